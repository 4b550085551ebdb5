/* Graph memory nodes as CUDA_SEMANTICS.md says: allocations in capture become nodes, a live
 * allocation blocks relaunch, freeing it outside allows relaunch at the same address,
 * AUTO_FREE_ON_LAUNCH, one instantiation, no free at destroy, counters and trim. */
#include <string.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

static cuuint64_t gmem(CUgraphMem_attribute a) {
  cuuint64_t v = 0;
  CU_OK(cuDeviceGetGraphMemAttribute(0, a, &v));
  return v;
}

/* Captures alloc(bytes) + fill into a graph whose allocation is not freed; *out gets the address. */
static CUgraph capture_alloc(CUstream s, size_t bytes, CUdeviceptr *out) {
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(cuMemAllocAsync(out, bytes, s));
  CU_OK(sim_test_fill(s, *out, (unsigned)(bytes / 4), 11));
  CUgraph g;
  CU_OK(cuStreamEndCapture(s, &g));
  return g;
}

static void test_alloc_in_capture_becomes_a_mem_alloc_node(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  CUgraph g = capture_alloc(s, 4096, &p);
  CUgraphNode nodes[4];
  size_t n = 4;
  CU_OK(cuGraphGetNodes(g, nodes, &n));
  assert_int_equal(n, 2);
  CUgraphNodeType t;
  CU_OK(cuGraphNodeGetType(nodes[0], &t));
  assert_int_equal(t, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
  CUDA_MEM_ALLOC_NODE_PARAMS params;
  CU_OK(cuGraphMemAllocNodeGetParams(nodes[0], &params));
  assert_int_equal(params.dptr, p);
  assert_int_equal(params.bytesize, 4096);
  CU_OK(cuGraphDestroy(g));
  /* from a pool too */
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUmemoryPool pool;
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_OK(cuThreadExchangeStreamCaptureMode(&mode));
  CU_OK(cuMemPoolCreate(&pool, &props));
  CU_OK(cuThreadExchangeStreamCaptureMode(&mode));
  CU_OK(cuMemAllocFromPoolAsync(&p, 512, pool, s));
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamEndCapture(s, &g));
  n = 4;
  CU_OK(cuGraphGetNodes(g, nodes, &n));
  assert_int_equal(n, 2);
  CU_OK(cuGraphNodeGetType(nodes[1], &t));
  assert_int_equal(t, CU_GRAPH_NODE_TYPE_MEM_FREE);
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuMemPoolDestroy(pool));
  CU_OK(cuStreamDestroy(s));
}

static void test_relaunch_with_live_allocation_fails_and_free_gives_same_address(void **state) {
  (void)state;
  CUstream s = sim_test_stream(), t = sim_test_stream();
  CUdeviceptr p;
  CUgraph g = capture_alloc(s, 4096, &p);
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphLaunch(x, s));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(x, s)); /* the allocation is live */
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(p, 1023), 11);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuGraphLaunch(x, s));
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuGraphLaunch(x, s)); /* same address again */
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(p, 0), 11);
  /* a free on another stream must be ordered before the relaunch, or it is a race */
  CU_OK(cuMemFreeAsync(p, t));
  CU_OK(cuStreamSynchronize(t));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuMemFreeAsync(p, t));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuCtxSynchronize());
  assert_true(api->race_count() > 0);
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  api->reset_races();
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(t));
}

static void test_auto_free_on_launch_frees_at_the_next_launch(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  CUgraph g = capture_alloc(s, 4096, &p);
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
  for (int i = 0; i < 3; i++) CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(p, 5), 11);
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuStreamDestroy(s));
}

static void test_only_one_exec_of_a_graph_with_memory_nodes(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  CUgraph g = capture_alloc(s, 4096, &p);
  CUgraphExec x, y;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_IS(CUDA_ERROR_NOT_SUPPORTED, cuGraphInstantiateWithFlags(&y, g, 0));
  /* nor can it be launched into a capture (it would be a child graph) */
  CUstream c = sim_test_stream();
  CU_OK(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuGraphLaunch(x, c));
  CUgraph none;
  CU_IS(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(c, &none));
  CU_OK(cuStreamDestroy(c));
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphInstantiateWithFlags(&y, g, 0));
  CU_OK(cuGraphExecDestroy(y));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuStreamDestroy(s));
}

