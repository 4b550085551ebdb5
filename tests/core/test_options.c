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

/* Every numeric WEFT_* variable is plain decimal digits with at most one K, M or G suffix
 * (binary multiples, either case): no sign, no whitespace, no hex, and a leading zero is not
 * octal. Rejected values name the variable and the accepted form, and change nothing. */
static void test_numbers_are_plain_decimal(void **state) {
  (void)state;
  const struct { const char *env, *value; uint64_t want; } good[] = {
      {"WEFT_STREAM_COUNT", "010", 10},      {"WEFT_STREAM_COUNT", "08", 8},
      {"WEFT_STREAM_COUNT", "0064", 64},     {"WEFT_POOL_CHUNK_BYTES", "2m", 2ull << 20},
      {"WEFT_POOL_CHUNK_BYTES", "1G", 1ull << 30}, {"WEFT_BUDGET_BYTES", "16k", 16ull << 10},
      {"WEFT_BUDGET_BYTES", "18446744073709551615", UINT64_MAX},
      {"WEFT_BUDGET_BYTES", "17179869183G", 17179869183ull << 30},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    weft_options_t o = weft_options_default();
    setenv(good[i].env, good[i].value, 1);
    weft_status_t st = weft_options_from_env(&o);
    if (st != WEFT_OK) print_error("%s='%s': %s\n", good[i].env, good[i].value, weft_last_error());
    assert_int_equal(st, WEFT_OK);
    uint64_t got = strcmp(good[i].env, "WEFT_STREAM_COUNT") == 0       ? o.stream_count
                   : strcmp(good[i].env, "WEFT_POOL_CHUNK_BYTES") == 0 ? o.pool_chunk_bytes
                                                                       : o.budget_bytes;
    assert_int_equal(got, good[i].want);
    unsetenv(good[i].env);
  }
  const char *bad_budget[] = {" -1", "-1",  "+5",   " 5",  "5 ",   "\t5", "5\n", "0x10", "0X10", "1KK",
                              "1KB", "1 K", "1T",   "K",   "1.5G", "1e3", "--1", "18446744073709551616",
                              "99999999999999999999", "17179869184G", "16777216T", "0x", "1k1"};
  for (size_t i = 0; i < sizeof bad_budget / sizeof bad_budget[0]; i++) {
    weft_options_t o = weft_options_default();
    o.budget_bytes = 7;
    setenv("WEFT_BUDGET_BYTES", bad_budget[i], 1);
    weft_status_t st = weft_options_from_env(&o);
    if (st != WEFT_ERR_INVALID_ARGUMENT) print_error("WEFT_BUDGET_BYTES='%s' was accepted as %llu\n", bad_budget[i], (unsigned long long)o.budget_bytes);
    assert_int_equal(st, WEFT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(weft_last_error(), "WEFT_BUDGET_BYTES"));
    assert_non_null(strstr(weft_last_error(), "decimal"));
    assert_int_equal(o.budget_bytes, 7);
    unsetenv("WEFT_BUDGET_BYTES");
  }
  /* Every numeric variable follows the same rule. */
#define X(field, type, env, def, lo, hi, doc)                                        \
  {                                                                                  \
    const char *bad[] = {" 1", "+1", "0x1", "1 "};                                   \
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {                        \
      weft_options_t o = weft_options_default();                                     \
      setenv(env, bad[i], 1);                                                        \
      assert_int_equal(weft_options_from_env(&o), WEFT_ERR_INVALID_ARGUMENT);        \
      assert_non_null(strstr(weft_last_error(), env));                               \
      unsetenv(env);                                                                 \
    }                                                                                \
  }
  WEFT_OPTIONS_MAP(X)
#undef X
}

/* The runtime keeps its own copies of the two strings (a 512-byte log path, a 256-byte key):
 * validation admits exactly what fits, so nothing is ever cut short, and names the field. */
static void test_long_strings_are_rejected(void **state) {
  (void)state;
  static char path[600], key[300];
  memset(path, 'p', sizeof path - 1);
  memset(key, 'k', sizeof key - 1);
  weft_options_t o = weft_options_default();
  path[511] = '\0';
  o.log_path = path;
  assert_int_equal(weft_options_validate(&o), WEFT_OK);
  path[511] = 'p';
  path[512] = '\0';
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.log_path"));
  path[512] = 'p';
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.log_path"));
  /* Through the environment: the error names the field and the variable; *opts is unchanged. */
  o = weft_options_default();
  setenv("WEFT_LOG", path, 1);
  assert_int_equal(weft_options_from_env(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.log_path"));
  assert_non_null(strstr(weft_last_error(), "WEFT_LOG"));
  assert_null(o.log_path);
  path[511] = '\0';
  setenv("WEFT_LOG", path, 1);
  assert_int_equal(weft_options_from_env(&o), WEFT_OK);
  assert_int_equal(strlen(o.log_path), 511);
  unsetenv("WEFT_LOG");
  /* The shared key: at most WEFT_BUDGET_KEY_MAX bytes, always < 256 with its NUL. */
  assert_true(WEFT_BUDGET_KEY_MAX < 256);
  o = weft_options_default();
  key[WEFT_BUDGET_KEY_MAX] = '\0';
  o.budget_shared_key = key;
  assert_int_equal(weft_options_validate(&o), WEFT_OK);
  key[WEFT_BUDGET_KEY_MAX] = 'k';
  key[WEFT_BUDGET_KEY_MAX + 1] = '\0';
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.budget_shared_key"));
  key[WEFT_BUDGET_KEY_MAX + 1] = 'k';
  key[255] = '\0';
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  key[255] = 'k';
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.budget_shared_key"));
  o = weft_options_default();
  setenv("WEFT_BUDGET_SHARED", key, 1);
  assert_int_equal(weft_options_from_env(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "WEFT_BUDGET_SHARED"));
  assert_null(o.budget_shared_key);
  unsetenv("WEFT_BUDGET_SHARED");
  /* The key names a shared-memory object: only what weft_budget_create accepts. */
  o = weft_options_default();
  o.budget_shared_key = "a b";
  assert_int_equal(weft_options_validate(&o), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "options.budget_shared_key"));
  o.budget_shared_key = "ci-run_7.gpu0";
  assert_int_equal(weft_options_validate(&o), WEFT_OK);
  o.budget_shared_key = "";
  assert_int_equal(weft_options_validate(&o), WEFT_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_are_valid),
      cmocka_unit_test(test_each_bad_field_is_named),
      cmocka_unit_test(test_cross_field_rules),
      cmocka_unit_test(test_environment_overrides),
      cmocka_unit_test(test_bad_environment_leaves_options_unchanged),
      cmocka_unit_test(test_numbers_are_plain_decimal),
      cmocka_unit_test(test_long_strings_are_rejected),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
