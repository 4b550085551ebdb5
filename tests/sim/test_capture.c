/* Stream capture as CUDA_SEMANTICS.md says: isolation and invalidation, external waits, fork and
 * join, UNJOINED, unsafe calls per capture mode, the wrong thread, the legacy stream, capture
 * info and dependency updates, and captured work that does not run until launched. */
#include <pthread.h>
#include <string.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

static size_t node_count(CUgraph g, CUgraphNodeType type) {
  CUgraphNode nodes[64];
  size_t n = 64, k = 0;
  CU_OK(cuGraphGetNodes(g, nodes, &n));
  for (size_t i = 0; i < n; i++) {
    CUgraphNodeType t;
    CU_OK(cuGraphNodeGetType(nodes[i], &t));
    k += t == type;
  }
  return k;
}

static void test_wait_on_event_from_outside_is_isolation_and_invalidates(void **state) {
  (void)state;
  CUstream s = sim_test_stream(), o = sim_test_stream();
  CUevent e;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventRecord(e, o));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cuStreamWaitEvent(s, e, 0));
  CUstreamCaptureStatus st;
  CU_OK(cuStreamIsCapturing(s, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph g = (CUgraph)1;
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));
  assert_null(g);
  CU_OK(cuStreamIsCapturing(s, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(o));
}

static void test_external_wait_becomes_an_event_wait_node(void **state) {
  (void)state;
  CUstream s = sim_test_stream(), o = sim_test_stream();
  CUevent e;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventRecord(e, o));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(cuStreamWaitEvent(s, e, CU_EVENT_WAIT_EXTERNAL));
  CU_OK(cuEventRecordWithFlags(e, s, CU_EVENT_RECORD_EXTERNAL));
  CUgraph g;
  CU_OK(cuStreamEndCapture(s, &g));
  assert_int_equal(node_count(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  assert_int_equal(node_count(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(o));
}

static void test_fork_and_join_capture_both_streams(void **state) {
  (void)state;
  CUstream s = sim_test_stream(), t = sim_test_stream();
  CUevent fork, join;
  CU_OK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr a, b;
  CU_OK(cuMemAlloc(&a, 4096));
  CU_OK(cuMemAlloc(&b, 4096));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(sim_test_fill(s, a, 1024, 1));
  CU_OK(cuEventRecord(fork, s));
  CU_OK(cuStreamWaitEvent(t, fork, 0));
  CUstreamCaptureStatus st;
  CU_OK(cuStreamIsCapturing(t, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(sim_test_copy(t, b, a, 512));         /* reads the first half of a */
  CU_OK(sim_test_fill(s, a + 2048, 512, 3));  /* writes the second half */
  CU_OK(cuEventRecord(join, t));
  CU_OK(cuStreamWaitEvent(s, join, 0));
  CUgraph g;
  CU_OK(cuStreamEndCapture(s, &g));
  CU_OK(cuStreamIsCapturing(t, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(node_count(g, CU_GRAPH_NODE_TYPE_KERNEL), 3);
  size_t edges = 0;
  CU_OK(cuGraphGetEdges(g, NULL, NULL, NULL, &edges));
  assert_int_equal(edges, 2); /* fill -> copy, fill -> fill2 */
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(b, 0), 1);
  assert_int_equal(sim_test_read(a, 600), 3);
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuMemFree(a));
  CU_OK(cuMemFree(b));
  CU_OK(cuEventDestroy(fork));
  CU_OK(cuEventDestroy(join));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(t));
}

static void test_forked_stream_not_rejoined_is_unjoined(void **state) {
  (void)state;
  CUstream s = sim_test_stream(), t = sim_test_stream();
  CUevent fork;
  CU_OK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr a;
  CU_OK(cuMemAlloc(&a, 4096));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(cuEventRecord(fork, s));
  CU_OK(cuStreamWaitEvent(t, fork, 0));
  CU_OK(sim_test_fill(t, a, 1024, 1));
  CUgraph g = (CUgraph)1;
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, cuStreamEndCapture(s, &g));
  assert_null(g);
  CUstreamCaptureStatus st;
  CU_OK(cuStreamIsCapturing(t, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(cuMemFree(a));
  CU_OK(cuEventDestroy(fork));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(t));
}

/* Ends a capture expected to be invalidated by an unsafe call. */
static void expect_invalidated(CUstream s) {
  CUgraph g;
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));
}

static void test_unsafe_calls_fail_and_invalidate_a_global_capture(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  cuuint64_t v;
  CUevent e;
  CU_OK(cuEventCreate(&e, 0));
  unsigned host = 0;
  CUdeviceptr d;
  CU_OK(cuMemAlloc(&d, 256));
  CUmemoryPool pool;
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CU_OK(cuMemPoolCreate(&pool, &props));

  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&p, 256));
  expect_invalidated(s);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  expect_invalidated(s);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemPoolTrimTo(pool, 0));
  expect_invalidated(s);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuCtxSynchronize());
  expect_invalidated(s);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemPoolCreate(&pool, &props));
  expect_invalidated(s);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuEventQuery(e)); /* an event recorded outside */
  expect_invalidated(s);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(cuEventRecord(e, s));
  CU_IS(CUDA_ERROR_CAPTURED_EVENT, cuEventQuery(e)); /* a captured event */
  expect_invalidated(s);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuEventQuery(e)); /* last recorded in an ended capture */
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuStreamWaitEvent(s, e, 0));
  CU_OK(cuEventRecord(e, s));
  CU_OK(cuEventSynchronize(e));
  CUstream other = sim_test_stream();
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(other)); /* any stream */
  expect_invalidated(s);
  CU_OK(cuStreamDestroy(other));
  /* a synchronous copy is not an unsafe call */
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(cuMemcpyDtoH(&host, d, 4));
  CUgraph ok_graph;
  CU_OK(cuStreamEndCapture(s, &ok_graph));
  CU_OK(cuGraphDestroy(ok_graph));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(s));
  expect_invalidated(s);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamQuery(s));
  expect_invalidated(s);
  /* once invalidated, captured calls say so */
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&p, 256));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, sim_test_fill(s, d, 64, 1));
  expect_invalidated(s);

  CU_OK(cuMemPoolDestroy(pool));
  CU_OK(cuMemFree(d));
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(s));
}

