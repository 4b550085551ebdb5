/* The fault sweep (issue 12): every driver entry point weft calls x its first 20 calls, on the
 * pool, async, direct and guard stacks, must give 0 crashes, 0 leaks and 0 swallowed failures.
 *
 * A fixed workload W (workload() below) drives one runtime end to end: allocations on several
 * streams, kernels with cross-stream waits, memset and copies, frees on other streams, copies to
 * the host, stream/block/runtime synchronisation, a capture with a join and allocations inside,
 * instantiate, two launches with the output freed in between, a graph-pool capture, a builder
 * graph, trims and weft_runtime_release. W checks every status: a failed step skips what depends
 * on it, cleanup steps (frees, destroys, trims) are retried once (weft.h: on failure nothing
 * changed, so the caller still owns the object), and W always ends with weft_runtime_release.
 *
 * For each stack and each entry point of WEFT_DRIVER_FUNCS, for N = 1, 2, ... W runs in a fresh
 * forked child with the Nth call of that entry point failing (CUDA_ERROR_OUT_OF_MEMORY for
 * allocations, CUDA_ERROR_UNKNOWN otherwise), until the Nth call is not reached (the simulator
 * and W are deterministic, so a run with the fault at N repeats the unfaulted run up to call N)
 * or N = 20. The child sends a verdict through a pipe; a cell FAILS on
 *   - a crash (signal; SIGALRM: a hang) or a sanitizer report (the child's exit status: ASan
 *     and UBSan exit 1, LeakSanitizer exits 23 at the child's exit),
 *   - device bytes in use after release != before (the simulator's stats),
 *   - weft metadata records live after release != before (weft keeps its records in a private
 *     jemalloc arena that LeakSanitizer cannot see; lib/core/meta.h counts them),
 *   - driver objects (contexts, streams, events, graphs, execs, pools) created != destroyed
 *     (counted by wrapping those entries of weft's driver table in this process), except the one
 *     object whose destroy failed in the last weft_runtime_release, which then returned DRIVER
 *     (weft.h: the runtime is released all the same and that object is left to the driver),
 *   - a race reported by the simulator's oracle, or wrong data in a step that reported success,
 *   - weft_runtime_release returning BUSY (a capture left active),
 *   - a swallowed failure: the fault fired inside a teardown call (weft_runtime_release, a
 *     *_destroy) that returned WEFT_OK, and no later call reported an error.
 * A fault that fired in any other call that returned WEFT_OK, with no error anywhere after and
 * every check passing, is 'absorbed': listed separately for a human to judge.
 *
 * Environment: WEFT_FAULT_SWEEP_MAX_N (20), WEFT_FAULT_SWEEP_JOBS (2 children at a time),
 * WEFT_FAULT_SWEEP_STACKS (e.g. "pool,guard"), WEFT_FAULT_SWEEP_FUNCS (e.g.
 * "cuEventRecord,cuMemFree"), WEFT_FAULT_SWEEP_CACHE_BYTES (options.stream_cache_bytes; small
 * bounds make W's frees give the streams' cached blocks back and move room between them);
 * WEFT_FAULT_SWEEP_CELL=stack:entry:N runs one cell with W's calls traced and the child's output
 * on stderr (the reproducer of a reported cell).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/core/meta.h"
#include "tests/kernels/test_kernels.h"
#include "tests/kernels/test_kernels_sim.h"
#include "tests/util/testutil.h"

#define NE 256 /* elements per block */
#define BYTES (NE * 4)
#define MAX_N 20
#define NSTREAMS 5

/* ------------------------------------------------------------------------------------------ */
/* Entry points, stacks                                                                        */
/* ------------------------------------------------------------------------------------------ */

static const char *const g_funcs[] = {
#define FS_NAME(name, required) #name,
    WEFT_DRIVER_FUNCS(FS_NAME)
#undef FS_NAME
};
#define NFUNCS (sizeof g_funcs / sizeof *g_funcs)

typedef struct fs_stack {
  const char *name;
  unsigned memory, guard;
} fs_stack_t;
static const fs_stack_t g_stacks[] = {
    {"pool", WEFT_MEMORY_POOL, 0},
    {"async", WEFT_MEMORY_ASYNC, 0},
    {"direct", WEFT_MEMORY_DIRECT, 0},
    {"guard", WEFT_MEMORY_POOL, 1},
};

/* The CUresult a failing call of `fn` returns. */
static const char *fault_code(const char *fn) {
  return strstr(fn, "Alloc") != NULL || strcmp(fn, "cuMemPoolCreate") == 0 ? "CUDA_ERROR_OUT_OF_MEMORY"
                                                                            : "CUDA_ERROR_UNKNOWN";
}

/* ------------------------------------------------------------------------------------------ */
/* Driver objects: weft's table entries that create and destroy them, wrapped to count         */
/* ------------------------------------------------------------------------------------------ */

typedef struct fs_handles {
  long ctx, streams, events, graphs, execs, pools;
} fs_handles_t;
static fs_handles_t g_live;

static __typeof__(cuDevicePrimaryCtxRetain) *real_ctx_retain;
static __typeof__(cuDevicePrimaryCtxRelease) *real_ctx_release;
static __typeof__(cuStreamCreateWithPriority) *real_stream_create;
static __typeof__(cuStreamDestroy) *real_stream_destroy;
static __typeof__(cuEventCreate) *real_event_create;
static __typeof__(cuEventDestroy) *real_event_destroy;
static __typeof__(cuGraphCreate) *real_graph_create;
static __typeof__(cuStreamEndCapture) *real_end_capture;
static __typeof__(cuGraphDestroy) *real_graph_destroy;
static __typeof__(cuGraphInstantiateWithFlags) *real_instantiate;
static __typeof__(cuGraphExecDestroy) *real_exec_destroy;
static __typeof__(cuMemPoolCreate) *real_pool_create;
static __typeof__(cuMemPoolDestroy) *real_pool_destroy;

