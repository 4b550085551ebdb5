/* Graph execution: nodes run in an order that respects every edge, in different orders for
 * different seeds, interleaved with other streams; edges and launch order are happens-before for
 * the oracle; nodes, edges and types can be read back; cycles do not instantiate. */
#include <string.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

static int g_order[16];
static int g_norder;
static void visit(void *p) { g_order[g_norder++] = (int)(uintptr_t)p; }

static CUgraphNode host_node(CUgraph g, const CUgraphNode *deps, size_t n, int id) {
  CUDA_HOST_NODE_PARAMS hp = {visit, (void *)(uintptr_t)id};
  CUgraphNode node;
  CU_OK(cuGraphAddHostNode(&node, g, deps, n, &hp));
  return node;
}

static int pos(int id) {
  for (int i = 0; i < g_norder; i++)
    if (g_order[i] == id) return i;
  return -1;
}

/* Diamond 0 -> {1, 2, 3} -> 4, and 5 independent. */
static void test_nodes_run_in_a_random_topological_order(void **state) {
  (void)state;
  CUgraph g;
  CU_OK(cuGraphCreate(&g, 0));
  CUgraphNode n0 = host_node(g, NULL, 0, 0);
  CUgraphNode mid[3];
  for (int i = 0; i < 3; i++) mid[i] = host_node(g, &n0, 1, i + 1);
  host_node(g, mid, 3, 4);
  host_node(g, NULL, 0, 5);
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CUstream s = sim_test_stream();
  int orders_seen = 0;
  int first[6];
  for (uint64_t seed = 1; seed <= 40; seed++) {
    api->seed(seed);
    g_norder = 0;
    CU_OK(cuGraphLaunch(x, s));
    CU_OK(cuStreamSynchronize(s));
    assert_int_equal(g_norder, 6);
    for (int i = 1; i <= 3; i++) {
      assert_true(pos(0) < pos(i));
      assert_true(pos(i) < pos(4));
    }
    if (seed == 1) memcpy(first, g_order, sizeof first);
    else orders_seen += memcmp(first, g_order, sizeof first) != 0;
  }
  assert_true(orders_seen > 10);
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuStreamDestroy(s));
}

static CUgraphNode fill_node(CUgraph g, const CUgraphNode *deps, size_t n, CUdeviceptr p, unsigned count, unsigned v) {
  void *pp = (void *)(uintptr_t)p;
  void *args[] = {&pp, &count, &v};
  CUDA_KERNEL_NODE_PARAMS kp;
  memset(&kp, 0, sizeof kp);
  kp.func = sim_test_kernel("sim_test_fill");
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = args;
  CUgraphNode node;
  CU_OK(cuGraphAddKernelNode(&node, g, deps, n, &kp));
  return node;
}

static void test_unordered_nodes_writing_the_same_bytes_race(void **state) {
  (void)state;
  CUdeviceptr p;
  CU_OK(cuMemAlloc(&p, 4096));
  CUstream s = sim_test_stream();
  CUgraph g;
  CU_OK(cuGraphCreate(&g, 0));
  CUgraphNode a = fill_node(g, NULL, 0, p, 1024, 1);
  fill_node(g, NULL, 0, p + 2048, 512, 2); /* overlaps the second half of a */
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  api->reset_races();
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(api->race_count(), 1);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_int_equal(r.ptr, p + 2048);
  assert_int_equal(r.bytes, 2048);
  assert_int_equal(r.first_stream, -2);
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  /* with an edge there is none */
  api->reset_races();
  CU_OK(cuGraphCreate(&g, 0));
  a = fill_node(g, NULL, 0, p, 1024, 1);
  CUgraphNode b = fill_node(g, NULL, 0, p + 2048, 512, 2);
  CU_OK(cuGraphAddDependencies(g, &a, &b, NULL, 1));
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  for (int i = 0; i < 5; i++) CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(p, 600), 2);
  assert_int_equal(sim_test_read(p, 100), 1);
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuMemFree(p));
  CU_OK(cuStreamDestroy(s));
}

