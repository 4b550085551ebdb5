/* Replay: one training-step-like graph of 100 small dependent kernels, three ways in one run:
 *   weft eager   100 weft_launch calls per step (each a tracked use);
 *   weft replay  the step captured once with weft, launched with weft_exec_launch (which waits
 *                for the access summary's hazards and records the launch as one use);
 *   raw graph    the very same CUgraph instantiated separately and launched with cuGraphLaunch.
 * Wall time per step is measured over many steps ending in one synchronisation; host time per
 * launch is the launch loop alone. Goal (issue 6): weft replay within 1% of the raw graph.
 * Then the memory of the two graph memory policies for a step with temporaries. */
#include <stdatomic.h>
#include <string.h>

#include "bench/bench.h"

#define KERNELS 100
#define ELEMS 1024

typedef struct step {
  bench_t *b;
  weft_block_t a, c;
  unsigned n, iters;
} step_t;

static weft_status_t run_step(weft_stream_t *s, void *arg) {
  step_t *st = arg;
  CUdeviceptr pa, pc;
  weft_status_t r = weft_block_ptr(st->a, &pa);
  if (r == WEFT_OK) r = weft_block_ptr(st->c, &pc);
  for (unsigned k = 0; k < KERNELS && r == WEFT_OK; k++) {
    /* a -> c -> a -> ...: each kernel reads what the previous one wrote. */
    CUdeviceptr out = k % 2 ? pa : pc, in = k % 2 ? pc : pa;
    void *params[] = {&out, &in, &st->n, &st->iters};
    weft_access_t acc[] = {{k % 2 ? st->a : st->c, WEFT_WRITE}, {k % 2 ? st->c : st->a, WEFT_READ}};
    weft_launch_t l = {.func = st->b->lcg, .grid = {(st->n + 255) / 256}, .block = {256}, .params = params};
    r = weft_launch(s, &l, acc, 2);
  }
  return r;
}

static weft_status_t temporaries_step(weft_stream_t *s, void *arg) {
  step_t *st = arg;
  weft_status_t r = WEFT_OK;
  for (unsigned k = 0; k < 8 && r == WEFT_OK; k++) {
    weft_block_t t;
    CUdeviceptr pt, pa;
    r = weft_alloc(weft_stream_runtime(s), 1u << 20, s, "temporary", &t);
    if (r == WEFT_OK) r = weft_block_ptr(t, &pt);
    if (r == WEFT_OK) r = weft_block_ptr(st->a, &pa);
    void *params[] = {&pt, &pa, &st->n, &st->iters};
    weft_access_t acc[] = {{t, WEFT_WRITE}, {st->a, WEFT_READ}};
    weft_launch_t l = {.func = st->b->lcg, .grid = {(st->n + 255) / 256}, .block = {256}, .params = params};
    if (r == WEFT_OK) r = weft_launch(s, &l, acc, 2);
    if (r == WEFT_OK) r = weft_free(t, s);
  }
  return r;
}

/* ---- eager step over two streams, against hand-placed events (issue 17) ----------------------
 * 100 kernels in a chain a -> c -> a -> ..., ten on one stream, the next ten on the other, so a
 * dependency crosses streams every 10 kernels. weft: weft_launch with the accesses (weft places
 * the waits), on pool streams 2 and 3, which nothing else here touches. (Until 2026-11-27 it ran
 * on streams 0 and 1; the raw graph launches above expose stream 0 through weft_stream_raw, and an
 * exposed stream records an event after every use (weft.h, weft_stream_raw): the diagnostic row
 * "one exposed" keeps measuring that case.) Hand-placed: the same kernels on two raw streams, one event recorded after each run
 * of ten and waited on by the other stream, the fewest a programmer can place. Wall time per
 * step over `steps` steps ending in one synchronisation. */
#define RUN 10

typedef struct eager2 {
  step_t *st;
  weft_block_t late[2]; /* turn_eager's */
  CUstream raw[2];
  CUevent ev[2];
  CUdeviceptr ra, rc; /* the raw side's buffers */
  unsigned steps;
} eager2_t;

/* One weft row of the eager step: its two streams, whether they are made eager before each sample
 * (turn_eager), and the events weft recorded per step in the last sample. */
