/* Global state, the per-call entry and exit, the live-handle set and the simulator's own API.
 *
 * Every exported driver function runs between sim__enter() and sim__leave(): the global
 * recursive lock is held in between, so the bodies never race with each other. sim__enter()
 * also counts the call, applies fault injection and lets the scheduler make a little progress,
 * which is what makes interleavings vary from call to call.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

sim__state_t sim = {
    .lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP,
    .oracle = 1,
    .rng = 1,
    .memory_limit = 80ull << 30,
    .ndev = 1,
    .next_op_id = 1,
    .next_lane = 1,
    .next_stream_id = 1,
    .next_capture_id = 1,
};

static __thread sim__thread_t g_self = {.ctx = NULL, .mode = CU_STREAM_CAPTURE_MODE_GLOBAL};

sim__thread_t *sim__self(void) { return &g_self; }

/* ---- small allocation helpers: the simulator treats host OOM as fatal ---- */

static void oom(void) {
  fputs("weft-sim: out of host memory\n", stderr);
  abort();
}
void *sim__xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) oom();
  return p;
}
void *sim__xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (p == NULL) oom();
  return p;
}
void *sim__xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (q == NULL) oom();
  return q;
}
void sim__grow(void *arr, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return;
  size_t c = *cap ? *cap : 4;
  while (c < need) c *= 2;
  void **a = (void **)arr;
  *a = sim__xrealloc(*a, c * size);
  *cap = c;
}

CUresult sim__unimplemented(void) {
  sim.stats.unimplemented++;
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- handles: open-addressing pointer sets (tombstones on removal) ----
 * g_live holds every object a handle may name now; g_dead the addresses of removed objects,
 * until a new object takes one: a use of one is answered INVALID_HANDLE, as an unknown handle,
 * and counted (stats.destroyed_handle_uses): the real driver may crash there. */

#define TOMB ((void *)1)
typedef struct pset {
  void **slot;
  size_t cap, used; /* slots, slots not empty (live + tombstones) */
} pset_t;
static pset_t g_live, g_dead;

static size_t hslot(const void *p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return (size_t)h & (cap - 1);
}

static size_t pset_find(const pset_t *t, const void *obj) {
  if (t->cap == 0 || obj == NULL) return SIZE_MAX;
  size_t j = hslot(obj, t->cap);
  while (t->slot[j] != NULL) {
    if (t->slot[j] == obj) return j;
    j = (j + 1) & (t->cap - 1);
  }
  return SIZE_MAX;
}

/* Rebuilt without tombstones when half its slots are taken, doubled while half full of live ones. */
static void pset_add(pset_t *t, void *obj) {
  if ((t->used + 1) * 2 > t->cap) {
    void **old = t->slot;
    size_t oldcap = t->cap, live = 0;
    for (size_t i = 0; i < oldcap; i++) live += old[i] != NULL && old[i] != TOMB;
    size_t cap = oldcap ? oldcap : 256;
    while ((live + 1) * 2 > cap) cap *= 2;
    t->slot = sim__xcalloc(cap, sizeof *t->slot);
    t->cap = cap;
    t->used = 0;
    for (size_t i = 0; i < oldcap; i++) {
      if (old[i] == NULL || old[i] == TOMB) continue;
      size_t j = hslot(old[i], cap);
      while (t->slot[j] != NULL) j = (j + 1) & (cap - 1);
      t->slot[j] = old[i];
      t->used++;
    }
    free(old);
  }
  if (pset_find(t, obj) != SIZE_MAX) return;
  size_t j = hslot(obj, t->cap);
  while (t->slot[j] != NULL && t->slot[j] != TOMB) j = (j + 1) & (t->cap - 1);
  if (t->slot[j] == NULL) t->used++;
  t->slot[j] = obj;
}

/* Removes obj; returns whether it was there. */
static bool pset_remove(pset_t *t, const void *obj) {
  size_t j = pset_find(t, obj);
  if (j != SIZE_MAX) t->slot[j] = TOMB;
  return j != SIZE_MAX;
}

void sim__handle_add(void *obj) {
  (void)pset_remove(&g_dead, obj); /* a new object at a destroyed one's address */
  pset_add(&g_live, obj);
}

void sim__handle_remove(void *obj) {
  if (pset_remove(&g_live, obj)) pset_add(&g_dead, obj);
}

void *sim__handle_get(const void *obj, uint32_t magic) {
  if (pset_find(&g_live, obj) == SIZE_MAX) {
    if (pset_find(&g_dead, obj) != SIZE_MAX && sim.stats.destroyed_handle_uses++ < 10)
      fprintf(stderr, "weft-sim: a handle was used after its destroy (%p): the real driver may crash here\n", obj);
    return NULL;
  }
  return *(const uint32_t *)obj == magic ? (void *)obj : NULL;
}

/* ---- configuration (environment, read once) ---- */

static uint64_t parse_bytes(const char *s, uint64_t dflt) {
  if (s == NULL || *s == '\0') return dflt;
  char *end;
  unsigned long long v = strtoull(s, &end, 0);
  switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    case 't': case 'T': v <<= 40; break;
    default: break;
  }
  return v ? (uint64_t)v : dflt;
}

