/* Cross-stream reuse with the real runtime and tracker, on the simulator and on a GPU: a block
 * is freed on stream A while a long kernel on stream B still reads it; allocations on stream C
 * then must not get memory that B still reads. B is held at a gate (a wait-value on its raw
 * stream, unknown to weft) until C has allocated and written every block it got (a memset), so
 * B's read is certainly outstanding then, on the simulator as on a GPU: had C's block been the
 * freed memory without waiting for B, B's output would be wrong. On the simulator the race
 * oracle checks the same (and must find nothing); on a GPU the data does.
 *
 * The pool is limited to one chunk, so that C must reuse the freed block: the test asserts it
 * did. The async and direct resources order reuse in the driver; they get the same checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "tests/util/testutil.h"

enum {
  BYTES = 1 << 20,  /* each block */
  WORDS = BYTES / 4,
  C_BLOCKS = 3,     /* the limited pool's chunk holds the freed block, B's output and 2 more */
  SALT = 3,
};

static unsigned host[WORDS];

static weft_stream_t *stream(const tu_env_t *env, unsigned i) {
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(env->rt, i, &s), WEFT_OK);
  return s;
}

static void check_words(weft_stream_t *s, weft_block_t b, unsigned want, const char *what) {
  memset(host, 0xff, sizeof host);
  assert_int_equal(tu_read(s, b, host, BYTES), WEFT_OK);
  for (unsigned i = 0; i < WORDS; i++)
    if (host[i] != want) fail_msg("%s: word %u is 0x%x, not 0x%x", what, i, host[i], want);
}

/* Runs the scenario on env's runtime; returns whether one of C's blocks got the freed memory.
 * `free_blocks`: the resource's free waits on the host for the freeing stream (direct), hence
 * for B: there B cannot be held at the gate. */
