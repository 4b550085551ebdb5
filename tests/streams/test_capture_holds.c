/* The capture holds (streams/tracker.h, weft__capture_hold_*): a weft graph holds its capture's
 * collectives by the capture's id so weft_comm_destroy says BUSY rather than let NCCL's destroy
 * wait for the graph for ever (tests/comm test_a_communicator_held_by_a_weft_graph_is_busy).
 * Here the list itself: several holds of one id, id 0, unlinking twice, and 8 threads linking and
 * unlinking at once (run under tsan in CI). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "streams/tracker.h"

static void test_holds_of_one_id_and_of_none(void **state) {
  (void)state;
  weft__capture_hold_t a = {0}, b = {0}, z = {0};
  const uint64_t id = 0x5eed0001u;
  assert_false(weft__capture_held(id));
  weft__capture_hold_link(&a, id);
  weft__capture_hold_link(&b, id);
  assert_true(weft__capture_held(id));
  weft__capture_hold_unlink(&a);
  assert_true(weft__capture_held(id)); /* b still holds it */
  weft__capture_hold_unlink(&a);       /* not linked: nothing */
  assert_true(weft__capture_held(id));
  weft__capture_hold_unlink(&b);
  assert_false(weft__capture_held(id));
  weft__capture_hold_link(&z, 0); /* no id: nothing linked, nothing to unlink */
  assert_int_equal(z.id, 0);
  assert_false(weft__capture_held(0));
  weft__capture_hold_unlink(&z);
  weft__capture_hold_link(&a, id + 1); /* linked again after its unlink */
  assert_true(weft__capture_held(id + 1));
  weft__capture_hold_unlink(&a);
  assert_false(weft__capture_held(id + 1));
}

enum { THREADS = 8, ROUNDS = 20000, PER = 4 };

static void *holder(void *arg) {
  uint64_t base = ((uint64_t)(uintptr_t)arg + 1) << 32;
  weft__capture_hold_t h[PER] = {{0}};
  for (uint64_t i = 0; i < ROUNDS; i++) {
    for (int k = 0; k < PER; k++) weft__capture_hold_link(&h[k], base + i * PER + (uint64_t)k + 1);
    for (int k = 0; k < PER; k++)
      if (!weft__capture_held(base + i * PER + (uint64_t)k + 1)) return (void *)1;
    for (int k = PER; k-- > 0;) weft__capture_hold_unlink(&h[(k * 3) % PER]); /* not in link order */
    for (int k = 0; k < PER; k++)
      if (weft__capture_held(base + i * PER + (uint64_t)k + 1)) return (void *)2;
  }
  return NULL;
}

static void test_eight_threads_link_and_unlink_at_once(void **state) {
  (void)state;
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, holder, (void *)i), 0);
  for (int i = 0; i < THREADS; i++) {
    void *r = NULL;
    assert_int_equal(pthread_join(t[i], &r), 0);
    if (r != NULL) fail_msg("thread %d: a hold %s", i, r == (void *)1 ? "linked was not seen" : "unlinked was still seen");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_holds_of_one_id_and_of_none),
      cmocka_unit_test(test_eight_threads_link_and_unlink_at_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
