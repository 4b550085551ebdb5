#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "weft/weft.h"

static void test_every_status_has_a_distinct_name_and_message(void **state) {
  (void)state;
  static const weft_status_t all[] = {
#define X(name, code, msg) WEFT_##name,
      WEFT_STATUS_MAP(X)
#undef X
  };
  size_t n = sizeof all / sizeof all[0];
  for (size_t i = 0; i < n; i++) {
    assert_true(strncmp(weft_status_name(all[i]), "WEFT_", 5) == 0);
    assert_string_not_equal(weft_status_str(all[i]), "unknown weft status");
    for (size_t j = 0; j < i; j++) {
      assert_int_not_equal(all[i], all[j]);
      assert_string_not_equal(weft_status_name(all[i]), weft_status_name(all[j]));
    }
  }
  assert_string_equal(weft_status_name(WEFT_ERR_NO_DRIVER), "WEFT_ERR_NO_DRIVER");
  assert_string_equal(weft_status_name((weft_status_t)12345), "WEFT_UNKNOWN_STATUS");
  assert_string_equal(weft_status_str((weft_status_t)12345), "unknown weft status");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_status_has_a_distinct_name_and_message),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
