/* The direct resource and the guard adaptor with a real runtime and tracker, on the simulator
 * and on a GPU: data written and read back, canaries (overrun and underrun named to the byte),
 * poison, quarantine, double free, and a fault injected at every driver call they make: each
 * gives a clean error, leaks no device memory and leaves the statistics consistent.
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


/* Writes byte `value` over [p, p+bytes) on s and reads it back. */
static void check_roundtrip(CUdeviceptr p, size_t bytes, weft_stream_t *s, unsigned char value) {
  static unsigned char host[1 << 16];
  assert_true(bytes <= sizeof host);
  memset(host, (unsigned char)~value, bytes);
  assert_int_equal(drv->cuMemsetD8Async(p, value, bytes, weft_stream_raw(s)), CUDA_SUCCESS);
  assert_int_equal(weft_stream_synchronize(s), WEFT_OK);
  assert_int_equal(drv->cuMemcpyDtoH(host, p, bytes), CUDA_SUCCESS);
  for (size_t i = 0; i < bytes; i++)
    if (host[i] != value) fail_msg("byte %zu of 0x%llx is 0x%x, not 0x%x", i, (unsigned long long)p, host[i], value);
}

static void test_direct_allocates_frees_and_fails_cleanly(void **state) {
  (void)state;
  uint64_t base = device_bytes();
  weft_resource_t *d = NULL;
  assert_int_equal(weft_direct_create(rt, &d), WEFT_OK);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(d, 1000, s0, "x", &p), WEFT_OK);
  if (sim != NULL) assert_true(device_bytes() >= base + 1000);
  check_roundtrip(p, 1000, s0, 0x5a);
  unsigned failures = 0;
  if (inject("cuMemAlloc:1:2")) {
    CUdeviceptr q = 0;
    assert_int_equal(weft_resource_allocate(d, 1000, s0, "x", &q), WEFT_ERR_OUT_OF_MEMORY);
    assert_int_equal(weft_last_driver_error(), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(q, 0);
    inject("cuStreamSynchronize:1:999");
    assert_int_equal(weft_resource_deallocate(d, p, 1000, s0, "x"), WEFT_ERR_DRIVER);
    assert_non_null(strstr(weft_last_error(), "cuStreamSynchronize"));
    inject("cuMemFree:1:1");
    assert_int_equal(weft_resource_deallocate(d, p, 1000, s0, "x"), WEFT_ERR_DRIVER);
    clear_faults();
    failures = 3;
    check_roundtrip(p, 1000, s0, 0xc3); /* still live after the failed frees */
  }
  weft_resource_stats_t st;
  weft_resource_stats(d, &st);
  assert_int_equal(st.live_bytes, 1000);
  assert_int_equal(st.failures, failures);
  assert_int_equal(weft_resource_deallocate(d, p, 1000, s0, "x"), WEFT_OK);
  weft_resource_stats(d, &st);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.allocs, 1);
  assert_int_equal(st.frees, 1);
  weft_resource_destroy(d);
  assert_int_equal(device_bytes(), base);
}

static weft_resource_t *make_guard(weft_resource_t **direct, size_t qcount) {
  assert_int_equal(weft_direct_create(rt, direct), WEFT_OK);
  weft_guard_options_t go = weft_guard_options_default();
  go.quarantine_count = qcount;
  weft_resource_t *g = NULL;
  assert_int_equal(weft_guard_create(rt, *direct, &go, &g), WEFT_OK);
  return g;
}

static void test_guard_finds_an_overrun_and_names_the_first_bad_byte(void **state) {
  (void)state;
  uint64_t base = device_bytes();
  weft_resource_t *d, *g = make_guard(&d, 4);
  static const char tag[] = "activations";
  CUdeviceptr p = 0, q = 0;
  assert_int_equal(weft_resource_allocate(g, 1000, s0, tag, &p), WEFT_OK);
  assert_int_equal(p % 256, 0);
  assert_int_equal(weft_resource_allocate(g, 512, s0, tag, &q), WEFT_OK);
  /* A kernel writes 3 bytes past the end of p, and one byte before q. */
  assert_int_equal(drv->cuMemsetD8Async(p + 1000, 0x00, 3, weft_stream_raw(s0)), CUDA_SUCCESS);
  assert_int_equal(drv->cuMemsetD8Async(q - 1, 0x11, 1, weft_stream_raw(s0)), CUDA_SUCCESS);
  assert_int_equal(weft_resource_deallocate(g, p, 1000, s0, tag), WEFT_ERR_CORRUPTED);
  char want[64];
  snprintf(want, sizeof want, "0x%llx", (unsigned long long)p);
  assert_non_null(strstr(weft_last_error(), want));
  assert_non_null(strstr(weft_last_error(), "activations"));
  assert_non_null(strstr(weft_last_error(), "+1000"));
  assert_int_equal(weft_resource_deallocate(g, q, 512, s0, tag), WEFT_ERR_CORRUPTED);
  assert_non_null(strstr(weft_last_error(), "offset -1"));
  /* Both were released anyway (into quarantine): a second free is a double free. */
  assert_int_equal(weft_resource_deallocate(g, p, 1000, s0, tag), WEFT_ERR_DOUBLE_FREE);
  weft_resource_stats_t st;
  weft_resource_stats(g, &st);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.frees, 2);
  /* Poisoned while in quarantine. */
  unsigned char b[16];
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  assert_int_equal(drv->cuMemcpyDtoH(b, p, sizeof b), CUDA_SUCCESS);
  for (size_t i = 0; i < sizeof b; i++) assert_int_equal(b[i], 0xDB);
  weft_resource_destroy(g);
  weft_resource_destroy(d);
  assert_int_equal(device_bytes(), base);
}

