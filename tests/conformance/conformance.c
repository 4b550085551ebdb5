/* Conformance: every line of shared/CUDA_SEMANTICS.md that a program can observe, asserted through
 * weft's driver table only, so the same binary runs against the simulator (WEFT_DRIVER=sim, the
 * default under `bazel test`) and against the real driver on a GPU (WEFT_DRIVER unset). Where the
 * two disagree the GPU is right: fix the simulator, not this file.
 *
 * Each case prints "conformance: <what> ok" when it passed, so a GPU log reads as a checklist.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"
#include "tests/util/child.h"
#include "tests/kernels/conformance_kernels.h"
#include "tests/kernels/conformance_kernels_sim.h"

static const weft__driver_t *d;
static CUcontext g_ctx;
static CUcontext g_ctx1; /* device 1's, retained by the first two-device case */
static CUmodule g_mod;
static CUfunction g_fill, g_copy;
static const weft_sim_api_t *g_sim; /* NULL on a GPU */

#define OK(expr) assert_int_equal((int)(expr), (int)CUDA_SUCCESS)
#define IS(code, expr) assert_int_equal((int)(expr), (int)(code))
#define PASS(what) printf("conformance: %s ok\n", what)

static int setup(void **state) {
  (void)state;
  if (weft__driver_get(&d) != WEFT_OK) {
    fprintf(stderr, "conformance: no driver: %s\n", weft_last_error());
    return -1;
  }
  g_sim = weft_sim_api(weft_driver_symbol);
  if (g_sim && weft_conf_register_sim_kernels(g_sim) != 0) return -1;
  if (d->cuDevicePrimaryCtxRetain(&g_ctx, 0) != CUDA_SUCCESS || d->cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) return -1;
  if (d->cuModuleLoadData(&g_mod, conformance_kernels_fatbin) != CUDA_SUCCESS ||
      d->cuModuleGetFunction(&g_fill, g_mod, "weft_conf_fill") != CUDA_SUCCESS ||
      d->cuModuleGetFunction(&g_copy, g_mod, "weft_conf_copy") != CUDA_SUCCESS)
    return -1;
  char name[128] = "";
  d->cuDeviceGetName(name, sizeof name, 0);
  printf("conformance: driver %s (%s), device %s\n", d->info.path, g_sim ? "simulator" : "GPU", name);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  d->cuModuleUnload(g_mod);
  if (g_ctx1 != NULL) d->cuDevicePrimaryCtxRelease(1);
  d->cuDevicePrimaryCtxRelease(0);
  return 0;
}

/* Streams of the running case, destroyed by its teardown (even when it failed half-way). */
static CUstream g_streams[8];
static int g_nstreams;

static CUstream new_stream(void) {
  CUstream s;
  OK(d->cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0));
  assert_true(g_nstreams < 8);
  g_streams[g_nstreams++] = s;
  return s;
}

/* Every case ends with its captures ended, its work finished and no race found (simulator). A
 * case that failed half-way may leave a capture open: end it so the next case starts clean. */
static int check_clean(void **state) {
  (void)state;
  int ok = 1;
  for (int i = 0; i < g_nstreams; i++) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    d->cuStreamIsCapturing(g_streams[i], &st);
    if (st != CU_STREAM_CAPTURE_STATUS_NONE) {
      CUgraph g = NULL;
      CUresult r = d->cuStreamEndCapture(g_streams[i], &g);
      printf("conformance: teardown ended a capture left open (%d)\n", (int)r);
      if (g) d->cuGraphDestroy(g);
    }
  }
  /* Stream by stream, not cuCtxSynchronize: see the note at test_unsafe_calls_... */
  for (int i = 0; i < g_nstreams; i++) {
    CUresult r = d->cuStreamSynchronize(g_streams[i]);
    if (r != CUDA_SUCCESS) {
      printf("conformance: teardown: cuStreamSynchronize -> %d\n", (int)r);
      ok = 0;
    }
  }
  for (int i = 0; i < g_nstreams; i++) d->cuStreamDestroy(g_streams[i]);
  g_nstreams = 0;
  if (g_sim && g_sim->race_count() != 0) {
    g_sim->print_report();
    g_sim->reset_races();
    ok = 0;
  }
  return ok ? 0 : -1;
}

static CUresult fill(CUstream s, CUdeviceptr p, unsigned n, unsigned v) {
  void *pp = (void *)(uintptr_t)p;
  void *args[] = {&pp, &n, &v};
  return d->cuLaunchKernel(g_fill, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, args, NULL);
}

static CUresult copy(CUstream s, CUdeviceptr dst, CUdeviceptr src, unsigned n) {
  void *pd = (void *)(uintptr_t)dst, *ps = (void *)(uintptr_t)src;
  void *args[] = {&pd, &ps, &n};
  return d->cuLaunchKernel(g_copy, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, args, NULL);
}

static unsigned read_at(CUdeviceptr p, unsigned i) {
  unsigned v = 0;
  OK(d->cuMemcpyDtoH(&v, p + (CUdeviceptr)i * 4, 4));
  return v;
}

static size_t count_type(CUgraph g, CUgraphNodeType type) {
  size_t n = 0;
  OK(d->cuGraphGetNodes(g, NULL, &n));
  if (n == 0) return 0; /* an array with room for no node is INVALID_VALUE (test_graph_get_nodes_needs_room) */
  CUgraphNode nodes[32];
  assert_true(n <= 32);
  OK(d->cuGraphGetNodes(g, nodes, &n));
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    CUgraphNodeType t;
    OK(d->cuGraphNodeGetType(nodes[i], &t));
    k += t == type;
  }
  return k;
}

static CUmemoryPool new_pool_max(CUmemAllocationHandleType handles, size_t max_size) {
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  props.handleTypes = handles;
  props.maxSize = max_size;
  CUmemoryPool pool;
  OK(d->cuMemPoolCreate(&pool, &props));
  return pool;
}

static CUmemoryPool new_pool(CUmemAllocationHandleType handles) { return new_pool_max(handles, 0); }

/* ---- stream capture ---- */

