/* Lazy records (options.lazy_records, issue 17): a stream that no other stream has waited on
 * records no event after its uses; a stream that needs one of its points records the pending
 * event then. When that point is the newest use's, the event sits exactly there and the stream
 * stays lazy. When later uses joined the tick after the needed one, the wait is late
 * (counters.late_waits) and the stream turns eager, so that from then on each use records its
 * event and a consumer waits for exactly its point. Host waits record the pending event first.
 * Every case checks the data and the simulator's oracle; with lazy_records = 0 every use
 * records, as before. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "lib/runtime/runtime.h" /* weft__tracker_exact */
#include "tests/util/testutil.h"

#define N 4096
static tu_env_t env;

static int setup_with(unsigned lazy) {
  weft_options_t o = weft_options_default();
  o.stream_count = 4;
  o.high_priority_streams = 0;
  o.lazy_records = lazy;
  return tu_init(&env, &o);
}
static int setup(void **state) {
  (void)state;
  return setup_with(1);
}
static int setup_eager(void **state) {
  (void)state;
  return setup_with(0);
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}

static weft_counters_t counters(void) {
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  return c;
}

static weft_stream_t *stream(unsigned i) {
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(env.rt, i, &s), WEFT_OK);
  return s;
}

static weft_block_t alloc(weft_stream_t *s, const char *tag) {
  weft_block_t b;
  assert_int_equal(weft_alloc(env.rt, N * 4, s, tag, &b), WEFT_OK);
  return b;
}

static void expect_all(weft_stream_t *s, weft_block_t b, unsigned value) {
  static unsigned host[N];
  assert_int_equal(tu_read(s, b, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (host[i] != value) fail_msg("element %u is %u, expected %u", i, host[i], value);
}

static const weft_block_t none = {0};

static void free_all(weft_stream_t *s, const weft_block_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) assert_int_equal(weft_free(b[i], s), WEFT_OK);
}

/* The value tu_combine writes from one input holding `in` (weft_test_combine: in * 7 + salt). */
static unsigned combined(unsigned in, unsigned salt) { return in * 7u + salt; }

static void quiesce(void) {
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  tu_reset_races(&env);
}

/* On a quiet runtime, s fills a with 3, then b with 4: b's use joins a's pending tick and is the
 * newest. Returns the counters from before the fills. */
static weft_counters_t fill_joined(weft_stream_t *s, weft_block_t a, weft_block_t b) {
  quiesce();
  weft_counters_t c0 = counters();
  assert_int_equal(tu_fill(&env, s, a, N, 3), WEFT_OK);
  assert_int_equal(tu_fill(&env, s, b, N, 4), WEFT_OK);
  return c0;
}

static void test_uses_on_a_stream_nobody_waits_on_record_no_event(void **state) {
  (void)state;
  weft_stream_t *s = stream(0);
  weft_block_t a = alloc(s, "a"), b = alloc(s, "b");
  quiesce();
  weft_counters_t c0 = counters();
  unsigned va = 1, vb = 0;
  assert_int_equal(tu_fill(&env, s, a, N, va), WEFT_OK);
  for (unsigned i = 0; i < 50; i++) {
    /* a -> b -> a ...: every use reads what the previous one wrote, on one stream. */
    if (i % 2 == 0) {
      assert_int_equal(tu_combine(&env, s, b, none, a, none, none, N, i), WEFT_OK);
      vb = combined(va, i);
    } else {
      assert_int_equal(tu_combine(&env, s, a, none, b, none, none, N, i), WEFT_OK);
      va = combined(vb, i);
    }
  }
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses - c0.uses, 51);
  assert_int_equal(c1.events_recorded - c0.events_recorded, 0);
  assert_int_equal(c1.waits_issued - c0.waits_issued, 0);
  /* The host's wait records the pending event first; the data is all there. */
  expect_all(s, a, va);
  expect_all(s, b, vb);
  assert_true(counters().events_recorded > c1.events_recorded);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(a, s), WEFT_OK);
  assert_int_equal(weft_free(b, s), WEFT_OK);
}

