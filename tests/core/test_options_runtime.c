/* Options a runtime would have to cut short are refused by weft_runtime_get before anything is
 * created: no driver call, no runtime (a later get creates one with its own options), no log
 * file under a truncated name. On the simulator (the driver call count proves it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "weft/weft.h"
#include "sim/weft_sim.h"

static uint64_t driver_calls(const weft_sim_api_t *sim) {
  weft_sim_stats_t st;
  sim->stats(&st);
  return st.api_calls;
}

/* No runtime is alive on device 0: a get creates one, with these options. */
static void assert_no_runtime(void) {
  weft_options_t o = weft_options_default();
  o.stream_count = 3;
  o.high_priority_streams = 1;
  weft_runtime_t *rt = NULL;
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_OK);
  weft_options_t got;
  assert_int_equal(weft_runtime_options(rt, &got), WEFT_OK);
  assert_int_equal(got.stream_count, 3);
  assert_null(got.log_path);
  assert_null(got.budget_shared_key);
  assert_int_equal(weft_runtime_release(rt), WEFT_OK);
}

static void test_long_log_path_creates_nothing(void **state) {
  (void)state;
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL) skip();
  /* A path whose first 511 bytes name a file that could be created: "<tmp>/././.../LLLL...". */
  const char *tmp = getenv("TEST_TMPDIR");
  if (tmp == NULL) tmp = "/tmp";
  static char path[700];
  int n = snprintf(path, sizeof path, "%s/", tmp);
  while (n < 400) n += snprintf(path + n, sizeof path - (size_t)n, "./");
  memset(path + n, 'L', 200);
  path[n + 200] = '\0';
  assert_true(strlen(path) > 511);
  char truncated[512];
  memcpy(truncated, path, 511);
  truncated[511] = '\0';
  weft_options_t o = weft_options_default();
  o.log_path = path;
  uint64_t calls = driver_calls(sim);
  weft_runtime_t *rt = NULL;
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.log_path"));
  assert_null(rt);
  assert_int_equal(driver_calls(sim), calls);
  assert_int_equal(access(truncated, F_OK), -1);
  assert_no_runtime();
}

static void test_long_shared_key_creates_nothing(void **state) {
  (void)state;
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL) skip();
  static char key[256];
  memset(key, 'k', sizeof key - 1);
  key[255] = '\0';
  weft_options_t o = weft_options_default();
  o.budget_shared_key = key;
  uint64_t calls = driver_calls(sim);
  weft_runtime_t *rt = NULL;
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.budget_shared_key"));
  assert_null(rt);
  assert_int_equal(driver_calls(sim), calls);
  assert_no_runtime();
}

/* release_threshold reaches the driver's pool under the runtime's stack (memory 0 and 1), from
 * the options and from WEFT_RELEASE_THRESHOLD; the default keeps everything cached. */
static void threshold_of(const weft_options_t *o, uint64_t want) {
  weft_runtime_t *rt = NULL;
  assert_int_equal(weft_runtime_get(0, o, &rt), WEFT_OK);
  weft_resource_t *r = weft_runtime_resource(rt);
  while (r != NULL && weft_async_pool(r) == NULL) r = r->upstream;
  assert_non_null(r);
  uint64_t v = 1;
  assert_int_equal(weft_async_get_attribute(r, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v), WEFT_OK);
  assert_int_equal(v, want);
  assert_int_equal(weft_runtime_release(rt), WEFT_OK);
}

static void test_release_threshold_reaches_the_driver_pool(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  threshold_of(&o, UINT64_MAX);
  o.release_threshold = 0;
  threshold_of(&o, 0);
  o.memory = WEFT_MEMORY_ASYNC;
  o.release_threshold = 32u << 20;
  threshold_of(&o, 32u << 20);
  setenv("WEFT_RELEASE_THRESHOLD", "16M", 1);
  o = weft_options_default();
  assert_int_equal(weft_options_from_env(&o), WEFT_OK);
  unsetenv("WEFT_RELEASE_THRESHOLD");
  assert_int_equal(o.release_threshold, 16u << 20);
  threshold_of(&o, 16u << 20);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_long_log_path_creates_nothing),
      cmocka_unit_test(test_long_shared_key_creates_nothing),
      cmocka_unit_test(test_release_threshold_reaches_the_driver_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