typedef struct weft_row {
  eager2_t *e;
  weft_stream_t *on[2];
  bool turn;
  double events;
} weft_row_t;

static void use_once(weft_stream_t *s, weft_block_t b, weft_access_kind_t kind) {
  weft_access_t a = {b, kind};
  BENCH_WEFT(weft_use_begin(s, &a, 1));
  BENCH_WEFT(weft_use_end(s, &a, 1));
}

/* Untimed, before each sample of the "turned eager first" row: each of on[0], on[1] writes
 * late[0] then late[1], and the other reads late[0], an older use than the writer's newest, so
 * both lanes start eager (a late wait). In the step every wait needs the newest use of its stream,
 * so weft__clock_needed turns them lazy again after WEFT__CLOCK_CALM such waits each (within the
 * first steps); before 2026-11-27 they stayed eager for good. */
static void turn_eager(weft_stream_t *const *on, const weft_block_t *late) {
  for (int k = 0; k < 2; k++) {
    use_once(on[k], late[0], WEFT_WRITE);
    use_once(on[k], late[1], WEFT_WRITE);
    use_once(on[k ^ 1], late[0], WEFT_READ);
  }
}

static double eager_weft(void *arg) {
  weft_row_t *w = arg;
  eager2_t *e = w->e;
  weft_stream_t *const *on = w->on;
  step_t *st = e->st;
  CUdeviceptr pa, pc;
  BENCH_WEFT(weft_block_ptr(st->a, &pa));
  BENCH_WEFT(weft_block_ptr(st->c, &pc));
  if (w->turn) turn_eager(on, e->late);
  weft_counters_t c0, c1;
  BENCH_WEFT(weft_runtime_counters(weft_stream_runtime(on[0]), &c0));
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < e->steps; i++)
    for (unsigned k = 0; k < KERNELS; k++) {
      CUdeviceptr out = k % 2 ? pa : pc, in = k % 2 ? pc : pa;
      void *params[] = {&out, &in, &st->n, &st->iters};
      weft_access_t acc[] = {{k % 2 ? st->a : st->c, WEFT_WRITE}, {k % 2 ? st->c : st->a, WEFT_READ}};
      weft_launch_t l = {.func = st->b->lcg, .grid = {(st->n + 255) / 256}, .block = {256}, .params = params};
      BENCH_WEFT(weft_launch(on[(k / RUN) % 2], &l, acc, 2));
    }
  for (int k = 0; k < 2; k++) BENCH_WEFT(weft_stream_synchronize(on[k]));
  double us = (double)(bench_now_ns() - t0) / e->steps / 1e3;
  BENCH_WEFT(weft_runtime_counters(weft_stream_runtime(on[0]), &c1));
  w->events = (double)(c1.events_recorded - c0.events_recorded) / e->steps;
  return us;
}

/* Synthetic host work before each launch of the hand-placed step (the cost-model rows): `lines`
 * cache lines written (the same ones every kernel, as a tracker writes its records), `rmws`
 * locked adds, each on a line of its own, and about `instrs` instructions (an add loop of four
 * independent chains). What a kind of host work costs beside the driver's launch, per unit, is
 * the row's step time over the plain step's. */
typedef struct synth {
  unsigned lines, rmws, instrs;
} synth_t;

static _Alignas(64) volatile uint64_t g_synth_lines[256][8];
static _Alignas(64) _Atomic uint64_t g_synth_rmw[64][8];

static void synth_work(const synth_t *w, unsigned k) {
  for (unsigned i = 0; i < w->lines; i++) g_synth_lines[i][0] += k;
  for (unsigned i = 0; i < w->rmws; i++) atomic_fetch_add_explicit(&g_synth_rmw[i][0], 1, memory_order_relaxed);
  uint64_t a = k, b = k + 1, c = k + 2, d = k + 3;
  for (unsigned i = 0; i < w->instrs / 7; i++) { /* 7 instructions: 4 ops, an increment, a compare, a branch */
    a += i, b ^= i, c += b, d ^= a;
    __asm__ volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d));
  }
  g_synth_lines[255][1] = a + b + c + d;
}