static void test_wait_on_outside_event_is_isolation_905_and_invalidates_901(void **state) {
  (void)state;
  CUstream s = new_stream(), o = new_stream();
  CUevent e;
  OK(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  OK(d->cuEventRecord(e, o));
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(905, d->cuStreamWaitEvent(s, e, 0));
  CUstreamCaptureStatus st;
  OK(d->cuStreamIsCapturing(s, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g = NULL;
  IS(901, d->cuStreamEndCapture(s, &g));
  assert_null(g);
  OK(d->cuStreamIsCapturing(s, &st)); /* the failed end ended the capture */
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  OK(d->cuEventDestroy(e));
  PASS("wait on an event recorded outside the capture: ISOLATION (905), then EndCapture INVALIDATED (901), no graph, "
       "and the capture is over");
}

static void test_external_wait_succeeds_as_an_event_wait_node(void **state) {
  (void)state;
  CUstream s = new_stream(), o = new_stream();
  CUevent e;
  OK(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  OK(d->cuEventRecord(e, o));
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuStreamWaitEvent(s, e, CU_EVENT_WAIT_EXTERNAL));
  CUgraph g;
  OK(d->cuStreamEndCapture(s, &g));
  assert_int_equal(count_type(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuEventDestroy(e));
  PASS("the same wait with CU_EVENT_WAIT_EXTERNAL succeeds and becomes an event-wait node");
}

static void test_fork_must_rejoin_or_end_capture_is_unjoined(void **state) {
  (void)state;
  CUstream s = new_stream(), t = new_stream();
  CUevent fork, join;
  OK(d->cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  OK(d->cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr a, b;
  OK(d->cuMemAlloc(&a, 4096));
  OK(d->cuMemAlloc(&b, 4096));
  /* joined: the forked stream's work is in the graph, ordered after the fork point */
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(fill(s, a, 1024, 8));
  OK(d->cuEventRecord(fork, s));
  OK(d->cuStreamWaitEvent(t, fork, 0));
  CUstreamCaptureStatus st;
  OK(d->cuStreamIsCapturing(t, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  OK(copy(t, b, a, 1024));
  OK(d->cuEventRecord(join, t));
  OK(d->cuStreamWaitEvent(s, join, 0));
  CUgraph g;
  OK(d->cuStreamEndCapture(s, &g));
  assert_int_equal(count_type(g, CU_GRAPH_NODE_TYPE_KERNEL), 2);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(b, 1023), 8);
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  /* not joined */
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuEventRecord(fork, s));
  OK(d->cuStreamWaitEvent(t, fork, 0));
  OK(fill(t, a, 1024, 9));
  g = NULL;
  IS(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, d->cuStreamEndCapture(s, &g));
  assert_null(g);
  CUstreamCaptureStatus cs; /* the failed end ended the capture, for both streams */
  OK(d->cuStreamIsCapturing(s, &cs));
  assert_int_equal(cs, CU_STREAM_CAPTURE_STATUS_NONE);
  OK(d->cuStreamIsCapturing(t, &cs));
  printf("probe: the forked stream after an UNJOINED end: capture status %d\n", (int)cs);
  OK(d->cuStreamSynchronize(t));
  OK(d->cuMemFree(a));
  OK(d->cuMemFree(b));
  OK(d->cuEventDestroy(fork));
  OK(d->cuEventDestroy(join));
  PASS("an event recorded in the capture forks another stream into it; not rejoined -> UNJOINED, which ends the capture");
}

static void end_invalidated(CUstream s) {
  CUgraph g = NULL;
  IS(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d->cuStreamEndCapture(s, &g));
  assert_null(g);
}

static void test_pool_attribute_under_global_capture_fails_and_invalidates(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  cuuint64_t v;
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  end_invalidated(s);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  v = 0;
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
  end_invalidated(s);
  OK(d->cuMemPoolDestroy(pool));
  PASS("cuMemPoolGetAttribute / SetAttribute under GLOBAL capture fail (UNSUPPORTED) and invalidate it");
}

/* Note: through weft's table, cuCtxSynchronize on a CUDA 13 driver returns
 * CUDA_ERROR_CONTEXT_IS_DESTROYED (709) even outside capture: lib/core resolves it with
 * cuGetProcAddress at version 13000, which gives cuCtxSynchronize_v2(CUcontext). Under capture the
 * capture check comes first, so the assertion below holds either way. */
static void test_unsafe_calls_under_global_capture_fail_and_invalidate(void **state) {
  (void)state;
  CUstream s = new_stream(), o = new_stream();
  CUdeviceptr p;
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuMemAlloc(&p, 256));
  end_invalidated(s);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuCtxSynchronize());
  end_invalidated(s);
  CUevent e;
  OK(d->cuEventCreate(&e, 0));
  OK(d->cuEventRecord(e, o));
  OK(d->cuEventSynchronize(e));
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuEventQuery(e));
  end_invalidated(s);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuEventSynchronize(e));
  end_invalidated(s);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuStreamSynchronize(s));
  end_invalidated(s);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuStreamSynchronize(o)); /* any stream */
  end_invalidated(s);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuStreamQuery(o));
  end_invalidated(s);
  /* An event recorded in the capture: CAPTURED_EVENT (907), and the capture is invalidated. */
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuEventRecord(e, s));
  IS(CUDA_ERROR_CAPTURED_EVENT, d->cuEventQuery(e));
  end_invalidated(s);
  /* ... after that capture ended the event is unusable until recorded again */
  IS(CUDA_ERROR_INVALID_VALUE, d->cuEventQuery(e));
  IS(CUDA_ERROR_INVALID_VALUE, d->cuStreamWaitEvent(o, e, 0));
  OK(d->cuEventRecord(e, o));
  OK(d->cuEventSynchronize(e));
  /* a synchronous copy is not an unsafe call */
  unsigned host = 0;
  CUdeviceptr dev;
  OK(d->cuMemAlloc(&dev, 256));
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuMemcpyDtoH(&host, dev, 4));
  CUgraph g;
  OK(d->cuStreamEndCapture(s, &g));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemFree(dev));
  OK(d->cuEventDestroy(e));
  PASS("under GLOBAL capture cuMemAlloc, cuCtxSynchronize, event query/sync, stream sync/query of any stream fail "
       "(UNSUPPORTED) and invalidate it; a captured event gives CAPTURED_EVENT; sync copies are allowed");
}

static void test_relaxed_capture_permits_unsafe_calls(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  CUdeviceptr p;
  cuuint64_t v;
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  OK(d->cuMemAlloc(&p, 256));
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  CUgraph g;
  OK(d->cuStreamEndCapture(s, &g));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemFree(p));
  /* a GLOBAL capture with this thread's mode exchanged to RELAXED */
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(d->cuThreadExchangeStreamCaptureMode(&mode));
  assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  OK(d->cuThreadExchangeStreamCaptureMode(&mode));
  OK(d->cuStreamEndCapture(s, &g));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemPoolDestroy(pool));
  PASS("RELAXED capture (or a thread exchanged to RELAXED) permits unsafe calls");
}

typedef struct other {
  CUstream s;
  CUresult alloc, end;
} other_t;

static void *other_alloc(void *arg) {
  other_t *o = arg;
  d->cuCtxSetCurrent(g_ctx);
  CUdeviceptr p = 0;
  o->alloc = d->cuMemAlloc(&p, 256);
  if (o->alloc == CUDA_SUCCESS) d->cuMemFree(p);
  return NULL;
}

static void *other_end(void *arg) {
  other_t *o = arg;
  d->cuCtxSetCurrent(g_ctx);
  CUgraph g = NULL;
  o->end = d->cuStreamEndCapture(o->s, &g);
  if (o->end == CUDA_SUCCESS) d->cuGraphDestroy(g);
  return NULL;
}

static void in_thread(void *(*fn)(void *), other_t *o) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fn, o), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

static void test_capture_modes_across_threads(void **state) {
  (void)state;
  other_t o = {new_stream(), CUDA_SUCCESS, CUDA_SUCCESS};
  OK(d->cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  in_thread(other_alloc, &o);
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, o.alloc);
  end_invalidated(o.s);
  OK(d->cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  in_thread(other_alloc, &o);
  OK(o.alloc);
  CUgraph g;
  OK(d->cuStreamEndCapture(o.s, &g));
  OK(d->cuGraphDestroy(g));
  PASS("GLOBAL capture forbids unsafe calls on other threads; THREAD_LOCAL does not");
}

typedef struct pool_call {
  CUmemoryPool pool;
  CUstream s;
  int relaxed;
  CUresult alloc;
} pool_call_t;

static void *other_pool_alloc(void *arg) {
  pool_call_t *o = arg;
  d->cuCtxSetCurrent(g_ctx);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (o->relaxed) d->cuThreadExchangeStreamCaptureMode(&mode);
  CUdeviceptr p = 0;
  o->alloc = d->cuMemAllocFromPoolAsync(&p, 4096, o->pool, o->s);
  if (o->alloc == CUDA_SUCCESS) d->cuMemFreeAsync(p, o->s);
  if (o->relaxed) d->cuThreadExchangeStreamCaptureMode(&mode);
  return NULL;
}

static void in_pool_thread(pool_call_t *o) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_pool_alloc, o), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

/* Measured on an H200 (driver 580, shared/CUDA_SEMANTICS.md, "What may run while another stream
 * is in a GLOBAL capture"): stream-ordered allocation and free on a stream that is NOT capturing,
 * while another stream is in a GLOBAL capture, fail with 900 and invalidate that capture, from
 * this thread or another; with the calling thread's mode exchanged to RELAXED they succeed. */
static void test_stream_ordered_alloc_free_off_capture_are_unsafe_under_global_capture(void **state) {
  (void)state;
  CUstream c = new_stream(), a = new_stream();
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  CUdeviceptr p, q;
  OK(d->cuMemAllocAsync(&q, 4096, a)); /* to free under capture */
  OK(d->cuStreamSynchronize(a));
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuMemAllocFromPoolAsync(&p, 4096, pool, a));
  end_invalidated(c);
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuMemAllocAsync(&p, 4096, a));
  end_invalidated(c);
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuMemFreeAsync(q, a));
  end_invalidated(c);
  /* the same calls with this thread's mode exchanged to RELAXED: fine, and nothing is captured */
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(d->cuThreadExchangeStreamCaptureMode(&mode));
  OK(d->cuMemAllocFromPoolAsync(&p, 4096, pool, a));
  OK(d->cuMemFreeAsync(p, a));
  OK(d->cuMemAllocAsync(&p, 4096, a));
  OK(d->cuMemFreeAsync(p, a));
  OK(d->cuMemFreeAsync(q, a));
  OK(d->cuThreadExchangeStreamCaptureMode(&mode));
  assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
  CUgraph g;
  OK(d->cuStreamEndCapture(c, &g));
  assert_int_equal(count_type(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC), 0);
  OK(d->cuGraphDestroy(g));
  /* from another thread: plain invalidates, RELAXED on that thread is fine */
  pool_call_t o = {pool, a, 0, CUDA_SUCCESS};
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  in_pool_thread(&o);
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, o.alloc);
  end_invalidated(c);
  o.relaxed = 1;
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  in_pool_thread(&o);
  OK(o.alloc);
  OK(d->cuStreamEndCapture(c, &g));
  OK(d->cuGraphDestroy(g));
  OK(d->cuStreamSynchronize(a));
  OK(d->cuMemPoolDestroy(pool));
  PASS("cuMemAllocFromPoolAsync / cuMemAllocAsync / cuMemFreeAsync on a stream outside a GLOBAL capture fail (UNSUPPORTED) "
       "and invalidate it, from this thread or another; RELAXED on the calling thread permits them");
}