static CUresult counted(CUresult r, long *field, long d) {
  if (r == CUDA_SUCCESS) *field += d;
  return r;
}
#define COUNTED(r, field, d) counted((r), &g_live.field, (d))
static CUresult CUDAAPI w_ctx_retain(CUcontext *c, CUdevice d) { return COUNTED(real_ctx_retain(c, d), ctx, 1); }
static CUresult CUDAAPI w_ctx_release(CUdevice d) { return COUNTED(real_ctx_release(d), ctx, -1); }
static CUresult CUDAAPI w_stream_create(CUstream *s, unsigned f, int p) { return COUNTED(real_stream_create(s, f, p), streams, 1); }
static CUresult CUDAAPI w_stream_destroy(CUstream s) { return COUNTED(real_stream_destroy(s), streams, -1); }
static CUresult CUDAAPI w_event_create(CUevent *e, unsigned f) { return COUNTED(real_event_create(e, f), events, 1); }
static CUresult CUDAAPI w_event_destroy(CUevent e) { return COUNTED(real_event_destroy(e), events, -1); }
static CUresult CUDAAPI w_graph_create(CUgraph *g, unsigned f) { return COUNTED(real_graph_create(g, f), graphs, 1); }
static CUresult CUDAAPI w_end_capture(CUstream s, CUgraph *g) {
  CUresult r = real_end_capture(s, g);
  if (r == CUDA_SUCCESS && g != NULL && *g != NULL) g_live.graphs++;
  return r;
}
static CUresult CUDAAPI w_graph_destroy(CUgraph g) { return COUNTED(real_graph_destroy(g), graphs, -1); }
static CUresult CUDAAPI w_instantiate(CUgraphExec *x, CUgraph g, unsigned long long f) {
  return COUNTED(real_instantiate(x, g, f), execs, 1);
}
static CUresult CUDAAPI w_exec_destroy(CUgraphExec x) { return COUNTED(real_exec_destroy(x), execs, -1); }
static CUresult CUDAAPI w_pool_create(CUmemoryPool *p, const CUmemPoolProps *pp) { return COUNTED(real_pool_create(p, pp), pools, 1); }
static CUresult CUDAAPI w_pool_destroy(CUmemoryPool p) { return COUNTED(real_pool_destroy(p), pools, -1); }

/* The table is static storage (lib/core/driver.c), filled once; no runtime exists yet. */
static void wrap_driver_table(const weft__driver_t *drv) {
  weft__driver_t *d = (weft__driver_t *)drv;
#define WRAP(member, real, wrapper) \
  do {                              \
    real = d->member;               \
    d->member = wrapper;            \
  } while (0)
  WRAP(cuDevicePrimaryCtxRetain, real_ctx_retain, w_ctx_retain);
  WRAP(cuDevicePrimaryCtxRelease, real_ctx_release, w_ctx_release);
  WRAP(cuStreamCreateWithPriority, real_stream_create, w_stream_create);
  WRAP(cuStreamDestroy, real_stream_destroy, w_stream_destroy);
  WRAP(cuEventCreate, real_event_create, w_event_create);
  WRAP(cuEventDestroy, real_event_destroy, w_event_destroy);
  WRAP(cuGraphCreate, real_graph_create, w_graph_create);
  WRAP(cuStreamEndCapture, real_end_capture, w_end_capture);
  WRAP(cuGraphDestroy, real_graph_destroy, w_graph_destroy);
  WRAP(cuGraphInstantiateWithFlags, real_instantiate, w_instantiate);
  WRAP(cuGraphExecDestroy, real_exec_destroy, w_exec_destroy);
  WRAP(cuMemPoolCreate, real_pool_create, w_pool_create);
  WRAP(cuMemPoolDestroy, real_pool_destroy, w_pool_destroy);
#undef WRAP
}

/* ------------------------------------------------------------------------------------------ */
/* The verdict of one run of W, and W's call log                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct fs_verdict {
  int completed;          /* W returned and the checks after it ran */
  int fired;              /* the injected fault fired */
  char fired_in[48];      /* the (innermost) weft call it fired in; "" if outside every call */
  int fired_status;       /* what that call returned */
  int fired_seq;          /* the index of that call among W's calls */
  int errors;             /* weft calls of W that returned an error */
  int errors_after;       /* of those, the ones at or after the call the fault fired in */
  char first_err[48];     /* the first of those (at or after the fault) */
  int first_err_status;
  char first_err_msg[160];
  int got_runtime;        /* weft_runtime_get succeeded */
  int release_status;
  int64_t dev_delta, meta_delta;
  fs_handles_t handles;   /* created - destroyed during W */
  uint64_t races;
  int checks_run, checks_bad;
  char bad_msg[120];
  int calls;              /* weft calls W made */
  char current[48];       /* the weft call running (a crash happened in it if W did not complete) */
  int mode_before, mode_after; /* the thread's stream capture mode around W */
} fs_verdict_t;

static tu_env_t env;
static const weft__driver_t *drv;
static fs_verdict_t *V;           /* the verdict W fills */
static fs_verdict_t g_scratch;    /* for W run in this process (warm-up) */
static bool g_trace;
static int g_depth, g_seq;
static uint64_t g_before[16];
static const char *g_names[16];

static uint64_t faults_now(void) {
  weft_sim_stats_t s;
  env.sim->stats(&s);
  return s.faults_injected;
}

static void fs_pre(const char *name) {
  snprintf(V->current, sizeof V->current, "%s", name);
  g_names[g_depth] = name;
  g_before[g_depth++] = faults_now();
}

static weft_status_t fs_post(const char *name, weft_status_t st) {
  int d = --g_depth, seq = g_seq++;
  snprintf(V->current, sizeof V->current, "%s", d > 0 ? g_names[d - 1] : "");
  bool fired_here = V->fired_in[0] == '\0' && faults_now() > g_before[d];
  if (fired_here) {
    snprintf(V->fired_in, sizeof V->fired_in, "%s", name);
    V->fired_status = st;
    V->fired_seq = seq;
  }
  if (st != WEFT_OK) {
    V->errors++;
    if (V->fired_in[0] != '\0') {
      if (V->errors_after++ == 0) {
        snprintf(V->first_err, sizeof V->first_err, "%s", name);
        V->first_err_status = st;
        snprintf(V->first_err_msg, sizeof V->first_err_msg, "%s", weft_last_error());
      }
    }
  }
  if (g_trace) {
    weft__meta_stats_t m;
    weft__meta_stats(&m);
    fprintf(stderr, "  [%3d] records %4lld %*s%-28s %s%s%s\n", seq, (long long)m.live, 2 * d, "", name,
            weft_status_name(st), st != WEFT_OK ? ": " : "", st != WEFT_OK ? weft_last_error() : "");
  }
  if (g_trace && fired_here) fprintf(stderr, "  ^^^^^ the injected fault fired in this call\n");
  return st;
}

/* A weft call of W: its status is logged, and the call the fault fires in is noted. */
#define CALL(name, expr) (fs_pre(name), fs_post((name), (expr)))
#define CALLV(name, stmt) (fs_pre(name), (stmt), fs_post((name), WEFT_OK))
/* A call for which WEFT_ERR_NOT_READY is an answer, not an error. */
#define CALLQ(name, expr) (fs_pre(name), fs_post((name), not_ready_ok(expr)))
static weft_status_t not_ready_ok(weft_status_t st) { return st == WEFT_ERR_NOT_READY ? WEFT_OK : st; }
#define OK(x) ((x) == WEFT_OK)
/* Cleanup: retried once (on failure nothing changed, so the object is still the caller's). */
#define CLEANUP(name, expr)                                            \
  do {                                                                 \
    if (CALL(name, expr) != WEFT_OK) (void)CALL(name " (retry)", expr); \
  } while (0)

static const char *const g_teardown[] = {"weft_runtime_release", "weft_graph_destroy", "weft_exec_destroy",
                                         "weft_graph_pool_destroy", "weft_builder_destroy"};
