/* Issue 12's boundary bugs, one test each (each failed on commit fb3bb08, before the fixes):
 *   - a pool stream that does not take part in a capture touches a block allocated inside it:
 *     CAPTURE, nothing changes (read, write and free);
 *   - graphs sharing a graph pool, launched one after the other on different streams: ordered;
 *   - weft_block_export_event while the block's last writer stream captures: no crash, a live
 *     event that orders outside work after the write;
 *   - the pool gives chunks back on a stream that takes part in no capture (a growth that fails
 *     while stream 0 captures), and the capture stays valid;
 *   - handles: double destroys and uses after destroy of execs, graphs, graph pools, builders and
 *     resources say STALE_HANDLE; a runtime with graphs still alive refuses release (BUSY);
 *     a pointer that is not a runtime is INVALID_ARGUMENT;
 *   - teardown reports failures: a chunk the driver refuses to free makes weft_runtime_release
 *     return the error.
 * Simulator-only checks (oracle, fault injection) call skip() on a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/cmocka_env.h"

#define N 256
static tu_env_t env;
static const weft_block_t none = {0};

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  /* The pool's own behaviour at the boundaries is under test: freed blocks go back to it at once
   * (tests/streams:test_stream_cache covers the stream cache with captures). */
  o.stream_cache_bytes = 0;
  return tu_init(&env, &o);
}
static int teardown(void **state) {
  (void)state;
  if (env.sim != NULL) (env.sim->fail)("");
  tu_fini(&env);
  return 0;
}
static void expect_all(weft_block_t b, unsigned v, const char *what) {
  static unsigned host[N];
  assert_int_equal(tu_read(tu_stream(&env, 7), b, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (host[i] != v) fail_msg("%s: element %u is %u, not %u", what, i, host[i], v);
}
static void same_counters(const weft_counters_t *a, const weft_counters_t *b) {
  assert_int_equal(a->uses, b->uses);
  assert_int_equal(a->waits_issued, b->waits_issued);
  assert_int_equal(a->events_recorded, b->events_recorded);
  assert_int_equal(a->frees, b->frees);
}

/* ---- a block allocated inside a capture, touched by a stream outside it ---------------------- */

static void test_stream_outside_a_capture_cannot_touch_its_blocks(void **state) {
  (void)state;
  tu_reset_races(&env);
  weft_block_t x = tu_alloc(&env, N * 4, 2, "x");
  assert_int_equal(tu_fill(&env, tu_stream(&env, 2), x, N, 3), WEFT_OK);
  assert_int_equal(weft_capture_begin(tu_stream(&env, 0), NULL), WEFT_OK);
  weft_block_t t;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "t", &t), WEFT_OK);
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), t, N, 5), WEFT_OK);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  /* Write, read and free from stream 1, which takes no part in the capture. */
  assert_int_equal(tu_fill(&env, tu_stream(&env, 1), t, N, 6), WEFT_ERR_CAPTURE);
  assert_non_null(strstr(weft_last_error(), "weft_capture_join"));
  assert_int_equal(tu_combine(&env, tu_stream(&env, 1), x, none, t, none, none, N, 1), WEFT_ERR_CAPTURE);
  assert_int_equal(weft_free(t, tu_stream(&env, 1)), WEFT_ERR_CAPTURE);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  same_counters(&c0, &c1);
  /* Joined, stream 1 may. */
  assert_int_equal(weft_capture_join(tu_stream(&env, 0), tu_stream(&env, 1)), WEFT_OK);
  assert_int_equal(tu_combine(&env, tu_stream(&env, 1), x, none, t, none, none, N, 1), WEFT_OK); /* x = 1 + 7 * 5 */
  assert_int_equal(weft_free(t, tu_stream(&env, 1)), WEFT_OK);
  weft_graph_t *g;
  assert_int_equal(weft_capture_end(tu_stream(&env, 0), &g), WEFT_OK);
  weft_exec_t *e;
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 3)), WEFT_OK);
  expect_all(x, 36, "x after the replay");
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(x, tu_stream(&env, 2)), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