static void test_non_relaxed_capture_must_end_on_its_thread(void **state) {
  (void)state;
  other_t o = {new_stream(), CUDA_SUCCESS, CUDA_SUCCESS};
  OK(d->cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  in_thread(other_end, &o);
  IS(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, o.end);
  CUgraph g = NULL;
  IS(CUDA_ERROR_ILLEGAL_STATE, d->cuStreamEndCapture(o.s, &g)); /* the failed end ended the capture */
  OK(d->cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_RELAXED));
  in_thread(other_end, &o);
  OK(o.end);
  PASS("a non-relaxed capture must end on the thread that began it (WRONG_THREAD, which ends it); a relaxed one need not");
}

static void test_legacy_stream_cannot_be_captured(void **state) {
  (void)state;
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
  PASS("the legacy NULL stream cannot be captured");
}

/* The legacy stream while a blocking stream captures (tools/probes/probe_legacy_capture, H100): a
 * query of it is STREAM_CAPTURE_IMPLICIT and leaves the capture alone; work on it (an event
 * record) is IMPLICIT too and invalidates the capture. A non-blocking stream's capture does not
 * involve the legacy stream. */
static void test_legacy_stream_during_a_blocking_capture(void **state) {
  (void)state;
  CUstream b;
  OK(d->cuStreamCreateWithPriority(&b, 0, 0)); /* blocking */
  assert_true(g_nstreams < 8);
  g_streams[g_nstreams++] = b;
  CUevent e;
  OK(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUstreamCaptureStatus st;
  CUgraph g = NULL;
  OK(d->cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, d->cuStreamGetCaptureInfo(CU_STREAM_LEGACY, &st, NULL, NULL, NULL, NULL, NULL));
  IS(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, d->cuStreamIsCapturing(NULL, &st));
  OK(d->cuStreamEndCapture(b, &g)); /* queries left it alone */
  OK(d->cuGraphDestroy(g));
  g = NULL;
  OK(d->cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(d->cuThreadExchangeStreamCaptureMode(&m));
  CUresult rec = d->cuEventRecord(e, CU_STREAM_LEGACY); /* RELAXED does not help */
  OK(d->cuThreadExchangeStreamCaptureMode(&m));
  IS(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, rec);
  IS(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, d->cuStreamEndCapture(b, &g));
  if (g != NULL) OK(d->cuGraphDestroy(g));
  CUstream nb = new_stream(); /* non-blocking: the legacy stream is free to use */
  OK(d->cuStreamBeginCapture(nb, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuStreamGetCaptureInfo(CU_STREAM_LEGACY, &st, NULL, NULL, NULL, NULL, NULL));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  g = NULL;
  OK(d->cuStreamEndCapture(nb, &g));
  OK(d->cuGraphDestroy(g));
  OK(d->cuEventDestroy(e));
  PASS("the legacy stream during a blocking stream's capture: queries IMPLICIT, work IMPLICIT and invalidates");
}

/* The per-thread stream (CU_STREAM_PER_THREAD) can be captured, unlike the legacy stream: it is
 * the calling thread's own blocking stream. Another thread's per-thread stream is another stream
 * (not capturing), and, a blocking stream, its capture makes the legacy stream IMPLICIT
 * meanwhile. The graph replays on it. */
typedef struct pt_probe {
  CUresult q;
  CUstreamCaptureStatus st;
} pt_probe_t;

static void *other_per_thread(void *arg) {
  pt_probe_t *p = arg;
  d->cuCtxSetCurrent(g_ctx);
  p->q = d->cuStreamIsCapturing(CU_STREAM_PER_THREAD, &p->st);
  return NULL;
}

static void test_per_thread_stream_can_be_captured(void **state) {
  (void)state;
  CUdeviceptr a;
  OK(d->cuMemAlloc(&a, 4096));
  OK(fill(CU_STREAM_PER_THREAD, a, 1024, 5));
  OK(d->cuStreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  OK(d->cuStreamIsCapturing(CU_STREAM_PER_THREAD, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  pt_probe_t p = {CUDA_ERROR_UNKNOWN, CU_STREAM_CAPTURE_STATUS_ACTIVE};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_per_thread, &p), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  OK(p.q);
  assert_int_equal(p.st, CU_STREAM_CAPTURE_STATUS_NONE);
  IS(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, d->cuStreamIsCapturing(CU_STREAM_LEGACY, &st));
  OK(fill(CU_STREAM_PER_THREAD, a, 1024, 6));
  CUgraph g;
  OK(d->cuStreamEndCapture(CU_STREAM_PER_THREAD, &g));
  assert_int_equal(count_type(g, CU_GRAPH_NODE_TYPE_KERNEL), 1);
  OK(d->cuStreamSynchronize(CU_STREAM_PER_THREAD));
  assert_int_equal(read_at(a, 1000), 5); /* captured, not run */
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuGraphLaunch(x, CU_STREAM_PER_THREAD));
  OK(d->cuStreamSynchronize(CU_STREAM_PER_THREAD));
  assert_int_equal(read_at(a, 1000), 6);
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemFree(a));
  PASS("per-thread stream: it can be captured (the legacy stream not); another thread's is another stream; its "
       "capture makes the legacy stream IMPLICIT; the graph replays on it");
}

/* A thread's end: the driver ends the thread's state, its per-thread streams with it, after the
 * thread-exit handlers of __cxa_thread_atexit_impl (the thread's context is still current there,
 * its per-thread stream can be synchronised) and before the destructors of pthread keys made
 * after cuInit (no current context there: INVALID_CONTEXT). A thread whose per-thread stream
 * still has work queued on memory of a stream-ordered pool allocated in its stream order (on it,
 * or on a stream it waited for by an event) when it ends never ends on the GPU (the teardown
 * spins, long after the work is done; the simulator reports a hazard instead); synchronising the
 * stream in such a handler avoids it. The hang is shown in a child process
 * (this program again, WEFT_CONF_CHILD set), killed after 10 s. */
#ifdef __GLIBC__
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso);
#define HAVE_THREAD_ATEXIT() 1
#else
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso) __attribute__((weak));
#define HAVE_THREAD_ATEXIT() (__cxa_thread_atexit_impl != NULL)
#endif
extern void *__dso_handle;

static _Atomic int g_exit_rc = -1, g_key_rc = -1;
static pthread_key_t g_end_key;
static CUdeviceptr g_pool_mem;

static void end_handler(void *arg) {
  (void)arg;
  g_exit_rc = (int)d->cuStreamSynchronize(CU_STREAM_PER_THREAD);
}

static void end_key(void *arg) {
  (void)arg;
  g_key_rc = (int)d->cuStreamSynchronize(CU_STREAM_PER_THREAD);
}

static void *ending_thread(void *arg) {
  (void)arg;
  d->cuCtxSetCurrent(g_ctx);
  d->cuStreamQuery(CU_STREAM_PER_THREAD); /* the stream exists */
  __cxa_thread_atexit_impl(end_handler, NULL, &__dso_handle);
  pthread_setspecific(g_end_key, &g_end_key);
  return NULL;
}

/* The child, in three shapes: threads that each allocate 4 MiB from the device's pool on their
 * per-thread stream, queue a memset of it there and end ("per_thread_end"); the same with a
 * thread-exit handler that synchronises the stream ("..._synced"); threads that only queue a memset
 * of pool memory the main thread allocated on its own stream and synchronised, with no event
 * between ("..._elsewhere"). The main thread frees the memory after each join. Exit 0: every
 * thread ended; 3: the simulator reported the hazard. */
static int g_child_shape; /* 0, 1 (synced), 2 (elsewhere) */

static void *pool_work_thread(void *arg) {
  d->cuCtxSetCurrent(g_ctx);
  if (g_child_shape == 1) __cxa_thread_atexit_impl(end_handler, NULL, &__dso_handle);
  if (g_child_shape == 2 || d->cuMemAllocAsync(&g_pool_mem, 4u << 20, CU_STREAM_PER_THREAD) == CUDA_SUCCESS)
    d->cuMemsetD32Async(g_pool_mem, (unsigned)(uintptr_t)arg, 1u << 20, CU_STREAM_PER_THREAD);
  return NULL;
}

static int child_per_thread_end(const char *mode) {
  g_child_shape = strstr(mode, "_synced") ? 1 : strstr(mode, "_elsewhere") ? 2 : 0;
  if (weft__driver_get(&d) != WEFT_OK) return 2;
  g_sim = weft_sim_api(weft_driver_symbol);
  if (d->cuDevicePrimaryCtxRetain(&g_ctx, 0) != CUDA_SUCCESS || d->cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) return 2;
  CUstream s;
  if (d->cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS) return 2;
  for (uintptr_t i = 0; i < 20; i++) {
    pthread_t t;
    g_pool_mem = 0;
    if (g_child_shape == 2 &&
        (d->cuMemAllocAsync(&g_pool_mem, 4u << 20, s) != CUDA_SUCCESS || d->cuStreamSynchronize(s) != CUDA_SUCCESS))
      return 2;
    if (pthread_create(&t, NULL, pool_work_thread, (void *)i) != 0 || pthread_join(t, NULL) != 0) return 2;
    if (g_pool_mem == 0 || d->cuCtxSynchronize() != CUDA_SUCCESS || d->cuMemFreeAsync(g_pool_mem, s) != CUDA_SUCCESS ||
        d->cuStreamSynchronize(s) != CUDA_SUCCESS)
      return 2;
    if (g_child_shape == 1 && g_exit_rc != CUDA_SUCCESS) return 4;
    if (g_sim != NULL && g_sim->race_count() != 0) return 3;
  }
  if (g_sim != NULL && g_sim->race_count() != 0) return 3;
  return 0;
}

/* Runs the child in `mode`; its exit status, or -1 when it was still running after `seconds`. */
static int run_child(const char *mode, int seconds) {
  extern char **environ;
  setenv("WEFT_CONF_CHILD", mode, 1);
  char *argv[] = {"conformance", NULL};
  pid_t pid;
  int r = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
  unsetenv("WEFT_CONF_CHILD");
  assert_int_equal(r, 0);
  return tu_wait_child(pid, seconds);
}

static void test_per_thread_stream_at_a_threads_end(void **state) {
  (void)state;
  if (!HAVE_THREAD_ATEXIT()) skip(); /* (a C library without it) */
  assert_int_equal(pthread_key_create(&g_end_key, end_key), 0); /* after cuInit */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, ending_thread, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  pthread_key_delete(g_end_key);
  assert_int_equal(g_exit_rc, CUDA_SUCCESS);
  assert_int_equal(g_key_rc, CUDA_ERROR_INVALID_CONTEXT);
  int unsynced = run_child("per_thread_end", 10);
  printf("probe: a child whose threads end with pool work queued on their per-thread streams: %s (%d)\n",
         unsynced == -1 ? "still running after 10 s (killed)" : unsynced == 3 ? "hazard reported" : "ended", unsynced);
  assert_int_equal(unsynced, g_sim != NULL ? 3 : -1);
  assert_int_equal(run_child("per_thread_end_synced", 60), 0);
  assert_int_equal(run_child("per_thread_end_elsewhere", 60), 0);
  PASS("per-thread stream at a thread's end: an exit handler of __cxa_thread_atexit_impl still synchronises it, a "
       "key's destructor finds no context; ended with work queued on pool memory allocated in its stream order, the "
       "thread never ends (synchronised: it does; allocated elsewhere and synchronised by the host: it does)");
}

static void test_capture_info_and_dependency_updates(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr a;
  OK(d->cuMemAlloc(&a, 4096));
  CUstreamCaptureStatus st;
  cuuint64_t id1 = 0, id2 = 0;
  CUgraph g = NULL;
  const CUgraphNode *deps = NULL;
  size_t n = 99;
  OK(d->cuStreamGetCaptureInfo(s, &st, NULL, NULL, NULL, NULL, NULL));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuStreamGetCaptureInfo(s, &st, &id1, &g, &deps, NULL, &n));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_non_null(g);
  assert_int_equal(n, 0);
  OK(fill(s, a, 16, 1));
  OK(d->cuStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &n));
  assert_int_equal(n, 1);
  CUgraphNode first = deps[0];
  OK(d->cuStreamUpdateCaptureDependencies(s, NULL, NULL, 0, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  OK(d->cuStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &n));
  assert_int_equal(n, 0);
  OK(fill(s, a + 1024, 16, 2));
  OK(d->cuStreamUpdateCaptureDependencies(s, &first, NULL, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  OK(d->cuStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &n));
  assert_int_equal(n, 2);
  CUgraph out;
  OK(d->cuStreamEndCapture(s, &out));
  assert_ptr_equal(out, g);
  size_t edges = 99;
  OK(d->cuGraphGetEdges(out, NULL, NULL, NULL, &edges));
  assert_int_equal(edges, 0);
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuStreamGetCaptureInfo(s, &st, &id2, NULL, NULL, NULL, NULL));
  assert_true(id2 != id1);
  CUgraph g2;
  OK(d->cuStreamEndCapture(s, &g2));
  OK(d->cuGraphDestroy(g2));
  OK(d->cuGraphDestroy(out));
  OK(d->cuMemFree(a));
  PASS("cuStreamGetCaptureInfo gives status, a unique id, the graph and dependencies; UpdateCaptureDependencies SETs and ADDs");
}

