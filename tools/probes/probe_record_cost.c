/* probe_record_cost: what one cuEventRecord costs the host on streams with different histories
 * (bench/driver_share.c found records on some streams 50-130 ns dearer than on others; this asks
 * which history does it). Each stream records into its own 64 events, cycling; the streams'
 * samples are interleaved, 11 samples of 100,000 records; medians, ns per record.
 *   A  a fresh stream
 *   B  another stream waited once on an event of it (at setup)
 *   C  another stream waited 200,000 times on its events (at setup: C records, W waits)
 *   W  the stream that waited on C 200,000 times
 *   E  1,000 stream-ordered pool allocations and frees ran on it (at setup)
 *   E1 one pool allocation on it, never freed; E2 one allocation and its free on it; E3 one
 *      free on it of memory allocated on another stream; E4 cuMemAllocAsync and cuMemFreeAsync on it (the
 *      device's default pool); E5 as E2 from a pool whose
 *      CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES is 0, E6 from one with all three reuse
 *      attributes 0 (all at setup)
 *   H  created with the greatest priority
 *   P  waited on by another stream before every sample (as the tracker table's weft rows are)
 *   M  it waited once (at setup) on an event recorded on another stream right after a pool
 *      allocation there (whether the mark travels with a wait, as it would if weft's pool took
 *      its chunks on a stream of its own and made the user's stream wait for it)
 *   F  it waited once on an event recorded on another stream right after a pool free there
 * Then a 4-byte memset and a wait on a complete event, on A and E2 alike.
 * Prints what the driver answers; asserts nothing. Run by hand on a GPU machine:
 *   bazel build -c opt //tools/probes:probe_record_cost && bazel-bin/tools/probes/probe_record_cost */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "tools/probes/probe.h"

#define RING 64
#define N 100000
#define REPS 11