/* ---- graphs sharing a graph pool -------------------------------------------------------------- */

typedef struct pool_step {
  weft_block_t in, out;
  unsigned salt;
} pool_step_t;

/* t = salt + 7 in (a temporary freed inside), out = 1 + 7 t: both graphs' temporaries take the
 * same pool memory. */
static weft_status_t pool_body(weft_stream_t *s, void *arg) {
  pool_step_t *p = arg;
  weft_block_t t;
  weft_status_t r = weft_alloc(env.rt, N * 4, s, "t", &t);
  if (r == WEFT_OK) r = tu_combine(&env, s, t, none, p->in, none, none, N, p->salt);
  if (r == WEFT_OK) r = tu_combine(&env, s, p->out, none, t, none, none, N, 1);
  if (r == WEFT_OK) r = weft_free(t, s);
  return r;
}

static void test_graphs_sharing_a_pool_are_ordered_on_any_stream(void **state) {
  (void)state;
  tu_reset_races(&env);
  weft_graph_pool_t *pool;
  assert_int_equal(weft_graph_pool_create(env.rt, &pool), WEFT_OK);
  weft_capture_options_t o = weft_capture_options_default();
  o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  o.pool = pool;
  pool_step_t a = {tu_alloc(&env, N * 4, 0, "in a"), tu_alloc(&env, N * 4, 0, "out a"), 10};
  pool_step_t b = {tu_alloc(&env, N * 4, 0, "in b"), tu_alloc(&env, N * 4, 0, "out b"), 20};
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), a.in, N, 1), WEFT_OK);
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), b.in, N, 2), WEFT_OK);
  weft_graph_t *ga, *gb;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), &o, pool_body, &a, &ga), WEFT_OK);
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), &o, pool_body, &b, &gb), WEFT_OK);
  weft_exec_t *ea, *eb;
  assert_int_equal(weft_graph_instantiate(ga, tu_stream(&env, 0), &ea), WEFT_OK);
  assert_int_equal(weft_graph_instantiate(gb, tu_stream(&env, 0), &eb), WEFT_OK);
  for (unsigned it = 0; it < 20; it++) {
    /* a then b, on different streams, without anything else ordering them. */
    assert_int_equal(weft_exec_launch(ea, tu_stream(&env, 1 + it % 3)), WEFT_OK);
    assert_int_equal(weft_exec_launch(eb, tu_stream(&env, 4 + it % 3)), WEFT_OK);
  }
  expect_all(a.out, 1 + 7 * (10 + 7 * 1), "a's output");
  expect_all(b.out, 1 + 7 * (20 + 7 * 2), "b's output");
  if (tu_races(&env) != 0) tu_print_races(&env);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_exec_destroy(ea), WEFT_OK);
  assert_int_equal(weft_exec_destroy(eb), WEFT_OK);
  assert_int_equal(weft_graph_destroy(ga), WEFT_OK);
  assert_int_equal(weft_graph_destroy(gb), WEFT_OK);
  assert_int_equal(weft_graph_pool_destroy(pool), WEFT_OK);
  weft_block_t all[] = {a.in, a.out, b.in, b.out};
  for (int i = 0; i < 4; i++) assert_int_equal(weft_free(all[i], tu_stream(&env, 0)), WEFT_OK);
}

/* ---- exporting a block's event while its writer's stream captures ----------------------------- */