static void test_destroying_graph_and_exec_frees_no_live_allocation(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p, out;
  CU_OK(cuMemAlloc(&out, 4096));
  CUgraph g = capture_alloc(s, 4096, &p);
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuDeviceGraphMemTrim(0));
  CU_OK(sim_test_copy(s, out, p, 1024)); /* still usable */
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(out, 77), 11);
  assert_true(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= 4096);
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0);
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuMemFree(out));
  CU_OK(cuStreamDestroy(s));
}

static void test_explicit_alloc_kernel_free_graph_relaunches(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr out;
  CU_OK(cuMemAlloc(&out, 4096));
  CUgraph g;
  CU_OK(cuGraphCreate(&g, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS ap;
  memset(&ap, 0, sizeof ap);
  ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ap.bytesize = 4096;
  CUgraphNode alloc, fill, copy, fr;
  CU_OK(cuGraphAddMemAllocNode(&alloc, g, NULL, 0, &ap));
  CUdeviceptr tmp = ap.dptr;
  void *pt = (void *)(uintptr_t)tmp, *po = (void *)(uintptr_t)out;
  unsigned n = 1024, v = 21;
  void *fill_args[] = {&pt, &n, &v}, *copy_args[] = {&po, &pt, &n};
  CUDA_KERNEL_NODE_PARAMS kp;
  memset(&kp, 0, sizeof kp);
  kp.func = sim_test_kernel("sim_test_fill");
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = fill_args;
  CU_OK(cuGraphAddKernelNode(&fill, g, &alloc, 1, &kp));
  kp.func = sim_test_kernel("sim_test_copy");
  kp.kernelParams = copy_args;
  CU_OK(cuGraphAddKernelNode(&copy, g, &fill, 1, &kp));
  CU_OK(cuGraphAddMemFreeNode(&fr, g, &copy, 1, tmp));
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  for (int i = 0; i < 3; i++) CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(out, 1023), 21);
  assert_int_equal(api->race_count(), 0);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuGraphAddMemFreeNode(&fr, g, NULL, 0, out)); /* not graph memory */
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuMemFree(out));
  CU_OK(cuStreamDestroy(s));
}

static void test_graph_memory_counters_and_trim(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CU_OK(cuDeviceGraphMemTrim(0));
  cuuint64_t zero = 0;
  CU_OK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
  CU_OK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero));
  cuuint64_t used0 = gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
  CUdeviceptr p;
  CUgraph g = capture_alloc(s, 1 << 20, &p);
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), used0 + (1 << 20));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) >= 1 << 20);
  assert_true(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) >= gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT));
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), used0);
  assert_true(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) >= used0 + (1 << 20));
  CU_OK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
  assert_int_equal(gmem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), used0);
  CU_OK(cuDeviceGraphMemTrim(0));
  assert_true(gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) < 1 << 20);
  assert_true(gmem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) >= 1 << 20);
  cuuint64_t one = 1;
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &one));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &zero));
  /* relaunch after trim maps again, at the same address */
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(p, 3), 11);
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuStreamDestroy(s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_in_capture_becomes_a_mem_alloc_node),
      cmocka_unit_test(test_relaunch_with_live_allocation_fails_and_free_gives_same_address),
      cmocka_unit_test(test_auto_free_on_launch_frees_at_the_next_launch),
      cmocka_unit_test(test_only_one_exec_of_a_graph_with_memory_nodes),
      cmocka_unit_test(test_destroying_graph_and_exec_frees_no_live_allocation),
      cmocka_unit_test(test_explicit_alloc_kernel_free_graph_relaunches),
      cmocka_unit_test(test_graph_memory_counters_and_trim),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
