/* Probe (asserts nothing): when the output of one graph (a memory-node allocation) is freed with
 * cuMemFreeAsync on a stream that is still blocked, can another graph launched on an unrelated
 * stream get the same memory and write it before the blocked stream's earlier reads run?
 *
 *   G1: alloc A, memset A = 0x11111111 (A is G1's output).   G2: alloc B, memset B = 0x22222222,
 *   copy B -> D (a cuMemAlloc buffer, so the write is seen), free B.
 *   Launch G1 on s1, synchronise. On s2: wait until flag == 1, copy A -> C, cuMemFreeAsync(A).
 *   Then instantiate G2 (after the free was enqueued) and launch it on s3, which is not ordered
 *   with s2. Poll s3 for up to 2 s (a driver that orders G2 after the free would still be
 *   waiting), then set the flag from s4 and synchronise everything.
 *   C != 0x11111111 means G2 reused A's memory before s2's copy ran. Runs ROUNDS times with
 *   varying sizes and says what happened each time. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tools/probes/probe.h"

#define ROUNDS 6



static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A graph captured on s: alloc `bytes`, memset to v, then (if dst) copy to dst and free. */
static int capture(CUstream s, size_t bytes, unsigned v, CUdeviceptr dst, CUdeviceptr *p, CUgraph *g) {
  TRY(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  TRY(d->cuMemAllocAsync(p, bytes, s));
  TRY(d->cuMemsetD32Async(*p, v, bytes / 4, s));
  if (dst) {
    TRY(d->cuMemcpyDtoDAsync(dst, *p, bytes, s));
    TRY(d->cuMemFreeAsync(*p, s));
  }
  TRY(d->cuStreamEndCapture(s, g));
  return 0;
}

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  CUstream s1, s2, s3, s4;
  TRY(d->cuStreamCreateWithPriority(&s1, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuStreamCreateWithPriority(&s3, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuStreamCreateWithPriority(&s4, CU_STREAM_NON_BLOCKING, 0));
  CUdeviceptr flag;
  TRY(d->cuMemAlloc(&flag, 4096));
  int reused = 0, ordered = 0, separate = 0;
  for (int round = 0; round < ROUNDS; round++) {
    size_t bytes = (size_t)(1 + round) << 20;
    CUdeviceptr C, D, A, B;
    TRY(d->cuMemAlloc(&C, bytes));
    TRY(d->cuMemAlloc(&D, bytes));
    TRY(d->cuMemsetD32Async(flag, 0, 1, s4));
    TRY(d->cuStreamSynchronize(s4));
    CUgraph g1, g2;
    CUgraphExec x1, x2;
    if (capture(s1, bytes, 0x11111111u, 0, &A, &g1)) return 1;
    TRY(d->cuGraphInstantiateWithFlags(&x1, g1, 0));
    TRY(d->cuGraphLaunch(x1, s1));
    TRY(d->cuStreamSynchronize(s1));
    TRY(d->cuStreamWaitValue32(s2, flag, 1, CU_STREAM_WAIT_VALUE_EQ));
    TRY(d->cuMemcpyDtoDAsync(C, A, bytes, s2));
    TRY(d->cuMemFreeAsync(A, s2));
    if (capture(s3, bytes, 0x22222222u, D, &B, &g2)) return 1;
    TRY(d->cuGraphInstantiateWithFlags(&x2, g2, 0));
    TRY(d->cuGraphLaunch(x2, s3));
    double t0 = now();
    CUresult q;
    while ((q = d->cuStreamQuery(s3)) == CUDA_ERROR_NOT_READY && now() - t0 < 2.0) {
    }
    int g2_waited = q == CUDA_ERROR_NOT_READY;
    TRY(d->cuStreamWriteValue32(s4, flag, 1, 0));
    TRY(d->cuCtxSynchronize());
    unsigned c = 0, dd = 0;
    TRY(d->cuMemcpyDtoH(&c, C, 4));
    TRY(d->cuMemcpyDtoH(&dd, D, 4));
    const char *what = c == 0x11111111u ? (g2_waited ? "G2 was held back until the free ran" : "no reuse seen")
                                        : "G2 wrote A's memory before s2's copy ran";
    if (c != 0x11111111u) reused++;
    else if (g2_waited) ordered++;
    else separate++;
    printf("round %d, %zu MiB: A 0x%llx, B 0x%llx, C[0] 0x%08x, D[0] 0x%08x, G2 %s after 2 s: %s\n", round,
           bytes >> 20, (unsigned long long)A, (unsigned long long)B, c, dd, g2_waited ? "still waiting" : "done", what);
    TRY(d->cuGraphExecDestroy(x1));
    TRY(d->cuGraphExecDestroy(x2));
    TRY(d->cuGraphDestroy(g1));
    TRY(d->cuGraphDestroy(g2));
    TRY(d->cuMemFree(C));
    TRY(d->cuMemFree(D));
    TRY(d->cuDeviceGraphMemTrim(dev));
  }
  printf("graph memory reuse across unordered streams: %d rounds reused A early, %d held G2 back, %d used other memory\n",
         reused, ordered, separate);
  return 0;
}
