/* weft__lock_t (lib/core/lock.h): mutual exclusion under contention, from 8 threads, through its
 * fast path, its spin and its sleep (a holder that keeps it long makes the others sleep). */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lib/core/lock.h"

enum { THREADS = 8, ROUNDS = 20000 };

static weft__lock_t g_lock = WEFT__LOCK_INIT;
static uint64_t g_count;  /* written only under g_lock (plain: tsan and the sum see a missing exclusion) */
static atomic_int g_inside; /* threads inside the section now */
static atomic_int g_overlaps;
static atomic_uint g_slept; /* sections entered while the lock said a thread may sleep (2) */

static void *hammer(void *arg) {
  uintptr_t me = (uintptr_t)arg;
  for (unsigned i = 0; i < ROUNDS; i++) {
    weft__lock(&g_lock);
    if (atomic_fetch_add(&g_inside, 1) != 0) atomic_fetch_add(&g_overlaps, 1);
    g_count++;
    if (atomic_load_explicit(&g_lock.v, memory_order_relaxed) == 2) atomic_fetch_add(&g_slept, 1);
    /* Now and then a long section: the waiters' spin runs out and they sleep. */
    if ((i + me) % 1000 == 0)
      for (int k = 0; k < 200; k++) sched_yield();
    atomic_fetch_sub(&g_inside, 1);
    weft__unlock(&g_lock);
  }
  return NULL;
}

static void test_eight_threads_never_overlap_and_none_is_lost(void **state) {
  (void)state;
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, hammer, (void *)i), 0);
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  assert_int_equal(atomic_load(&g_overlaps), 0);
  assert_int_equal(g_count, (uint64_t)THREADS * ROUNDS);
  assert_int_equal(atomic_load_explicit(&g_lock.v, memory_order_relaxed), 0); /* left free */
  if (atomic_load(&g_slept) == 0) skip(); /* the sleeping side never ran (a machine of one core?) */
}

static void test_uncontended_lock_and_unlock_leave_it_free(void **state) {
  (void)state;
  weft__lock_t l = WEFT__LOCK_INIT;
  for (int i = 0; i < 3; i++) {
    weft__lock(&l);
    assert_int_equal(atomic_load(&l.v), 1);
    weft__unlock(&l);
    assert_int_equal(atomic_load(&l.v), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uncontended_lock_and_unlock_leave_it_free),
      cmocka_unit_test(test_eight_threads_never_overlap_and_none_is_lost),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
