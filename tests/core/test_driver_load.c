/* Loading the driver: a missing library, the toolkit's stub library and a library that is not a
 * driver all give a clean WEFT_ERR_NO_DRIVER with a message; the simulator loads; error names
 * work without any driver. Each case loads into its own table (weft__driver_load), so one
 * process can try them all; the process-wide table is tested with WEFT_DRIVER pointing nowhere. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"

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
  assert_non_null(strstr(weft_last_error(), stub));
  assert_null(d.handle);
}

static void test_non_driver_library_is_no_driver(void **state) {
  (void)state;
  weft__driver_t d;
  assert_int_equal(weft__driver_load("libm.so.6", &d), WEFT_ERR_NO_DRIVER);
  assert_non_null(strstr(weft_last_error(), "cuInit"));
  assert_non_null(strstr(weft_last_error(), "'libm.so.6'"));
  assert_null(d.handle);
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

/* The simulator loaded into a table of its own, for its fault injection. */
static weft__driver_t sim_table;
static void *sim_lookup(const char *name) { return dlsym(sim_table.handle, name); }

/* cuInit succeeds, then the driver cannot say how many devices it has: the load fails, and the
 * message names the library that was asked for (the table it was loading into is cleared). */
static void test_failed_device_count_names_the_library(void **state) {
  (void)state;
  assert_int_equal(weft__driver_load("sim", &sim_table), WEFT_OK);
  const weft_sim_api_t *sim = weft_sim_api(sim_lookup);
  assert_non_null(sim);
  assert_int_equal((sim->fail)("cuDeviceGetCount:1:CUDA_ERROR_NO_DEVICE"), 0);
  weft__driver_t d;
  weft_status_t st = weft__driver_load("sim", &d);
  assert_int_equal((sim->fail)(""), 0);
  assert_int_equal(st, WEFT_ERR_NO_DRIVER);
  assert_non_null(strstr(weft_last_error(), "'sim'"));
  assert_non_null(strstr(weft_last_error(), "CUDA_ERROR_NO_DEVICE"));
  assert_int_equal(weft_last_driver_error(), CUDA_ERROR_NO_DEVICE);
  assert_null(d.handle);
  assert_int_equal(d.path[0], '\0');
  weft__driver_unload(&sim_table);
}

/* A library whose cuInit ran stays mapped after a failed load: drivers are never dlclosed. */
static void test_library_stays_mapped_after_cuinit(void **state) {
  (void)state;
  const char *srcdir = getenv("TEST_SRCDIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/weft/tests/core/libfake_driver.so", srcdir ? srcdir : ".");
  weft__driver_t d;
  assert_int_equal(weft__driver_load(path, &d), WEFT_ERR_NO_DRIVER);
  assert_non_null(strstr(weft_last_error(), "required entry point"));
  assert_non_null(strstr(weft_last_error(), path));
  assert_null(d.handle);
  void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (h == NULL) print_error("%s was unloaded after its cuInit ran\n", path);
  assert_non_null(h);
  int *inits = dlsym(h, "fake_driver_inits");
  assert_non_null(inits);
  assert_int_equal(*inits, 1);
  /* A second attempt finds the same library, initialised once more, never unmapped. */
  assert_int_equal(weft__driver_load(path, &d), WEFT_ERR_NO_DRIVER);
  assert_int_equal(*inits, 2);
  dlclose(h); /* our own NOLOAD reference only */
}

/* A WEFT_DRIVER path longer than the table's record of it is refused, not cut short. */
static void test_overlong_path_is_refused(void **state) {
  (void)state;
  static char path[400];
  memset(path, 'x', sizeof path - 1);
  path[0] = '/';
  weft__driver_t d;
  assert_int_equal(weft__driver_load(path, &d), WEFT_ERR_NO_DRIVER);
  assert_non_null(strstr(weft_last_error(), "longer than"));
  assert_null(d.handle);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_library_is_no_driver),
      cmocka_unit_test(test_stub_library_is_no_driver),
      cmocka_unit_test(test_non_driver_library_is_no_driver),
      cmocka_unit_test(test_simulator_loads),
      cmocka_unit_test(test_failed_device_count_names_the_library),
      cmocka_unit_test(test_library_stays_mapped_after_cuinit),
      cmocka_unit_test(test_overlong_path_is_refused),
      cmocka_unit_test(test_process_driver_missing_is_sticky_and_clean),
      cmocka_unit_test(test_driver_failures_map_to_statuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
