/* The capture-legality matrix: every public weft call that may touch the driver, made while a
 * capture is underway somewhere, in every situation a program can create, in each capture mode.
 *
 * Situations (the column letter):
 *   a  no capture
 *   b  weft's own capture on pool stream 0 (weft_capture_begin); the call uses other streams
 *   c  an outside capture on pool stream 0 (cuStreamBeginCapture on weft_stream_raw(s0))
 *   d  an outside capture on a stream weft never saw (created here with cuStreamCreate)
 *   e  as d, begun (and ended) on another thread; the call is made on this thread
 * and b-e in each mode: G (GLOBAL), T (THREAD_LOCAL), R (RELAXED).
 *
 * The rule, per cell: the capture still ends successfully and its graph instantiates (and holds
 * only what its owner captured: work of a call on other streams must not leak into it), OR the
 * call returned WEFT_ERR_CAPTURE and changed nothing (counters, resource statistics, blocks
 * still live). In (a) the call must succeed. Every cell also ends with the race oracle silent.
 * Each cell is independent: its objects are made before its capture begins and released after
 * it ended.
 *
 * The table prints one code per cell:
 *   ok    success, capture intact          ref   WEFT_ERR_CAPTURE, nothing changed, capture intact
 *   INV   the capture did not end well (invalidated / end failed / graph does not instantiate)
 *   LEAK  the call succeeded but put work into the capture (the graph has more nodes than the
 *         control row's)
 *   CHG   WEFT_ERR_CAPTURE but the counters / statistics / blocks changed
 *   ERR   another status                   BAD   the call's answer is wrong (is_capturing)
 *   RACE  the simulator's oracle reported a race    DIRT  the runtime did not synchronise after
 *   PREP  the cell's preparation failed (a harness problem, not a verdict)
 *   inv   (positive-control row only) the unsafe raw call broke the capture, as it must there;
 *   CTL!  it did not break one it must break, or broke one it must not: the harness is blind
 *   CRSH / HANG  weft crashed or did not return within 30 s (simulator: each cell is a process)
 * then every failing cell with the call's status, weft_last_error() and the capture's end.
 *
 * WEFT_MATRIX_ONLY=<substring> runs only the calls whose name contains it (reproducers);
 * WEFT_MATRIX_VERBOSE=1 prints every cell's details, not only the failing ones; WEFT_MATRIX_TRACE=1
 * names each cell before it runs (for a crash); WEFT_MATRIX_SKIP='a;b' leaves out the calls whose
 * name contains a or b (on a GPU, where cells share one process, a call that crashes weft).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/core/driver.h"
#include "tests/util/testutil.h"

#define BYTES 4096u
#define N (BYTES / 4)
#define BIG ((size_t)8 << 20) /* gets a dedicated chunk from weft's pool: reaches the driver */

static tu_env_t env;
static const weft__driver_t *d;
static CUcontext g_ctx;
static weft_stream_t *S[4];   /* pool streams 0..3; 0 captures in b and c */
static CUstream g_x;          /* the stream weft never saw: captures in d and e */
static CUstream g_y;          /* another stream weft never saw: never captured (imports) */
static CUdeviceptr g_scratch; /* what the outside captures write */
static FILE *g_devnull;

/* ---- situations and modes --------------------------------------------------------------------- */

enum { SIT_A, SIT_B, SIT_C, SIT_D, SIT_E, NSIT };
static const char sit_letter[NSIT] = {'a', 'b', 'c', 'd', 'e'};
static const char *const sit_words[NSIT] = {
    "no capture",
    "weft's own capture on pool stream 0",
    "an outside capture on pool stream 0",
    "an outside capture on a stream weft never saw",
    "an outside capture on another thread, on a stream weft never saw",
};
static const CUstreamCaptureMode cu_modes[3] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                                CU_STREAM_CAPTURE_MODE_RELAXED};
static const weft_capture_mode_t weft_modes[3] = {WEFT_CAPTURE_GLOBAL, WEFT_CAPTURE_THREAD_LOCAL, WEFT_CAPTURE_RELAXED};
static const char mode_letter[3] = {'G', 'T', 'R'};
static const char *const mode_words[3] = {"GLOBAL", "THREAD_LOCAL", "RELAXED"};

/* Columns: a, then b..e × G, T, R. */
#define NCOL (1 + (NSIT - 1) * 3)
static int col_sit(int col) { return col == 0 ? SIT_A : 1 + (col - 1) / 3; }
static int col_mode(int col) { return col == 0 ? 0 : (col - 1) % 3; }

/* ---- one cell's objects --------------------------------------------------------------------------- */

typedef struct cell {
  int sit, mode;
  weft_stream_t *on, *on2;      /* the streams the call uses (never capturing) */
  weft_block_t b[3];            /* blocks from the runtime (b[2]: wrapped cuMemAlloc memory) */
  CUdeviceptr wrapped;          /* behind b[2] */
  weft_resource_t *res, *up;    /* the resource under test and its upstream */
  CUdeviceptr p;                /* allocated from res */
  size_t p_bytes;
  weft_graph_t *g, *g2;
  weft_exec_t *e;
  weft_graph_pool_t *gp;
  weft_builder_t *bld;
  weft_block_t bb[2];           /* builder blocks */
  CUevent ev;                   /* exported or imported */
  uint64_t value;               /* answers: attributes, counters */
  int answer;                   /* weft_stream_is_capturing */
  char host[BYTES];
} cell_t;

typedef struct call {
  const char *name;
  int (*prep)(cell_t *c);        /* 0: ready; made with no capture active */
  weft_status_t (*run)(cell_t *c);
  const char *(*check)(cell_t *c); /* after a successful run: NULL, or what is wrong */
  weft_status_t also_ok;         /* a second status that counts as success (query: NOT_READY) */
  int positive_control;          /* not weft: an unsafe driver call that must break the captures
                                    the driver says it breaks (shows the harness can see it) */
} call_t;

static unsigned spin(void) { return env.spin_ns; }