/* The hand-placed step; `every` records an event after every kernel (the wait still only every
 * RUN kernels, on the last one): what weft's lanes do once another stream waits on them, so the
 * difference to the plain hand-placed step is what those records cost (a diagnostic row).
 * `holds` (1 or 2) runs the floor of a tracker (bench.h) before each launch (0: none); it must find
 * exactly the hand-placed waits, else the run aborts. `w` (NULL: none): synthetic host work before
 * each launch (synth_t). */
static double eager_hand_records(eager2_t *e, int every, int holds, const synth_t *w) {
  step_t *st = e->st;
  const weft__driver_t *d = st->b->drv;
  bench_floor_reset();
  uint64_t t0 = bench_now_ns();
  for (unsigned i = 0; i < e->steps; i++)
    for (unsigned k = 0; k < KERNELS; k++) {
      unsigned side = (k / RUN) % 2;
      bool wait = k % RUN == 0 && (k > 0 || i > 0);
      if (holds != 0 && bench_floor_use(side, k % 2 ? 0 : 1, k % 2 ? 1 : 0, holds) != wait)
        bench_die("the floor of a tracker placed a wait where the hand-placed step has none, or missed one");
      if (w != NULL) synth_work(w, k);
      if (wait) BENCH_CU(d->cuStreamWaitEvent(e->raw[side], e->ev[side ^ 1], 0));
      CUdeviceptr out = k % 2 ? e->ra : e->rc, in = k % 2 ? e->rc : e->ra;
      void *params[] = {&out, &in, &st->n, &st->iters};
      BENCH_CU(d->cuLaunchKernel(st->b->lcg, (st->n + 255) / 256, 1, 1, 256, 1, 1, 0, e->raw[side], params, NULL));
      if (every || k % RUN == RUN - 1) BENCH_CU(d->cuEventRecord(e->ev[side], e->raw[side]));
    }
  for (int k = 0; k < 2; k++) BENCH_CU(d->cuStreamSynchronize(e->raw[k]));
  return (double)(bench_now_ns() - t0) / e->steps / 1e3;
}

static double eager_hand(void *arg) { return eager_hand_records(arg, 0, 0, NULL); }
static double eager_hand_every(void *arg) { return eager_hand_records(arg, 1, 0, NULL); }
static double eager_floor1(void *arg) { return eager_hand_records(arg, 0, 1, NULL); }
static double eager_floor2(void *arg) { return eager_hand_records(arg, 0, 2, NULL); }

/* A cost-model row: the hand-placed step with synthetic work w before each launch. */
typedef struct cost_row {
  eager2_t *e;
  synth_t w;
} cost_row_t;

static double eager_synth(void *arg) {
  cost_row_t *c = arg;
  return eager_hand_records(c->e, 0, 0, &c->w);
}

/* What host work costs beside the driver's launches (diagnostic, issue 17): the hand-placed step
 * against itself with synthetic work before each launch (synth_t); per kernel and per unit, from
 * the medians. A tracked use is instructions, cache lines the driver's launch evicted and locked
 * operations (tools/host_instr.sh counts the three per path on the simulator); these rows price
 * each on the GPU host, beside the driver as in the eager step. */
static void eager_cost_model(bench_t *b, eager2_t *e) {
  static const char base[] = "hand-placed events, 2 raw streams (100 cuLaunchKernel)";
  static const struct {
    const char *row;
    synth_t w;
    unsigned units;
    const char *unit;
  } rows[] = {
      {"hand-placed + 32 cache lines written before each launch (diagnostic)", {32, 0, 0}, 32, "line"},
      {"hand-placed + 128 cache lines written before each launch (diagnostic)", {128, 0, 0}, 128, "line"},
      {"hand-placed + 8 locked adds before each launch (diagnostic)", {0, 8, 0}, 8, "locked add"},
      {"hand-placed + 32 locked adds before each launch (diagnostic)", {0, 32, 0}, 32, "locked add"},
      {"hand-placed + 2000 instructions before each launch (diagnostic)", {0, 0, 2000}, 2000, "instruction"},
      {"hand-placed + 8000 instructions before each launch (diagnostic)", {0, 0, 8000}, 8000, "instruction"},
  };
  enum { NROWS = sizeof rows / sizeof rows[0] };
  cost_row_t c[NROWS];
  bench_series_t series[NROWS + 1] = {{base, NULL, NULL, eager_hand, e}};
  for (int i = 0; i < NROWS; i++) {
    c[i] = (cost_row_t){e, rows[i].w};
    series[i + 1] = (bench_series_t){rows[i].row, base, NULL, eager_synth, &c[i]};
  }
  double med[NROWS + 1];
  bench_measure(b, "replay", "us per eager step, host work added before each launch", "us", series, NROWS + 1, med);
  static const char *const cols[] = {"host work before each of the 100 launches", "us per step (wall)",
                                     "ns per kernel over the plain step", "ns per unit"};
  bench_table(cols, 4);
  printf("| none (%s) | %.2f | baseline | |\n", base, med[0]);
  for (int i = 0; i < NROWS; i++) {
    double per_kernel = (med[i + 1] - med[0]) * 1e3 / KERNELS;
    printf("| %s | %.2f | %.1f | %.3f per %s |\n", rows[i].row, med[i + 1], per_kernel, per_kernel / rows[i].units,
           rows[i].unit);
  }
  printf("\n");
}