enum { A, B, C, W, E, E1, E2, E3, E4, E5, E6, H, P, M, F, K };
static const char *const names[K] = {"A fresh", "B waited on once", "C waited on 200,000 times", "W waited 200,000 times",
                                     "E 1,000 pool alloc/free pairs ran on it", "E1 one pool allocation on it, kept",
                                     "E2 one pool allocation and its free on it", "E3 one pool free on it (allocated on another stream)",
                                     "E4 one cuMemAllocAsync and its free on it (the device's default pool)",
                                     "E5 as E2, a pool that does not follow event dependencies",
                                     "E6 as E2, a pool with none of the three reuse policies",
                                     "H greatest priority", "P waited on before each sample",
                                     "M waited once on a record after a pool allocation elsewhere",
                                     "F waited once on a record after a pool free elsewhere"};

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  CUstream s[K], other;
  CUevent ev[K][RING];
  int least, greatest;
  TRY(d->cuCtxGetStreamPriorityRange(&least, &greatest));
  for (int k = 0; k < K; k++) {
    TRY(d->cuStreamCreateWithPriority(&s[k], CU_STREAM_NON_BLOCKING, k == H ? greatest : 0));
    for (int i = 0; i < RING; i++) TRY(d->cuEventCreate(&ev[k][i], CU_EVENT_DISABLE_TIMING));
  }
  TRY(d->cuStreamCreateWithPriority(&other, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuEventRecord(ev[B][0], s[B]));
  TRY(d->cuStreamWaitEvent(other, ev[B][0], 0));
  for (int i = 0; i < 200000; i++) {
    TRY(d->cuEventRecord(ev[C][i % RING], s[C]));
    TRY(d->cuStreamWaitEvent(s[W], ev[C][i % RING], 0));
  }
  CUmemoryPool pool;
  CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                          .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)dev}};
  TRY(d->cuMemPoolCreate(&pool, &props));
  for (int i = 0; i < 1000; i++) {
    CUdeviceptr p;
    TRY(d->cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s[E]));
    TRY(d->cuMemFreeAsync(p, s[E]));
  }
  CUmemoryPool nofollow, noreuse;
  TRY(d->cuMemPoolCreate(&nofollow, &props));
  TRY(d->cuMemPoolCreate(&noreuse, &props));
  int zero = 0;
  TRY(d->cuMemPoolSetAttribute(nofollow, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &zero));
  TRY(d->cuMemPoolSetAttribute(noreuse, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &zero));
  TRY(d->cuMemPoolSetAttribute(noreuse, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &zero));
  TRY(d->cuMemPoolSetAttribute(noreuse, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &zero));
  CUdeviceptr p5, p6;
  TRY(d->cuMemAllocFromPoolAsync(&p5, 1 << 20, nofollow, s[E5]));
  TRY(d->cuMemFreeAsync(p5, s[E5]));
  TRY(d->cuMemAllocFromPoolAsync(&p6, 1 << 20, noreuse, s[E6]));
  TRY(d->cuMemFreeAsync(p6, s[E6]));
  CUdeviceptr p1, p2, p3, p4;
  TRY(d->cuMemAllocFromPoolAsync(&p1, 1 << 20, pool, s[E1]));
  TRY(d->cuMemAllocFromPoolAsync(&p2, 1 << 20, pool, s[E2]));
  TRY(d->cuMemFreeAsync(p2, s[E2]));
  TRY(d->cuMemAllocFromPoolAsync(&p3, 1 << 20, pool, other));
  TRY(d->cuStreamSynchronize(other));
  TRY(d->cuMemFreeAsync(p3, s[E3]));
  TRY(d->cuMemAllocAsync(&p4, 1 << 20, s[E4]));
  CUstream q;
  CUevent qe;
  CUdeviceptr pm, pf;
  TRY(d->cuStreamCreateWithPriority(&q, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuEventCreate(&qe, CU_EVENT_DISABLE_TIMING));
  TRY(d->cuMemAllocFromPoolAsync(&pm, 1 << 20, pool, q));
  TRY(d->cuEventRecord(qe, q));
  TRY(d->cuStreamWaitEvent(s[M], qe, 0));
  TRY(d->cuMemAllocFromPoolAsync(&pf, 1 << 20, pool, q));
  TRY(d->cuMemFreeAsync(pf, q));
  TRY(d->cuEventRecord(qe, q));
  TRY(d->cuStreamWaitEvent(s[F], qe, 0));
  TRY(d->cuStreamSynchronize(q));
  TRY(d->cuMemFreeAsync(p4, s[E4]));
  for (int k = 0; k < K; k++) TRY(d->cuStreamSynchronize(s[k]));
  TRY(d->cuStreamSynchronize(other));
  static double v[K][REPS];
  for (int rep = 0; rep <= REPS; rep++)
    for (int k = 0; k < K; k++) {
      if (k == P) {
        TRY(d->cuEventRecord(ev[P][RING - 1], s[P]));
        TRY(d->cuStreamWaitEvent(other, ev[P][RING - 1], 0));
      }
      uint64_t t0 = probe_now();
      for (int i = 0; i < N; i++) TRY(d->cuEventRecord(ev[k][i % RING], s[k]));
      uint64_t t1 = probe_now();
      TRY(d->cuStreamSynchronize(s[k]));
      TRY(d->cuStreamSynchronize(other));
      if (rep > 0) v[k][rep - 1] = (double)(t1 - t0) / N;
    }
  printf("probe_record_cost: ns per cuEventRecord, median of %d samples of %d (min-max)\n", REPS, N);
  for (int k = 0; k < K; k++) {
    qsort(v[k], REPS, sizeof v[k][0], probe_cmp_double);
    printf("  %-70s %6.1f  (%.1f-%.1f)\n", names[k], v[k][REPS / 2], v[k][0], v[k][REPS - 1]);
  }
  /* The same for a 4-byte memset (work) and for a wait on a complete event, on A (fresh) and E2
   * (one pool allocation and its free): whether the pool's mark reaches other calls too. */
  CUdeviceptr m;
  TRY(d->cuMemAlloc(&m, 4096));
  CUevent done;
  TRY(d->cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  TRY(d->cuEventRecord(done, other));
  TRY(d->cuStreamSynchronize(other));
  static const int pick[2] = {A, E2};
  static double u[2][2][REPS];
  (void)pick;
  for (int rep = 0; rep <= REPS; rep++)
    for (int op = 0; op < 2; op++)
      for (int j = 0; j < 2; j++) {
        CUstream st = s[pick[j]];
        uint64_t t0 = probe_now();
        for (int i = 0; i < N; i++) {
          if (op == 0) TRY(d->cuMemsetD32Async(m + (CUdeviceptr)(4 * j), (unsigned)i, 1, st));
          else TRY(d->cuStreamWaitEvent(st, done, 0));
        }
        uint64_t t1 = probe_now();
        TRY(d->cuStreamSynchronize(st));
        if (rep > 0) u[op][j][rep - 1] = (double)(t1 - t0) / N;
      }
  static const char *const opname[2] = {"cuMemsetD32Async of 4 bytes", "cuStreamWaitEvent on a complete event"};
  for (int op = 0; op < 2; op++)
    for (int j = 0; j < 2; j++) {
      qsort(u[op][j], REPS, sizeof u[op][j][0], probe_cmp_double);
      printf("  %-40s on %-30s %6.1f  (%.1f-%.1f)\n", opname[op], names[pick[j]], u[op][j][REPS / 2], u[op][j][0],
             u[op][j][REPS - 1]);
    }
  TRY(d->cuMemFree(m));
  TRY(d->cuEventDestroy(done));
  TRY(d->cuMemFreeAsync(p1, s[E1]));
  TRY(d->cuMemFreeAsync(pm, q));
  TRY(d->cuStreamSynchronize(q));
  TRY(d->cuStreamSynchronize(s[E1]));
  return 0;
}
