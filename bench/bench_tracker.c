/* Tracker: host cost of weft_use_begin + weft_use_end with no work between them, against the
 * driver calls a hand-written program makes for the same ordering, measured in the same run.
 *
 * A use records one ring event (cuEventRecord), and one cuStreamWaitEvent per cross-stream edge
 * it needs. So the tracker's own share of a use is its total minus a raw cuEventRecord (no edge)
 * or minus a raw cuStreamWaitEvent + cuEventRecord pair (one edge). What is left is weft's
 * bookkeeping: argument and handle checks, the context check (two cuCtxGetCurrent, shown below
 * for scale), the lock, the clocks and the blocks' histories. */
#include "bench/bench.h"

#define BLOCKS 16
#define RING 64 /* raw events per stream, as many as weft's default ring */

typedef struct raw {
  CUstream s[2];
  CUevent ev[2][RING];
} raw_t;

/* ns per cuEventRecord on one stream. */
static double raw_record(const bench_t *b, const raw_t *r, unsigned n) {
  double v[16];
  for (unsigned rep = 0; rep <= b->reps; rep++) {
    uint64_t t0 = bench_now_ns();
    for (unsigned i = 0; i < n; i++) BENCH_CU(b->drv->cuEventRecord(r->ev[0][i % RING], r->s[0]));
    uint64_t t1 = bench_now_ns();
    BENCH_CU(b->drv->cuStreamSynchronize(r->s[0]));
    if (rep > 0) v[rep - 1] = (double)(t1 - t0) / n;
  }
  return bench_median(v, b->reps);
}

/* ns per operation that waits for the other stream's last event, then records its own: what a
 * hand-written ping-pong between two streams costs. */
static double raw_wait_record(const bench_t *b, const raw_t *r, unsigned n) {
  double v[16];
  for (unsigned rep = 0; rep <= b->reps; rep++) {
    BENCH_CU(b->drv->cuEventRecord(r->ev[1][RING - 1], r->s[1]));
    uint64_t t0 = bench_now_ns();
    for (unsigned i = 0; i < n; i++) {
      unsigned me = i & 1, other = me ^ 1;
      BENCH_CU(b->drv->cuStreamWaitEvent(r->s[me], r->ev[other][(i + RING - 1) % RING], 0));
      BENCH_CU(b->drv->cuEventRecord(r->ev[me][i % RING], r->s[me]));
    }
    uint64_t t1 = bench_now_ns();
    for (int k = 0; k < 2; k++) BENCH_CU(b->drv->cuStreamSynchronize(r->s[k]));
    if (rep > 0) v[rep - 1] = (double)(t1 - t0) / n;
  }
  return bench_median(v, b->reps);
}

/* ns per cuCtxGetCurrent, the call weft's per-thread context check makes. */
static double raw_ctx_get(const bench_t *b, unsigned n) {
  double v[16];
  for (unsigned rep = 0; rep <= b->reps; rep++) {
    CUcontext c;
    uint64_t t0 = bench_now_ns();
    for (unsigned i = 0; i < n; i++) BENCH_CU(b->drv->cuCtxGetCurrent(&c));
    if (rep > 0) v[rep - 1] = (double)(bench_now_ns() - t0) / n;
  }
  return bench_median(v, b->reps);
}

/* ns per use begin+end of `acc` (k accesses), on s[0] only, or alternating s[0] and s[1] (each
 * use then needs one wait). *waits gets the waits issued per use. */
static double weft_uses(const bench_t *b, weft_runtime_t *rt, weft_stream_t *const *s, int alternate,
                        const weft_access_t *acc, size_t k, unsigned n, double *waits) {
  double v[16];
  weft_counters_t c0, c1;
  for (unsigned rep = 0; rep <= b->reps; rep++) {
    BENCH_WEFT(weft_runtime_counters(rt, &c0));
    uint64_t t0 = bench_now_ns();
    for (unsigned i = 0; i < n; i++) {
      weft_stream_t *on = s[alternate ? i & 1 : 0];
      BENCH_WEFT(weft_use_begin(on, acc, k));
      BENCH_WEFT(weft_use_end(on, acc, k));
    }
    uint64_t t1 = bench_now_ns();
    BENCH_WEFT(weft_runtime_counters(rt, &c1));
    /* Untimed: the host then knows everything complete, which only spares the next run's first
     * use its wait. */
    BENCH_WEFT(weft_runtime_synchronize(rt));
    if (rep > 0) v[rep - 1] = (double)(t1 - t0) / n;
  }
  *waits = (double)(c1.waits_issued - c0.waits_issued) / n;
  return bench_median(v, b->reps);
}

