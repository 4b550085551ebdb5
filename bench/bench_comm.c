/* Collectives (issue 14): an all-reduce of float32 data over two devices of this process, through
 * weft (weft_all_reduce of both ranks in one weft_comm_group_begin/end: each a tracked use) and
 * through raw NCCL (ncclAllReduce of both ranks in one ncclGroupStart/End), on the same buffers,
 * sizes 1 MiB to 256 MiB. Raw NCCL runs on streams of its own, of the communicator stream's
 * priority: asking weft for its stream's handle would expose it (weft_stream_raw), and an
 * exposed stream records an event after every use. Each repetition times `iters` all-reduces ending
 * in one synchronisation of both streams, the two ways alternating repetition by repetition; the
 * medians are compared. Goal (issue 14): weft within 2% of raw NCCL at every size. Needs two
 * devices and NCCL (WEFT_NCCL); skipped otherwise. Then the same with a thread per rank, and
 * (section comm_procs) with a process per rank. */
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "lib/core/nccl.h"
#include "lib/runtime/runtime.h"

#define MIB (1u << 20)

typedef struct pair {
  weft_runtime_t *rt[2];
  weft_comm_t *comm[2];
  weft_block_t buf[2];
  CUdeviceptr ptr[2];
  CUstream raw[2];
  ncclComm_t nc[2];
  CUevent ev[2]; /* the "raw + record" path's events */
  CUcontext ctx[2]; /* the devices' primary contexts (the "raw + switches" path) */
  CUstream wraw[2]; /* the communicators' weft streams' own handles (the "raw on weft's streams" path) */
} pair_t;

/* The ways an all-reduce is issued: through weft, raw NCCL, and raw NCCL followed by driver
 * calls a tracked use of each rank makes, to tell where weft's host time goes:
 *   RAW_RECORD  an event record on each stream (also tells a host-side cost from a GPU-side one);
 *   RAW_SWITCH  two context switches, device 1 then device 0 (a weft group over two devices
 *               binds each rank's context once);
 *   RAW_PROBE   per rank, two cuCtxGetCurrent and two cuStreamIsCapturing (the bind check and
 *               the capture probe of an exposed stream, at the use's begin and end);
 *   RAW_ON_WEFT raw NCCL on the weft streams' own handles (is it the streams?);
 *   RAW_BOOK    raw NCCL, then weft's bookkeeping of the group without NCCL: the joint use of
 *               both ranks' streams and buffers (weft__use_joint: the buffers resolved, then
 *               weft__use_joint_uses, which weft_comm_group_end runs) around no work (is it
 *               weft's own host work, among NCCL's?);
 *   RAW_BOOK_FIRST  the same bookkeeping before raw NCCL rather than after: NCCL's group launch
 *               empties the host's caches, so the bookkeeping after it finds its data cold, the
 *               bookkeeping before it warm (from the previous iteration's). The difference between
 *               the two is what cold data costs weft's group (the per-repetition differences to
 *               raw NCCL, medians, are the last two columns).
 *   RAW_JOINT   raw NCCL on weft's streams run inside weft's joint use of both ranks (the work of
 *               weft_comm_group_end's use, NCCL where weft_comm_group_end calls it), without the
 *               communicator layer's calls: weft minus this is what the layer's calls cost;
 *   RAW_FLOOR   raw NCCL, then the floor of a tracker (bench.h) for each rank's buffer: what the
 *               least thread-safe tracker would add (one mutex hold and the history of each block). */
enum { RAW, WEFT, RAW_RECORD, RAW_SWITCH, RAW_PROBE, RAW_ON_WEFT, RAW_BOOK, RAW_BOOK_FIRST, RAW_JOINT, RAW_FLOOR };

static weft_status_t no_work(weft_stream_t *s, void *arg) {
  (void)s;
  (void)arg;
  return WEFT_OK;
}

/* weft's joint use of both ranks' communicator streams and buffers (weft__use_joint_uses, as
 * weft_comm_group_end runs it, after weft__use_joint resolves the buffers) around fn: no work
 * (RAW_BOOK, RAW_BOOK_FIRST) or a raw NCCL group (RAW_JOINT). */
static void joint(pair_t *p, weft_status_t (*fn)(weft_stream_t *, void *), void *arg) {
  weft_stream_t *s[2] = {weft_comm_stream(p->comm[0]), weft_comm_stream(p->comm[1])};
  weft_access_t a0[1] = {{p->buf[0], WEFT_READ_WRITE}}, a1[1] = {{p->buf[1], WEFT_READ_WRITE}};
  const weft_access_t *acc[2] = {a0, a1};
  size_t n[2] = {1, 1};
  BENCH_WEFT(weft__use_joint(s, acc, n, 2, "bench", fn, arg));
}

/* One raw NCCL group, an in-place all-reduce per rank on streams on[0], on[1]. */
static void raw_all_reduce(const weft__nccl_t *nl, const pair_t *p, size_t count, const CUstream *on) {
  if (nl->ncclGroupStart() != ncclSuccess) bench_die("ncclGroupStart");
  for (int r = 0; r < 2; r++)
    if (nl->ncclAllReduce((void *)p->ptr[r], (void *)p->ptr[r], count, ncclFloat32, ncclSum, p->nc[r],
                          (cudaStream_t)on[r]) != ncclSuccess)
      bench_die("ncclAllReduce");
  if (nl->ncclGroupEnd() != ncclSuccess) bench_die("ncclGroupEnd");
}

