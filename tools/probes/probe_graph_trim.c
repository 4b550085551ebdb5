/* Probe (asserts nothing): what cuDeviceGraphMemTrim does to graph memory that is still live.
 *
 * G1 allocates A (a memory node, not freed in the graph: an output) and sets it to 0x11111111.
 * Launch G1, synchronise, trim, read A; then launch G2 (allocates B, sets it to 0x22222222,
 * copies B to D, frees B) on another stream, synchronise, read A again; then cuMemAlloc Z, set it
 * to 0x33333333, read A again. Each read says whether A kept its contents. Also: P, a cuMemAlloc
 * buffer set to 0x44444444 before everything, read at the end. Sizes 256 B and 2 MiB, with and
 * without the trim. */
#include <stdio.h>
#include <string.h>

#include "tools/probes/probe.h"



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

static unsigned word(CUdeviceptr p, size_t bytes) {
  unsigned a = 0, b = 0;
  if (d->cuMemcpyDtoH(&a, p, 4) != CUDA_SUCCESS) return 0xdeadbeef;
  if (d->cuMemcpyDtoH(&b, p + bytes - 4, 4) != CUDA_SUCCESS) return 0xdeadbeef;
  return a == b ? a : 0xbadbad00;
}

static int one(size_t bytes, int trim, CUstream s1, CUstream s2) {
  CUdeviceptr A, B, D, Z, P;
  TRY(d->cuMemAlloc(&P, bytes));
  TRY(d->cuMemAlloc(&D, bytes));
  TRY(d->cuMemsetD32Async(P, 0x44444444, bytes / 4, s1));
  CUgraph g1, g2;
  CUgraphExec x1, x2;
  if (capture(s1, bytes, 0x11111111, 0, &A, &g1) || capture(s2, bytes, 0x22222222, D, &B, &g2)) return 1;
  TRY(d->cuGraphInstantiateWithFlags(&x1, g1, 0));
  TRY(d->cuGraphInstantiateWithFlags(&x2, g2, 0));
  TRY(d->cuGraphLaunch(x1, s1));
  TRY(d->cuCtxSynchronize());
  unsigned a0 = word(A, bytes);
  if (trim) TRY(d->cuDeviceGraphMemTrim(0));
  unsigned a1 = word(A, bytes);
  TRY(d->cuGraphLaunch(x2, s2));
  TRY(d->cuCtxSynchronize());
  unsigned a2 = word(A, bytes);
  TRY(d->cuMemAlloc(&Z, bytes));
  TRY(d->cuMemsetD32Async(Z, 0x33333333, bytes / 4, s1));
  TRY(d->cuCtxSynchronize());
  unsigned a3 = word(A, bytes), p = word(P, bytes);
  printf("%8zu B, trim %d: A after launch 0x%08x, after trim 0x%08x, after G2 0x%08x, after cuMemAlloc 0x%08x; "
         "B %s A; P 0x%08x -> %s\n", bytes, trim, a0, a1, a2, a3, A == B ? "==" : "!=", p,
         a1 == 0x11111111u && a2 == 0x11111111u && a3 == 0x11111111u && p == 0x44444444u ? "kept" : "LOST");
  TRY(d->cuMemFreeAsync(A, s1));
  TRY(d->cuCtxSynchronize());
  d->cuGraphExecDestroy(x1);
  d->cuGraphExecDestroy(x2);
  d->cuGraphDestroy(g1);
  d->cuGraphDestroy(g2);
  d->cuMemFree(Z);
  d->cuMemFree(D);
  d->cuMemFree(P);
  return 0;
}

/* G (alloc T, set 0x22222222, copy to D, free T) launched once, trim, then cuMemAlloc P (several,
 * set to 0x44444444), then G launched again: does G's second launch write P? */
static int relaunch(size_t bytes, int trim, CUstream s1) {
  CUdeviceptr T, D, P[8];
  TRY(d->cuMemAlloc(&D, bytes));
  CUgraph g;
  CUgraphExec x;
  if (capture(s1, bytes, 0x22222222, D, &T, &g)) return 1;
  TRY(d->cuGraphInstantiateWithFlags(&x, g, 0));
  TRY(d->cuGraphLaunch(x, s1));
  TRY(d->cuCtxSynchronize());
  if (trim) TRY(d->cuDeviceGraphMemTrim(0));
  int hit = 0;
  for (int i = 0; i < 8; i++) {
    TRY(d->cuMemAlloc(&P[i], bytes));
    TRY(d->cuMemsetD32Async(P[i], 0x44444444, bytes / 4, s1));
    if (P[i] == T) hit = 1;
  }
  TRY(d->cuCtxSynchronize());
  TRY(d->cuGraphLaunch(x, s1));
  TRY(d->cuCtxSynchronize());
  int lost = 0;
  for (int i = 0; i < 8; i++) lost += word(P[i], bytes) != 0x44444444u;
  printf("%8zu B, trim %d: relaunch after cuMemAlloc: %d of 8 buffers overwritten; a buffer got T's address: %s; D 0x%08x\n",
         bytes, trim, lost, hit ? "yes" : "no", word(D, bytes));
  for (int i = 0; i < 8; i++) d->cuMemFree(P[i]);
  d->cuGraphExecDestroy(x);
  d->cuGraphDestroy(g);
  d->cuMemFree(D);
  return 0;
}

