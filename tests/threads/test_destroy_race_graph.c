/* Destroying a graph-layer object while other threads use it ("All functions are thread-safe",
 * weft.h), beside test_destroy_race (an exec destroyed while threads launch it): a graph read or
 * instantiated, a graph pool drawn from or queried, a builder added to, an exec's outputs read,
 * each while the main thread destroys the object. Every use either works on the live object or
 * fails with STALE_HANDLE once it is destroyed; the destroy frees nothing a use still reads (asan:
 * no use after free), and the simulator's oracle sees no race.
 *
 * Precondition checked: every user had used the object BEFORE times before it was destroyed.
 *
 * A use after free shows as a wrong status or answer in any build, or as asan's heap-use-after-free
 * with weft's metadata from libc (bazel test --config=asan --define=weft_metadata=libc): from its
 * private jemalloc arena (the default) freed objects stay mapped and asan does not see them. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/cmocka_env.h"

enum { USERS = 3, MAX_USERS = 5, ROUNDS = 30, BEFORE = 20, ELEMS = 256, SUMMARY = 128, PACE = 20000 };

static tu_env_t env;

typedef struct user user_t;

struct user {
  weft_status_t (*step)(user_t *u); /* one use: OK counts, BUSY is tried again, anything else ends */
  void *obj;                        /* the object under test */
  weft_stream_t *s;                 /* the user's own stream */
  uint64_t expect;                  /* what a query of the live object answers */
  unsigned pace;                    /* spins (no sleep) after each use: room for the destroy */
  atomic_uint ok;                   /* uses that worked */
  atomic_bool done;                 /* the loop ended */
  weft_status_t last;               /* the status that ended it */
  char why[256];                    /* its message (the step's own for a wrong answer) */
};

static void *use_loop(void *arg) {
  user_t *u = arg;
  weft_status_t st;
  while ((st = u->step(u)) == WEFT_OK || st == WEFT_ERR_BUSY) {
    if (st == WEFT_OK) atomic_fetch_add(&u->ok, 1);
    for (volatile unsigned k = u->pace; k != 0; k--) {
    }
  }
  u->last = st;
  if (u->why[0] == '\0') snprintf(u->why, sizeof u->why, "%s", weft_last_error());
  atomic_store(&u->done, true);
  return NULL;
}

/* A query that answers with a value, not a status: OK when the answer was right; STALE_HANDLE when
 * it failed because the object was destroyed (weft_last_error says so); else a wrong answer. */
static weft_status_t queried(user_t *u, bool right, const char *fn) {
  if (right) return WEFT_OK;
  const char *e = weft_last_error();
  if (strncmp(e, fn, strlen(fn)) == 0 && strstr(e, "destroyed") != NULL) return WEFT_ERR_STALE_HANDLE;
  snprintf(u->why, sizeof u->why, "%s gave a wrong answer (last error: '%s')", fn, e);
  return WEFT_ERR_CORRUPTED;
}

/* A call that must work on an object the user made itself: any failure is a wrong answer (never
 * mistaken for the STALE_HANDLE that ends the loop). */
static weft_status_t must(user_t *u, weft_status_t st, const char *what) {
  if (st == WEFT_OK) return WEFT_OK;
  snprintf(u->why, sizeof u->why, "%s: %s (%s)", what, weft_status_name(st), weft_last_error());
  return WEFT_ERR_CORRUPTED;
}

/* Starts the users of `obj` (u[i].step, .s and .expect set), waits (spinning, no sleep) until each
 * has used it BEFORE times, destroys it with `destroy` (BUSY: a user holds it for the moment, as
 * a graph with an exec: try again), joins them, and checks that each loop ended with STALE_HANDLE. */
static void race(const char *what, unsigned round, user_t *u, unsigned n, void *obj, weft_status_t (*destroy)(void *)) {
  pthread_t t[MAX_USERS];
  assert_true(n <= MAX_USERS);
  for (unsigned i = 0; i < n; i++) {
    u[i].obj = obj;
    atomic_init(&u[i].ok, 0);
    atomic_init(&u[i].done, false);
    u[i].last = WEFT_OK;
    u[i].why[0] = '\0';
    assert_int_equal(pthread_create(&t[i], NULL, use_loop, &u[i]), 0);
  }
  for (unsigned i = 0; i < n; i++)
    while (atomic_load(&u[i].ok) < BEFORE && !atomic_load(&u[i].done)) sched_yield();
  unsigned before[MAX_USERS];
  for (unsigned i = 0; i < n; i++) before[i] = atomic_load(&u[i].ok);
  /* A user whose count just reached BEFORE is at the start of its next use: spin a while longer
   * (no sleep), a different while each round, so that the destroy meets its uses at any point. */
  for (volatile unsigned k = (round * 7919u) % 40000u; k != 0; k--) {
  }
  weft_status_t st;
  while ((st = destroy(obj)) == WEFT_ERR_BUSY) sched_yield();
  char why[256];
  snprintf(why, sizeof why, "%s", weft_last_error());
  for (unsigned i = 0; i < n; i++) pthread_join(t[i], NULL);
  for (unsigned i = 0; i < n; i++) {
    if (u[i].last != WEFT_ERR_STALE_HANDLE)
      fail_msg("%s, round %u, user %u: its loop ended with %s (%s) after %u uses, not STALE_HANDLE", what, round, i,
               weft_status_name(u[i].last), u[i].why, atomic_load(&u[i].ok));
    if (before[i] < BEFORE)
      fail_msg("%s, round %u, user %u: used only %u times before the destroy", what, round, i, before[i]);
  }
  if (st != WEFT_OK) fail_msg("%s, round %u: the destroy gave %s (%s)", what, round, weft_status_name(st), why);
}