/* RAW_JOINT's work: the raw group on weft's own streams. */
typedef struct raw_group {
  const weft__nccl_t *nl;
  const pair_t *p;
  size_t count;
} raw_group_t;

static weft_status_t raw_group(weft_stream_t *s, void *arg) {
  (void)s;
  const raw_group_t *g = arg;
  raw_all_reduce(g->nl, g->p, g->count, g->p->wraw);
  return WEFT_OK;
}

/* One all-reduce of each rank, issued the way `how` says (the modes above). */
static inline void one(bench_t *b, const weft__nccl_t *nl, pair_t *p, size_t count, int how) {
  if (how == WEFT) {
    BENCH_WEFT(weft_comm_group_begin());
    for (int r = 0; r < 2; r++)
      BENCH_WEFT(weft_all_reduce(p->comm[r], p->buf[r], 0, p->buf[r], 0, count, WEFT_FLOAT32, WEFT_SUM, NULL));
    BENCH_WEFT(weft_comm_group_end());
  } else if (how == RAW_JOINT) {
    raw_group_t g = {nl, p, count};
    joint(p, raw_group, &g);
  } else {
    if (how == RAW_BOOK_FIRST) joint(p, no_work, NULL);
    raw_all_reduce(nl, p, count, how == RAW_ON_WEFT ? p->wraw : p->raw);
    if (how == RAW_BOOK) joint(p, no_work, NULL);
    for (int r = 0; r < 2 && how == RAW_FLOOR; r++)
      if (bench_floor_use((unsigned)r, r, -1, 1)) bench_die("the floor of a tracker placed a wait between ranks");
    for (int r = 0; r < 2 && how == RAW_RECORD; r++) BENCH_CU(b->drv->cuEventRecord(p->ev[r], p->raw[r]));
    for (int r = 1; r >= 0 && how == RAW_SWITCH; r--) BENCH_CU(b->drv->cuCtxSetCurrent(p->ctx[r]));
    for (int r = 0; r < 4 && how == RAW_PROBE; r++) {
      CUcontext cur;
      CUstreamCaptureStatus cs;
      BENCH_CU(b->drv->cuCtxGetCurrent(&cur));
      BENCH_CU(b->drv->cuStreamIsCapturing(p->raw[r / 2], &cs));
    }
  }
}

/* Both ranks' streams synchronised after a run of `how`. */
static void finish(bench_t *b, pair_t *p, int how) {
  for (int r = 0; r < 2; r++) {
    if (how == WEFT || how == RAW_BOOK || how == RAW_BOOK_FIRST || how == RAW_JOINT) BENCH_WEFT(weft_stream_synchronize(weft_comm_stream(p->comm[r])));
    if (how != WEFT && how != RAW_JOINT) BENCH_CU(b->drv->cuStreamSynchronize(how == RAW_ON_WEFT ? p->wraw[r] : p->raw[r]));
  }
}

/* The NCCL communicators under weft's (the same ones the raw path uses): made separately with
 * ncclCommInitAll, and adopted by weft. Microseconds per all-reduce of `iters` issued `how`,
 * ending in one synchronisation; *host_us: to the last call's return. */
static double run(bench_t *b, const weft__nccl_t *nl, pair_t *p, size_t count, unsigned iters, int how, double *host_us) {
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < iters; i++) one(b, nl, p, count, how);
  if (host_us != NULL) *host_us = (double)(bench_now_ns() - t0) / iters / 1000.0;
  finish(b, p, how);
  return (double)(bench_now_ns() - t0) / iters / 1000.0;
}

/* The median host time of one iteration (ns) over `iters` issued `how`, each timed on its own:
 * the typical iteration, which the slow ones a repetition's mean takes in (NCCL's host time swings
 * from one repetition to the next) do not move. A separate run from run()'s: the clock readings
 * add about as much to either way. */
#define TIMED_MAX 1000
static double run_timed(bench_t *b, const weft__nccl_t *nl, pair_t *p, size_t count, unsigned iters, int how) {
  static double t[TIMED_MAX];
  if (iters > TIMED_MAX) iters = TIMED_MAX;
  uint64_t prev = bench_now_ns();
  for (unsigned i = 0; i < iters; i++) {
    one(b, nl, p, count, how);
    uint64_t now = bench_now_ns();
    t[i] = (double)(now - prev);
    prev = now;
  }
  finish(b, p, how);
  return bench_median(t, iters);
}

/* Events weft recorded so far on both runtimes (weft_runtime_counters). */
static uint64_t events_recorded(const pair_t *p) {
  uint64_t n = 0;
  for (int r = 0; r < 2; r++) {
    weft_counters_t c;
    BENCH_WEFT(weft_runtime_counters(p->rt[r], &c));
    n += c.events_recorded;
  }
  return n;
}

/* ---- one thread per rank ----
 * Each rank's all-reduces issued by a thread of its own, as a process per GPU does: the thread
 * stays on its device, so no context changes, and each all-reduce is one call (one tracked use,
 * or one ncclAllReduce: NCCL needs no group with a thread per rank). */
