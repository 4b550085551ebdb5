/* Curves (issue 17): how the host cost of weft's paths grows with what a program has, each point
 * measured as the other sections measure a figure (bench_measure: the series of a point
 * interleaved, the median of b->reps samples), with its parameter in the CSV's `x` column:
 *   curve_tracker_streams   a use against the runtime's stream count (with and without an edge);
 *   curve_tracker_blocks    a use against the number of live blocks (a fixed one, a random one);
 *   curve_tracker_accesses  a use against its number of accesses, beside a raw cuEventRecord;
 *   curve_pool              a `pool` resource pair against the number of live (fragmenting) blocks;
 *   curve_graph             instantiating and launching a captured chain against its kernel count;
 *   curve_threads           launches from T threads, each on a stream of its own, against T;
 *   curve_sim               the simulator's own speed against program length (simulator only).
 * Nothing is derived here (no ratios, no fits): bench/results.py draws the curves from the CSV. */
#include <pthread.h>
#include <stdlib.h>

#include "bench/bench.h"

#define MAX_STREAMS 64   /* the most pool streams a point asks for */
#define MAX_ACCESSES 64  /* the most accesses of one use */
#define RING 64          /* raw events for the cuEventRecord baseline, as weft's default ring */
#define ELEMS 256        /* elements per kernel: one thread block, tiny data */
#define SIM_STREAMS 4    /* curve_sim: streams the launches alternate over */
#define SIM_BLOCKS 8     /* curve_sim: blocks they read and write */

/* The cheap random numbers of the curves (the pipeline kernel's LCG). */
static uint32_t lcg_next(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return *state;
}

/* A uniform index below n from the high bits of r (no division in timed loops). */
static size_t pick(uint32_t r, size_t n) { return (size_t)(((uint64_t)r * n) >> 32); }

/* How many of a curve's x values this run takes: all on a GPU, `sim` of them on the simulator,
 * `quick` with --quick. */
static size_t points(const bench_t *b, size_t all, size_t sim, size_t quick) {
  size_t n = b->quick ? quick : b->sim ? sim : all;
  return n < all ? n : all;
}

static void curve_heading(const char *section, const char *title, const char *about) {
  printf("### %s (`%s`)\n\n%s\n\n", title, section, about);
}

/* Options with `streams` pool streams (0: the default count), none of them high priority. */
static weft_options_t plain_options(unsigned streams) {
  weft_options_t o = weft_options_default();
  if (streams != 0) o.stream_count = streams;
  o.high_priority_streams = 0; /* plain streams only, as a raw program's */
  return o;
}

/* ---- uses: curve_tracker_streams, curve_tracker_blocks, curve_tracker_accesses ------------- */

/* One series of uses: n uses of acc[0..k) going round streams s[0..nstreams), or (blocks != NULL)
 * one write per use of a block chosen at random among blocks[0..nblocks). */
typedef struct uses {
  weft_runtime_t *rt;
  weft_stream_t *const *s;
  unsigned nstreams;
  const weft_access_t *acc;
  size_t k;
  const weft_block_t *blocks;
  size_t nblocks;
  uint32_t lcg;
  unsigned n;
} uses_t;

/* ns per weft_use_begin + weft_use_end. */
static double use_sample(void *arg) {
  uses_t *u = arg;
  unsigned j = 0;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < u->n; i++) {
    weft_stream_t *on = u->s[j];
    if (++j == u->nstreams) j = 0;
    BENCH_WEFT(weft_use_begin(on, u->acc, u->k));
    BENCH_WEFT(weft_use_end(on, u->acc, u->k));
  }
  uint64_t t1 = bench_now_ns();
  /* Untimed: the host then knows everything complete, so the next sample starts alike. */
  BENCH_WEFT(weft_runtime_synchronize(u->rt));
  return (double)(t1 - t0) / u->n;
}

/* ns per use of one random live block (the pick is inside the timed loop, as a program's is). */
static double random_use_sample(void *arg) {
  uses_t *u = arg;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < u->n; i++) {
    weft_access_t acc = {u->blocks[pick(lcg_next(&u->lcg), u->nblocks)], WEFT_WRITE};
    BENCH_WEFT(weft_use_begin(u->s[0], &acc, 1));
    BENCH_WEFT(weft_use_end(u->s[0], &acc, 1));
  }
  uint64_t t1 = bench_now_ns();
  BENCH_WEFT(weft_runtime_synchronize(u->rt));
  return (double)(t1 - t0) / u->n;
}