static void test_export_event_while_the_writer_captures(void **state) {
  (void)state;
  tu_reset_races(&env);
  weft_block_t b = tu_alloc(&env, N * 4, 2, "b"), c = tu_alloc(&env, N * 4, 2, "c");
  assert_int_equal(tu_fill(&env, tu_stream(&env, 2), b, N, 9), WEFT_OK);
  assert_int_equal(tu_combine(&env, tu_stream(&env, 1), c, none, b, none, none, N, 0), WEFT_OK);
  assert_int_equal(weft_capture_begin(tu_stream(&env, 2), NULL), WEFT_OK);
  CUevent ev = NULL;
  assert_int_equal(weft_block_export_event(b, WEFT_WRITE, &ev), WEFT_OK);
  /* The event is live: stream 3 waits for it, then writes b. */
  assert_int_equal(weft_stream_import_event(tu_stream(&env, 3), ev), WEFT_OK);
  CUresult (*destroy)(CUevent) = (CUresult(*)(CUevent))weft_driver_symbol("cuEventDestroy_v2");
  if (destroy == NULL) destroy = (CUresult(*)(CUevent))weft_driver_symbol("cuEventDestroy");
  assert_non_null(destroy);
  assert_int_equal(destroy(ev), CUDA_SUCCESS);
  weft_graph_t *g;
  assert_int_equal(weft_capture_end(tu_stream(&env, 2), &g), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(&env, 3)), WEFT_OK);
  expect_all(c, 7 * 9, "c");
  assert_int_equal(weft_free(c, tu_stream(&env, 2)), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

/* ---- the pool's chunks go back on a live stream --------------------------------------------- */

static void test_pool_gives_chunks_back_on_a_live_stream_while_stream_0_captures(void **state) {
  (void)state;
  if (env.sim == NULL) skip(); /* fault injection */
  weft_block_t small;
  /* A wholly idle chunk in the pool (1 MiB lives in a shared chunk). */
  assert_int_equal(weft_alloc(env.rt, 1 << 20, tu_stream(&env, 1), "small", &small), WEFT_OK);
  assert_int_equal(weft_free(small, tu_stream(&env, 1)), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(weft_capture_begin(tu_stream(&env, 0), NULL), WEFT_OK);
  weft_resource_stats_t before, after;
  weft_resource_stats(weft_runtime_resource(env.rt), &before);
  /* The pool's next two requests upstream are refused (a chunk of the block's own size, then a
   * plain chunk): it gives back its idle chunk (on a stream that is not capturing) and tries
   * again. */
  (env.sim->fail)("cuMemAllocFromPoolAsync:1:2;cuMemAllocFromPoolAsync:2:2");
  weft_block_t large;
  weft_status_t st = weft_alloc(env.rt, 96ull << 20, tu_stream(&env, 1), "large", &large);
  (env.sim->fail)("");
  if (st != WEFT_OK) fail_msg("weft_alloc: %s: %s", weft_status_name(st), weft_last_error());
  weft_resource_stats(weft_runtime_resource(env.rt), &after);
  /* The idle chunk went back: what is reserved now is the new block's chunk alone. */
  assert_true(before.reserved_bytes > 0);
  if (after.reserved_bytes >= before.reserved_bytes + (96ull << 20))
    fail_msg("reserved %llu bytes: the idle chunk of %llu bytes was not given back", (unsigned long long)after.reserved_bytes,
             (unsigned long long)before.reserved_bytes);
  assert_int_equal(weft_resource_trim(weft_runtime_resource(env.rt), 0), WEFT_OK);
  weft_graph_t *g;
  st = weft_capture_end(tu_stream(&env, 0), &g);
  if (st != WEFT_OK) fail_msg("weft_capture_end: %s: %s", weft_status_name(st), weft_last_error()); /* still valid */
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(large, tu_stream(&env, 1)), WEFT_OK);
}

/* ---- handles ------------------------------------------------------------------------------------ */

static weft_status_t fill_body(weft_stream_t *s, void *arg) {
  weft_block_t *x = arg;
  return tu_fill(&env, s, *x, N, 4);
}

static void test_destroyed_handles_say_stale_and_release_waits_for_graphs(void **state) {
  (void)state;
  weft_block_t x = tu_alloc(&env, N * 4, 0, "x");
  weft_graph_t *g;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, fill_body, &x, &g), WEFT_OK);
  weft_exec_t *e;
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
  /* The runtime refuses to go while a graph made for it lives. */
  assert_int_equal(weft_runtime_retain(env.rt), WEFT_OK);
  assert_int_equal(weft_runtime_release(env.rt), WEFT_OK); /* one of two references */
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_exec_destroy(e), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 0)), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_ERR_STALE_HANDLE);
  weft_graph_pool_t *p;
  assert_int_equal(weft_graph_pool_create(env.rt, &p), WEFT_OK);
  assert_int_equal(weft_graph_pool_destroy(p), WEFT_OK);
  assert_int_equal(weft_graph_pool_destroy(p), WEFT_ERR_STALE_HANDLE);
  weft_builder_t *b;
  assert_int_equal(weft_builder_create(env.rt, &b), WEFT_OK);
  assert_int_equal(weft_builder_destroy(b), WEFT_OK);
  assert_int_equal(weft_builder_destroy(b), WEFT_ERR_STALE_HANDLE);
  weft_block_t y;
  assert_int_equal(weft_builder_alloc(b, 64, "y", &y), WEFT_ERR_STALE_HANDLE);
  weft_resource_t *d;
  assert_int_equal(weft_direct_create(env.rt, &d), WEFT_OK);
  assert_int_equal(weft_resource_destroy(d), WEFT_OK);
  assert_int_equal(weft_resource_destroy(d), WEFT_ERR_STALE_HANDLE);
  /* Not a runtime at all. */
  weft_graph_memory_stats_t ms;
  int not_a_runtime;
  assert_int_equal(weft_graph_memory_stats(NULL, &ms), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_graph_memory_trim((weft_runtime_t *)&not_a_runtime), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "not a weft runtime"));
  assert_int_equal(weft_free(x, tu_stream(&env, 0)), WEFT_OK);
}