static void test_captured_work_is_not_in_the_stream(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr a;
  OK(d->cuMemAlloc(&a, 4096));
  OK(fill(s, a, 1024, 5));
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(fill(s, a, 1024, 6));
  CUgraph g;
  OK(d->cuStreamEndCapture(s, &g));
  OK(fill(s, a + 2048, 512, 7)); /* ordered after the fill before the capture */
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(a, 0), 5);
  assert_int_equal(read_at(a, 1000), 7);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(a, 1000), 6);
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemFree(a));
  PASS("captured work is not in the stream: it runs only when the graph is launched");
}

/* ---- graph memory nodes ---- */

/* Captures alloc + fill (value 11) with the allocation not freed; *p gets its address. */
static CUgraph capture_output(CUstream s, size_t bytes, CUdeviceptr *p) {
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuMemAllocAsync(p, bytes, s));
  OK(fill(s, *p, (unsigned)(bytes / 4), 11));
  CUgraph g;
  OK(d->cuStreamEndCapture(s, &g));
  return g;
}

static void test_alloc_in_capture_becomes_a_mem_alloc_node(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  CUdeviceptr p, q;
  OK(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuMemAllocAsync(&p, 4096, s));
  OK(d->cuMemAllocFromPoolAsync(&q, 4096, pool, s));
  OK(d->cuMemFreeAsync(q, s));
  OK(d->cuMemFreeAsync(p, s));
  CUgraph g;
  OK(d->cuStreamEndCapture(s, &g));
  assert_int_equal(count_type(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC), 2);
  assert_int_equal(count_type(g, CU_GRAPH_NODE_TYPE_MEM_FREE), 2);
  CUgraphNode nodes[4];
  size_t n = 4;
  OK(d->cuGraphGetNodes(g, nodes, &n));
  CUDA_MEM_ALLOC_NODE_PARAMS params;
  OK(d->cuGraphMemAllocNodeGetParams(nodes[0], &params));
  assert_int_equal(params.dptr, p);
  assert_int_equal(params.bytesize, 4096);
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemPoolDestroy(pool));
  PASS("cuMemAllocAsync and cuMemAllocFromPoolAsync in capture become mem-alloc nodes (frees: mem-free nodes)");
}

static void test_relaunch_with_live_allocation_then_free_gives_same_address(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr p;
  CUgraph g = capture_output(s, 4096, &p);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(p, 1023), 11);
  IS(CUDA_ERROR_INVALID_VALUE, d->cuGraphLaunch(x, s));
  OK(d->cuMemFreeAsync(p, s));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(p, 0), 11); /* the same address again */
  OK(d->cuMemFreeAsync(p, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  PASS("relaunch while the graph's allocation is live -> INVALID_VALUE; after cuMemFreeAsync it relaunches at the same address");
}

static void test_auto_free_on_launch(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr p;
  CUgraph g = capture_output(s, 4096, &p);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(p, 7), 11);
  OK(d->cuMemFreeAsync(p, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  PASS("AUTO_FREE_ON_LAUNCH frees the live allocation at the next launch");
}

static void test_explicit_alloc_kernel_free_graph_relaunches(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr out;
  OK(d->cuMemAlloc(&out, 4096));
  CUgraph g;
  OK(d->cuGraphCreate(&g, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS ap;
  memset(&ap, 0, sizeof ap);
  ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ap.bytesize = 4096;
  CUgraphNode alloc, k1, k2, fr;
  OK(d->cuGraphAddMemAllocNode(&alloc, g, NULL, 0, &ap));
  void *pt = (void *)(uintptr_t)ap.dptr, *po = (void *)(uintptr_t)out;
  unsigned n = 1024, v = 21;
  void *fill_args[] = {&pt, &n, &v}, *copy_args[] = {&po, &pt, &n};
  CUDA_KERNEL_NODE_PARAMS kp;
  memset(&kp, 0, sizeof kp);
  kp.func = g_fill;
  kp.gridDimX = 8;
  kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 128;
  kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = fill_args;
  OK(d->cuGraphAddKernelNode(&k1, g, &alloc, 1, &kp));
  kp.func = g_copy;
  kp.kernelParams = copy_args;
  OK(d->cuGraphAddKernelNode(&k2, g, &k1, 1, &kp));
  OK(d->cuGraphAddMemFreeNode(&fr, g, &k2, 1, ap.dptr));
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  for (int i = 0; i < 3; i++) OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(out, 1023), 21);
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemFree(out));
  PASS("explicit cuGraphAddMemAllocNode -> kernel -> cuGraphAddMemFreeNode instantiates and relaunches");
}

static void test_second_instantiation_is_not_supported(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr p;
  CUgraph g = capture_output(s, 4096, &p);
  CUgraphExec x, y;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  IS(CUDA_ERROR_NOT_SUPPORTED, d->cuGraphInstantiateWithFlags(&y, g, 0));
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphInstantiateWithFlags(&y, g, 0));
  OK(d->cuGraphExecDestroy(y));
  OK(d->cuGraphDestroy(g));
  PASS("only one instantiation of a graph with memory nodes at a time (second -> NOT_SUPPORTED)");
}

static void test_graph_with_memory_nodes_cannot_be_launched_into_a_capture(void **state) {
  (void)state;
  CUstream s = new_stream(), c = new_stream();
  CUdeviceptr p;
  CUgraph g = capture_output(s, 4096, &p);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuGraphLaunch(x, c));
  end_invalidated(c);
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  PASS("a graph with memory nodes launched into a capture -> UNSUPPORTED, capture invalidated");
}