typedef struct ranker {
  bench_t *b;
  const weft__nccl_t *nl;
  pair_t *p;
  int r, how; /* WEFT, RAW or RAW_RECORD (the modes of the one-group table, above) */
  size_t count;
  unsigned iters;
  pthread_barrier_t *start;
  uint64_t begin, host_end, end; /* when its first call began; its last returned; its stream finished */
} ranker_t;

static void *rank_loop(void *arg) {
  ranker_t *k = arg;
  pair_t *p = k->p;
  BENCH_CU(k->b->drv->cuCtxSetCurrent(p->ctx[k->r]));
  pthread_barrier_wait(k->start);
  k->begin = bench_now_ns();
  for (unsigned i = 0; i < k->iters; i++) {
    if (k->how == WEFT)
      BENCH_WEFT(weft_all_reduce(p->comm[k->r], p->buf[k->r], 0, p->buf[k->r], 0, k->count, WEFT_FLOAT32, WEFT_SUM, NULL));
    else if (k->nl->ncclAllReduce((void *)p->ptr[k->r], (void *)p->ptr[k->r], k->count, ncclFloat32, ncclSum,
                                  p->nc[k->r], (cudaStream_t)p->raw[k->r]) != ncclSuccess)
      bench_die("ncclAllReduce");
    else if (k->how == RAW_RECORD) /* what an exact lane adds: its use's event (streams/README.md, "Exact lanes") */
      BENCH_CU(k->b->drv->cuEventRecord(p->ev[k->r], p->raw[k->r]));
  }
  k->host_end = bench_now_ns();
  if (k->how == WEFT) BENCH_WEFT(weft_stream_synchronize(weft_comm_stream(p->comm[k->r])));
  else BENCH_CU(k->b->drv->cuStreamSynchronize(p->raw[k->r]));
  k->end = bench_now_ns();
  return NULL;
}

/* Microseconds per all-reduce with a thread per rank (how: WEFT, RAW, or RAW_RECORD: raw NCCL and an
 * event record after each all-reduce), from the earlier rank's start to the later rank's end;
 * *host_us: to the later rank's last call. The start is the ranks' own clock reading after their
 * barrier: a reading by this thread could come after a rank's last call (it happened at 256 MiB,
 * 20 all-reduces: an underflow, 9.2e14 us in bench/data/h200x2-4a4327b). */
static double run_threads(bench_t *b, const weft__nccl_t *nl, pair_t *p, size_t count, unsigned iters, int how,
                          double *host_us) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, 2);
  ranker_t k[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    k[r] = (ranker_t){b, nl, p, r, how, count, iters, &start, 0, 0, 0};
    if (pthread_create(&th[r], NULL, rank_loop, &k[r]) != 0) bench_die("pthread_create");
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&start);
  BENCH_CU(b->drv->cuCtxSetCurrent(p->ctx[0]));
  uint64_t t0 = k[0].begin < k[1].begin ? k[0].begin : k[1].begin;
  uint64_t host = k[0].host_end > k[1].host_end ? k[0].host_end : k[1].host_end;
  uint64_t end = k[0].end > k[1].end ? k[0].end : k[1].end;
  if (host_us != NULL) *host_us = (double)(host - t0) / iters / 1000.0;
  return (double)(end - t0) / iters / 1000.0;
}

/* The smallest and largest of v[0..n), n >= 1. */
static void min_max(const double *v, unsigned n, double *lo, double *hi) {
  *lo = *hi = v[0];
  for (unsigned k = 1; k < n; k++) {
    if (v[k] < *lo) *lo = v[k];
    if (v[k] > *hi) *hi = v[k];
  }
}

/* NCCL's table where there are two devices and NCCL; else NULL, the section's skip printed. */
static const weft__nccl_t *two_devices_and_nccl(bench_t *b) {
  int ndev = 0;
  BENCH_CU(b->drv->cuDeviceGetCount(&ndev));
  const weft__nccl_t *nl = NULL;
  if (ndev < 2 || weft__nccl_get(&nl) != WEFT_OK) {
    printf("skipped: %s\n\n", ndev < 2 ? "one device" : weft_last_error());
    return NULL;
  }
  return nl;
}

/* The samples and table row of one size of a per-rank mode (a thread or a process per rank):
 * weft's and raw NCCL's microseconds per all-reduce (w, raw) and host microseconds to enqueue
 * (wh, rh) over `reps` repetitions, and weft's events per all-reduce where evs is not NULL. */
static void report_per_rank(bench_t *b, const char *wn, const char *rn, size_t count, unsigned reps, double *w,
                            double *raw, double *wh, double *rh, double *evs) {
  double ratio[BENCH_MAX_REPS], lo, hi;
  for (unsigned k = 0; k < reps; k++) ratio[k] = w[k] / raw[k];
  min_max(ratio, reps, &lo, &hi);
  char x[32];
  snprintf(x, sizeof x, "%zu", count * 4);
  for (unsigned k = 0; k < reps; k++) {
    bench_sample(b, "comm", wn, "us per all-reduce", "us", rn, x, k, w[k]);
    bench_sample(b, "comm", rn, "us per all-reduce", "us", NULL, x, k, raw[k]);
    bench_sample(b, "comm", wn, "host us to enqueue", "us", rn, x, k, wh[k]);
    bench_sample(b, "comm", rn, "host us to enqueue", "us", NULL, x, k, rh[k]);
    if (evs != NULL) bench_sample(b, "comm", wn, "events recorded per all-reduce", "events", NULL, x, k, evs[k]);
  }
  printf("| %zu | %.1f | %.1f | %.3f | %.3f-%.3f | %.2f | %.2f |", count * 4, bench_median(w, reps),
         bench_median(raw, reps), bench_median(ratio, reps), lo, hi, bench_median(wh, reps), bench_median(rh, reps));
  if (evs != NULL) printf(" %.3f |", bench_median(evs, reps));
  printf("\n");
}

