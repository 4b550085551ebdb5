/* The private graph-pool policy: temporaries of one capture reuse each other's memory with the
 * needed captured waits; two graphs sharing a pool and replayed in capture order reuse each
 * other's temporaries; outputs follow the same relaunch rules as graph memory nodes. Prints the
 * device memory each policy held for the same step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/again.h"
#include "tests/util/cmocka_env.h"

#define N 4096
static tu_env_t env;
static const weft_block_t none = {0};

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  return tu_init(&env, &o);
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}
typedef struct step {
  weft_block_t x;
  CUdeviceptr tmp_ptr[4];
} step_t;

/* x -> t1 (s0) -> t2 (s1) -> t3 (s0) -> out (s1); each temporary freed right after its reader,
 * so later temporaries can take earlier ones' memory, on the other stream. */
static weft_status_t body(weft_stream_t *s0, void *arg) {
  step_t *st = arg;
  weft_stream_t *s1 = tu_stream(&env, 1);
  weft_status_t r = weft_capture_join(s0, s1);
  weft_block_t t1, t2, t3, out;
  if (r == WEFT_OK) r = weft_alloc(env.rt, N * 4, s0, "t1", &t1);
  if (r == WEFT_OK) r = tu_combine(&env, s0, t1, none, st->x, none, none, N, 1);
  if (r == WEFT_OK) r = weft_alloc(env.rt, N * 4, s1, "t2", &t2);
  if (r == WEFT_OK) r = tu_combine(&env, s1, t2, none, t1, none, none, N, 2);
  if (r == WEFT_OK) r = weft_block_ptr(t1, &st->tmp_ptr[0]);
  if (r == WEFT_OK) r = weft_free(t1, s1);
  if (r == WEFT_OK) r = weft_alloc(env.rt, N * 4, s0, "t3", &t3);
  if (r == WEFT_OK) r = weft_block_ptr(t3, &st->tmp_ptr[2]);
  if (r == WEFT_OK) r = tu_combine(&env, s0, t3, none, t2, none, none, N, 3);
  if (r == WEFT_OK) r = weft_free(t2, s0);
  if (r == WEFT_OK) r = weft_alloc(env.rt, N * 4, s1, "out", &out);
  if (r == WEFT_OK) r = tu_combine(&env, s1, out, none, t3, none, none, N, 4);
  if (r == WEFT_OK) r = weft_free(t3, s1);
  return r;
}

static unsigned expect(unsigned x) {
  unsigned t1 = 1 + 7u * x, t2 = 2 + 7u * t1, t3 = 3 + 7u * t2;
  return 4 + 7u * t3;
}

static void run_replays(weft_graph_t *g, step_t *st, unsigned base) {
  weft_exec_t *e;
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
  for (unsigned it = 0; it < 50; it++) {
    assert_int_equal(tu_fill(&env, tu_stream(&env, 2), st->x, N, base + it), WEFT_OK);
    assert_int_equal(weft_exec_launch(e, tu_stream(&env, it % 2 ? 3 : 0)), WEFT_OK);
    weft_block_t out;
    assert_int_equal(weft_exec_output(e, 0, &out), WEFT_OK);
    assert_int_equal(weft_exec_launch(e, tu_stream(&env, 0)), WEFT_ERR_BUSY);
    static unsigned got[N];
    assert_int_equal(tu_read(tu_stream(&env, 4), out, got, sizeof got), WEFT_OK);
    for (unsigned i = 0; i < N; i++)
      if (got[i] != expect(base + it)) fail_msg("replay %u element %u: %u != %u", it, i, got[i], expect(base + it));
    assert_int_equal(weft_free(out, tu_stream(&env, 5)), WEFT_OK);
  }
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
}

static void test_private_pool_reuses_temporaries_with_captured_waits(void **state) {
  (void)state;
  tu_reset_races(&env);
  step_t st;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "x", &st.x), WEFT_OK);
  weft_capture_options_t o = weft_capture_options_default();
  o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  weft_graph_t *g;
  weft_status_t r = weft_capture_run(tu_stream(&env, 0), &o, body, &st, &g);
  if (r != WEFT_OK) fail_msg("%s: %s", weft_status_name(r), weft_last_error());
  assert_true(st.tmp_ptr[2] == st.tmp_ptr[0]); /* t3 took t1's memory (freed on the other stream) */
  run_replays(g, &st, 10);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(st.x, tu_stream(&env, 0)), WEFT_OK);
  if (tu_races(&env) != 0) tu_print_races(&env);
  assert_int_equal(tu_races(&env), 0);
}