static void report_at_exit(void) {
  pthread_mutex_lock(&sim.lock);
  sim__race_report();
  pthread_mutex_unlock(&sim.lock);
}

static pthread_once_t g_config_once = PTHREAD_ONCE_INIT;

/* Reads the environment; run once, before the first call's body or API use. */
static void config_once(void) {
  const char *seed = getenv("WEFT_SIM_SEED");
  sim__seed(seed && *seed ? strtoull(seed, NULL, 0) : 1);
  sim.memory_limit = parse_bytes(getenv("WEFT_SIM_MEMORY"), 80ull << 30);
  const char *ndev = getenv("WEFT_SIM_DEVICES");
  long n = ndev && *ndev ? strtol(ndev, NULL, 10) : 1;
  sim.ndev = n < 1 ? 1 : n > SIM_MAX_DEVICES ? SIM_MAX_DEVICES : (int)n;
  const char *peer = getenv("WEFT_SIM_PEER");
  sim.no_peer = peer && strcmp(peer, "0") == 0;
  for (int d = 0; d < SIM_MAX_DEVICES; d++) sim.ctxs[d] = (sim__ctx_t){SIM_MAGIC_CTX, d, 0, 0};
  const char *oracle = getenv("WEFT_SIM_ORACLE");
  sim.oracle = !(oracle && strcmp(oracle, "0") == 0);
  const char *lazy = getenv("WEFT_SIM_LAZY");
  sim.lazy = lazy && strcmp(lazy, "1") == 0;
  const char *depth = getenv("WEFT_SIM_QUEUE_DEPTH");
  sim.queue_depth = depth && *depth ? strtoull(depth, NULL, 10) : 1024;
  sim__thread_end_key();
  const char *report = getenv("WEFT_SIM_REPORT");
  if (report && strcmp(report, "1") == 0) {
    sim.report_at_exit = 1;
    atexit(report_at_exit);
  }
}

static void config(void) { pthread_once(&g_config_once, config_once); }

/* Each device's legacy stream and default pool exist from cuInit on. */
static void init_objects(void) {
  if (sim.null_streams[0] != NULL) return;
  for (int d = 0; d < sim.ndev; d++) {
    sim__stream_t *s = sim__xcalloc(1, sizeof *s);
    s->magic = SIM_MAGIC_STREAM;
    s->id = 0;
    s->dev = d;
    s->is_null = 1;
    s->lane = sim.next_lane++;
    s->busy_index = -1;
    sim__grow(&sim.streams, &sim.capstreams, sim.nstreams + 1, sizeof *sim.streams);
    s->all_index = sim.nstreams;
    sim.streams[sim.nstreams++] = s;
    sim.null_streams[d] = s;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = d;
    sim.default_pools[d] = sim__pool_new(&props);
    sim.default_pools[d]->is_default = 1;
  }
}

