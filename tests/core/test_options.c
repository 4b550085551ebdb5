/* Options: defaults are valid, every field's range is enforced, environment overrides parse and
 * fail cleanly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "weft/weft.h"

static void test_defaults_are_valid(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  assert_int_equal(weft_options_validate(&o), WEFT_OK);
  assert_int_equal(o.stream_count, 8);
  assert_int_equal(o.event_ring, 64);
  assert_null(o.log_path);
}

/* Each field below its minimum and above its maximum is rejected, and the message names it. */
static void test_each_bad_field_is_named(void **state) {
  (void)state;
#define X(field, type, env, def, lo, hi, doc)                                        \
  {                                                                                  \
    weft_options_t o = weft_options_default();                                       \
    if ((uint64_t)(lo) > 0) {                                                        \
      o.field = (type)((uint64_t)(lo) - 1);                                          \
      assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);        \
      assert_non_null(strstr(weft_last_error(), "options." #field));                 \
    }                                                                                \
    o = weft_options_default();                                                      \
    if ((uint64_t)(hi) < (uint64_t)((type)-1)) {                                     \
      o.field = (type)((uint64_t)(hi) + 1);                                          \
      assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);        \
      assert_non_null(strstr(weft_last_error(), "options." #field));                 \
    }                                                                                \
  }
  WEFT_OPTIONS_MAP(X)
#undef X
}

static void test_cross_field_rules(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_count = 2;
  o.high_priority_streams = 3;
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "high_priority_streams"));
  o = weft_options_default();
  o.event_ring = 48;
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "power of two"));
  o = weft_options_default();
  o.budget_shared_key = "a/b";
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_options_validate(NULL), WEFT_ERR_INVALID_ARGUMENT);
}

static void test_environment_overrides(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  setenv("WEFT_STREAM_COUNT", "16", 1);
  setenv("WEFT_POOL_CHUNK_BYTES", "32M", 1);
  setenv("WEFT_LOG", "/tmp/x.csv", 1);
  assert_int_equal(weft_options_from_env(&o), WEFT_OK);
  assert_int_equal(o.stream_count, 16);
  assert_int_equal(o.pool_chunk_bytes, 32u << 20);
  assert_string_equal(o.log_path, "/tmp/x.csv");
  unsetenv("WEFT_STREAM_COUNT");
  unsetenv("WEFT_POOL_CHUNK_BYTES");
  unsetenv("WEFT_LOG");
}

/* A bad variable is an error naming it, and the options stay as they were. */
static void test_bad_environment_leaves_options_unchanged(void **state) {
  (void)state;
  const char *bad[][2] = {{"WEFT_STREAM_COUNT", "0"},  {"WEFT_STREAM_COUNT", "65"},
                          {"WEFT_STREAM_COUNT", "x"},  {"WEFT_EVENT_RING", "-4"},
                          {"WEFT_EVENT_RING", "12"},   {"WEFT_GUARD", "2"},
                          {"WEFT_BUDGET_BYTES", "1Q"}, {"WEFT_POOL_CHUNK_BYTES", "99999999999999999999"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    weft_options_t o = weft_options_default();
    o.stream_count = 3;
    setenv(bad[i][0], bad[i][1], 1);
    assert_int_equal(weft_options_from_env(&o), WEFT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(weft_last_error(), strcmp(bad[i][0], "WEFT_EVENT_RING") == 0 && strcmp(bad[i][1], "12") == 0 ? "event_ring" : bad[i][0]));
    assert_int_equal(o.stream_count, 3);
    unsetenv(bad[i][0]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_are_valid),
      cmocka_unit_test(test_each_bad_field_is_named),
      cmocka_unit_test(test_cross_field_rules),
      cmocka_unit_test(test_environment_overrides),
      cmocka_unit_test(test_bad_environment_leaves_options_unchanged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