static void test_destroy_frees_no_live_allocation(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr p, out;
  OK(d->cuMemAlloc(&out, 4096));
  CUgraph g = capture_output(s, 4096, &p);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuDeviceGraphMemTrim(0));
  OK(copy(s, out, p, 1024));
  OK(d->cuStreamSynchronize(s));
  assert_int_equal(read_at(out, 500), 11);
  OK(d->cuMemFreeAsync(p, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuMemFree(out));
  PASS("destroying the graph and its exec frees no live allocation");
}

static cuuint64_t gmem(CUgraphMem_attribute a) {
  cuuint64_t v = 0;
  OK(d->cuDeviceGetGraphMemAttribute(0, a, &v));
  return v;
}

static void test_graph_memory_attributes_and_trim(void **state) {
  (void)state;
  CUstream s = new_stream();
  OK(d->cuDeviceGraphMemTrim(0));
  cuuint64_t used0 = gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
  CUdeviceptr p;
  CUgraph g = capture_output(s, 1 << 20, &p);
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  OK(d->cuGraphLaunch(x, s));
  OK(d->cuStreamSynchronize(s));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= used0 + (1 << 20));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) >= gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) >= gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) >= gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT));
  cuuint64_t zero = 0;
  OK(d->cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
  OK(d->cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) >= used0 + (1 << 20));
  OK(d->cuMemFreeAsync(p, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuDeviceGraphMemTrim(0));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) <= gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH));
  printf("conformance: graph memory after free+trim: used %llu reserved %llu (high %llu)\n",
         (unsigned long long)gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
         (unsigned long long)gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
         (unsigned long long)gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH));
  PASS("graph memory is counted by cuDeviceGetGraphMemAttribute (HIGH resets by setting 0) and trimmed by cuDeviceGraphMemTrim");
}

/* ---- pools ---- */