/* The most pool streams weft_options_validate accepts, up to `want`. */
static unsigned max_streams(unsigned want) {
  unsigned s = want;
  for (; s > 1; s--) {
    weft_options_t o = plain_options(s);
    if (weft_options_validate(&o) == WEFT_OK) break;
  }
  return s;
}

static void curve_streams(const bench_t *b, unsigned n) {
  static const char sec[] = "curve_tracker_streams";
  static const unsigned xs[] = {2, 4, 8, 16, 32, 64};
  size_t np = points(b, 6, 6, 3);
  unsigned cap = max_streams(xs[np - 1]);
  char about[512];
  snprintf(about, sizeof about,
           "Host ns per `weft_use_begin` + `weft_use_end` of one write to one block, on a runtime of S "
           "plain pool streams (made for the point, released after it). *One edge*: the uses go round "
           "the S streams, so each waits for the previous stream. *No edge*: all on stream 0.%s",
           cap < xs[np - 1] ? " S is capped at the most `weft_options_validate` accepts." : "");
  curve_heading(sec, "Tracker: a use against the number of streams", about);
  static const char *const cols[] = {"streams", "use, one edge (ns)", "use, no edge (ns)"};
  bench_table(cols, 3);
  unsigned last = 0;
  for (size_t p = 0; p < np; p++) {
    unsigned streams = xs[p] < cap ? xs[p] : cap;
    if (streams == last) continue;
    last = streams;
    weft_options_t o = plain_options(streams);
    weft_runtime_t *rt = bench_runtime(&o);
    weft_stream_t *s[MAX_STREAMS];
    for (unsigned i = 0; i < streams; i++) BENCH_WEFT(weft_stream_get(rt, i, &s[i]));
    weft_block_t blk;
    BENCH_WEFT(weft_alloc(rt, 256, s[0], "curve", &blk));
    weft_access_t acc = {blk, WEFT_WRITE};
    uses_t edge = {.rt = rt, .s = s, .nstreams = streams, .acc = &acc, .k = 1, .n = n};
    uses_t plain = edge;
    plain.nstreams = 1;
    char x[16];
    snprintf(x, sizeof x, "%u", streams);
    bench_series_t series[2] = {{"use, one edge", NULL, x, use_sample, &edge},
                                {"use, no edge", NULL, x, use_sample, &plain}};
    double med[2];
    bench_measure(b, sec, "ns per use", "ns", series, 2, med);
    printf("| %u | %.0f | %.0f |\n", streams, med[0], med[1]);
    BENCH_WEFT(weft_free(blk, s[0]));
    BENCH_WEFT(weft_runtime_release(rt));
  }
  printf("\n");
}

static void curve_blocks(const bench_t *b, unsigned n) {
  static const char sec[] = "curve_tracker_blocks";
  static const unsigned xs[] = {100, 1000, 10000, 100000, 1000000};
  size_t np = points(b, 5, 4, 2);
  curve_heading(sec, "Tracker: a use against the number of live blocks",
                "N blocks of 256 B live (`weft_alloc` on stream 0); host ns per `weft_use_begin` + "
                "`weft_use_end` writing one of them on stream 0 (no edge): always the same block, or one "
                "chosen by an LCG among the N at each use (its records are then mostly cold).");
  static const char *const cols[] = {"live blocks", "use, no edge (ns)", "use of a random live block (ns)"};
  bench_table(cols, 3);
  weft_options_t o = plain_options(0);
  weft_runtime_t *rt = bench_runtime(&o);
  weft_stream_t *s;
  BENCH_WEFT(weft_stream_get(rt, 0, &s));
  weft_block_t *blocks = malloc(xs[np - 1] * sizeof *blocks);
  if (blocks == NULL) bench_die("curve_tracker_blocks: no host memory");
  size_t live = 0;
  for (size_t p = 0; p < np; p++) {
    for (; live < xs[p]; live++) BENCH_WEFT(weft_alloc(rt, 256, s, "curve", &blocks[live]));
    BENCH_WEFT(weft_runtime_synchronize(rt));
    weft_access_t acc = {blocks[0], WEFT_WRITE};
    uses_t fixed = {.rt = rt, .s = &s, .nstreams = 1, .acc = &acc, .k = 1, .n = n};
    uses_t random = {.rt = rt, .s = &s, .blocks = blocks, .nblocks = live, .lcg = 17, .n = n};
    char x[16];
    snprintf(x, sizeof x, "%u", xs[p]);
    bench_series_t series[2] = {{"use, no edge", NULL, x, use_sample, &fixed},
                                {"use of a random live block", NULL, x, random_use_sample, &random}};
    double med[2];
    bench_measure(b, sec, "ns per use", "ns", series, 2, med);
    printf("| %u | %.0f | %.0f |\n", xs[p], med[0], med[1]);
  }
  printf("\n");
  for (size_t i = 0; i < live; i++) BENCH_WEFT(weft_free(blocks[i], s));
  free(blocks);
  BENCH_WEFT(weft_runtime_release(rt));
}

