/* Tracker: host cost of weft_use_begin + weft_use_end with no work between them, against the
 * driver calls a hand-written program makes for the same ordering, measured in the same run.
 *
 * A use on a stream that other streams wait on records one ring event (cuEventRecord), and one
 * cuStreamWaitEvent per cross-stream edge it needs. A use on a stream nobody has waited on yet
 * records nothing (options.lazy_records: its event is recorded when first needed). The no-edge
 * rows are measured on both kinds of stream; each row shows the events it recorded per use. So
 * the tracker's own share of a use is its total minus the raw calls it stands for: a
 * cuEventRecord (no edge) or a cuStreamWaitEvent + cuEventRecord pair (one edge). What is left
 * is weft's bookkeeping: argument and handle checks, the context check (two cuCtxGetCurrent,
 * shown below for scale), the lock, the clocks and the blocks' histories. */
#include <pthread.h>
#include <stdatomic.h>

#include "bench/bench.h"
#include "lib/runtime/runtime.h"

#define BLOCKS 16
#define RING 64 /* raw events per stream, as many as weft's default ring */

/* s[0], s[1]: raw streams that never touch a pool; s[2], s[3]: the same after one stream-ordered
 * allocation and its free on each (at setup), which makes every later record there dearer
 * (tools/probes/probe_record_cost: the driver's mark; a stream that waits for such a point carries
 * it too), as on weft's streams, whose blocks come from a stream-ordered pool. */
typedef struct raw {
  CUstream s[4];
  CUevent ev[4][RING];
} raw_t;

/* What the samples share: the raw streams and events, weft's runtime and streams, the count. */
typedef struct tctx {
  const bench_t *b;
  raw_t *r;
  weft_runtime_t *rt;
  weft_stream_t *s[3]; /* s[0], s[1]: streams that wait on each other; s[2]: nobody waits on it */
  weft_block_t late[2]; /* keep_eager's */
  unsigned n;
} tctx_t;

/* One series of uses: k accesses, on s[on] only or alternating s[0] and s[1] (each use then
 * needs one wait). */
typedef struct useq {
  tctx_t *t;
  size_t k;
  int alternate;
  unsigned on;
  weft_access_t acc[BLOCKS]; /* the first k are the use's */
  double waits;              /* waits issued per use in the last sample */
  double records;            /* events recorded per use in the last sample */
} useq_t;

/* ns per cuEventRecord on raw stream `on` (0, or 2: marked by a pool); with `floor`, each after
 * the floor of a tracker's bookkeeping for a write on that stream (bench.h; it never needs a wait
 * there). */
static double raw_record_floor(tctx_t *t, unsigned on, bool floor) {
  bench_floor_reset();
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < t->n; i++) {
    if (floor && bench_floor_use(0, 0, -1, 1)) bench_die("the floor of a tracker placed a wait on one stream");
    BENCH_CU(t->b->drv->cuEventRecord(t->r->ev[on][i % RING], t->r->s[on]));
  }
  uint64_t t1 = bench_now_ns();
  BENCH_CU(t->b->drv->cuStreamSynchronize(t->r->s[on]));
  return (double)(t1 - t0) / t->n;
}

static double raw_record(void *arg) { return raw_record_floor(arg, 0, false); }
static double raw_record_tracked(void *arg) { return raw_record_floor(arg, 0, true); }
static double raw_record_marked(void *arg) { return raw_record_floor(arg, 2, false); }

/* ns per operation that waits for the other stream's last event, then records its own: what a
 * hand-written ping-pong between two streams costs; with `floor`, each after the floor of a
 * tracker's bookkeeping for that write (bench.h), which must find the wait (from the second on). */
static double raw_wait_record_floor(tctx_t *t, unsigned base, bool floor) {
  const raw_t *r = t->r;
  BENCH_CU(t->b->drv->cuEventRecord(r->ev[base + 1][RING - 1], r->s[base + 1]));
  bench_floor_reset();
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < t->n; i++) {
    unsigned me = base + (i & 1), other = me ^ 1;
    if (floor && bench_floor_use(me, 0, -1, 1) != (i > 0)) bench_die("the floor of a tracker missed a wait");
    BENCH_CU(t->b->drv->cuStreamWaitEvent(r->s[me], r->ev[other][(i + RING - 1) % RING], 0));
    BENCH_CU(t->b->drv->cuEventRecord(r->ev[me][i % RING], r->s[me]));
  }
  uint64_t t1 = bench_now_ns();
  for (unsigned k = base; k < base + 2; k++) BENCH_CU(t->b->drv->cuStreamSynchronize(r->s[k]));
  return (double)(t1 - t0) / t->n;
}
static double raw_wait_record(void *arg) { return raw_wait_record_floor(arg, 0, false); }
static double raw_wait_record_tracked(void *arg) { return raw_wait_record_floor(arg, 0, true); }
static double raw_wait_record_marked(void *arg) { return raw_wait_record_floor(arg, 2, false); }