static void test_release_refuses_while_a_graph_lives(void **state) {
  (void)state;
  weft_block_t x = tu_alloc(&env, N * 4, 0, "x");
  weft_graph_t *g;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, fill_body, &x, &g), WEFT_OK);
  assert_int_equal(weft_runtime_release(env.rt), WEFT_ERR_BUSY);
  assert_non_null(strstr(weft_last_error(), "destroy them first"));
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(x, tu_stream(&env, 0)), WEFT_OK);
}

/* ---- a block the guard finds corrupted is freed ----------------------------------------------- */

static int setup_guard(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  o.guard = 1;
  return tu_init(&env, &o);
}

static void test_corrupted_block_is_freed_all_the_same(void **state) {
  (void)state;
  weft_block_t b = tu_alloc(&env, N * 4, 0, "b");
  CUdeviceptr p;
  assert_int_equal(weft_block_ptr(b, &p), WEFT_OK);
  typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
  htod_fn htod = (htod_fn)weft_driver_symbol("cuMemcpyHtoD_v2");
  if (htod == NULL) htod = (htod_fn)weft_driver_symbol("cuMemcpyHtoD");
  assert_non_null(htod);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  static const unsigned char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(htod(p + N * 4, junk, sizeof junk), CUDA_SUCCESS); /* past the end: the canary */
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_ERR_CORRUPTED);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  assert_int_equal(c1.frees, c0.frees + 1);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_ERR_DOUBLE_FREE);
  assert_non_null(strstr(weft_last_error(), "weft_free"));
  /* Nothing is live: the top resource can be swapped. */
  weft_resource_t *top = weft_runtime_resource(env.rt);
  assert_int_equal(weft_runtime_set_resource(env.rt, top), WEFT_OK);
}

/* A destroyed resource given to weft_runtime_set_resource: refused (STALE_HANDLE), and the runtime
 * keeps the resource it had (before, it took the freed resource and allocated through it). */
