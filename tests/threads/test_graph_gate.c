/* The graph gate (issue 11): graph calls (capture with memory nodes, instantiate, launch, the
 * free of an output, destroy, weft_graph_memory_trim) on one thread while seven other threads
 * launch, copy, allocate and free. On an H200 and an H100 (driver 580.159.04) graph calls that
 * overlapped such driver calls of other threads were followed by wrong results
 * (tests/conformance/README.md, "graph calls"); weft keeps every such call out while a graph call
 * runs (lib/core/gate.h). The simulator reports an overlap as a race, so on the simulator the
 * oracle must stay at 0; on a GPU every block and every graph output must hold what was written.
 *
 * Precondition checked: the graph calls ran while the workers were working. */
#include <pthread.h>
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
#include "sim/weft_sim.h"

enum { WORKERS = 7, ELEMS = 4096, ROUNDS = 400, GRAPHS = 100 };

static tu_env_t env;
static atomic_int running;   /* workers still working */
static atomic_int failures;  /* weft calls that failed and data that differed, all workers */

typedef struct {
  unsigned id;
} worker_t;

static void count_fail(const char *what, weft_status_t st) {
  fprintf(stderr, "worker: %s: %s (%s)\n", what, weft_status_name(st), weft_last_error());
  atomic_fetch_add(&failures, 1);
}

/* Each round: allocate two blocks on one stream, fill one, combine it into the other on another
 * stream, read the result back, free both on a third stream. */
static void *work(void *arg) {
  worker_t *w = arg;
  unsigned host[ELEMS];
  for (unsigned r = 0; r < ROUNDS; r++) {
    weft_stream_t *s0 = tu_stream(&env, (w->id + r) % 8), *s1 = tu_stream(&env, (w->id + r + 3) % 8);
    weft_block_t a, b;
    weft_status_t st = weft_alloc(env.rt, ELEMS * 4, s0, "a", &a);
    if (st != WEFT_OK) { count_fail("weft_alloc", st); break; }
    if ((st = weft_alloc(env.rt, ELEMS * 4, s0, "b", &b)) != WEFT_OK) {
      count_fail("weft_alloc", st);
      if (weft_free(a, s0) != WEFT_OK) atomic_fetch_add(&failures, 1);
      break;
    }
    unsigned v = w->id * 100000u + r;
    if ((st = tu_fill(&env, s0, a, ELEMS, v)) != WEFT_OK) count_fail("tu_fill", st);
    if ((st = tu_combine(&env, s1, b, (weft_block_t){0}, a, (weft_block_t){0}, (weft_block_t){0}, ELEMS, r)) != WEFT_OK)
      count_fail("tu_combine", st);
    unsigned want_a[ELEMS], want_b[ELEMS];
    for (unsigned i = 0; i < ELEMS; i++) want_a[i] = v, want_b[i] = r + 7u * v; /* weft_test_combine */
    if ((st = tu_read(s1, a, host, sizeof host)) != WEFT_OK) count_fail("tu_read", st);
    else if (memcmp(host, want_a, sizeof host) != 0) {
      fprintf(stderr, "worker %u round %u: block a differs\n", w->id, r);
      atomic_fetch_add(&failures, 1);
    }
    if ((st = tu_read(s0, b, host, sizeof host)) != WEFT_OK) count_fail("tu_read", st);
    else if (memcmp(host, want_b, sizeof host) != 0) {
      fprintf(stderr, "worker %u round %u: block b differs\n", w->id, r);
      atomic_fetch_add(&failures, 1);
    }
    weft_stream_t *s2 = tu_stream(&env, (w->id + r + 5) % 8);
    if ((st = weft_free(a, s2)) != WEFT_OK) count_fail("weft_free", st);
    if ((st = weft_free(b, s2)) != WEFT_OK) count_fail("weft_free", st);
  }
  atomic_fetch_sub(&running, 1);
  return NULL;
}

/* One round of graph calls on stream 8 (no worker uses it): capture a fill of a new block into a
 * graph with memory nodes, instantiate, launch, check the output, free it, destroy, trim. */
static void graph_round(unsigned r) {
  weft_stream_t *s = tu_stream(&env, 8);
  weft_capture_options_t o = weft_capture_options_default();
  weft_status_t st = weft_capture_begin(s, &o);
  if (st != WEFT_OK) return count_fail("weft_capture_begin", st);
  weft_block_t b;
  if ((st = weft_alloc(env.rt, ELEMS * 4, s, "graph", &b)) != WEFT_OK) count_fail("weft_alloc (capture)", st);
  else if ((st = tu_fill(&env, s, b, ELEMS, 0x5000000u + r)) != WEFT_OK) count_fail("tu_fill (capture)", st);
  weft_graph_t *g;
  if ((st = weft_capture_end(s, &g)) != WEFT_OK) return count_fail("weft_capture_end", st);
  weft_exec_t *e;
  if ((st = weft_graph_instantiate(g, s, &e)) != WEFT_OK) {
    count_fail("weft_graph_instantiate", st);
    if (weft_graph_destroy(g) != WEFT_OK) atomic_fetch_add(&failures, 1);
    return;
  }
  if ((st = weft_exec_launch(e, s)) != WEFT_OK) count_fail("weft_exec_launch", st);
  weft_block_t out;
  if (st == WEFT_OK && (st = weft_exec_output(e, 0, &out)) == WEFT_OK) {
    unsigned host[ELEMS];
    if ((st = tu_read(s, out, host, sizeof host)) != WEFT_OK) count_fail("tu_read (output)", st);
    for (unsigned i = 0; st == WEFT_OK && i < ELEMS; i++)
      if (host[i] != 0x5000000u + r) {
        fprintf(stderr, "graph round %u: output element %u is %u\n", r, i, host[i]);
        atomic_fetch_add(&failures, 1);
        break;
      }
    if ((st = weft_free(out, s)) != WEFT_OK) count_fail("weft_free (output)", st);
  } else if (st != WEFT_OK) {
    count_fail("weft_exec_output", st);
  }
  if ((st = weft_exec_destroy(e)) != WEFT_OK) count_fail("weft_exec_destroy", st);
  if ((st = weft_graph_destroy(g)) != WEFT_OK) count_fail("weft_graph_destroy", st);
  if ((st = weft_graph_memory_trim(env.rt)) != WEFT_OK) count_fail("weft_graph_memory_trim", st);
}