static void start(unsigned streams) {
  weft_options_t o = weft_options_default();
  o.stream_count = streams;
  assert_int_equal(tu_init(&env, &o), 0);
  tu_reset_races(&env);
}

static void finish(void) {
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  uint64_t races = tu_races(&env);
  if (races != 0) tu_print_races(&env);
  tu_fini(&env);
  assert_int_equal(races, 0);
}

static weft_status_t destroy_graph(void *g) { return weft_graph_destroy(g); }
static weft_status_t destroy_exec(void *e) { return weft_exec_destroy(e); }
static weft_status_t destroy_pool(void *p) { return weft_graph_pool_destroy(p); }
static weft_status_t destroy_builder(void *b) { return weft_builder_destroy(b); }

/* A graph of one capture on s: fills `b`; with `inside`, also allocates a block there and fills it
 * (an output of the graph). */
static weft_graph_t *captured(weft_stream_t *s, weft_block_t b, bool inside, unsigned value) {
  weft_capture_options_t co = weft_capture_options_default();
  assert_int_equal(weft_capture_begin(s, &co), WEFT_OK);
  assert_int_equal(tu_fill(&env, s, b, ELEMS, value), WEFT_OK);
  if (inside) {
    weft_block_t o;
    assert_int_equal(weft_alloc(env.rt, ELEMS * 4, s, "output", &o), WEFT_OK);
    assert_int_equal(tu_fill(&env, s, o, ELEMS, value + 1), WEFT_OK);
  }
  weft_graph_t *g;
  assert_int_equal(weft_capture_end(s, &g), WEFT_OK);
  return g;
}

/* ---- a graph ------------------------------------------------------------------------------------ */

static weft_block_t outside[SUMMARY]; /* the blocks a builder's graph reads, in its summary's order */

static weft_status_t raw_step(user_t *u) {
  CUgraph g = weft_graph_raw(u->obj);
  return queried(u, g != NULL && (uint64_t)(uintptr_t)g == u->expect, "weft_graph_raw");
}
static weft_status_t output_count_step(user_t *u) {
  return queried(u, weft_graph_output_count(u->obj) == u->expect, "weft_graph_output_count");
}
static weft_status_t summary_step(user_t *u) {
  weft_access_t acc[SUMMARY];
  size_t n = weft_graph_summary(u->obj, acc, SUMMARY);
  bool right = n == u->expect;
  for (size_t i = 0; i < SUMMARY && right; i++)
    right = acc[i].block.rec == outside[i].rec && acc[i].block.gen == outside[i].gen && acc[i].kind == WEFT_READ;
  return queried(u, right, "weft_graph_summary");
}

/* weft_graph_raw, weft_graph_output_count and weft_graph_summary while the graph is destroyed. */
static void test_a_graph_read_while_it_is_destroyed(void **state) {
  (void)state;
  start(2);
  for (unsigned i = 0; i < SUMMARY; i++) outside[i] = tu_alloc(&env, 64, 0, "outside");
  for (unsigned r = 0; r < ROUNDS; r++) {
    weft_builder_t *bd;
    assert_int_equal(weft_builder_create(env.rt, &bd), WEFT_OK);
    weft_block_t inside;
    assert_int_equal(weft_builder_alloc(bd, 64, "inside", &inside), WEFT_OK);
    /* One read per node: a node with more new blocks than the builder's state array has room for
     * reads that array after growing it (a bug of its own, not this test's). */
    for (unsigned i = 0; i < SUMMARY; i++) {
      weft_access_t acc = {outside[i], WEFT_READ};
      assert_int_equal(weft_builder_empty(bd, &acc, 1, NULL), WEFT_OK);
    }
    weft_graph_t *g;
    assert_int_equal(weft_builder_finish(bd, &g), WEFT_OK);
    user_t u[USERS] = {
        {.step = raw_step, .expect = (uint64_t)(uintptr_t)weft_graph_raw(g)},
        {.step = output_count_step, .expect = 1},
        {.step = summary_step, .expect = SUMMARY},
    };
    race("weft_graph_raw / output_count / summary", r, u, USERS, g, destroy_graph);
  }
  for (unsigned i = 0; i < SUMMARY; i++) assert_int_equal(weft_free(outside[i], tu_stream(&env, 0)), WEFT_OK);
  finish();
}