static void test_relaxed_capture_permits_unsafe_calls(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(cuMemAlloc(&p, 256));
  CU_OK(cuMemFree(p));
  CUgraph g;
  CU_OK(cuStreamEndCapture(s, &g));
  CU_OK(cuGraphDestroy(g));
  /* a GLOBAL capture, with this thread's mode exchanged to RELAXED */
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_OK(cuThreadExchangeStreamCaptureMode(&mode));
  assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CU_OK(cuMemAlloc(&p, 256));
  CU_OK(cuMemFree(p));
  CU_OK(cuThreadExchangeStreamCaptureMode(&mode));
  assert_int_equal(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
  CU_OK(cuStreamEndCapture(s, &g));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuStreamDestroy(s));
}

typedef struct other {
  CUstream s;
  CUresult alloc, end;
} other_t;

static void *other_thread_allocates(void *arg) {
  other_t *o = arg;
  sim_test_thread_init();
  CUdeviceptr p = 0;
  o->alloc = cuMemAlloc(&p, 256);
  if (o->alloc == CUDA_SUCCESS) cuMemFree(p);
  return NULL;
}

static void *other_thread_ends(void *arg) {
  other_t *o = arg;
  sim_test_thread_init();
  CUgraph g = NULL;
  o->end = cuStreamEndCapture(o->s, &g);
  return NULL;
}

static void run_in_thread(void *(*fn)(void *), other_t *o) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fn, o), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

static void test_global_capture_forbids_unsafe_calls_on_other_threads(void **state) {
  (void)state;
  other_t o = {sim_test_stream(), CUDA_SUCCESS, CUDA_SUCCESS};
  CU_OK(cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  run_in_thread(other_thread_allocates, &o);
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, o.alloc);
  expect_invalidated(o.s);
  CU_OK(cuStreamDestroy(o.s));
}

static void test_thread_local_capture_forbids_only_its_own_thread(void **state) {
  (void)state;
  other_t o = {sim_test_stream(), CUDA_SUCCESS, CUDA_SUCCESS};
  CU_OK(cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  run_in_thread(other_thread_allocates, &o);
  CU_OK(o.alloc);
  CUdeviceptr p;
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&p, 256));
  expect_invalidated(o.s);
  CU_OK(cuStreamDestroy(o.s));
}