/* The raw baseline of a use with no edge: one cuEventRecord on a raw stream, events in a ring. */
typedef struct raw_record {
  const bench_t *b;
  CUstream s;
  CUevent ev[RING];
  unsigned n;
} raw_record_t;

static double raw_record_sample(void *arg) {
  raw_record_t *r = arg;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < r->n; i++) BENCH_CU(r->b->drv->cuEventRecord(r->ev[i % RING], r->s));
  uint64_t t1 = bench_now_ns();
  BENCH_CU(r->b->drv->cuStreamSynchronize(r->s));
  return (double)(t1 - t0) / r->n;
}

static void curve_accesses(const bench_t *b, unsigned n) {
  static const char sec[] = "curve_tracker_accesses";
  static const unsigned xs[] = {1, 2, 4, 8, 16, 32, 64};
  size_t np = points(b, 7, 7, 3);
  curve_heading(sec, "Tracker: a use against its number of accesses",
                "Host ns per `weft_use_begin` + `weft_use_end` of k accesses to k blocks (a quarter "
                "written, at least one, the rest read), all on stream 0 (no edge), beside a raw "
                "`cuEventRecord` (what such a use records) measured at the same point.");
  static const char *const cols[] = {"accesses", "use, no edge (ns)", "raw cuEventRecord (ns)"};
  bench_table(cols, 3);
  const weft__driver_t *d = b->drv;
  raw_record_t raw = {.b = b, .n = n};
  BENCH_CU(d->cuStreamCreateWithPriority(&raw.s, CU_STREAM_NON_BLOCKING, 0));
  /* Flags as weft's ring events. */
  for (int i = 0; i < RING; i++) BENCH_CU(d->cuEventCreate(&raw.ev[i], CU_EVENT_DISABLE_TIMING));
  weft_options_t o = plain_options(0);
  weft_runtime_t *rt = bench_runtime(&o);
  weft_stream_t *s;
  BENCH_WEFT(weft_stream_get(rt, 0, &s));
  weft_block_t blk[MAX_ACCESSES];
  for (int i = 0; i < MAX_ACCESSES; i++) BENCH_WEFT(weft_alloc(rt, 256, s, "curve", &blk[i]));
  weft_access_t acc[MAX_ACCESSES];
  for (size_t p = 0; p < np; p++) {
    size_t k = xs[p], writes = k / 4 ? k / 4 : 1;
    for (size_t i = 0; i < k; i++) acc[i] = (weft_access_t){blk[i], i < writes ? WEFT_WRITE : WEFT_READ};
    uses_t u = {.rt = rt, .s = &s, .nstreams = 1, .acc = acc, .k = k, .n = n};
    char x[16];
    snprintf(x, sizeof x, "%zu", k);
    bench_series_t series[2] = {{"use, no edge", "raw cuEventRecord", x, use_sample, &u},
                                {"raw cuEventRecord", NULL, x, raw_record_sample, &raw}};
    double med[2];
    bench_measure(b, sec, "ns per use", "ns", series, 2, med);
    printf("| %zu | %.0f | %.0f |\n", k, med[0], med[1]);
  }
  printf("\n");
  for (int i = 0; i < MAX_ACCESSES; i++) BENCH_WEFT(weft_free(blk[i], s));
  BENCH_WEFT(weft_runtime_release(rt));
  for (int i = 0; i < RING; i++) BENCH_CU(d->cuEventDestroy(raw.ev[i]));
  BENCH_CU(d->cuStreamDestroy(raw.s));
}

/* ---- curve_pool ---------------------------------------------------------------------------- */

/* The sizes of the measured pairs, picked by an LCG: 256 B .. 1 MiB, size classes and TLSF. */
static const size_t pair_sizes[16] = {256,  1024,  4096,   16384,  65536, 262144, 1u << 20, 512,
                                      2048, 8192,  32768,  131072, 524288, 3000,  50000,   700000};