static void test_set_resource_refuses_a_destroyed_resource(void **state) {
  (void)state;
  weft_resource_t *old = weft_runtime_resource(env.rt), *r;
  assert_int_equal(weft_stats_create(env.rt, old, &r), WEFT_OK);
  assert_int_equal(weft_resource_destroy(r), WEFT_OK);
  assert_int_equal(weft_runtime_trim(env.rt), WEFT_OK);
  assert_int_equal(weft_runtime_set_resource(env.rt, r), WEFT_ERR_STALE_HANDLE);
  assert_ptr_equal(weft_runtime_resource(env.rt), old);
  weft_block_t b;
  assert_int_equal(weft_alloc(env.rt, 64, tu_stream(&env, 0), "after", &b), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
}

/* A resource another resource draws from is not destroyed under it: BUSY, until the one drawing
 * from it is destroyed (before, it was freed and the other allocated through freed memory). */
static void test_a_resource_drawn_from_is_not_destroyed(void **state) {
  (void)state;
  weft_resource_t *old = weft_runtime_resource(env.rt), *a, *b;
  assert_int_equal(weft_stats_create(env.rt, old, &a), WEFT_OK);
  assert_int_equal(weft_stats_create(env.rt, a, &b), WEFT_OK);
  assert_int_equal(weft_resource_destroy(a), WEFT_ERR_BUSY);
  assert_non_null(strstr(weft_last_error(), "draws from it"));
  CUdeviceptr p; /* b still allocates through a */
  assert_int_equal(weft_resource_allocate(b, 256, tu_stream(&env, 0), "t", &p), WEFT_OK);
  assert_int_equal(weft_resource_deallocate(b, p, 256, tu_stream(&env, 0), "t"), WEFT_OK);
  assert_int_equal(weft_resource_destroy(b), WEFT_OK);
  assert_int_equal(weft_resource_destroy(a), WEFT_OK);
  assert_int_equal(weft_resource_destroy(a), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
}

/* ---- teardown reports what it could not do -------------------------------------------------- */

static void test_release_reports_a_chunk_the_driver_would_not_free(void **state) {
  (void)state;
  if (env.sim == NULL) skip(); /* fault injection */
  weft_block_t small;
  /* 1 MiB: it lives in a shared chunk, which the pool keeps until it is destroyed at release. */
  assert_int_equal(weft_alloc(env.rt, 1 << 20, tu_stream(&env, 1), "small", &small), WEFT_OK);
  assert_int_equal(weft_free(small, tu_stream(&env, 1)), WEFT_OK);
  (env.sim->fail)("cuMemFreeAsync:1:999"); /* the pool's chunk, given back at release */
  weft_status_t st = weft_runtime_release(env.rt);
  (env.sim->fail)("");
  assert_int_equal(st, WEFT_ERR_DRIVER);
  assert_int_equal(weft_last_driver_error(), CUDA_ERROR_UNKNOWN);
  env.rt = NULL;
  /* A new runtime for teardown. */
  assert_int_equal(setup(NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stream_outside_a_capture_cannot_touch_its_blocks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_graphs_sharing_a_pool_are_ordered_on_any_stream, setup, teardown),
      cmocka_unit_test_setup_teardown(test_export_event_while_the_writer_captures, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pool_gives_chunks_back_on_a_live_stream_while_stream_0_captures, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_destroyed_handles_say_stale_and_release_waits_for_graphs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_release_refuses_while_a_graph_lives, setup, teardown),
      cmocka_unit_test_setup_teardown(test_corrupted_block_is_freed_all_the_same, setup_guard, teardown),
      cmocka_unit_test_setup_teardown(test_release_reports_a_chunk_the_driver_would_not_free, setup, teardown),
      cmocka_unit_test_setup_teardown(test_set_resource_refuses_a_destroyed_resource, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_resource_drawn_from_is_not_destroyed, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