static void test_non_relaxed_capture_must_end_on_its_thread(void **state) {
  (void)state;
  other_t o = {sim_test_stream(), CUDA_SUCCESS, CUDA_SUCCESS};
  CU_OK(cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  run_in_thread(other_thread_ends, &o);
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, o.end);
  CUgraph g;
  CU_IS(CUDA_ERROR_ILLEGAL_STATE, cuStreamEndCapture(o.s, &g)); /* the failed end ended it */
  /* a relaxed capture may end anywhere */
  CU_OK(cuStreamBeginCapture(o.s, CU_STREAM_CAPTURE_MODE_RELAXED));
  run_in_thread(other_thread_ends, &o);
  CU_OK(o.end);
  CU_OK(cuStreamDestroy(o.s));
}

static void test_legacy_stream_cannot_be_captured(void **state) {
  (void)state;
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_RELAXED));
}

static void test_capture_info_and_dependency_updates(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr a;
  CU_OK(cuMemAlloc(&a, 4096));
  CUstreamCaptureStatus st;
  cuuint64_t id1 = 0, id2 = 0;
  CUgraph g = NULL;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL;
  size_t n = 99;
  CU_OK(cuStreamGetCaptureInfo(s, &st, NULL, NULL, NULL, NULL, NULL));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(cuStreamGetCaptureInfo(s, &st, &id1, &g, &deps, &edges, &n));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_non_null(g);
  assert_int_equal(n, 0);
  CU_OK(sim_test_fill(s, a, 16, 1));
  CU_OK(cuStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, &edges, &n));
  assert_int_equal(n, 1);
  CUgraphNode first = deps[0];
  CUgraphNodeType t;
  CU_OK(cuGraphNodeGetType(first, &t));
  assert_int_equal(t, CU_GRAPH_NODE_TYPE_KERNEL);
  CU_OK(cuStreamUpdateCaptureDependencies(s, NULL, NULL, 0, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  CU_OK(sim_test_fill(s, a + 1024, 16, 2)); /* no dependency on the first */
  CU_OK(cuStreamUpdateCaptureDependencies(s, &first, NULL, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  CU_OK(cuStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &n));
  assert_int_equal(n, 2);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuStreamUpdateCaptureDependencies(s, &first, NULL, 1, 7));
  CUgraph out;
  CU_OK(cuStreamEndCapture(s, &out));
  assert_ptr_equal(out, g);
  size_t edge_count;
  CU_OK(cuGraphGetEdges(out, NULL, NULL, NULL, &edge_count));
  assert_int_equal(edge_count, 0);
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(cuStreamGetCaptureInfo(s, &st, &id2, NULL, NULL, NULL, NULL));
  assert_true(id2 != id1);
  CUgraph g2;
  CU_OK(cuStreamEndCapture(s, &g2));
  CU_OK(cuGraphDestroy(g2));
  CU_OK(cuGraphDestroy(out));
  CU_OK(cuMemFree(a));
  CU_OK(cuStreamDestroy(s));
}

static void test_captured_work_runs_only_when_launched(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr a;
  CU_OK(cuMemAlloc(&a, 4096));
  CU_OK(sim_test_fill(s, a, 1024, 5));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(sim_test_fill(s, a, 1024, 6));
  CU_OK(cuMemsetD32Async(a + 64, 7, 1, s));
  CUgraph g;
  CU_OK(cuStreamEndCapture(s, &g));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(a, 16), 5);
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(a, 15), 6);
  assert_int_equal(sim_test_read(a, 16), 7);
  if (api->race_count()) api->print_report();
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuMemFree(a));
  CU_OK(cuStreamDestroy(s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wait_on_event_from_outside_is_isolation_and_invalidates),
      cmocka_unit_test(test_external_wait_becomes_an_event_wait_node),
      cmocka_unit_test(test_fork_and_join_capture_both_streams),
      cmocka_unit_test(test_forked_stream_not_rejoined_is_unjoined),
      cmocka_unit_test(test_unsafe_calls_fail_and_invalidate_a_global_capture),
      cmocka_unit_test(test_relaxed_capture_permits_unsafe_calls),
      cmocka_unit_test(test_global_capture_forbids_unsafe_calls_on_other_threads),
      cmocka_unit_test(test_thread_local_capture_forbids_only_its_own_thread),
      cmocka_unit_test(test_non_relaxed_capture_must_end_on_its_thread),
      cmocka_unit_test(test_legacy_stream_cannot_be_captured),
      cmocka_unit_test(test_capture_info_and_dependency_updates),
      cmocka_unit_test(test_captured_work_runs_only_when_launched),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