static void test_graphs_sharing_a_pool_reuse_each_others_temporaries(void **state) {
  (void)state;
  tu_reset_races(&env);
  weft_graph_pool_t *pool;
  assert_int_equal(weft_graph_pool_create(env.rt, &pool), WEFT_OK);
  step_t a, b;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "xa", &a.x), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "xb", &b.x), WEFT_OK);
  weft_capture_options_t o = weft_capture_options_default();
  o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  o.pool = pool;
  weft_graph_t *ga, *gb;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), &o, body, &a, &ga), WEFT_OK);
  uint64_t after_a = weft_graph_pool_reserved(pool);
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), &o, body, &b, &gb), WEFT_OK);
  assert_true(b.tmp_ptr[0] == a.tmp_ptr[0]); /* b's first temporary reuses a's */
  assert_int_equal(weft_graph_pool_reserved(pool), after_a); /* nothing new reserved */
  assert_int_equal(weft_graph_pool_destroy(pool), WEFT_ERR_BUSY);
  /* Replayed in capture order (a then b, each time). */
  weft_exec_t *ea, *eb;
  assert_int_equal(weft_graph_instantiate(ga, tu_stream(&env, 0), &ea), WEFT_OK);
  assert_int_equal(weft_graph_instantiate(gb, tu_stream(&env, 0), &eb), WEFT_OK);
  for (unsigned it = 0; it < 30; it++) {
    assert_int_equal(tu_fill(&env, tu_stream(&env, 2), a.x, N, it), WEFT_OK);
    assert_int_equal(tu_fill(&env, tu_stream(&env, 2), b.x, N, 1000 + it), WEFT_OK);
    assert_int_equal(weft_exec_launch(ea, tu_stream(&env, 0)), WEFT_OK);
    assert_int_equal(weft_exec_launch(eb, tu_stream(&env, 0)), WEFT_OK);
    weft_block_t oa, ob;
    assert_int_equal(weft_exec_output(ea, 0, &oa), WEFT_OK);
    assert_int_equal(weft_exec_output(eb, 0, &ob), WEFT_OK);
    unsigned va, vb;
    assert_int_equal(weft_copy_from_block(tu_stream(&env, 4), &va, oa, 0, 4), WEFT_OK);
    assert_int_equal(weft_copy_from_block(tu_stream(&env, 4), &vb, ob, 0, 4), WEFT_OK);
    assert_int_equal(weft_stream_synchronize(tu_stream(&env, 4)), WEFT_OK);
    assert_int_equal(va, expect(it));
    assert_int_equal(vb, expect(1000 + it));
    assert_int_equal(weft_free(oa, tu_stream(&env, 1)), WEFT_OK);
    assert_int_equal(weft_free(ob, tu_stream(&env, 1)), WEFT_OK);
  }
  assert_int_equal(weft_exec_destroy(ea), WEFT_OK);
  assert_int_equal(weft_exec_destroy(eb), WEFT_OK);
  assert_int_equal(weft_graph_destroy(ga), WEFT_OK);
  assert_int_equal(weft_graph_destroy(gb), WEFT_OK);
  printf("shared graph pool: %llu bytes reserved for two graphs of 4 x %u-byte blocks each\n",
         (unsigned long long)weft_graph_pool_reserved(pool), N * 4);
  assert_int_equal(weft_graph_pool_destroy(pool), WEFT_OK);
  assert_int_equal(weft_free(a.x, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_free(b.x, tu_stream(&env, 0)), WEFT_OK);
  if (tu_races(&env) != 0) tu_print_races(&env);
  assert_int_equal(tu_races(&env), 0);
}

/* The same step under graph memory nodes, for the memory comparison. */
static void test_memory_nodes_policy_runs_the_same_step(void **state) {
  (void)state;
  step_t st;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "x", &st.x), WEFT_OK);
  weft_graph_t *g;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, body, &st, &g), WEFT_OK);
  run_replays(g, &st, 77);
  weft_graph_memory_stats_t m;
  weft_status_t r = weft_graph_memory_stats(env.rt, &m);
  assert_true(r == WEFT_OK || r == WEFT_ERR_NOT_SUPPORTED);
  if (r == WEFT_OK)
    printf("graph memory nodes: used high %llu, reserved high %llu bytes\n", (unsigned long long)m.used_high,
           (unsigned long long)m.reserved_high);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_graph_memory_trim(env.rt), WEFT_OK);
  assert_int_equal(weft_free(st.x, tu_stream(&env, 0)), WEFT_OK);
}

/* ---- faults at every call ---- */

static const char *g_cell = "no fault"; /* the fault cell a clean run follows, for messages */

#define AGAIN(failures, call) TU_AGAIN(failures, g_cell, call)

/* Two graphs sharing one private pool, captured, instantiated and replayed in capture order three
 * times, then everything destroyed. A capture that failed leaves no graph (and its step is not
 * replayed); an instantiate that failed leaves its graph unlaunched; a launch, an output read, a
 * free or a destroy that failed is made again at once. `check`: no call may fail and the outputs
 * must be right. Returns the calls that failed. */