static void test_the_first_waiter_turns_the_producer_eager(void **state) {
  (void)state;
  weft_stream_t *s0 = stream(0), *s1 = stream(1);
  weft_block_t a = alloc(s0, "a"), b = alloc(s0, "b"), a2 = alloc(s0, "a2"), out = alloc(s0, "out");
  weft_counters_t c0 = fill_joined(s0, a, b);
  assert_int_equal(counters().events_recorded, c0.events_recorded);
  /* s1 needs a: the pending event is recorded now, after b's fill too (late, but correct). */
  assert_int_equal(tu_combine(&env, s1, out, none, a, none, none, N, 1), WEFT_OK);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
  assert_int_equal(c1.late_waits - c0.late_waits, 1);
  assert_int_equal(c1.events_recorded - c0.events_recorded, 1);
  /* s0 is eager now: each use records its event, and a consumer enqueued after later work on s0
   * waits for exactly its point (no late wait). (a2 and b: blocks s1 never read, so that s0's
   * writes need nothing of s1.) */
  assert_int_equal(tu_fill(&env, s0, a2, N, 5), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, b, N, 6), WEFT_OK);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.events_recorded - c1.events_recorded, 2);
  assert_int_equal(c2.waits_issued, c1.waits_issued);
  assert_int_equal(tu_combine(&env, s1, out, none, a2, none, none, N, 2), WEFT_OK);
  weft_counters_t c3 = counters();
  assert_int_equal(c3.waits_issued - c2.waits_issued, 1);
  assert_int_equal(c3.late_waits, c2.late_waits);
  /* Nobody waited on s1: it stays lazy (its two uses so far recorded nothing of their own). */
  assert_int_equal(c3.events_recorded - c2.events_recorded, 0);
  expect_all(s1, out, combined(5, 2));
  expect_all(s0, b, 6);
  assert_int_equal(tu_races(&env), 0);
  free_all(s0, (weft_block_t[]){a, b, a2, out}, 4);
}

/* The consumer needs what the producer's newest use wrote: the event recorded now sits exactly
 * at that point (not late), so the producer stays lazy and its next uses record nothing. */
static void test_a_waiter_needing_the_newest_use_leaves_the_producer_lazy(void **state) {
  (void)state;
  weft_stream_t *s0 = stream(0), *s1 = stream(1);
  weft_block_t a = alloc(s0, "a"), b = alloc(s0, "b"), a2 = alloc(s0, "a2"), out = alloc(s0, "out");
  weft_counters_t c0 = fill_joined(s0, a, b);
  assert_int_equal(tu_combine(&env, s1, out, none, b, none, none, N, 1), WEFT_OK);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
  assert_int_equal(c1.late_waits, c0.late_waits);
  assert_int_equal(c1.events_recorded - c0.events_recorded, 1);
  /* Still lazy: two more uses on s0 record nothing. */
  assert_int_equal(tu_fill(&env, s0, a2, N, 5), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, a, N, 6), WEFT_OK);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.events_recorded, c1.events_recorded);
  /* A consumer of a2 (not the newest use: a's fill joined after it) is late, and turns s0 eager. */
  assert_int_equal(tu_combine(&env, s1, out, none, a2, none, none, N, 2), WEFT_OK);
  weft_counters_t c3 = counters();
  assert_int_equal(c3.waits_issued - c2.waits_issued, 1);
  assert_int_equal(c3.late_waits - c2.late_waits, 1);
  assert_int_equal(tu_fill(&env, s0, a, N, 7), WEFT_OK); /* s1 never read a: no wait */
  assert_int_equal(counters().events_recorded - c3.events_recorded, 1);
  expect_all(s1, out, combined(5, 2));
  expect_all(s0, a, 7);
  expect_all(s0, b, 4);
  assert_int_equal(tu_races(&env), 0);
  free_all(s0, (weft_block_t[]){a, b, a2, out}, 4);
}

/* Which access of the newest use counts: a writer that must follow the newest use's read of a
 * block is exact; a reader that needs only that block's write, done by an earlier joined use,
 * is late even though the newest use touched the block. */
