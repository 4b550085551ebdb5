/* Probe (asserts nothing): how many operations can be enqueued behind a held stream before an
 * enqueue waits inside the driver for room (the launch queue is full)?
 *
 * A host function holds stream s until released; then 4-byte memsets are enqueued, each timed.
 * The first memset that takes more than 50 ms shows the depth (a helper thread releases the
 * stream after 2 s). Then the same with the memsets spread over 4 and 16 streams that all wait
 * for s (an event), to see whether the room is per stream or shared. Then on the held stream
 * alone with other operations: event records, waits on an event that has completed, and a
 * memset and an event record in turn (what a weft use on a stream that records after each use
 * enqueues): do they take room, and does an enqueue of theirs wait for it? Prints the count per
 * case. */
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

enum { MEMSET, RECORD, WAIT, MEMSET_RECORD, WAIT_PENDING };
static const char *const kind_name[] = {"memsets", "event records", "waits on a completed event",
                                        "memset + event record pairs (counted by operation)",
                                        "waits on a pending event (of another held stream)"};

static int one(unsigned nstreams, long limit, int kind) {
  CUstream s, t[16];
  CUevent e, done, rec;
  CUdeviceptr p;
  TRY(d->cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0));
  for (unsigned i = 0; i < nstreams; i++) TRY(d->cuStreamCreateWithPriority(&t[i], CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  TRY(d->cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  TRY(d->cuEventCreate(&rec, CU_EVENT_DISABLE_TIMING));
  TRY(d->cuMemAlloc(&p, 4));
  CUstream other;
  TRY(d->cuStreamCreateWithPriority(&other, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuEventRecord(done, other));
  TRY(d->cuStreamSynchronize(other));
  CUevent pending;
  TRY(d->cuEventCreate(&pending, CU_EVENT_DISABLE_TIMING));
  atomic_store(&released, 0);
  pthread_t th;
  pthread_create(&th, NULL, release_later, NULL);
  TRY(d->cuLaunchHostFunc(s, hold, NULL));
  TRY(d->cuEventRecord(e, s));
  TRY(d->cuLaunchHostFunc(other, hold, NULL)); /* `pending`: recorded behind other's hold */
  TRY(d->cuEventRecord(pending, other));
  for (unsigned i = 0; i < nstreams; i++) TRY(d->cuStreamWaitEvent(t[i], e, 0));
  long depth = -1;
  double slow = 0;
  for (long k = 0; k < limit; k++) {
    double t0 = now();
    CUstream on = nstreams ? t[k % nstreams] : s;
    if (kind == MEMSET || (kind == MEMSET_RECORD && k % 2 == 0)) TRY(d->cuMemsetD32Async(p, (unsigned)k, 1, on));
    else if (kind == WAIT) TRY(d->cuStreamWaitEvent(on, done, 0));
    else if (kind == WAIT_PENDING) TRY(d->cuStreamWaitEvent(on, pending, 0));
    else TRY(d->cuEventRecord(rec, on));
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
    printf("queue depth, %s, %u streams behind the held one: more than %ld enqueued without waiting\n", kind_name[kind],
           nstreams, limit);
  else
    printf("queue depth, %s, %u streams behind the held one: operation %ld waited %.2f s for room\n", kind_name[kind],
           nstreams, depth, slow);
  for (unsigned i = 0; i < nstreams; i++) TRY(d->cuStreamDestroy(t[i]));
  TRY(d->cuStreamDestroy(s));
  TRY(d->cuEventDestroy(e));
  TRY(d->cuEventDestroy(done));
  TRY(d->cuEventDestroy(rec));
  TRY(d->cuEventDestroy(pending));
  TRY(d->cuStreamDestroy(other));
  TRY(d->cuMemFree(p));
  return 0;
}

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  if (probe_context() != 0) return 1;
  return one(0, 200000, MEMSET) || one(4, 200000, MEMSET) || one(16, 200000, MEMSET) || one(0, 200000, RECORD) ||
         one(0, 200000, WAIT) || one(0, 200000, MEMSET_RECORD) || one(0, 200000, WAIT_PENDING);
}
