/* Destroying an object while other threads use it ("All functions are thread-safe", weft.h): a
 * graph's exec destroyed while threads launch it. Each launch either runs the whole graph or
 * fails with STALE_HANDLE; the destroy returns once no launch is inside (never frees what a
 * launch reads); nothing crashes (asan: no use after free), and the simulator's oracle sees no
 * race.
 *
 * Precondition checked: every launcher had launched the exec before it was destroyed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/cmocka_env.h"

enum { LAUNCHERS = 3, ELEMS = 1024, ROUNDS = 30, BEFORE = 20 };

static tu_env_t env;

typedef struct launcher {
  weft_exec_t *e;
  unsigned stream;
  atomic_uint launched;     /* launches that returned WEFT_OK */
  weft_status_t last;       /* the status that ended the loop */
  char why[256];            /* its message */
} launcher_t;

static void *launch_loop(void *arg) {
  launcher_t *l = arg;
  weft_stream_t *s = tu_stream(&env, l->stream);
  weft_status_t st;
  while ((st = weft_exec_launch(l->e, s)) == WEFT_OK) atomic_fetch_add(&l->launched, 1);
  l->last = st;
  snprintf(l->why, sizeof l->why, "%s", weft_last_error());
  return NULL;
}

static void test_an_exec_destroyed_while_threads_launch_it(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_count = LAUNCHERS + 1;
  assert_int_equal(tu_init(&env, &o), 0);
  tu_reset_races(&env);
  weft_block_t b = tu_alloc(&env, ELEMS * 4, 0, "b");
  unsigned before_destroy = UINT32_MAX;
  for (unsigned r = 0; r < ROUNDS; r++) {
    weft_stream_t *s = tu_stream(&env, 0);
    weft_capture_options_t co = weft_capture_options_default();
    assert_int_equal(weft_capture_begin(s, &co), WEFT_OK);
    assert_int_equal(tu_fill(&env, s, b, ELEMS, r), WEFT_OK);
    weft_graph_t *g;
    assert_int_equal(weft_capture_end(s, &g), WEFT_OK);
    weft_exec_t *e;
    assert_int_equal(weft_graph_instantiate(g, s, &e), WEFT_OK);
    launcher_t l[LAUNCHERS];
    pthread_t t[LAUNCHERS];
    for (unsigned i = 0; i < LAUNCHERS; i++) {
      l[i].e = e;
      l[i].stream = 1 + i;
      atomic_init(&l[i].launched, 0);
      l[i].last = WEFT_OK;
      assert_int_equal(pthread_create(&t[i], NULL, launch_loop, &l[i]), 0);
    }
    /* Wait (no sleep: spin on the counts) until each launcher has launched BEFORE times. */
    for (unsigned i = 0; i < LAUNCHERS; i++)
      while (atomic_load(&l[i].launched) < BEFORE && l[i].last == WEFT_OK) sched_yield();
    for (unsigned i = 0; i < LAUNCHERS; i++)
      if (atomic_load(&l[i].launched) < before_destroy) before_destroy = atomic_load(&l[i].launched);
    assert_int_equal(weft_exec_destroy(e), WEFT_OK);
    for (unsigned i = 0; i < LAUNCHERS; i++) {
      pthread_join(t[i], NULL);
      if (l[i].last != WEFT_ERR_STALE_HANDLE)
        fail_msg("round %u launcher %u: weft_exec_launch ended with %s (%s), not STALE_HANDLE", r, i,
                 weft_status_name(l[i].last), l[i].why);
    }
    assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  }
  /* The graph's work landed whole: the last round's fill. */
  unsigned host[ELEMS];
  assert_int_equal(tu_read(tu_stream(&env, 0), b, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < ELEMS; i++) assert_int_equal(host[i], ROUNDS - 1);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  uint64_t races = tu_races(&env);
  if (races != 0) tu_print_races(&env);
  tu_fini(&env);
  if (before_destroy < BEFORE) skip(); /* a launcher failed before the destroy: reported above */
  assert_int_equal(races, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_an_exec_destroyed_while_threads_launch_it)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