static bool is_teardown(const char *call) {
  for (size_t i = 0; i < sizeof g_teardown / sizeof *g_teardown; i++)
    if (strncmp(call, g_teardown[i], strlen(g_teardown[i])) == 0) return true;
  return false;
}

static void check(const char *what, const unsigned *host, unsigned want) {
  V->checks_run++;
  for (unsigned i = 0; i < NE; i++)
    if (host[i] != want) {
      if (V->checks_bad++ == 0)
        snprintf(V->bad_msg, sizeof V->bad_msg, "%s[%u] = %u, expected %u", what, i, host[i], want);
      return;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The workload W                                                                              */
/* ------------------------------------------------------------------------------------------ */

static weft_stream_t *S[NSTREAMS];
static const weft_block_t none = {0};
static unsigned h_c[NE], h_b[NE], h_d[NE], h_o[NE], h_11[NE];

static void CUDA_CB host_noop(void *user) { (void)user; }

static bool alloc_(weft_runtime_t *rt, weft_stream_t *s, const char *tag, weft_block_t *b) {
  return OK(CALL("weft_alloc", weft_alloc(rt, BYTES, s, tag, b)));
}
/* Frees a live block (retrying once); *live stays true if both attempts fail (release frees it). */
static bool free_(weft_block_t b, weft_stream_t *s, bool *live) {
  if (!*live) return true;
  if (!OK(CALL("weft_free", weft_free(b, s))) && !OK(CALL("weft_free (retry)", weft_free(b, s)))) return false;
  *live = false;
  return true;
}
static weft_status_t combine(weft_stream_t *s, weft_block_t out, weft_block_t in0, weft_block_t in1, unsigned salt) {
  return CALL("weft_launch (combine)", tu_combine(&env, s, out, none, in0, in1, none, NE, salt));
}
static weft_status_t fill(weft_stream_t *s, weft_block_t b, unsigned value) {
  return CALL("weft_launch (fill)", tu_fill(&env, s, b, NE, value));
}
static weft_status_t read_(weft_stream_t *s, unsigned *host, weft_block_t b) {
  return CALL("weft_copy_from_block", weft_copy_from_block(s, host, b, 0, BYTES));
}

/* Values: c = 1 + 7*3 + 13*5 = 87; b = 2 + 7*11 + 13*9 = 196; d = 9. */
#define C_VAL 87u
/* Capture: t = 3 + 7c; out = 4 + 7t + 13c. */
#define CAP_VAL (4u + 7u * (3u + 7u * C_VAL) + 13u * C_VAL)
/* Graph-pool capture: tmp = 5 + 7c; out = 6 + 7 tmp. */
#define POOL_VAL (6u + 7u * (5u + 7u * C_VAL))
/* Builder: x = 2, then x = 7 + 7x + 13c, copied to d. */
#define BUILDER_VAL (7u + 7u * 2u + 13u * C_VAL)

static void capture_phase(weft_runtime_t *rt, weft_block_t c) {
  if (!OK(CALL("weft_capture_begin", weft_capture_begin(S[0], NULL)))) return;
  weft_block_t t, out;
  bool in = OK(CALL("weft_capture_join", weft_capture_join(S[0], S[1])));
  int capturing = 0;
  in = in && OK(CALL("weft_stream_is_capturing", weft_stream_is_capturing(S[1], &capturing)));
  if (in && capturing != 1) {
    V->checks_bad++;
    snprintf(V->bad_msg, sizeof V->bad_msg, "weft_stream_is_capturing: a joined stream says %d", capturing);
  }
  bool vt = in && alloc_(rt, S[1], "t", &t) && OK(combine(S[1], t, c, none, 3));
  bool vo = vt && alloc_(rt, S[0], "out", &out) && OK(combine(S[0], out, t, c, 4));
  bool complete = vo && OK(CALL("weft_free", weft_free(t, S[0])));
  weft_graph_t *g = NULL;
  if (!OK(CALL("weft_capture_end", weft_capture_end(S[0], &g)))) return;
  if (complete) {
    weft_exec_t *e = NULL;
    if (OK(CALL("weft_graph_instantiate", weft_graph_instantiate(g, S[0], &e)))) {
      weft_block_t o, o2;
      if (OK(CALL("weft_exec_launch", weft_exec_launch(e, S[1]))) && OK(CALL("weft_exec_output", weft_exec_output(e, 0, &o)))) {
        bool r = OK(read_(S[2], h_o, o)) && OK(CALL("weft_block_synchronize", weft_block_synchronize(o)));
        if (r) check("capture output", h_o, CAP_VAL);
        bool live = true;
        if (free_(o, S[3], &live) && OK(CALL("weft_exec_launch", weft_exec_launch(e, S[2]))) &&
            OK(CALL("weft_exec_output", weft_exec_output(e, 0, &o2)))) {
          live = true;
          free_(o2, S[4], &live);
        }
      }
      CLEANUP("weft_exec_destroy", weft_exec_destroy(e));
    }
  }
  CLEANUP("weft_graph_destroy", weft_graph_destroy(g));
}

typedef struct pool_ctx {
  weft_runtime_t *rt;
  weft_block_t c;
} pool_ctx_t;

static weft_status_t pool_body(weft_stream_t *s, void *user) {
  pool_ctx_t *pc = user;
  weft_block_t tmp, out;
  weft_status_t r;
  if ((r = CALL("weft_capture_join", weft_capture_join(s, S[1]))) != WEFT_OK) return r;
  if ((r = CALL("weft_alloc", weft_alloc(pc->rt, BYTES, S[1], "ptmp", &tmp))) != WEFT_OK) return r;
  if ((r = combine(S[1], tmp, pc->c, none, 5)) != WEFT_OK) return r;
  if ((r = CALL("weft_alloc", weft_alloc(pc->rt, BYTES, s, "pout", &out))) != WEFT_OK) return r;
  if ((r = combine(s, out, tmp, none, 6)) != WEFT_OK) return r;
  return CALL("weft_free", weft_free(tmp, s));
}

static void pool_phase(weft_runtime_t *rt, weft_block_t c) {
  weft_graph_pool_t *gp = NULL;
  if (!OK(CALL("weft_graph_pool_create", weft_graph_pool_create(rt, &gp)))) return;
  weft_capture_options_t co = weft_capture_options_default();
  co.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  co.pool = gp;
  pool_ctx_t pc = {rt, c};
  weft_graph_t *g = NULL;
  if (OK(CALL("weft_capture_run", weft_capture_run(S[0], &co, pool_body, &pc, &g)))) {
    weft_exec_t *e = NULL;
    if (OK(CALL("weft_graph_instantiate", weft_graph_instantiate(g, S[3], &e)))) {
      weft_block_t o;
      if (OK(CALL("weft_exec_launch", weft_exec_launch(e, S[3]))) && OK(CALL("weft_exec_output", weft_exec_output(e, 0, &o)))) {
        bool r = OK(read_(S[4], h_o, o));
        bool sy = OK(CALL("weft_stream_synchronize", weft_stream_synchronize(S[4])));
        if (r && sy) check("graph-pool output", h_o, POOL_VAL);
        bool live = true;
        free_(o, S[2], &live);
      }
      CLEANUP("weft_exec_destroy", weft_exec_destroy(e));
    }
    CLEANUP("weft_graph_destroy", weft_graph_destroy(g));
  }
  CLEANUP("weft_graph_pool_destroy", weft_graph_pool_destroy(gp));
}

static void builder_phase(weft_runtime_t *rt, weft_block_t c, weft_block_t d) {
  weft_builder_t *bd = NULL;
  if (!OK(CALL("weft_builder_create", weft_builder_create(rt, &bd)))) return;
  weft_block_t x;
  static CUdeviceptr args[5];
  static unsigned n = NE, salt = 7, spin = 0;
  static void *params[8];
  bool ok = OK(CALL("weft_builder_alloc", weft_builder_alloc(bd, BYTES, "x", &x))) &&
            OK(CALL("weft_builder_memset32", weft_builder_memset32(bd, x, 0, 2, BYTES, NULL))) &&
            OK(CALL("weft_block_ptr", weft_block_ptr(x, &args[0]))) && OK(CALL("weft_block_ptr", weft_block_ptr(c, &args[3])));
  if (ok) {
    args[1] = 0;
    args[2] = args[0];
    args[4] = 0;
    for (int i = 0; i < 5; i++) params[i] = &args[i];
    params[5] = &n;
    params[6] = &salt;
    params[7] = &spin;
    weft_launch_t l = {.func = env.combine, .grid = {1}, .block = {256}, .params = params};
    weft_access_t acc[2] = {{x, WEFT_READ_WRITE}, {c, WEFT_READ}};
    ok = OK(CALL("weft_builder_kernel", weft_builder_kernel(bd, &l, acc, 2, NULL)));
  }
  ok = ok && OK(CALL("weft_builder_copy", weft_builder_copy(bd, d, 0, x, 0, BYTES, NULL))) &&
       OK(CALL("weft_builder_free", weft_builder_free(bd, x)));
  if (!ok) {
    CALLV("weft_builder_destroy", weft_builder_destroy(bd));
    return;
  }
  weft_graph_t *g = NULL;
  if (!OK(CALL("weft_builder_finish", weft_builder_finish(bd, &g)))) return; /* consumed */
  weft_exec_t *e = NULL;
  if (OK(CALL("weft_graph_instantiate", weft_graph_instantiate(g, S[0], &e)))) {
    if (OK(CALL("weft_exec_launch", weft_exec_launch(e, S[4])))) {
      bool sy = OK(CALL("weft_block_synchronize", weft_block_synchronize(d)));
      bool r = OK(read_(S[1], h_d, d));
      bool sy2 = OK(CALL("weft_stream_synchronize", weft_stream_synchronize(S[1])));
      if (sy && r && sy2) check("builder output", h_d, BUILDER_VAL);
    }
    CLEANUP("weft_exec_destroy", weft_exec_destroy(e));
  }
  CLEANUP("weft_graph_destroy", weft_graph_destroy(g));
}

static void phases(weft_runtime_t *rt) {
  weft_block_t a, b, c, d;
  bool la = alloc_(rt, S[0], "a", &a), lb = alloc_(rt, S[1], "b", &b);
  bool lc = alloc_(rt, S[2], "c", &c), ld = alloc_(rt, S[3], "d", &d);
  /* Kernels on three streams: c waits for a (s0) and b (s1). */
  bool va = la && OK(fill(S[0], a, 3));
  bool vb = lb && OK(fill(S[1], b, 5));
  bool vc = lc && va && vb && OK(combine(S[2], c, a, b, 1));
  if (vc) (void)CALLQ("weft_stream_query", weft_stream_query(S[2]));
  weft_access_t rc = {c, WEFT_READ};
  if (vc) vc = OK(CALL("weft_host_func", weft_host_func(S[3], host_noop, NULL, &rc, 1)));
  /* Writes after reads on other streams: a memset, a host copy, a device copy, a kernel. */
  vb = vb && OK(CALL("weft_memset32", weft_memset32(S[3], b, 0, 9, BYTES)));
  for (unsigned i = 0; i < NE; i++) h_11[i] = 11;
  va = la && OK(CALL("weft_copy_to_block", weft_copy_to_block(S[4], a, 0, h_11, BYTES)));
  bool vd = ld && vb && OK(CALL("weft_copy_block", weft_copy_block(S[0], d, 0, b, 0, BYTES)));
  vb = va && vb && OK(combine(S[1], b, a, b, 2));
  /* Copies to the host, and the three synchronisations. */
  bool r = vc && OK(read_(S[3], h_c, c));
  if (r && OK(CALL("weft_block_synchronize", weft_block_synchronize(c)))) check("c", h_c, C_VAL);
  r = vb && OK(read_(S[4], h_b, b));
  bool sy = OK(CALL("weft_stream_synchronize", weft_stream_synchronize(S[4])));
  if (r && sy) check("b", h_b, 2u + 7u * 11u + 13u * 9u);
  r = vd && OK(read_(S[2], h_d, d));
  sy = OK(CALL("weft_runtime_synchronize", weft_runtime_synchronize(rt)));
  if (r && sy) check("d", h_d, 9);
  /* Frees on streams other than the last users'. */
  free_(a, S[3], &la);
  free_(b, S[0], &lb);
  if (vc) capture_phase(rt, c);
  if (vc) pool_phase(rt, c);
  if (vc && ld) builder_phase(rt, c, d);
  free_(c, S[1], &lc);
  free_(d, S[2], &ld);
  CLEANUP("weft_runtime_trim", weft_runtime_trim(rt));
  CLEANUP("weft_graph_memory_trim", weft_graph_memory_trim(rt));
}

static uint64_t g_cache_bytes = UINT64_MAX; /* WEFT_FAULT_SWEEP_CACHE_BYTES; UINT64_MAX: the default */

static void workload(const fs_stack_t *stk) {
  weft_options_t o = weft_options_default();
  if (g_cache_bytes != UINT64_MAX) o.stream_cache_bytes = g_cache_bytes;
  o.memory = stk->memory;
  o.guard = stk->guard;
  weft_runtime_t *rt = NULL;
  V->release_status = WEFT_OK;
  if (!OK(CALL("weft_runtime_get", weft_runtime_get(0, &o, &rt)))) return;
  V->got_runtime = 1;
  env.rt = rt;
  bool streams = true;
  for (unsigned i = 0; i < NSTREAMS; i++) streams = OK(CALL("weft_stream_get", weft_stream_get(rt, i, &S[i]))) && streams;
  if (streams) phases(rt);
  weft_status_t st = CALL("weft_runtime_release", weft_runtime_release(rt));
  if (st == WEFT_ERR_BUSY) st = CALL("weft_runtime_release (retry)", weft_runtime_release(rt));
  V->release_status = st;
  env.rt = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* One run in a forked child                                                                   */
/* ------------------------------------------------------------------------------------------ */

static const char *g_tmpdir;

/* The handlers of the crash signals before cmocka replaced them (ASan's): children restore them,
 * so that a crash in a child is reported by ASan and kills it, instead of cmocka's handler
 * jumping back into the test runner in the child. */
static const int g_crash_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS};
static struct sigaction g_crash_handlers[sizeof g_crash_signals / sizeof *g_crash_signals];

/* Runs W with `spec` armed (NULL: no fault) and fills *v; in the child process. */
/* The calling thread's stream capture mode (asked by exchanging it twice). */
static int thread_capture_mode(void) {
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;
  if (drv->cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS) return -1;
  CUstreamCaptureMode back = m;
  drv->cuThreadExchangeStreamCaptureMode(&back);
  return (int)m;
}

static void run_w(const fs_stack_t *stk, const char *spec, fs_verdict_t *v) {
  memset(v, 0, sizeof *v);
  V = v;
  g_depth = g_seq = 0;
  drv->cuCtxSetCurrent(NULL); /* as a fresh thread: weft binds its context (swept too) */
  weft_sim_stats_t s0, s1;
  weft__meta_stats_t m0, m1;
  env.sim->stats(&s0);
  weft__meta_stats(&m0);
  fs_handles_t h0 = g_live;
  uint64_t races0 = env.sim->race_count();
  v->mode_before = thread_capture_mode();
  if (spec != NULL && (env.sim->fail)(spec) != 0) {
    fprintf(stderr, "bad fault spec %s\n", spec);
    abort();
  }
  workload(stk);
  v->calls = g_seq;
  env.sim->stats(&s1);
  (env.sim->fail)("");
  v->mode_after = thread_capture_mode();
  weft__meta_stats(&m1);
  v->fired = s1.faults_injected > s0.faults_injected;
  v->dev_delta = (int64_t)(s1.bytes_in_use - s0.bytes_in_use);
  v->meta_delta = m1.live - m0.live;
  v->handles = (fs_handles_t){g_live.ctx - h0.ctx, g_live.streams - h0.streams, g_live.events - h0.events,
                              g_live.graphs - h0.graphs, g_live.execs - h0.execs, g_live.pools - h0.pools};
  v->races = env.sim->race_count() - races0;
  v->completed = 1;
}

typedef struct fs_job {
  pid_t pid; /* 0: the lane is idle */
  int fd;
  unsigned slot; /* its verdict in g_shared: what W got to, also when the child crashed */
  size_t fn;
  unsigned n;
  char errpath[512];
} fs_job_t;

#define MAX_JOBS 8
static fs_verdict_t *g_shared; /* MAP_SHARED, one per lane (MAX_JOBS + 1 for single runs) */

/* Forks a child running W with the fault `fn`:`n` (fn == NFUNCS: no fault); output to errpath
 * (NULL: inherited). */
static void start_job(fs_job_t *j, const fs_stack_t *stk, size_t fn, unsigned n, bool to_file) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  j->fn = fn;
  j->n = n;
  snprintf(j->errpath, sizeof j->errpath, "%s/fault_sweep_%s_%s_%u.log", g_tmpdir, stk->name,
           fn < NFUNCS ? g_funcs[fn] : "none", n);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    for (size_t i = 0; i < sizeof g_crash_signals / sizeof *g_crash_signals; i++)
      sigaction(g_crash_signals[i], &g_crash_handlers[i], NULL);
    close(p[0]);
    if (to_file) {
      int fd = open(j->errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    alarm(60); /* a hang shows as SIGALRM */
    char spec[128];
    if (fn < NFUNCS) snprintf(spec, sizeof spec, "%s:%u:%s", g_funcs[fn], n, fault_code(g_funcs[fn]));
    fs_verdict_t *v = &g_shared[j->slot];
    run_w(stk, fn < NFUNCS ? spec : NULL, v);
    const char *q = (const char *)v;
    size_t left = sizeof *v;
    while (left > 0) {
      ssize_t w = write(p[1], q, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) _exit(97);
      q += w;
      left -= (size_t)w;
    }
    close(p[1]);
    fflush(NULL);
    exit(0); /* LeakSanitizer checks here (exit status 23 on a leak) */
  }
  close(p[1]);
  j->pid = pid;
  j->fd = p[0];
}

/* Collects a finished job's verdict; returns whether one came. Without one, *v is what the child
 * had recorded when it died (its shared slot). */
static bool collect(fs_job_t *j, fs_verdict_t *v) {
  char *q = (char *)v;
  size_t got = 0;
  while (got < sizeof *v) {
    ssize_t r = read(j->fd, q + got, sizeof *v - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(j->fd);
  if (got == sizeof *v && v->completed) return true;
  *v = g_shared[j->slot];
  v->completed = 0;
  return false;
}

/* ------------------------------------------------------------------------------------------ */
/* Classification and the report                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct fs_cell {
  char mark; /* 0 not run / not reached, '.' error reported, 'd' reported by a later call, 'a' absorbed, 'F' */
  char reason[200];
  fs_verdict_t v;
  char errpath[512];
} fs_cell_t;

__attribute__((format(printf, 2, 3))) static void add_reason(fs_cell_t *c, const char *fmt, ...) {
  size_t len = strlen(c->reason);
  if (len + 3 >= sizeof c->reason) return;
  if (len > 0) {
    strcpy(c->reason + len, "; ");
    len += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->reason + len, sizeof c->reason - len, fmt, ap);
  va_end(ap);
}

/* Which sanitizer spoke in a child's log. */
static const char *sanitizer_in(const char *path) {
  FILE *f = path != NULL ? fopen(path, "r") : NULL;
  if (f == NULL) return "no log";
  char line[400];
  const char *what = "no sanitizer report in the log";
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, "ERROR: LeakSanitizer") != NULL) what = "LeakSanitizer: host memory leaked";
    else if (strstr(line, "ERROR: AddressSanitizer") != NULL) what = "AddressSanitizer report";
    else if (strstr(line, "runtime error:") != NULL) what = "UndefinedBehaviorSanitizer report";
    else continue;
    break;
  }
  fclose(f);
  return what;
}

