/* The graph gate (lib/core/gate.h) on its own, no driver: it is per device. A thread in the shared
 * side of one device holds back an exclusive holder of that device and of no other; an exclusive
 * holder holds back shared entries of its devices only; a call of unknown device (WEFT__GATE_ALL)
 * holds back every exclusive holder; the exclusive holder's own calls pass through; the scopes
 * "process" (every device one gate) and "off" (none).
 *
 * "Holds back" is checked both ways: a call that must go through has 10 s to do so (a watchdog:
 * failing it is a deadlock), and a call that must wait is seen still waiting after its thread
 * signalled that it was about to make it, then seen to go through once the holder leaves. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>
#include <cmocka.h>

#include "lib/core/gate.h"

#define DEV(d) weft__gate_device(d)

typedef struct helper {
  pthread_t t;
  int exclusive; /* lock instead of enter */
  weft__gate_devices_t devices;
  atomic_int started, through, release;
} helper_t;

static void *helper_main(void *arg) {
  helper_t *h = arg;
  atomic_store(&h->started, 1);
  if (h->exclusive) weft__gate_lock(h->devices);
  else weft__gate_enter(h->devices);
  atomic_store(&h->through, 1);
  while (!atomic_load(&h->release)) sched_yield();
  if (h->exclusive) weft__gate_unlock();
  else weft__gate_leave();
  return NULL;
}

static void helper_start(helper_t *h, int exclusive, weft__gate_devices_t devices) {
  atomic_init(&h->started, 0);
  atomic_init(&h->through, 0);
  atomic_init(&h->release, 0);
  h->exclusive = exclusive;
  h->devices = devices;
  assert_int_equal(pthread_create(&h->t, NULL, helper_main, h), 0);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The helper got through within `seconds`. */
static int through_within(helper_t *h, double seconds) {
  double end = now_s() + seconds;
  while (!atomic_load(&h->through))
    if (now_s() > end) return 0;
    else sched_yield();
  return 1;
}

static void helper_end(helper_t *h) {
  atomic_store(&h->release, 1);
  assert_int_equal(pthread_join(h->t, NULL), 0);
}

/* The helper has started its call and, 50 ms later, is still inside it (held back). */
static void assert_held_back(helper_t *h) {
  while (!atomic_load(&h->started)) sched_yield();
  assert_false(through_within(h, 0.05));
}

static void test_a_shared_holder_holds_back_its_device_only(void **state) {
  (void)state;
  weft__gate_enter(DEV(0));
  helper_t other, same;
  helper_start(&other, 1, DEV(1));
  assert_true(through_within(&other, 10.0)); /* device 1's graph call does not wait for device 0 */
  helper_end(&other);
  helper_start(&same, 1, DEV(0));
  assert_held_back(&same);
  weft__gate_leave();
  assert_true(through_within(&same, 10.0));
  helper_end(&same);
}

static void test_an_exclusive_holder_holds_back_its_devices_only(void **state) {
  (void)state;
  weft__gate_lock(DEV(1) | DEV(3));
  helper_t other, same, both;
  helper_start(&other, 0, DEV(0) | DEV(2));
  assert_true(through_within(&other, 10.0));
  helper_end(&other);
  helper_start(&same, 0, DEV(3));
  helper_start(&both, 0, DEV(0) | DEV(1));
  assert_held_back(&same);
  assert_held_back(&both);
  weft__gate_unlock();
  assert_true(through_within(&same, 10.0));
  assert_true(through_within(&both, 10.0));
  helper_end(&same);
  helper_end(&both);
}

static void test_exclusive_holders_of_one_device_take_turns(void **state) {
  (void)state;
  weft__gate_lock(DEV(2));
  helper_t same, other;
  helper_start(&same, 1, DEV(2));
  helper_start(&other, 1, DEV(5));
  assert_true(through_within(&other, 10.0));
  assert_held_back(&same);
  helper_end(&other);
  weft__gate_unlock();
  assert_true(through_within(&same, 10.0));
  helper_end(&same);
}

static void test_a_call_of_unknown_device_holds_back_every_device(void **state) {
  (void)state;
  weft__gate_enter(WEFT__GATE_ALL);
  helper_t h;
  helper_start(&h, 1, DEV(7));
  assert_held_back(&h);
  weft__gate_leave();
  assert_true(through_within(&h, 10.0));
  helper_end(&h);
}

static void test_the_exclusive_holders_own_calls_pass(void **state) {
  (void)state;
  weft__gate_lock(DEV(0));
  weft__gate_enter(DEV(0)); /* would wait for itself */
  weft__gate_leave();
  weft__gate_enter(WEFT__GATE_ALL);
  weft__gate_leave();
  weft__gate_unlock();
  helper_t h; /* and the gate is open again */
  helper_start(&h, 0, DEV(0));
  assert_true(through_within(&h, 10.0));
  helper_end(&h);
}

static void test_scope_process_is_one_gate(void **state) {
  (void)state;
  weft__gate_set_scope(WEFT__GATE_PROCESS);
  weft__gate_enter(DEV(0));
  helper_t h;
  helper_start(&h, 1, DEV(1));
  assert_held_back(&h);
  weft__gate_leave();
  assert_true(through_within(&h, 10.0));
  helper_end(&h);
  weft__gate_set_scope(WEFT__GATE_PER_DEVICE);
}

static void test_scope_off_holds_nothing_back(void **state) {
  (void)state;
  weft__gate_set_scope(WEFT__GATE_OFF);
  weft__gate_enter(DEV(0));
  helper_t h;
  helper_start(&h, 1, DEV(0));
  assert_true(through_within(&h, 10.0));
  helper_end(&h);
  weft__gate_leave();
  weft__gate_set_scope(WEFT__GATE_PER_DEVICE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_shared_holder_holds_back_its_device_only),
      cmocka_unit_test(test_an_exclusive_holder_holds_back_its_devices_only),
      cmocka_unit_test(test_exclusive_holders_of_one_device_take_turns),
      cmocka_unit_test(test_a_call_of_unknown_device_holds_back_every_device),
      cmocka_unit_test(test_the_exclusive_holders_own_calls_pass),
      cmocka_unit_test(test_scope_process_is_one_gate),
      cmocka_unit_test(test_scope_off_holds_nothing_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
