/* The scheduler: one seed gives one interleaving, different seeds give different ones, and each
 * stream still runs its work in issue order. */
#include <string.h>

#include "tests/sim/sim_test.h"

#define STREAMS 4
#define PER_STREAM 16

static const weft_sim_api_t *api;
static unsigned char g_trace[STREAMS * PER_STREAM];
static size_t g_ntrace;

static void record(void *p) { g_trace[g_ntrace++] = (unsigned char)(uintptr_t)p; }

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

/* Issues PER_STREAM host functions round-robin on STREAMS streams; returns the run order. */
static void run(uint64_t seed, unsigned char *out) {
  CUstream s[STREAMS];
  for (int i = 0; i < STREAMS; i++) s[i] = sim_test_stream();
  api->seed(seed);
  g_ntrace = 0;
  for (int k = 0; k < PER_STREAM; k++)
    for (int i = 0; i < STREAMS; i++) CU_OK(cuLaunchHostFunc(s[i], record, (void *)(uintptr_t)(i * PER_STREAM + k)));
  CU_OK(cuCtxSynchronize());
  assert_int_equal(g_ntrace, STREAMS * PER_STREAM);
  memcpy(out, g_trace, sizeof g_trace);
  for (int i = 0; i < STREAMS; i++) CU_OK(cuStreamDestroy(s[i]));
}

static void test_same_seed_gives_same_interleaving(void **state) {
  (void)state;
  unsigned char a[sizeof g_trace], b[sizeof g_trace];
  run(7, a);
  run(7, b);
  assert_memory_equal(a, b, sizeof a);
}

static void test_different_seeds_give_different_interleavings(void **state) {
  (void)state;
  unsigned char first[sizeof g_trace], other[sizeof g_trace];
  run(1, first);
  int differ = 0;
  for (uint64_t seed = 2; seed < 12; seed++) {
    run(seed, other);
    differ += memcmp(first, other, sizeof first) != 0;
  }
  assert_true(differ >= 5);
}

static void test_each_stream_runs_in_issue_order(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed < 20; seed++) {
    unsigned char t[sizeof g_trace];
    run(seed, t);
    int next[STREAMS] = {0};
    for (size_t j = 0; j < sizeof t; j++) {
      int stream = t[j] / PER_STREAM, k = t[j] % PER_STREAM;
      assert_int_equal(k, next[stream]);
      next[stream]++;
    }
  }
}

static void test_streams_interleave_not_run_one_after_another(void **state) {
  (void)state;
  unsigned char t[sizeof g_trace];
  run(3, t);
  size_t switches = 0;
  for (size_t j = 1; j < sizeof t; j++) switches += t[j] / PER_STREAM != t[j - 1] / PER_STREAM;
  assert_true(switches > STREAMS * 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_seed_gives_same_interleaving),
      cmocka_unit_test(test_different_seeds_give_different_interleavings),
      cmocka_unit_test(test_each_stream_runs_in_issue_order),
      cmocka_unit_test(test_streams_interleave_not_run_one_after_another),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