static void test_exactness_follows_the_conflict_rule(void **state) {
  (void)state;
  weft_stream_t *s0 = stream(0), *s1 = stream(1), *s2 = stream(2), *s3 = stream(3);
  weft_block_t a = alloc(s0, "a"), b = alloc(s0, "b"), c = alloc(s2, "c"), d = alloc(s2, "d"),
               out = alloc(s3, "out");
  quiesce();
  weft_counters_t c0 = counters();
  /* s0: write a, then read a (writing b): joined. s1 writes a: it must follow the read. */
  assert_int_equal(tu_fill(&env, s0, a, N, 2), WEFT_OK);
  assert_int_equal(tu_combine(&env, s0, b, none, a, none, none, N, 1), WEFT_OK);
  assert_int_equal(tu_fill(&env, s1, a, N, 8), WEFT_OK);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
  assert_int_equal(c1.late_waits, c0.late_waits);
  /* s2: write c, then read c (writing d): joined. s3 reads c: it needs only c's write. */
  assert_int_equal(tu_fill(&env, s2, c, N, 4), WEFT_OK);
  assert_int_equal(tu_combine(&env, s2, d, none, c, none, none, N, 3), WEFT_OK);
  assert_int_equal(tu_combine(&env, s3, out, none, c, none, none, N, 5), WEFT_OK);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.waits_issued - c1.waits_issued, 1);
  assert_int_equal(c2.late_waits - c1.late_waits, 1);
  expect_all(s1, a, 8);
  expect_all(s0, b, combined(2, 1));
  expect_all(s2, d, combined(4, 3));
  expect_all(s3, out, combined(4, 5));
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(a, s1), WEFT_OK);
  assert_int_equal(weft_free(b, s0), WEFT_OK);
  assert_int_equal(weft_free(c, s3), WEFT_OK);
  assert_int_equal(weft_free(d, s2), WEFT_OK);
  assert_int_equal(weft_free(out, s3), WEFT_OK);
}

static void test_a_deferred_tick_the_host_saw_complete_needs_no_wait(void **state) {
  (void)state;
  weft_stream_t *s2 = stream(2), *s3 = stream(3);
  weft_block_t a = alloc(s2, "a"), out = alloc(s2, "out");
  quiesce();
  assert_int_equal(tu_fill(&env, s2, a, N, 9), WEFT_OK);
  weft_counters_t c0 = counters();
  assert_int_equal(weft_stream_synchronize(s2), WEFT_OK);
  assert_int_equal(counters().events_recorded - c0.events_recorded, 1);
  assert_int_equal(tu_combine(&env, s3, out, none, a, none, none, N, 4), WEFT_OK);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.waits_issued, c0.waits_issued);
  assert_int_equal(c1.late_waits, c0.late_waits);
  expect_all(s3, out, combined(9, 4));
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(a, s2), WEFT_OK);
  assert_int_equal(weft_free(out, s2), WEFT_OK);
}

/* A free orders the memory's next user after the block's uses, deferred or not. */
static void test_memory_freed_after_deferred_uses_is_reused_in_order(void **state) {
  (void)state;
  weft_stream_t *s0 = stream(0), *s1 = stream(1);
  for (unsigned round = 0; round < 20; round++) {
    weft_block_t a = alloc(s0, "a"), out = alloc(s1, "out");
    assert_int_equal(tu_fill(&env, s0, a, N, round), WEFT_OK);
    assert_int_equal(tu_combine(&env, s0, a, none, a, none, none, N, 1), WEFT_OK);
    assert_int_equal(weft_free(a, s0), WEFT_OK);
    weft_block_t b = alloc(s1, "b"); /* may take a's memory on another stream */
    assert_int_equal(tu_fill(&env, s1, b, N, 100 + round), WEFT_OK);
    assert_int_equal(tu_combine(&env, s1, out, none, b, none, none, N, 2), WEFT_OK);
    expect_all(s1, out, combined(100 + round, 2));
    assert_int_equal(weft_free(b, s1), WEFT_OK);
    assert_int_equal(weft_free(out, s1), WEFT_OK);
  }
  assert_int_equal(tu_races(&env), 0);
}

/* The deferred event is recorded by the stream that needs it; when that record fails, the
 * needing use fails before enqueuing anything (DRIVER), the producer's tick stays pending, and
 * the same use then succeeds in order. */