/* Fills c from the child's wait status and verdict (its log at `log`). Returns whether the fault
 * was reached. */
static bool classify(fs_cell_t *c, int wstatus, bool got, const char *log) {
  const fs_verdict_t *v = &c->v;
  c->reason[0] = '\0';
  if (WIFSIGNALED(wstatus)) {
    int sig = WTERMSIG(wstatus);
    if (sig == SIGALRM) add_reason(c, "hang (60 s)");
    else add_reason(c, "crash: signal %d (%s)", sig, strsignal(sig));
  } else if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0) {
    add_reason(c, "exit %d: %s", WEXITSTATUS(wstatus), sanitizer_in(log));
  } else if (!got) {
    add_reason(c, "no verdict from the child");
  }
  if (c->reason[0] != '\0') {
    if (!got && v->current[0] != '\0') add_reason(c, "in %s", v->current);
    c->mark = 'F';
    return true;
  }
  if (!v->fired) {
    c->mark = 0;
    return false;
  }
  if (v->fired_in[0] == '\0') add_reason(c, "the fault fired outside every weft call of W");
  if (v->dev_delta != 0) add_reason(c, "device bytes %+" PRId64 " after release", v->dev_delta);
  if (v->meta_delta != 0) add_reason(c, "weft metadata records %+" PRId64 " after release", v->meta_delta);
  const fs_handles_t *h = &v->handles;
  /* weft.h: a teardown call failing in the last release is reported (DRIVER) and the runtime is
   * released all the same, the object the driver refused to destroy left to it: one object, no
   * more, and only then. */
  long left = h->ctx + h->streams + h->events + h->graphs + h->execs + h->pools;
  bool refused_in_release = strcmp(v->fired_in, "weft_runtime_release") == 0 && v->fired_status == WEFT_ERR_DRIVER &&
                            left == 1 && h->ctx >= 0 && h->streams >= 0 && h->events >= 0 && h->graphs >= 0 &&
                            h->execs >= 0 && h->pools >= 0;
  if (!refused_in_release && (h->ctx || h->streams || h->events || h->graphs || h->execs || h->pools))
    add_reason(c, "driver objects left: ctx %+ld streams %+ld events %+ld graphs %+ld execs %+ld pools %+ld", h->ctx,
               h->streams, h->events, h->graphs, h->execs, h->pools);
  if (v->mode_after != v->mode_before)
    add_reason(c, "the thread's stream capture mode changed from %d to %d (0 GLOBAL, 2 RELAXED)", v->mode_before, v->mode_after);
  if (v->races != 0) add_reason(c, "%" PRIu64 " races reported by the oracle", v->races);
  if (v->checks_bad != 0) add_reason(c, "wrong data after success: %s", v->bad_msg);
  if (v->got_runtime && v->release_status == WEFT_ERR_BUSY) add_reason(c, "weft_runtime_release: BUSY");
  if (v->fired_in[0] != '\0' && v->fired_status == WEFT_OK && v->errors_after == 0 && is_teardown(v->fired_in))
    add_reason(c, "swallowed: %s returned WEFT_OK", v->fired_in);
  if (c->reason[0] != '\0') c->mark = 'F';
  else if (v->fired_status != WEFT_OK) c->mark = '.';
  else if (v->errors_after > 0) c->mark = 'd';
  else c->mark = 'a';
  return true;
}