static bool free_while_read_then_allocate_elsewhere(tu_env_t *env, bool free_blocks) {
  weft_stream_t *a = stream(env, 0), *b = stream(env, 1), *c = stream(env, 2), *d = stream(env, 3);
  const weft__driver_t *drv;
  assert_int_equal(weft__driver_get(&drv), WEFT_OK);
  assert_non_null(drv->cuStreamWaitValue32);
  assert_non_null(drv->cuStreamWriteValue32);
  CUdeviceptr gate;
  unsigned zero = 0;
  assert_int_equal(drv->cuMemAlloc(&gate, sizeof zero), CUDA_SUCCESS);
  assert_int_equal(drv->cuMemcpyHtoD(gate, &zero, sizeof zero), CUDA_SUCCESS);
  tu_reset_races(env);
  weft_block_t x, y;
  assert_int_equal(weft_alloc(env->rt, BYTES, a, "x", &x), WEFT_OK);
  assert_int_equal(weft_alloc(env->rt, BYTES, a, "y", &y), WEFT_OK);
  CUdeviceptr xp;
  assert_int_equal(weft_block_ptr(x, &xp), WEFT_OK);
  assert_int_equal(tu_fill(env, a, x, WORDS, 1), WEFT_OK);
  /* B: y = SALT + 7 * x, once the gate opens. */
  if (!free_blocks)
    assert_int_equal(drv->cuStreamWaitValue32(weft_stream_raw(b), gate, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  assert_int_equal(tu_combine(env, b, y, (weft_block_t){0}, x, (weft_block_t){0}, (weft_block_t){0}, WORDS, SALT),
                   WEFT_OK);
  /* A frees x while B's kernel still reads it. */
  assert_int_equal(weft_free(x, a), WEFT_OK);
  /* C allocates and writes at once. */
  weft_block_t cb[C_BLOCKS];
  bool reused = false;
  for (unsigned i = 0; i < C_BLOCKS; i++) {
    assert_int_equal(weft_alloc(env->rt, BYTES, c, "c", &cb[i]), WEFT_OK);
    CUdeviceptr p;
    assert_int_equal(weft_block_ptr(cb[i], &p), WEFT_OK);
    reused |= p == xp;
    assert_int_equal(weft_memset32(c, cb[i], 0, 0xdead0000u + i, BYTES), WEFT_OK);
  }
  if (!free_blocks) {
    assert_int_equal(weft_stream_query(b), WEFT_ERR_NOT_READY); /* B's read is still to come */
    assert_int_equal(drv->cuStreamWriteValue32(weft_stream_raw(d), gate, 1, 0), CUDA_SUCCESS);
  }
  check_words(d, y, SALT + 7u, "B's output");
  for (unsigned i = 0; i < C_BLOCKS; i++) check_words(c, cb[i], 0xdead0000u + i, "C's block");
  for (unsigned i = 0; i < C_BLOCKS; i++) assert_int_equal(weft_free(cb[i], c), WEFT_OK);
  assert_int_equal(weft_free(y, b), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
  assert_int_equal(drv->cuMemFree(gate), CUDA_SUCCESS);
  if (tu_races(env) != 0) {
    tu_print_races(env);
    fail_msg("%llu races", (unsigned long long)tu_races(env));
  }
  return reused;
}

static tu_env_t env;
static weft_resource_t *bottom, *pool; /* the pool test's resources */

/* After a failure: gives the runtime back so that the next test gets a fresh one (a pool still
 * holding live blocks is left behind). */
static int teardown(void **state) {
  (void)state;
  if (env.rt != NULL && pool != NULL && weft_runtime_set_resource(env.rt, bottom) == WEFT_OK) weft_resource_destroy(pool);
  pool = NULL;
  if (env.rt != NULL) tu_fini(&env);
  return 0;
}

static void test_pool_reuses_memory_freed_on_a_only_after_b_read_it(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.memory = WEFT_MEMORY_ASYNC;
  o.stream_cache_bytes = 0; /* the resource's reuse across streams is under test */
  assert_int_equal(tu_init(&env, &o), 0);
  bottom = weft_runtime_resource(env.rt);
  weft_pool_options_t po = weft_pool_options_default();
  po.chunk_bytes = 4 << 20;
  po.max_bytes = 4 << 20;
  assert_int_equal(weft_pool_create(env.rt, bottom, &po, &pool), WEFT_OK);
  assert_int_equal(weft_runtime_set_resource(env.rt, pool), WEFT_OK);
  assert_true(free_while_read_then_allocate_elsewhere(&env, false));
  weft_resource_stats_t st;
  weft_resource_stats(pool, &st);
  assert_true(st.reserved_peak <= po.max_bytes);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.failures, 0);
  assert_int_equal(weft_runtime_set_resource(env.rt, bottom), WEFT_OK);
  weft_resource_destroy(pool);
  pool = NULL;
  tu_fini(&env);
}

static void test_driver_resource_reuse_waits_for_reader(weft_memory_kind_t kind) {
  weft_options_t o = weft_options_default();
  o.memory = kind;
  o.stream_cache_bytes = 0; /* the resource's reuse across streams is under test */
  assert_int_equal(tu_init(&env, &o), 0);
  bool reused = free_while_read_then_allocate_elsewhere(&env, kind == WEFT_MEMORY_DIRECT);
  print_message("%s: C %s the freed memory\n", kind == WEFT_MEMORY_ASYNC ? "async" : "direct",
                reused ? "reused" : "did not reuse");
  tu_fini(&env);
  /* The point is reuse while B still reads: without reuse nothing was tested. */
  if (!reused) skip();
}

static void test_async_reuse_waits_for_the_reader_on_b(void **state) {
  (void)state;
  test_driver_resource_reuse_waits_for_reader(WEFT_MEMORY_ASYNC);
}

static void test_direct_reuse_waits_for_the_reader_on_b(void **state) {
  (void)state;
  test_driver_resource_reuse_waits_for_reader(WEFT_MEMORY_DIRECT);
}

static int group_setup(void **state) {
  (void)state;
  if (weft_sim_api(weft_driver_symbol) == NULL)
    print_message("GPU: simulator-only checks skipped: race counts of the oracle (checked by data instead)\n");
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_pool_reuses_memory_freed_on_a_only_after_b_read_it, teardown),
      cmocka_unit_test_teardown(test_async_reuse_waits_for_the_reader_on_b, teardown),
      cmocka_unit_test_teardown(test_direct_reuse_waits_for_the_reader_on_b, teardown),
  };
  return cmocka_run_group_tests(tests, group_setup, NULL);
}