/* A capture allocates T (set 0x55555555, copied to D, freed); before the capture ends: trim, then
 * cuMemAlloc P (several, set to 0x44444444). End, instantiate, launch: do P keep their contents,
 * and did one get T's address? */
static int mid_capture(size_t bytes, int trim, CUstream s1) {
  CUdeviceptr T, D, P[8];
  TRY(d->cuMemAlloc(&D, bytes));
  TRY(d->cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
  TRY(d->cuMemAllocAsync(&T, bytes, s1));
  TRY(d->cuMemsetD32Async(T, 0x55555555, bytes / 4, s1));
  TRY(d->cuMemcpyDtoDAsync(D, T, bytes, s1));
  TRY(d->cuMemFreeAsync(T, s1));
  if (trim) TRY(d->cuDeviceGraphMemTrim(0));
  int hit = 0;
  for (int i = 0; i < 8; i++) {
    TRY(d->cuMemAlloc(&P[i], bytes));
    if (P[i] <= T + bytes - 1 && T <= P[i] + bytes - 1) hit = 1;
  }
  CUgraph g;
  CUgraphExec x;
  TRY(d->cuStreamEndCapture(s1, &g));
  CUstream s2;
  TRY(d->cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, 0));
  for (int i = 0; i < 8; i++) TRY(d->cuMemsetD32Async(P[i], 0x44444444, bytes / 4, s2));
  TRY(d->cuCtxSynchronize());
  TRY(d->cuGraphInstantiateWithFlags(&x, g, 0));
  TRY(d->cuGraphLaunch(x, s1));
  TRY(d->cuCtxSynchronize());
  int lost = 0;
  for (int i = 0; i < 8; i++) lost += word(P[i], bytes) != 0x44444444u;
  printf("%8zu B, trim %d inside a capture: %d of 8 later cuMemAlloc buffers overwritten; one overlaps T: %s; D 0x%08x\n",
         bytes, trim, lost, hit ? "YES" : "no", word(D, bytes));
  for (int i = 0; i < 8; i++) d->cuMemFree(P[i]);
  d->cuGraphExecDestroy(x);
  d->cuGraphDestroy(g);
  d->cuMemFree(D);
  d->cuStreamDestroy(s2);
  return 0;
}

/* G (alloc T, set 0x66666666, copy to D, free T) instantiated and uploaded on s2, trim, cuMemAlloc
 * P (several, set 0x44444444), then G launched on s1 (its first launch): do P keep their contents? */
static int upload_then_trim(size_t bytes, int trim, CUstream s1, CUstream s2) {
  CUdeviceptr T, D, P[8];
  TRY(d->cuMemAlloc(&D, bytes));
  CUgraph g;
  CUgraphExec x;
  if (capture(s1, bytes, 0x66666666, D, &T, &g)) return 1;
  TRY(d->cuGraphInstantiateWithFlags(&x, g, 0));
  TRY(d->cuGraphUpload(x, s2));
  TRY(d->cuCtxSynchronize());
  if (trim) TRY(d->cuDeviceGraphMemTrim(0));
  int hit = 0;
  for (int i = 0; i < 8; i++) {
    TRY(d->cuMemAlloc(&P[i], bytes));
    TRY(d->cuMemsetD32Async(P[i], 0x44444444, bytes / 4, s2));
    if (P[i] <= T + bytes - 1 && T <= P[i] + bytes - 1) hit = 1;
  }
  TRY(d->cuCtxSynchronize());
  TRY(d->cuGraphLaunch(x, s1));
  TRY(d->cuCtxSynchronize());
  int lost = 0;
  for (int i = 0; i < 8; i++) lost += word(P[i], bytes) != 0x44444444u;
  printf("%8zu B, trim %d after upload: %d of 8 later cuMemAlloc buffers overwritten; one overlaps T: %s; D 0x%08x\n",
         bytes, trim, lost, hit ? "YES" : "no", word(D, bytes));
  for (int i = 0; i < 8; i++) d->cuMemFree(P[i]);
  d->cuGraphExecDestroy(x);
  d->cuGraphDestroy(g);
  d->cuMemFree(D);
  return 0;
}

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  CUstream s1, s2;
  TRY(d->cuStreamCreateWithPriority(&s1, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, 0));
  size_t sizes[] = {256, 2u << 20};
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < 2; i++)
      if (one(sizes[i], t, s1, s2)) return 1;
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < 2; i++)
      if (relaunch(sizes[i], t, s1)) return 1;
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < 2; i++)
      if (mid_capture(sizes[i], t, s1)) return 1;
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < 2; i++)
      if (upload_then_trim(sizes[i], t, s1, s2)) return 1;
  return 0;
}
