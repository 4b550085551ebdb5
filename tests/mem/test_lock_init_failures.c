/* Every pthread object lib/mem initialises is checked: when pthread_*_init fails, the resource's
 * constructor returns HOST_OUT_OF_MEMORY (attribute settings a platform refuses: NOT_SUPPORTED),
 * creates nothing, leaks nothing, and a later creation works. Over the fake upstream; the
 * failures are injected by tests/util/fail_init.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/mem/fake_runtime.h"
#include "tests/util/fail_init.h"

static char key[64];
static char shm_name[128];

static void unique_key(const char *what) {
  snprintf(key, sizeof key, "test-lockinit-%s-%d", what, (int)getpid());
  snprintf(shm_name, sizeof shm_name, "/weft-%s-0", key);
  shm_unlink(shm_name);
}

/* A shared budget whose table could not be set up: the error, nothing created, and the same key
 * works afterwards (the table was left for the next process to initialise). */
static void shared_budget_fails(fail_init_fn_t fn, int err, weft_status_t want) {
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  fail_init_arm(fn, 1, err);
  weft_status_t st = weft_budget_create(rt, &up->base, 1000, key, &b);
  unsigned calls = fail_init_calls(fn);
  fail_init_clear();
  if (st != want) print_error("injected failure %d: got %s: %s\n", (int)fn, weft_status_name(st), weft_last_error());
  assert_true(calls >= 1);
  assert_int_equal(st, want);
  assert_null(b);
  assert_non_null(strstr(weft_last_error(), "weft_budget_create"));
  assert_non_null(strstr(weft_last_error(), strerror(err)));
  assert_int_equal(up->allocs, 0);
  /* The same key, nothing injected: a working shared budget. */
  assert_int_equal(weft_budget_create(rt, &up->base, 1000, key, &b), WEFT_OK);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(b, 600, fake_stream(0), "t", &p), WEFT_OK);
  assert_int_equal(weft_resource_allocate(b, 600, fake_stream(0), "t", &p), WEFT_ERR_OVER_BUDGET);
  assert_int_equal(weft_budget_used(b), 600);
  weft_resource_destroy(b);
  fake_upstream_destroy(up);
  shm_unlink(shm_name);
}

static void test_shared_budget_mutexattr_init_failure(void **state) {
  (void)state;
  unique_key("attr");
  shared_budget_fails(FAIL_MUTEXATTR_INIT, ENOMEM, WEFT_ERR_HOST_OUT_OF_MEMORY);
}

static void test_shared_budget_mutex_init_failure(void **state) {
  (void)state;
  unique_key("mutex");
  /* The first mutex is the budget's own lock, the second the shared table's. */
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  fail_init_arm(FAIL_MUTEX_INIT, 2, EAGAIN);
  weft_status_t st = weft_budget_create(rt, &up->base, 1000, key, &b);
  fail_init_clear();
  if (st != WEFT_ERR_HOST_OUT_OF_MEMORY) print_error("got %s: %s\n", weft_status_name(st), weft_last_error());
  assert_int_equal(st, WEFT_ERR_HOST_OUT_OF_MEMORY);
  assert_null(b);
  assert_non_null(strstr(weft_last_error(), strerror(EAGAIN)));
  fake_upstream_destroy(up);
  shared_budget_fails(FAIL_MUTEX_INIT, EAGAIN, WEFT_ERR_HOST_OUT_OF_MEMORY); /* the budget's own lock */
}

static void test_shared_budget_attribute_failures(void **state) {
  (void)state;
  unique_key("pshared");
  shared_budget_fails(FAIL_MUTEXATTR_SETPSHARED, ENOTSUP, WEFT_ERR_NOT_SUPPORTED);
  unique_key("robust");
  shared_budget_fails(FAIL_MUTEXATTR_SETROBUST, ENOTSUP, WEFT_ERR_NOT_SUPPORTED);
}

static unsigned lines;
static void count_line(void *user, const char *line) {
  (void)user;
  (void)line;
  lines++;
}

/* The resources with one process-local pthread mutex. */
static void test_resource_lock_failures(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *r = NULL;
  fail_init_arm(FAIL_MUTEX_INIT, 1, ENOMEM);
  assert_int_equal(weft_budget_create(rt, &up->base, 1000, NULL, &r), WEFT_ERR_HOST_OUT_OF_MEMORY);
  assert_null(r);
  /* (The pool's lock is a weft__lock_t, which cannot fail: lib/core/lock.h.) */
  fail_init_arm(FAIL_MUTEX_INIT, 1, ENOMEM);
  assert_int_equal(weft_stats_create(rt, &up->base, &r), WEFT_ERR_HOST_OUT_OF_MEMORY);
  assert_null(r);
  fail_init_arm(FAIL_MUTEX_INIT, 1, ENOMEM);
  lines = 0;
  assert_int_equal(weft_logging_create(rt, &up->base, NULL, count_line, NULL, &r), WEFT_ERR_HOST_OUT_OF_MEMORY);
  assert_null(r);
  assert_int_equal(lines, 0); /* not even the header */
  fail_init_clear();
  assert_non_null(strstr(weft_last_error(), strerror(ENOMEM)));
  assert_int_equal(up->allocs, 0);
  fake_upstream_destroy(up);
}

/* One shared budget made and destroyed before any failure is armed: the metadata allocator sets
 * up its own locks on first use, and those are not the ones under test. */
static int warm_up(void **state) {
  (void)state;
  unique_key("warm");
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  if (weft_budget_create(rt, &up->base, 1000, key, &b) != WEFT_OK) return -1;
  weft_resource_destroy(b);
  fake_upstream_destroy(up);
  shm_unlink(shm_name);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shared_budget_mutexattr_init_failure),
      cmocka_unit_test(test_shared_budget_mutex_init_failure),
      cmocka_unit_test(test_shared_budget_attribute_failures),
      cmocka_unit_test(test_resource_lock_failures),
  };
  return cmocka_run_group_tests(tests, warm_up, NULL);
}