static void test_launch_is_ordered_with_its_stream_and_events(void **state) {
  (void)state;
  CUdeviceptr p, q;
  CU_OK(cuMemAlloc(&p, 4096));
  CU_OK(cuMemAlloc(&q, 4096));
  CUstream s = sim_test_stream(), t = sim_test_stream();
  CUevent e;
  CU_OK(cuEventCreate(&e, 0));
  CUgraph g;
  CU_OK(cuGraphCreate(&g, 0));
  CUgraphNode a = fill_node(g, NULL, 0, p, 1024, 4), rec;
  CU_OK(cuGraphAddEventRecordNode(&rec, g, &a, 1, e));
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD));
  CU_OK(cuGraphUpload(x, s));
  api->reset_races();
  for (uint64_t seed = 1; seed <= 20; seed++) {
    api->seed(seed);
    CU_OK(sim_test_fill(s, p, 1024, 3)); /* before the launch on its stream */
    CU_OK(cuGraphLaunch(x, s));
    CU_OK(cuStreamWaitEvent(t, e, 0)); /* waits for the graph's record node */
    CU_OK(sim_test_copy(t, q, p, 1024));
    CU_OK(cuStreamSynchronize(t));
    CU_OK(cuStreamSynchronize(s));
    assert_int_equal(sim_test_read(q, 9), 4);
  }
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuEventDestroy(e));
  CU_OK(cuMemFree(p));
  CU_OK(cuMemFree(q));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(t));
}

static void test_nodes_edges_and_types_read_back(void **state) {
  (void)state;
  CUgraph g;
  CU_OK(cuGraphCreate(&g, 0));
  CUgraphNode a, b, c;
  CU_OK(cuGraphAddEmptyNode(&a, g, NULL, 0));
  CU_OK(cuGraphAddEmptyNode(&b, g, &a, 1));
  CUdeviceptr p;
  CU_OK(cuMemAlloc(&p, 4096));
  CUDA_MEMSET_NODE_PARAMS mp = {.dst = p, .pitch = 1024, .value = 9, .elementSize = 4, .width = 16, .height = 2};
  CU_OK(cuGraphAddMemsetNode(&c, g, &b, 1, &mp, NULL));
  size_t n = 0;
  CU_OK(cuGraphGetNodes(g, NULL, &n));
  assert_int_equal(n, 3);
  CUgraphNode from[4], to[4];
  CUgraphEdgeData ed[4];
  size_t ne = 4;
  CU_OK(cuGraphGetEdges(g, from, to, NULL, &ne));
  assert_int_equal(ne, 2);
  assert_ptr_equal(from[0], a);
  assert_ptr_equal(to[0], b);
  ne = 4;
  CU_OK(cuGraphGetEdges(g, from, to, ed, &ne));
  assert_int_equal(ed[1].type, 0);
  CUgraphNodeType t;
  CU_OK(cuGraphNodeGetType(c, &t));
  assert_int_equal(t, CU_GRAPH_NODE_TYPE_MEMSET);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuGraphGetNodes(g, NULL, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuGraphAddDependencies(g, &a, &b, NULL, 1)); /* duplicate edge */
  /* a cycle does not instantiate */
  CU_OK(cuGraphAddDependencies(g, &c, &a, NULL, 1));
  CUgraphExec x;
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphDestroy(g));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuGraphGetNodes(g, NULL, &n));
  /* the memset node's 2-D shape */
  CU_OK(cuGraphCreate(&g, 0));
  CU_OK(cuGraphAddMemsetNode(&c, g, NULL, 0, &mp, NULL));
  CUstream s = sim_test_stream();
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(p, 256 + 15), 9);
  assert_int_equal(sim_test_read(p, 15), 9);
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuMemFree(p));
  CU_OK(cuStreamDestroy(s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nodes_run_in_a_random_topological_order),
      cmocka_unit_test(test_unordered_nodes_writing_the_same_bytes_race),
      cmocka_unit_test(test_launch_is_ordered_with_its_stream_and_events),
      cmocka_unit_test(test_nodes_edges_and_types_read_back),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