/* ns per cuCtxGetCurrent, the call weft's per-thread context check makes. */
static double raw_ctx_get(void *arg) {
  tctx_t *t = arg;
  CUcontext c;
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < t->n; i++) BENCH_CU(t->b->drv->cuCtxGetCurrent(&c));
  return (double)(bench_now_ns() - t0) / t->n;
}

/* ns per use begin+end of the series' accesses. */
/* Untimed, before a series on s[0] that must record each use ("a stream others wait on"): s[0]
 * writes late[0], then late[1], and s[1] reads late[0], an older use of s[0] than its newest. That
 * wait turns s[0] eager (late, if s[0] was lazy) or keeps it eager (a waiter of an older tick
 * resets the calm count: weft__clock_needed). Without it the edge row's waits, each for the newest
 * use of s[0], turn s[0] lazy again between samples. */
static void keep_eager(tctx_t *t) {
  weft_access_t w0 = {t->late[0], WEFT_WRITE}, w1 = {t->late[1], WEFT_WRITE}, r0 = {t->late[0], WEFT_READ};
  BENCH_WEFT(weft_use_begin(t->s[0], &w0, 1));
  BENCH_WEFT(weft_use_end(t->s[0], &w0, 1));
  BENCH_WEFT(weft_use_begin(t->s[0], &w1, 1));
  BENCH_WEFT(weft_use_end(t->s[0], &w1, 1));
  BENCH_WEFT(weft_use_begin(t->s[1], &r0, 1));
  BENCH_WEFT(weft_use_end(t->s[1], &r0, 1));
}

static double weft_uses(void *arg) {
  useq_t *q = arg;
  tctx_t *t = q->t;
  if (!q->alternate && q->on == 0) keep_eager(t);
  weft_counters_t c0, c1;
  BENCH_WEFT(weft_runtime_counters(t->rt, &c0));
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < t->n; i++) {
    weft_stream_t *on = t->s[q->alternate ? i & 1 : q->on];
    BENCH_WEFT(weft_use_begin(on, q->acc, q->k));
    BENCH_WEFT(weft_use_end(on, q->acc, q->k));
  }
  uint64_t t1 = bench_now_ns();
  BENCH_WEFT(weft_runtime_counters(t->rt, &c1));
  /* Untimed: the host then knows everything complete, which only spares the next run's first
   * use its wait. */
  BENCH_WEFT(weft_runtime_synchronize(t->rt));
  q->waits = (double)(c1.waits_issued - c0.waits_issued) / t->n;
  q->records = (double)(c1.events_recorded - c0.events_recorded) / t->n;
  return (double)(t1 - t0) / t->n;
}

/* ---- a use with its work: where weft_launch's time goes (a diagnostic table) ---- */

typedef struct lctx {
  const bench_t *b;
  weft_stream_t *s;
  CUstream raw, pool_raw; /* a raw stream; another pool stream's handle, used raw only */
  weft_block_t blk;
  CUdeviceptr ptr;
  unsigned n;
} lctx_t;

static weft_status_t no_work(weft_stream_t *s, void *arg) {
  (void)s;
  (void)arg;
  return WEFT_OK;
}

/* What a use's host work is made of, without weft, to tell which part makes the launch after it
 * slower than the two apart: `spin`, a chain of 100 dependent multiply-adds (registers only,
 * about the time of weft's use); `touch`, a read and a write of 48 cache lines (about the lines a
 * use brings back cold: bench/README.md, "Instructions per operation"), the next 48 of a 1 MiB
 * buffer each time, so that they come from beyond the first-level cache as a use's do. */
static void spin(lctx_t *l) {
  (void)l;
  static volatile unsigned long sink;
  unsigned long x = sink;
  for (int i = 0; i < 100; i++) {
    x = x * 3 + 1;
    __asm__ volatile("" : "+r"(x));
  }
  sink = x;
}
#define TOUCH_BYTES (1u << 20)
static void touch(lctx_t *l) {
  (void)l;
  static unsigned char buf[TOUCH_BYTES] __attribute__((aligned(64)));
  static size_t at;
  for (int i = 0; i < 48; i++) {
    buf[at] = (unsigned char)(buf[at] + 1);
    at = (at + 64) % TOUCH_BYTES;
  }
}

