/* The tracker's rules on small programs: read-after-write, write-after-read and
 * write-after-write across 2..8 streams, concurrent readers then one writer, the transitive case,
 * host knowledge, and the exact number of waits each needs. Data is checked on the host and the
 * simulator's oracle must report no race. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/testutil.h"

#define N 4096
static tu_env_t env;

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  return tu_init(&env, &o);
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}

static uint64_t waits(void) {
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  return c.waits_issued;
}

static weft_stream_t *stream(unsigned i) {
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(env.rt, i, &s), WEFT_OK);
  return s;
}

static weft_block_t alloc(const char *tag) {
  weft_block_t b;
  assert_int_equal(weft_alloc(env.rt, N * 4, stream(0), tag, &b), WEFT_OK);
  return b;
}

static void expect_all(weft_block_t b, unsigned value) {
  static unsigned host[N];
  assert_int_equal(tu_read(stream(0), b, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (host[i] != value) fail_msg("element %u is %u, expected %u", i, host[i], value);
}

static const weft_block_t none = {0};

/* Start each test from a quiet device: everything done and known to the host. */
static void quiesce(void) {
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  tu_reset_races(&env);
}

static void test_read_after_write_waits_once_per_reader_stream(void **state) {
  (void)state;
  for (unsigned k = 2; k <= 8; k++) {
    quiesce();
    weft_block_t a = alloc("a"), out[8];
    for (unsigned i = 1; i < k; i++) out[i] = alloc("out");
    quiesce();
    uint64_t w0 = waits();
    assert_int_equal(tu_fill(&env, stream(0), a, N, 5), WEFT_OK);
    for (unsigned i = 1; i < k; i++) assert_int_equal(tu_combine(&env, stream(i), out[i], none, a, none, none, N, i), WEFT_OK);
    assert_int_equal(waits() - w0, k - 1);
    for (unsigned i = 1; i < k; i++) expect_all(out[i], i + 7u * 5);
    assert_int_equal(tu_races(&env), 0);
    assert_int_equal(weft_free(a, stream(0)), WEFT_OK);
    for (unsigned i = 1; i < k; i++) assert_int_equal(weft_free(out[i], stream(0)), WEFT_OK);
  }
}

static void test_write_after_concurrent_reads_waits_for_every_reader(void **state) {
  (void)state;
  for (unsigned k = 2; k <= 8; k++) {
    quiesce();
    weft_block_t a = alloc("a"), out[8];
    for (unsigned i = 0; i < k; i++) out[i] = alloc("out");
    assert_int_equal(tu_fill(&env, stream(0), a, N, 3), WEFT_OK);
    quiesce();
    uint64_t w0 = waits();
    /* k-1 readers on streams 1..k-1 run concurrently: no wait among them (host knows the fill). */
    for (unsigned i = 1; i < k; i++) assert_int_equal(tu_combine(&env, stream(i), out[i], none, a, none, none, N, 0), WEFT_OK);
    assert_int_equal(waits() - w0, 0);
    /* The writer on stream 0 waits for each reader exactly once (write-after-read). */
    assert_int_equal(tu_fill(&env, stream(0), a, N, 9), WEFT_OK);
    assert_int_equal(waits() - w0, k - 1);
    for (unsigned i = 1; i < k; i++) expect_all(out[i], 21);
    expect_all(a, 9);
    assert_int_equal(tu_races(&env), 0);
    assert_int_equal(weft_free(a, stream(0)), WEFT_OK);
    for (unsigned i = 0; i < k; i++) assert_int_equal(weft_free(out[i], stream(0)), WEFT_OK);
  }
}

static void test_write_after_write_orders_the_writers(void **state) {
  (void)state;
  quiesce();
  weft_block_t a = alloc("a");
  quiesce();
  uint64_t w0 = waits();
  for (unsigned i = 0; i < 8; i++) assert_int_equal(tu_fill(&env, stream(i), a, N, 100 + i), WEFT_OK);
  assert_int_equal(waits() - w0, 7); /* each writer after the previous one */
  expect_all(a, 107);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(a, stream(3)), WEFT_OK);
}

/* A writes X; B waits on A and writes Y; C waits on B (reads Y); then C reads X: already ordered. */
static void test_transitive_order_needs_no_new_wait(void **state) {
  (void)state;
  quiesce();
  weft_block_t x = alloc("x"), y = alloc("y"), z = alloc("z"), zz = alloc("zz");
  quiesce();
  uint64_t w0 = waits();
  assert_int_equal(tu_fill(&env, stream(0), x, N, 2), WEFT_OK);                                   /* A */
  assert_int_equal(tu_combine(&env, stream(1), y, none, x, none, none, N, 1), WEFT_OK);           /* B: waits A */
  assert_int_equal(tu_combine(&env, stream(2), z, none, y, none, none, N, 0), WEFT_OK);           /* C: waits B */
  assert_int_equal(waits() - w0, 2);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  assert_int_equal(tu_combine(&env, stream(2), zz, none, x, none, none, N, 0), WEFT_OK);          /* C reads X */
  assert_int_equal(waits() - w0, 2);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  assert_true(c1.waits_skipped > c0.waits_skipped);
  expect_all(z, 7u * (1 + 7u * 2));
  expect_all(zz, 14);
  assert_int_equal(tu_races(&env), 0);
  weft_block_t all[4] = {x, y, z, zz};
  for (int i = 0; i < 4; i++) assert_int_equal(weft_free(all[i], stream(0)), WEFT_OK);
}

