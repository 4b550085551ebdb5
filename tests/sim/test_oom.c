/* WEFT_SIM_MEMORY is the device's memory: reported by cuMemGetInfo and cuDeviceTotalMem, and
 * enforced for every kind of allocation with CUDA_ERROR_OUT_OF_MEMORY. */
#include <stdlib.h>
#include <string.h>

#include "tests/sim/sim_test.h"

#define MIB (1ull << 20)

static int setup(void **state) {
  (void)state;
  setenv("WEFT_SIM_MEMORY", "64M", 1); /* read once, before the simulator's first call */
  sim_test_init();
  return 0;
}

static void test_memory_size_comes_from_the_environment(void **state) {
  (void)state;
  size_t free_b, total;
  CU_OK(cuMemGetInfo(&free_b, &total));
  assert_int_equal(total, 64 * MIB);
  CU_OK(cuDeviceTotalMem(&total, 0));
  assert_int_equal(total, 64 * MIB);
}

static void test_cuMemAlloc_over_the_limit_is_out_of_memory(void **state) {
  (void)state;
  CUdeviceptr a, b;
  CU_OK(cuMemAlloc(&a, 48 * MIB));
  CU_IS(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc(&b, 32 * MIB));
  CU_OK(cuMemFree(a));
  CU_OK(cuMemAlloc(&b, 32 * MIB));
  CU_OK(cuMemFree(b));
}

static void test_pool_allocation_over_the_limit_is_out_of_memory(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr a, b, c;
  CU_OK(cuMemAlloc(&a, 40 * MIB));
  CU_IS(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocAsync(&b, 32 * MIB, s));
  CU_OK(cuMemAllocAsync(&b, 16 * MIB, s));
  CU_OK(cuMemFreeAsync(b, s));
  /* with the release threshold at 0 the synchronisation gives the freed block back */
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuMemAllocAsync(&c, 20 * MIB, s));
  CU_OK(cuMemFreeAsync(c, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuMemFree(a));
  CU_OK(cuStreamDestroy(s));
}

static void test_graph_launch_over_the_limit_is_out_of_memory(void **state) {
  (void)state;
  CUgraph g;
  CU_OK(cuGraphCreate(&g, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.bytesize = 40 * MIB;
  CUgraphNode n, f;
  CU_OK(cuGraphAddMemAllocNode(&n, g, NULL, 0, &p));
  CU_OK(cuGraphAddMemFreeNode(&f, g, &n, 1, p.dptr));
  CUgraphExec x;
  CU_OK(cuGraphInstantiateWithFlags(&x, g, 0));
  CUdeviceptr a;
  CU_OK(cuMemAlloc(&a, 40 * MIB));
  CUstream s = sim_test_stream();
  CU_IS(CUDA_ERROR_OUT_OF_MEMORY, cuGraphLaunch(x, s));
  CU_OK(cuMemFree(a));
  CU_OK(cuGraphLaunch(x, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuGraphExecDestroy(x));
  CU_OK(cuGraphDestroy(g));
  CU_OK(cuDeviceGraphMemTrim(0));
  CU_OK(cuStreamDestroy(s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory_size_comes_from_the_environment),
      cmocka_unit_test(test_cuMemAlloc_over_the_limit_is_out_of_memory),
      cmocka_unit_test(test_pool_allocation_over_the_limit_is_out_of_memory),
      cmocka_unit_test(test_graph_launch_over_the_limit_is_out_of_memory),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
