/* Creating a runtime initialises pthread objects (its block table and staging locks, the guard's
 * lock; the tracker's and the pool's locks are weft__lock_t, which have no initialiser): failing any one of them makes weft_runtime_get return
 * HOST_OUT_OF_MEMORY with nothing left behind (no runtime, no device memory, no host memory under
 * ASan), and the next weft_runtime_get works. The nth call of each initialiser is failed in turn
 * (tests/util/fail_init.c), on the simulator. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"
#include "tests/util/fail_init.h"
#include "weft/weft.h"

static const weft_sim_api_t *sim;

static uint64_t device_bytes(void) {
  weft_sim_stats_t st;
  sim->stats(&st);
  return st.bytes_in_use;
}

/* Fails the 1st, 2nd, ... call of fn under weft_runtime_get until a get makes fewer calls than
 * that; returns how many calls failed. */
static unsigned fail_each_call(fail_init_fn_t fn) {
  unsigned failed = 0;
  for (unsigned n = 1; n < 1000; n++) {
    weft_options_t o = weft_options_default();
    o.guard = 1; /* one more resource with a lock */
    weft_runtime_t *rt = NULL;
    fail_init_arm(fn, n, ENOMEM);
    weft_status_t st = weft_runtime_get(0, &o, &rt);
    unsigned calls = fail_init_calls(fn);
    fail_init_clear();
    if (calls < n) {
      assert_int_equal(st, WEFT_OK);
      assert_int_equal(weft_runtime_release(rt), WEFT_OK);
      print_message("initialiser %d: each of %u calls failed in turn, each unwound\n", (int)fn, failed);
      return failed;
    }
    if (st != WEFT_ERR_HOST_OUT_OF_MEMORY)
      print_error("failing call %u of initialiser %d: %s: %s\n", n, (int)fn, weft_status_name(st), weft_last_error());
    assert_int_equal(st, WEFT_ERR_HOST_OUT_OF_MEMORY);
    assert_null(rt);
    assert_non_null(strstr(weft_last_error(), strerror(ENOMEM)));
    assert_int_equal(device_bytes(), 0);
    failed++;
  }
  fail();
  return failed;
}

/* The runtime's first life in the process: the first lock it creates is its block table's,
 * before anything else exists (the metadata allocator is not set up yet either). */
static void test_first_life_block_table_lock_failure(void **state) {
  (void)state;
  weft_runtime_t *rt = NULL;
  fail_init_arm(FAIL_MUTEX_INIT, 1, ENOMEM);
  weft_status_t st = weft_runtime_get(0, NULL, &rt);
  fail_init_clear();
  assert_int_equal(st, WEFT_ERR_HOST_OUT_OF_MEMORY);
  assert_null(rt);
  assert_int_equal(device_bytes(), 0);
  /* A runtime made and released unarmed: the metadata allocator creates its own locks on first
   * use, and those are not weft's to check. */
  assert_int_equal(weft_runtime_get(0, NULL, &rt), WEFT_OK);
  assert_int_equal(weft_runtime_release(rt), WEFT_OK);
}

static void test_each_mutex_init_failure_unwinds(void **state) {
  (void)state;
  /* The guard's lock; the pool's is a weft__lock_t (lib/core/lock.h), which cannot fail, and the
   * trackers share one static lock (streams/clock.c). */
  assert_true(fail_each_call(FAIL_MUTEX_INIT) >= 1);
}

static void test_each_cond_init_failure_unwinds(void **state) {
  (void)state;
  (void)fail_each_call(FAIL_COND_INIT); /* weft has none today (lib/core/lock.h); any it gains is covered */
}

static void test_rwlock_init_failures_unwind(void **state) {
  (void)state;
  (void)fail_each_call(FAIL_RWLOCK_INIT); /* weft has none today; any it gains is covered */
}

static int setup(void **state) {
  (void)state;
  sim = weft_sim_api(weft_driver_symbol);
  return sim == NULL ? -1 : 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_life_block_table_lock_failure),
      cmocka_unit_test(test_each_mutex_init_failure_unwinds),
      cmocka_unit_test(test_each_cond_init_failure_unwinds),
      cmocka_unit_test(test_rwlock_init_failures_unwind),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