static void test_pool_defaults_threshold_and_reuse(void **state) {
  (void)state;
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  cuuint64_t t = 1;
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
  assert_int_equal(t, 0);
  const CUmemPool_attribute reuse[] = {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                                       CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                       CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES};
  for (int i = 0; i < 3; i++) {
    int on = 0;
    OK(d->cuMemPoolGetAttribute(pool, reuse[i], &on));
    assert_int_equal(on, 1);
  }
  t = UINT64_MAX;
  OK(d->cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
  t = 0;
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
  assert_int_equal(t, UINT64_MAX);
  CUstream s = new_stream();
  CUdeviceptr p;
  OK(d->cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s));
  OK(d->cuStreamSynchronize(s));
  cuuint64_t used = 0, reserved = 0;
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  assert_true(used >= 1 << 20);
  assert_true(reserved >= used);
  OK(d->cuMemFreeAsync(p, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
  assert_int_equal(used, 0);
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  assert_true(reserved >= 1 << 20); /* cached: the threshold keeps it */
  OK(d->cuMemPoolTrimTo(pool, 0));
  OK(d->cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  assert_int_equal(reserved, 0);
  OK(d->cuMemPoolDestroy(pool));
  PASS("pool release threshold defaults to 0, reuse policies default on, counters and trim work");
}

/* [doc] cuMemPoolCreate: "Applications can control the maximum size of the pool by specifying a
 * non-zero value for CUmemPoolProps::maxSize"; an allocation that would take the pool beyond it
 * fails with CUDA_ERROR_OUT_OF_MEMORY (run this case on a GPU to confirm: tools/run_gpu.sh). */
static void test_pool_max_size_limits_allocations(void **state) {
  (void)state;
  const size_t mib = 1 << 20;
  CUmemoryPool pool = new_pool_max(CU_MEM_HANDLE_TYPE_NONE, 64 * mib);
  CUstream s = new_stream();
  CUdeviceptr p1, p2, p3;
  OK(d->cuMemAllocFromPoolAsync(&p1, 32 * mib, pool, s));
  OK(d->cuMemAllocFromPoolAsync(&p2, 16 * mib, pool, s));
  IS(CUDA_ERROR_OUT_OF_MEMORY, d->cuMemAllocFromPoolAsync(&p3, 32 * mib, pool, s)); /* 80 MiB > 64 */
  IS(CUDA_ERROR_OUT_OF_MEMORY, d->cuMemAllocFromPoolAsync(&p3, 65 * mib, pool, s)); /* alone > 64 */
  OK(d->cuMemFreeAsync(p1, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuMemAllocFromPoolAsync(&p3, 32 * mib, pool, s)); /* the freed 32 MiB can be had again */
  OK(d->cuMemFreeAsync(p3, s));
  OK(d->cuMemFreeAsync(p2, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuMemPoolDestroy(pool));
  PASS("a pool created with CUmemPoolProps.maxSize refuses allocations beyond it (OUT_OF_MEMORY)");
}

static void test_pool_ipc_needs_a_handle_type(void **state) {
  (void)state;
  CUmemoryPool plain = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  int fd = -1;
  IS(CUDA_ERROR_INVALID_VALUE, d->cuMemPoolExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  OK(d->cuMemPoolDestroy(plain));
  CUmemoryPool ipc = new_pool(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  OK(d->cuMemPoolExportToShareableHandle(&fd, ipc, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  assert_true(fd >= 0);
  close(fd);
  /* Under a GLOBAL capture of another stream the export is an unsafe call; RELAXED permits it. */
  CUstream c = new_stream();
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, d->cuMemPoolExportToShareableHandle(&fd, ipc, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  end_invalidated(c);
  OK(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(d->cuThreadExchangeStreamCaptureMode(&mode));
  fd = -1;
  OK(d->cuMemPoolExportToShareableHandle(&fd, ipc, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  OK(d->cuThreadExchangeStreamCaptureMode(&mode));
  assert_true(fd >= 0);
  close(fd);
  CUgraph g;
  OK(d->cuStreamEndCapture(c, &g));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemPoolDestroy(ipc));
  PASS("IPC export needs a handle type at pool creation (else INVALID_VALUE); under another stream's GLOBAL capture "
       "it fails (UNSUPPORTED) and invalidates it, unless the thread is RELAXED");
}

static void test_graph_get_nodes_needs_room(void **state) {
  (void)state;
  CUgraph g;
  OK(d->cuGraphCreate(&g, 0));
  size_t n = 7;
  OK(d->cuGraphGetNodes(g, NULL, &n));
  assert_int_equal(n, 0);
  CUgraphNode nodes[2];
  n = 0;
  IS(CUDA_ERROR_INVALID_VALUE, d->cuGraphGetNodes(g, nodes, &n));
  n = 2;
  OK(d->cuGraphGetNodes(g, nodes, &n));
  assert_int_equal(n, 0);
  OK(d->cuGraphDestroy(g));
  PASS("cuGraphGetNodes with an array and *numNodes = 0 is INVALID_VALUE, even for an empty graph; with room it "
       "answers 0 nodes");
}

/* Stream calls with no context current on the thread (a thread that never called CUDA, or one
 * that set none): the stream-ordered calls weft makes on its streams (a launch, an event record,
 * a wait, a memset, a copy, a graph launch, a stream-ordered allocation and free, a host
 * function, the capture questions) take their context from the stream; only the legacy stream, which names the current
 * context's, needs one (INVALID_CONTEXT without). Each answer is printed before it is checked,
 * so a GPU that answers otherwise shows all its answers at once. */
static void CUDA_CB count_call(void *arg) { atomic_fetch_add((_Atomic int *)arg, 1); }

static void test_stream_calls_need_no_current_context(void **state) {
  (void)state;
  CUstream s = new_stream(), s2 = new_stream();
  CUevent e;
  OK(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr m, m2;
  OK(d->cuMemAlloc(&m, 4096));
  OK(d->cuMemAlloc(&m2, 4096));
  /* A graph that fills m2's second half with 0x99, made while the context is current. */
  CUstream gs = new_stream();
  CUgraph g;
  CUgraphExec x;
  OK(d->cuStreamBeginCapture(gs, CU_STREAM_CAPTURE_MODE_RELAXED));
  OK(d->cuMemsetD32Async(m2 + 2048, 0x99, 512, gs));
  OK(d->cuStreamEndCapture(gs, &g));
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  static _Atomic int called;
  atomic_store(&called, 0);
  OK(d->cuCtxSetCurrent(NULL));
  CUcontext none = (CUcontext)1;
  OK(d->cuCtxGetCurrent(&none));
  enum { N = 13 };
  static const char *const what[N] = {"launch", "record", "wait", "memset", "query", "copy", "graph launch",
                                      "alloc async", "free async", "host function", "capture question",
                                      "capture info", "legacy record"};
  CUresult r[N];
  CUdeviceptr a = 0;
  r[0] = fill(s, m, 1024, 0x77);
  r[1] = d->cuEventRecord(e, s);
  r[2] = d->cuStreamWaitEvent(s2, e, 0);
  r[3] = d->cuMemsetD32Async(m + 2048, 0x55, 512, s2);
  r[4] = d->cuEventQuery(e);
  r[5] = d->cuMemcpyDtoDAsync(m2, m, 2048, s2);
  r[6] = d->cuGraphLaunch(x, s2);
  r[7] = d->cuMemAllocAsync(&a, 4096, s2);
  r[8] = r[7] == CUDA_SUCCESS ? d->cuMemFreeAsync(a, s2) : r[7];
  r[9] = d->cuLaunchHostFunc(s2, count_call, (void *)&called);
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_ACTIVE, cs2 = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  cuuint64_t cid = 1;
  r[10] = d->cuStreamIsCapturing(s2, &cs);
  r[11] = d->cuStreamGetCaptureInfo(s2, &cs2, &cid, NULL, NULL, NULL, NULL);
  r[12] = d->cuEventRecord(e, NULL); /* the legacy stream: the current context's */
  OK(d->cuCtxSetCurrent(g_ctx));
  printf("conformance: no current context (%p):", (void *)none);
  for (int i = 0; i < N; i++) printf(" %s %d%s", what[i], (int)r[i], i + 1 < N ? "," : "\n");
  assert_null(none);
  for (int i = 0; i < N - 1; i++)
    if (i != 4 && r[i] != CUDA_SUCCESS) fail_msg("with no context current, %s: %d, want 0", what[i], (int)r[i]);
  assert_true(r[4] == CUDA_SUCCESS || r[4] == CUDA_ERROR_NOT_READY);
  assert_int_equal(cs, CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(cs2, CU_STREAM_CAPTURE_STATUS_NONE);
  IS(CUDA_ERROR_INVALID_CONTEXT, r[N - 1]);
  OK(d->cuStreamSynchronize(s2));
  assert_int_equal(read_at(m, 0), 0x77);
  assert_int_equal(read_at(m, 511), 0x77);
  assert_int_equal(read_at(m, 512), 0x55);
  assert_int_equal(read_at(m, 1023), 0x55);
  assert_int_equal(read_at(m2, 0), 0x77);
  assert_int_equal(read_at(m2, 511), 0x77);
  assert_int_equal(read_at(m2, 512), 0x99);
  assert_int_equal(atomic_load(&called), 1);
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemFree(m));
  OK(d->cuMemFree(m2));
  OK(d->cuEventDestroy(e));
  PASS("with no context current, launches, event records, waits, memsets, copies, graph launches, stream-ordered "
       "allocations and frees, host functions and capture questions on streams run (the stream names the "
       "context); a record on the legacy stream is INVALID_CONTEXT");
}

static void test_stream_priority_range_and_events(void **state) {
  (void)state;
  int least = 1, greatest = 1;
  OK(d->cuCtxGetStreamPriorityRange(&least, &greatest));
  assert_int_equal(least, 0);
  assert_true(greatest < 0);
  CUstream s = new_stream();
  CUevent a, b, nt;
  OK(d->cuEventCreate(&a, 0));
  OK(d->cuEventCreate(&b, 0));
  OK(d->cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr p;
  OK(d->cuMemAlloc(&p, 1 << 20));
  OK(d->cuEventRecord(a, s));
  OK(fill(s, p, 1 << 18, 3));
  OK(d->cuEventRecord(b, s));
  OK(d->cuEventRecord(nt, s));
  OK(d->cuEventSynchronize(b));
  OK(d->cuEventQuery(a));
  float ms = -1;
  OK(d->cuEventElapsedTime(&ms, a, b));
  assert_true(ms >= 0.0f);
  IS(CUDA_ERROR_INVALID_HANDLE, d->cuEventElapsedTime(&ms, a, nt));
  assert_int_equal(read_at(p, 1000), 3);
  OK(d->cuMemFree(p));
  OK(d->cuEventDestroy(a));
  OK(d->cuEventDestroy(b));
  OK(d->cuEventDestroy(nt));
  PASS("stream priorities range from 0 (least) to negative (greatest); event timing needs timing events");
}

static void test_cuMemAlloc_memory_can_be_freed_in_stream_order(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr p;
  OK(d->cuMemAlloc(&p, 1 << 20));
  OK(fill(s, p, 1024, 1));
  OK(d->cuMemFreeAsync(p, s));
  OK(d->cuStreamSynchronize(s));
  OK(d->cuMemFree(0));
  PASS("cuMemFreeAsync accepts cuMemAlloc memory; cuMemFree(0) succeeds");
}

/* cuGraphLaunch: "each launch is ordered behind both any previous work in hStream and any previous
 * launches of hGraphExec" (the driver API's documentation). A launch on stream 1 held behind
 * other work (an event of stream 3 after a long fill), then a launch of the same exec on idle
 * stream 2: synchronising stream 2 means both launches ran, so a host write after it stays. The
 * simulator used to start the second launch first and run the first afterwards (found by the
 * helper's tests/streams/test_outside_long, lazy simulator). */
static void test_launches_of_one_exec_keep_their_order_across_streams(void **state) {
  (void)state;
  CUstream r1 = new_stream(), r2 = new_stream(), r3 = new_stream();
  const unsigned big = 16u << 20; /* words the fill on stream 3 writes, several times over */
  CUdeviceptr p, q;
  OK(d->cuMemAlloc(&p, 1024));
  OK(d->cuMemAlloc(&q, (size_t)big * 4));
  OK(d->cuStreamBeginCapture(r1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(d->cuMemsetD32Async(p, 7, 256, r1));
  CUgraph g = NULL;
  OK(d->cuStreamEndCapture(r1, &g));
  CUgraphExec x;
  OK(d->cuGraphInstantiateWithFlags(&x, g, 0));
  CUevent ev;
  OK(d->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  for (unsigned k = 0; k < 8; k++) OK(fill(r3, q, big, k));
  OK(d->cuEventRecord(ev, r3));
  OK(d->cuStreamWaitEvent(r1, ev, 0));
  OK(d->cuGraphLaunch(x, r1));
  OK(d->cuGraphLaunch(x, r2));
  OK(d->cuStreamSynchronize(r2)); /* both launches have run */
  unsigned host[256], zero[256] = {0};
  OK(d->cuMemcpyHtoD(p, zero, sizeof zero));
  OK(d->cuStreamSynchronize(r1));
  OK(d->cuStreamSynchronize(r3));
  OK(d->cuMemcpyDtoH(host, p, sizeof host));
  for (unsigned i = 0; i < 256; i++)
    if (host[i] != 0) fail_msg("word %u is %u: a launch of the exec ran after the host's write", i, host[i]);
  OK(d->cuEventDestroy(ev));
  OK(d->cuGraphExecDestroy(x));
  OK(d->cuGraphDestroy(g));
  OK(d->cuMemFree(q));
  OK(d->cuMemFree(p));
  PASS("launches of one exec on two streams run in launch order");
}

/* Measured on an H200 (driver 580): cuStreamWriteValue32 / WaitValue32 accept cuMemAlloc
 * memory but return INVALID_VALUE for memory from a stream-ordered pool. */
static void test_stream_memory_operations_need_cuMemAlloc_memory(void **state) {
  (void)state;
  CUstream s = new_stream();
  CUdeviceptr plain, pooled;
  OK(d->cuMemAlloc(&plain, 4096));
  OK(d->cuMemAllocAsync(&pooled, 4096, s));
  OK(d->cuStreamWriteValue32(s, plain, 7, 0));
  OK(d->cuStreamWaitValue32(s, plain, 7, CU_STREAM_WAIT_VALUE_GEQ));
  IS(CUDA_ERROR_INVALID_VALUE, d->cuStreamWriteValue32(s, pooled, 7, 0));
  IS(CUDA_ERROR_INVALID_VALUE, d->cuStreamWaitValue32(s, pooled, 0, CU_STREAM_WAIT_VALUE_GEQ));
  IS(CUDA_ERROR_INVALID_VALUE, d->cuStreamWriteValue32(s, plain, 7, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
  OK(d->cuMemFreeAsync(pooled, s));
  OK(d->cuStreamSynchronize(s));
  unsigned v = 0;
  OK(d->cuMemcpyDtoH(&v, plain, 4));
  assert_int_equal(v, 7);
  OK(d->cuMemFree(plain));
  PASS("stream memory operations work on cuMemAlloc memory, return INVALID_VALUE on pool memory");
}

/* ---- two devices (issue 14; 2 x H100, driver 580.159.04; skipped with one device) ---- */

/* Device 1's primary context, retained once for the program (g_ctx1, declared at the top:
 * streams made in it die with it, and each case's teardown still synchronises them); the case
 * skips without a second device. */
static CUcontext second_device(void) {
  int n = 0;
  OK(d->cuDeviceGetCount(&n));
  if (n < 2 || d->cuDeviceCanAccessPeer == NULL) skip();
  if (g_ctx1 == NULL) OK(d->cuDevicePrimaryCtxRetain(&g_ctx1, 1));
  return g_ctx1;
}

static void test_two_devices_peer_access_rules(void **state) {
  (void)state;
  CUcontext c1 = second_device();
  int can = -1;
  OK(d->cuDeviceCanAccessPeer(&can, 0, 1));
  assert_int_equal(can, 1);
  OK(d->cuDeviceCanAccessPeer(&can, 0, 0));
  assert_int_equal(can, 0); /* not its own peer */
  IS(CUDA_ERROR_INVALID_DEVICE, d->cuDeviceCanAccessPeer(&can, 0, 64));
  OK(d->cuCtxSetCurrent(g_ctx));
  IS(CUDA_ERROR_INVALID_VALUE, d->cuCtxEnablePeerAccess(c1, 1));
  IS(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, d->cuCtxEnablePeerAccess(g_ctx, 0));
  IS(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, d->cuCtxDisablePeerAccess(c1));
  OK(d->cuCtxEnablePeerAccess(c1, 0));
  IS(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, d->cuCtxEnablePeerAccess(c1, 0));
  OK(d->cuCtxDisablePeerAccess(c1));
  IS(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, d->cuCtxDisablePeerAccess(c1));
  PASS("peer access: 0 <-> 1 yes, a device is not its own peer, flags 0, enable/disable once");
}

static void test_two_devices_events_wait_across_record_only_at_home(void **state) {
  (void)state;
  CUcontext c1 = second_device();
  OK(d->cuCtxSetCurrent(g_ctx));
  CUstream s0 = new_stream();
  CUevent e0;
  OK(d->cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr m0, m1;
  OK(d->cuMemAlloc(&m0, 1 << 20));
  OK(d->cuCtxSetCurrent(c1));
  CUstream s1 = new_stream();
  OK(d->cuMemAlloc(&m1, 1 << 20));
  size_t fr = 0, total = 0, total0 = 0;
  OK(d->cuMemGetInfo(&fr, &total));
  OK(d->cuDeviceTotalMem(&total0, 1));
  assert_true(total > 0 && total <= total0);
  /* Device 0's work, then device 1 waits on its event and copies the data over (unified
   * addressing; no peer access needed for a copy). */
  OK(d->cuMemsetD32Async(m0, 0x5eed, (1 << 20) / 4, s0));
  OK(d->cuEventRecord(e0, s0)); /* the current context does not matter */
  OK(d->cuStreamWaitEvent(s1, e0, 0));
  IS(CUDA_ERROR_INVALID_HANDLE, d->cuEventRecord(e0, s1)); /* an event records only at home */
  OK(d->cuMemcpyDtoDAsync(m1, m0, 1 << 20, s1));
  OK(d->cuStreamSynchronize(s1));
  assert_int_equal(read_at(m1, 0), 0x5eed);
  assert_int_equal(read_at(m1, (1 << 18) - 1), 0x5eed);
  /* A memset of another device's memory is refused without peer access, allowed with it. */
  IS(CUDA_ERROR_INVALID_VALUE, d->cuMemsetD32Async(m0, 7, 256, s1));
  OK(d->cuCtxEnablePeerAccess(g_ctx, 0)); /* device 1 may access device 0's memory */
  OK(d->cuMemsetD32Async(m0, 7, 256, s1));
  OK(d->cuStreamSynchronize(s1));
  assert_int_equal(read_at(m0, 0), 7);
  OK(d->cuCtxDisablePeerAccess(g_ctx));
  OK(d->cuMemcpyPeerAsync(m1, c1, m0, g_ctx, 1024, s1));
  OK(d->cuStreamSynchronize(s1));
  assert_int_equal(read_at(m1, 0), 7);
  OK(d->cuMemFree(m1));
  OK(d->cuCtxSetCurrent(g_ctx));
  OK(d->cuMemFree(m0));
  OK(d->cuEventDestroy(e0));
  PASS("events: any device waits on them, they record only on their device; copies cross devices; "
       "memsets of a peer's memory need peer access");
}

/* ---- host copies and page-locked memory ----
 * A stream-ordered copy to pageable host memory returns only once the copy has run (the driver
 * stages it), so only once its stream has reached it; to page-locked memory (cuMemHostAlloc) it
 * returns at once. The stream is held by a host function that waits for a flag: a helper thread
 * sets it once the caller says it returned, or after 300 ms (then the copy had blocked). The
 * driver knows page-locked memory as host memory (cuPointerGetAttribute MEMORY_TYPE) and refuses
 * pageable memory (INVALID_VALUE). weft stages pageable copies through page-locked buffers for
 * this (lib/runtime/runtime.h, "staging"). */
static _Atomic int g_returned, g_released;

static void CUDA_CB hold_until_released(void *arg) {
  (void)arg;
  while (!atomic_load(&g_released)) {
    struct timespec t = {0, 100000};
    nanosleep(&t, NULL);
  }
}

static void *release_later(void *arg) {
  (void)arg;
  for (int i = 0; i < 3000 && !atomic_load(&g_returned); i++) {
    struct timespec t = {0, 100000};
    nanosleep(&t, NULL);
  }
  atomic_store(&g_released, 1);
  return NULL;
}

/* Whether a copy of `bytes` between `dev` and `host` (to the host, or from it) returned before
 * the stream reached it. */
static int copy_returned_early_n(CUstream s, CUdeviceptr dev, void *host, size_t bytes, int to_host) {
  atomic_store(&g_returned, 0);
  atomic_store(&g_released, 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, release_later, NULL), 0);
  OK(d->cuLaunchHostFunc(s, hold_until_released, NULL));
  if (to_host) OK(d->cuMemcpyDtoHAsync(host, dev, bytes, s));
  else OK(d->cuMemcpyHtoDAsync(dev, host, bytes, s));
  int early = !atomic_load(&g_released);
  atomic_store(&g_returned, 1);
  assert_int_equal(pthread_join(th, NULL), 0);
  OK(d->cuStreamSynchronize(s));
  return early;
}

static int copy_returned_early(CUstream s, CUdeviceptr dev, void *host) { return copy_returned_early_n(s, dev, host, 16, 1); }

static void test_a_pageable_device_to_host_copy_waits_for_its_stream(void **state) {
  (void)state;
  if (d->cuMemHostAlloc == NULL || d->cuPointerGetAttribute == NULL) skip();
  CUstream s = new_stream();
  CUdeviceptr dev;
  OK(d->cuMemAlloc(&dev, 64));
  CUstream init = new_stream();
  OK(d->cuMemsetD32Async(dev, 77, 16, init));
  OK(d->cuStreamSynchronize(init));
  unsigned pageable[4] = {0}, *pinned = NULL;
  OK(d->cuMemHostAlloc((void **)&pinned, 4096, 0));
  unsigned type = 0;
  OK(d->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)pinned));
  assert_int_equal(type, CU_MEMORYTYPE_HOST);
  OK(d->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)(pinned + 1023)));
  assert_int_equal(type, CU_MEMORYTYPE_HOST);
  OK(d->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev));
  assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
  IS(CUDA_ERROR_INVALID_VALUE, d->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)pageable));
  assert_false(copy_returned_early(s, dev, pageable));
  assert_int_equal(pageable[3], 77);
  /* (The simulator may run queued work, the host function too, inside any call: its progress.) */
  int early = copy_returned_early(s, dev, pinned);
  if (g_sim == NULL) assert_true(early);
  assert_int_equal(pinned[3], 77);
  /* Measured, not asserted: whether a pageable host-to-device copy waits for its stream (the
   * driver may stage it into page-locked memory at once, or wait; weft stages it either way). */
  if (g_sim == NULL) {
    const size_t big = 8u << 20;
    CUdeviceptr dbig;
    OK(d->cuMemAlloc(&dbig, big));
    unsigned char *hbig = calloc(1, big);
    assert_non_null(hbig);
    int small_early = copy_returned_early_n(s, dev, pageable, 16, 0);
    int big_early = copy_returned_early_n(s, dbig, hbig, big, 0);
    printf("conformance: measured: a pageable host-to-device copy of 16 B returned %s its stream reached it, of 8 MiB %s\n",
           small_early ? "before" : "after", big_early ? "before" : "after");
    free(hbig);
    OK(d->cuMemFree(dbig));
  }
  OK(d->cuMemFreeHost(pinned));
  OK(d->cuMemFree(dev));
  PASS("a pageable device-to-host copy returns once its stream reached it; a page-locked one at once");
}

static void test_two_devices_pool_access(void **state) {
  (void)state;
  CUcontext c1 = second_device();
  OK(d->cuCtxSetCurrent(g_ctx));
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool p0;
  OK(d->cuMemPoolCreate(&p0, &props));
  CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
  CUmemAccess_flags fl;
  OK(d->cuMemPoolGetAccess(&fl, p0, &l0));
  assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  OK(d->cuMemPoolGetAccess(&fl, p0, &l1));
  assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUmemAccessDesc own = {l0, CU_MEM_ACCESS_FLAGS_PROT_NONE}, rw = {l1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
                  none = {l1, CU_MEM_ACCESS_FLAGS_PROT_NONE}, far = {{CU_MEM_LOCATION_TYPE_DEVICE, 64}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  IS(CUDA_ERROR_INVALID_DEVICE, d->cuMemPoolSetAccess(p0, &own, 1));
  IS(CUDA_ERROR_INVALID_DEVICE, d->cuMemPoolSetAccess(p0, &far, 1));
  OK(d->cuMemPoolSetAccess(p0, &rw, 1));
  OK(d->cuMemPoolGetAccess(&fl, p0, &l1));
  assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  /* A stream of device 1 allocates from device 0's pool, and with access writes it. */
  OK(d->cuCtxSetCurrent(c1));
  CUstream s1 = new_stream();
  CUdeviceptr q = 0;
  OK(d->cuMemAllocFromPoolAsync(&q, 4096, p0, s1));
  OK(d->cuMemsetD32Async(q, 9, 1024, s1));
  OK(d->cuStreamSynchronize(s1));
  assert_int_equal(read_at(q, 1023), 9);
  OK(d->cuMemFreeAsync(q, s1));
  OK(d->cuStreamSynchronize(s1));
  OK(d->cuMemPoolSetAccess(p0, &none, 1));
  OK(d->cuMemPoolGetAccess(&fl, p0, &l1));
  assert_int_equal(fl, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  OK(d->cuMemAllocFromPoolAsync(&q, 4096, p0, s1)); /* allocation needs no access */
  OK(d->cuMemFreeAsync(q, s1));
  OK(d->cuStreamSynchronize(s1));
  /* Copying device 0's pool memory on device 1's stream: cuMemcpyDtoDAsync needs the pool's
   * access, cuMemcpyPeerAsync does not; on device 0's stream it needs nothing. */
  CUdeviceptr m1;
  OK(d->cuMemAlloc(&m1, 4096));
  OK(d->cuMemAllocFromPoolAsync(&q, 4096, p0, s1));
  OK(d->cuStreamSynchronize(s1));
  IS(CUDA_ERROR_INVALID_VALUE, d->cuMemcpyDtoDAsync(m1, q, 4096, s1));
  OK(d->cuMemcpyPeerAsync(m1, c1, q, g_ctx, 4096, s1));
  OK(d->cuStreamSynchronize(s1));
  /* A synchronous copy to or from the host in device 1's context needs the access too (2 x H100:
   * reading device 0's pool memory so failed, tests/torch:test_torch_threads' first GPU run). */
  unsigned word = 0;
  IS(CUDA_ERROR_INVALID_VALUE, d->cuMemcpyDtoH(&word, q, 4));
  IS(CUDA_ERROR_INVALID_VALUE, d->cuMemcpyHtoD(q, &word, 4));
  OK(d->cuMemPoolSetAccess(p0, &rw, 1));
  OK(d->cuMemcpyDtoDAsync(m1, q, 4096, s1));
  OK(d->cuStreamSynchronize(s1));
  OK(d->cuMemcpyDtoH(&word, q, 4));
  OK(d->cuMemFreeAsync(q, s1));
  OK(d->cuStreamSynchronize(s1));
  OK(d->cuMemFree(m1));
  OK(d->cuCtxSetCurrent(g_ctx));
  OK(d->cuMemPoolDestroy(p0));
  PASS("pools: their own device always has access, others none until cuMemPoolSetAccess; "
       "another device's stream may allocate from them, copies their memory with cuMemcpyPeerAsync, "
       "and with cuMemcpyDtoDAsync, cuMemcpyDtoH or cuMemcpyHtoD only with access");
}

/* A peer copy cannot be captured: cuMemcpyPeerAsync on a capturing stream fails with
 * STREAM_CAPTURE_UNSUPPORTED and invalidates the capture (2 x H100, driver 580.159.04), while a
 * device-to-device copy of memory the stream's device may access is captured as a memcpy node.
 * (weft refuses a copy between devices inside a capture before calling the driver.) */
static void test_two_devices_peer_copy_is_not_capturable(void **state) {
  (void)state;
  CUcontext c1 = second_device();
  OK(d->cuCtxSetCurrent(g_ctx));
  CUdeviceptr m0;
  OK(d->cuMemAlloc(&m0, 4096));
  OK(d->cuCtxSetCurrent(c1));
  CUstream s1 = new_stream();
  CUdeviceptr m1;
  OK(d->cuMemAlloc(&m1, 4096));
  OK(d->cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
  CUresult r = d->cuMemcpyPeerAsync(m1, c1, m0, g_ctx, 4096, s1);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  OK(d->cuStreamIsCapturing(s1, &st));
  printf("conformance: cuMemcpyPeerAsync in a capture -> %d, capture status %d\n", (int)r, (int)st);
  CUgraph g = NULL;
  CUresult e = d->cuStreamEndCapture(s1, &g);
  if (g != NULL) OK(d->cuGraphDestroy(g));
  IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, r);
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  IS(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, e);
  OK(d->cuMemFree(m1));
  OK(d->cuCtxSetCurrent(g_ctx));
  OK(d->cuMemFree(m0));
  PASS("a peer copy on a capturing stream fails with STREAM_CAPTURE_UNSUPPORTED and invalidates the capture");
}

#define CASE(f) cmocka_unit_test_teardown(f, check_clean)

int main(void) {
  const char *child = getenv("WEFT_CONF_CHILD");
  if (child != NULL) return child_per_thread_end(child);
  const struct CMUnitTest tests[] = {
      CASE(test_a_pageable_device_to_host_copy_waits_for_its_stream),
      CASE(test_wait_on_outside_event_is_isolation_905_and_invalidates_901),
      CASE(test_external_wait_succeeds_as_an_event_wait_node),
      CASE(test_fork_must_rejoin_or_end_capture_is_unjoined),
      CASE(test_pool_attribute_under_global_capture_fails_and_invalidates),
      CASE(test_unsafe_calls_under_global_capture_fail_and_invalidate),
      CASE(test_relaxed_capture_permits_unsafe_calls),
      CASE(test_capture_modes_across_threads),
      CASE(test_stream_ordered_alloc_free_off_capture_are_unsafe_under_global_capture),
      CASE(test_non_relaxed_capture_must_end_on_its_thread),
      CASE(test_legacy_stream_cannot_be_captured),
      CASE(test_legacy_stream_during_a_blocking_capture),
      CASE(test_per_thread_stream_can_be_captured),
      CASE(test_per_thread_stream_at_a_threads_end),
      CASE(test_capture_info_and_dependency_updates),
      CASE(test_captured_work_is_not_in_the_stream),
      CASE(test_alloc_in_capture_becomes_a_mem_alloc_node),
      CASE(test_relaunch_with_live_allocation_then_free_gives_same_address),
      CASE(test_auto_free_on_launch),
      CASE(test_explicit_alloc_kernel_free_graph_relaunches),
      CASE(test_second_instantiation_is_not_supported),
      CASE(test_graph_with_memory_nodes_cannot_be_launched_into_a_capture),
      CASE(test_destroy_frees_no_live_allocation),
      CASE(test_graph_memory_attributes_and_trim),
      CASE(test_pool_defaults_threshold_and_reuse),
      CASE(test_pool_max_size_limits_allocations),
      CASE(test_pool_ipc_needs_a_handle_type),
      CASE(test_graph_get_nodes_needs_room),
      CASE(test_stream_calls_need_no_current_context),
      CASE(test_stream_priority_range_and_events),
      CASE(test_cuMemAlloc_memory_can_be_freed_in_stream_order),
      CASE(test_launches_of_one_exec_keep_their_order_across_streams),
      CASE(test_stream_memory_operations_need_cuMemAlloc_memory),
      CASE(test_two_devices_peer_access_rules),
      CASE(test_two_devices_events_wait_across_record_only_at_home),
      CASE(test_two_devices_pool_access),
      CASE(test_two_devices_peer_copy_is_not_capturable),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