/* 16 KiB of code run once (2,048 eight-byte no-ops): half the first-level instruction cache, about
 * what a use's path through its files may take, with no data and no calls. */
static __attribute__((noinline)) void code_walk(lctx_t *l) {
  (void)l;
  __asm__ volatile(".rept 2048\n\t.byte 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00\n\t.endr" ::: "memory");
}

static pthread_mutex_t g_m = PTHREAD_MUTEX_INITIALIZER;
static void one_lock(lctx_t *l) {
  (void)l;
  pthread_mutex_lock(&g_m);
  pthread_mutex_unlock(&g_m);
}
/* A use around no work takes weft's lock twice (before, and after its work). */
static void two_locks(lctx_t *l) {
  one_lock(l);
  one_lock(l);
}
/* The same two holds on a bare lock word (a compare-and-swap to take it, an exchange to give it
 * back; the futex calls of a contended lock never run here): what glibc's mutex adds to the two
 * locked instructions every lock needs. */
static _Atomic unsigned g_word;
static inline void word_hold(void) {
  unsigned z = 0;
  while (!atomic_compare_exchange_weak_explicit(&g_word, &z, 1, memory_order_acquire, memory_order_relaxed)) z = 0;
  (void)atomic_exchange_explicit(&g_word, 0, memory_order_release);
}
static void two_words(lctx_t *l) {
  (void)l;
  word_hold();
  word_hold();
}
static void one_rmw(lctx_t *l) {
  (void)l;
  static _Atomic unsigned long word;
  atomic_fetch_add_explicit(&word, 1, memory_order_seq_cst);
}
static void ctx_get(lctx_t *l) {
  CUcontext cur;
  BENCH_CU(l->b->drv->cuCtxGetCurrent(&cur));
}
/* weft's use alone: the same use as weft_launch's around no work (its bookkeeping, the lock taken
 * twice as around real work). */
static void use_no_work(lctx_t *l) {
  weft_access_t acc = {l->blk, WEFT_READ_WRITE};
  BENCH_WEFT(weft__use_run(l->s, &acc, 1, "bench", no_work, NULL));
}

/* One row of the launch breakdown: host work before, the launch (of a one-block kernel), host work
 * after. */
enum { NO_LAUNCH, RAW, POOL_RAW, WEFT_LAUNCH };
typedef struct lrow {
  const char *name;
  void (*before)(lctx_t *);
  int launch; /* cuLaunchKernel on a raw stream, on a pool stream's handle, weft_launch on the pool
                 stream (one READ_WRITE access), or none */
  void (*after)(lctx_t *);
  lctx_t *l;
} lrow_t;

/* ns per row: its host work and launch, l->n times. */
static double launches(void *arg) {
  const lrow_t *r = arg;
  lctx_t *l = r->l;
  unsigned elems = 256, rounds = 1;
  void *params[] = {&l->ptr, &l->ptr, &elems, &rounds};
  weft_access_t acc = {l->blk, WEFT_READ_WRITE};
  weft_launch_t launch = {.func = l->b->lcg, .grid = {1}, .block = {256}, .params = params};
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < l->n; i++) {
    if (r->before != NULL) r->before(l);
    if (r->launch == WEFT_LAUNCH) BENCH_WEFT(weft_launch(l->s, &launch, &acc, 1));
    else if (r->launch != NO_LAUNCH)
      BENCH_CU(l->b->drv->cuLaunchKernel(l->b->lcg, 1, 1, 1, 256, 1, 1, 0, r->launch == POOL_RAW ? l->pool_raw : l->raw,
                                         params, NULL));
    if (r->after != NULL) r->after(l);
  }
  uint64_t t1 = bench_now_ns();
  BENCH_CU(l->b->drv->cuStreamSynchronize(l->raw));
  BENCH_CU(l->b->drv->cuStreamSynchronize(l->pool_raw));
  BENCH_WEFT(weft_stream_synchronize(l->s));
  return (double)(t1 - t0) / l->n;
}