static weft_status_t instantiate_step(user_t *u) {
  weft_exec_t *e;
  weft_status_t st = weft_graph_instantiate(u->obj, u->s, &e);
  if (st != WEFT_OK) return st; /* BUSY: another user's exec exists for the moment */
  return must(u, weft_exec_destroy(e), "weft_exec_destroy of the exec just made");
}

/* weft_graph_instantiate (and the destroy of the exec it made) while the graph is destroyed. */
static void test_a_graph_instantiated_while_it_is_destroyed(void **state) {
  (void)state;
  start(USERS + 1);
  weft_block_t b = tu_alloc(&env, ELEMS * 4, 0, "b");
  for (unsigned r = 0; r < ROUNDS; r++) {
    weft_graph_t *g = captured(tu_stream(&env, 0), b, false, r);
    user_t u[USERS];
    for (unsigned i = 0; i < USERS; i++) u[i] = (user_t){.step = instantiate_step, .s = tu_stream(&env, 1 + i)};
    race("weft_graph_instantiate", r, u, USERS, g, destroy_graph);
  }
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
  finish();
}

/* ---- a graph pool --------------------------------------------------------------------------------- */

static weft_status_t capture_step(user_t *u) {
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = WEFT_CAPTURE_THREAD_LOCAL;
  o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  o.pool = u->obj;
  weft_status_t st = weft_capture_begin(u->s, &o);
  if (st != WEFT_OK) return st; /* BUSY: another user's capture draws from the pool */
  weft_block_t t;
  st = must(u, weft_alloc(env.rt, 256, u->s, "from the pool", &t), "weft_alloc in the capture");
  weft_graph_t *g = NULL;
  weft_status_t end = weft_capture_end(u->s, &g);
  if (st != WEFT_OK) return st;
  if ((st = must(u, end, "weft_capture_end")) != WEFT_OK) return st;
  return must(u, weft_graph_destroy(g), "weft_graph_destroy of the graph just made");
}

/* weft_capture_begin with the pool (and a capture drawing from it) while the pool is destroyed. */
static void test_a_graph_pool_drawn_from_while_it_is_destroyed(void **state) {
  (void)state;
  start(USERS + 1);
  /* Two users, pausing after each capture (spinning): else they keep the pool in use almost all
   * the time, and its destroy says BUSY until it finds it unused (seconds a round under asan). */
  for (unsigned r = 0; r < ROUNDS; r++) {
    weft_graph_pool_t *p;
    assert_int_equal(weft_graph_pool_create(env.rt, &p), WEFT_OK);
    user_t u[2];
    for (unsigned i = 0; i < 2; i++) u[i] = (user_t){.step = capture_step, .s = tu_stream(&env, 1 + i), .pace = PACE};
    race("weft_capture_begin with a graph pool", r, u, 2, p, destroy_pool);
  }
  finish();
}

static weft_status_t owns_step(user_t *u) {
  return queried(u, weft_graph_pool_owns(u->obj, (CUdeviceptr)u->expect) == 1, "weft_graph_pool_owns");
}
static weft_status_t reserved_step(user_t *u) {
  return queried(u, weft_graph_pool_reserved(u->obj) == u->expect, "weft_graph_pool_reserved");
}
static weft_status_t allocate_to_step(user_t *u) {
  weft_status_t st = weft_capture_allocate_to(u->s, u->obj);
  if (st == WEFT_ERR_CAPTURE) return WEFT_OK; /* right: no capture begun outside weft on the stream */
  return st == WEFT_OK ? must(u, WEFT_ERR_INVALID_ARGUMENT, "weft_capture_allocate_to without a capture said OK") : st;
}

/* weft_graph_pool_owns, weft_graph_pool_reserved and weft_capture_allocate_to while the pool (with
 * memory: a graph allocated from it) is destroyed. */