typedef struct pairs {
  weft_resource_t *res;
  weft_stream_t *s;
  uint32_t lcg;
  unsigned n;
} pairs_t;

/* ns per weft_resource_allocate + weft_resource_deallocate of one size. */
static double pair_sample(void *arg) {
  pairs_t *q = arg;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < q->n; i++) {
    size_t bytes = pair_sizes[lcg_next(&q->lcg) >> 28];
    CUdeviceptr p;
    BENCH_WEFT(weft_resource_allocate(q->res, bytes, q->s, "", &p));
    BENCH_WEFT(weft_resource_deallocate(q->res, p, bytes, q->s, ""));
  }
  uint64_t t1 = bench_now_ns();
  BENCH_WEFT(weft_stream_synchronize(q->s));
  return (double)(t1 - t0) / q->n;
}

static void no_segment(void *ctx, const weft_segment_t *s) {
  (void)ctx;
  (void)s;
}

static void count_range(void *ctx, const weft_free_range_t *r) {
  (void)r;
  ++*(uint64_t *)ctx;
}

typedef struct live {
  CUdeviceptr p;
  size_t bytes;
} live_t;

/* Gives back v[first], v[first + 2], ... of v[0..n). */
static void deallocate_every_other(const pairs_t *q, const live_t *v, size_t n, size_t first) {
  for (size_t i = first; i < n; i += 2) BENCH_WEFT(weft_resource_deallocate(q->res, v[i].p, v[i].bytes, q->s, ""));
}

static void curve_pool(const bench_t *b, unsigned n) {
  static const char sec[] = "curve_pool";
  static const unsigned xs[] = {100, 1000, 10000, 100000};
  size_t np = points(b, 4, 3, 2);
  curve_heading(sec, "Pool: a pair against the number of live blocks",
                "Host ns per `weft_resource_allocate` + `weft_resource_deallocate` on the runtime's `pool` "
                "resource (memory = POOL, one runtime per point), 16 sizes from 256 B to 1 MiB picked by "
                "an LCG, while N other blocks stay live: 2N blocks of 256 B .. 64 KiB (random, in steps of "
                "256 B) were allocated and every other one freed, so the pool is fragmented. *Free ranges*: "
                "the pool's free ranges then (its `segments` report), one count per point.");
  static const char *const cols[] = {"live blocks", "pool resource pair (ns)", "free ranges"};
  bench_table(cols, 3);
  live_t *blocks = malloc(2 * (size_t)xs[np - 1] * sizeof *blocks);
  if (blocks == NULL) bench_die("curve_pool: no host memory");
  for (size_t p = 0; p < np; p++) {
    size_t live = xs[p];
    weft_options_t o = plain_options(0);
    o.memory = WEFT_MEMORY_POOL;
    weft_runtime_t *rt = bench_runtime(&o);
    pairs_t q = {.res = weft_runtime_resource(rt), .lcg = 29, .n = n};
    BENCH_WEFT(weft_stream_get(rt, 0, &q.s));
    uint32_t r = 7;
    for (size_t i = 0; i < 2 * live; i++) {
      blocks[i].bytes = 256 * ((size_t)(lcg_next(&r) >> 24) + 1);
      BENCH_WEFT(weft_resource_allocate(q.res, blocks[i].bytes, q.s, "", &blocks[i].p));
    }
    deallocate_every_other(&q, blocks, 2 * live, 1);
    BENCH_WEFT(weft_stream_synchronize(q.s));
    char x[16];
    snprintf(x, sizeof x, "%zu", live);
    uint64_t ranges = 0;
    int counted = q.res->ops->segments != NULL;
    if (counted) {
      q.res->ops->segments(q.res, no_segment, count_range, &ranges);
      bench_sample(b, sec, "pool resource pair", "free ranges", "ranges", NULL, x, 0, (double)ranges);
    }
    bench_series_t series = {"pool resource pair", NULL, x, pair_sample, &q};
    double med;
    bench_measure(b, sec, "ns per pair", "ns", &series, 1, &med);
    if (counted) printf("| %zu | %.0f | %llu |\n", live, med, (unsigned long long)ranges);
    else printf("| %zu | %.0f | - |\n", live, med);
    deallocate_every_other(&q, blocks, 2 * live, 0);
    BENCH_WEFT(weft_runtime_release(rt));
  }
  printf("\n");
  free(blocks);
}

/* ---- curve_threads ------------------------------------------------------------------------- */

#define MAX_THREADS 8

