/* Probe (asserts nothing): how many operations can be enqueued behind a held stream before an
 * enqueue waits inside the driver for room (the launch queue is full)?
 *
 * A host function holds stream s until released; then 4-byte memsets are enqueued, each timed.
 * The first memset that takes more than 50 ms shows the depth (a helper thread releases the
 * stream after 2 s). Then the same with the memsets spread over 4 and 16 streams that all wait
 * for s (an event), to see whether the room is per stream or shared. Prints the depth per case. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "tools/probes/probe.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static _Atomic int released;

static void CUDA_CB hold(void *arg) {
  (void)arg;
  while (!atomic_load(&released)) usleep(100);
}

static void *release_later(void *arg) {
  (void)arg;
  usleep(2000000);
  atomic_store(&released, 1);
  return NULL;
}

static int one(unsigned nstreams, long limit) {
  CUstream s, t[16];
  CUevent e;
  CUdeviceptr p;
  TRY(d->cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0));
  for (unsigned i = 0; i < nstreams; i++) TRY(d->cuStreamCreateWithPriority(&t[i], CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  TRY(d->cuMemAlloc(&p, 4));
  atomic_store(&released, 0);
  pthread_t th;
  pthread_create(&th, NULL, release_later, NULL);
  TRY(d->cuLaunchHostFunc(s, hold, NULL));
  TRY(d->cuEventRecord(e, s));
  for (unsigned i = 0; i < nstreams; i++) TRY(d->cuStreamWaitEvent(t[i], e, 0));
  long depth = -1;
  double slow = 0;
  for (long k = 0; k < limit; k++) {
    double t0 = now();
    TRY(d->cuMemsetD32Async(p, (unsigned)k, 1, nstreams ? t[k % nstreams] : s));
    double dt = now() - t0;
    if (dt > 0.05) {
      depth = k;
      slow = dt;
      break;
    }
  }
  pthread_join(th, NULL);
  TRY(d->cuCtxSynchronize());
  if (depth < 0)
    printf("queue depth, %u streams behind the held one: more than %ld memsets enqueued without waiting\n", nstreams, limit);
  else
    printf("queue depth, %u streams behind the held one: memset %ld waited %.2f s for room\n", nstreams, depth, slow);
  for (unsigned i = 0; i < nstreams; i++) TRY(d->cuStreamDestroy(t[i]));
  TRY(d->cuStreamDestroy(s));
  TRY(d->cuEventDestroy(e));
  TRY(d->cuMemFree(p));
  return 0;
}

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  if (probe_context() != 0) return 1;
  return one(0, 200000) || one(4, 200000) || one(16, 200000);
}
