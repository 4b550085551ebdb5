/* Stale block handles while eight threads hand records out again (the stream cache reuses a
 * freed block's record at once, on any thread): a freed handle's weft_free, weft_block_ptr and
 * use are refused (STALE_HANDLE, or DOUBLE_FREE for a free), never taken for the record's later
 * block, and no thread ever sees its own live block as stale or freed. Run it under
 * --config=tsan too. In builds with test points (WEFT_DEBUG >= 1) the threads also yield inside
 * weft_free's window between its checks and its claim, so that records change hands there. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/debug.h"
#include "lib/runtime/runtime.h"
#include "tests/util/cmocka_env.h"

#define THREADS 8
#define ROUNDS 1500
#define N 1024     /* elements (unsigned) of the smallest block */
#define RING 64    /* handles freed lately, shared by every thread */

typedef struct shared {
  pthread_mutex_t lock;
  weft_block_t ring[RING];
  unsigned next;
  atomic_ulong reused_seen; /* stale handles tried while their record held a later live block */
} shared_t;

typedef struct worker {
  tu_env_t *env;
  shared_t *sh;
  unsigned id;
  char why[320]; /* the first check that failed, with weft's message */
} worker_t;

static uint64_t next_rand(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

#if WEFT__TEST_POINTS
static _Thread_local uint64_t tls_rand;

/* Yields at weft_free's test points one time in four: another thread may then hand the record
 * out again between the free's checks and its claim, or look at the block meanwhile. */
static void yield_in_free(const char *point, void *arg) {
  (void)arg;
  if (strncmp(point, "weft_free: ", 11) != 0) return;
  if (tls_rand == 0) tls_rand = (uint64_t)(uintptr_t)&tls_rand | 1;
  if ((next_rand(&tls_rand) & 3) == 0) sched_yield();
}
#endif

static bool failed(worker_t *w, const char *what, weft_status_t st) {
  if (w->why[0] == '\0')
    snprintf(w->why, sizeof w->why, "worker %u: %s: %s (%s)", w->id, what, weft_status_name(st), weft_last_error());
  return true;
}

/* The checks on a handle another thread freed: every call refuses it. */
static bool try_stale(worker_t *w, weft_stream_t *s, weft_block_t old) {
  const struct weft__block *rec = old.rec;
  uint64_t life = weft__block_life(rec);
  if (weft__life_gen(life) != old.gen && weft__life_state(life) == WEFT__BLOCK_LIVE)
    atomic_fetch_add_explicit(&w->sh->reused_seen, 1, memory_order_relaxed);
  CUdeviceptr p;
  weft_status_t st = weft_block_ptr(old, &p);
  if (st != WEFT_ERR_STALE_HANDLE) return failed(w, "weft_block_ptr of a freed handle", st);
  st = weft_free(old, s);
  if (st != WEFT_ERR_STALE_HANDLE && st != WEFT_ERR_DOUBLE_FREE) return failed(w, "weft_free of a freed handle", st);
  weft_access_t a = {old, WEFT_READ};
  st = weft_use_begin(s, &a, 1);
  if (st == WEFT_OK) {
    (void)weft_use_end(s, &a, 1);
    return failed(w, "weft_use_begin with a freed handle", st);
  }
  if (st != WEFT_ERR_STALE_HANDLE) return failed(w, "weft_use_begin with a freed handle", st);
  return false;
}

static void *churn(void *arg) {
  worker_t *w = arg;
  tu_env_t *env = w->env;
  shared_t *sh = w->sh;
  uint64_t x = 0x9E3779B97F4A7C15ull * (w->id + 1);
  unsigned streams = env->rt->tracker.n_pool;
  for (int i = 0; i < ROUNDS && w->why[0] == '\0'; i++) {
    weft_stream_t *s;
    weft_status_t st = weft_stream_get(env->rt, (unsigned)(next_rand(&x) % streams), &s);
    if (st != WEFT_OK && failed(w, "weft_stream_get", st)) break;
    /* Few sizes, so that blocks come back from the caches of the streams. */
    size_t n = (size_t)N * (1 + next_rand(&x) % 2);
    weft_block_t b;
    if ((st = weft_alloc(env->rt, n * 4, s, "stale", &b)) != WEFT_OK && failed(w, "weft_alloc", st)) break;
    CUdeviceptr p;
    if ((st = weft_block_ptr(b, &p)) != WEFT_OK && failed(w, "weft_block_ptr of the thread's own block", st)) break;
    if ((st = tu_fill(env, s, b, (unsigned)n, w->id)) != WEFT_OK && failed(w, "a fill of the thread's own block", st)) break;
    /* A handle freed lately, by any thread. */
    pthread_mutex_lock(&sh->lock);
    weft_block_t old = sh->ring[next_rand(&x) % RING];
    pthread_mutex_unlock(&sh->lock);
    if (old.rec != NULL && try_stale(w, s, old)) break;
    if ((st = weft_block_ptr(b, &p)) != WEFT_OK && failed(w, "weft_block_ptr of the thread's own block", st)) break;
    if ((st = weft_free(b, s)) != WEFT_OK && failed(w, "weft_free of the thread's own block", st)) break;
    pthread_mutex_lock(&sh->lock);
    sh->ring[sh->next++ % RING] = b;
    pthread_mutex_unlock(&sh->lock);
  }
  return NULL;
}

static int setup(void **state) {
  tu_env_t *env = calloc(1, sizeof *env);
  assert_non_null(env);
  tu_init(env, NULL);
  *state = env;
  return 0;
}

static int teardown(void **state) {
  tu_env_t *env = *state;
  tu_fini(env);
  free(env);
  return 0;
}

static void test_freed_handles_stay_stale_while_records_change_hands(void **state) {
  tu_env_t *env = *state;
  shared_t sh = {.next = 0};
  assert_int_equal(pthread_mutex_init(&sh.lock, NULL), 0);
  atomic_init(&sh.reused_seen, 0);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env->rt, &c0), WEFT_OK);
#if WEFT__TEST_POINTS
  atomic_store(&weft__test_hook, yield_in_free);
#endif
  worker_t w[THREADS];
  pthread_t t[THREADS];
  for (unsigned i = 0; i < THREADS; i++) {
    w[i] = (worker_t){env, &sh, i, ""};
    assert_int_equal(pthread_create(&t[i], NULL, churn, &w[i]), 0);
  }
  for (unsigned i = 0; i < THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
#if WEFT__TEST_POINTS
  atomic_store(&weft__test_hook, NULL);
#endif
  for (unsigned i = 0; i < THREADS; i++)
    if (w[i].why[0] != '\0') fail_msg("%s", w[i].why);
  assert_int_equal(weft_runtime_counters(env->rt, &c1), WEFT_OK);
  assert_int_equal(c1.allocs - c0.allocs, c1.frees - c0.frees);
  assert_int_equal(c1.allocs - c0.allocs, (uint64_t)THREADS * ROUNDS);
  /* The case this test is for happened: stale handles were tried while their record held a
   * later live block. */
  unsigned long seen = atomic_load(&sh.reused_seen);
  print_message("stale handles tried while their record held a later live block: %lu\n", seen);
  assert_true(seen > 0);
  assert_int_equal(tu_races(env), 0);
  pthread_mutex_destroy(&sh.lock);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_freed_handles_stay_stale_while_records_change_hands, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
