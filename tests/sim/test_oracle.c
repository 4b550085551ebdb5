/* The race oracle's rules: reads never race with reads; exact byte ranges; host copies run on the
 * host's clock; allocation and free are writes (use after free is a race); stream order, event
 * waits and host synchronisation are happens-before; descriptions name both sides. */
#include <string.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;
static CUstream a, b;
static CUdeviceptr x, y, z;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  a = sim_test_stream();
  b = sim_test_stream();
  CU_OK(cuMemAlloc(&x, 4096));
  CU_OK(cuMemAlloc(&y, 4096));
  CU_OK(cuMemAlloc(&z, 4096));
  return 0;
}

static int reset(void **state) {
  (void)state;
  assert_int_equal(cuCtxSynchronize(), CUDA_SUCCESS);
  api->reset_races();
  return 0;
}

static uint64_t races_after_sync(void) {
  CU_OK(cuCtxSynchronize());
  return api->race_count();
}

static void test_two_reads_on_different_streams_do_not_race(void **state) {
  (void)state;
  CU_OK(sim_test_copy(a, y, x, 1024));
  CU_OK(sim_test_copy(b, z, x, 1024));
  assert_int_equal(races_after_sync(), 0);
}

static void test_write_after_read_on_another_stream_races(void **state) {
  (void)state;
  CU_OK(sim_test_copy(a, y, x, 1024));
  CU_OK(sim_test_fill(b, x, 1024, 1));
  assert_int_equal(races_after_sync(), 1);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_true(strstr(r.first_desc, "sim_test_copy") || strstr(r.second_desc, "sim_test_copy"));
  assert_true(strstr(r.first_desc, "stream") != NULL);
}

static void test_disjoint_ranges_do_not_race_and_overlaps_are_exact(void **state) {
  (void)state;
  CU_OK(sim_test_fill(a, x, 512, 1));          /* bytes [0, 2048) */
  CU_OK(sim_test_fill(b, x + 2048, 512, 2));   /* bytes [2048, 4096) */
  assert_int_equal(races_after_sync(), 0);
  CU_OK(sim_test_fill(a, x + 1000, 100, 1));   /* [1000, 1400) */
  CU_OK(sim_test_fill(b, x + 1200, 300, 2));   /* [1200, 2400) */
  assert_int_equal(races_after_sync(), 1);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_int_equal(r.ptr, x + 1200);
  assert_int_equal(r.bytes, 200);
  assert_true(r.first_writes && r.second_writes);
}

static void test_stream_order_and_host_sync_are_happens_before(void **state) {
  (void)state;
  CU_OK(sim_test_fill(a, x, 1024, 1));
  CU_OK(sim_test_copy(a, y, x, 1024));
  CU_OK(sim_test_fill(a, x, 1024, 2));
  CU_OK(cuStreamSynchronize(a));
  CU_OK(sim_test_fill(b, x, 1024, 3));
  CU_OK(cuStreamSynchronize(b));
  assert_int_equal(sim_test_read(x, 0), 3);
  assert_int_equal(sim_test_read(y, 0), 1);
  assert_int_equal(races_after_sync(), 0);
}

static void test_sync_copy_of_unsynchronised_stream_data_races(void **state) {
  (void)state;
  unsigned v;
  CU_OK(sim_test_fill(a, x, 1024, 1));
  CU_OK(cuMemcpyDtoH(&v, x, 4));
  assert_int_equal(races_after_sync(), 1);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_true(r.first_stream == -1 || r.second_stream == -1);
  api->reset_races();
  CU_OK(cuMemcpyHtoD(x, &v, 4)); /* the host's write, then a stream's read */
  CU_OK(sim_test_copy(a, y, x, 1024));
  assert_int_equal(races_after_sync(), 0);
}