/* Runs round(r) on this thread, at least GRAPHS times and until the workers are done, while the
 * workers work; then checks: no failure, no oracle race, and at least 10 rounds overlapped all the
 * workers (else a skip). `name` and `rounds` word the summary line. A round returns false to stop. */
static void while_working(const char *name, const char *rounds, bool (*round)(unsigned r)) {
  weft_options_t o = weft_options_default();
  o.stream_count = 9;
  assert_int_equal(tu_init(&env, &o), 0);
  tu_reset_races(&env);
  atomic_store(&failures, 0);
  pthread_t t[WORKERS];
  worker_t w[WORKERS];
  atomic_store(&running, WORKERS);
  for (unsigned i = 0; i < WORKERS; i++) {
    w[i].id = i;
    assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  unsigned during = 0;
  for (unsigned r = 0; r < GRAPHS || atomic_load(&running) > 0; r++) {
    int before = atomic_load(&running);
    if (!round(r)) break;
    if (before == WORKERS && atomic_load(&running) == WORKERS) during++;
  }
  for (unsigned i = 0; i < WORKERS; i++) pthread_join(t[i], NULL);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  uint64_t races = tu_races(&env);
  if (races != 0) tu_print_races(&env);
  fprintf(stderr, "%s gate: %u %s while all %d workers worked; %d failures; %llu races\n", name, during, rounds,
          WORKERS, atomic_load(&failures), (unsigned long long)races);
  tu_fini(&env);
  if (during < 10) skip(); /* the workers finished before the rounds could overlap them */
  assert_int_equal(atomic_load(&failures), 0);
  assert_int_equal(races, 0);
}

static bool graph_round_on(unsigned r) {
  graph_round(r);
  return true;
}

static void graph_calls_while_working(void **state) {
  (void)state;
  while_working("graph", "rounds of graph calls", graph_round_on);
}

/* A builder with memory nodes made and destroyed (its graph destroyed with it): cuGraphDestroy of
 * a graph with memory nodes is a graph call. */
static bool builder_round(unsigned r) {
  (void)r;
  weft_builder_t *b;
  weft_status_t st = weft_builder_create(env.rt, &b);
  if (st != WEFT_OK) {
    count_fail("weft_builder_create", st);
    return false;
  }
  weft_block_t blk;
  if ((st = weft_builder_alloc(b, ELEMS * 4, "built", &blk)) != WEFT_OK) count_fail("weft_builder_alloc", st);
  if ((st = weft_builder_destroy(b)) != WEFT_OK) count_fail("weft_builder_destroy", st);
  return true;
}

/* The same with builders, while the workers work. */
static void builder_calls_while_working(void **state) {
  (void)state;
  while_working("builder", "builders made and destroyed", builder_round);
}

/* A capture whose end fails (an injected cuStreamEndCapture failure leaves the stream capturing):
 * weft ends it again and destroys the graph it drops, which has memory nodes, so that destroy
 * is a graph call too. Simulator only (fault injection). */
static bool failed_end_round(unsigned r) {
  if (env.sim == NULL) return false; /* on a GPU: no round overlaps the workers, a skip */
  weft_stream_t *s = tu_stream(&env, 8);
  weft_capture_options_t o = weft_capture_options_default();
  weft_status_t st = weft_capture_begin(s, &o);
  if (st != WEFT_OK) {
    count_fail("weft_capture_begin", st);
    return false;
  }
  weft_block_t b;
  if ((st = weft_alloc(env.rt, ELEMS * 4, s, "graph", &b)) != WEFT_OK) count_fail("weft_alloc (capture)", st);
  else if ((st = tu_fill(&env, s, b, ELEMS, 0x6000000u + r)) != WEFT_OK) count_fail("tu_fill (capture)", st);
  weft_sim_stats_t f0, f1;
  env.sim->stats(&f0);
  if ((env.sim->fail)("cuStreamEndCapture:1:CUDA_ERROR_UNKNOWN") != 0) count_fail("sim fail", WEFT_ERR_INVALID_ARGUMENT);
  weft_graph_t *g = NULL;
  st = weft_capture_end(s, &g);
  (void)(env.sim->fail)(NULL);
  env.sim->stats(&f1);
  if (f1.faults_injected - f0.faults_injected != 1) count_fail("premise: the end's fault", WEFT_ERR_INVALID_ARGUMENT);
  if (st != WEFT_ERR_DRIVER) {
    count_fail("weft_capture_end (should fail)", st);
    if (st == WEFT_OK && weft_graph_destroy(g) != WEFT_OK) atomic_fetch_add(&failures, 1);
  }
  int capturing = 1;
  if (weft_stream_is_capturing(s, &capturing) != WEFT_OK || capturing) count_fail("still capturing", st);
  return true;
}

static void failed_capture_ends_while_working(void **state) {
  (void)state;
  while_working("failed-end", "captures whose end failed", failed_end_round);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(graph_calls_while_working),
                                     cmocka_unit_test(builder_calls_while_working),
                                     cmocka_unit_test(failed_capture_ends_while_working)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
