/* The oracle's positive control: a kernel writing a buffer on stream A and a kernel reading it on
 * stream B are a race on every seed when the event wait between them is left out, and are
 * never one when cuEventRecord + cuStreamWaitEvent order them. */
#include <stdio.h>
#include <string.h>

#include "tests/sim/sim_test.h"

#define SEEDS 128u
#define N 1024u

static const weft_sim_api_t *api;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

/* Runs write-on-A, read-on-B once with this seed; returns the races found. */
static uint64_t run_once(uint64_t seed, int with_wait, CUdeviceptr x, CUdeviceptr y, CUstream a, CUstream b, CUevent e) {
  api->seed(seed);
  api->reset_races();
  CU_OK(sim_test_fill(a, x, N, (unsigned)seed));
  if (with_wait) {
    CU_OK(cuEventRecord(e, a));
    CU_OK(cuStreamWaitEvent(b, e, 0));
  }
  CU_OK(sim_test_copy(b, y, x, N));
  CU_OK(cuStreamSynchronize(a));
  CU_OK(cuStreamSynchronize(b));
  return api->race_count();
}

static void test_missing_wait_is_reported_on_every_seed(void **state) {
  (void)state;
  CUdeviceptr x, y;
  CU_OK(cuMemAlloc(&x, N * 4));
  CU_OK(cuMemAlloc(&y, N * 4));
  CUstream a = sim_test_stream(), b = sim_test_stream();
  CUevent e;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  for (uint64_t seed = 1; seed <= SEEDS; seed++) {
    uint64_t races = run_once(seed, 0, x, y, a, b, e);
    if (races != 1) fprintf(stderr, "seed %llu: %llu races\n", (unsigned long long)seed, (unsigned long long)races);
    assert_int_equal(races, 1);
    weft_sim_race_t r;
    assert_int_equal(api->races(&r, 1), 1);
    assert_true(r.first_writes != r.second_writes); /* a write and a read */
    assert_int_equal(r.ptr, x);
    assert_int_equal(r.bytes, N * 4);
    assert_true(strstr(r.first_desc, "sim_test_") != NULL);
    assert_true(strstr(r.second_desc, "sim_test_") != NULL);
    assert_true(r.first_stream != r.second_stream);
  }
  printf("missing wait reported as a race on all %u seeds\n", SEEDS);
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuStreamDestroy(b));
  CU_OK(cuMemFree(x));
  CU_OK(cuMemFree(y));
}

static void test_event_wait_orders_the_read_on_every_seed(void **state) {
  (void)state;
  CUdeviceptr x, y;
  CU_OK(cuMemAlloc(&x, N * 4));
  CU_OK(cuMemAlloc(&y, N * 4));
  CUstream a = sim_test_stream(), b = sim_test_stream();
  CUevent e;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  for (uint64_t seed = 1; seed <= SEEDS; seed++) {
    uint64_t races = run_once(seed, 1, x, y, a, b, e);
    if (races != 0) api->print_report();
    assert_int_equal(races, 0);
    /* and the data flowed: the read saw the write */
    assert_int_equal(sim_test_read(y, 0), (unsigned)seed);
    assert_int_equal(sim_test_read(y, N - 1), (unsigned)seed);
  }
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuStreamDestroy(b));
  CU_OK(cuMemFree(x));
  CU_OK(cuMemFree(y));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_wait_is_reported_on_every_seed),
      cmocka_unit_test(test_event_wait_orders_the_read_on_every_seed),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
