/* Loading the driver: a missing library, the toolkit's stub library and a library that is not a
 * driver all give a clean WEFT_ERR_NO_DRIVER with a message; the simulator loads; error names
 * work without any driver. Each case loads into its own table (weft__driver_load), so one
 * process can try them all; the process-wide table is tested with WEFT_DRIVER pointing nowhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"

static void test_missing_library_is_no_driver(void **state) {
  (void)state;
  weft__driver_t d;
  assert_int_equal(weft__driver_load("/nonexistent/libcuda.so.1", &d), WEFT_ERR_NO_DRIVER);
  assert_non_null(strstr(weft_last_error(), "/nonexistent/libcuda.so.1"));
  assert_null(d.handle);
}

static void test_stub_library_is_no_driver(void **state) {
  (void)state;
  const char *stub = getenv("WEFT_TEST_STUB");
  if (stub == NULL) stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  weft__driver_t d;
  assert_int_equal(weft__driver_load(stub, &d), WEFT_ERR_NO_DRIVER);
  /* The stub's cuInit says CUDA_ERROR_STUB_LIBRARY, and weft says so in words. */
  assert_non_null(strstr(weft_last_error(), "cuInit"));
  assert_int_equal(weft_last_driver_error(), CUDA_ERROR_STUB_LIBRARY);
  assert_non_null(strstr(weft_last_error(), "stub"));
}

static void test_non_driver_library_is_no_driver(void **state) {
  (void)state;
  weft__driver_t d;
  assert_int_equal(weft__driver_load("libm.so.6", &d), WEFT_ERR_NO_DRIVER);
  assert_non_null(strstr(weft_last_error(), "cuInit"));
}

static void test_simulator_loads(void **state) {
  (void)state;
  weft__driver_t d;
  assert_int_equal(weft__driver_load("sim", &d), WEFT_OK);
  assert_int_equal(d.info.is_simulator, 1);
  assert_int_equal(d.info.via_proc_address, 0);
  assert_true(d.info.version >= 12000);
  assert_true(d.info.device_count >= 1);
  assert_non_null(d.cuMemAlloc);
  assert_non_null(d.cuGraphAddMemAllocNode);
  assert_int_equal(d.info.missing_optional, 0);
  weft__driver_unload(&d);
}

/* The process table: WEFT_DRIVER names nothing, so every call says NO_DRIVER, every time. */
static void test_process_driver_missing_is_sticky_and_clean(void **state) {
  (void)state;
  setenv("WEFT_DRIVER", "/nonexistent/driver.so", 1);
  weft_driver_info_t info;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(weft_driver_info(&info), WEFT_ERR_NO_DRIVER);
    assert_non_null(strstr(weft_last_error(), "/nonexistent/driver.so"));
  }
  assert_null(weft_driver_symbol("weft_sim_get_api"));
  /* What needs no driver still works. */
  assert_string_equal(weft_driver_error_name(CUDA_ERROR_INVALID_VALUE), "CUDA_ERROR_INVALID_VALUE");
  assert_string_equal(weft_driver_error_name(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
                      "CUDA_ERROR_STREAM_CAPTURE_ISOLATION");
  assert_string_equal(weft_driver_error_name((CUresult)987654), "CUDA_ERROR_UNKNOWN_CODE");
  assert_int_equal(weft_driver_info(NULL), WEFT_ERR_INVALID_ARGUMENT);
}

static void test_driver_failures_map_to_statuses(void **state) {
  (void)state;
  assert_int_equal(weft__driver_fail(CUDA_ERROR_OUT_OF_MEMORY, "x"), WEFT_ERR_OUT_OF_MEMORY);
  assert_int_equal(weft_last_driver_error(), CUDA_ERROR_OUT_OF_MEMORY);
  assert_int_equal(weft__driver_fail(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "x"), WEFT_ERR_CAPTURE);
  assert_int_equal(weft__driver_fail(CUDA_ERROR_INVALID_VALUE, "cuFoo(1)"), WEFT_ERR_DRIVER);
  assert_non_null(strstr(weft_last_error(), "cuFoo(1)"));
  assert_non_null(strstr(weft_last_error(), "CUDA_ERROR_INVALID_VALUE"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_library_is_no_driver),
      cmocka_unit_test(test_stub_library_is_no_driver),
      cmocka_unit_test(test_non_driver_library_is_no_driver),
      cmocka_unit_test(test_simulator_loads),
      cmocka_unit_test(test_process_driver_missing_is_sticky_and_clean),
      cmocka_unit_test(test_driver_failures_map_to_statuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
