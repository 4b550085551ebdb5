/* The live fast path (streams/tracker.c, "the live fast path"; lib/runtime/use.c, prepare_fast)
 * takes the same steps as run_use's general path, which tracker.no_fast_path forces:
 * - random programs (8 streams, 50 blocks, 1,000 uses, several seeds), each run on a fresh
 *   runtime with the fast path and without it, issue the same waits, skip the same, record the
 *   same events, count the same late waits and compute the sequential program's data with no
 *   race; in both forms (weft_launch; the split form around a raw launch on weft_stream_raw's
 *   handle, where every stream is exposed) and with lazy and eager records. The fast path must
 *   have taken every use (tracker.fast_uses), else the comparison proves nothing;
 * - every refused call (a second weft_use_begin, weft_use_end without one or with other
 *   accesses, a bad kind, NULL accesses, a freed block, a released runtime's stream) gives the
 *   same status and message either way, and leaves the stream usable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/runtime/runtime.h"
#include "tests/streams/program.h"
#include "tests/streams/refusals.h"

static unsigned seeds(void) {
  const char *e = getenv("WEFT_TEST_SEEDS");
  return e ? (unsigned)strtoul(e, NULL, 10) : 6;
}

/* What a run did, from the runtime's counters. */
typedef struct run {
  weft_counters_t c;
  uint64_t waits, fast, races;
} run_t;

/* A fresh runtime for a program: 8 plain streams, a ring of `ring` events, lazy records or not,
 * the tracked launches in the split form or not. */
static void env_open(tu_env_t *env, unsigned lazy, int split, unsigned ring) {
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  o.event_ring = ring;
  o.lazy_records = lazy;
  assert_int_equal(tu_init(env, &o), 0);
  env->split = split;
}

static run_t run_program(const prog_t *p, unsigned lazy, int split, bool fast) {
  tu_env_t env;
  env_open(&env, lazy, split, 4096);
  env.rt->tracker.no_fast_path = !fast;
  tu_reset_races(&env);
  weft_counters_t c0;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  uint64_t f0 = env.rt->tracker.fast_uses;
  run_t r = {0};
  (void)prog_run(&env, p, &r.waits, 1);
  assert_int_equal(weft_runtime_counters(env.rt, &r.c), WEFT_OK);
  r.fast = env.rt->tracker.fast_uses - f0;
  r.races = tu_races(&env);
  if (r.races != 0) tu_print_races(&env);
#define DELTA(f) r.c.f -= c0.f
  DELTA(uses);
  DELTA(accesses);
  DELTA(waits_issued);
  DELTA(waits_skipped);
  DELTA(events_recorded);
  DELTA(late_waits);
  DELTA(ring_evictions);
#undef DELTA
  assert_true(weft__tracker_is_valid(&env.rt->tracker));
  tu_fini(&env);
  return r;
}

/* The same programs from a thread with no current context before each tracked launch (weft_launch
 * or the split form around a raw launch), which weft must leave so: each launch, its waits and
 * its records take their context from weft's streams (tests/conformance "no current context").
 * The data must be the sequential program's, with no race, and the fast path must take every use. */
static void no_context(unsigned lazy, int split) {
  for (unsigned seed = 1; seed <= 3; seed++) {
    prog_t p;
    prog_init(&p, 50, 8, 64);
    prog_random(&p, 1000, seed);
    tu_env_t env;
    env_open(&env, lazy, split, 64);
    env.no_context = 1;
    tu_reset_races(&env);
    uint64_t f0 = env.rt->tracker.fast_uses, waits;
    assert_int_equal(prog_run(&env, &p, &waits, 1), 0);
    uint64_t fast = env.rt->tracker.fast_uses - f0;
    uint64_t races = tu_races(&env);
    if (races != 0) tu_print_races(&env);
    assert_int_equal(races, 0);
    /* Every use of the program (and its 50 fills): the fast path's (split: begin and end). */
    if (fast < (uint64_t)(p.uses + p.blocks) * (split ? 2 : 1))
      fail_msg("seed %u: the fast path took %llu uses of %u", seed, (unsigned long long)fast, p.uses + p.blocks);
    printf("%s, %s records, seed %u, no current context: %llu waits, %llu fast uses\n", split ? "split" : "launch",
           lazy ? "lazy" : "eager", seed, (unsigned long long)waits, (unsigned long long)fast);
    tu_fini(&env);
    prog_free(&p);
  }
}

static void test_launches_need_no_current_context(void **state) {
  (void)state;
  no_context(1, 0);
  no_context(0, 0);
}

static void test_split_uses_need_no_current_context(void **state) {
  (void)state;
  no_context(1, 1);
  no_context(0, 1);
}