static unsigned g_max_n = MAX_N, g_jobs = 2;
static char g_only_funcs[1024];

static bool wanted_func(const char *fn) {
  if (g_only_funcs[0] == '\0') return true;
  size_t len = strlen(fn);
  for (const char *p = g_only_funcs; (p = strstr(p, fn)) != NULL; p += len)
    if ((p == g_only_funcs || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) return true;
  return false;
}

static void print_file_head(const char *path, int lines) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  char line[400];
  int shown = 0;
  while (shown < lines && fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "  [", 3) == 0) continue; /* W's trace, if any */
    print_message("      | %s", line);
    shown++;
  }
  fclose(f);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static fs_cell_t g_cells[NFUNCS][MAX_N + 1];

/* Sweeps one stack; returns the number of FAILED cells. */
static unsigned sweep(const fs_stack_t *stk) {
  double t0 = now_s();
  memset(g_cells, 0, sizeof g_cells);
  /* The unfaulted run must be clean. */
  fs_job_t gj = {.slot = 0};
  start_job(&gj, stk, NFUNCS, 0, true);
  int ws;
  assert_int_equal(waitpid(gj.pid, &ws, 0), gj.pid);
  fs_verdict_t golden;
  bool got = collect(&gj, &golden);
  if (!got || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0 || golden.errors != 0 || golden.dev_delta != 0 ||
      golden.meta_delta != 0 || golden.races != 0 || golden.checks_bad != 0 || golden.checks_run != 6 ||
      golden.release_status != WEFT_OK || golden.fired || golden.mode_after != golden.mode_before) {
    print_message("unfaulted run of W on %s is not clean (status 0x%x, %d errors, %d/%d checks bad: %s, device %+" PRId64
                  ", metadata %+" PRId64 ", races %" PRIu64 "); log %s:\n",
                  stk->name, ws, golden.errors, golden.checks_bad, golden.checks_run, golden.bad_msg, golden.dev_delta,
                  golden.meta_delta, golden.races, gj.errpath);
    print_file_head(gj.errpath, 40);
    fail_msg("W is not clean without faults on %s", stk->name);
  }
  unlink(gj.errpath);

  /* Lanes: each sweeps one entry point at a time, N = 1, 2, ... until call N is not reached. */
  fs_job_t jobs[MAX_JOBS];
  memset(jobs, 0, sizeof jobs);
  unsigned active = 0, runs = 1;
  size_t next_fn = 0;
  for (;;) {
    for (unsigned k = 0; k < g_jobs; k++) {
      if (jobs[k].pid != 0) continue;
      while (next_fn < NFUNCS && !wanted_func(g_funcs[next_fn])) next_fn++;
      if (next_fn == NFUNCS) break;
      jobs[k].slot = k;
      start_job(&jobs[k], stk, next_fn++, 1, true);
      active++;
      runs++;
    }
    if (active == 0) break;
    pid_t pid = waitpid(-1, &ws, 0);
    if (pid < 0 && errno == EINTR) continue;
    assert_true(pid > 0);
    unsigned k = 0;
    while (k < g_jobs && jobs[k].pid != pid) k++;
    assert_true(k < g_jobs);
    fs_job_t *j = &jobs[k];
    fs_cell_t *c = &g_cells[j->fn][j->n];
    bool have = collect(j, &c->v);
    bool reached = classify(c, ws, have, j->errpath);
    if (c->mark == 'F') snprintf(c->errpath, sizeof c->errpath, "%s", j->errpath);
    else unlink(j->errpath);
    if (reached && j->n < g_max_n) {
      start_job(j, stk, j->fn, j->n + 1, true); /* the same slot goes on with N + 1 */
      runs++;
    } else {
      j->pid = 0;
      active--;
    }
  }
  double secs = now_s() - t0;

  /* The table. */
  unsigned failed = 0, absorbed = 0, reported = 0, reached_fns = 0;
  print_message("== stack %s: %u runs in %.1f s (W unfaulted: %d weft calls, 0 errors, %d data checks)\n", stk->name, runs,
                secs, golden.calls, golden.checks_run);
  print_message("   . error returned by the faulted call   d error returned by a later call   a absorbed   F FAILED   "
                "(blank: call N not reached)\n");
  print_message("   %-34s %s\n", "entry point \\ N", "12345678901234567890");
  char never[4096] = "";
  for (size_t f = 0; f < NFUNCS; f++) {
    if (!wanted_func(g_funcs[f])) continue;
    char row[MAX_N + 1];
    unsigned calls = 0;
    for (unsigned n = 1; n <= g_max_n; n++) {
      fs_cell_t *c = &g_cells[f][n];
      row[n - 1] = c->mark ? c->mark : ' ';
      if (c->mark) calls = n;
      failed += c->mark == 'F';
      absorbed += c->mark == 'a';
      reported += c->mark == '.' || c->mark == 'd';
    }
    row[g_max_n] = '\0';
    if (calls == 0) {
      size_t len = strlen(never);
      snprintf(never + len, sizeof never - len, "%s%s", len ? " " : "", g_funcs[f]);
      continue;
    }
    reached_fns++;
    print_message("   %-34s %s%s\n", g_funcs[f], row, calls == g_max_n ? " +" : "");
  }
  print_message("   not called by W: %s\n", never);
  print_message("   %u entry points reached; cells: %u reported, %u absorbed, %u FAILED\n", reached_fns, reported, absorbed,
                failed);

  /* Absorbed cells, grouped by the call they fired in. */
  if (absorbed) {
    print_message("   absorbed (fired, every weft call returned WEFT_OK afterwards, state correct):\n");
    for (size_t f = 0; f < NFUNCS; f++)
      for (unsigned n = 1; n <= g_max_n; n++) {
        fs_cell_t *c = &g_cells[f][n];
        if (c->mark != 'a' || c->reason[0] == '#') continue;
        char cells[600];
        int len = snprintf(cells, sizeof cells, "%u", n);
        for (unsigned m = n + 1; m <= g_max_n; m++) {
          fs_cell_t *o = &g_cells[f][m];
          if (o->mark == 'a' && strcmp(o->v.fired_in, c->v.fired_in) == 0) {
            if (len < (int)sizeof cells - 8) len += snprintf(cells + len, sizeof cells - (size_t)len, ",%u", m);
            o->reason[0] = '#';
          }
        }
        print_message("     %s #%s in %s\n", g_funcs[f], cells, c->v.fired_in);
      }
  }
  /* FAILED cells, grouped by reason. */
  if (failed) {
    print_message("   FAILED:\n");
    for (size_t f = 0; f < NFUNCS; f++)
      for (unsigned n = 1; n <= g_max_n; n++) {
        fs_cell_t *c = &g_cells[f][n];
        if (c->mark != 'F' || c->reason[0] == '\0') continue;
        char reason[200], where[300] = "", cells[1500] = "";
        snprintf(reason, sizeof reason, "%s", c->reason);
        unsigned count = 0;
        size_t wl = 0, cl = 0;
        for (size_t f2 = f; f2 < NFUNCS; f2++) {
          unsigned run_from = 0, run_to = 0;
          for (unsigned m = 1; m <= g_max_n + 1; m++) {
            fs_cell_t *o = m <= g_max_n ? &g_cells[f2][m] : NULL;
            bool in = o != NULL && o->mark == 'F' && strcmp(o->reason, reason) == 0 && (f2 > f || m >= n);
            if (in) {
              count++;
              const char *w = o->v.fired_in[0] ? o->v.fired_in : "-";
              char key[64];
              snprintf(key, sizeof key, "%s,", w);
              if (strstr(where, key) == NULL && wl + strlen(key) + 2 < sizeof where) wl += (size_t)snprintf(where + wl, sizeof where - wl, "%s", key);
              o->reason[0] = '\0';
              if (run_from == 0) run_from = m;
              run_to = m;
            } else if (run_from != 0) {
              if (cl + 64 < sizeof cells)
                cl += (size_t)(run_from == run_to ? snprintf(cells + cl, sizeof cells - cl, " %s#%u", g_funcs[f2], run_from)
                                                  : snprintf(cells + cl, sizeof cells - cl, " %s#%u-%u", g_funcs[f2], run_from, run_to));
              run_from = 0;
            }
          }
        }
        if (wl > 0) where[wl - 1] = '\0';
        print_message("   - %s\n     fault fired in: %s; first error after it: %s%s%s%s%s\n     %u cells:%s\n", reason, where,
                      c->v.first_err[0] ? c->v.first_err : "none", c->v.first_err[0] ? " returned " : "",
                      c->v.first_err[0] ? weft_status_name(c->v.first_err_status) : "", c->v.first_err_msg[0] ? ": " : "",
                      c->v.first_err_msg, count, cells);
        print_message("     reproduce: WEFT_FAULT_SWEEP_CELL=%s:%s:%u\n", stk->name, g_funcs[f], n);
        print_file_head(c->errpath, 12);
      }
  }
  return failed;
}

