/* Runtime lifetime and the stream pool: get/retain/release, stale handles after release, wrong
 * device, stream acquisition by index, round-robin and auto, priorities, ids, blocks of another
 * runtime generation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/testutil.h"

static void test_get_retain_release_and_stale_handles(void **state) {
  (void)state;
  weft_runtime_t *a, *b;
  assert_int_equal(weft_runtime_get(0, NULL, &a), WEFT_OK);
  assert_int_equal(weft_runtime_get(0, NULL, &b), WEFT_OK);
  assert_ptr_equal(a, b);
  assert_int_equal(weft_runtime_retain(a), WEFT_OK);
  assert_int_equal(weft_runtime_device(a), 0);
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(a, 0, &s), WEFT_OK);
  weft_block_t blk;
  assert_int_equal(weft_alloc(a, 1024, s, "t", &blk), WEFT_OK);
  assert_int_equal(weft_runtime_release(a), WEFT_OK);
  assert_int_equal(weft_runtime_release(a), WEFT_OK);
  assert_int_equal(weft_runtime_device(a), 0);
  assert_int_equal(weft_runtime_release(a), WEFT_OK); /* the last one frees the live block too */
  assert_int_equal(weft_runtime_device(a), -1);
  assert_int_equal(weft_runtime_release(a), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_runtime_retain(a), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_stream_get(a, 0, &s), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_stream_synchronize(s), WEFT_ERR_STALE_HANDLE);
  CUdeviceptr p;
  assert_int_equal(weft_block_ptr(blk, &p), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_free(blk, s), WEFT_ERR_STALE_HANDLE);
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(a, &c), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_runtime_counters((weft_runtime_t *)&c, &c), WEFT_ERR_INVALID_ARGUMENT);
  /* A new life: old handles stay stale, new ones work. */
  assert_int_equal(weft_runtime_get(0, NULL, &b), WEFT_OK);
  assert_int_equal(weft_block_ptr(blk, &p), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_stream_get(b, 0, &s), WEFT_OK);
  assert_int_equal(weft_runtime_release(b), WEFT_OK);
}

static void test_bad_arguments(void **state) {
  (void)state;
  weft_runtime_t *rt;
  assert_int_equal(weft_runtime_get(0, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_runtime_get(-1, NULL, &rt), WEFT_ERR_WRONG_DEVICE);
  assert_int_equal(weft_runtime_get(63, NULL, &rt), WEFT_ERR_WRONG_DEVICE);
  weft_options_t o = weft_options_default();
  o.stream_count = 0;
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "stream_count"));
  o = weft_options_default();
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_OK);
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(rt, 8, &s), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_stream_get(rt, 0, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_stream_get(rt, 0, &s), WEFT_OK);
  weft_block_t b;
  assert_int_equal(weft_alloc(rt, 0, s, "x", &b), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_alloc(rt, SIZE_MAX, s, "x", &b), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_alloc(rt, 64, NULL, "x", &b), WEFT_ERR_INVALID_ARGUMENT);
  weft_access_t bad = {{0}, WEFT_READ};
  assert_int_equal(weft_use_begin(s, &bad, 1), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_use_begin(s, NULL, 1), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_alloc(rt, 64, s, "x", &b), WEFT_OK);
  weft_access_t badkind = {b, (weft_access_kind_t)7};
  assert_int_equal(weft_use_begin(s, &badkind, 1), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_free(b, s), WEFT_OK);
  assert_int_equal(weft_free(b, s), WEFT_ERR_DOUBLE_FREE);
  weft_access_t stale = {b, WEFT_READ};
  assert_int_equal(weft_use_begin(s, &stale, 1), WEFT_ERR_STALE_HANDLE);
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(rt, &c), WEFT_OK);
  assert_int_equal(c.allocs, c.frees);
  assert_int_equal(weft_runtime_release(rt), WEFT_OK);
}

static void test_stream_pool_round_robin_priority_and_ids(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_count = 6;
  o.high_priority_streams = 2;
  weft_runtime_t *rt;
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_OK);
  weft_stream_t *seen[8];
  for (int i = 0; i < 8; i++) assert_int_equal(weft_stream_next(rt, WEFT_PRIORITY_NORMAL, &seen[i]), WEFT_OK);
  for (int i = 0; i < 4; i++) assert_ptr_equal(seen[i], seen[i + 4]);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < i; j++) assert_ptr_not_equal(seen[i], seen[j]);
  weft_stream_t *h;
  assert_int_equal(weft_stream_next(rt, WEFT_PRIORITY_HIGH, &h), WEFT_OK);
  assert_true(weft_stream_index(h) >= 4);
  int pn, ph;
  assert_int_equal(weft_stream_priority(seen[0], &pn), WEFT_OK);
  assert_int_equal(weft_stream_priority(h, &ph), WEFT_OK);
  assert_true(ph < pn); /* lower numbers are higher priority */
  unsigned long long id0, id1;
  assert_int_equal(weft_stream_id(seen[0], &id0), WEFT_OK);
  assert_int_equal(weft_stream_id(seen[1], &id1), WEFT_OK);
  assert_true(id0 != id1);
  assert_non_null(weft_stream_raw(h));
  assert_ptr_equal(weft_stream_runtime(h), rt);
  assert_int_equal(weft_runtime_release(rt), WEFT_OK);
  /* A stream of a released runtime names no stream: NULL, nothing touched. */
  assert_null(weft_stream_raw(seen[0]));
  assert_null(weft_stream_raw(h));
  assert_int_equal(weft_stream_index(h), -1);

  o.high_priority_streams = 0;
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_OK);
  assert_int_equal(weft_stream_next(rt, WEFT_PRIORITY_HIGH, &h), WEFT_ERR_NOT_SUPPORTED);
  assert_int_equal(weft_runtime_release(rt), WEFT_OK);
}

/* auto picks the last writer's stream (no wait needed), else the least recently used. */
static void test_auto_stream_prefers_the_stream_needing_fewest_waits(void **state) {
  (void)state;
  tu_env_t env;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  assert_int_equal(tu_init(&env, &o), 0);
  weft_stream_t *s3, *pick;
  assert_int_equal(weft_stream_get(env.rt, 3, &s3), WEFT_OK);
  weft_block_t a;
  assert_int_equal(weft_alloc(env.rt, 4096, s3, "a", &a), WEFT_OK);
  assert_int_equal(tu_fill(&env, s3, a, 1024, 1), WEFT_OK);
  weft_access_t r = {a, WEFT_READ};
  assert_int_equal(weft_stream_auto(env.rt, WEFT_PRIORITY_NORMAL, &r, 1, &pick), WEFT_OK);
  assert_ptr_equal(pick, s3);
  /* With no accesses: the least recently used stream, which is not 3. */
  assert_int_equal(weft_stream_auto(env.rt, WEFT_PRIORITY_NORMAL, NULL, 0, &pick), WEFT_OK);
  assert_ptr_not_equal(pick, s3);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  assert_int_equal(weft_stream_auto(env.rt, WEFT_PRIORITY_NORMAL, &r, 1, &pick), WEFT_OK);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  assert_memory_equal(&c0, &c1, sizeof c0); /* choosing changes no counter */
  assert_int_equal(weft_free(a, s3), WEFT_OK);
  tu_fini(&env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_retain_release_and_stale_handles),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_stream_pool_round_robin_priority_and_ids),
      cmocka_unit_test(test_auto_stream_prefers_the_stream_needing_fewest_waits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
