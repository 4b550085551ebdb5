/* The async resource with a real runtime and tracker, on the simulator and on a GPU: pool
 * attributes (get, set, resetting *_HIGH), trim, export, refusal under capture, data written and
 * read back, and a fault injected at every driver call it makes: each gives a clean error, leaks
 * no device memory and leaves the statistics consistent.
 *
 * Simulator-only (skipped inside the tests on a GPU, which runs every other step): fault
 * injection (there each faulted call must instead succeed) and the device-byte leak check
 * (the simulator's bytes in use; on a GPU the resources' own statistics are checked). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tests/mem/mem_env.h"


/* Writes `value` over the `bytes` (a multiple of 4) at p on s and reads them back. */
static void check_roundtrip(CUdeviceptr p, size_t bytes, weft_stream_t *s, unsigned value) {
  static unsigned host[1 << 16];
  assert_true(bytes <= sizeof host);
  memset(host, 0, bytes);
  assert_int_equal(drv->cuMemsetD32Async(p, value, bytes / 4, weft_stream_raw(s)), CUDA_SUCCESS);
  assert_int_equal(weft_stream_synchronize(s), WEFT_OK);
  assert_int_equal(drv->cuMemcpyDtoH(host, p, bytes), CUDA_SUCCESS);
  for (size_t i = 0; i < bytes / 4; i++)
    if (host[i] != value) fail_msg("word %zu of 0x%llx is 0x%x, not 0x%x", i, (unsigned long long)p, host[i], value);
}

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
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v), WEFT_OK);
  assert_true(v >= (4u << 20)); /* the initial reserve stays cached (release threshold) */
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(a, 1 << 20, s0, "a", &p), WEFT_OK);
  check_roundtrip(p, 1 << 18, s0, 0xa5a5c3c3u);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), WEFT_OK);
  assert_true(v >= (1u << 20));
  assert_int_equal(weft_resource_deallocate(a, p, 1 << 20, s0, "a"), WEFT_OK);
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_OK);
  assert_true(v >= (1u << 20));
  /* A reset sets *_HIGH to the current use: once the free has run, below the freed block. */
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
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
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v), WEFT_OK);
  assert_true(v < (4u << 20)); /* nothing is in use: the trim gave the cached memory back */
  int fd = -1;
  assert_int_equal(weft_async_export(a, &fd), WEFT_ERR_NOT_SUPPORTED);
  /* Not an async resource. */
  weft_resource_t *d = NULL;
  assert_int_equal(weft_direct_create(rt, &d), WEFT_OK);
  assert_int_equal(weft_async_get_attribute(d, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_ERR_INVALID_ARGUMENT);
  assert_null(weft_async_pool(d));
  weft_resource_destroy(d);
  weft_resource_stats_t st;
  weft_resource_stats(a, &st);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.allocs, 1);
  assert_int_equal(st.frees, 1);
  weft_resource_destroy(a);
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  assert_int_equal(device_bytes(), base);
}

/* A fault at each driver call of weft_async_create and of the async resource's operations. On a
 * GPU the same calls run unfaulted and must succeed. */
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
    bool armed = inject(create_faults[i]);
    weft_status_t st = weft_async_create(rt, &o, &a);
    clear_faults();
    if (armed) {
      assert_true(st == WEFT_ERR_DRIVER || st == WEFT_ERR_OUT_OF_MEMORY);
      assert_null(a);
      print_message("%s -> %s (%s)\n", create_faults[i], weft_status_name(st), weft_last_error());
    } else {
      assert_int_equal(st, WEFT_OK);
      assert_non_null(a);
      weft_resource_destroy(a);
    }
    assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  }
  weft_resource_t *a = NULL;
  assert_int_equal(weft_async_create(rt, &o, &a), WEFT_OK);
  CUdeviceptr p = 0;
  unsigned failures = 0;
  if (inject("cuMemAllocFromPoolAsync:1:2")) {
    assert_int_equal(weft_resource_allocate(a, 4096, s1, "f", &p), WEFT_ERR_OUT_OF_MEMORY);
    assert_int_equal(p, 0);
    clear_faults();
    failures++;
  }
  assert_int_equal(weft_resource_allocate(a, 4096, s1, "f", &p), WEFT_OK);
  check_roundtrip(p, 4096, s1, 0x01020304u);
  if (inject("cuMemFreeAsync:1:999")) {
    assert_int_equal(weft_resource_deallocate(a, p, 4096, s1, "f"), WEFT_ERR_DRIVER);
    clear_faults();
    failures++;
    check_roundtrip(p, 4096, s1, 0x05060708u); /* still live after the failed free */
  }
  weft_resource_stats_t st;
  weft_resource_stats(a, &st);
  assert_int_equal(st.live_bytes, 4096);
  assert_int_equal(st.failures, failures);
  assert_int_equal(weft_resource_deallocate(a, p, 4096, s1, "f"), WEFT_OK);
  weft_resource_stats(a, &st);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.allocs, 1);
  assert_int_equal(st.frees, 1);
  uint64_t v;
  bool armed = inject("cuMemPoolGetAttribute:1:999");
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), armed ? WEFT_ERR_DRIVER : WEFT_OK);
  armed = inject("cuMemPoolSetAttribute:1:999");
  assert_int_equal(weft_async_set_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0), armed ? WEFT_ERR_DRIVER : WEFT_OK);
  armed = inject("cuMemPoolTrimTo:1:999");
  assert_int_equal(weft_resource_trim(a, 0), armed ? WEFT_ERR_DRIVER : WEFT_OK);
  clear_faults();
  /* After the faults every call works again. */
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_OK);
  assert_int_equal(weft_resource_trim(a, 0), WEFT_OK);
  weft_resource_destroy(a);
  assert_int_equal(weft_runtime_synchronize(rt), WEFT_OK);
  assert_int_equal(device_bytes(), base);
}

/* Pool housekeeping runs in RELAXED capture mode: a GLOBAL capture begun by code outside weft
 * on a stream weft does not use stays valid through attributes, allocations, frees and a trim. */
static void test_async_housekeeping_leaves_an_outside_global_capture_valid(void **state) {
  (void)state;
  weft_resource_t *a = NULL;
  assert_int_equal(weft_async_create(rt, NULL, &a), WEFT_OK);
  CUstream outside;
  assert_int_equal(drv->cuStreamCreateWithPriority(&outside, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  assert_int_equal(drv->cuStreamBeginCapture(outside, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  uint64_t v;
  CUdeviceptr p = 0;
  assert_int_equal(weft_async_get_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v), WEFT_OK);
  assert_int_equal(weft_async_set_attribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0), WEFT_OK);
  assert_int_equal(weft_resource_allocate(a, 4096, s1, "h", &p), WEFT_OK);
  assert_int_equal(weft_resource_deallocate(a, p, 4096, s1, "h"), WEFT_OK);
  assert_int_equal(weft_resource_trim(a, 0), WEFT_OK);
  CUgraph g = NULL;
  assert_int_equal(drv->cuStreamEndCapture(outside, &g), CUDA_SUCCESS); /* not invalidated */
  assert_non_null(g);
  drv->cuGraphDestroy(g);
  drv->cuStreamDestroy(outside);
  weft_resource_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_async_pool_attributes_trim_and_export),
      cmocka_unit_test(test_async_faults_at_every_driver_call),
      cmocka_unit_test(test_async_housekeeping_leaves_an_outside_global_capture_valid),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