/* Sizes below 16 MiB are bound by the host's enqueueing (NCCL's own is about 22 us a group on 2 x
 * H200), whose time swings from one repetition to the next (a ratio range of 0.57-1.55 over 9
 * repetitions of 200 at 1 MiB, bench/data/h200x2-ab307c2): on a GPU they take 1,000 all-reduces
 * a repetition and at least 15 repetitions. */
static unsigned comm_iters(const bench_t *b, size_t count) {
  /* (On the simulator, and with --quick, the counts stay as they were: not performance numbers.) */
  return bench_count(b, count >= 16 * MIB ? 20 : b->quick || b->sim ? 200 : 1000, 2);
}
static unsigned comm_reps(const bench_t *b) {
  unsigned reps = b->quick || b->sim || b->reps >= 15 ? b->reps : 15;
  return reps < BENCH_MAX_REPS ? reps : BENCH_MAX_REPS;
}

void bench_comm(bench_t *b) {
  bench_section(b, "Collectives: all-reduce through weft and raw NCCL",
                "float32 sum over two devices of one process, in place; weft_all_reduce (a tracked use per rank, one "
                "weft group) against ncclAllReduce (one NCCL group) on the same buffers, on streams of the same priority; "
                "microseconds per "
                "all-reduce, median of the repetitions, the two alternating. Goal: within 2% at every size.");
  const weft__nccl_t *nl = two_devices_and_nccl(b);
  if (nl == NULL) return;
  pair_t p = {0};
  p.rt[0] = bench_runtime(NULL);
  BENCH_WEFT(weft_runtime_get(1, NULL, &p.rt[1]));
  if (nl->ncclCommInitAll(p.nc, 2, (int[]){0, 1}) != ncclSuccess) bench_die("ncclCommInitAll");
  size_t max_count = (b->quick ? 1 : 64) * MIB; /* floats: 256 MiB */
  for (int r = 0; r < 2; r++) {
    BENCH_WEFT(weft_comm_adopt(p.rt[r], p.nc[r], &p.comm[r]));
    weft_stream_t *s = weft_comm_stream(p.comm[r]);
    BENCH_WEFT(weft_alloc(p.rt[r], max_count * 4, s, "allreduce", &p.buf[r]));
    BENCH_WEFT(weft_block_ptr(p.buf[r], &p.ptr[r]));
    BENCH_WEFT(weft_memset32(s, p.buf[r], 0, 0, max_count * 4));
    BENCH_WEFT(weft_stream_synchronize(s)); /* the raw path's streams do not wait for weft's */
    CUcontext ctx; /* the device's primary context, weft's too: the stream and event belong to its device */
    BENCH_CU(b->drv->cuDevicePrimaryCtxRetain(&ctx, r));
    BENCH_CU(b->drv->cuCtxSetCurrent(ctx));
    /* The raw path's own stream, of the communicator stream's priority: weft's stays unexposed
     * (weft_stream_raw would expose it), as in a program that leaves its streams to weft. */
    int prio;
    BENCH_WEFT(weft_stream_priority(s, &prio));
    BENCH_CU(b->drv->cuStreamCreateWithPriority(&p.raw[r], CU_STREAM_NON_BLOCKING, prio));
    BENCH_CU(b->drv->cuEventCreate(&p.ev[r], CU_EVENT_DISABLE_TIMING));
    p.ctx[r] = ctx; /* kept retained until the end */
    p.wraw[r] = s->raw; /* read, not weft_stream_raw: that would expose the stream (an event after every use) */
  }
  static const char *const cols[] = {"bytes",         "weft us",           "raw NCCL us",
                                     "weft / raw",    "range of weft / raw", "raw + event record us",
                                     "weft host us",  "raw host us", "raw + record host us",
                                     "raw + 2 context switches host us", "raw + 4 probes host us",
                                     "raw on weft's streams host us", "raw + weft's bookkeeping host us",
                                     "raw + weft's bookkeeping first host us", "bookkeeping after - raw host us",
                                     "bookkeeping first - raw host us", "raw NCCL inside weft's joint use us",
                                     "joint use / raw", "raw + the floor of a tracker host us"};
  bench_table(cols, 19);
  bool timed_line = false;
  double timed_ratio = 0, timed_diff = 0, timed_book = 0, timed_weft = 0, timed_raw = 0;
  for (size_t count = MIB / 4; count <= max_count; count *= 4) {
    unsigned iters = comm_iters(b, count);
    double w[BENCH_MAX_REPS], raw[BENCH_MAX_REPS], ratio[BENCH_MAX_REPS], rec[BENCH_MAX_REPS], wh[BENCH_MAX_REPS],
        rh[BENCH_MAX_REPS], qh[BENCH_MAX_REPS], sh[BENCH_MAX_REPS], ph[BENCH_MAX_REPS], oh[BENCH_MAX_REPS],
        kh[BENCH_MAX_REPS], fh[BENCH_MAX_REPS], dk[BENCH_MAX_REPS], df[BENCH_MAX_REPS], jw[BENCH_MAX_REPS],
        jh[BENCH_MAX_REPS], jr[BENCH_MAX_REPS], evs[BENCH_MAX_REPS], lh[BENCH_MAX_REPS], ti_weft[BENCH_MAX_REPS],
        ti_raw[BENCH_MAX_REPS], ti_book[BENCH_MAX_REPS];
    unsigned reps = comm_reps(b);
    (void)run(b, nl, &p, count, 2, WEFT, NULL); /* warm every path */
    (void)run(b, nl, &p, count, 2, RAW, NULL);
    (void)run(b, nl, &p, count, 2, RAW_RECORD, NULL);
    (void)run(b, nl, &p, count, 2, RAW_SWITCH, NULL);
    (void)run(b, nl, &p, count, 2, RAW_PROBE, NULL);
    (void)run(b, nl, &p, count, 2, RAW_ON_WEFT, NULL);
    (void)run(b, nl, &p, count, 2, RAW_BOOK, NULL);
    (void)run(b, nl, &p, count, 2, RAW_BOOK_FIRST, NULL);
    (void)run(b, nl, &p, count, 2, RAW_JOINT, NULL);
    bench_floor_reset();
    (void)run(b, nl, &p, count, 2, RAW_FLOOR, NULL);
    for (unsigned k = 0; k < reps; k++) {
      /* weft and raw alternate which runs first, so that neither always follows the other. */
      if (k & 1) raw[k] = run(b, nl, &p, count, iters, RAW, &rh[k]);
      uint64_t ev0 = events_recorded(&p);
      w[k] = run(b, nl, &p, count, iters, WEFT, &wh[k]);
      evs[k] = (double)(events_recorded(&p) - ev0) / iters; /* (the closing synchronisation's too) */
      if (!(k & 1)) raw[k] = run(b, nl, &p, count, iters, RAW, &rh[k]);
      jw[k] = run(b, nl, &p, count, iters, RAW_JOINT, &jh[k]);
      jr[k] = jw[k] / raw[k];
      rec[k] = run(b, nl, &p, count, iters, RAW_RECORD, &qh[k]);
      (void)run(b, nl, &p, count, iters, RAW_SWITCH, &sh[k]);
      (void)run(b, nl, &p, count, iters, RAW_PROBE, &ph[k]);
      (void)run(b, nl, &p, count, iters, RAW_ON_WEFT, &oh[k]);
      (void)run(b, nl, &p, count, iters, RAW_BOOK, &kh[k]);
      (void)run(b, nl, &p, count, iters, RAW_BOOK_FIRST, &fh[k]);
      (void)run(b, nl, &p, count, iters, RAW_FLOOR, &lh[k]);
      ratio[k] = w[k] / raw[k];
      dk[k] = kh[k] - rh[k];
      df[k] = fh[k] - rh[k];
      if (count == MIB / 4) { /* host-bound: the typical iteration of each way, alternating */
        if (k & 1) ti_raw[k] = run_timed(b, nl, &p, count, iters, RAW);
        ti_weft[k] = run_timed(b, nl, &p, count, iters, WEFT);
        if (!(k & 1)) ti_raw[k] = run_timed(b, nl, &p, count, iters, RAW);
        ti_book[k] = run_timed(b, nl, &p, count, iters, RAW_BOOK);
      }
    }
    double lo, hi;
    min_max(ratio, reps, &lo, &hi);
    char x[32];
    snprintf(x, sizeof x, "%zu", count * 4);
    if (count == MIB / 4) {
      static const char tn[] = "weft_all_reduce, one weft group (median iteration)",
                        tr[] = "raw ncclAllReduce, one NCCL group (median iteration)",
                        tk[] = "raw ncclAllReduce + weft's group bookkeeping around no work (median iteration, diagnostic)";
      double tratio[BENCH_MAX_REPS], tdiff[BENCH_MAX_REPS], kdiff[BENCH_MAX_REPS];
      for (unsigned k = 0; k < reps; k++) {
        bench_sample(b, "comm", tn, "host ns per group", "ns", tr, x, k, ti_weft[k]);
        bench_sample(b, "comm", tr, "host ns per group", "ns", NULL, x, k, ti_raw[k]);
        bench_sample(b, "comm", tk, "host ns per group", "ns", tr, x, k, ti_book[k]);
        tratio[k] = ti_weft[k] / ti_raw[k];
        tdiff[k] = ti_weft[k] - ti_raw[k];
        kdiff[k] = ti_book[k] - ti_raw[k];
      }
      timed_line = true;
      timed_ratio = bench_median(tratio, reps);
      timed_diff = bench_median(tdiff, reps);
      timed_book = bench_median(kdiff, reps);
      timed_weft = bench_median(ti_weft, reps);
      timed_raw = bench_median(ti_raw, reps);
    }
    static const char wn[] = "weft_all_reduce, one weft group", rn[] = "raw ncclAllReduce, one NCCL group",
                      qn[] = "raw ncclAllReduce + an event record per stream",
                      sn[] = "raw ncclAllReduce + 2 context switches", pn[] = "raw ncclAllReduce + 4 capture probes",
                      on[] = "raw ncclAllReduce on weft's streams (diagnostic)",
                      kn[] = "raw ncclAllReduce + weft's group bookkeeping around no work (diagnostic)",
                      fn[] = "weft's group bookkeeping around no work + raw ncclAllReduce (diagnostic)",
                      jn[] = "raw ncclAllReduce inside weft's joint use (diagnostic)",
                      ln[] = "raw ncclAllReduce + the floor of a tracker (diagnostic)";
    for (unsigned k = 0; k < reps; k++) {
      bench_sample(b, "comm", wn, "us per all-reduce", "us", rn, x, k, w[k]);
      bench_sample(b, "comm", rn, "us per all-reduce", "us", NULL, x, k, raw[k]);
      bench_sample(b, "comm", qn, "us per all-reduce", "us", rn, x, k, rec[k]);
      bench_sample(b, "comm", wn, "host us to enqueue", "us", rn, x, k, wh[k]);
      bench_sample(b, "comm", wn, "events recorded per all-reduce", "events", NULL, x, k, evs[k]);
      bench_sample(b, "comm", rn, "host us to enqueue", "us", NULL, x, k, rh[k]);
      bench_sample(b, "comm", qn, "host us to enqueue", "us", rn, x, k, qh[k]);
      bench_sample(b, "comm", sn, "host us to enqueue", "us", rn, x, k, sh[k]);
      bench_sample(b, "comm", pn, "host us to enqueue", "us", rn, x, k, ph[k]);
      bench_sample(b, "comm", on, "host us to enqueue", "us", rn, x, k, oh[k]);
      bench_sample(b, "comm", kn, "host us to enqueue", "us", rn, x, k, kh[k]);
      bench_sample(b, "comm", fn, "host us to enqueue", "us", rn, x, k, fh[k]);
      bench_sample(b, "comm", jn, "us per all-reduce", "us", rn, x, k, jw[k]);
      bench_sample(b, "comm", jn, "host us to enqueue", "us", rn, x, k, jh[k]);
      bench_sample(b, "comm", ln, "host us to enqueue", "us", rn, x, k, lh[k]);
    }
    double mw = bench_median(w, reps), mr = bench_median(raw, reps), mq = bench_median(ratio, reps);
    printf("| %zu | %.1f | %.1f | %.3f | %.3f-%.3f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f "
           "| %.1f | %.3f | %.2f |\n",
           count * 4, mw, mr, mq, lo, hi, bench_median(rec, reps), bench_median(wh, reps), bench_median(rh, reps),
           bench_median(qh, reps), bench_median(sh, reps), bench_median(ph, reps), bench_median(oh, reps),
           bench_median(kh, reps), bench_median(fh, reps), bench_median(dk, reps), bench_median(df, reps),
           bench_median(jw, reps), bench_median(jr, reps), bench_median(lh, reps));
  }
  printf("\n");
  if (timed_line)
    printf("1 MiB, the typical iteration (each timed on its own, median per repetition, then over repetitions): "
           "weft %.0f ns, raw NCCL %.0f ns per group, weft / raw %.3f, weft - raw %.0f ns; weft's group bookkeeping "
           "around no work after raw NCCL's group %.0f ns over raw.\n\n",
           timed_weft, timed_raw, timed_ratio, timed_diff, timed_book);
  printf("A thread per rank (each on its own device, one call per all-reduce, no group):\n\n");
  static const char *const tcols[] = {"bytes", "weft us", "raw NCCL us", "weft / raw", "range of weft / raw",
                                      "weft host us", "raw host us", "events per all-reduce"};
  bench_table(tcols, 8);
  /* With a thread per rank in a process of two runtimes the communicator streams are exact lanes:
   * each all-reduce records its event (the events column), which the raw path with a record per
   * all-reduce (a diagnostic row, printed below the table) also pays. */
  double rec_ratio[8] = {0};
  unsigned nsizes = 0;
  for (size_t count = MIB / 4; count <= max_count; count *= 4) {
    unsigned iters = comm_iters(b, count);
    double w[BENCH_MAX_REPS], raw[BENCH_MAX_REPS], wh[BENCH_MAX_REPS], rh[BENCH_MAX_REPS], evs[BENCH_MAX_REPS],
        rec[BENCH_MAX_REPS], rech[BENCH_MAX_REPS], rr[BENCH_MAX_REPS];
    unsigned reps = comm_reps(b);
    (void)run_threads(b, nl, &p, count, 2, WEFT, NULL); /* warm the paths */
    (void)run_threads(b, nl, &p, count, 2, RAW, NULL);
    (void)run_threads(b, nl, &p, count, 2, RAW_RECORD, NULL);
    for (unsigned k = 0; k < reps; k++) {
      uint64_t ev0 = events_recorded(&p);
      w[k] = run_threads(b, nl, &p, count, iters, WEFT, &wh[k]);
      evs[k] = (double)(events_recorded(&p) - ev0) / iters / 2; /* per rank's all-reduce */
      raw[k] = run_threads(b, nl, &p, count, iters, RAW, &rh[k]);
      rec[k] = run_threads(b, nl, &p, count, iters, RAW_RECORD, &rech[k]);
      rr[k] = rec[k] / raw[k];
    }
    report_per_rank(b, "weft_all_reduce, a thread per rank", "raw ncclAllReduce, a thread per rank", count, reps, w,
                    raw, wh, rh, evs);
    char x[32];
    snprintf(x, sizeof x, "%zu", count * 4);
    static const char qn[] = "raw ncclAllReduce + an event record, a thread per rank (diagnostic)";
    for (unsigned k = 0; k < reps; k++) {
      bench_sample(b, "comm", qn, "us per all-reduce", "us", "raw ncclAllReduce, a thread per rank", x, k, rec[k]);
      bench_sample(b, "comm", qn, "host us to enqueue", "us", "raw ncclAllReduce, a thread per rank", x, k, rech[k]);
    }
    if (nsizes < 8) rec_ratio[nsizes++] = bench_median(rr, reps);
  }
  printf("\nRaw NCCL with an event record after each all-reduce, a thread per rank, against raw NCCL alone "
         "(medians, from 1 MiB up):");
  for (unsigned i = 0; i < nsizes; i++) printf(" %.3f", rec_ratio[i]);
  printf("\n\n");
  for (int r = 0; r < 2; r++) {
    BENCH_WEFT(weft_free(p.buf[r], weft_comm_stream(p.comm[r])));
    BENCH_WEFT(weft_runtime_synchronize(p.rt[r]));
    BENCH_WEFT(weft_comm_destroy(p.comm[r]));
    BENCH_CU(b->drv->cuEventDestroy(p.ev[r]));
    BENCH_CU(b->drv->cuStreamDestroy(p.raw[r]));
    BENCH_CU(b->drv->cuDevicePrimaryCtxRelease(r));
    if (nl->ncclCommDestroy(p.nc[r]) != ncclSuccess) bench_die("ncclCommDestroy");
  }
  BENCH_WEFT(weft_runtime_release(p.rt[1]));
  BENCH_WEFT(weft_runtime_release(p.rt[0]));
}