static void test_a_failed_deferred_record_fails_the_needing_use_only(void **state) {
  (void)state;
  if (env.sim == NULL) skip(); /* fault injection needs the simulator */
  weft_stream_t *s2 = stream(2), *s3 = stream(3);
  weft_block_t a = alloc(s2, "a"), out = alloc(s3, "out");
  quiesce();
  assert_int_equal(tu_fill(&env, s2, a, N, 11), WEFT_OK);
  assert_int_equal(tu_fill(&env, s3, out, N, 1), WEFT_OK);
  weft_counters_t c0 = counters();
  weft_sim_stats_t f0, f1;
  env.sim->stats(&f0);
  assert_int_equal((env.sim->fail)("cuEventRecord:1:CUDA_ERROR_LAUNCH_FAILED"), 0);
  weft_status_t st = tu_combine(&env, s3, out, none, a, none, none, N, 5);
  assert_int_equal((env.sim->fail)(NULL), 0);
  env.sim->stats(&f1);
  assert_int_equal(f1.faults_injected - f0.faults_injected, 1); /* premise: the deferred record failed */
  assert_int_equal(st, WEFT_ERR_DRIVER);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses);
  assert_int_equal(c1.waits_issued, c0.waits_issued);
  assert_int_equal(tu_combine(&env, s3, out, none, a, none, none, N, 5), WEFT_OK);
  assert_int_equal(counters().waits_issued - c1.waits_issued, 1);
  expect_all(s3, out, combined(11, 5));
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(a, s2), WEFT_OK);
  assert_int_equal(weft_free(out, s3), WEFT_OK);
}

/* weft_stream_raw hands the stream to code outside weft, which may begin a capture on it at any
 * moment: the deferred event is recorded then, and the stream records eagerly from then on. */
static void test_exposing_a_stream_records_its_deferred_event(void **state) {
  (void)state;
  weft_stream_t *s1 = stream(1);
  weft_block_t a = alloc(s1, "a");
  quiesce();
  assert_int_equal(tu_fill(&env, s1, a, N, 2), WEFT_OK);
  weft_counters_t c0 = counters();
  (void)weft_stream_raw(s1);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.events_recorded - c0.events_recorded, 1);
  (void)weft_stream_raw(s1); /* nothing pending any more */
  assert_int_equal(tu_fill(&env, s1, a, N, 3), WEFT_OK);
  assert_int_equal(counters().events_recorded - c1.events_recorded, 1);
  expect_all(s1, a, 3);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(a, s1), WEFT_OK);
}

static void test_with_lazy_records_off_every_use_records(void **state) {
  (void)state;
  weft_stream_t *s = stream(0);
  weft_block_t a = alloc(s, "a");
  quiesce();
  weft_counters_t c0 = counters();
  for (unsigned i = 0; i < 10; i++) assert_int_equal(tu_fill(&env, s, a, N, i), WEFT_OK);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.events_recorded - c0.events_recorded, 10);
  assert_int_equal(c1.late_waits, 0);
  expect_all(s, a, 9);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(a, s), WEFT_OK);
}

/* A need that another wait implies costs nothing: stream 2 needs an older use of stream 0's joined
 * tick (late, on its own) and stream 1's newest use, whose event already follows all of that
 * tick. Only the wait on stream 1 is issued; no wait was late, and stream 0 stays lazy. */