/* ------------------------------------------------------------------------------------------ */
/* cmocka                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static CUcontext g_ctx;
static CUdevice g_dev;

static int setup(void **state) {
  (void)state;
  memset(&env, 0, sizeof env);
  if (weft__driver_get(&drv) != WEFT_OK) {
    fprintf(stderr, "no driver: %s\n", weft_last_error());
    return -1;
  }
  env.sim = weft_sim_api(weft_driver_symbol);
  if (env.sim == NULL) {
    fprintf(stderr, "the fault sweep needs the simulator (WEFT_DRIVER=sim)\n");
    return -1;
  }
  weft_test_kernels_register_sim();
  /* The program's own hold on the primary context, for its module (as an application that also
   * uses the driver directly has): weft's retains and releases are counted on top of it. */
  CUdevice dev;
  if (drv->cuDeviceGet(&dev, 0) != CUDA_SUCCESS || drv->cuDevicePrimaryCtxRetain(&g_ctx, dev) != CUDA_SUCCESS ||
      drv->cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS || drv->cuModuleLoadData(&env.module, test_kernels_fatbin) != CUDA_SUCCESS ||
      drv->cuModuleGetFunction(&env.combine, env.module, "weft_test_combine") != CUDA_SUCCESS ||
      drv->cuModuleGetFunction(&env.fill, env.module, "weft_test_fill") != CUDA_SUCCESS) {
    fprintf(stderr, "cannot load the test kernels\n");
    return -1;
  }
  g_dev = dev;
  /* No context current: weft binds its own (cuCtxGetCurrent / cuCtxSetCurrent are swept too). */
  if (drv->cuCtxSetCurrent(NULL) != CUDA_SUCCESS) return -1;
  wrap_driver_table(drv);
  g_tmpdir = getenv("TEST_TMPDIR");
  if (g_tmpdir == NULL) g_tmpdir = "/tmp";
  const char *s;
  if ((s = getenv("WEFT_FAULT_SWEEP_MAX_N")) != NULL && atoi(s) > 0) g_max_n = (unsigned)atoi(s) > MAX_N ? MAX_N : (unsigned)atoi(s);
  if ((s = getenv("WEFT_FAULT_SWEEP_JOBS")) != NULL && atoi(s) > 0) g_jobs = (unsigned)atoi(s) > MAX_JOBS ? MAX_JOBS : (unsigned)atoi(s);
  g_shared = mmap(NULL, (MAX_JOBS + 1) * sizeof *g_shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_shared == MAP_FAILED) return -1;
  if ((s = getenv("WEFT_FAULT_SWEEP_FUNCS")) != NULL) snprintf(g_only_funcs, sizeof g_only_funcs, "%s", s);
  if ((s = getenv("WEFT_FAULT_SWEEP_CACHE_BYTES")) != NULL) g_cache_bytes = strtoull(s, NULL, 10);
  /* Warm-up in this process, so that what weft keeps for the process's life exists before the
   * children count: interned tags, and block records, which stay with the runtime slot and are
   * reused only once WEFT__FREED_KEPT freed ones wait (lib/runtime/runtime.h). W runs on every
   * stack until its metadata stays put; a W that leaks records even without faults never does. */
  V = &g_scratch;
  g_trace = getenv("WEFT_FAULT_SWEEP_TRACE") != NULL;
  for (size_t i = 0; i < sizeof g_stacks / sizeof *g_stacks; i++) {
    int stable = 0, runs = 0;
    int64_t last = -1;
    while (stable < 2) {
      memset(&g_scratch, 0, sizeof g_scratch);
      workload(&g_stacks[i]);
      if (g_scratch.errors != 0 || g_scratch.checks_bad != 0) {
        fprintf(stderr, "warm-up of W on %s: %d errors, %d bad checks (%s)\n", g_stacks[i].name, g_scratch.errors,
                g_scratch.checks_bad, g_scratch.bad_msg);
        return -1;
      }
      weft__meta_stats_t m;
      weft__meta_stats(&m);
      stable = m.live == last ? stable + 1 : 0;
      last = m.live;
      if (++runs == 200) {
        fprintf(stderr, "W without faults on %s: weft's metadata still grows after %d runs (%lld records live)\n",
                g_stacks[i].name, runs, (long long)m.live);
        return -1;
      }
    }
  }
  /* Headroom: 64 more records on the free list, for faulted runs that hold more blocks at once. */
  {
    weft_runtime_t *rt;
    weft_stream_t *s;
    weft_block_t b[64];
    if (weft_runtime_get(0, NULL, &rt) != WEFT_OK || weft_stream_get(rt, 0, &s) != WEFT_OK) return -1;
    for (int i = 0; i < 64; i++)
      if (weft_alloc(rt, 256, s, "headroom", &b[i]) != WEFT_OK) return -1;
    for (int i = 0; i < 64; i++)
      if (weft_free(b[i], s) != WEFT_OK) return -1;
    if (weft_runtime_release(rt) != WEFT_OK) return -1;
  }
  g_trace = false;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (env.module != NULL) drv->cuModuleUnload(env.module);
  if (g_ctx != NULL) (real_ctx_release ? real_ctx_release : drv->cuDevicePrimaryCtxRelease)(g_dev);
  return 0;
}

