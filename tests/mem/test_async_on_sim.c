/* The async resource on the simulator, with a real runtime and tracker: pool attributes (get,
 * set, resetting *_HIGH), trim, export, refusal under capture, and a fault injected at every
 * driver call it makes: each gives a clean error, leaks no device memory and leaves the
 * statistics consistent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"
#include "weft/weft.h"

static weft_runtime_t *rt;
static weft_stream_t *s0, *s1;
static const weft_sim_api_t *sim;
static const weft__driver_t *drv;

static uint64_t device_bytes(void) {
  weft_sim_stats_t st;
  sim->stats(&st);
  return st.bytes_in_use;
}

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.memory = WEFT_MEMORY_DIRECT;
  if (weft_runtime_get(0, &o, &rt) != WEFT_OK) {
    fprintf(stderr, "runtime: %s\n", weft_last_error());
    return -1;
  }
  if (weft_stream_get(rt, 0, &s0) != WEFT_OK || weft_stream_get(rt, 1, &s1) != WEFT_OK) return -1;
  sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL || weft__driver_get(&drv) != WEFT_OK) return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  (sim->fail)("");
  return weft_runtime_release(rt) == WEFT_OK ? 0 : -1;
}

static void inject(const char *spec) { assert_int_equal((sim->fail)(spec), 0); }

static void test_async_pool_attributes_trim_and_export(void **state) {
  (void)state;
  uint64_t base = device_bytes();
  weft_async_options_t o = weft_async_options_default();
  o.initial_reserve = 4 << 20;
  weft_resource_t *a = NULL;
  assert_int_equal(weft_async_create(rt, &o, &a), WEFT_OK);
  assert_non_null(weft_async_pool(a));
  uint64_t v = 0;
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v), WEFT_OK);
  assert_true(v == UINT64_MAX);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &v), WEFT_OK);
  assert_int_equal(v, 1);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(a, 1 << 20, s0, "a", &p), WEFT_OK);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), WEFT_OK);
  assert_true(v >= (1u << 20));
  assert_int_equal(weft_resource_deallocate(a, p, 1 << 20, s0, "a"), WEFT_OK);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_OK);
  assert_true(v >= (1u << 20));
  assert_int_equal(weft_async_set_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0), WEFT_OK);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_OK);
  assert_true(v < (1u << 20));
  assert_int_equal(weft_async_set_attribute(a, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, 0), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_async_set_attribute(a, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 5), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_async_set_attribute(a, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0), WEFT_OK);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &v), WEFT_OK);
  assert_int_equal(v, 0);
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  assert_int_equal(weft_resource_trim(a, 0), WEFT_OK);
  int fd = -1;
  assert_int_equal(weft_async_export(a, &fd), WEFT_ERR_NOT_SUPPORTED);
  /* Not an async resource. */
  weft_resource_t *d = NULL;
  assert_int_equal(weft_direct_create(rt, &d), WEFT_OK);
  assert_int_equal(weft_async_get_attribute(d, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_ERR_INVALID_ARGUMENT);
  assert_null(weft_async_pool(d));
  weft_resource_destroy(d);
  weft_resource_destroy(a);
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  assert_int_equal(device_bytes(), base);
}

/* A fault at each driver call of weft_async_create and of the async resource's operations. */
static void test_async_faults_at_every_driver_call(void **state) {
  (void)state;
  uint64_t base = device_bytes();
  static const char *create_faults[] = {
      "cuMemPoolCreate:1:2",       "cuMemPoolSetAttribute:1:1", "cuMemPoolSetAttribute:2:1",
      "cuMemPoolSetAttribute:3:1", "cuMemPoolSetAttribute:4:1", "cuMemAllocFromPoolAsync:1:2",
      "cuMemFreeAsync:1:999",
  };
  weft_async_options_t o = weft_async_options_default();
  o.initial_reserve = 1 << 20;
  for (size_t i = 0; i < sizeof create_faults / sizeof *create_faults; i++) {
    weft_resource_t *a = NULL;
    inject(create_faults[i]);
    weft_status_t st = weft_async_create(rt, &o, &a);
    inject("");
    assert_true(st == WEFT_ERR_DRIVER || st == WEFT_ERR_OUT_OF_MEMORY);
    assert_null(a);
    assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
    print_message("%s -> %s (%s)\n", create_faults[i], weft_status_name(st), weft_last_error());
  }
  weft_resource_t *a = NULL;
  assert_int_equal(weft_async_create(rt, &o, &a), WEFT_OK);
  CUdeviceptr p = 0;
  inject("cuMemAllocFromPoolAsync:1:2");
  assert_int_equal(weft_resource_allocate(a, 4096, s1, "f", &p), WEFT_ERR_OUT_OF_MEMORY);
  inject("");
  assert_int_equal(weft_resource_allocate(a, 4096, s1, "f", &p), WEFT_OK);
  inject("cuMemFreeAsync:1:999");
  assert_int_equal(weft_resource_deallocate(a, p, 4096, s1, "f"), WEFT_ERR_DRIVER);
  inject("");
  weft_resource_stats_t st;
  weft_resource_stats(a, &st);
  assert_int_equal(st.live_bytes, 4096);
  assert_int_equal(st.failures, 2);
  assert_int_equal(weft_resource_deallocate(a, p, 4096, s1, "f"), WEFT_OK);
  uint64_t v;
  inject("cuMemPoolGetAttribute:1:999");
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_ERR_DRIVER);
  inject("cuMemPoolSetAttribute:1:999");
  assert_int_equal(weft_async_set_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0), WEFT_ERR_DRIVER);
  inject("cuStreamIsCapturing:1:999");
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_ERR_DRIVER);
  inject("cuMemPoolTrimTo:1:999");
  assert_int_equal(weft_resource_trim(a, 0), WEFT_ERR_DRIVER);
  inject("");
  weft_resource_destroy(a);
  assert_int_equal(weft_runtime_synchronize(rt), WEFT_OK);
  assert_int_equal(device_bytes(), base);
}

static void test_async_refuses_housekeeping_under_capture(void **state) {
  (void)state;
  weft_resource_t *a = NULL;
  assert_int_equal(weft_async_create(rt, NULL, &a), WEFT_OK);
  assert_int_equal(drv->cuStreamBeginCapture(weft_stream_raw(s1), CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  uint64_t v;
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_ERR_CAPTURE);
  assert_int_equal(weft_resource_trim(a, 0), WEFT_ERR_CAPTURE);
  CUgraph g = NULL;
  assert_int_equal(drv->cuStreamEndCapture(weft_stream_raw(s1), &g), CUDA_SUCCESS);
  if (g) drv->cuGraphDestroy(g);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_OK);
  weft_resource_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_pool_attributes_trim_and_export),
      cmocka_unit_test(test_async_faults_at_every_driver_call),
      cmocka_unit_test(test_async_refuses_housekeeping_under_capture),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