/* ---- a process per rank ----
 * The launch mode of torchrun and of several machines: each rank a process with the runtime of
 * its one device, so weft's waits need not stay exact (one runtime in the process) and each
 * all-reduce is one call. Rank 0 is this process; rank 1 is this binary again
 * (/proc/self/exe --comm-child ID_FILE QUICK REPS), which runs the same sequence of all-reduces on
 * device 1 (NCCL keeps the two in step) and records nothing. The NCCL communicator is made with
 * ncclCommInitRank from an id passed through ID_FILE, and adopted by weft, so both paths use the
 * same one. */
typedef struct proc_rank {
  bench_t *b;
  const weft__nccl_t *nl;
  int rank;
  weft_runtime_t *rt;
  ncclComm_t nc;
  weft_comm_t *comm;
  weft_block_t buf;
  CUdeviceptr ptr;
  CUstream raw;
  CUcontext ctx;
} proc_rank_t;

/* Microseconds per all-reduce of `iters` in a row, through weft or raw NCCL; *host_us to the last
 * call's return. */
static double proc_run(proc_rank_t *q, size_t count, unsigned iters, int weft, double *host_us) {
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < iters; i++) {
    if (weft) BENCH_WEFT(weft_all_reduce(q->comm, q->buf, 0, q->buf, 0, count, WEFT_FLOAT32, WEFT_SUM, NULL));
    else if (q->nl->ncclAllReduce((void *)q->ptr, (void *)q->ptr, count, ncclFloat32, ncclSum, q->nc,
                                  (cudaStream_t)q->raw) != ncclSuccess)
      bench_die("ncclAllReduce");
  }
  if (host_us != NULL) *host_us = (double)(bench_now_ns() - t0) / iters / 1000.0;
  if (weft) BENCH_WEFT(weft_stream_synchronize(weft_comm_stream(q->comm)));
  else BENCH_CU(q->b->drv->cuStreamSynchronize(q->raw));
  return (double)(bench_now_ns() - t0) / iters / 1000.0;
}