static void launch_breakdown(bench_t *b, weft_runtime_t *rt, weft_stream_t *s, weft_stream_t *other, unsigned n) {
  lctx_t l = {.b = b, .s = s, .n = n, .pool_raw = weft_stream_raw(other)};
  BENCH_CU(b->drv->cuStreamCreateWithPriority(&l.raw, CU_STREAM_NON_BLOCKING, 0));
  BENCH_WEFT(weft_alloc(rt, 1024, s, "launch", &l.blk));
  BENCH_WEFT(weft_block_ptr(l.blk, &l.ptr));
  /* Row 1 is the baseline; the printed summary below names rows by index. */
  enum { NL = 18 };
  lrow_t rows[NL] = {
      {"weft_launch, 1 access, a stream nobody waits on", NULL, WEFT_LAUNCH, NULL, &l},
      {"cuLaunchKernel, a raw stream", NULL, RAW, NULL, &l},
      {"the same use around no work (weft's share, diagnostic)", use_no_work, NO_LAUNCH, NULL, &l},
      {"cuLaunchKernel on a weft pool stream's handle (diagnostic)", NULL, POOL_RAW, NULL, &l},
      {"that use around no work, then cuLaunchKernel on a raw stream (diagnostic)", use_no_work, RAW, NULL, &l},
      {"cuLaunchKernel, then one atomic read-modify-write (diagnostic)", NULL, RAW, one_rmw, &l},
      {"cuLaunchKernel, then a mutex lock and unlock (diagnostic)", NULL, RAW, one_lock, &l},
      {"100 dependent multiply-adds alone (diagnostic)", spin, NO_LAUNCH, NULL, &l},
      {"100 dependent multiply-adds, then cuLaunchKernel (diagnostic)", spin, RAW, NULL, &l},
      {"48 cache lines touched alone (diagnostic)", touch, NO_LAUNCH, NULL, &l},
      {"48 cache lines touched, then cuLaunchKernel (diagnostic)", touch, RAW, NULL, &l},
      {"cuCtxGetCurrent, then cuLaunchKernel (diagnostic)", ctx_get, RAW, NULL, &l},
      {"two mutex lock-unlock pairs alone (diagnostic)", two_locks, NO_LAUNCH, NULL, &l},
      {"two mutex lock-unlock pairs, then cuLaunchKernel (diagnostic)", two_locks, RAW, NULL, &l},
      {"two lock-word holds alone (diagnostic)", two_words, NO_LAUNCH, NULL, &l},
      {"two lock-word holds, then cuLaunchKernel (diagnostic)", two_words, RAW, NULL, &l},
      {"16 KiB of code run alone (diagnostic)", code_walk, NO_LAUNCH, NULL, &l},
      {"16 KiB of code run, then cuLaunchKernel (diagnostic)", code_walk, RAW, NULL, &l},
  };
  const char *raw_name = rows[1].name;
  bench_series_t series[NL];
  for (int i = 0; i < NL; i++) series[i] = (bench_series_t){rows[i].name, i == 1 ? NULL : raw_name, NULL, launches, &rows[i]};
  double med[NL];
  bench_measure(b, "tracker", "ns per launch", "ns", series, NL, med);
  static const char *const cols[] = {"launch of a one-block kernel, one thread", "ns per launch", "vs cuLaunchKernel"};
  bench_table(cols, 3);
  for (int i = 0; i < NL; i++)
    printf("| %s | %.0f | %.3fx |\n", rows[i].name, med[i], med[i] / med[1]);
  printf("\nweft_launch - cuLaunchKernel = %.0f ns; the use alone %.0f ns; the use and a raw launch one after the "
         "other %.0f ns over the launch alone; the multiply-adds alone %.0f ns, before a launch %.0f ns over it; the "
         "cache lines alone %.0f ns, before a launch %.0f ns over it.\n\n",
         med[0] - med[1], med[2], med[4] - med[1], med[7], med[8] - med[1], med[9], med[10] - med[1]);
  BENCH_WEFT(weft_free(l.blk, s));
  BENCH_CU(b->drv->cuStreamDestroy(l.raw));
}