static void eager_two_streams(bench_t *b, weft_runtime_t *rt, step_t *st) {
  const weft__driver_t *d = b->drv;
  eager2_t e = {.st = st, .steps = bench_count(b, 200, 2)};
  /* Pool streams 2 and 3, which nothing else here touches; 0 and 1, the first exposed by the raw
   * graph's launches; 4 and 5, made eager before each sample. */
  weft_row_t w[3] = {{.e = &e}, {.e = &e}, {.e = &e, .turn = true}};
  for (int k = 0; k < 2; k++) {
    BENCH_WEFT(weft_stream_get(rt, 2u + (unsigned)k, &w[0].on[k]));
    BENCH_WEFT(weft_stream_get(rt, (unsigned)k, &w[1].on[k]));
    BENCH_WEFT(weft_stream_get(rt, 4u + (unsigned)k, &w[2].on[k]));
    BENCH_WEFT(weft_alloc(rt, 256, w[2].on[0], "late", &e.late[k]));
    BENCH_CU(d->cuStreamCreateWithPriority(&e.raw[k], CU_STREAM_NON_BLOCKING, 0));
    BENCH_CU(d->cuEventCreate(&e.ev[k], CU_EVENT_DISABLE_TIMING));
  }
  BENCH_CU(d->cuMemAlloc(&e.ra, ELEMS * 4));
  BENCH_CU(d->cuMemAlloc(&e.rc, ELEMS * 4));
  BENCH_CU(d->cuMemsetD32Async(e.ra, 1, ELEMS, e.raw[0]));
  BENCH_CU(d->cuStreamSynchronize(e.raw[0]));
  static const char wn[] = "weft eager, 2 streams (100 weft_launch)",
                    hn[] = "hand-placed events, 2 raw streams (100 cuLaunchKernel)",
                    en[] = "hand-placed events + an event record after every kernel (diagnostic)",
                    xn[] = "weft eager, 2 streams, one exposed by weft_stream_raw (diagnostic)",
                    yn[] = "weft eager, 2 streams turned eager before each sample (diagnostic)";
  static const char f1[] = "hand-placed events + the floor of a tracker: one mutex hold per kernel (diagnostic)",
                    f2[] = "hand-placed events + the floor of a tracker: two mutex holds per kernel (diagnostic)";
  bench_series_t series[7] = {{wn, hn, NULL, eager_weft, &w[0]},
                              {hn, NULL, NULL, eager_hand, &e},
                              {en, hn, NULL, eager_hand_every, &e},
                              {xn, hn, NULL, eager_weft, &w[1]},
                              {yn, hn, NULL, eager_weft, &w[2]},
                              {f1, hn, NULL, eager_floor1, &e},
                              {f2, hn, NULL, eager_floor2, &e}};
  double med[7];
  bench_measure(b, "replay", "us per eager step, an edge every 10 kernels", "us", series, 7, med);
  static const char *const names[3] = {wn, xn, yn};
  for (int i = 0; i < 3; i++)
    bench_sample(b, "replay", names[i], "events recorded per eager step (last sample)", "events", NULL, NULL, 0,
                 w[i].events);
  static const char *const cols[] = {"eager step, an edge every 10 kernels", "us per step (wall)",
                                     "vs hand-placed events", "events recorded per step"};
  bench_table(cols, 4);
  printf("| %s | %.2f | %.3fx | %.1f |\n| %s | %.2f | baseline | 10 |\n| %s | %.2f | %.3fx | 100 |\n", wn, med[0],
         med[0] / med[1], w[0].events, hn, med[1], en, med[2], med[2] / med[1]);
  printf("| %s | %.2f | %.3fx | %.1f |\n| %s | %.2f | %.3fx | %.1f |\n", xn, med[3], med[3] / med[1], w[1].events, yn,
         med[4], med[4] / med[1], w[2].events);
  printf("| %s | %.2f | %.3fx | 10 |\n| %s | %.2f | %.3fx | 10 |\n\n", f1, med[5], med[5] / med[1], f2, med[6],
         med[6] / med[1]);
  eager_cost_model(b, &e);
  for (int k = 0; k < 2; k++) BENCH_WEFT(weft_free(e.late[k], w[2].on[0]));
  BENCH_CU(d->cuMemFree(e.ra));
  BENCH_CU(d->cuMemFree(e.rc));
  for (int k = 0; k < 2; k++) {
    BENCH_CU(d->cuEventDestroy(e.ev[k]));
    BENCH_CU(d->cuStreamDestroy(e.raw[k]));
  }
}