static void same_steps(unsigned lazy, int split) {
  for (unsigned seed = 1; seed <= seeds(); seed++) {
    prog_t p;
    prog_init(&p, 50, 8, 64);
    prog_random(&p, 1000, seed);
    run_t a = run_program(&p, lazy, split, true), b = run_program(&p, lazy, split, false);
    printf("%s, %s records, seed %u: waits %llu / %llu, events %llu / %llu, late %llu / %llu, fast uses %llu / %llu\n",
           split ? "split" : "launch", lazy ? "lazy" : "eager", seed, (unsigned long long)a.c.waits_issued,
           (unsigned long long)b.c.waits_issued, (unsigned long long)a.c.events_recorded,
           (unsigned long long)b.c.events_recorded, (unsigned long long)a.c.late_waits,
           (unsigned long long)b.c.late_waits, (unsigned long long)a.fast, (unsigned long long)b.fast);
    assert_int_equal(a.races, 0);
    assert_int_equal(b.races, 0);
    /* The precondition: the fast path took every use of the program (and the blocks' fills);
     * the split form counts its begin and its end. Without it, none. */
    assert_true(a.fast >= (uint64_t)p.uses * (split ? 2 : 1));
    assert_int_equal(b.fast, 0);
    assert_int_equal(a.c.uses, b.c.uses);
    assert_int_equal(a.c.accesses, b.c.accesses);
    assert_int_equal(a.c.waits_issued, b.c.waits_issued);
    assert_int_equal(a.c.waits_skipped, b.c.waits_skipped);
    assert_int_equal(a.c.events_recorded, b.c.events_recorded);
    assert_int_equal(a.c.late_waits, b.c.late_waits);
    assert_int_equal(a.c.ring_evictions, b.c.ring_evictions);
    assert_true(a.c.waits_issued > 0); /* the programs have cross-stream edges to compare */
    prog_free(&p);
  }
}

static void test_launches_take_the_same_steps_lazy(void **state) {
  (void)state;
  same_steps(1, 0);
}
static void test_launches_take_the_same_steps_eager(void **state) {
  (void)state;
  same_steps(0, 0);
}
static void test_split_uses_on_exposed_streams_take_the_same_steps_lazy(void **state) {
  (void)state;
  same_steps(1, 1);
}
static void test_split_uses_on_exposed_streams_take_the_same_steps_eager(void **state) {
  (void)state;
  same_steps(0, 1);
}

/* ---- refused calls ---------------------------------------------------------------------------- */

/* Every refused call of the fast path's entries, on a fresh runtime, with the fast path on or
 * off; out[i] gets the i-th call's status and message. Each refusal leaves the stream usable:
 * the use that follows it succeeds. Returns how many calls it made. */
static size_t refusals(bool fast, refusal_t *out) {
  weft_options_t o = weft_options_default();
  o.stream_count = 4;
  o.high_priority_streams = 0;
  tu_env_t env;
  assert_int_equal(tu_init(&env, &o), 0);
  env.rt->tracker.no_fast_path = !fast;
  weft_stream_t *s, *s1;
  assert_int_equal(weft_stream_get(env.rt, 0, &s), WEFT_OK);
  assert_int_equal(weft_stream_get(env.rt, 1, &s1), WEFT_OK);
  weft_block_t a, b, dead;
  assert_int_equal(weft_alloc(env.rt, 4096, s, "a", &a), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, 4096, s, "b", &b), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, 4096, s, "dead", &dead), WEFT_OK);
  assert_int_equal(weft_free(dead, s), WEFT_OK);
  weft_access_t wa = {a, WEFT_WRITE}, rb = {b, WEFT_READ}, bad = {a, (weft_access_kind_t)7}, gone = {dead, WEFT_READ};
  size_t k = 0;
  assert_int_equal(weft_use_begin(s, &wa, 1), WEFT_OK);
  out[k++] = refusal(weft_use_begin(s, &wa, 1)); /* a second open */
  out[k++] = refusal(weft_use_end(s, &rb, 1));   /* other accesses */
  assert_int_equal(weft_use_end(s, &wa, 1), WEFT_OK);
  out[k++] = refusal(weft_use_end(s, &wa, 1)); /* no open use */
  out[k++] = refusal(weft_use_begin(s, &bad, 1));
  out[k++] = refusal(weft_use_begin(s, NULL, 1));
  out[k++] = refusal(weft_use_begin(s, &gone, 1));
  out[k++] = refusal(weft_use_begin(NULL, &wa, 1));
  out[k++] = refusal(tu_fill(&env, s, dead, 16, 1));
  out[k++] = refusal(weft_memset8(s, a, 0, 0, 5000)); /* a range outside the block */
  /* The stream still works, its history intact: s1 reads what s wrote. */
  assert_int_equal(weft_use_begin(s, &wa, 1), WEFT_OK);
  assert_int_equal(weft_use_end(s, &wa, 1), WEFT_OK);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  weft_access_t ra = {a, WEFT_READ};
  assert_int_equal(weft_use_begin(s1, &ra, 1), WEFT_OK);
  assert_int_equal(weft_use_end(s1, &ra, 1), WEFT_OK);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
  assert_int_equal(weft_free(a, s), WEFT_OK);
  assert_int_equal(weft_free(b, s), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
  tu_fini(&env);
  /* A released runtime's stream. */
  out[k++] = refusal(weft_use_begin(s, &wa, 1));
  out[k++] = refusal(weft_use_end(s, &wa, 1));
  return k;
}

static void test_refused_calls_are_the_general_paths(void **state) {
  (void)state;
  refusal_t fast[16], slow[16];
  size_t n = refusals(true, fast);
  assert_int_equal(refusals(false, slow), n);
  same_refusals(fast, slow, n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_launches_take_the_same_steps_lazy),
      cmocka_unit_test(test_launches_take_the_same_steps_eager),
      cmocka_unit_test(test_split_uses_on_exposed_streams_take_the_same_steps_lazy),
      cmocka_unit_test(test_split_uses_on_exposed_streams_take_the_same_steps_eager),
      cmocka_unit_test(test_refused_calls_are_the_general_paths),
      cmocka_unit_test(test_launches_need_no_current_context),
      cmocka_unit_test(test_split_uses_need_no_current_context),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