static bool wanted_stack(const char *name) {
  const char *only = getenv("WEFT_FAULT_SWEEP_STACKS");
  if (only == NULL || *only == '\0') return true;
  size_t len = strlen(name);
  for (const char *p = only; (p = strstr(p, name)) != NULL; p += len)
    if ((p == only || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) return true;
  return false;
}

/* WEFT_FAULT_SWEEP_CELL=stack:entry:N: one run, traced, output on stderr. */
static bool run_one_cell(const fs_stack_t *stk) {
  const char *cell = getenv("WEFT_FAULT_SWEEP_CELL");
  if (cell == NULL || *cell == '\0') return false;
  char name[64] = "", fn[96] = "";
  unsigned n = 0;
  if (sscanf(cell, "%63[^:]:%95[^:]:%u", name, fn, &n) != 3 || strcmp(name, stk->name) != 0) {
    skip();
    return true;
  }
  size_t f = 0;
  while (f < NFUNCS && strcmp(g_funcs[f], fn) != 0) f++;
  if (f == NFUNCS || n == 0) fail_msg("WEFT_FAULT_SWEEP_CELL: no entry point %s or bad N", fn);
  g_trace = true;
  fprintf(stderr, "W on %s with %s:%u:%s, traced:\n", stk->name, fn, n, fault_code(fn));
  fs_job_t j = {.slot = MAX_JOBS};
  start_job(&j, stk, f, n, false);
  int ws;
  assert_int_equal(waitpid(j.pid, &ws, 0), j.pid);
  fs_cell_t c;
  memset(&c, 0, sizeof c);
  bool have = collect(&j, &c.v);
  bool reached = classify(&c, ws, have, NULL);
  const fs_verdict_t *v = &c.v;
  fprintf(stderr,
          "verdict: %s%s%s\n  fired %d in %s (returned %s, call %d); errors %d (%d at or after the fault; first %s: %s %s)\n"
          "  release %s; device %+" PRId64 "; metadata %+" PRId64 "; races %" PRIu64 "; checks %d run, %d bad %s\n",
          !reached ? "not reached" : c.mark == 'F' ? "FAILED: " : c.mark == 'a' ? "absorbed" : "ok", c.mark == 'F' ? c.reason : "",
          "", v->fired, v->fired_in, weft_status_name(v->fired_status), v->fired_seq, v->errors, v->errors_after, v->first_err,
          weft_status_name(v->first_err_status), v->first_err_msg, weft_status_name(v->release_status), v->dev_delta,
          v->meta_delta, v->races, v->checks_run, v->checks_bad, v->bad_msg);
  g_trace = false;
  return true;
}

static void sweep_stack(size_t i) {
#if defined(__SANITIZE_THREAD__)
  /* Under TSan the forks fail inside TSan itself: jemalloc's fork handlers hold more locks than
   * its deadlock detector tracks (64). W is single-threaded; the sweep runs in the default and
   * asan configs. */
  skip();
#endif
  const fs_stack_t *stk = &g_stacks[i];
  if (!wanted_stack(stk->name)) skip();
  if (run_one_cell(stk)) return;
  unsigned failed = sweep(stk);
  if (failed != 0) fail_msg("%u FAILED cells on the %s stack (see above)", failed, stk->name);
}

static void test_sweep_pool(void **state) { (void)state; sweep_stack(0); }
static void test_sweep_async(void **state) { (void)state; sweep_stack(1); }
static void test_sweep_direct(void **state) { (void)state; sweep_stack(2); }
static void test_sweep_guard(void **state) { (void)state; sweep_stack(3); }

int main(void) {
  for (size_t i = 0; i < sizeof g_crash_signals / sizeof *g_crash_signals; i++)
    sigaction(g_crash_signals[i], NULL, &g_crash_handlers[i]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sweep_pool),
      cmocka_unit_test(test_sweep_async),
      cmocka_unit_test(test_sweep_direct),
      cmocka_unit_test(test_sweep_guard),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
