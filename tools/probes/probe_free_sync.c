/* Probe (asserts nothing): does cuMemFree wait for queued work that still uses the memory?
 *
 * On a stream (non-blocking, as weft's pool streams are, then a blocking one), work waits on a
 * device flag and then copies X -> Y. The host frees X while that work is queued; a thread sets
 * the flag from another stream 1 s later. If cuMemFree returns at once, the memory is handed out
 * again (cuMemAlloc of the same size, set to 0x5a5a5a5a) before the copy runs, and Y shows what
 * the copy then read. Prints the time cuMemFree took and what Y holds, per case. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/probes/probe.h"



static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
  CUstream s;
  CUdeviceptr flag;
} setter_t;

static void *set_later(void *arg) {
  setter_t *a = arg;
  d->cuCtxSetCurrent(ctx);
  usleep(1000000);
  d->cuStreamWriteValue32(a->s, a->flag, 1, 0);
  d->cuStreamSynchronize(a->s);
  return NULL;
}

static int one(unsigned flags, const char *name, size_t bytes) {
  CUstream s1, s2;
  TRY(d->cuStreamCreateWithPriority(&s1, flags, 0));
  TRY(d->cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, 0));
  CUdeviceptr x, y, flag, z = 0;
  TRY(d->cuMemAlloc(&x, bytes));
  TRY(d->cuMemAlloc(&y, bytes));
  TRY(d->cuMemAlloc(&flag, 4096));
  TRY(d->cuMemsetD32Async(x, 0x11111111, bytes / 4, s2));
  TRY(d->cuMemsetD32Async(y, 0, bytes / 4, s2));
  TRY(d->cuMemsetD32Async(flag, 0, 1, s2));
  TRY(d->cuCtxSynchronize());
  TRY(d->cuStreamWaitValue32(s1, flag, 1, CU_STREAM_WAIT_VALUE_EQ));
  TRY(d->cuMemcpyDtoDAsync(y, x, bytes, s1));
  setter_t a = {s2, flag};
  pthread_t th;
  pthread_create(&th, NULL, set_later, &a);
  double t0 = now();
  TRY(d->cuMemFree(x));
  double t1 = now();
  CUresult ra = d->cuMemAlloc(&z, bytes);
  if (ra == CUDA_SUCCESS) (void)d->cuMemsetD32Async(z, 0x5a5a5a5a, bytes / 4, s2);
  pthread_join(th, NULL);
  TRY(d->cuCtxSynchronize());
  unsigned got = 0;
  TRY(d->cuMemcpyDtoH(&got, y, 4));
  printf("%-12s %8zu B: cuMemFree took %.3f s; realloc %s (same address: %s); copy read 0x%08x (%s)\n", name, bytes,
         t1 - t0, ra == CUDA_SUCCESS ? "ok" : "failed", z == x ? "yes" : "no", got,
         got == 0x11111111u ? "the old contents" : got == 0x5a5a5a5au ? "THE NEW ALLOCATION" : "other");
  if (z) d->cuMemFree(z);
  d->cuMemFree(y);
  d->cuMemFree(flag);
  d->cuStreamDestroy(s1);
  d->cuStreamDestroy(s2);
  return 0;
}

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  size_t sizes[] = {1 << 20, 2 << 20, 64 << 20};
  for (int i = 0; i < 3; i++) {
    if (one(CU_STREAM_NON_BLOCKING, "non-blocking", sizes[i])) return 1;
    if (one(CU_STREAM_DEFAULT, "blocking", sizes[i])) return 1;
  }
  return 0;
}