/* One thread's launches: the LCG kernel (one block, one round: a launch costs its enqueue) over
 * a block of its own, on a stream of its own, weft_launch or cuLaunchKernel. */
typedef struct launcher {
  const bench_t *b;
  weft_stream_t *s;
  CUstream raw;
  weft_block_t blk;
  CUdeviceptr ptr;
  unsigned n;
  int weft;
  pthread_barrier_t *start;
  uint64_t begin; /* its clock reading after the barrier */
} launcher_t;

static void *launch_loop(void *arg) {
  launcher_t *l = arg;
  BENCH_CU(l->b->drv->cuCtxSetCurrent(l->b->ctx));
  unsigned elems = 256, rounds = 1;
  void *params[] = {&l->ptr, &l->ptr, &elems, &rounds};
  weft_access_t acc = {l->blk, WEFT_READ_WRITE};
  weft_launch_t launch = {.func = l->b->lcg, .grid = {1}, .block = {256}, .params = params};
  pthread_barrier_wait(l->start);
  l->begin = bench_now_ns();
  for (unsigned i = 0; i < l->n; i++) {
    if (l->weft) BENCH_WEFT(weft_launch(l->s, &launch, &acc, 1));
    else BENCH_CU(l->b->drv->cuLaunchKernel(l->b->lcg, 1, 1, 1, 256, 1, 1, 0, l->raw, params, NULL));
  }
  return NULL;
}

typedef struct threads_point {
  launcher_t l[MAX_THREADS];
  unsigned t;
  weft_runtime_t *rt;
} threads_point_t;

/* ns per launch over all threads: their wall time from the first thread's start (its own reading:
 * this thread's could come late) to the last one's join / every launch. */
static double threads_sample(void *arg) {
  threads_point_t *q = arg;
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, q->t);
  pthread_t th[MAX_THREADS];
  for (unsigned i = 0; i < q->t; i++) {
    q->l[i].start = &start;
    if (pthread_create(&th[i], NULL, launch_loop, &q->l[i]) != 0) bench_die("pthread_create");
  }
  for (unsigned i = 0; i < q->t; i++) pthread_join(th[i], NULL);
  uint64_t t1 = bench_now_ns(), t0 = t1;
  for (unsigned i = 0; i < q->t; i++)
    if (q->l[i].begin < t0) t0 = q->l[i].begin;
  pthread_barrier_destroy(&start);
  /* Untimed: the launches drain before the next sample. */
  for (unsigned i = 0; i < q->t; i++) BENCH_CU(q->l[0].b->drv->cuStreamSynchronize(q->l[i].raw));
  BENCH_WEFT(weft_runtime_synchronize(q->rt));
  return (double)(t1 - t0) / ((double)q->t * q->l[0].n);
}

/* n: launches per thread per sample. */
static void curve_threads(const bench_t *b, unsigned n) {
  static const char sec[] = "curve_threads";
  static const unsigned xs[] = {1, 2, 4, 8};
  size_t np = points(b, 4, 4, 2);
  curve_heading(sec, "Launches from several threads",
                "Host ns per kernel launch, over all T threads together (their wall time from the first thread's start, "
                "divided by every launch): each thread launches a one-block kernel over a block of its own on a "
                "stream of its own, `weft_launch` on a pool stream (a tracked use) or `cuLaunchKernel` on a raw "
                "stream; 128 launches a thread a sample, so that at most about 1,000 are in flight and the driver's "
                "launch queue does not hold the host back. With perfect scaling the time per launch falls as 1/T. "
                "weft's lock is not held while a "
                "launch is enqueued (busy lanes, streams/tracker.h), so threads on different streams enqueue in "
                "parallel; what they still share is the lock around each use's bookkeeping.");
  static const char *const cols[] = {"threads", "weft_launch (ns)", "cuLaunchKernel (ns)", "weft / raw"};
  bench_table(cols, 4);
  weft_options_t o = plain_options(MAX_THREADS);
  weft_runtime_t *rt = bench_runtime(&o);
  threads_point_t *w = calloc(1, sizeof *w), *r = calloc(1, sizeof *r);
  if (w == NULL || r == NULL) bench_die("curve_threads: no host memory");
  for (unsigned i = 0; i < MAX_THREADS; i++) {
    weft_stream_t *s;
    BENCH_WEFT(weft_stream_get(rt, i, &s));
    weft_block_t blk;
    BENCH_WEFT(weft_alloc(rt, 1024, s, "curve", &blk));
    BENCH_WEFT(weft_memset32(s, blk, 0, 1, 1024));
    CUdeviceptr ptr;
    BENCH_WEFT(weft_block_ptr(blk, &ptr));
    CUstream raw;
    BENCH_CU(b->drv->cuStreamCreateWithPriority(&raw, CU_STREAM_NON_BLOCKING, 0));
    w->l[i] = (launcher_t){b, s, raw, blk, ptr, n, 1, NULL, 0};
    r->l[i] = (launcher_t){b, s, raw, blk, ptr, n, 0, NULL, 0};
  }
  w->rt = r->rt = rt;
  BENCH_WEFT(weft_runtime_synchronize(rt));
  for (size_t p = 0; p < np; p++) {
    w->t = r->t = xs[p];
    char x[16];
    snprintf(x, sizeof x, "%u", xs[p]);
    bench_series_t series[2] = {{"weft_launch, a stream per thread", "cuLaunchKernel, a raw stream per thread", x,
                                 threads_sample, w},
                                {"cuLaunchKernel, a raw stream per thread", NULL, x, threads_sample, r}};
    double med[2];
    bench_measure(b, sec, "ns per launch, all threads", "ns", series, 2, med);
    printf("| %u | %.0f | %.0f | %.2f |\n", xs[p], med[0], med[1], med[0] / med[1]);
  }
  printf("\n");
  for (unsigned i = 0; i < MAX_THREADS; i++) {
    BENCH_WEFT(weft_free(w->l[i].blk, w->l[i].s));
    BENCH_CU(b->drv->cuStreamDestroy(w->l[i].raw));
  }
  free(w);
  free(r);
  BENCH_WEFT(weft_runtime_release(rt));
}