void bench_replay(bench_t *b) {
  bench_section(b, "Captured-step replay vs raw graph vs eager",
                "A step of 100 dependent small kernels (1024 elements each). Wall time per step over many "
                "steps ending in one synchronisation; host time per launch call. Goal: weft replay within 1% "
                "of the same graph launched raw.");
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  weft_runtime_t *rt = bench_runtime(&o);
  weft_stream_t *s;
  BENCH_WEFT(weft_stream_get(rt, 0, &s));
  step_t st = {.b = b, .n = ELEMS, .iters = 1};
  BENCH_WEFT(weft_alloc(rt, ELEMS * 4, s, "a", &st.a));
  BENCH_WEFT(weft_alloc(rt, ELEMS * 4, s, "c", &st.c));
  BENCH_WEFT(weft_memset32(s, st.a, 0, 1, ELEMS * 4));
  weft_graph_t *g;
  BENCH_WEFT(weft_capture_run(s, NULL, run_step, &st, &g));
  weft_exec_t *e;
  BENCH_WEFT(weft_graph_instantiate(g, s, &e));
  CUgraphExec raw;
  BENCH_CU(b->drv->cuGraphInstantiateWithFlags(&raw, weft_graph_raw(g), 0));
  BENCH_CU(b->drv->cuGraphUpload(raw, weft_stream_raw(s)));
  unsigned steps = bench_count(b, 2000, 4), eager_steps = bench_count(b, 200, 2);
  double wall[3][BENCH_MAX_REPS], host[3][BENCH_MAX_REPS];
  for (unsigned rep = 0; rep < b->reps; rep++) {
    /* weft eager */
    BENCH_WEFT(weft_stream_synchronize(s));
    uint64_t t0 = bench_now_ns();
    for (unsigned i = 0; i < eager_steps; i++) BENCH_WEFT(run_step(s, &st));
    uint64_t t1 = bench_now_ns();
    BENCH_WEFT(weft_stream_synchronize(s));
    wall[0][rep] = (double)(bench_now_ns() - t0) / eager_steps / 1e3;
    host[0][rep] = (double)(t1 - t0) / eager_steps / KERNELS;
    /* weft replay */
    t0 = bench_now_ns();
    for (unsigned i = 0; i < steps; i++) BENCH_WEFT(weft_exec_launch(e, s));
    t1 = bench_now_ns();
    BENCH_WEFT(weft_stream_synchronize(s));
    wall[1][rep] = (double)(bench_now_ns() - t0) / steps / 1e3;
    host[1][rep] = (double)(t1 - t0) / steps;
    /* raw graph */
    t0 = bench_now_ns();
    for (unsigned i = 0; i < steps; i++) BENCH_CU(b->drv->cuGraphLaunch(raw, weft_stream_raw(s)));
    t1 = bench_now_ns();
    BENCH_CU(b->drv->cuStreamSynchronize(weft_stream_raw(s)));
    wall[2][rep] = (double)(bench_now_ns() - t0) / steps / 1e3;
    host[2][rep] = (double)(t1 - t0) / steps;
  }
  static const char *const names[] = {"weft eager (100 weft_launch)", "weft replay (weft_exec_launch)",
                                      "raw graph (cuGraphLaunch)"};
  /* Every sample (the three variants interleaved, repetition by repetition), then the medians. */
  for (int v = 0; v < 3; v++)
    for (unsigned rep = 0; rep < b->reps; rep++) {
      bench_sample(b, "replay", names[v], "us per step", "us", v < 2 ? names[2] : NULL, NULL, rep, wall[v][rep]);
      bench_sample(b, "replay", names[v], v == 0 ? "host ns per kernel" : "host ns per launch call", "ns", NULL, NULL,
                   rep, host[v][rep]);
    }
  double w[3], h[3];
  for (int v = 0; v < 3; v++) w[v] = bench_median(wall[v], b->reps), h[v] = bench_median(host[v], b->reps);
  static const char *const cols[] = {"variant", "us per step (wall)", "vs raw graph", "host ns per launch call"};
  bench_table(cols, 4);
  for (int v = 0; v < 3; v++) printf("| %s | %.2f | %.3fx | %.0f |\n", names[v], w[v], w[v] / w[2], h[v]);
  printf("\n");
  eager_two_streams(b, rt, &st);
  BENCH_CU(b->drv->cuGraphExecDestroy(raw));
  BENCH_WEFT(weft_exec_destroy(e));
  BENCH_WEFT(weft_graph_destroy(g));

  /* Memory of the two policies: 8 sequential 1 MiB temporaries per step. */
  BENCH_WEFT(weft_runtime_synchronize(rt));
  BENCH_WEFT(weft_graph_memory_trim(rt));
  weft_graph_t *gn, *gp;
  BENCH_WEFT(weft_capture_run(s, NULL, temporaries_step, &st, &gn));
  weft_exec_t *en, *ep;
  BENCH_WEFT(weft_graph_instantiate(gn, s, &en));
  BENCH_WEFT(weft_exec_launch(en, s));
  BENCH_WEFT(weft_stream_synchronize(s));
  weft_graph_memory_stats_t m;
  BENCH_WEFT(weft_graph_memory_stats(rt, &m));
  weft_capture_options_t co = weft_capture_options_default();
  co.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  weft_graph_pool_t *pool;
  BENCH_WEFT(weft_graph_pool_create(rt, &pool));
  co.pool = pool;
  BENCH_WEFT(weft_capture_run(s, &co, temporaries_step, &st, &gp));
  BENCH_WEFT(weft_graph_instantiate(gp, s, &ep));
  BENCH_WEFT(weft_exec_launch(ep, s));
  BENCH_WEFT(weft_stream_synchronize(s));
  static const char *const mcols[] = {"policy", "reserved for the step", "in use (high)"};
  bench_table(mcols, 3);
  printf("| graph memory nodes | %.1f MiB | %.1f MiB |\n", m.reserved_high / 1048576.0, m.used_high / 1048576.0);
  printf("| weft graph pool | %.1f MiB | %.1f MiB |\n\n", weft_graph_pool_reserved(pool) / 1048576.0,
         weft_graph_pool_reserved(pool) / 1048576.0);
  bench_sample(b, "replay", "graph memory nodes", "reserved bytes", "B", NULL, NULL, 0, (double)m.reserved_high);
  bench_sample(b, "replay", "weft graph pool", "reserved bytes", "B", NULL, NULL, 0, (double)weft_graph_pool_reserved(pool));
  BENCH_WEFT(weft_exec_destroy(en));
  BENCH_WEFT(weft_exec_destroy(ep));
  BENCH_WEFT(weft_graph_destroy(gn));
  BENCH_WEFT(weft_graph_destroy(gp));
  BENCH_WEFT(weft_graph_pool_destroy(pool));
  BENCH_WEFT(weft_free(st.a, s));
  BENCH_WEFT(weft_free(st.c, s));
  BENCH_WEFT(weft_runtime_release(rt));
}
