/* Pattern suite (fork-join, pipeline, diamond, all-to-all) and random programs: every run is
 * race-free (oracle), computes what the sequential program computes, and issues exactly as many
 * waits as the transitive reduction of its dependency graph has cross-stream edges (computed
 * independently in program.c). Positive control: the same random program with weft's waits
 * turned off is reported racy. WEFT_TEST_SEEDS sets how many random seeds run (default 12).
 *
 * The suite runs twice. With eager records (options.lazy_records = 0) every use records its own
 * event, and the count is exact. With lazy records (the default) a stream's ticks may cover
 * several uses; a wait for one that is not the newest of them waits for more than it needs
 * (counters.late_waits) and may imply a later need, so the count is exact while no wait was
 * late, and otherwise at most the reduction's (never a redundant wait). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "lib/runtime/runtime.h"
#include "tests/streams/program.h"

static tu_env_t env;
static unsigned g_lazy;

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  o.event_ring = 4096; /* no eviction: the count must be exact */
  o.lazy_records = g_lazy;
  return tu_init(&env, &o);
}
static int setup_lazy(void **state) {
  g_lazy = 1;
  return setup(state);
}
static int setup_eager(void **state) {
  g_lazy = 0;
  return setup(state);
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}

static void run_and_check(const prog_t *p, const char *name, uint64_t expected_or_0) {
  tu_reset_races(&env);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  uint64_t waits = 0, minimal = prog_reduction_edges(p);
  (void)prog_run(&env, p, &waits, 1);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  uint64_t late = c1.late_waits - c0.late_waits;
  printf("%-12s uses %4u  waits %4llu  minimal %4llu  late %3llu  events %4llu  races %llu\n", name, p->uses,
         (unsigned long long)waits, (unsigned long long)minimal, (unsigned long long)late,
         (unsigned long long)(c1.events_recorded - c0.events_recorded), (unsigned long long)tu_races(&env));
  if (tu_races(&env) != 0) tu_print_races(&env);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(c1.ring_evictions, c0.ring_evictions);
  if (!g_lazy) assert_int_equal(late, 0);
  if (late == 0) assert_int_equal(waits, minimal);
  else assert_true(waits <= minimal);
  if (expected_or_0) assert_int_equal(minimal, expected_or_0);
  assert_true(weft__tracker_is_valid(&env.rt->tracker));
}

static void test_fork_join(void **state) {
  (void)state;
  prog_t p;
  prog_fork_join(&p);
  run_and_check(&p, "fork-join", 14);
  prog_free(&p);
}

static void test_pipeline(void **state) {
  (void)state;
  prog_t p;
  prog_pipeline(&p);
  run_and_check(&p, "pipeline", 0);
  prog_free(&p);
}

static void test_diamond(void **state) {
  (void)state;
  prog_t p;
  prog_diamond(&p);
  run_and_check(&p, "diamond", 0);
  prog_free(&p);
}

static void test_all_to_all(void **state) {
  (void)state;
  prog_t p;
  prog_all_to_all(&p);
  run_and_check(&p, "all-to-all", 0);
  prog_free(&p);
}

static unsigned seeds(void) {
  const char *e = getenv("WEFT_TEST_SEEDS");
  return e ? (unsigned)strtoul(e, NULL, 10) : 12;
}

static void test_random_programs_issue_minimal_waits(void **state) {
  (void)state;
  for (unsigned seed = 1; seed <= seeds(); seed++) {
    prog_t p;
    prog_init(&p, 50, 8, 64);
    prog_random(&p, 1000, seed);
    char name[32];
    snprintf(name, sizeof name, "random #%u", seed);
    run_and_check(&p, name, 0);
    prog_free(&p);
  }
}

/* With a small ring, waits on evicted ticks use newer events. Pruning then uses only what the
 * evicted tick itself implies, so a few more waits than the minimum may be issued (at most one
 * per eviction), never a race. */
static void test_random_program_with_ring_evictions_stays_correct(void **state) {
  (void)state;
  tu_fini(&env);
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  o.event_ring = 4;
  o.lazy_records = g_lazy;
  assert_int_equal(tu_init(&env, &o), 0);
  prog_t p;
  prog_init(&p, 50, 8, 64);
  prog_random(&p, 1000, 77);
  tu_reset_races(&env);
  uint64_t waits;
  (void)prog_run(&env, &p, &waits, 1);
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  printf("ring 4: waits %llu (minimal %llu), evictions %llu, races %llu\n", (unsigned long long)waits,
         (unsigned long long)prog_reduction_edges(&p), (unsigned long long)c.ring_evictions,
         (unsigned long long)tu_races(&env));
  assert_true(c.ring_evictions > 0);
  assert_true(waits <= prog_reduction_edges(&p) + c.ring_evictions);
  assert_int_equal(tu_races(&env), 0);
  prog_free(&p);
  tu_fini(&env);
  assert_int_equal(setup(NULL), 0);
}

/* Positive control: without weft's waits the same program is wrong: the simulator's oracle
 * reports races; on a GPU the spinning kernels produce wrong data. */
static void test_without_waits_the_same_program_races(void **state) {
  (void)state;
  prog_t p;
  prog_init(&p, 50, 8, 64);
  prog_random(&p, 1000, 5);
  tu_reset_races(&env);
  env.rt->tracker.no_waits = true;
  uint64_t waits;
  uint64_t wrong = prog_run(&env, &p, &waits, 0);
  env.rt->tracker.no_waits = false;
  printf("waits off: %llu races reported, %llu wrong elements\n", (unsigned long long)tu_races(&env),
         (unsigned long long)wrong);
  assert_int_equal(waits, 0);
  if (env.sim != NULL) assert_true(tu_races(&env) > 0);
  else assert_true(wrong > 0);
  tu_reset_races(&env);
  prog_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_join),
      cmocka_unit_test(test_pipeline),
      cmocka_unit_test(test_diamond),
      cmocka_unit_test(test_all_to_all),
      cmocka_unit_test(test_random_programs_issue_minimal_waits),
      cmocka_unit_test(test_random_program_with_ring_evictions_stays_correct),
      cmocka_unit_test(test_without_waits_the_same_program_races),
  };
  int failed = cmocka_run_group_tests_name("eager records", tests, setup_eager, teardown);
  return failed + cmocka_run_group_tests_name("lazy records", tests, setup_lazy, teardown);
}