/* Two needs where one implies the other: only the newer is waited for. */
static void test_redundant_need_is_dropped(void **state) {
  (void)state;
  quiesce();
  weft_block_t x = alloc("x"), y = alloc("y"), out = alloc("out");
  quiesce();
  uint64_t w0 = waits();
  assert_int_equal(tu_fill(&env, stream(0), x, N, 1), WEFT_OK);
  assert_int_equal(tu_combine(&env, stream(1), y, none, x, none, none, N, 0), WEFT_OK); /* waits 0 */
  /* Stream 2 reads x (from 0) and y (from 1): waiting on 1 implies 0. */
  assert_int_equal(tu_combine(&env, stream(2), out, none, x, y, none, N, 0), WEFT_OK);
  assert_int_equal(waits() - w0, 2);
  expect_all(out, 7u + 13u * 7u);
  assert_int_equal(tu_races(&env), 0);
  weft_block_t all[3] = {x, y, out};
  for (int i = 0; i < 3; i++) assert_int_equal(weft_free(all[i], stream(0)), WEFT_OK);
}

/* Host knowledge: after synchronising the writer, a reader elsewhere needs no wait. */
static void test_host_knowledge_removes_waits(void **state) {
  (void)state;
  quiesce();
  weft_block_t x = alloc("x"), out = alloc("out");
  assert_int_equal(tu_fill(&env, stream(0), x, N, 4), WEFT_OK);
  assert_int_equal(weft_block_synchronize(x), WEFT_OK);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  assert_int_equal(tu_combine(&env, stream(5), out, none, x, none, none, N, 0), WEFT_OK);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  assert_int_equal(c1.waits_issued, c0.waits_issued);
  assert_true(c1.waits_host_known > c0.waits_host_known);
  /* Stream query success counts the same. */
  assert_int_equal(tu_fill(&env, stream(1), x, N, 6), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(stream(1)), WEFT_OK);
  assert_int_equal(weft_stream_query(stream(1)), WEFT_OK);
  assert_int_equal(tu_combine(&env, stream(6), out, none, x, none, none, N, 0), WEFT_OK);
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  /* One wait: the fill on 1 after the read on 5 (write-after-read). The read on 6 needs none:
   * the host saw stream 1 complete, and through 1's clock also 5's write of out. */
  assert_int_equal(c0.waits_issued - c1.waits_issued, 1);
  expect_all(out, 42);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, stream(0)), WEFT_OK);
  assert_int_equal(weft_free(out, stream(0)), WEFT_OK);
}

/* A free is ordered after every outstanding use on every stream. */
static void test_free_waits_for_reader_on_other_stream(void **state) {
  (void)state;
  quiesce();
  weft_block_t x = alloc("x"), out = alloc("out"), out2 = alloc("out2");
  assert_int_equal(tu_fill(&env, stream(0), x, N, 8), WEFT_OK);
  assert_int_equal(tu_combine(&env, stream(1), out, none, x, none, none, N, 0), WEFT_OK);
  assert_int_equal(tu_combine(&env, stream(2), out2, none, x, none, none, N, 0), WEFT_OK);
  uint64_t w0 = waits();
  assert_int_equal(weft_free(x, stream(3)), WEFT_OK);
  assert_int_equal(waits() - w0, 2); /* the readers on 1 and 2 (the write on 0 is implied) */
  /* New allocations may reuse x's memory: work on them must not race with the old readers. */
  weft_block_t y = alloc("y");
  assert_int_equal(tu_fill(&env, stream(4), y, N, 1), WEFT_OK);
  expect_all(y, 1);
  expect_all(out, 56);
  expect_all(out2, 56);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(y, stream(0)), WEFT_OK);
  assert_int_equal(weft_free(out, stream(0)), WEFT_OK);
  assert_int_equal(weft_free(out2, stream(0)), WEFT_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_after_write_waits_once_per_reader_stream),
      cmocka_unit_test(test_write_after_concurrent_reads_waits_for_every_reader),
      cmocka_unit_test(test_write_after_write_orders_the_writers),
      cmocka_unit_test(test_transitive_order_needs_no_new_wait),
      cmocka_unit_test(test_redundant_need_is_dropped),
      cmocka_unit_test(test_host_knowledge_removes_waits),
      cmocka_unit_test(test_free_waits_for_reader_on_other_stream),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
