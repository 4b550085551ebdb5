/* Several simulated devices (WEFT_SIM_DEVICES=2, set in BUILD): each device's memory is its own
 * (cuMemGetInfo, WEFT_SIM_MEMORY each); a kernel on one device touching another's memory needs
 * peer access (cuCtxEnablePeerAccess for cuMemAlloc memory, cuMemPoolSetAccess for a pool's),
 * else the simulator reports it as a race (a GPU faults); copies need none. */
#include <string.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;
static CUcontext c0, c1;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  CU_OK(cuCtxGetCurrent(&c0));
  CU_OK(cuDevicePrimaryCtxRetain(&c1, 1));
  return 0;
}

static void test_two_devices_count_their_own_memory(void **state) {
  (void)state;
  int n = 0;
  CU_OK(cuDeviceGetCount(&n));
  assert_int_equal(n, 2);
  size_t f0, t0, f1, t1;
  CU_OK(cuCtxSetCurrent(c0));
  CU_OK(cuMemGetInfo(&f0, &t0));
  CU_OK(cuCtxSetCurrent(c1));
  CU_OK(cuMemGetInfo(&f1, &t1));
  CUdeviceptr big;
  CU_OK(cuMemAlloc(&big, 64u << 20)); /* device 1's */
  size_t f1b;
  CU_OK(cuMemGetInfo(&f1b, &t1));
  assert_int_equal(f1 - f1b, 64u << 20);
  /* Device 0's free memory is what it was before device 1's allocation. */
  CU_OK(cuCtxSetCurrent(c0));
  size_t f0b;
  CU_OK(cuMemGetInfo(&f0b, &t0));
  assert_int_equal(f0b, f0);
  assert_int_equal(t0, t1); /* WEFT_SIM_MEMORY each */
  CU_OK(cuCtxSetCurrent(c1));
  CU_OK(cuMemFree(big));
  CU_OK(cuMemGetInfo(&f1b, &t1));
  assert_int_equal(f1b, f1);
  CU_OK(cuCtxSetCurrent(c0));
}

static void test_kernels_need_peer_access_copies_do_not(void **state) {
  (void)state;
  CU_OK(cuCtxSetCurrent(c0));
  CUdeviceptr m0;
  CU_OK(cuMemAlloc(&m0, 4096));
  CUstream s0 = sim_test_stream();
  CU_OK(sim_test_fill(s0, m0, 1024, 5));
  CU_OK(cuStreamSynchronize(s0));
  CU_OK(cuCtxSetCurrent(c1));
  CUstream s1 = sim_test_stream();
  CUdeviceptr m1;
  CU_OK(cuMemAlloc(&m1, 4096));
  /* A copy between devices: fine without peer access. */
  CU_OK(cuMemcpyDtoDAsync(m1, m0, 4096, s1));
  CU_OK(cuStreamSynchronize(s1));
  assert_int_equal(sim_test_read(m1, 1023), 5);
  assert_int_equal(api->race_count(), 0);
  /* A kernel on device 1 reading device 0's memory without peer access: reported, skipped. */
  CU_OK(sim_test_copy(s1, m1, m0, 1024));
  CU_OK(cuStreamSynchronize(s1));
  assert_int_equal(api->race_count(), 1);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_non_null(strstr(r.second_desc, "no peer access"));
  api->reset_races();
  /* With peer access (device 1's context to device 0's): fine. */
  CU_OK(cuCtxEnablePeerAccess(c0, 0));
  CU_OK(sim_test_add(s1, m1, m0, 1024));
  CU_OK(cuStreamSynchronize(s1));
  assert_int_equal(sim_test_read(m1, 0), 10);
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuCtxDisablePeerAccess(c0));
  /* Pool memory of device 0: cuMemPoolSetAccess decides, not the context's peer access. */
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool p0;
  CU_OK(cuMemPoolCreate(&p0, &props));
  CUdeviceptr q;
  CU_OK(cuMemAllocFromPoolAsync(&q, 4096, p0, s1)); /* allocation needs no access */
  CU_OK(cuCtxEnablePeerAccess(c0, 0));
  CU_OK(sim_test_fill(s1, q, 1024, 3)); /* context peer access does not cover pool memory */
  CU_OK(cuStreamSynchronize(s1));
  assert_int_equal(api->race_count(), 1);
  api->reset_races();
  CUmemAccessDesc rw = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CU_OK(cuMemPoolSetAccess(p0, &rw, 1));
  CU_OK(sim_test_fill(s1, q, 1024, 3));
  CU_OK(cuMemFreeAsync(q, s1));
  CU_OK(cuStreamSynchronize(s1));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuCtxDisablePeerAccess(c0));
  CU_OK(cuMemPoolDestroy(p0));
  CU_OK(cuMemFree(m1));
  CU_OK(cuStreamDestroy(s1));
  CU_OK(cuCtxSetCurrent(c0));
  CU_OK(cuMemFree(m0));
  CU_OK(cuStreamDestroy(s0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_devices_count_their_own_memory),
      cmocka_unit_test(test_kernels_need_peer_access_copies_do_not),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
