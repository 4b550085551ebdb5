/* A fast use that leaves its tick deferred (lazy records) finishes its bookkeeping before its
 * work is enqueued and, once the work is in, clears its busy lane without weft's lock
 * (streams/tracker.c, use_live; tracker.h, "Busy lanes"):
 *   - a failed work puts everything back: the blocks' histories, the lane, the stream's published
 *     point, the use counters and the stream's place in the least-recently-used order; also a
 *     failed weft_launch, which calls the driver between weft__tracker_enter and _exit;
 *   - a thread that waits for the lane is always woken: the lane is cleared by a thread that does
 *     not hold the lock, so the waiter counts itself first and looks again before it sleeps
 *     (weft__cond_wait_unless). Two threads in lockstep, many rounds, random delays on both sides:
 *     a waiter that misses the clear sleeps for good, and the test's alarm fails it; and four such
 *     pairs at once (eight threads), whose waiters share one condition.
 * Data and the simulator's oracle check every result; the tests run on a GPU too. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "lib/runtime/runtime.h"
#include "tests/util/testutil.h"

#define N 1024
static tu_env_t env;
static const weft__driver_t *drv;

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  o.lazy_records = 1;
  alarm(300); /* a waiter that missed the lane's clear would sleep for good: fail instead */
  if (weft__driver_get(&drv) != WEFT_OK) return -1;
  return tu_init(&env, &o);
}

static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  alarm(0);
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

static weft_block_t alloc(weft_stream_t *s) {
  weft_block_t b;
  assert_int_equal(weft_alloc(env.rt, N * 4, s, "busy.unlocked", &b), WEFT_OK);
  return b;
}

static void expect_all(weft_stream_t *s, weft_block_t b, unsigned value) {
  static unsigned host[N];
  assert_int_equal(tu_read(s, b, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (host[i] != value) fail_msg("element %u: %u, want %u", i, host[i], value);
}

/* Whether a plain use of s now leaves its tick deferred and takes the fast path (the tracker's
 * own conditions, read under its lock): lazy records, a lane that is not eager, a stream not
 * exposed. */
static bool defers(weft_stream_t *s) {
  weft__tracker_t *tr = s->tr;
  weft__lock(tr->lock);
  bool d = tr->lazy && !tr->no_fast_path && !tr->live->lane[s->lane].eager &&
           !atomic_load(&s->exposed) && s->capture == NULL && !s->per_thread;
  weft__unlock(tr->lock);
  return d;
}

static weft_status_t refused_work(weft_stream_t *s, void *arg) {
  (void)s;
  (void)arg;
  return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: the work was refused");
}

/* A use of s0 writing x whose work fails: weft__use_run with a work function that refuses, or
 * weft_launch (tu_fill) whose cuLaunchKernel the simulator fails. Returns its status. */
typedef weft_status_t (*failing_use_t)(weft_stream_t *s0, weft_block_t x, weft_block_t y);

static weft_status_t refused_use(weft_stream_t *s0, weft_block_t x, weft_block_t y) {
  weft_access_t w[2] = {{x, WEFT_WRITE}, {y, WEFT_READ}};
  return weft__use_run(s0, w, 2, "refused", refused_work, NULL);
}

static weft_status_t failed_launch(weft_stream_t *s0, weft_block_t x, weft_block_t y) {
  (void)y;
  assert_int_equal((env.sim->fail)("cuLaunchKernel:1:CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"), 0);
  weft_status_t st = tu_fill(&env, s0, x, N, 5);
  assert_int_equal((env.sim->fail)(NULL), 0);
  return st;
}

static void failed_deferred_use(failing_use_t use, weft_status_t want) {
  weft_stream_t *s0 = stream(0), *s1 = stream(1), *s2 = stream(2);
  weft_block_t x = alloc(s1), y = alloc(s0);
  assert_int_equal(tu_fill(&env, s1, x, N, 3), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, y, N, 4), WEFT_OK);
  /* Everything complete and known so: the failed use below needs no wait (a wait it issued would
   * stay, and change s0's lane, harmlessly), so s0's lane must come back exactly as it was. */
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  if (!defers(s0)) skip(); /* (the precondition: the use below takes the deferred fast path) */
  weft_counters_t c0 = counters();
  uint64_t point = atomic_load(&s0->point), last_used = s0->last_used;
  if (point == 0) fail_msg("s0's point is not published before the use");
  assert_int_equal(use(s0, x, y), want);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses);
  assert_int_equal(c1.accesses, c0.accesses);
  assert_int_equal(c1.waits_issued, c0.waits_issued);
  if (atomic_load(&s0->point) != point)
    fail_msg("s0's point %llu after the failure, %llu before", (unsigned long long)atomic_load(&s0->point),
             (unsigned long long)point);
  assert_int_equal(s0->last_used, last_used);
  /* Nothing of the failed write is in x's history: a reader on s1, the last writer's stream,
   * needs no wait (it would wait for s0's tick otherwise). */
  expect_all(s1, x, 3);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.waits_issued, c1.waits_issued);
  /* s0 goes on: its next write is ordered after s1's read, and s2 reads it. */
  assert_int_equal(tu_fill(&env, s0, x, N, 8), WEFT_OK);
  expect_all(s2, x, 8);
  expect_all(s2, y, 4);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, s2), WEFT_OK);
  assert_int_equal(weft_free(y, s2), WEFT_OK);
}