static void row(const bench_t *b, const char *name, size_t k, double total, double driver, const char *driver_name,
                double waits) {
  double share = total - driver;
  printf("| %s | %zu | %.0f | %.0f | %.2fx | %.0f | %.1f | %.2f |\n", name, k, total, driver, total / driver, share,
         share / (double)k, waits);
  bench_csv(b, "tracker", name, "ns per use, begin+end", total, "ns", driver_name, driver);
  bench_csv(b, "tracker", name, "tracker share, ns per access", share / (double)k, "ns", NULL, 0);
  bench_csv(b, "tracker", name, "waits issued per use", waits, "waits", NULL, 0);
}

void bench_tracker(bench_t *b) {
  bench_section(b, "Tracker: cost of a use",
                "Host ns per `weft_use_begin` + `weft_use_end` with no work between (median), next to the raw "
                "driver calls that give the same ordering by hand: one `cuEventRecord` per use, plus one "
                "`cuStreamWaitEvent` when the use needs a cross-stream edge. *Tracker share* = weft total - "
                "those raw calls: weft's own bookkeeping. Accesses: a quarter written, the rest read, all "
                "on one stream; the edge row writes one block alternately from two streams, so every use "
                "waits once. Goal (issue 4): at most 30 ns per access that needs no edge.");
  const weft__driver_t *d = b->drv;
  unsigned n = bench_count(b, 100000, 64);
  raw_t r;
  for (int k = 0; k < 2; k++) {
    BENCH_CU(d->cuStreamCreateWithPriority(&r.s[k], CU_STREAM_NON_BLOCKING, 0));
    /* Flags as weft's ring events (streams/pool.c). */
    for (int i = 0; i < RING; i++) BENCH_CU(d->cuEventCreate(&r.ev[k][i], CU_EVENT_DISABLE_TIMING));
  }
  double rec = raw_record(b, &r, n), wait_rec = raw_wait_record(b, &r, n), ctx_get = raw_ctx_get(b, n);

  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0; /* two plain streams, as the raw ones */
  weft_runtime_t *rt = bench_runtime(&o);
  weft_stream_t *s[2];
  BENCH_WEFT(weft_stream_get(rt, 0, &s[0]));
  BENCH_WEFT(weft_stream_get(rt, 1, &s[1]));
  weft_block_t blk[BLOCKS];
  weft_access_t acc[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) BENCH_WEFT(weft_alloc(rt, 256, s[0], "tracker", &blk[i]));
  BENCH_WEFT(weft_runtime_synchronize(rt));

  static const char *const cols[] = {"use", "accesses", "weft, ns/use", "raw driver calls, ns", "vs raw",
                                     "tracker share, ns/use", "share, ns/access", "waits/use"};
  bench_table(cols, 8);
  static const size_t ks[] = {1, 4, 16};
  for (int j = 0; j < 3; j++) {
    size_t k = ks[j], writes = k / 4 ? k / 4 : 1;
    for (size_t i = 0; i < k; i++) acc[i] = (weft_access_t){blk[i], i < writes ? WEFT_WRITE : WEFT_READ};
    double waits, t = weft_uses(b, rt, s, 0, acc, k, n, &waits);
    char name[64];
    snprintf(name, sizeof name, "no edge, %zu access%s", k, k > 1 ? "es" : "");
    row(b, name, k, t, rec, "raw cuEventRecord", waits);
  }
  acc[0] = (weft_access_t){blk[0], WEFT_WRITE};
  double waits, t = weft_uses(b, rt, s, 1, acc, 1, n, &waits);
  row(b, "one edge (write after write, 2 streams)", 1, t, wait_rec, "raw cuStreamWaitEvent + cuEventRecord", waits);
  for (int i = 0; i < BLOCKS; i++) BENCH_WEFT(weft_free(blk[i], s[0]));
  BENCH_WEFT(weft_runtime_release(rt));

  printf("\nRaw driver calls in the same run, ns each: `cuEventRecord` %.0f, `cuStreamWaitEvent` + "
         "`cuEventRecord` %.0f, `cuCtxGetCurrent` %.0f (weft's share includes two of these). %u uses per run.\n\n",
         rec, wait_rec, ctx_get, n);
  bench_csv(b, "tracker", "raw cuEventRecord", "ns per call", rec, "ns", NULL, 0);
  bench_csv(b, "tracker", "raw cuStreamWaitEvent + cuEventRecord", "ns per pair", wait_rec, "ns", NULL, 0);
  bench_csv(b, "tracker", "raw cuCtxGetCurrent", "ns per call", ctx_get, "ns", NULL, 0);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < RING; i++) BENCH_CU(d->cuEventDestroy(r.ev[k][i]));
    BENCH_CU(d->cuStreamDestroy(r.s[k]));
  }
}