/* ---- curve_graph --------------------------------------------------------------------------- */

typedef struct graph_point {
  const bench_t *b;
  weft_stream_t *s;
  weft_graph_t *g;
  weft_exec_t *e;   /* for the launches */
  CUgraphExec raw;  /* the same CUgraph instantiated raw, for the launches */
  unsigned inst;    /* instantiations per sample */
  unsigned launches;
} graph_point_t;

/* A chain of n kernels on s: a -> c -> a -> ..., each reading what the previous one wrote. */
static void capture_chain(const bench_t *b, weft_stream_t *s, weft_block_t a, weft_block_t c, unsigned n,
                          weft_graph_t **out) {
  CUdeviceptr pa, pc;
  BENCH_WEFT(weft_block_ptr(a, &pa));
  BENCH_WEFT(weft_block_ptr(c, &pc));
  unsigned elems = ELEMS, rounds = 1;
  BENCH_WEFT(weft_capture_begin(s, NULL));
  for (unsigned k = 0; k < n; k++) {
    CUdeviceptr out_p = k % 2 ? pa : pc, in_p = k % 2 ? pc : pa;
    void *params[] = {&out_p, &in_p, &elems, &rounds};
    weft_access_t acc[] = {{k % 2 ? a : c, WEFT_WRITE}, {k % 2 ? c : a, WEFT_READ}};
    weft_launch_t l = {.func = b->lcg, .grid = {1}, .block = {ELEMS}, .params = params};
    BENCH_WEFT(weft_launch(s, &l, acc, 2));
  }
  BENCH_WEFT(weft_capture_end(s, out));
}

/* us per weft_graph_instantiate (instantiate + upload) with its weft_exec_destroy. */
static double weft_instantiate_sample(void *arg) {
  graph_point_t *g = arg;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < g->inst; i++) {
    weft_exec_t *e;
    BENCH_WEFT(weft_graph_instantiate(g->g, g->s, &e));
    BENCH_WEFT(weft_exec_destroy(e));
  }
  uint64_t t1 = bench_now_ns();
  BENCH_WEFT(weft_stream_synchronize(g->s));
  return (double)(t1 - t0) / g->inst / 1e3;
}

/* us per cuGraphInstantiateWithFlags + cuGraphUpload + cuGraphExecDestroy of the same CUgraph:
 * the driver calls weft_graph_instantiate and weft_exec_destroy make. */
static double raw_instantiate_sample(void *arg) {
  graph_point_t *g = arg;
  const weft__driver_t *d = g->b->drv;
  CUstream s = weft_stream_raw(g->s);
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < g->inst; i++) {
    CUgraphExec x;
    BENCH_CU(d->cuGraphInstantiateWithFlags(&x, weft_graph_raw(g->g), 0));
    BENCH_CU(d->cuGraphUpload(x, s));
    BENCH_CU(d->cuGraphExecDestroy(x));
  }
  uint64_t t1 = bench_now_ns();
  BENCH_CU(d->cuStreamSynchronize(s));
  return (double)(t1 - t0) / g->inst / 1e3;
}

