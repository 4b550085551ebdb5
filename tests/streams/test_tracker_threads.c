/* Eight host threads share one runtime and its streams: each runs its own random program (own
 * blocks, all pool streams) and reads one shared block, while allocating and freeing. Results
 * match each thread's model, the oracle reports no race, the tracker's invariants hold. Run it
 * under --config=tsan to check the locking. It runs twice: with the live fast path
 * (streams/tracker.c), which must have taken a good share of the uses (the others met a lane
 * another thread's use kept busy and took the general path), and with every use on the general
 * path (no_fast_path). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "lib/runtime/runtime.h"
#include "tests/util/testutil.h"

#define THREADS 8
#define BLOCKS 6
#define ELEMS 64
#define USES 300

static tu_env_t env;
static weft_block_t shared_block;

typedef struct job {
  unsigned id;
  int failed;
  char why[160];
} job_t;

static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  return z ^ (z >> 27);
}

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      snprintf(j->why, sizeof j->why, __VA_ARGS__);       \
      j->failed = 1;                                      \
      return NULL;                                        \
    }                                                     \
  } while (0)

static void *worker(void *arg) {
  job_t *j = arg;
  uint64_t seed = j->id * 1000003u + 17;
  weft_block_t blk[BLOCKS];
  unsigned model[BLOCKS][ELEMS], tmp[ELEMS];
  weft_stream_t *s;
  const weft_block_t none = {0};
  CHECK(weft_stream_get(env.rt, j->id % 8, &s) == WEFT_OK, "stream");
  for (unsigned b = 0; b < BLOCKS; b++) {
    CHECK(weft_alloc(env.rt, ELEMS * 4, s, "thread", &blk[b]) == WEFT_OK, "alloc: %s", weft_last_error());
    CHECK(tu_fill(&env, s, blk[b], ELEMS, j->id * 100 + b) == WEFT_OK, "fill: %s", weft_last_error());
    for (unsigned i = 0; i < ELEMS; i++) model[b][i] = j->id * 100 + b;
  }
  for (unsigned v = 0; v < USES; v++) {
    CHECK(weft_stream_get(env.rt, (unsigned)(next(&seed) % 8), &s) == WEFT_OK, "stream");
    unsigned out = (unsigned)(next(&seed) % BLOCKS), in = (unsigned)(next(&seed) % BLOCKS);
    if (v % 50 == 49) {
      /* Replace a block: free it on one stream, allocate anew on another. */
      CHECK(weft_free(blk[out], s) == WEFT_OK, "free: %s", weft_last_error());
      CHECK(weft_stream_get(env.rt, (unsigned)(next(&seed) % 8), &s) == WEFT_OK, "stream");
      CHECK(weft_alloc(env.rt, ELEMS * 4, s, "thread", &blk[out]) == WEFT_OK, "alloc: %s", weft_last_error());
      CHECK(tu_fill(&env, s, blk[out], ELEMS, v) == WEFT_OK, "fill");
      for (unsigned i = 0; i < ELEMS; i++) model[out][i] = v;
      continue;
    }
    unsigned salt = j->id * 7919u + v;
    CHECK(tu_combine(&env, s, blk[out], none, blk[in], shared_block, none, ELEMS, salt) == WEFT_OK, "combine: %s",
          weft_last_error());
    for (unsigned i = 0; i < ELEMS; i++) tmp[i] = salt + 7u * model[in][i] + 13u * 11u;
    for (unsigned i = 0; i < ELEMS; i++) model[out][i] = tmp[i];
  }
  for (unsigned b = 0; b < BLOCKS; b++) {
    CHECK(tu_read(s, blk[b], tmp, sizeof tmp) == WEFT_OK, "read");
    for (unsigned i = 0; i < ELEMS; i++) CHECK(tmp[i] == model[b][i], "thread %u block %u elem %u: %u != %u", j->id, b, i, tmp[i], model[b][i]);
    CHECK(weft_free(blk[b], s) == WEFT_OK, "free");
  }
  return NULL;
}

static void eight_threads(bool fast) {
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  assert_int_equal(tu_init(&env, &o), 0);
  env.rt->tracker.no_fast_path = !fast;
  weft_stream_t *s0;
  assert_int_equal(weft_stream_get(env.rt, 0, &s0), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, ELEMS * 4, s0, "shared", &shared_block), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, shared_block, ELEMS, 11), WEFT_OK);
  tu_reset_races(&env);
  pthread_t t[THREADS];
  job_t jobs[THREADS] = {{0}};
  for (unsigned i = 0; i < THREADS; i++) {
    jobs[i].id = i;
    assert_int_equal(pthread_create(&t[i], NULL, worker, &jobs[i]), 0);
  }
  for (unsigned i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  for (unsigned i = 0; i < THREADS; i++)
    if (jobs[i].failed) fail_msg("thread %u: %s", i, jobs[i].why);
  if (tu_races(&env) != 0) tu_print_races(&env);
  assert_int_equal(tu_races(&env), 0);
  assert_true(weft__tracker_is_valid(&env.rt->tracker));
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  uint64_t fast_uses = env.rt->tracker.fast_uses;
  printf("8 threads: %llu uses, %llu waits issued, %llu skipped, %llu busy waits, %llu on the fast path\n",
         (unsigned long long)c.uses, (unsigned long long)c.waits_issued, (unsigned long long)c.waits_skipped,
         (unsigned long long)c.busy_waits, (unsigned long long)fast_uses);
  /* Most uses on the simulator (2,477 of 2,497), about half on a GPU, where kernels run longer
   * and more uses meet a busy lane (1,380 of 2,497 with 1,544 busy waits on 2 x H100). */
  if (fast) assert_true(fast_uses > c.uses / 4);
  else assert_int_equal(fast_uses, 0);
  assert_int_equal(weft_free(shared_block, s0), WEFT_OK);
  tu_fini(&env);
}

static void test_eight_threads_share_one_runtime(void **state) {
  (void)state;
  eight_threads(true);
}

static void test_eight_threads_share_one_runtime_on_the_general_path(void **state) {
  (void)state;
  eight_threads(false);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_eight_threads_share_one_runtime),
      cmocka_unit_test(test_eight_threads_share_one_runtime_on_the_general_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