/* Rank q->rank's part: sets up, runs every size (rank 0 records the samples), tears down. */
static void proc_rank_run(proc_rank_t *q, const char *id_file) {
  bench_t *b = q->b;
  ncclUniqueId id;
  if (q->rank == 0) {
    if (q->nl->ncclGetUniqueId(&id) != ncclSuccess) bench_die("ncclGetUniqueId");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", id_file);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, id_file) != 0)
      bench_die("writing the NCCL id file");
  } else {
    FILE *f = NULL;
    for (int tries = 0; tries < 6000 && (f = fopen(id_file, "rb")) == NULL; tries++) usleep(10000);
    if (f == NULL || fread(&id, sizeof id, 1, f) != 1) bench_die("reading the NCCL id file");
    fclose(f);
  }
  CUdevice dev;
  BENCH_CU(b->drv->cuDeviceGet(&dev, q->rank));
  BENCH_CU(b->drv->cuDevicePrimaryCtxRetain(&q->ctx, dev));
  BENCH_CU(b->drv->cuCtxSetCurrent(q->ctx));
  if (q->nl->ncclCommInitRank(&q->nc, 2, id, q->rank) != ncclSuccess) bench_die("ncclCommInitRank");
  q->rt = q->rank == 0 ? bench_runtime(NULL) : NULL;
  if (q->rt == NULL) BENCH_WEFT(weft_runtime_get(q->rank, NULL, &q->rt));
  BENCH_WEFT(weft_comm_adopt(q->rt, q->nc, &q->comm));
  weft_stream_t *s = weft_comm_stream(q->comm);
  size_t max_count = (b->quick ? 1 : 64) * MIB;
  BENCH_WEFT(weft_alloc(q->rt, max_count * 4, s, "allreduce", &q->buf));
  BENCH_WEFT(weft_block_ptr(q->buf, &q->ptr));
  BENCH_WEFT(weft_memset32(s, q->buf, 0, 0, max_count * 4));
  BENCH_WEFT(weft_stream_synchronize(s));
  int prio;
  BENCH_WEFT(weft_stream_priority(s, &prio));
  BENCH_CU(b->drv->cuCtxSetCurrent(q->ctx));
  BENCH_CU(b->drv->cuStreamCreateWithPriority(&q->raw, CU_STREAM_NON_BLOCKING, prio));
  for (size_t count = MIB / 4; count <= max_count; count *= 4) {
    unsigned iters = comm_iters(b, count), reps = comm_reps(b);
    double w[BENCH_MAX_REPS], raw[BENCH_MAX_REPS], wh[BENCH_MAX_REPS], rh[BENCH_MAX_REPS], evs[BENCH_MAX_REPS];
    (void)proc_run(q, count, 2, 1, NULL); /* warm both paths */
    (void)proc_run(q, count, 2, 0, NULL);
    for (unsigned k = 0; k < reps; k++) {
      if (k & 1) raw[k] = proc_run(q, count, iters, 0, &rh[k]);
      weft_counters_t c0, c1;
      BENCH_WEFT(weft_runtime_counters(q->rt, &c0));
      w[k] = proc_run(q, count, iters, 1, &wh[k]);
      BENCH_WEFT(weft_runtime_counters(q->rt, &c1));
      evs[k] = (double)(c1.events_recorded - c0.events_recorded) / iters;
      if (!(k & 1)) raw[k] = proc_run(q, count, iters, 0, &rh[k]);
    }
    if (q->rank == 0)
      report_per_rank(b, "weft_all_reduce, a process per rank", "raw ncclAllReduce, a process per rank", count, reps,
                      w, raw, wh, rh, evs);
  }
  BENCH_WEFT(weft_free(q->buf, s));
  BENCH_WEFT(weft_runtime_synchronize(q->rt));
  BENCH_WEFT(weft_comm_destroy(q->comm));
  BENCH_CU(b->drv->cuCtxSetCurrent(q->ctx));
  BENCH_CU(b->drv->cuStreamDestroy(q->raw));
  if (q->nl->ncclCommDestroy(q->nc) != ncclSuccess) bench_die("ncclCommDestroy");
  BENCH_WEFT(weft_runtime_release(q->rt));
  BENCH_CU(b->drv->cuDevicePrimaryCtxRelease(dev));
}

