/* A thread's exit destructors in the order that splits weft's (its own binary: pthread keys are
 * numbered in the order a process makes them, and glibc runs destructors in that order): the
 * handle set's key (made by the first entry into any object), then a program's key, then comm's
 * key for the group buffer (made by the first grouped call). The program's destructor runs after
 * the thread's entries ended but before its group buffer went; a group it finds open stays inside
 * nothing, so it is dropped: its end says there is no group (INVALID_ARGUMENT) and enqueues
 * nothing, and a destroy of its communicators on another thread returns. Before, the end ran the
 * group on communicators it no longer protected from a concurrent destroy. (Found by review.) */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "lib/core/handle.h"
#include "weft/weft.h"

#define N 1024
static weft_runtime_t *rt[2];
static weft_comm_t *x[2];
static weft_block_t a[2];
static pthread_key_t mid_key;
static weft_status_t group_st, end_st;
static unsigned entries_at_end = 99;
static int ran;

static void mid_destructor(void *arg) {
  (void)arg;
  entries_at_end = weft__handle_entries();
  end_st = weft_comm_group_end();
  ran = 1;
}

static void *open_group(void *arg) {
  (void)arg;
  group_st = weft_comm_group_begin();
  for (int r = 0; r < 2 && group_st == WEFT_OK; r++)
    group_st = weft_all_reduce(x[r], a[r], 0, a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL);
  (void)pthread_setspecific(mid_key, &mid_key); /* the group stays open */
  return NULL;
}

static void test_a_group_found_open_between_weft_exit_destructors_is_dropped(void **state) {
  (void)state;
  /* The handle set's key first: an entry into an object (here one of the handle set's own). */
  static int dummy;
  assert_true(weft__handle_add(&dummy, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_enter(&dummy, WEFT__HANDLE_EXEC));
  weft__handle_leave();
  assert_true(weft__handle_remove(&dummy, WEFT__HANDLE_EXEC));
  assert_int_equal(pthread_key_create(&mid_key, mid_destructor), 0);
  weft_driver_info_t info;
  assert_int_equal(weft_driver_info(&info), WEFT_OK);
  if (info.device_count < 2) skip();
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_get(r, NULL, &rt[r]), WEFT_OK);
  assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK); /* its eager group makes comm's key: after mid_key */
  weft_stream_t *s[2];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_stream_get(rt[r], 0, &s[r]), WEFT_OK);
    assert_int_equal(weft_alloc(rt[r], N * 4, s[r], "keyorder", &a[r]), WEFT_OK);
    assert_int_equal(weft_memset32(s[r], a[r], 0, 0, N * 4), WEFT_OK);
  }
  weft_counters_t c0[2], c1[2];
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_counters(rt[r], &c0[r]), WEFT_OK);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, open_group, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(group_st, WEFT_OK);
  if (!ran) fail_msg("the program's destructor did not run");
  assert_int_equal(entries_at_end, 0); /* the handle set's destructor ran first */
  if (end_st != WEFT_ERR_INVALID_ARGUMENT)
    fail_msg("the group's end between weft's exit destructors: %s, want INVALID_ARGUMENT (the group dropped)",
             weft_status_name(end_st));
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_runtime_counters(rt[r], &c1[r]), WEFT_OK);
    assert_int_equal(c1[r].uses, c0[r].uses); /* nothing enqueued */
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(x[r]), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_free(a[r], s[r]), WEFT_OK);
    assert_int_equal(weft_runtime_release(rt[r]), WEFT_OK);
  }
  assert_int_equal(pthread_key_delete(mid_key), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_group_found_open_between_weft_exit_destructors_is_dropped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