static void test_a_failed_deferred_use_puts_everything_back(void **state) {
  (void)state;
  failed_deferred_use(refused_use, WEFT_ERR_INVALID_ARGUMENT);
}

/* The same through weft_launch, whose deferred case calls the driver between weft__tracker_enter
 * and weft__tracker_exit (the simulator fails the launch). */
static void test_a_failed_deferred_launch_puts_everything_back(void **state) {
  (void)state;
  if (env.sim == NULL || env.split) skip(); /* (fault injection is the simulator's) */
  failed_deferred_use(failed_launch, WEFT_ERR_DRIVER);
}

/* ---- lockstep rounds ---- */

#define ROUNDS 20000

typedef struct lockstep {
  weft_stream_t *sa, *sb;
  weft_block_t x, y;
  _Atomic unsigned started, read; /* the writer's round begun; the reader's round done */
  _Atomic int failed;
  weft_status_t st_a, st_b;
} lockstep_t;

static unsigned next_random(unsigned *r) {
  *r ^= *r << 13;
  *r ^= *r >> 17;
  *r ^= *r << 5;
  return *r;
}

/* A short random delay (0 to about a microsecond), so that the two threads meet at every point
 * of each other's calls. */
static void jitter(unsigned *r) {
  unsigned k = next_random(r) % 512;
  for (volatile unsigned i = 0; i < k; i++) {
  }
}

typedef struct fill_arg {
  weft_block_t x;
  unsigned value;
  unsigned *rng;
} fill_arg_t;

static weft_status_t fill_work(weft_stream_t *s, void *arg) {
  fill_arg_t *f = arg;
  jitter(f->rng);
  CUdeviceptr p;
  weft_status_t st = weft_block_ptr(f->x, &p);
  if (st != WEFT_OK) return st;
  CUresult r = drv->cuMemsetD32Async(p, f->value, N, s->raw);
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "cuMemsetD32Async");
}

/* Waits until *word reaches `want` or the other thread failed; false then. */
static bool await_round(_Atomic unsigned *word, unsigned want, _Atomic int *failed) {
  while (atomic_load(word) < want)
    if (atomic_load(failed)) return false;
    else sched_yield();
  return true;
}

static void *writer(void *arg) {
  lockstep_t *l = arg;
  unsigned rng = 0x9e3779b9u;
  for (unsigned r = 1; r <= ROUNDS; r++) {
    atomic_store(&l->started, r);
    fill_arg_t f = {l->x, r, &rng};
    weft_access_t w = {l->x, WEFT_WRITE};
    weft_status_t st = weft__use_run(l->sa, &w, 1, "lockstep.write", fill_work, &f);
    if (st != WEFT_OK) {
      l->st_a = st;
      atomic_store(&l->failed, 1);
      return NULL;
    }
    if (!await_round(&l->read, r, &l->failed)) return NULL;
  }
  return NULL;
}