/* Graph calls (launch, instantiate, upload, exec and graph destroy, trim; the free of graph memory,
 * checked in pool.c; allocations on a capturing stream, in sim__enter) must not overlap another
 * thread's driver call that enqueues work: on an H200 and an H100 with driver 580.159.04 such
 * overlaps were followed by wrong results (tests/conformance/README.md, "graph calls"); the
 * simulator reports one as a race of no bytes. enqueues() is the same set as lib/core/driver.c's
 * WEFT__DRIVER_GATED. */
static int enqueues(sim__fn_t fn) {
  switch (fn) {
    case SIM_FN_cuLaunchKernel: case SIM_FN_cuLaunchHostFunc: case SIM_FN_cuEventRecord:
    case SIM_FN_cuEventRecordWithFlags: case SIM_FN_cuStreamWaitEvent: case SIM_FN_cuStreamWriteValue32:
    case SIM_FN_cuStreamWriteValue64: case SIM_FN_cuStreamWaitValue32: case SIM_FN_cuStreamWaitValue64:
    case SIM_FN_cuMemcpyHtoDAsync: case SIM_FN_cuMemcpyDtoHAsync: case SIM_FN_cuMemcpyDtoDAsync:
    case SIM_FN_cuMemcpyPeerAsync:
    case SIM_FN_cuMemsetD8Async: case SIM_FN_cuMemsetD32Async: case SIM_FN_cuMemAlloc:
    case SIM_FN_cuMemAllocAsync: case SIM_FN_cuMemAllocFromPoolAsync: case SIM_FN_cuMemFreeAsync:
    case SIM_FN_cuStreamBeginCapture: case SIM_FN_cuStreamEndCapture: case SIM_FN_cuGraphInstantiateWithFlags:
    case SIM_FN_cuGraphUpload: case SIM_FN_cuGraphLaunch: case SIM_FN_cuGraphExecDestroy: case SIM_FN_cuGraphDestroy:
      return 1;
    default: return 0;
  }
}

/* Per device (the current context's at entry): calls of enqueues() entered and not left, all
 * threads, and the name of the last one entered. Graph calls on one device may overlap enqueues on
 * another (lib/core/gate.h: the gate is per device; measured by tests/threads/test_thread_gate,
 * THREAD_GATE_DEVICES=2). */
static _Atomic unsigned g_enqueuing[SIM_MAX_DEVICES];
static _Atomic(const char *) g_enqueuing_last[SIM_MAX_DEVICES];

/* Graph calls checked on the current context's device; launch, upload (the stream's device) and
 * trim (its argument) are checked in their bodies. */
static int graph_call(sim__fn_t fn) {
  switch (fn) {
    case SIM_FN_cuGraphInstantiateWithFlags: case SIM_FN_cuGraphExecDestroy: case SIM_FN_cuGraphDestroy:
      return 1;
    default: return 0;
  }
}

void sim__graph_call_check(int dev, const char *what) {
  if (dev < 0 || dev >= SIM_MAX_DEVICES) return;
  unsigned mine = 0;
  for (unsigned i = 0; i < g_self.depth && i < 64; i++)
    if ((g_self.enqueue_bits >> (g_self.depth - 1 - i) & 1) && g_self.enqueue_dev[i] == dev) mine++;
  unsigned all = atomic_load(&g_enqueuing[dev]);
  if (all <= mine) return;
  const char *last = atomic_load(&g_enqueuing_last[dev]);
  char first[112], second[96];
  snprintf(first, sizeof first, "%u call(s) enqueueing on device %d on other threads (last: %s)", all - mine, dev,
           last ? last : "?");
  snprintf(second, sizeof second, "%.50s at the same time (wrong results on GPUs)", what);
  sim__hazard_report(first, second);
}

/* The device a call counts on: the current context's. */
static int self_dev(void) {
  int d = sim__cur_dev();
  return d >= 0 && d < SIM_MAX_DEVICES ? d : 0;
}