static void test_event_query_counts_as_host_synchronisation(void **state) {
  (void)state;
  CUevent e;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU_OK(sim_test_fill(a, x, 1024, 5));
  CU_OK(cuEventRecord(e, a));
  while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) {
  }
  unsigned v = 0;
  CU_OK(cuMemcpyDtoH(&v, x, 4));
  assert_int_equal(v, 5);
  assert_int_equal(races_after_sync(), 0);
  CU_OK(cuEventDestroy(e));
}

static void test_use_not_ordered_before_free_is_a_race(void **state) {
  (void)state;
  CUdeviceptr p;
  CU_OK(cuMemAllocAsync(&p, 4096, a));
  CU_OK(sim_test_fill(a, p, 1024, 1));
  CUevent e;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuEventRecord(e, a));
  CU_OK(cuStreamWaitEvent(b, e, 0));
  CU_OK(sim_test_copy(b, y, p, 1024)); /* reader on b */
  CU_OK(cuMemFreeAsync(p, a));          /* free on a, not after b's read */
  assert_true(races_after_sync() >= 1);
  api->reset_races();
  /* ordered properly: no race */
  CU_OK(cuMemAllocAsync(&p, 4096, a));
  CU_OK(sim_test_fill(a, p, 1024, 1));
  CU_OK(cuEventRecord(e, a));
  CU_OK(cuStreamWaitEvent(b, e, 0));
  CU_OK(sim_test_copy(b, y, p, 1024));
  CU_OK(cuEventRecord(e, b));
  CU_OK(cuStreamWaitEvent(a, e, 0));
  CU_OK(cuMemFreeAsync(p, a));
  assert_int_equal(races_after_sync(), 0);
  CU_OK(cuEventDestroy(e));
}

static void test_kernel_after_free_touches_no_live_allocation(void **state) {
  (void)state;
  CUdeviceptr p;
  CU_OK(cuMemAllocAsync(&p, 4096, a));
  CU_OK(cuMemFreeAsync(p, a));
  CU_OK(sim_test_fill(a, p, 1024, 1)); /* kernel arguments are not checked at launch, as on a GPU */
  assert_true(races_after_sync() >= 1);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_true(strstr(r.first_desc, "free") != NULL || strstr(r.first_desc, "no live") != NULL);
}

static void test_oracle_off_reports_nothing(void **state) {
  (void)state;
  int old = api->set_oracle(0);
  assert_int_equal(old, 1);
  CU_OK(sim_test_fill(a, x, 1024, 1));
  CU_OK(sim_test_fill(b, x, 1024, 2));
  assert_int_equal(races_after_sync(), 0);
  api->set_oracle(1);
}

static void test_report_prints_and_stats_count(void **state) {
  (void)state;
  CU_OK(sim_test_fill(a, x, 1024, 1));
  CU_OK(sim_test_fill(b, x, 1024, 2));
  assert_int_equal(races_after_sync(), 1);
  weft_sim_stats_t st;
  api->stats(&st);
  assert_int_equal(st.races, 1);
  assert_true(st.ops_executed > 0);
  assert_true(st.api_calls > st.ops_executed);
  api->print_report();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_two_reads_on_different_streams_do_not_race, reset),
      cmocka_unit_test_setup(test_write_after_read_on_another_stream_races, reset),
      cmocka_unit_test_setup(test_disjoint_ranges_do_not_race_and_overlaps_are_exact, reset),
      cmocka_unit_test_setup(test_stream_order_and_host_sync_are_happens_before, reset),
      cmocka_unit_test_setup(test_sync_copy_of_unsynchronised_stream_data_races, reset),
      cmocka_unit_test_setup(test_event_query_counts_as_host_synchronisation, reset),
      cmocka_unit_test_setup(test_use_not_ordered_before_free_is_a_race, reset),
      cmocka_unit_test_setup(test_kernel_after_free_touches_no_live_allocation, reset),
      cmocka_unit_test_setup(test_oracle_off_reports_nothing, reset),
      cmocka_unit_test_setup(test_report_prints_and_stats_count, reset),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