void bench_tracker(bench_t *b) {
  bench_section(b, "Tracker: cost of a use",
                "Host ns per `weft_use_begin` + `weft_use_end` with no work between (median), next to the raw "
                "driver calls that give the same ordering by hand: one `cuEventRecord` per use, plus one "
                "`cuStreamWaitEvent` when the use needs a cross-stream edge. *Tracker share* = weft total - "
                "those raw calls: weft's own bookkeeping. Accesses: a quarter written, the rest read, all "
                "on one stream; the edge row writes one block alternately from two streams, so every use "
                "waits once. The plain no-edge rows run on a stream nobody waits on, which records no "
                "event (options.lazy_records); the rows 'a stream others wait on' record one per use (before each "
                "of their samples another stream waits for an older use of that stream, which keeps it eager). "
                "Goal (issues 4, 17): a use with no edge at most 30 ns over one raw `cuEventRecord`.");
  const weft__driver_t *d = b->drv;
  unsigned n = bench_count(b, 100000, 64);
  raw_t r;
  for (int k = 0; k < 4; k++) {
    BENCH_CU(d->cuStreamCreateWithPriority(&r.s[k], CU_STREAM_NON_BLOCKING, 0));
    /* Flags as weft's ring events (streams/pool.c). */
    for (int i = 0; i < RING; i++) BENCH_CU(d->cuEventCreate(&r.ev[k][i], CU_EVENT_DISABLE_TIMING));
  }
  for (int k = 2; k < 4; k++) { /* the pool's mark (raw_t) */
    CUdeviceptr p;
    BENCH_CU(d->cuMemAllocAsync(&p, 256, r.s[k]));
    BENCH_CU(d->cuMemFreeAsync(p, r.s[k]));
    BENCH_CU(d->cuStreamSynchronize(r.s[k]));
  }

  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0; /* two plain streams, as the raw ones */
  tctx_t t = {.b = b, .r = &r, .rt = bench_runtime(&o), .n = n};
  for (unsigned k = 0; k < 3; k++) BENCH_WEFT(weft_stream_get(t.rt, k, &t.s[k]));
  /* blk: used on s[0] and s[1]; own: used on s[2] alone. */
  weft_block_t blk[BLOCKS], own[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) BENCH_WEFT(weft_alloc(t.rt, 256, t.s[0], "tracker", &blk[i]));
  for (int i = 0; i < BLOCKS; i++) BENCH_WEFT(weft_alloc(t.rt, 256, t.s[2], "tracker.own", &own[i]));
  for (int i = 0; i < 2; i++) BENCH_WEFT(weft_alloc(t.rt, 256, t.s[0], "tracker.late", &t.late[i]));
  /* s[0] and s[1] each get waited on late once (for a use that a later one joined: lazy
   * records), so they record eagerly from the first sample on. */
  static const unsigned on[] = {0, 0, 1, 1, 0}, which[] = {0, 1, 0, 1, 0};
  for (unsigned k = 0; k < 5; k++) {
    weft_access_t w = {blk[which[k]], WEFT_WRITE};
    BENCH_WEFT(weft_use_begin(t.s[on[k]], &w, 1));
    BENCH_WEFT(weft_use_end(t.s[on[k]], &w, 1));
  }
  BENCH_WEFT(weft_runtime_synchronize(t.rt));
  static const size_t ks[] = {1, 4, 16};
  enum { NQ = 7 };
  static const char *const names[NQ] = {
      "no edge, 1 access",     "no edge, 4 accesses",     "no edge, 16 accesses",
      "no edge, 1 access, a stream others wait on", "no edge, 4 accesses, a stream others wait on",
      "no edge, 16 accesses, a stream others wait on", "one edge (write after write, 2 streams)"};
  static const char rec_name[] = "raw cuEventRecord", pair_name[] = "raw cuStreamWaitEvent + cuEventRecord";
  /* No-edge uses: k accesses, a quarter written (at least one), the rest read, on one stream: s[2]
   * (nobody waits on it) or s[0] (s[1] does). The edge use writes blk[0] alternately from s[0]
   * and s[1], so every use waits once. */
  useq_t q[NQ];
  for (int j = 0; j < NQ; j++) {
    q[j] = (useq_t){.t = &t, .k = j < 6 ? ks[j % 3] : 1, .alternate = j == 6, .on = j < 3 ? 2 : 0};
    size_t writes = q[j].k / 4 ? q[j].k / 4 : 1;
    for (size_t i = 0; i < q[j].k; i++)
      q[j].acc[i] = (weft_access_t){j < 3 ? own[i] : blk[i], i < writes ? WEFT_WRITE : WEFT_READ};
  }
  bench_series_t series[NQ + 6];
  for (int j = 0; j < NQ; j++)
    series[j] = (bench_series_t){names[j], j < 6 ? rec_name : pair_name, NULL, weft_uses, &q[j]};
  series[NQ] = (bench_series_t){rec_name, NULL, NULL, raw_record, &t};
  series[NQ + 1] = (bench_series_t){pair_name, NULL, NULL, raw_wait_record, &t};
  /* What the least thread-safe tracker would add to the raw calls (bench.h, "the floor"). */
  series[NQ + 2] = (bench_series_t){"raw cuEventRecord + the floor of a tracker (diagnostic)", rec_name, NULL,
                                    raw_record_tracked, &t};
  series[NQ + 3] = (bench_series_t){"raw cuStreamWaitEvent + cuEventRecord + the floor of a tracker (diagnostic)",
                                    pair_name, NULL, raw_wait_record_tracked, &t};
  /* The same raw calls on streams a stream-ordered pool operation marked, as weft's are (raw_t):
   * the driver's part of the gap between a weft row and its raw baseline. */
  series[NQ + 4] = (bench_series_t){"raw cuEventRecord on a stream that made a stream-ordered allocation (diagnostic)",
                                    rec_name, NULL, raw_record_marked, &t};
  series[NQ + 5] = (bench_series_t){
      "raw cuStreamWaitEvent + cuEventRecord on streams that made a stream-ordered allocation (diagnostic)", pair_name,
      NULL, raw_wait_record_marked, &t};
  double med[NQ + 6], ctx_get;
  bench_measure(b, "tracker", "ns per use, begin+end", "ns", series, NQ + 6, med);
  bench_series_t ctx_series = {"raw cuCtxGetCurrent", NULL, NULL, raw_ctx_get, &t};
  bench_measure(b, "tracker", "ns per call", "ns", &ctx_series, 1, &ctx_get);

  static const char *const cols[] = {"use", "accesses", "weft, ns/use", "raw driver calls, ns", "vs raw",
                                     "tracker share, ns/use", "share, ns/access", "waits/use", "events/use"};
  bench_table(cols, 9);
  for (int j = 0; j < NQ; j++) {
    double driver = j < 6 ? med[NQ] : med[NQ + 1], share = med[j] - driver;
    printf("| %s | %zu | %.0f | %.0f | %.2fx | %.0f | %.1f | %.2f | %.2f |\n", names[j], q[j].k, med[j], driver,
           med[j] / driver, share, share / (double)q[j].k, q[j].waits, q[j].records);
    bench_sample(b, "tracker", names[j], "waits issued per use", "waits", NULL, NULL, 0, q[j].waits);
    bench_sample(b, "tracker", names[j], "events recorded per use", "events", NULL, NULL, 0, q[j].records);
  }
  for (int i = 0; i < BLOCKS; i++) BENCH_WEFT(weft_free(blk[i], t.s[0]));
  for (int i = 0; i < BLOCKS; i++) BENCH_WEFT(weft_free(own[i], t.s[2]));
  for (int i = 0; i < 2; i++) BENCH_WEFT(weft_free(t.late[i], t.s[0]));
  weft_stream_t *ls, *other;
  BENCH_WEFT(weft_stream_get(t.rt, 3, &ls));
  BENCH_WEFT(weft_stream_get(t.rt, 4, &other)); /* given out raw: exposed, used raw only */
  launch_breakdown(b, t.rt, ls, other, bench_count(b, 20000, 16));
  BENCH_WEFT(weft_runtime_release(t.rt));

  printf("\nRaw driver calls in the same run, ns each (medians): `cuEventRecord` %.0f, `cuStreamWaitEvent` + "
         "`cuEventRecord` %.0f, `cuCtxGetCurrent` %.0f (weft's share includes two of these). %u uses per sample, "
         "the series interleaved. The floor of a tracker (one mutex hold and the blocks' histories, bench.h) "
         "beside them: record %.0f (%.3fx), wait + record %.0f (%.3fx). On streams that made one stream-ordered "
         "allocation, as weft's have (the driver's mark): record %.0f (%.3fx), wait + record %.0f (%.3fx).\n\n",
         med[NQ], med[NQ + 1], ctx_get, n, med[NQ + 2], med[NQ + 2] / med[NQ], med[NQ + 3], med[NQ + 3] / med[NQ + 1],
         med[NQ + 4], med[NQ + 4] / med[NQ], med[NQ + 5], med[NQ + 5] / med[NQ + 1]);
  for (int k = 0; k < 4; k++) {
    for (int i = 0; i < RING; i++) BENCH_CU(d->cuEventDestroy(r.ev[k][i]));
    BENCH_CU(d->cuStreamDestroy(r.s[k]));
  }
}