static int shared_pool_graphs(bool check) {
  int failures = 0;
  weft_graph_pool_t *pool = NULL;
  if (weft_graph_pool_create(env.rt, &pool) != WEFT_OK) return 1;
  step_t st[2];
  weft_graph_t *g[2] = {NULL, NULL};
  weft_exec_t *e[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++) AGAIN(&failures, weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "x", &st[k].x));
  weft_capture_options_t o = weft_capture_options_default();
  o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  o.pool = pool;
  for (int k = 0; k < 2; k++)
    if (weft_capture_run(tu_stream(&env, 0), &o, body, &st[k], &g[k]) != WEFT_OK) {
      failures++;
      g[k] = NULL;
    }
  for (int k = 0; k < 2; k++)
    if (g[k] != NULL && weft_graph_instantiate(g[k], tu_stream(&env, 0), &e[k]) != WEFT_OK) {
      failures++;
      e[k] = NULL;
    }
  for (unsigned it = 0; it < 3; it++)
    for (int k = 0; k < 2; k++) {
      if (e[k] == NULL) continue;
      unsigned base = 100u * (unsigned)k + it;
      AGAIN(&failures, tu_fill(&env, tu_stream(&env, 2), st[k].x, N, base));
      AGAIN(&failures, weft_exec_launch(e[k], tu_stream(&env, it % 2 ? 3 : 0)));
      weft_block_t out;
      assert_int_equal(weft_exec_output(e[k], 0, &out), WEFT_OK);
      unsigned v = 0;
      AGAIN(&failures, weft_copy_from_block(tu_stream(&env, 4), &v, out, 0, 4));
      AGAIN(&failures, weft_stream_synchronize(tu_stream(&env, 4)));
      if (v != expect(base)) fail_msg("after %s: graph %d replay %u: %u != %u", g_cell, k, it, v, expect(base));
      AGAIN(&failures, weft_free(out, tu_stream(&env, 5)));
    }
  for (int k = 0; k < 2; k++) {
    if (e[k] != NULL) AGAIN(&failures, weft_exec_destroy(e[k]));
    if (g[k] != NULL) AGAIN(&failures, weft_graph_destroy(g[k]));
  }
  AGAIN(&failures, weft_graph_pool_destroy(pool));
  for (int k = 0; k < 2; k++) AGAIN(&failures, weft_free(st[k].x, tu_stream(&env, 0)));
  if (check && failures != 0) fail_msg("after %s: %d calls failed without a fault", g_cell, failures);
  return failures;
}

/* Each driver function the shared-pool graphs reach fails at its Nth call, for N = 1, 2, ...
 * until not reached: no race, no device memory left, the outputs of every replay that ran are
 * right, and the same work without faults runs right afterwards. Simulator only. */
static void test_faults_at_every_call_of_shared_pool_graphs(void **state) {
  (void)state;
  if (env.sim == NULL) skip(); /* fault injection */
  static const char *const fns[] = {"cuStreamBeginCapture", "cuStreamEndCapture", "cuStreamGetCaptureInfo",
                                    "cuStreamIsCapturing", "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecDestroy",
                                    "cuGraphDestroy", "cuLaunchKernel", "cuEventRecord", "cuStreamWaitEvent",
                                    "cuMemcpyDtoHAsync", "cuStreamSynchronize"};
  tu_reset_races(&env);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(weft_runtime_trim(env.rt), WEFT_OK);
  assert_int_equal(shared_pool_graphs(true), 0);
  assert_int_equal(weft_runtime_trim(env.rt), WEFT_OK);
  weft_sim_stats_t s0, s1;
  env.sim->stats(&s0);
  unsigned cells = 0;
  for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
    unsigned fired = 0;
    for (unsigned n = 1; n <= 24; n++) {
      char spec[80];
      snprintf(spec, sizeof spec, "%s:%u:CUDA_ERROR_UNKNOWN", fns[f], n);
      env.sim->stats(&s1);
      uint64_t before = s1.faults_injected;
      assert_int_equal((env.sim->fail)(spec), 0);
      g_cell = spec;
      (void)shared_pool_graphs(false);
      assert_int_equal((env.sim->fail)(""), 0);
      env.sim->stats(&s1);
      if (s1.faults_injected == before) break; /* not reached */
      fired++;
      cells++;
      assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
      if (tu_races(&env) != 0) {
        tu_print_races(&env);
        fail_msg("%s: races", spec);
      }
      assert_int_equal(shared_pool_graphs(true), 0);
      assert_int_equal(weft_runtime_trim(env.rt), WEFT_OK);
      env.sim->stats(&s1);
      if (s1.bytes_in_use > s0.bytes_in_use)
        fail_msg("%s: %llu device bytes left", spec, (unsigned long long)(s1.bytes_in_use - s0.bytes_in_use));
    }
    g_cell = "no fault";
    if (fired == 0) fail_msg("%s: the fault fired nowhere", fns[f]);
  }
  printf("fault cells: %u\n", cells);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_private_pool_reuses_temporaries_with_captured_waits),
      cmocka_unit_test(test_graphs_sharing_a_pool_reuse_each_others_temporaries),
      cmocka_unit_test(test_memory_nodes_policy_runs_the_same_step),
      cmocka_unit_test(test_faults_at_every_call_of_shared_pool_graphs),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
