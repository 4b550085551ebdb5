/* The budget adaptor over a fake upstream: OVER_BUDGET never reaches upstream, refusals give the
 * charge back, and the shared mode across real processes (fork): one limit for all, and the share
 * of a process that died is reclaimed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/mem/fake_runtime.h"

static const char tag[] = "budget-test";

static void test_over_budget_never_reaches_upstream(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  assert_int_equal(weft_budget_create(rt, &up->base, 1000, NULL, &b), WEFT_OK);
  CUdeviceptr p1 = 0, p2 = 0, p3 = 0;
  assert_int_equal(weft_resource_allocate(b, 600, fake_stream(0), tag, &p1), WEFT_OK);
  assert_int_equal(weft_resource_allocate(b, 401, fake_stream(0), tag, &p2), WEFT_ERR_OVER_BUDGET);
  assert_non_null(strstr(weft_last_error(), "1000"));
  assert_int_equal(up->allocs, 1);
  assert_int_equal(weft_resource_allocate(b, 400, fake_stream(1), tag, &p2), WEFT_OK);
  assert_int_equal(weft_budget_used(b), 1000);
  assert_int_equal(weft_resource_deallocate(b, p1, 600, fake_stream(0), tag), WEFT_OK);
  assert_int_equal(weft_resource_allocate(b, 600, fake_stream(0), tag, &p3), WEFT_OK);
  weft_resource_stats_t st;
  weft_resource_stats(b, &st);
  assert_int_equal(st.live_bytes, 1000);
  assert_int_equal(st.live_peak, 1000);
  assert_int_equal(st.failures, 1);
  assert_int_equal(st.allocs, 3);
  assert_int_equal(weft_resource_deallocate(b, p2, 400, fake_stream(0), tag), WEFT_OK);
  assert_int_equal(weft_resource_deallocate(b, p3, 600, fake_stream(0), tag), WEFT_OK);
  assert_int_equal(weft_budget_used(b), 0);
  weft_resource_destroy(b);
  assert_int_equal(up->live_bytes, 0);
  fake_upstream_destroy(up);
}

static void test_upstream_refusal_gives_the_charge_back(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  assert_int_equal(weft_budget_create(rt, &up->base, 1000, NULL, &b), WEFT_OK);
  up->fail_alloc = WEFT_ERR_OUT_OF_MEMORY;
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(b, 600, fake_stream(0), tag, &p), WEFT_ERR_OUT_OF_MEMORY);
  assert_int_equal(weft_budget_used(b), 0);
  up->fail_alloc = WEFT_OK;
  assert_int_equal(weft_resource_allocate(b, 1000, fake_stream(0), tag, &p), WEFT_OK);
  /* A refused free keeps the charge: the block is still live. */
  up->fail_free = WEFT_ERR_DRIVER;
  assert_int_equal(weft_resource_deallocate(b, p, 1000, fake_stream(0), tag), WEFT_ERR_DRIVER);
  assert_int_equal(weft_budget_used(b), 1000);
  up->fail_free = WEFT_OK;
  assert_int_equal(weft_resource_deallocate(b, p, 1000, fake_stream(0), tag), WEFT_OK);
  assert_int_equal(weft_budget_used(b), 0);
  weft_resource_destroy(b);
  fake_upstream_destroy(up);
}

