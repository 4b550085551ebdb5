/* Fault injection: WEFT_SIM_FAIL at cuInit and weft_sim_api_t.fail(), "NAME:N:CODE" (the Nth
 * call) and "NAME:N+:CODE" (the Nth and later), counted from when the spec is set. */
#include <stdlib.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;

/* cmocka defines a function-like macro fail(): call the table's member through parentheses. */
static int set_faults(const char *spec) { return (api->fail)(spec); }

static int setup(void **state) {
  (void)state;
  setenv("WEFT_SIM_FAIL", "cuEventCreate:1:CUDA_ERROR_OUT_OF_MEMORY", 1);
  api = sim_test_init();
  return 0;
}

static void test_environment_spec_applies_from_cuInit(void **state) {
  (void)state;
  CUevent e;
  CU_IS(CUDA_ERROR_OUT_OF_MEMORY, cuEventCreate(&e, 0));
  CU_OK(cuEventCreate(&e, 0));
  CU_OK(cuEventDestroy(e));
}

static void test_nth_call_fails_once(void **state) {
  (void)state;
  weft_sim_stats_t before, after;
  api->stats(&before);
  assert_int_equal(set_faults("cuMemAlloc:2:2"), 0);
  CUdeviceptr a, b, c;
  CU_OK(cuMemAlloc(&a, 256));
  CU_IS(2, cuMemAlloc(&b, 256));
  CU_OK(cuMemAlloc(&c, 256));
  api->stats(&after);
  assert_int_equal(after.faults_injected, before.faults_injected + 1);
  CU_OK(cuMemFree(a));
  CU_OK(cuMemFree(c));
}

static void test_nth_and_later_calls_fail(void **state) {
  (void)state;
  assert_int_equal(set_faults("cuStreamCreateWithPriority:2+:999;cuMemFree:1:1"), 0);
  CUstream s, t;
  CU_OK(cuStreamCreateWithPriority(&s, 0, 0));
  for (int i = 0; i < 5; i++) CU_IS(999, cuStreamCreateWithPriority(&t, 0, 0));
  assert_int_equal(set_faults(""), 0);
  CU_OK(cuStreamCreateWithPriority(&t, 0, 0));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(t));
}

static void test_malformed_spec_is_rejected_and_changes_nothing(void **state) {
  (void)state;
  assert_int_equal(set_faults("cuEventQuery:1+:CUDA_ERROR_NOT_READY"), 0);
  assert_int_equal(set_faults("cuMemAlloc:0:2"), -1);
  assert_int_equal(set_faults("cuNoSuchCall:1:2"), -1);
  assert_int_equal(set_faults("cuMemAlloc_v2:1:2"), -1); /* names are cuda.h's base names */
  assert_int_equal(set_faults("cuMemAlloc:1"), -1);
  assert_int_equal(set_faults("cuMemAlloc:x:2"), -1);
  assert_int_equal(set_faults("cuMemAlloc:1:NOT_A_CODE"), -1);
  CUevent e;
  CU_OK(cuEventCreate(&e, 0));
  CU_IS(CUDA_ERROR_NOT_READY, cuEventQuery(e)); /* the earlier spec still holds */
  assert_int_equal(set_faults(NULL), 0);
  CU_OK(cuEventQuery(e));
  CU_OK(cuEventDestroy(e));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_environment_spec_applies_from_cuInit),
      cmocka_unit_test(test_nth_call_fails_once),
      cmocka_unit_test(test_nth_and_later_calls_fail),
      cmocka_unit_test(test_malformed_spec_is_rejected_and_changes_nothing),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