static void *reader(void *arg) {
  lockstep_t *l = arg;
  unsigned rng = 0x85ebca6bu;
  for (unsigned r = 1; r <= ROUNDS; r++) {
    if (!await_round(&l->started, r, &l->failed)) return NULL;
    jitter(&rng);
    /* y = f(x): a tracked kernel reading what the writer's round wrote (or is writing). */
    weft_status_t st = tu_combine(&env, l->sb, l->y, (weft_block_t){0}, l->x, (weft_block_t){0}, (weft_block_t){0},
                                  N, r);
    if (st != WEFT_OK) {
      l->st_b = st;
      atomic_store(&l->failed, 1);
      return NULL;
    }
    atomic_store(&l->read, r);
  }
  return NULL;
}

/* `pairs` writer/reader pairs, each on its own two streams and block, all at once: every lane's
 * waiters share one condition (weft__clock_idle), so each clear must wake the waiters of every
 * lane that became idle, whoever else counted itself a waiter meanwhile. */
static void lockstep_pairs(unsigned pairs) {
  lockstep_t l[4];
  pthread_t a[4], b[4];
  assert_true(pairs <= 4);
  for (unsigned p = 0; p < pairs; p++) {
    l[p] = (lockstep_t){.sa = stream(p), .sb = stream(4 + p)};
    l[p].x = alloc(l[p].sa);
    l[p].y = alloc(l[p].sb);
  }
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  for (unsigned p = 0; p < pairs; p++)
    if (!defers(l[p].sa)) skip();
  weft_counters_t c0 = counters();
  for (unsigned p = 0; p < pairs; p++) {
    assert_int_equal(pthread_create(&a[p], NULL, writer, &l[p]), 0);
    assert_int_equal(pthread_create(&b[p], NULL, reader, &l[p]), 0);
  }
  for (unsigned p = 0; p < pairs; p++) {
    pthread_join(a[p], NULL);
    pthread_join(b[p], NULL);
  }
  for (unsigned p = 0; p < pairs; p++) {
    assert_int_equal(l[p].st_a, WEFT_OK);
    assert_int_equal(l[p].st_b, WEFT_OK);
    assert_int_equal(atomic_load(&l[p].read), ROUNDS);
  }
  weft_counters_t c1 = counters();
  /* The precondition: readers met their writers' busy lanes (else nothing here was tested). */
  print_message("%u pairs: busy waits %llu over %u rounds each\n", pairs,
                (unsigned long long)(c1.busy_waits - c0.busy_waits), ROUNDS);
  if (c1.busy_waits == c0.busy_waits) skip();
  for (unsigned p = 0; p < pairs; p++) {
    assert_true(defers(l[p].sa)); /* the writers' uses took the deferred fast path throughout */
    expect_all(l[p].sb, l[p].x, ROUNDS);
  }
  assert_int_equal(tu_races(&env), 0);
  for (unsigned p = 0; p < pairs; p++) {
    assert_int_equal(weft_free(l[p].x, l[p].sb), WEFT_OK);
    assert_int_equal(weft_free(l[p].y, l[p].sb), WEFT_OK);
  }
}

static void test_a_waiter_is_always_woken_by_a_lane_cleared_without_the_lock(void **state) {
  (void)state;
  lockstep_pairs(1);
}

static void test_eight_threads_waiting_on_four_lanes_are_always_woken(void **state) {
  (void)state;
  lockstep_pairs(4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_failed_deferred_use_puts_everything_back),
      cmocka_unit_test(test_a_failed_deferred_launch_puts_everything_back),
      cmocka_unit_test(test_a_waiter_is_always_woken_by_a_lane_cleared_without_the_lock),
      cmocka_unit_test(test_eight_threads_waiting_on_four_lanes_are_always_woken),
  };
  return cmocka_run_group_tests_name("busy lanes cleared without the lock", tests, setup, teardown);
}