static int fail_prep(const char *what, weft_status_t st) {
  printf("matrix: prep: %s: %s: %s\n", what, weft_status_name(st), weft_last_error());
  return -1;
}
#define PREP(expr)                                 \
  do {                                             \
    weft_status_t st_ = (expr);                    \
    if (st_ != WEFT_OK) return fail_prep(#expr, st_); \
  } while (0)
#define PREP_CU(expr)                                                    \
  do {                                                                   \
    CUresult r_ = (expr);                                                \
    if (r_ != CUDA_SUCCESS) {                                            \
      printf("matrix: prep: %s: %s\n", #expr, weft_driver_error_name(r_)); \
      return -1;                                                         \
    }                                                                    \
  } while (0)

/* ---- preparations --------------------------------------------------------------------------------- */

static int prep_none(cell_t *c) { (void)c; return 0; }
/* b0 allocated and written on `on` (its work may still be pending). */
static int prep_b0(cell_t *c) {
  PREP(weft_alloc(env.rt, BYTES, c->on, "matrix.b0", &c->b[0]));
  PREP(tu_fill(&env, c->on, c->b[0], N, 1));
  return 0;
}
static int prep_b0_b1(cell_t *c) {
  if (prep_b0(c)) return -1;
  PREP(weft_alloc(env.rt, BYTES, c->on2, "matrix.b1", &c->b[1]));
  return 0;
}
static int prep_b0_empty(cell_t *c) {
  PREP(weft_alloc(env.rt, BYTES, c->on, "matrix.b0", &c->b[0]));
  return 0;
}
static int prep_big(cell_t *c) {
  PREP(weft_alloc(env.rt, BIG, c->on, "matrix.big", &c->b[0]));
  return 0;
}
/* b2: cuMemAlloc memory wrapped (stream memory operations refuse pool memory). */
static int prep_wrapped(cell_t *c) {
  PREP_CU(d->cuMemAlloc(&c->wrapped, BYTES));
  PREP_CU(d->cuMemsetD8Async(c->wrapped, 0, BYTES, g_y));
  PREP_CU(d->cuStreamSynchronize(g_y));
  PREP(weft_block_wrap(env.rt, c->wrapped, BYTES, "matrix.wrapped", &c->b[2]));
  return 0;
}
static int prep_event(cell_t *c) {
  PREP_CU(d->cuEventCreate(&c->ev, CU_EVENT_DISABLE_TIMING));
  PREP_CU(d->cuMemsetD32Async(g_scratch + 1024, 3, 16, g_y));
  PREP_CU(d->cuEventRecord(c->ev, g_y));
  return 0;
}
static int prep_y_work(cell_t *c) {
  (void)c;
  PREP_CU(d->cuMemsetD32Async(g_scratch + 1024, 4, 16, g_y));
  return 0;
}

/* b0 written on pool stream 0 just before its capture begins (the tick may still be pending: its
 * event not yet recorded), b1 on `on`. */
static int prep_s0_block(cell_t *c) {
  PREP(weft_alloc(env.rt, BYTES, S[0], "matrix.s0", &c->b[0]));
  PREP(tu_fill(&env, S[0], c->b[0], N, 1));
  PREP(weft_alloc(env.rt, BYTES, c->on, "matrix.b1", &c->b[1]));
  return 0;
}
/* Memory weft's pool got from upstream on stream 0 and that was freed there. */
static int prep_s0_freed(cell_t *c) {
  weft_block_t t;
  PREP(weft_alloc(env.rt, BYTES, S[0], "matrix.s0", &t));
  PREP(tu_fill(&env, S[0], t, N, 1));
  PREP(weft_free(t, S[0]));
  return 0;
}

/* ---- the calls: blocks, uses, streams ---------------------------------------------------------- */

static weft_status_t run_control(cell_t *c) { (void)c; return WEFT_OK; }
/* The positive control: the raw stream-ordered allocation weft makes, without RELAXED. */
static weft_status_t run_unsafe_raw(cell_t *c) {
  CUdeviceptr p = 0;
  CUresult r = d->cuMemAllocAsync(&p, BYTES, weft_stream_raw(c->on));
  if (r == CUDA_SUCCESS) r = d->cuMemFreeAsync(p, weft_stream_raw(c->on));
  return r == CUDA_SUCCESS ? WEFT_OK : WEFT_ERR_DRIVER;
}
/* Where that breaks the capture: a non-RELAXED capture of this thread, or a GLOBAL one of another
 * (CUDA_SEMANTICS.md, tests/conformance). */
static int unsafe_breaks(int sit, int mode) {
  if (sit == SIT_A || cu_modes[mode] == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
  return sit != SIT_E || cu_modes[mode] == CU_STREAM_CAPTURE_MODE_GLOBAL;
}
static weft_status_t run_alloc(cell_t *c) { return weft_alloc(env.rt, BYTES, c->on, "matrix.new", &c->b[0]); }
static weft_status_t run_alloc_big(cell_t *c) { return weft_alloc(env.rt, BIG, c->on, "matrix.big", &c->b[0]); }
static weft_status_t freed(cell_t *c, int i, weft_status_t st) {
  if (st == WEFT_OK) c->b[i] = (weft_block_t){0};
  return st;
}
static weft_status_t run_free(cell_t *c) { return freed(c, 0, weft_free(c->b[0], c->on)); }
static weft_status_t run_free_other(cell_t *c) { return freed(c, 0, weft_free(c->b[0], c->on2)); }
static weft_status_t run_free_wrapped(cell_t *c) { return freed(c, 2, weft_free(c->b[2], c->on)); }
static weft_status_t run_fill(cell_t *c) { return tu_fill(&env, c->on, c->b[0], N, 2); }
static weft_status_t run_combine(cell_t *c) {
  return tu_combine(&env, c->on2, c->b[1], (weft_block_t){0}, c->b[0], (weft_block_t){0}, (weft_block_t){0}, N, 3);
}
static weft_status_t run_combine_s0(cell_t *c) {
  return tu_combine(&env, c->on, c->b[1], (weft_block_t){0}, c->b[0], (weft_block_t){0}, (weft_block_t){0}, N, 3);
}
static weft_status_t run_free_on_s0(cell_t *c) { return freed(c, 0, weft_free(c->b[0], S[0])); }
static weft_status_t run_sync_s0(cell_t *c) { (void)c; return weft_stream_synchronize(S[0]); }
static weft_status_t run_query_s0(cell_t *c) { (void)c; return weft_stream_query(S[0]); }
static weft_status_t run_capture_s0(cell_t *c) {
  weft_status_t st = weft_capture_begin(S[0], NULL);
  if (st != WEFT_OK) return st;
  return weft_capture_end(S[0], &c->g2);
}
static weft_status_t run_use(cell_t *c) {
  weft_access_t a = {c->b[0], WEFT_READ_WRITE};
  weft_status_t st = weft_use_begin(c->on, &a, 1);
  if (st != WEFT_OK) return st;
  return weft_use_end(c->on, &a, 1);
}
static weft_status_t run_copy_to(cell_t *c) { return weft_copy_to_block(c->on, c->b[0], 0, c->host, 256); }
static weft_status_t run_copy_from(cell_t *c) { return weft_copy_from_block(c->on, c->host, c->b[0], 0, 256); }
static weft_status_t run_copy_block(cell_t *c) { return weft_copy_block(c->on2, c->b[1], 0, c->b[0], 0, 256); }
static weft_status_t run_memset8(cell_t *c) { return weft_memset8(c->on, c->b[0], 0, 7, 256); }
static weft_status_t run_memset32(cell_t *c) { return weft_memset32(c->on, c->b[0], 0, 7, 256); }
static void host_fn(void *user) { (void)user; }
static weft_status_t run_host_func(cell_t *c) {
  weft_access_t a = {c->b[0], WEFT_READ};
  return weft_host_func(c->on, host_fn, NULL, &a, 1);
}
static weft_status_t run_write32(cell_t *c) { return weft_write_value32(c->on, c->b[2], 0, 5); }
static weft_status_t run_write64(cell_t *c) { return weft_write_value64(c->on, c->b[2], 8, 5); }
static weft_status_t run_wait32(cell_t *c) { return weft_wait_value32(c->on, c->b[2], 0, 0, CU_STREAM_WAIT_VALUE_GEQ); }
static weft_status_t run_wait64(cell_t *c) { return weft_wait_value64(c->on, c->b[2], 8, 0, CU_STREAM_WAIT_VALUE_GEQ); }
static weft_status_t run_hot_block(cell_t *c) { return weft_stream_set_hot_block(c->on, c->b[0], 0.5f); }
static weft_status_t run_sync(cell_t *c) { return weft_stream_synchronize(c->on); }
static weft_status_t run_query(cell_t *c) { return weft_stream_query(c->on); }
static weft_status_t run_is_capturing_on(cell_t *c) { return weft_stream_is_capturing(c->on, &c->answer); }
static weft_status_t run_is_capturing_s0(cell_t *c) { return weft_stream_is_capturing(S[0], &c->answer); }
static const char *check_not_capturing(cell_t *c) { return c->answer == 0 ? NULL : "said 1 for a stream that is not capturing"; }
static const char *check_s0_answer(cell_t *c) {
  int want = c->sit == SIT_B || c->sit == SIT_C;
  if (c->answer == want) return NULL;
  return want ? "said 0 for pool stream 0, which is capturing" : "said 1 for pool stream 0, which is not capturing";
}
static weft_status_t run_priority(cell_t *c) {
  int p;
  return weft_stream_priority(c->on, &p);
}
static weft_status_t run_stream_id(cell_t *c) {
  unsigned long long id;
  return weft_stream_id(c->on, &id);
}
static weft_status_t run_block_sync(cell_t *c) { return weft_block_synchronize(c->b[0]); }
static weft_status_t run_export(cell_t *c) { return weft_block_export_event(c->b[0], WEFT_WRITE, &c->ev); }
static weft_status_t run_import_event(cell_t *c) { return weft_stream_import_event(c->on, c->ev); }
static weft_status_t run_import_stream(cell_t *c) { return weft_stream_import_stream(c->on, g_y); }
static weft_status_t run_rt_sync(cell_t *c) { (void)c; return weft_runtime_synchronize(env.rt); }
/* The same once weft has seen the capture on stream 0 (a call on that stream adopts it). */
static weft_status_t run_rt_sync_seen(cell_t *c) {
  int cap = 0;
  weft_status_t st = weft_stream_is_capturing(S[0], &cap);
  (void)c;
  return st != WEFT_OK ? st : weft_runtime_synchronize(env.rt);
}
static weft_status_t run_counters(cell_t *c) {
  weft_counters_t k;
  (void)c;
  return weft_runtime_counters(env.rt, &k);
}
static weft_status_t run_print(cell_t *c) {
  (void)c;
  weft_runtime_print(env.rt, g_devnull);
  return WEFT_OK;
}

/* ---- resources --------------------------------------------------------------------------------------- */

enum { R_DIRECT, R_ASYNC, R_POOL, R_BUDGET, R_GUARD, R_LOGGING, R_STATS, NRES };
static void log_sink(void *user, const char *line) { (void)user, (void)line; }

/* The upstream of the adaptors: a fresh driver pool of their own. */
static int make_up(cell_t *c) {
  PREP(weft_async_create(env.rt, NULL, &c->up));
  return 0;
}
static weft_status_t create(cell_t *c, int kind) {
  switch (kind) {
    case R_DIRECT: return weft_direct_create(env.rt, &c->res);
    case R_ASYNC: return weft_async_create(env.rt, NULL, &c->res);
    case R_POOL: {
      weft_pool_options_t o = weft_pool_options_default();
      o.chunk_bytes = 1 << 20;
      return weft_pool_create(env.rt, c->up, &o, &c->res);
    }
    case R_BUDGET: return weft_budget_create(env.rt, c->up, 64 << 20, NULL, &c->res);
    case R_GUARD: return weft_guard_create(env.rt, c->up, NULL, &c->res);
    case R_LOGGING: return weft_logging_create(env.rt, c->up, NULL, log_sink, NULL, &c->res);
    default: return weft_stats_create(env.rt, c->up, &c->res);
  }
}
static int prep_res_up(cell_t *c, int kind) { return kind == R_DIRECT || kind == R_ASYNC ? 0 : make_up(c); }
static int prep_res_made(cell_t *c, int kind) {
  if (prep_res_up(c, kind)) return -1;
  PREP(create(c, kind));
  return 0;
}
static int prep_res_allocated(cell_t *c, int kind) {
  if (prep_res_made(c, kind)) return -1;
  PREP(weft_resource_allocate(c->res, BYTES, c->on, "matrix.r", &c->p));
  c->p_bytes = BYTES;
  return 0;
}
/* Allocated and given back, its work complete: the resource holds cached memory to trim. */
static int prep_res_cached(cell_t *c, int kind) {
  if (prep_res_allocated(c, kind)) return -1;
  PREP(weft_resource_deallocate(c->res, c->p, c->p_bytes, c->on, "matrix.r"));
  c->p = 0;
  PREP(weft_stream_synchronize(c->on));
  return 0;
}
static weft_status_t res_alloc(cell_t *c) {
  weft_status_t st = weft_resource_allocate(c->res, BYTES, c->on, "matrix.r", &c->p);
  if (st == WEFT_OK) c->p_bytes = BYTES;
  return st;
}
static weft_status_t res_dealloc(cell_t *c) {
  weft_status_t st = weft_resource_deallocate(c->res, c->p, c->p_bytes, c->on, "matrix.r");
  if (st == WEFT_OK || st == WEFT_ERR_CORRUPTED) c->p = 0;
  return st;
}
static weft_status_t res_trim(cell_t *c) { return weft_resource_trim(c->res, 0); }
static weft_status_t res_stats(cell_t *c) {
  weft_resource_stats_t s;
  weft_resource_stats(c->res, &s);
  return WEFT_OK;
}
static weft_status_t res_destroy(cell_t *c) {
  weft_resource_destroy(c->res);
  c->res = NULL;
  return WEFT_OK;
}
/* A destroyed adaptor has given everything back to its upstream. */
static const char *check_up_released(cell_t *c) {
  if (c->up == NULL) return NULL;
  weft_resource_stats_t s;
  weft_resource_stats(c->up, &s);
  return s.live_bytes == 0 ? NULL : "the upstream still has live bytes after the destroy (memory given back failed)";
}

#define RES_CALLS(K, k)                                                                   \
  static int prep_##k##_up(cell_t *c) { return prep_res_up(c, K); }                       \
  static int prep_##k##_made(cell_t *c) { return prep_res_made(c, K); }                   \
  static int prep_##k##_allocated(cell_t *c) { return prep_res_allocated(c, K); }         \
  static int prep_##k##_cached(cell_t *c) { return prep_res_cached(c, K); }               \
  static weft_status_t run_##k##_create(cell_t *c) { return create(c, K); }
RES_CALLS(R_DIRECT, direct)
RES_CALLS(R_ASYNC, async)
RES_CALLS(R_POOL, pool)
RES_CALLS(R_BUDGET, budget)
RES_CALLS(R_GUARD, guard)
RES_CALLS(R_LOGGING, logging)
RES_CALLS(R_STATS, stats)

static weft_status_t run_async_create_reserve(cell_t *c) {
  weft_async_options_t o = weft_async_options_default();
  o.initial_reserve = 1 << 20;
  return weft_async_create(env.rt, &o, &c->res);
}
static weft_status_t run_async_get(cell_t *c) {
  return weft_async_get_attribute(c->res, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &c->value);
}
static weft_status_t run_async_set(cell_t *c) {
  return weft_async_set_attribute(c->res, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
}
static int prep_async_ipc(cell_t *c) {
  weft_async_options_t o = weft_async_options_default();
  o.handle_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  PREP(weft_async_create(env.rt, &o, &c->res));
  return 0;
}
static weft_status_t run_async_export(cell_t *c) {
  int fd = -1;
  weft_status_t st = weft_async_export(c->res, &fd);
  if (fd >= 0) close(fd);
  return st;
}
static weft_status_t run_res_conformance(cell_t *c) {
  /* one stream: with two, the suite frees on `other` what it allocated on `s` with no order between
   * them, which the oracle rightly reports (a property of the suite, not of captures) */
  unsigned failed = weft_resource_conformance(c->res, c->on, c->on, NULL);
  return failed == 0 ? WEFT_OK : WEFT_ERR_DRIVER;
}

/* ---- graphs --------------------------------------------------------------------------------------- */

/* Captured on pool stream 3 (no situation uses it): a temporary, and a write of b0. */
static weft_status_t body_temp(weft_stream_t *s, void *user) {
  cell_t *c = user;
  weft_block_t t;
  weft_status_t st = weft_alloc(env.rt, BYTES, s, "matrix.temp", &t);
  if (st == WEFT_OK) st = tu_fill(&env, s, t, N, 5);
  if (st == WEFT_OK) st = tu_combine(&env, s, c->b[0], (weft_block_t){0}, t, (weft_block_t){0}, (weft_block_t){0}, N, 6);
  if (st == WEFT_OK) st = weft_free(t, s);
  return st;
}
/* An output: allocated and written, not freed. */
static weft_status_t body_output(weft_stream_t *s, void *user) {
  (void)user;
  weft_block_t t;
  weft_status_t st = weft_alloc(env.rt, BYTES, s, "matrix.output", &t);
  if (st == WEFT_OK) st = tu_fill(&env, s, t, N, 7);
  return st;
}
static int prep_graph(cell_t *c) {
  PREP(weft_alloc(env.rt, BYTES, c->on2, "matrix.b0", &c->b[0]));
  PREP(tu_fill(&env, c->on2, c->b[0], N, 1)); /* so that a launch on `on` must wait */
  PREP(weft_capture_run(S[3], NULL, body_temp, c, &c->g));
  return 0;
}
static int prep_exec(cell_t *c) {
  if (prep_graph(c)) return -1;
  PREP(weft_graph_instantiate(c->g, S[3], &c->e));
  return 0;
}
static int prep_output(cell_t *c) {
  PREP(weft_capture_run(S[3], NULL, body_output, c, &c->g));
  PREP(weft_graph_instantiate(c->g, S[3], &c->e));
  PREP(weft_exec_launch(c->e, c->on));
  PREP(weft_exec_output(c->e, 0, &c->b[1]));
  return 0;
}
/* A graph whose access summary holds b0, last written on pool stream 0 before its capture. */
static int prep_exec_s0(cell_t *c) {
  PREP(weft_alloc(env.rt, BYTES, S[0], "matrix.b0", &c->b[0]));
  PREP(tu_fill(&env, S[0], c->b[0], N, 1));
  PREP(weft_capture_run(S[3], NULL, body_temp, c, &c->g));
  PREP(weft_graph_instantiate(c->g, S[3], &c->e));
  return 0;
}
static weft_status_t run_exec_launch_s0(cell_t *c) { return weft_exec_launch(c->e, S[0]); }
static weft_status_t run_instantiate(cell_t *c) { return weft_graph_instantiate(c->g, c->on, &c->e); }
static weft_status_t run_exec_launch(cell_t *c) { return weft_exec_launch(c->e, c->on); }
static weft_status_t run_exec_destroy(cell_t *c) {
  weft_status_t st = weft_exec_destroy(c->e);
  if (st == WEFT_OK) c->e = NULL;
  return st;
}
static weft_status_t run_graph_destroy(cell_t *c) {
  weft_status_t st = weft_graph_destroy(c->g);
  if (st == WEFT_OK) c->g = NULL;
  return st;
}
static weft_status_t run_free_output(cell_t *c) { return freed(c, 1, weft_free(c->b[1], c->on)); }
static weft_status_t run_gpool_create(cell_t *c) { return weft_graph_pool_create(env.rt, &c->gp); }
static int prep_gpool(cell_t *c) {
  PREP(weft_graph_pool_create(env.rt, &c->gp));
  return 0;
}
/* A pool that holds device memory: a private-pool capture drew from it (its graph is gone). */
static int prep_gpool_used(cell_t *c) {
  if (prep_gpool(c)) return -1;
  weft_capture_options_t o = weft_capture_options_default();
  o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  o.pool = c->gp;
  PREP(weft_capture_run(S[3], &o, body_output, c, &c->g));
  PREP(weft_graph_destroy(c->g));
  c->g = NULL;
  return 0;
}
static weft_status_t run_gpool_destroy(cell_t *c) {
  weft_status_t st = weft_graph_pool_destroy(c->gp);
  /* Even when it fails, weft_graph_pool_destroy may have freed the pool (it did when a stream
   * would not synchronise): never touch the handle again; the cell leaks it at worst. */
  if (st == WEFT_OK || st != WEFT_ERR_BUSY) c->gp = NULL;
  return st;
}
static weft_status_t run_gmem_stats(cell_t *c) {
  weft_graph_memory_stats_t s;
  (void)c;
  return weft_graph_memory_stats(env.rt, &s);
}
static weft_status_t run_gmem_trim(cell_t *c) { (void)c; return weft_graph_memory_trim(env.rt); }

/* weft_capture_begin .. weft_capture_end on `on`, in the cell's mode (GLOBAL in a). */
static weft_status_t run_capture_other(cell_t *c) {
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = weft_modes[c->mode];
  weft_status_t st = weft_capture_begin(c->on, &o);
  if (st != WEFT_OK) return st;
  weft_block_t t;
  weft_status_t body = weft_alloc(env.rt, BYTES, c->on, "matrix.inner", &t);
  if (body == WEFT_OK) body = tu_fill(&env, c->on, t, N, 8);
  if (body == WEFT_OK) body = weft_free(t, c->on);
  char why[256] = "";
  if (body != WEFT_OK) snprintf(why, sizeof why, "%s", weft_last_error());
  st = weft_capture_end(c->on, &c->g2);
  if (body != WEFT_OK) {
    printf("matrix: capture on another stream: body failed: %s\n", why);
    return body;
  }
  return st;
}

/* ---- the builder ------------------------------------------------------------------------------------ */

static int prep_builder(cell_t *c) {
  PREP(weft_builder_create(env.rt, &c->bld));
  return 0;
}
static int prep_builder_block(cell_t *c) {
  if (prep_builder(c)) return -1;
  PREP(weft_builder_alloc(c->bld, BYTES, "matrix.bb0", &c->bb[0]));
  return 0;
}
static int prep_builder_two(cell_t *c) {
  if (prep_builder_block(c)) return -1;
  PREP(weft_builder_alloc(c->bld, BYTES, "matrix.bb1", &c->bb[1]));
  return 0;
}
static weft_status_t builder_kernel(cell_t *c, weft_block_t b) {
  CUdeviceptr p = 0;
  weft_status_t st = weft_block_ptr(b, &p);
  if (st != WEFT_OK) return st;
  unsigned n = N, v = 9, sp = spin();
  void *params[4] = {&p, &n, &v, &sp};
  weft_launch_t l = {.func = env.fill, .grid = {(N + 255) / 256}, .block = {256}, .params = params};
  weft_access_t a = {b, WEFT_WRITE};
  return weft_builder_kernel(c->bld, &l, &a, 1, NULL);
}
static int prep_builder_filled(cell_t *c) {
  if (prep_builder_block(c)) return -1;
  PREP(builder_kernel(c, c->bb[0]));
  return 0;
}
static weft_status_t run_builder_create(cell_t *c) { return weft_builder_create(env.rt, &c->bld); }
static weft_status_t run_builder_alloc(cell_t *c) { return weft_builder_alloc(c->bld, BYTES, "matrix.bb0", &c->bb[0]); }
static weft_status_t run_builder_kernel(cell_t *c) { return builder_kernel(c, c->bb[0]); }
static weft_status_t run_builder_copy(cell_t *c) { return weft_builder_copy(c->bld, c->bb[1], 0, c->bb[0], 0, 256, NULL); }
static weft_status_t run_builder_memset(cell_t *c) { return weft_builder_memset32(c->bld, c->bb[0], 0, 1, 256, NULL); }
static weft_status_t run_builder_host(cell_t *c) {
  weft_access_t a = {c->bb[0], WEFT_READ};
  return weft_builder_host(c->bld, host_fn, NULL, &a, 1, NULL);
}
static weft_status_t run_builder_empty(cell_t *c) {
  weft_access_t a = {c->bb[0], WEFT_READ};
  return weft_builder_empty(c->bld, &a, 1, NULL);
}
static weft_status_t run_builder_free(cell_t *c) { return weft_builder_free(c->bld, c->bb[0]); }
static weft_status_t run_builder_finish(cell_t *c) {
  weft_builder_t *b = c->bld;
  c->bld = NULL; /* consumed, also on failure */
  if (weft_builder_free(b, c->bb[0]) != WEFT_OK) printf("matrix: builder_free before finish failed\n");
  return weft_builder_finish(b, &c->g);
}
static weft_status_t run_builder_destroy(cell_t *c) {
  weft_builder_destroy(c->bld);
  c->bld = NULL;
  return WEFT_OK;
}

/* ---- the list ------------------------------------------------------------------------------------- */

#define RES_ROWS(k)                                                                      \
  {#k "_create", prep_##k##_up, run_##k##_create, NULL, WEFT_OK, 0},                        \
      {#k " allocate", prep_##k##_made, res_alloc, NULL, WEFT_OK, 0},                       \
      {#k " deallocate", prep_##k##_allocated, res_dealloc, NULL, WEFT_OK, 0},              \
      {#k " trim", prep_##k##_cached, res_trim, NULL, WEFT_OK, 0},                          \
      {#k " stats", prep_##k##_allocated, res_stats, NULL, WEFT_OK, 0},                     \
      {#k " destroy", prep_##k##_cached, res_destroy, check_up_released, WEFT_OK, 0}

static const call_t calls[] = {
    {"(control: no call)", prep_none, run_control, NULL, WEFT_OK, 0},
    {"(positive control: raw cuMemAllocAsync)", prep_none, run_unsafe_raw, NULL, WEFT_OK, 1},
    {"weft_alloc", prep_none, run_alloc, NULL, WEFT_OK, 0},
    {"weft_alloc 8M (own chunk)", prep_none, run_alloc_big, NULL, WEFT_OK, 0},
    {"weft_alloc (memory freed on s0)", prep_s0_freed, run_alloc, NULL, WEFT_OK, 0},
    {"weft_free", prep_b0, run_free, NULL, WEFT_OK, 0},
    {"weft_free on another stream", prep_b0, run_free_other, NULL, WEFT_OK, 0},
    {"weft_free 8M (own chunk)", prep_big, run_free, NULL, WEFT_OK, 0},
    {"weft_free wrapped", prep_wrapped, run_free_wrapped, NULL, WEFT_OK, 0},
    {"weft_launch (tu_fill)", prep_b0_empty, run_fill, NULL, WEFT_OK, 0},
    {"weft_launch (tu_combine, cross)", prep_b0_b1, run_combine, NULL, WEFT_OK, 0},
    {"weft_launch reading a block of s0", prep_s0_block, run_combine_s0, NULL, WEFT_OK, 0},
    {"weft_free (block of s0)", prep_s0_block, run_free, NULL, WEFT_OK, 0},
    {"weft_free (block of s0) on s0", prep_s0_block, run_free_on_s0, NULL, WEFT_OK, 0},
    {"weft_block_synchronize (block of s0)", prep_s0_block, run_block_sync, NULL, WEFT_OK, 0},
    {"weft_block_export_event (block of s0)", prep_s0_block, run_export, NULL, WEFT_OK, 0},
    {"weft_use_begin/end", prep_b0, run_use, NULL, WEFT_OK, 0},
    {"weft_copy_to_block", prep_b0, run_copy_to, NULL, WEFT_OK, 0},
    {"weft_copy_from_block", prep_b0, run_copy_from, NULL, WEFT_OK, 0},
    {"weft_copy_block (cross)", prep_b0_b1, run_copy_block, NULL, WEFT_OK, 0},
    {"weft_memset8", prep_b0, run_memset8, NULL, WEFT_OK, 0},
    {"weft_memset32", prep_b0, run_memset32, NULL, WEFT_OK, 0},
    {"weft_host_func", prep_b0, run_host_func, NULL, WEFT_OK, 0},
    {"weft_write_value32", prep_wrapped, run_write32, NULL, WEFT_OK, 0},
    {"weft_write_value64", prep_wrapped, run_write64, NULL, WEFT_OK, 0},
    {"weft_wait_value32", prep_wrapped, run_wait32, NULL, WEFT_OK, 0},
    {"weft_wait_value64", prep_wrapped, run_wait64, NULL, WEFT_OK, 0},
    {"weft_stream_set_hot_block", prep_b0, run_hot_block, NULL, WEFT_OK, 0},
    {"weft_stream_synchronize", prep_b0, run_sync, NULL, WEFT_OK, 0},
    {"weft_stream_query", prep_b0, run_query, NULL, WEFT_ERR_NOT_READY, 0},
    {"weft_stream_synchronize(s0)", prep_s0_block, run_sync_s0, NULL, WEFT_OK, 0},
    {"weft_stream_query(s0)", prep_s0_block, run_query_s0, NULL, WEFT_ERR_NOT_READY, 0},
    {"weft_stream_is_capturing(other)", prep_none, run_is_capturing_on, check_not_capturing, WEFT_OK, 0},
    {"weft_stream_is_capturing(s0)", prep_none, run_is_capturing_s0, check_s0_answer, WEFT_OK, 0},
    {"weft_stream_priority", prep_none, run_priority, NULL, WEFT_OK, 0},
    {"weft_stream_id", prep_none, run_stream_id, NULL, WEFT_ERR_NOT_SUPPORTED, 0},
    {"weft_block_synchronize", prep_b0, run_block_sync, NULL, WEFT_OK, 0},
    {"weft_block_export_event", prep_b0, run_export, NULL, WEFT_OK, 0},
    {"weft_stream_import_event", prep_event, run_import_event, NULL, WEFT_OK, 0},
    {"weft_stream_import_stream", prep_y_work, run_import_stream, NULL, WEFT_OK, 0},
    {"weft_runtime_synchronize", prep_b0, run_rt_sync, NULL, WEFT_OK, 0},
    {"weft_runtime_synchronize (s0 seen)", prep_b0, run_rt_sync_seen, NULL, WEFT_OK, 0},
    {"weft_runtime_counters", prep_none, run_counters, NULL, WEFT_OK, 0},
    {"weft_runtime_print", prep_none, run_print, NULL, WEFT_OK, 0},
    RES_ROWS(direct),
    RES_ROWS(async),
    {"async_create initial_reserve", prep_none, run_async_create_reserve, NULL, WEFT_OK, 0},
    {"weft_async_get_attribute", prep_async_made, run_async_get, NULL, WEFT_OK, 0},
    {"weft_async_set_attribute", prep_async_made, run_async_set, NULL, WEFT_OK, 0},
    {"weft_async_export", prep_async_ipc, run_async_export, NULL, WEFT_OK, 0},
    {"weft_resource_conformance(async)", prep_async_made, run_res_conformance, NULL, WEFT_OK, 0},
    RES_ROWS(pool),
    RES_ROWS(budget),
    RES_ROWS(guard),
    RES_ROWS(logging),
    RES_ROWS(stats),
    {"weft_graph_instantiate", prep_graph, run_instantiate, NULL, WEFT_OK, 0},
    {"weft_exec_launch", prep_exec, run_exec_launch, NULL, WEFT_OK, 0},
    {"weft_exec_launch (summary block of s0)", prep_exec_s0, run_exec_launch, NULL, WEFT_OK, 0},
    {"weft_exec_launch on s0", prep_exec, run_exec_launch_s0, NULL, WEFT_OK, 0},
    {"weft_exec_destroy", prep_exec, run_exec_destroy, NULL, WEFT_OK, 0},
    {"weft_graph_destroy", prep_graph, run_graph_destroy, NULL, WEFT_OK, 0},
    {"weft_free (graph output)", prep_output, run_free_output, NULL, WEFT_OK, 0},
    {"weft_graph_pool_create", prep_none, run_gpool_create, NULL, WEFT_OK, 0},
    {"weft_graph_pool_destroy", prep_gpool, run_gpool_destroy, NULL, WEFT_OK, 0},
    {"weft_graph_pool_destroy (used)", prep_gpool_used, run_gpool_destroy, NULL, WEFT_OK, 0},
    {"weft_graph_memory_stats", prep_none, run_gmem_stats, NULL, WEFT_OK, 0},
    {"weft_graph_memory_trim", prep_none, run_gmem_trim, NULL, WEFT_OK, 0},
    {"weft_builder_create", prep_none, run_builder_create, NULL, WEFT_OK, 0},
    {"weft_builder_alloc", prep_builder, run_builder_alloc, NULL, WEFT_OK, 0},
    {"weft_builder_kernel", prep_builder_block, run_builder_kernel, NULL, WEFT_OK, 0},
    {"weft_builder_copy", prep_builder_two, run_builder_copy, NULL, WEFT_OK, 0},
    {"weft_builder_memset32", prep_builder_block, run_builder_memset, NULL, WEFT_OK, 0},
    {"weft_builder_host", prep_builder_block, run_builder_host, NULL, WEFT_OK, 0},
    {"weft_builder_empty", prep_builder_block, run_builder_empty, NULL, WEFT_OK, 0},
    {"weft_builder_free", prep_builder_filled, run_builder_free, NULL, WEFT_OK, 0},
    {"weft_builder_finish", prep_builder_filled, run_builder_finish, NULL, WEFT_OK, 0},
    {"weft_builder_destroy", prep_builder_filled, run_builder_destroy, NULL, WEFT_OK, 0},
    {"weft_capture_begin/end (other stream)", prep_none, run_capture_other, NULL, WEFT_OK, 0},
    {"weft_capture_begin/end (s0)", prep_none, run_capture_s0, NULL, WEFT_OK, 0},
};
#define NCALLS (sizeof calls / sizeof calls[0])

/* ---- state: what "changed nothing" compares ------------------------------------------------------- */

typedef struct snap {
  weft_counters_t k;
  weft_resource_stats_t top, res, up;
  int live[3];
  uint64_t device_bytes; /* simulator: device bytes allocated now (0 on a GPU) */
} snap_t;

/* Taken with this thread in RELAXED mode: reading weft's statistics must not disturb a capture. */
static void take(const cell_t *c, snap_t *s) {
  memset(s, 0, sizeof *s);
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  d->cuThreadExchangeStreamCaptureMode(&m);
  if (weft_runtime_counters(env.rt, &s->k) != WEFT_OK) memset(&s->k, 0xff, sizeof s->k);
  weft_resource_stats(weft_runtime_resource(env.rt), &s->top);
  weft_resource_stats(c->res, &s->res);
  weft_resource_stats(c->up, &s->up);
  for (int i = 0; i < 3; i++) {
    size_t n;
    s->live[i] = c->b[i].rec != NULL && weft_block_size(c->b[i], &n) == WEFT_OK;
  }
  if (env.sim != NULL) {
    weft_sim_stats_t st;
    env.sim->stats(&st);
    s->device_bytes = st.bytes_in_use;
  }
  d->cuThreadExchangeStreamCaptureMode(&m);
}

static const char *diff(const snap_t *a, const snap_t *b) {
  if (memcmp(&a->k, &b->k, sizeof a->k) != 0) return "runtime counters";
  if (memcmp(&a->top, &b->top, sizeof a->top) != 0) return "the runtime resource's statistics";
  if (memcmp(&a->res, &b->res, sizeof a->res) != 0) return "the resource's statistics";
  if (memcmp(&a->up, &b->up, sizeof a->up) != 0) return "the upstream's statistics";
  if (memcmp(a->live, b->live, sizeof a->live) != 0) return "a block's liveness";
  if (a->device_bytes != b->device_bytes) return "device memory in use (the simulator's count)";
  return NULL;
}

/* ---- the situations' captures ------------------------------------------------------------------- */

typedef struct capture_end {
  int ok;              /* ended, a graph, it instantiates */
  size_t nodes;
  char what[200];      /* how it ended */
} capture_end_t;

static void finish_graph(CUgraph g, capture_end_t *out) {
  CUgraphExec x = NULL;
  size_t n = 0;
  d->cuGraphGetNodes(g, NULL, &n);
  out->nodes = n;
  CUresult r = d->cuGraphInstantiateWithFlags(&x, g, 0);
  if (r != CUDA_SUCCESS) {
    snprintf(out->what, sizeof out->what, "ended, but cuGraphInstantiate: %s", weft_driver_error_name(r));
    return;
  }
  d->cuGraphExecDestroy(x);
  out->ok = 1;
  snprintf(out->what, sizeof out->what, "ended, %zu nodes, instantiates", n);
}

static void end_raw(CUstream s, capture_end_t *out) {
  CUgraph g = NULL;
  CUresult r = d->cuStreamEndCapture(s, &g);
  if (r != CUDA_SUCCESS || g == NULL) {
    snprintf(out->what, sizeof out->what, "cuStreamEndCapture: %s", weft_driver_error_name(r));
    if (g) d->cuGraphDestroy(g);
    return;
  }
  finish_graph(g, out);
  d->cuGraphDestroy(g);
}

static CUresult outside_work(CUstream s) { return d->cuMemsetD32Async(g_scratch, 1, 64, s); }

/* Situation e: the capture lives on a helper thread. */
typedef struct helper {
  pthread_t t;
  pthread_mutex_t m;
  pthread_cond_t cv;
  int phase; /* 1 begun (or failed), 2 main says end, 3 ended */
  CUstreamCaptureMode mode;
  CUresult begin;
  capture_end_t end;
} helper_t;

static void phase_set(helper_t *h, int p) {
  pthread_mutex_lock(&h->m);
  h->phase = p;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->m);
}
static void phase_wait(helper_t *h, int p) {
  pthread_mutex_lock(&h->m);
  while (h->phase < p) pthread_cond_wait(&h->cv, &h->m);
  pthread_mutex_unlock(&h->m);
}
static void *helper_main(void *arg) {
  helper_t *h = arg;
  d->cuCtxSetCurrent(g_ctx);
  h->begin = d->cuStreamBeginCapture(g_x, h->mode);
  if (h->begin == CUDA_SUCCESS) h->begin = outside_work(g_x);
  phase_set(h, 1);
  phase_wait(h, 2);
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  d->cuStreamIsCapturing(g_x, &cs);
  if (cs != CU_STREAM_CAPTURE_STATUS_NONE) end_raw(g_x, &h->end);
  else snprintf(h->end.what, sizeof h->end.what, "begin failed: %s", weft_driver_error_name(h->begin));
  phase_set(h, 3);
  return NULL;
}

typedef struct situation {
  helper_t h;
  capture_end_t end;
  char begin_err[200];
} situation_t;

static int begin_situation(cell_t *c, situation_t *s) {
  memset(s, 0, sizeof *s);
  CUresult r = CUDA_SUCCESS;
  switch (c->sit) {
    case SIT_A: return 0;
    case SIT_B: {
      weft_capture_options_t o = weft_capture_options_default();
      o.mode = weft_modes[c->mode];
      weft_status_t st = weft_capture_begin(S[0], &o);
      weft_block_t t;
      if (st == WEFT_OK) st = weft_alloc(env.rt, BYTES, S[0], "matrix.captured", &t);
      if (st == WEFT_OK) st = tu_fill(&env, S[0], t, N, 4);
      if (st == WEFT_OK) st = weft_free(t, S[0]);
      if (st != WEFT_OK) snprintf(s->begin_err, sizeof s->begin_err, "weft capture: %s: %s", weft_status_name(st), weft_last_error());
      return st == WEFT_OK ? 0 : -1;
    }
    case SIT_C:
      r = d->cuStreamBeginCapture(weft_stream_raw(S[0]), cu_modes[c->mode]);
      if (r == CUDA_SUCCESS) r = outside_work(weft_stream_raw(S[0]));
      break;
    case SIT_D:
      r = d->cuStreamBeginCapture(g_x, cu_modes[c->mode]);
      if (r == CUDA_SUCCESS) r = outside_work(g_x);
      break;
    case SIT_E:
      pthread_mutex_init(&s->h.m, NULL);
      pthread_cond_init(&s->h.cv, NULL);
      s->h.mode = cu_modes[c->mode];
      if (pthread_create(&s->h.t, NULL, helper_main, &s->h) != 0) return -1;
      phase_wait(&s->h, 1);
      r = s->h.begin;
      break;
  }
  if (r != CUDA_SUCCESS) snprintf(s->begin_err, sizeof s->begin_err, "outside capture: %s", weft_driver_error_name(r));
  return r == CUDA_SUCCESS ? 0 : -1;
}

static void end_situation(cell_t *c, situation_t *s) {
  switch (c->sit) {
    case SIT_A:
      s->end.ok = 1;
      snprintf(s->end.what, sizeof s->end.what, "no capture");
      return;
    case SIT_B: {
      weft_graph_t *g = NULL;
      weft_status_t st = weft_capture_end(S[0], &g);
      if (st != WEFT_OK || g == NULL) {
        snprintf(s->end.what, sizeof s->end.what, "weft_capture_end: %s (%s): %s", weft_status_name(st),
                 weft_driver_error_name(weft_last_driver_error()), weft_last_error());
        return;
      }
      finish_graph(weft_graph_raw(g), &s->end);
      if (weft_graph_destroy(g) != WEFT_OK) printf("matrix: weft_graph_destroy: %s\n", weft_last_error());
      return;
    }
    case SIT_C: end_raw(weft_stream_raw(S[0]), &s->end); return;
    case SIT_D: end_raw(g_x, &s->end); return;
    case SIT_E:
      phase_set(&s->h, 2);
      pthread_join(s->h.t, NULL);
      s->end = s->h.end;
      pthread_mutex_destroy(&s->h.m);
      pthread_cond_destroy(&s->h.cv);
      return;
  }
}

/* ---- cleanup: everything the cell made, whatever state it is in --------------------------------- */

static void cleanup(cell_t *c) {
  /* A capture this cell left open on a stream weft uses would break every later cell. */
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  for (int i = 0; i < 4; i++) {
    int cap = 0;
    if (weft_stream_is_capturing(S[i], &cap) == WEFT_OK && cap) {
      weft_graph_t *g = NULL;
      if (weft_capture_end(S[i], &g) == WEFT_OK) (void)weft_graph_destroy(g);
    }
    if (d->cuStreamIsCapturing(weft_stream_raw(S[i]), &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE) {
      CUgraph g = NULL;
      d->cuStreamEndCapture(weft_stream_raw(S[i]), &g);
      if (g) d->cuGraphDestroy(g);
      printf("matrix: cleanup ended a capture left open on pool stream %d\n", i);
    }
  }
  if (c->g2 != NULL) (void)weft_graph_destroy(c->g2);
  if (c->bld != NULL) weft_builder_destroy(c->bld);
  for (int i = 0; i < 3; i++)
    if (c->b[i].rec != NULL && weft_free(c->b[i], c->on) != WEFT_OK) printf("matrix: cleanup: weft_free: %s\n", weft_last_error());
  if (c->e != NULL) (void)weft_exec_destroy(c->e);
  if (c->g != NULL && weft_graph_destroy(c->g) != WEFT_OK) printf("matrix: cleanup: weft_graph_destroy: %s\n", weft_last_error());
  if (c->res != NULL && c->p != 0 && weft_resource_deallocate(c->res, c->p, c->p_bytes, c->on, "matrix.r") != WEFT_OK)
    printf("matrix: cleanup: weft_resource_deallocate: %s\n", weft_last_error());
  if (weft_runtime_synchronize(env.rt) != WEFT_OK) printf("matrix: cleanup: weft_runtime_synchronize: %s\n", weft_last_error());
  if (c->res != NULL) weft_resource_destroy(c->res);
  if (c->up != NULL) weft_resource_destroy(c->up);
  if (c->gp != NULL && weft_graph_pool_destroy(c->gp) != WEFT_OK) printf("matrix: cleanup: weft_graph_pool_destroy: %s\n", weft_last_error());
  if (c->ev != NULL) d->cuEventDestroy(c->ev);
  d->cuStreamSynchronize(g_y);
  if (c->wrapped != 0) d->cuMemFree(c->wrapped);
}

/* ---- one cell -------------------------------------------------------------------------------------- */

typedef struct outcome {
  char code[6];
  int failed;
  char detail[640];
} outcome_t;

static size_t g_control_nodes[NCOL];

static void set(outcome_t *o, const char *code, int failed) {
  snprintf(o->code, sizeof o->code, "%s", code);
  o->failed = failed;
}

/* The verdict on what the call did and how the capture ended (before the cleanup). */
static void judge(const call_t *k, const cell_t *c, int col, const situation_t *sit, int prepared, int begun,
                  weft_status_t st, CUresult derr, const char *err, const char *changed, const char *wrong,
                  outcome_t *o) {
  int call_ok = st == WEFT_OK || (k->also_ok != WEFT_OK && st == k->also_ok);
  if (!prepared || !begun) {
    set(o, "PREP", 1);
    snprintf(o->detail, sizeof o->detail, "%s", prepared ? sit->begin_err : "preparation failed");
    return;
  }
  int control = k == &calls[0];
  int broke = !sit->end.ok, must = unsafe_breaks(c->sit, c->mode);
  if (k->positive_control) set(o, broke == must ? (broke ? "inv" : "ok") : "CTL!", broke != must);
  else if (!sit->end.ok) set(o, "INV", 1);
  else if (call_ok && c->sit != SIT_A && !control && sit->end.nodes != g_control_nodes[col]) set(o, "LEAK", 1);
  else if (call_ok && wrong) set(o, "BAD", 1);
  else if (call_ok) set(o, "ok", 0);
  else if (st == WEFT_ERR_CAPTURE && c->sit != SIT_A && changed == NULL) set(o, "ref", 0);
  else if (st == WEFT_ERR_CAPTURE && c->sit != SIT_A) set(o, "CHG", 1);
  else set(o, "ERR", 1);
  size_t len = (size_t)snprintf(o->detail, sizeof o->detail, "call %s", weft_status_name(st));
#define ADD(...) \
  if (len < sizeof o->detail) len += (size_t)snprintf(o->detail + len, sizeof o->detail - len, __VA_ARGS__)
  if (derr != CUDA_SUCCESS) ADD(" (%s)", weft_driver_error_name(derr));
  ADD("; capture: %s", sit->end.what);
  if (o->code[0] == 'L') ADD(" (control: %zu)", g_control_nodes[col]);
  if (changed && st != WEFT_OK) ADD("; changed: %s", changed);
  if (wrong) ADD("; %s", wrong);
  if (err[0]) ADD("; weft_last_error: \"%s\"", err);
#undef ADD
}

/* Runs one cell. `report` (may be NULL) gets the verdict before the cleanup too, so that a crash
 * in the cleanup still leaves it. */
static void run_cell(const call_t *k, int col, outcome_t *o, void (*report)(const outcome_t *o)) {
  cell_t *c = calloc(1, sizeof *c);
  assert_non_null(c);
  c->sit = col_sit(col);
  c->mode = col_mode(col);
  c->on = S[1];
  c->on2 = S[2];
  memset(o, 0, sizeof *o);
  if (getenv("WEFT_MATRIX_TRACE")) {
    printf("matrix: cell %s [%c%c]\n", k->name, sit_letter[c->sit], col ? mode_letter[c->mode] : ' ');
    fflush(stdout);
  }
  situation_t sit;
  int prepared = k->prep(c) == 0;
  int begun = prepared && begin_situation(c, &sit) == 0;
  weft_status_t st = WEFT_OK;
  char err[300] = "";
  CUresult derr = CUDA_SUCCESS;
  const char *changed = NULL, *wrong = NULL;
  if (begun) {
    snap_t before, after;
    take(c, &before);
    st = k->run(c);
    snprintf(err, sizeof err, "%s", st == WEFT_OK ? "" : weft_last_error());
    derr = st == WEFT_OK ? CUDA_SUCCESS : weft_last_driver_error();
    take(c, &after);
    changed = diff(&before, &after);
    if (st == WEFT_OK && k->check) wrong = k->check(c);
  }
  if (prepared && (begun || c->sit == SIT_E)) end_situation(c, &sit);
  judge(k, c, col, &sit, prepared, begun, st, derr, err, changed, wrong, o);
  if (k == &calls[0] && !o->failed) g_control_nodes[col] = sit.end.nodes;
  if (report) report(o);
  cleanup(c);
  /* Afterwards the runtime must synchronise again, and the oracle must be silent. */
  weft_status_t rs = weft_runtime_synchronize(env.rt);
  char rs_err[200] = "";
  if (rs != WEFT_OK) snprintf(rs_err, sizeof rs_err, "%s", weft_last_error());
  uint64_t races = tu_races(&env);
  if (races != 0) {
    tu_print_races(&env);
    tu_reset_races(&env);
  }
  if (prepared && begun) {
    size_t len = strlen(o->detail);
    if (races != 0) {
      if (!o->failed) set(o, "RACE", 1);
      len += (size_t)snprintf(o->detail + len, sizeof o->detail - len, "; %llu races", (unsigned long long)races);
    }
    if (rs != WEFT_OK && len < sizeof o->detail) {
      if (!o->failed) set(o, "DIRT", 1);
      snprintf(o->detail + len, sizeof o->detail - len, "; afterwards weft_runtime_synchronize: %s", rs_err);
    }
  }
  free(c);
}

/* On the simulator each cell runs in a child process (fork): a cell that crashes or hangs weft
 * shows as CRSH / HANG instead of ending the run, and no cell inherits another's state. On a GPU
 * (a CUDA context does not survive fork) the cells run in this process, one after another. */
typedef struct msg {
  outcome_t o;
  size_t control;
  int final;
} msg_t;
static int g_report_fd = -1;
static int g_report_col;

static void send_msg(const outcome_t *o, int final) {
  msg_t m = {*o, g_control_nodes[g_report_col], final};
  if (write(g_report_fd, &m, sizeof m) != (ssize_t)sizeof m) _exit(3);
}
static void report_early(const outcome_t *o) { send_msg(o, 0); }

static void run_cell_isolated(const call_t *k, int col, outcome_t *o) {
  const char *nofork = getenv("WEFT_MATRIX_NOFORK");
#if defined(__SANITIZE_THREAD__)
  /* TSan's deadlock detector fails on fork here (jemalloc's prefork handler takes > 64 locks). */
  nofork = "1";
#endif
  if (env.sim == NULL || (nofork != NULL && nofork[0] == '1')) {
    run_cell(k, col, o, NULL);
    return;
  }
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fd[0]);
    /* cmocka catches these to fail the test; in the child they must end the process */
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
    alarm(30);
    g_report_fd = fd[1];
    g_report_col = col;
    run_cell(k, col, o, report_early);
    send_msg(o, 1);
    fflush(stdout);
    fflush(stderr);
    _exit(0);
  }
  close(fd[1]);
  msg_t m, last;
  int have = 0, final = 0;
  for (;;) {
    size_t got = 0;
    while (got < sizeof m) {
      ssize_t r = read(fd[0], (char *)&m + got, sizeof m - got);
      if (r <= 0) break;
      got += (size_t)r;
    }
    if (got < sizeof m) break;
    last = m;
    have = 1;
    final = m.final;
  }
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (have && !strcmp(k->name, calls[0].name)) g_control_nodes[col] = last.control;
  if (have && final) {
    *o = last.o;
    return;
  }
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  char why[120];
  snprintf(why, sizeof why, "the cell's process %s %d%s (alone: WEFT_MATRIX_ONLY='%s' WEFT_MATRIX_NOFORK=1)",
           sig ? "died of signal" : "exited with", sig ? sig : WEXITSTATUS(status), have ? " in the cleanup" : "",
           k->name);
  if (have && last.o.failed) { /* the verdict stands; say what happened next */
    *o = last.o;
    size_t len = strlen(o->detail);
    snprintf(o->detail + len, sizeof o->detail - len, "; then %s", why);
    return;
  }
  memset(o, 0, sizeof *o);
  set(o, sig == SIGALRM ? "HANG" : "CRSH", 1);
  size_t len = (size_t)snprintf(o->detail, sizeof o->detail, "%s", why);
  if (have && len + 16 < sizeof o->detail)
    snprintf(o->detail + len, sizeof o->detail - len, "; before it: %.*s", (int)(sizeof o->detail - len - 16), last.o.detail);
}

/* ---- the test ----------------------------------------------------------------------------------------- */

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  if (tu_init(&env, &o) != 0) return -1;
  if (weft__driver_get(&d) != WEFT_OK) return -1;
  for (unsigned i = 0; i < 4; i++)
    if (weft_stream_get(env.rt, i, &S[i]) != WEFT_OK) return -1;
  if (d->cuCtxGetCurrent(&g_ctx) != CUDA_SUCCESS || g_ctx == NULL) return -1;
  if (d->cuStreamCreateWithPriority(&g_x, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
      d->cuStreamCreateWithPriority(&g_y, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
      d->cuMemAlloc(&g_scratch, BYTES) != CUDA_SUCCESS)
    return -1;
  g_devnull = fopen("/dev/null", "w");
  return g_devnull ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  if (d == NULL || g_devnull == NULL) return 0;
  d->cuStreamSynchronize(g_x);
  d->cuStreamSynchronize(g_y);
  d->cuMemFree(g_scratch);
  d->cuStreamDestroy(g_x);
  d->cuStreamDestroy(g_y);
  fclose(g_devnull);
  tu_fini(&env);
  return 0;
}

/* Whether `name` contains one of the ';'-separated parts of `list`. */
static int skipped(const char *list, const char *name) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *part = strtok_r(buf, ";", &save); part != NULL; part = strtok_r(NULL, ";", &save))
    if (part[0] != '\0' && strstr(name, part) != NULL) return 1;
  return 0;
}

static void test_capture_matrix(void **state) {
  (void)state;
  const char *only = getenv("WEFT_MATRIX_ONLY");
  const char *verbose = getenv("WEFT_MATRIX_VERBOSE");
  const char *skip = getenv("WEFT_MATRIX_SKIP");
  static outcome_t out[NCALLS][NCOL];
  int ran[NCALLS] = {0};
  unsigned failures = 0, cells = 0;
  for (size_t i = 0; i < NCALLS; i++) {
    if (i != 0 && only != NULL && strstr(calls[i].name, only) == NULL) continue;
    if (i != 0 && skip != NULL && skipped(skip, calls[i].name)) {
      printf("matrix: skipped (WEFT_MATRIX_SKIP): %s\n", calls[i].name);
      continue;
    }
    ran[i] = 1;
    for (int col = 0; col < NCOL; col++) {
      run_cell_isolated(&calls[i], col, &out[i][col]);
      cells++;
      failures += out[i][col].failed;
    }
  }
  printf("\ncapture-legality matrix: %u cells, %u failing (%s)\n", cells, failures,
         env.sim ? "simulator" : "GPU");
  for (int s = 0; s < NSIT; s++) printf("  %c: %s\n", sit_letter[s], sit_words[s]);
  printf("  modes: G GLOBAL, T THREAD_LOCAL, R RELAXED\n\n%-38s", "call");
  for (int col = 0; col < NCOL; col++) {
    char h[4];
    if (col == 0) snprintf(h, sizeof h, "a");
    else snprintf(h, sizeof h, "%c%c", sit_letter[col_sit(col)], mode_letter[col_mode(col)]);
    printf(" %-4s", h);
  }
  printf("\n");
  for (size_t i = 0; i < NCALLS; i++) {
    if (!ran[i]) continue;
    printf("%-38.38s", calls[i].name);
    for (int col = 0; col < NCOL; col++) printf(" %-4s", out[i][col].code);
    printf("\n");
  }
  printf("\n");
  for (size_t i = 0; i < NCALLS; i++) {
    if (!ran[i]) continue;
    for (int col = 0; col < NCOL; col++) {
      const outcome_t *o = &out[i][col];
      if (!o->failed && verbose == NULL) continue;
      printf("%s %s [%c%s%s]: %s\n", o->failed ? "FAIL" : "pass", calls[i].name, sit_letter[col_sit(col)],
             col == 0 ? "" : " ", col == 0 ? "" : mode_words[col_mode(col)], o->detail);
    }
  }
  if (failures != 0) fail_msg("%u of %u cells break the capture-legality rule (table above)", failures, cells);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_capture_matrix)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