static void test_bad_arguments_are_rejected(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  assert_int_equal(weft_budget_create(rt, &up->base, 0, NULL, &b), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_budget_create(rt, NULL, 10, NULL, &b), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_budget_create(rt, &up->base, 10, "bad/key", &b), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_budget_create(rt, &up->base, 10, NULL, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_null(b);
  assert_int_equal(weft_budget_used(NULL), 0);
  assert_int_equal(weft_budget_used(&up->base), 0);
  fake_upstream_destroy(up);
}

static char key[64];

static void unique_key(const char *what) {
  snprintf(key, sizeof key, "test-%s-%d", what, (int)getpid());
}

static void unlink_key(void) {
  char name[128];
  snprintf(name, sizeof name, "/weft-%s-0", key);
  shm_unlink(name);
}

enum { CHILDREN = 4, UNIT = 1000, LIMIT_UNITS = 10 };

/* A child: take units until OVER_BUDGET, report the count, hold until told, free, exit. */
static void child(int report_fd, int go_fd) {
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  if (weft_budget_create(rt, &up->base, LIMIT_UNITS * UNIT, key, &b) != WEFT_OK) _exit(10);
  CUdeviceptr p[LIMIT_UNITS + 1];
  int n = 0;
  while (n <= LIMIT_UNITS) {
    weft_status_t st = weft_resource_allocate(b, UNIT, fake_stream(0), tag, &p[n]);
    if (st == WEFT_ERR_OVER_BUDGET) break;
    if (st != WEFT_OK) _exit(11);
    if (weft_budget_used(b) > LIMIT_UNITS * UNIT) _exit(12);
    n++;
    usleep(1000);
  }
  char c = (char)n;
  if (write(report_fd, &c, 1) != 1) _exit(13);
  if (read(go_fd, &c, 1) != 1) _exit(14);
  for (int i = 0; i < n; i++)
    if (weft_resource_deallocate(b, p[i], UNIT, fake_stream(0), tag) != WEFT_OK) _exit(15);
  weft_resource_destroy(b);
  _exit(0);
}

/* ThreadSanitizer cannot see synchronisation through another process's mutex operations on
 * shared memory (its model is one process); the fork tests run in the other configurations. */
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() skip()
#else
#define SKIP_UNDER_TSAN() ((void)0)
#endif

static void test_processes_share_one_limit(void **state) {
  (void)state;
  SKIP_UNDER_TSAN();
  unique_key("share");
  int rep[2], go[2];
  assert_int_equal(pipe(rep), 0);
  assert_int_equal(pipe(go), 0);
  pid_t pids[CHILDREN];
  for (int i = 0; i < CHILDREN; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) child(rep[1], go[0]);
  }
  int total = 0;
  for (int i = 0; i < CHILDREN; i++) {
    char c;
    assert_int_equal(read(rep[0], &c, 1), 1);
    total += c;
  }
  /* Every child stopped at OVER_BUDGET while the others held theirs: exactly the limit. */
  assert_int_equal(total, LIMIT_UNITS);
  char go_c[CHILDREN] = {0};
  assert_int_equal(write(go[1], go_c, CHILDREN), CHILDREN);
  for (int i = 0; i < CHILDREN; i++) {
    int status;
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  /* All gone: the whole limit is free again. */
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  assert_int_equal(weft_budget_create(rt, &up->base, LIMIT_UNITS * UNIT, key, &b), WEFT_OK);
  assert_int_equal(weft_budget_used(b), 0);
  weft_resource_destroy(b);
  fake_upstream_destroy(up);
  unlink_key();
}

static void test_share_of_a_dead_process_is_reclaimed(void **state) {
  (void)state;
  SKIP_UNDER_TSAN();
  unique_key("dead");
  int rep[2];
  assert_int_equal(pipe(rep), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    weft_runtime_t *rt = fake_init(2);
    fake_upstream_t *up = fake_upstream_create(rt);
    weft_resource_t *b = NULL;
    CUdeviceptr p;
    if (weft_budget_create(rt, &up->base, 10 * UNIT, key, &b) != WEFT_OK) _exit(10);
    if (weft_resource_allocate(b, 8 * UNIT, fake_stream(0), tag, &p) != WEFT_OK) _exit(11);
    char c = 1;
    if (write(rep[1], &c, 1) != 1) _exit(12);
    pause();
    _exit(0);
  }
  char c;
  assert_int_equal(read(rep[0], &c, 1), 1);
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *b = NULL;
  assert_int_equal(weft_budget_create(rt, &up->base, 10 * UNIT, key, &b), WEFT_OK);
  assert_int_equal(weft_budget_used(b), 8 * UNIT);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(b, 5 * UNIT, fake_stream(0), tag, &p), WEFT_ERR_OVER_BUDGET);
  /* The child dies holding 8 units (no chance to clean up). */
  kill(pid, SIGKILL);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_int_equal(weft_resource_allocate(b, 5 * UNIT, fake_stream(0), tag, &p), WEFT_OK);
  assert_int_equal(weft_budget_used(b), 5 * UNIT);
  assert_int_equal(weft_resource_deallocate(b, p, 5 * UNIT, fake_stream(0), tag), WEFT_OK);
  weft_resource_destroy(b);
  fake_upstream_destroy(up);
  unlink_key();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_over_budget_never_reaches_upstream),
      cmocka_unit_test(test_upstream_refusal_gives_the_charge_back),
      cmocka_unit_test(test_bad_arguments_are_rejected),
      cmocka_unit_test(test_processes_share_one_limit),
      cmocka_unit_test(test_share_of_a_dead_process_is_reclaimed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