void bench_comm_procs(bench_t *b) {
  printf("A process per rank (rank 1 a second process on device 1; one call per all-reduce):\n\n");
  const weft__nccl_t *nl = two_devices_and_nccl(b);
  if (nl == NULL) return;
  static const char *const cols[] = {"bytes",        "weft us",     "raw NCCL us", "weft / raw", "range of weft / raw",
                                     "weft host us", "raw host us", "events per all-reduce"};
  bench_table(cols, 8);
  char id_file[512], quick[8], reps[16];
  snprintf(id_file, sizeof id_file, "%s/weft_bench_comm_id.%ld", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
           (long)getpid());
  (void)unlink(id_file);
  snprintf(quick, sizeof quick, "%d", b->quick);
  snprintf(reps, sizeof reps, "%u", b->reps);
  char *args[] = {"weft_bench", "--comm-child", id_file, quick, reps, NULL};
  pid_t child;
  extern char **environ;
  if (posix_spawn(&child, "/proc/self/exe", NULL, NULL, args, environ) != 0) bench_die("posix_spawn (rank 1)");
  proc_rank_t q = {.b = b, .nl = nl, .rank = 0};
  proc_rank_run(&q, id_file);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    bench_die("rank 1's process failed");
  (void)unlink(id_file);
  BENCH_CU(b->drv->cuCtxSetCurrent(b->ctx));
  printf("\n");
}

int bench_comm_child(int argc, char **argv) {
  if (argc != 5) bench_die("usage: weft_bench --comm-child ID_FILE QUICK REPS");
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with rank 0 (else NCCL would wait for it forever) */
  bench_t b = {0};
  weft_driver_info_t info;
  BENCH_WEFT(weft_driver_info(&info));
  BENCH_WEFT(weft__driver_get(&b.drv));
  b.sim = info.is_simulator;
  b.quick = atoi(argv[3]);
  b.reps = (unsigned)atoi(argv[4]);
  const weft__nccl_t *nl;
  BENCH_WEFT(weft__nccl_get(&nl));
  proc_rank_t q = {.b = &b, .nl = nl, .rank = 1};
  proc_rank_run(&q, argv[2]);
  return 0;
}