static void test_a_need_implied_by_another_wait_is_not_late(void **state) {
  (void)state;
  weft_stream_t *s0 = stream(0), *s1 = stream(1), *s2 = stream(2);
  weft_block_t a = alloc(s0, "a"), b = alloc(s0, "b"), c = alloc(s1, "c"), d = alloc(s2, "d"),
               e = alloc(s0, "e");
  quiesce();
  weft_counters_t c0 = counters();
  assert_int_equal(tu_fill(&env, s0, a, N, 2), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, b, N, 3), WEFT_OK); /* joins a's tick */
  assert_int_equal(tu_combine(&env, s1, c, none, b, none, none, N, 1), WEFT_OK); /* the newest: exact */
  weft_counters_t c1 = counters();
  assert_int_equal(c1.late_waits, c0.late_waits);
  assert_int_equal(tu_combine(&env, s2, d, none, a, c, none, N, 4), WEFT_OK); /* a: older; c: newest */
  weft_counters_t c2 = counters();
  assert_int_equal(c2.waits_issued - c1.waits_issued, 1);
  assert_int_equal(c2.late_waits, c0.late_waits);
  assert_int_equal(tu_fill(&env, s0, e, N, 6), WEFT_OK); /* still lazy: no event */
  assert_int_equal(counters().events_recorded, c2.events_recorded);
  expect_all(s2, d, 4u + 7u * 2u + 13u * combined(3, 1));
  assert_int_equal(tu_races(&env), 0);
  free_all(s0, (weft_block_t[]){a, b, c, d, e}, 5);
}

/* ---- eager lanes turn lazy again ------------------------------------------------------------
 * A lane turned eager by one late wait used to stay eager for good: every later use recorded its
 * own event even where every consumer needed the lane's newest use, which lazy records serve
 * exactly (bench_replay's eager step: 111 events for 200 uses, after one late wait earlier in the
 * run). Now an eager lane whose waiters needed its newest use several times in a row turns lazy
 * again; a waiter needing an older use keeps it eager; an exact lane never turns lazy. */
#define ROUNDS 64

/* One round on a fresh block x: the producer p fills its scratch block, then x (the newest use);
 * with `older`, it fills the scratch after x instead, so that x's use is no longer the newest.
 * Then the consumer c reads x into out. Returns the events p's two fills recorded. */
static uint64_t round_of(weft_stream_t *p, weft_stream_t *c, weft_block_t scratch, weft_block_t x, weft_block_t out,
                         unsigned i, bool older) {
  weft_counters_t c0 = counters();
  assert_int_equal(tu_fill(&env, p, older ? x : scratch, N, older ? i : 1000 + i), WEFT_OK);
  assert_int_equal(tu_fill(&env, p, older ? scratch : x, N, older ? 1000 + i : i), WEFT_OK);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.waits_issued, c0.waits_issued); /* x is new; p's own blocks: no wait */
  assert_int_equal(tu_combine(&env, c, out, none, x, none, none, N, i), WEFT_OK);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.waits_issued - c1.waits_issued, 1);
  return c1.events_recorded - c0.events_recorded;
}

typedef struct rounds {
  weft_stream_t *p, *c;
  weft_block_t scratch, out, x[ROUNDS];
} rounds_t;

/* s0 (producer) made eager by one late wait of s1 (consumer); the blocks of the rounds. */
static rounds_t eager_producer(void) {
  rounds_t r = {.p = stream(0), .c = stream(1)};
  weft_block_t a = alloc(r.p, "a"), b = alloc(r.p, "b");
  r.scratch = alloc(r.p, "scratch");
  r.out = alloc(r.c, "out");
  for (unsigned i = 0; i < ROUNDS; i++) r.x[i] = alloc(r.p, "x");
  weft_counters_t c0 = fill_joined(r.p, a, b);
  assert_int_equal(tu_combine(&env, r.c, r.out, none, a, none, none, N, 1), WEFT_OK); /* late */
  weft_counters_t c1 = counters();
  assert_int_equal(c1.late_waits - c0.late_waits, 1);
  /* Eager: the next use records its own event. */
  assert_int_equal(tu_fill(&env, r.p, r.scratch, N, 5), WEFT_OK);
  assert_int_equal(counters().events_recorded - c1.events_recorded, 1);
  free_all(r.p, (weft_block_t[]){a, b}, 2);
  return r;
}

static void free_rounds(rounds_t *r) {
  free_all(r->p, r->x, ROUNDS);
  free_all(r->p, (weft_block_t[]){r->scratch, r->out}, 2);
}