/* Host us per weft_exec_launch: the launch calls alone, the synchronisation after them untimed. */
static double weft_launch_sample(void *arg) {
  graph_point_t *g = arg;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < g->launches; i++) BENCH_WEFT(weft_exec_launch(g->e, g->s));
  uint64_t t1 = bench_now_ns();
  BENCH_WEFT(weft_stream_synchronize(g->s));
  return (double)(t1 - t0) / g->launches / 1e3;
}

static double raw_launch_sample(void *arg) {
  graph_point_t *g = arg;
  const weft__driver_t *d = g->b->drv;
  CUstream s = weft_stream_raw(g->s);
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < g->launches; i++) BENCH_CU(d->cuGraphLaunch(g->raw, s));
  uint64_t t1 = bench_now_ns();
  BENCH_CU(d->cuStreamSynchronize(s));
  return (double)(t1 - t0) / g->launches / 1e3;
}

static void curve_graph(const bench_t *b) {
  static const char sec[] = "curve_graph";
  static const unsigned xs[] = {10, 100, 1000, 10000};
  size_t np = b->quick || b->sim ? 2 : 4;
  curve_heading(sec, "Graphs: instantiation and launch against the number of kernels",
                "A chain of N dependent kernels (the pipeline kernel, 256 elements, one round) captured "
                "from `weft_launch` on one stream. *Instantiate*: `weft_graph_instantiate` (instantiate + "
                "upload) and `weft_exec_destroy`, against `cuGraphInstantiateWithFlags` + `cuGraphUpload` + "
                "`cuGraphExecDestroy` of the same `CUgraph` (`weft_graph_raw`). *Launch*: host us per "
                "`weft_exec_launch`, against `cuGraphLaunch` of the same graph on the same stream; several "
                "launches, then one synchronisation that is not timed.");
  static const char *const cols[] = {"kernel nodes", "weft_graph_instantiate (us)", "raw cuGraphInstantiate (us)",
                                     "weft_exec_launch (us)", "raw cuGraphLaunch (us)"};
  bench_table(cols, 5);
  weft_options_t o = plain_options(0);
  weft_runtime_t *rt = bench_runtime(&o);
  weft_stream_t *s;
  BENCH_WEFT(weft_stream_get(rt, 0, &s));
  weft_block_t a, c;
  BENCH_WEFT(weft_alloc(rt, ELEMS * 4, s, "curve a", &a));
  BENCH_WEFT(weft_alloc(rt, ELEMS * 4, s, "curve c", &c));
  BENCH_WEFT(weft_memset32(s, a, 0, 1, ELEMS * 4));
  for (size_t p = 0; p < np; p++) {
    graph_point_t g = {.b = b, .s = s, .inst = bench_count(b, 2000 / xs[p], 1),
                       .launches = bench_count(b, 500 / xs[p], 2)};
    capture_chain(b, s, a, c, xs[p], &g.g);
    char x[16];
    snprintf(x, sizeof x, "%u", xs[p]);
    bench_series_t inst[2] = {{"weft_graph_instantiate", "raw cuGraphInstantiate", x, weft_instantiate_sample, &g},
                              {"raw cuGraphInstantiate", NULL, x, raw_instantiate_sample, &g}};
    double mi[2], ml[2];
    bench_measure(b, sec, "us per instantiate", "us", inst, 2, mi);
    BENCH_WEFT(weft_graph_instantiate(g.g, s, &g.e));
    BENCH_CU(b->drv->cuGraphInstantiateWithFlags(&g.raw, weft_graph_raw(g.g), 0));
    BENCH_CU(b->drv->cuGraphUpload(g.raw, weft_stream_raw(s)));
    bench_series_t launch[2] = {{"weft_exec_launch", "raw cuGraphLaunch", x, weft_launch_sample, &g},
                                {"raw cuGraphLaunch", NULL, x, raw_launch_sample, &g}};
    bench_measure(b, sec, "us per launch", "us", launch, 2, ml);
    printf("| %u | %.1f | %.1f | %.2f | %.2f |\n", xs[p], mi[0], mi[1], ml[0], ml[1]);
    BENCH_CU(b->drv->cuGraphExecDestroy(g.raw));
    BENCH_WEFT(weft_exec_destroy(g.e));
    BENCH_WEFT(weft_graph_destroy(g.g));
  }
  printf("\n");
  BENCH_WEFT(weft_free(a, s));
  BENCH_WEFT(weft_free(c, s));
  BENCH_WEFT(weft_runtime_release(rt));
}