static void test_guard_quarantine_delays_reuse_by_count(void **state) {
  (void)state;
  uint64_t base = device_bytes();
  weft_resource_t *d, *g = make_guard(&d, 2);
  CUdeviceptr p[3];
  for (int i = 0; i < 3; i++) assert_int_equal(weft_resource_allocate(g, 256, s0, "", &p[i]), WEFT_OK);
  weft_resource_stats_t up;
  for (int i = 0; i < 3; i++) assert_int_equal(weft_resource_deallocate(g, p[i], 256, s0, ""), WEFT_OK);
  weft_resource_stats(d, &up);
  assert_int_equal(up.frees, 1); /* two still in quarantine */
  assert_int_equal(weft_resource_deallocate(g, p[0], 256, s0, ""), WEFT_ERR_INVALID_ARGUMENT); /* left quarantine */
  assert_int_equal(weft_resource_deallocate(g, p[2], 256, s0, ""), WEFT_ERR_DOUBLE_FREE);
  assert_int_equal(weft_resource_deallocate(g, p[1], 100, s0, ""), WEFT_ERR_DOUBLE_FREE);
  assert_int_equal(weft_resource_trim(g, 0), WEFT_OK);
  weft_resource_stats(d, &up);
  assert_int_equal(up.frees, 3);
  weft_resource_destroy(g);
  weft_resource_destroy(d);
  assert_int_equal(device_bytes(), base);
}

/* A fault at each driver call of the guard's allocate and deallocate. On a GPU the same calls
 * run unfaulted and must succeed. */
static void test_guard_faults_at_every_driver_call(void **state) {
  (void)state;
  uint64_t base = device_bytes();
  weft_resource_t *d, *g = make_guard(&d, 4);
  CUdeviceptr p = 0;
  unsigned failures = 0;
  static const char *alloc_faults[] = {"cuMemsetD8Async:1:999", "cuMemsetD8Async:2:999"};
  for (size_t i = 0; i < sizeof alloc_faults / sizeof *alloc_faults && sim != NULL; i++) {
    inject(alloc_faults[i]);
    assert_int_equal(weft_resource_allocate(g, 1000, s0, "", &p), WEFT_ERR_DRIVER);
    clear_faults();
    assert_int_equal(p, 0);
    failures++;
  }
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  assert_int_equal(device_bytes(), base); /* the upstream block went back */
  assert_int_equal(weft_resource_allocate(g, 1000, s0, "", &p), WEFT_OK);
  check_roundtrip(p, 1000, s0, 0x77); /* the whole block, not a byte more: the canaries hold */
  static const char *free_faults[] = {"cuStreamSynchronize:1:999", "cuMemcpyDtoH:1:999", "cuMemcpyDtoH:2:999",
                                      "cuMemsetD8Async:1:999"};
  for (size_t i = 0; i < sizeof free_faults / sizeof *free_faults && sim != NULL; i++) {
    inject(free_faults[i]);
    assert_int_equal(weft_resource_deallocate(g, p, 1000, s0, ""), WEFT_ERR_DRIVER);
    clear_faults();
    failures++;
  }
  if (sim != NULL) check_roundtrip(p, 1000, s0, 0x78); /* still live after the failed frees */
  weft_resource_stats_t st;
  weft_resource_stats(g, &st);
  assert_int_equal(st.live_bytes, 1000);
  assert_int_equal(st.failures, failures);
  assert_int_equal(weft_resource_deallocate(g, p, 1000, s0, ""), WEFT_OK);
  weft_resource_stats(g, &st);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.frees, 1);
  weft_resource_destroy(g);
  weft_resource_destroy(d);
  assert_int_equal(device_bytes(), base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_direct_allocates_frees_and_fails_cleanly),
      cmocka_unit_test(test_guard_finds_an_overrun_and_names_the_first_bad_byte),
      cmocka_unit_test(test_guard_quarantine_delays_reuse_by_count),
      cmocka_unit_test(test_guard_faults_at_every_driver_call),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