CUresult sim__enter(sim__fn_t fn, int needs_init) {
  config();
  int e = enqueues(fn);
  g_self.enqueue_bits = (g_self.enqueue_bits << 1) | (uint64_t)e;
  int dev = self_dev();
  if (g_self.depth < 64) g_self.enqueue_dev[g_self.depth] = (uint8_t)dev;
  g_self.depth++;
  g_self.enqueued = NULL;
  if (e) {
    atomic_store(&g_enqueuing_last[dev], sim__fn_name(fn));
    atomic_fetch_add(&g_enqueuing[dev], 1);
  }
  if (g_self.registered == 0) sim__thread_watch();
  g_self.stream_without_ctx = 0;
  pthread_mutex_lock(&sim.lock);
  sim.stats.api_calls++;
  if (needs_init && !sim.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult f = sim__fault_check(fn);
  if (f != CUDA_SUCCESS) {
    sim.stats.faults_injected++;
    return f;
  }
  if (sim.initialized) sim__progress(fn);
  if (graph_call(fn)) sim__graph_call_check(dev, sim__fn_name(fn));
  return CUDA_SUCCESS;
}

CUresult sim__leave_result(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE && g_self.stream_without_ctx ? CUDA_ERROR_INVALID_CONTEXT : r;
}

void sim__leave(void) {
  pthread_mutex_unlock(&sim.lock);
  g_self.depth--;
  if (g_self.enqueue_bits & 1) atomic_fetch_sub(&g_enqueuing[g_self.depth < 64 ? g_self.enqueue_dev[g_self.depth] : 0], 1);
  g_self.enqueue_bits >>= 1;
}

CUresult sim__need_ctx(void) {
  return g_self.ctx != NULL && ((sim__ctx_t *)g_self.ctx)->refs > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

int sim__cur_dev(void) { return g_self.ctx != NULL ? ((sim__ctx_t *)g_self.ctx)->dev : 0; }

/* ---- cuInit, versions, error names ---- */

static CUresult do_init(unsigned flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!sim.initialized) {
    init_objects();
    sim.initialized = 1;
    const char *spec = getenv("WEFT_SIM_FAIL");
    if (spec && *spec && sim__fault_set(spec) != 0)
      fprintf(stderr, "weft-sim: ignoring malformed WEFT_SIM_FAIL '%s'\n", spec);
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  CUresult r = sim__enter(SIM_FN_cuInit, 0);
  if (r == CUDA_SUCCESS) r = do_init(Flags);
  sim__leave();
  return r;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
  CUresult r = sim__enter(SIM_FN_cuDriverGetVersion, 0);
  if (r == CUDA_SUCCESS) {
    if (driverVersion == NULL) r = CUDA_ERROR_INVALID_VALUE;
    else *driverVersion = 13000;
  }
  sim__leave();
  return r;
}

/* Descriptions: the name without its prefix, lower case ("CUDA_ERROR_OUT_OF_MEMORY" -> "out of
 * memory"), built once into a static table. */
static const struct { int code; const char *name; } g_names[] = {
#define X(name, code) {code, #name},
#include "tools/cuda_error_names.inc"
#undef X
};
#define NNAMES (sizeof g_names / sizeof g_names[0])
static char g_desc[NNAMES][96];
static pthread_once_t g_desc_once = PTHREAD_ONCE_INIT;

static void desc_once(void) {
  for (size_t i = 0; i < NNAMES; i++) {
    const char *n = g_names[i].name;
    if (strncmp(n, "CUDA_ERROR_", 11) == 0) n += 11;
    else if (strncmp(n, "CUDA_", 5) == 0) n += 5;
    size_t j = 0;
    for (; n[j] && j + 1 < sizeof g_desc[i]; j++) g_desc[i][j] = n[j] == '_' ? ' ' : (char)(n[j] | 0x20);
    g_desc[i][j] = '\0';
  }
}

const char *sim__error_name(CUresult r) {
  for (size_t i = 0; i < NNAMES; i++)
    if (g_names[i].code == (int)r) return g_names[i].name;
  return NULL;
}

static CUresult error_text(CUresult error, const char **out, int describe) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  pthread_once(&g_desc_once, desc_once);
  for (size_t i = 0; i < NNAMES; i++) {
    if (g_names[i].code != (int)error) continue;
    *out = describe ? g_desc[i] : g_names[i].name;
    return CUDA_SUCCESS;
  }
  *out = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  CUresult r = sim__enter(SIM_FN_cuGetErrorName, 0);
  if (r == CUDA_SUCCESS) r = error_text(error, pStr, 0);
  sim__leave();
  return r;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  CUresult r = sim__enter(SIM_FN_cuGetErrorString, 0);
  if (r == CUDA_SUCCESS) r = error_text(error, pStr, 1);
  sim__leave();
  return r;
}

/* ---- the simulator's own API ---- */

static int api_register(const char *name, weft_sim_kernel_fn fn, weft_sim_ranges_fn ranges) {
  config();
  pthread_mutex_lock(&sim.lock);
  int r = sim__register_kernel(name, fn, ranges, -1, NULL);
  pthread_mutex_unlock(&sim.lock);
  return r;
}

static int api_register_params(const char *name, weft_sim_kernel_fn fn, weft_sim_ranges_fn ranges,
                               unsigned nparams, const size_t *param_bytes) {
  if (nparams > 0 && param_bytes == NULL) return -1;
  config();
  pthread_mutex_lock(&sim.lock);
  int r = sim__register_kernel(name, fn, ranges, (int)nparams, param_bytes);
  pthread_mutex_unlock(&sim.lock);
  return r;
}

static uint64_t api_race_count(void) {
  pthread_mutex_lock(&sim.lock);
  uint64_t n = sim.races;
  pthread_mutex_unlock(&sim.lock);
  return n;
}

static size_t api_races(weft_sim_race_t *out, size_t max) {
  pthread_mutex_lock(&sim.lock);
  size_t n = sim.nrace_log < max ? sim.nrace_log : max;
  if (out != NULL && n > 0) memcpy(out, sim.race_log, n * sizeof *out);
  else if (out == NULL) n = 0;
  pthread_mutex_unlock(&sim.lock);
  return n;
}

static void api_reset_races(void) {
  pthread_mutex_lock(&sim.lock);
  sim.races = 0;
  sim.stats.races = 0;
  sim.nrace_log = 0;
  pthread_mutex_unlock(&sim.lock);
}

static void api_print_report(void) {
  pthread_mutex_lock(&sim.lock);
  sim__race_report();
  pthread_mutex_unlock(&sim.lock);
}

static int api_fail(const char *spec) {
  config();
  pthread_mutex_lock(&sim.lock);
  int r = sim__fault_set(spec);
  pthread_mutex_unlock(&sim.lock);
  return r;
}

static void api_seed(uint64_t seed) {
  config();
  pthread_mutex_lock(&sim.lock);
  sim__seed(seed);
  pthread_mutex_unlock(&sim.lock);
}

static void api_stats(weft_sim_stats_t *out) {
  if (out == NULL) return;
  pthread_mutex_lock(&sim.lock);
  *out = sim.stats;
  out->races = sim.races;
  pthread_mutex_unlock(&sim.lock);
}

static int api_set_oracle(int on) {
  config();
  pthread_mutex_lock(&sim.lock);
  int old = sim.oracle;
  sim.oracle = on != 0;
  pthread_mutex_unlock(&sim.lock);
  return old;
}

static const weft_sim_api_t g_api = {
    .version = WEFT_SIM_API_VERSION,
    .register_kernel = api_register,
    .race_count = api_race_count,
    .races = api_races,
    .reset_races = api_reset_races,
    .print_report = api_print_report,
    .fail = api_fail,
    .seed = api_seed,
    .stats = api_stats,
    .set_oracle = api_set_oracle,
    .register_kernel_params = api_register_params,
};

const weft_sim_api_t *weft_sim_get_api(void) { return &g_api; }

const char *weft_sim_version(void) { return "weft-sim 1.0"; }
