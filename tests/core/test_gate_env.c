/* WEFT_GATE, read when weft loads the driver (lib/core/gate.h): built twice, with WEFT_GATE=process
 * (the scope is applied, and weft works) and WEFT_GATE=bogus (every call that needs the driver
 * fails with INVALID_ARGUMENT naming the variable, and makes nothing), on the simulator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/gate.h"
#include "weft/weft.h"

static void test_weft_gate_from_the_environment(void **state) {
  (void)state;
  const char *gate = getenv("WEFT_GATE");
  assert_non_null(gate);
  weft_runtime_t *rt = NULL;
  weft_status_t st = weft_runtime_get(0, NULL, &rt);
  if (strcmp(gate, "process") == 0) {
    assert_int_equal(st, WEFT_OK);
    assert_int_equal(weft__gate_scope(), WEFT__GATE_PROCESS);
    weft_stream_t *s;
    weft_block_t b;
    assert_int_equal(weft_stream_get(rt, 0, &s), WEFT_OK);
    assert_int_equal(weft_alloc(rt, 256, s, "b", &b), WEFT_OK);
    assert_int_equal(weft_memset32(s, b, 0, 7, 256), WEFT_OK);
    assert_int_equal(weft_free(b, s), WEFT_OK);
    assert_int_equal(weft_runtime_synchronize(rt), WEFT_OK);
    assert_int_equal(weft_runtime_release(rt), WEFT_OK);
  } else {
    assert_int_equal(st, WEFT_ERR_INVALID_ARGUMENT);
    assert_null(rt);
    assert_non_null(strstr(weft_last_error(), "WEFT_GATE='bogus'"));
    assert_int_equal(weft_runtime_get(0, NULL, &rt), WEFT_ERR_INVALID_ARGUMENT); /* and again */
    assert_null(rt);
    assert_int_equal(weft__gate_scope(), WEFT__GATE_PER_DEVICE);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_weft_gate_from_the_environment)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