static void test_a_graph_pool_queried_while_it_is_destroyed(void **state) {
  (void)state;
  start(USERS + 1);
  /* weft_capture_allocate_to read the pool only right after its check: three users of it and
   * more rounds (without the fix, asan saw the destroy in between in about half of the runs with
   * one user and 30 rounds; in 7 of 8 with these). Each call takes a use of the pool (its destroy
   * says BUSY meanwhile): they pause between calls (spinning), or the destroy waits for seconds. */
  for (unsigned r = 0; r < 8 * ROUNDS; r++) {
    weft_graph_pool_t *p;
    assert_int_equal(weft_graph_pool_create(env.rt, &p), WEFT_OK);
    weft_stream_t *s = tu_stream(&env, 0);
    weft_capture_options_t o = weft_capture_options_default();
    o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
    o.pool = p;
    assert_int_equal(weft_capture_begin(s, &o), WEFT_OK);
    weft_block_t t;
    CUdeviceptr ptr;
    assert_int_equal(weft_alloc(env.rt, 256, s, "from the pool", &t), WEFT_OK);
    assert_int_equal(weft_block_ptr(t, &ptr), WEFT_OK);
    weft_graph_t *g;
    assert_int_equal(weft_capture_end(s, &g), WEFT_OK);
    assert_int_equal(weft_graph_destroy(g), WEFT_OK);
    uint64_t reserved = weft_graph_pool_reserved(p);
    assert_true(reserved != 0);
    user_t u[5] = {
        {.step = owns_step, .expect = ptr},
        {.step = reserved_step, .expect = reserved},
        {.step = allocate_to_step, .s = tu_stream(&env, 1), .pace = PACE / 5},
        {.step = allocate_to_step, .s = tu_stream(&env, 2), .pace = PACE / 5},
        {.step = allocate_to_step, .s = tu_stream(&env, 3), .pace = PACE / 5},
    };
    race("weft_graph_pool_owns / reserved / weft_capture_allocate_to", r, u, 5, p, destroy_pool);
  }
  finish();
}

/* ---- a builder ------------------------------------------------------------------------------------- */

static weft_graph_t *finished; /* the graph weft_builder_finish made */

static weft_status_t finish_builder(void *b) { return weft_builder_finish(b, &finished); }

static weft_status_t build_step(user_t *u) {
  weft_block_t blk;
  weft_status_t st = weft_builder_alloc(u->obj, 64, "inside", &blk);
  if (st != WEFT_OK) return st;
  weft_access_t a = {blk, WEFT_WRITE};
  if ((st = weft_builder_empty(u->obj, &a, 1, NULL)) != WEFT_OK) return st;
  return weft_builder_free(u->obj, blk);
}

/* weft_builder_alloc, _empty and _free while the builder is destroyed (even rounds) or finished
 * (odd rounds). One user: a builder is used by one thread at a time. */
static void test_a_builder_used_while_it_is_destroyed(void **state) {
  (void)state;
  start(2);
  /* More rounds: one user (and two CPUs) meets the destroy inside a use less often. */
  for (unsigned r = 0; r < 10 * ROUNDS; r++) {
    weft_builder_t *bd;
    assert_int_equal(weft_builder_create(env.rt, &bd), WEFT_OK);
    user_t u[1] = {{.step = build_step}};
    finished = NULL;
    race(r % 2 ? "weft_builder_* vs weft_builder_finish" : "weft_builder_* vs weft_builder_destroy", r, u, 1, bd,
         r % 2 ? finish_builder : destroy_builder);
    if (r % 2) assert_int_equal(weft_graph_destroy(finished), WEFT_OK);
  }
  finish();
}

/* ---- an exec's outputs ---------------------------------------------------------------------------- */

static weft_status_t exec_output_step(user_t *u) {
  weft_block_t out;
  return weft_exec_output(u->obj, 0, &out);
}

/* weft_exec_output while the exec is destroyed. */
static void test_an_exec_output_read_while_the_exec_is_destroyed(void **state) {
  (void)state;
  start(2);
  weft_block_t b = tu_alloc(&env, ELEMS * 4, 0, "b");
  for (unsigned r = 0; r < ROUNDS; r++) {
    weft_graph_t *g = captured(tu_stream(&env, 0), b, true, r);
    assert_int_equal(weft_graph_output_count(g), 1);
    weft_exec_t *e;
    assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
    user_t u[USERS];
    for (unsigned i = 0; i < USERS; i++) u[i] = (user_t){.step = exec_output_step};
    race("weft_exec_output", r, u, USERS, e, destroy_exec);
    assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  }
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
  finish();
}

/* An argument runs only the tests whose names match it (cmocka's filter, * a wildcard). */
int main(int argc, char **argv) {
  if (argc > 1) cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_graph_read_while_it_is_destroyed),
      cmocka_unit_test(test_a_graph_instantiated_while_it_is_destroyed),
      cmocka_unit_test(test_a_graph_pool_drawn_from_while_it_is_destroyed),
      cmocka_unit_test(test_a_graph_pool_queried_while_it_is_destroyed),
      cmocka_unit_test(test_a_builder_used_while_it_is_destroyed),
      cmocka_unit_test(test_an_exec_output_read_while_the_exec_is_destroyed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