static void test_an_eager_lane_whose_waiters_need_its_newest_use_turns_lazy_again(void **state) {
  (void)state;
  rounds_t r = eager_producer();
  weft_counters_t c0 = counters();
  unsigned lazy_from = ROUNDS;
  for (unsigned i = 0; i < ROUNDS; i++) {
    uint64_t recorded = round_of(r.p, r.c, r.scratch, r.x[i], r.out, i, false);
    if (lazy_from == ROUNDS && recorded == 0) lazy_from = i;
    /* Once lazy, it stays lazy: its waiters still need only its newest use. */
    if (lazy_from < i) assert_int_equal(recorded, 0);
    if (lazy_from > i) assert_int_equal(recorded, 2);
  }
  printf("lazy again from round %u of %u\n", lazy_from, ROUNDS);
  assert_true(lazy_from < ROUNDS);
  assert_true(lazy_from > 1); /* not at the first exact wait: one calm wait proves little */
  assert_int_equal(counters().late_waits, c0.late_waits);
  expect_all(r.c, r.out, combined(ROUNDS - 1, ROUNDS - 1));
  expect_all(r.p, r.scratch, 1000 + ROUNDS - 1);
  assert_int_equal(tu_races(&env), 0);
  free_rounds(&r);
}

/* ROUNDS rounds (round_of) on r, each recording both of the producer's uses (the lane stays
 * eager) with no late wait; then the data, the oracle, and the blocks freed. */
static void rounds_stay_eager(rounds_t *r, bool older) {
  weft_counters_t c0 = counters();
  for (unsigned i = 0; i < ROUNDS; i++) assert_int_equal(round_of(r->p, r->c, r->scratch, r->x[i], r->out, i, older), 2);
  assert_int_equal(counters().late_waits, c0.late_waits);
  expect_all(r->c, r->out, combined(ROUNDS - 1, ROUNDS - 1));
  assert_int_equal(tu_races(&env), 0);
  free_rounds(r);
}

/* A waiter that needs an older use than the newest keeps the lane eager: its waits stay exact
 * (no late wait), however many rounds. */
static void test_an_eager_lane_whose_waiters_need_older_uses_stays_eager(void **state) {
  (void)state;
  rounds_t r = eager_producer();
  rounds_stay_eager(&r, true);
}

/* A lane whose waits are exact (collectives, value waits: weft.h "Exact waits") records every
 * use, whatever its waiters need. */
static void test_an_exact_lane_stays_eager(void **state) {
  (void)state;
  rounds_t r = eager_producer();
  assert_int_equal(weft__tracker_exact(r.p), WEFT_OK);
  rounds_stay_eager(&r, false);
}

int main(void) {
  const struct CMUnitTest lazy[] = {
      cmocka_unit_test(test_uses_on_a_stream_nobody_waits_on_record_no_event),
      cmocka_unit_test(test_the_first_waiter_turns_the_producer_eager),
      cmocka_unit_test(test_a_deferred_tick_the_host_saw_complete_needs_no_wait),
      cmocka_unit_test(test_memory_freed_after_deferred_uses_is_reused_in_order),
      cmocka_unit_test(test_a_failed_deferred_record_fails_the_needing_use_only),
      cmocka_unit_test(test_exposing_a_stream_records_its_deferred_event),
  };
  /* Each on a fresh runtime: whether a lane is eager is what they check. */
  const struct CMUnitTest fresh[] = {
      cmocka_unit_test_setup_teardown(test_a_waiter_needing_the_newest_use_leaves_the_producer_lazy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exactness_follows_the_conflict_rule, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_need_implied_by_another_wait_is_not_late, setup, teardown),
      cmocka_unit_test_setup_teardown(test_an_eager_lane_whose_waiters_need_its_newest_use_turns_lazy_again, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_an_eager_lane_whose_waiters_need_older_uses_stays_eager, setup, teardown),
      cmocka_unit_test_setup_teardown(test_an_exact_lane_stays_eager, setup, teardown),
  };
  const struct CMUnitTest eager[] = {
      cmocka_unit_test(test_with_lazy_records_off_every_use_records),
  };
  int failed = cmocka_run_group_tests_name("lazy records", lazy, setup, teardown);
  failed += cmocka_run_group_tests_name("lazy records, one runtime each", fresh, NULL, NULL);
  return failed + cmocka_run_group_tests_name("lazy records off", eager, setup_eager, teardown);
}