/* ---- curve_sim ----------------------------------------------------------------------------- */

typedef struct program {
  const bench_t *b;
  weft_runtime_t *rt;
  weft_stream_t *s[SIM_STREAMS];
  weft_block_t blk[SIM_BLOCKS];
  CUdeviceptr ptr[SIM_BLOCKS];
  uint32_t lcg;
  unsigned len;
} program_t;

/* Launches per second: len kernels alternating the streams, each writing one random block and
 * reading another, then the runtime's synchronisation (timed: the simulator runs the work then). */
static double program_sample(void *arg) {
  program_t *q = arg;
  unsigned elems = ELEMS, rounds = 1;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < q->len; i++) {
    uint32_t r = lcg_next(&q->lcg);
    size_t w = r >> 29, rd = (w + 1 + pick(r << 3, SIM_BLOCKS - 1)) % SIM_BLOCKS;
    void *params[] = {&q->ptr[w], &q->ptr[rd], &elems, &rounds};
    weft_access_t acc[] = {{q->blk[w], WEFT_WRITE}, {q->blk[rd], WEFT_READ}};
    weft_launch_t l = {.func = q->b->lcg, .grid = {1}, .block = {ELEMS}, .params = params};
    BENCH_WEFT(weft_launch(q->s[i % SIM_STREAMS], &l, acc, 2));
  }
  BENCH_WEFT(weft_runtime_synchronize(q->rt));
  return q->len / ((double)(bench_now_ns() - t0) / 1e9);
}

static void curve_sim(const bench_t *b) {
  static const char sec[] = "curve_sim";
  curve_heading(sec, "Simulator: operations per second against program length",
                b->sim ? "L `weft_launch` calls of the pipeline kernel (256 elements) alternating 4 streams, "
                         "each writing one of 8 blocks and reading another (picked by an LCG), then "
                         "`weft_runtime_synchronize`; L / seconds, the synchronisation included."
                       : "skipped: the simulator's speed is measured with WEFT_DRIVER=sim");
  if (!b->sim) return;
  static const unsigned xs[] = {1000, 10000, 100000};
  size_t np = points(b, 3, 3, 2);
  static const char *const cols[] = {"program length", "simulator (operations per second)"};
  bench_table(cols, 2);
  weft_options_t o = plain_options(0);
  program_t q = {.b = b, .rt = bench_runtime(&o), .lcg = 3};
  for (unsigned i = 0; i < SIM_STREAMS; i++) BENCH_WEFT(weft_stream_get(q.rt, i, &q.s[i]));
  for (unsigned i = 0; i < SIM_BLOCKS; i++) {
    BENCH_WEFT(weft_alloc(q.rt, ELEMS * 4, q.s[0], "curve", &q.blk[i]));
    BENCH_WEFT(weft_block_ptr(q.blk[i], &q.ptr[i]));
    BENCH_WEFT(weft_memset32(q.s[0], q.blk[i], 0, i, ELEMS * 4));
  }
  for (size_t p = 0; p < np; p++) {
    q.len = xs[p];
    char x[16];
    snprintf(x, sizeof x, "%u", xs[p]);
    bench_series_t series = {"simulator", NULL, x, program_sample, &q};
    double med;
    bench_measure(b, sec, "operations per second", "ops/s", &series, 1, &med);
    printf("| %u | %.0f |\n", xs[p], med);
  }
  printf("\n");
  for (unsigned i = 0; i < SIM_BLOCKS; i++) BENCH_WEFT(weft_free(q.blk[i], q.s[0]));
  BENCH_WEFT(weft_runtime_release(q.rt));
}

void bench_curves(bench_t *b) {
  bench_section(b, "Curves: how cost grows",
                "Each point is the median of the samples of its series, taken interleaved; every sample is "
                "in the CSV with the point's parameter in `x` (sections `curve_*`), from which "
                "bench/results.py draws the curves. Host time.");
  unsigned n = bench_count(b, 20000, 64);
  curve_streams(b, n);
  curve_blocks(b, n);
  curve_accesses(b, n);
  curve_pool(b, n);
  curve_graph(b);
  curve_threads(b, b->quick ? 16 : 128);
  curve_sim(b);
}
