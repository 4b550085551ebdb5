/* The stream cache (lib/runtime/cache.c): a block freed on a stream is kept for that stream's next
 * weft_alloc of the same size, which takes it without the resource, the block table's map or a
 * driver call; every other path (another stream, a capture, a full cache, an allocation that
 * fails for want of memory, weft_runtime_trim, the runtime's release) gives cached memory back
 * or leaves it alone, and the race oracle sees every reuse ordered. On the simulator and a GPU. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/debug.h"
#include "tests/util/cmocka_env.h"

#define N 4096 /* elements (unsigned) of the test blocks */
#define MIB (1024ull * 1024ull)

static weft_counters_t counters(const tu_env_t *env) {
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env->rt, &c), WEFT_OK);
  return c;
}

static weft_resource_stats_t top_stats(const tu_env_t *env) {
  weft_resource_stats_t s;
  weft_resource_stats(weft_runtime_resource(env->rt), &s);
  return s;
}

static CUdeviceptr ptr_of(weft_block_t b) {
  CUdeviceptr p = 0;
  assert_int_equal(weft_block_ptr(b, &p), WEFT_OK);
  return p;
}

static int setup_with(void **state, const weft_options_t *o) {
  tu_env_t *env = calloc(1, sizeof *env);
  assert_non_null(env);
  tu_init(env, o);
  *state = env;
  return 0;
}

static int setup(void **state) { return setup_with(state, NULL); }

static int teardown(void **state) {
  tu_env_t *env = *state;
  assert_int_equal(tu_races(env), 0);
  tu_fini(env);
  free(env);
  return 0;
}

/* Same stream, same size: the block comes back with no resource call; the old handle is stale,
 * and while cached the memory is no block (find, free by pointer and a second free refuse). */
static void test_same_stream_same_size_reuses_without_the_resource(void **state) {
  tu_env_t *env = *state;
  weft_stream_t *s0 = tu_stream(env, 0);
  weft_block_t a = tu_alloc(env, N * 4, 0, "a");
  CUdeviceptr pa = ptr_of(a);
  assert_int_equal(tu_fill(env, s0, a, N, 1), WEFT_OK);
  weft_resource_stats_t r0 = top_stats(env);
  weft_counters_t c0 = counters(env);
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  weft_counters_t c1 = counters(env);
  assert_int_equal(c1.cached_blocks, c0.cached_blocks + 1);
  assert_int_equal(c1.cached_bytes, c0.cached_bytes + N * 4);
  assert_int_equal(c1.frees, c0.frees + 1);
  weft_block_t found;
  assert_int_equal(weft_block_find(env->rt, pa, &found), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_free_ptr(env->rt, pa, s0), WEFT_ERR_INVALID_ARGUMENT); /* no live block there */
  assert_int_equal(weft_free(a, s0), WEFT_ERR_DOUBLE_FREE);
  CUdeviceptr p;
  assert_int_equal(weft_block_ptr(a, &p), WEFT_ERR_STALE_HANDLE);

  weft_block_t b = tu_alloc(env, N * 4, 0, "b");
  assert_int_equal(ptr_of(b), pa);
  assert_string_equal(weft_block_tag(b), "b");
  weft_resource_stats_t r1 = top_stats(env);
  assert_int_equal(r1.allocs, r0.allocs); /* the resource saw neither the free nor the alloc */
  assert_int_equal(r1.frees, r0.frees);
  weft_counters_t c2 = counters(env);
  assert_int_equal(c2.cached_blocks, c0.cached_blocks);
  assert_int_equal(c2.allocs, c1.allocs + 1);
  assert_int_equal(weft_free(a, s0), WEFT_ERR_STALE_HANDLE); /* the record holds b now */
  assert_int_equal(weft_block_find(env->rt, pa, &found), WEFT_OK);
  assert_true(found.rec == b.rec && found.gen == b.gen);
  /* b works as a new block: written on s0, read on s1 (which waits for s0). */
  assert_int_equal(tu_fill(env, s0, b, N, 7), WEFT_OK);
  unsigned host[N];
  assert_int_equal(tu_read(tu_stream(env, 1), b, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++) assert_int_equal(host[i], 7);
  assert_int_equal(weft_free(b, s0), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
}

/* Another stream or another size never takes a cached block. */
static void test_other_stream_or_size_does_not_take_it(void **state) {
  tu_env_t *env = *state;
  weft_stream_t *s0 = tu_stream(env, 0), *s1 = tu_stream(env, 1);
  weft_block_t a = tu_alloc(env, N * 4, 0, "a");
  CUdeviceptr pa = ptr_of(a);
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  weft_block_t b = tu_alloc(env, N * 4, 1, "b"), c = tu_alloc(env, N * 4 + 256, 0, "c");
  assert_true(ptr_of(b) != pa && ptr_of(c) != pa);
  assert_int_equal(counters(env).cached_blocks, 1);
  assert_int_equal(weft_free(b, s1), WEFT_OK);
  assert_int_equal(weft_free(c, s0), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
}

/* A block read on another stream and freed on s: the free waits for the reader, so the cached
 * block's next user on s is ordered after it (the oracle sees no race, the data is right). */
static void test_reuse_after_a_read_elsewhere_is_ordered(void **state) {
  tu_env_t *env = *state;
  weft_stream_t *s0 = tu_stream(env, 0), *s1 = tu_stream(env, 1);
  for (int round = 0; round < 8; round++) {
    weft_block_t a = tu_alloc(env, N * 4, 0, "a"), out = tu_alloc(env, N * 4, 1, "out");
    assert_int_equal(tu_fill(env, s0, a, N, 3 + round), WEFT_OK);
    assert_int_equal(tu_combine(env, s1, out, (weft_block_t){0}, a, (weft_block_t){0}, (weft_block_t){0}, N, 5), WEFT_OK);
    assert_int_equal(weft_free(a, s0), WEFT_OK);
    weft_block_t b = tu_alloc(env, N * 4, 0, "b"); /* a's memory again */
    assert_int_equal(tu_fill(env, s0, b, N, 99), WEFT_OK);
    unsigned first[N], again[N];
    assert_int_equal(tu_read(s1, out, first, sizeof first), WEFT_OK);
    /* The same combine from a fresh copy of a's value gives the same output. */
    weft_block_t a2 = tu_alloc(env, N * 4, 2, "a2"), out2 = tu_alloc(env, N * 4, 2, "out2");
    weft_stream_t *s2 = tu_stream(env, 2);
    assert_int_equal(tu_fill(env, s2, a2, N, 3 + round), WEFT_OK);
    assert_int_equal(tu_combine(env, s2, out2, (weft_block_t){0}, a2, (weft_block_t){0}, (weft_block_t){0}, N, 5), WEFT_OK);
    assert_int_equal(tu_read(s2, out2, again, sizeof again), WEFT_OK);
    assert_memory_equal(first, again, sizeof first);
    assert_int_equal(weft_free(b, s0), WEFT_OK);
    assert_int_equal(weft_free(out, s1), WEFT_OK);
    assert_int_equal(weft_free(a2, s2), WEFT_OK);
    assert_int_equal(weft_free(out2, s2), WEFT_OK);
  }
  assert_int_equal(tu_races(env), 0);
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
}

/* A reused block's history is a new block's on its stream, set when the free was kept (in the
 * lock hold of the free's waits; the reuse makes no tracker call): its first use elsewhere, a
 * write with no use on s0 between, waits for every use of the old block, on s0 and elsewhere,
 * and nothing more: s0's later work does not hold it back (one wait, for the free's point). */
static void test_reused_block_written_elsewhere_waits_for_the_old_uses(void **state) {
  tu_env_t *env = *state;
  weft_stream_t *s0 = tu_stream(env, 0), *s1 = tu_stream(env, 1), *s2 = tu_stream(env, 2);
  weft_block_t other = tu_alloc(env, N * 4, 0, "other");
  for (int round = 0; round < 8; round++) {
    weft_block_t a = tu_alloc(env, N * 4, 0, "a"), out = tu_alloc(env, N * 4, 2, "out");
    CUdeviceptr pa = ptr_of(a);
    assert_int_equal(tu_fill(env, s0, a, N, 3 + round), WEFT_OK);
    /* A read of a on s2: the free on s0 waits for it. */
    assert_int_equal(tu_combine(env, s2, out, (weft_block_t){0}, a, (weft_block_t){0}, (weft_block_t){0}, N, 5), WEFT_OK);
    assert_int_equal(weft_free(a, s0), WEFT_OK);
    weft_block_t b = tu_alloc(env, N * 4, 0, "b");
    if (ptr_of(b) != pa) skip(); /* the cache did not keep a: nothing of it to check */
    /* s0 works on after the free; the write of b on s1 needs none of that. */
    assert_int_equal(tu_fill(env, s0, other, N, 1), WEFT_OK);
    weft_counters_t c0 = counters(env);
    assert_int_equal(tu_fill(env, s1, b, N, 40 + round), WEFT_OK);
    weft_counters_t c1 = counters(env);
    assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
    unsigned host[N], expect[N];
    assert_int_equal(tu_read(s1, b, host, sizeof host), WEFT_OK);
    weft_block_t ref = tu_alloc(env, N * 4, 1, "ref");
    assert_int_equal(tu_fill(env, s1, ref, N, 40 + round), WEFT_OK);
    assert_int_equal(tu_read(s1, ref, expect, sizeof expect), WEFT_OK);
    assert_memory_equal(host, expect, sizeof host);
    assert_int_equal(tu_races(env), 0);
    assert_int_equal(weft_free(b, s1), WEFT_OK);
    assert_int_equal(weft_free(ref, s1), WEFT_OK);
    assert_int_equal(weft_free(out, s2), WEFT_OK);
  }
  assert_int_equal(weft_free(other, s0), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
}

/* The cache holds at most stream_cache_bytes; older blocks go back to the resource. */
static void test_cache_is_bounded(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_cache_bytes = 3 * N * 4;
  void *st;
  setup_with(&st, &o);
  tu_env_t *env = st;
  weft_stream_t *s0 = tu_stream(env, 0);
  weft_block_t b[6];
  for (int i = 0; i < 6; i++) b[i] = tu_alloc(env, N * 4, 0, "b");
  weft_resource_stats_t r0 = top_stats(env);
  for (int i = 0; i < 6; i++) assert_int_equal(weft_free(b[i], s0), WEFT_OK);
  weft_counters_t c = counters(env);
  assert_int_equal(c.cached_bytes, 3 * N * 4);
  assert_int_equal(c.cached_blocks, 3);
  assert_int_equal(top_stats(env).frees, r0.frees + 3);
  /* A block larger than the whole cache is never cached. */
  weft_block_t big = tu_alloc(env, 4 * N * 4, 0, "big");
  assert_int_equal(weft_free(big, s0), WEFT_OK);
  assert_int_equal(counters(env).cached_bytes, 3 * N * 4);
  teardown(&st);
  /* 0 turns the cache off. */
  o.stream_cache_bytes = 0;
  setup_with(&st, &o);
  env = st;
  s0 = tu_stream(env, 0);
  weft_block_t a = tu_alloc(env, N * 4, 0, "a");
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  assert_int_equal(counters(env).cached_blocks, 0);
  teardown(&st);
}

/* The bound is shared by the streams: room a stream's cache stops using (its blocks taken back
 * by its allocations) is room for another stream's frees, and a stream whose frees would pass the
 * bound because of other streams' blocks gives its own oldest back first, never theirs. */
static void test_cache_room_moves_between_streams(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_cache_bytes = 4 * N * 4;
  void *st;
  setup_with(&st, &o);
  tu_env_t *env = st;
  weft_stream_t *s0 = tu_stream(env, 0), *s1 = tu_stream(env, 1), *s2 = tu_stream(env, 2);
  weft_block_t a[4], b[4], c[2];
  for (int i = 0; i < 4; i++) a[i] = tu_alloc(env, N * 4, 0, "a");
  for (int i = 0; i < 4; i++) assert_int_equal(weft_free(a[i], s0), WEFT_OK);
  assert_int_equal(counters(env).cached_bytes, 4 * N * 4); /* s0's cache holds the whole bound */
  for (int i = 0; i < 4; i++) a[i] = tu_alloc(env, N * 4, 0, "a"); /* s0 takes all four back */
  assert_int_equal(counters(env).cached_bytes, 0);
  for (int i = 0; i < 4; i++) b[i] = tu_alloc(env, N * 4, 1, "b");
  weft_resource_stats_t r0 = top_stats(env);
  for (int i = 0; i < 4; i++) assert_int_equal(weft_free(b[i], s1), WEFT_OK);
  weft_counters_t k = counters(env);
  assert_int_equal(k.cached_bytes, 4 * N * 4); /* all of s1's frees kept: s0 holds no room now */
  assert_int_equal(k.cached_blocks, 4);
  assert_int_equal(top_stats(env).frees, r0.frees);
  /* s0's frees: s1's blocks fill the bound, and s0 has none to give back: not kept. */
  for (int i = 0; i < 4; i++) assert_int_equal(weft_free(a[i], s0), WEFT_OK);
  assert_int_equal(counters(env).cached_bytes, 4 * N * 4);
  assert_int_equal(top_stats(env).frees, r0.frees + 4);
  /* s1 takes two back; s2 can keep two (the room s1 stopped using), not a third. */
  for (int i = 0; i < 2; i++) b[i] = tu_alloc(env, N * 4, 1, "b");
  for (int i = 0; i < 2; i++) c[i] = tu_alloc(env, N * 4, 2, "c");
  weft_block_t third = tu_alloc(env, N * 4, 2, "c");
  weft_resource_stats_t r1 = top_stats(env);
  for (int i = 0; i < 2; i++) assert_int_equal(weft_free(c[i], s2), WEFT_OK);
  assert_int_equal(top_stats(env).frees, r1.frees);
  assert_int_equal(weft_free(third, s2), WEFT_OK); /* s2 gives its oldest back to keep it */
  assert_int_equal(top_stats(env).frees, r1.frees + 1);
  k = counters(env);
  assert_int_equal(k.cached_bytes, 4 * N * 4);
  assert_int_equal(k.cached_blocks, 4);
  /* s1 keeps its two frees by giving back its own two oldest, not s2's. */
  weft_resource_stats_t r2 = top_stats(env);
  for (int i = 0; i < 2; i++) assert_int_equal(weft_free(b[i], s1), WEFT_OK);
  assert_int_equal(top_stats(env).frees, r2.frees + 2);
  assert_int_equal(counters(env).cached_bytes, 4 * N * 4);
  weft_block_t again = tu_alloc(env, N * 4, 2, "c"); /* s2's cache still holds its two */
  weft_block_t again2 = tu_alloc(env, N * 4, 2, "c");
  assert_int_equal(top_stats(env).allocs, r2.allocs);
  assert_int_equal(weft_free(again, s2), WEFT_OK);
  assert_int_equal(weft_free(again2, s2), WEFT_OK);
  assert_int_equal(weft_runtime_trim(env->rt), WEFT_OK);
  k = counters(env);
  assert_int_equal(k.cached_bytes, 0);
  assert_int_equal(k.cached_blocks, 0);
  teardown(&st);
}

/* A runtime with a budget of 6 MiB whose stream 0 caches a 4 MiB block. */
static tu_env_t *budget_with_a_cached_block(void **st) {
  weft_options_t o = weft_options_default();
  o.budget_bytes = 6 * MIB;
  setup_with(st, &o);
  tu_env_t *env = *st;
  weft_block_t a = tu_alloc(env, 4 * MIB, 0, "a");
  assert_int_equal(weft_free(a, tu_stream(env, 0)), WEFT_OK);
  assert_int_equal(counters(env).cached_bytes, 4 * MIB);
  return env;
}

/* An allocation refused for want of memory first takes back what the streams cached. */
static void test_out_of_memory_empties_the_cache_first(void **state) {
  (void)state;
  void *st;
  tu_env_t *env = budget_with_a_cached_block(&st);
  weft_stream_t *s1 = tu_stream(env, 1);
  weft_block_t b = tu_alloc(env, 3 * MIB, 1, "b"); /* 4 + 3 > 6: the cache gives a back */
  assert_int_equal(counters(env).cached_bytes, 0);
  assert_int_equal(weft_free(b, s1), WEFT_OK);
  teardown(&st);
}

/* ... and only then: a stream that cached a block and took it back holds nothing, so an
 * allocation refused for want of memory asks the resource once, not again after an empty flush. */
static void test_out_of_memory_asks_once_when_nothing_is_cached(void **state) {
  (void)state;
  void *st;
  tu_env_t *env = budget_with_a_cached_block(&st);
  weft_stream_t *s0 = tu_stream(env, 0), *s1 = tu_stream(env, 1);
  weft_block_t a = tu_alloc(env, 4 * MIB, 0, "a"); /* taken back from s0's cache */
  assert_int_equal(counters(env).cached_blocks, 0);
  weft_resource_stats_t r0 = top_stats(env);
  weft_block_t b;
  assert_int_equal(weft_alloc(env->rt, 3 * MIB, s1, "b", &b), WEFT_ERR_OVER_BUDGET);
  assert_int_equal(top_stats(env).failures, r0.failures + 1);
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  teardown(&st);
}

/* weft_runtime_trim gives every cached block back, then trims the resource stack. */
static void test_runtime_trim_gives_cached_blocks_back(void **state) {
  tu_env_t *env = *state;
  weft_stream_t *s0 = tu_stream(env, 0), *s1 = tu_stream(env, 1);
  weft_block_t a = tu_alloc(env, N * 4, 0, "a"), b = tu_alloc(env, 8 * MIB, 1, "b");
  uint64_t live = top_stats(env).live_bytes;
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  assert_int_equal(weft_free(b, s1), WEFT_OK);
  assert_int_equal(top_stats(env).live_bytes, live); /* held by the cache */
  assert_int_equal(weft_runtime_trim(NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_runtime_trim(env->rt), WEFT_OK);
  weft_counters_t c = counters(env);
  assert_int_equal(c.cached_blocks, 0);
  assert_int_equal(c.cached_bytes, 0);
  assert_int_equal(top_stats(env).live_bytes, live - N * 4 - 8 * MIB);
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
}

/* Inside a capture weft_alloc takes graph memory, never a cached block; after it the cache serves
 * again. */
static void test_capture_does_not_use_the_cache(void **state) {
  tu_env_t *env = *state;
  weft_stream_t *s0 = tu_stream(env, 0);
  weft_block_t a = tu_alloc(env, N * 4, 0, "a");
  CUdeviceptr pa = ptr_of(a);
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  assert_int_equal(weft_capture_begin(s0, NULL), WEFT_OK);
  weft_block_t g;
  assert_int_equal(weft_alloc(env->rt, N * 4, s0, "g", &g), WEFT_OK);
  assert_true(ptr_of(g) != pa);
  assert_int_equal(tu_fill(env, s0, g, N, 1), WEFT_OK);
  assert_int_equal(weft_free(g, s0), WEFT_OK);
  assert_int_equal(counters(env).cached_blocks, 1);
  weft_graph_t *graph;
  assert_int_equal(weft_capture_end(s0, &graph), WEFT_OK);
  assert_int_equal(weft_graph_destroy(graph), WEFT_OK);
  weft_block_t b = tu_alloc(env, N * 4, 0, "b");
  assert_int_equal(ptr_of(b), pa);
  assert_int_equal(weft_free(b, s0), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
}

/* The memory snapshot shows cached blocks as cached, not as live. */
static void test_snapshot_shows_cached_blocks(void **state) {
  tu_env_t *env = *state;
  weft_stream_t *s0 = tu_stream(env, 0);
  weft_block_t a = tu_alloc(env, N * 4, 0, "cached-one");
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  assert_int_equal(weft_memory_snapshot(env->rt, f), WEFT_OK);
  fclose(f);
  char *at = strstr(text, "cached-one");
  assert_non_null(at);
  assert_non_null(strstr(at, "\"state\": \"cached\""));
  free(text);
  assert_int_equal(weft_runtime_trim(env->rt), WEFT_OK);
}

/* The guard sees every free (poison, canaries): with it on, nothing is cached. */
static void test_guard_turns_the_cache_off(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.guard = 1;
  void *st;
  setup_with(&st, &o);
  tu_env_t *env = st;
  weft_block_t a = tu_alloc(env, N * 4, 0, "a");
  assert_int_equal(weft_free(a, tu_stream(env, 0)), WEFT_OK);
  assert_int_equal(counters(env).cached_blocks, 0);
  teardown(&st);
}

/* The runtime's release gives cached memory back with the rest: no device memory is left. */
static void test_release_leaves_no_cached_memory(void **state) {
  (void)state;
  void *st;
  setup_with(&st, NULL);
  tu_env_t *env = st;
  if (env->sim == NULL) {
    teardown(&st);
    skip(); /* on a GPU the driver's own allocations move cuMemGetInfo: no exact count */
  }
  weft_sim_stats_t before, after;
  weft_block_t a = tu_alloc(env, N * 4, 0, "a"), b = tu_alloc(env, 8 * MIB, 1, "b");
  assert_int_equal(weft_free(a, tu_stream(env, 0)), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(env, 1)), WEFT_OK);
  assert_int_equal(counters(env).cached_blocks, 2);
  const weft_sim_api_t *sim = env->sim;
  teardown(&st);
  sim->stats(&after);
  (void)before;
  assert_int_equal(after.bytes_in_use, 0);
}

/* Eight threads allocate and free on shared streams, sizes from a small set: every reuse is
 * ordered (oracle), the counters add up, and a freed handle stays stale and cannot be freed again
 * while other threads take its record from the cache. Run under tsan in CI. */
/* A stale handle's free whose record is handed out again between the free's checks and its claim
 * (the stream cache reuses a record at once, so another thread can take it in that window): the
 * claim never takes the record's new block, not even for a moment, and the free is refused. Test
 * points act in the window on this thread. This was test_threads_share_the_cache's flake on the
 * GPU: a worker's own live block read as freed while another worker's stale free held it. */
#if WEFT__TEST_POINTS
typedef struct window {
  tu_env_t *env;
  weft_stream_t *s;
  size_t bytes;
  unsigned reused;
  weft_status_t alloc_st, during;
  weft_block_t fresh;
  bool looked;
  char why[256]; /* weft_last_error() of the look */
} window_t;
static window_t g_window;

static void hand_out_in_the_window(const char *point, void *arg) {
  (void)arg;
  if (strcmp(point, "weft_free: checked") == 0 && g_window.reused++ == 0) {
    g_window.alloc_st = weft_alloc(g_window.env->rt, g_window.bytes, g_window.s, "fresh", &g_window.fresh);
  } else if (strcmp(point, "weft_free: claim tried") == 0 && g_window.fresh.rec != NULL && !g_window.looked) {
    CUdeviceptr p;
    g_window.looked = true;
    g_window.during = weft_block_ptr(g_window.fresh, &p);
    snprintf(g_window.why, sizeof g_window.why, "%s", weft_last_error());
  }
}
#endif

static void test_a_stale_free_never_claims_the_records_next_block(void **state) {
#if !WEFT__TEST_POINTS
  (void)state;
  skip(); /* the test points are compiled only where WEFT_DEBUG >= 1 (the asan and tsan configs) */
#else
  tu_env_t *env = *state;
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(env->rt, 0, &s), WEFT_OK);
  weft_block_t b;
  size_t bytes = (size_t)N * 4;
  assert_int_equal(weft_alloc(env->rt, bytes, s, "old", &b), WEFT_OK);
  assert_int_equal(tu_fill(env, s, b, N, 1), WEFT_OK);
  uint64_t cached = counters(env).cached_blocks;
  assert_int_equal(weft_free(b, s), WEFT_OK);
  assert_int_equal(counters(env).cached_blocks, cached + 1); /* the record waits in s's cache */
  g_window = (window_t){env, s, bytes, 0, WEFT_OK, WEFT_OK, {0}, false, ""};
  atomic_store(&weft__test_hook, hand_out_in_the_window);
  weft_status_t again = weft_free(b, s);
  atomic_store(&weft__test_hook, NULL);
  /* The window happened: the record went to a new block inside the stale free. */
  assert_int_equal(g_window.alloc_st, WEFT_OK);
  assert_ptr_equal(g_window.fresh.rec, b.rec);
  assert_true(g_window.looked);
  if (g_window.during != WEFT_OK) fail_msg("the new block read as %s while a stale free ran: %s",
                                           weft_status_name(g_window.during), g_window.why);
  assert_int_equal(again, WEFT_ERR_STALE_HANDLE);
  assert_int_equal(tu_fill(env, s, g_window.fresh, N, 2), WEFT_OK);
  assert_int_equal(weft_free(g_window.fresh, s), WEFT_OK);
#endif
}

typedef struct worker {
  tu_env_t *env;
  unsigned id;
  weft_status_t st;
  char why[256]; /* the worker's own weft_last_error() when it stopped */
} worker_t;

static void *churn(void *arg) {
  worker_t *w = arg;
  tu_env_t *env = w->env;
  uint64_t x = 0x9E3779B97F4A7C15ull * (w->id + 1);
  weft_block_t held[4] = {{0}};
  weft_stream_t *held_on[4] = {0};
  for (int i = 0; i < 400 && w->st == WEFT_OK; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    unsigned k = (unsigned)(x % 4);
    weft_stream_t *s;
    if ((w->st = weft_stream_get(env->rt, (unsigned)((x >> 8) % 3), &s)) != WEFT_OK) break;
    if (held[k].rec != NULL) {
      weft_block_t old = held[k];
      held[k] = (weft_block_t){0};
      if ((w->st = weft_free(old, (x >> 16) % 2 ? s : held_on[k])) != WEFT_OK) break;
      /* Another thread may take the record from the cache at once: the freed handle stays stale
       * and a second free of it is refused, never taken for the new block. */
      CUdeviceptr p;
      weft_status_t again = weft_block_ptr(old, &p), twice = weft_free(old, s);
      if (again != WEFT_ERR_STALE_HANDLE || (twice != WEFT_ERR_STALE_HANDLE && twice != WEFT_ERR_DOUBLE_FREE)) {
        w->st = WEFT_ERR_INVALID_ARGUMENT; /* the check failed: reported below */
        fprintf(stderr, "worker %u: a freed handle: weft_block_ptr %s, a second weft_free %s\n", w->id,
                weft_status_name(again), weft_status_name(twice));
        break;
      }
      continue;
    }
    size_t bytes = (size_t)N * 4 * (1 + (x >> 24) % 3);
    if ((w->st = weft_alloc(env->rt, bytes, s, "churn", &held[k])) != WEFT_OK) break;
    held_on[k] = s;
    w->st = tu_fill(env, s, held[k], N, w->id);
  }
  for (int k = 0; k < 4; k++)
    if (held[k].rec != NULL && w->st == WEFT_OK) w->st = weft_free(held[k], held_on[k]);
  if (w->st != WEFT_OK) snprintf(w->why, sizeof w->why, "%s", weft_last_error());
  return NULL;
}

/* Eight threads run churn on env; returns the counters after (every allocation freed, some
 * frees cached). */
static weft_counters_t churn_eight_threads(tu_env_t *env) {
  worker_t w[8];
  pthread_t t[8];
  weft_counters_t c0 = counters(env);
  for (unsigned i = 0; i < 8; i++) {
    w[i] = (worker_t){env, i, WEFT_OK, ""};
    assert_int_equal(pthread_create(&t[i], NULL, churn, &w[i]), 0);
  }
  for (unsigned i = 0; i < 8; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  for (unsigned i = 0; i < 8; i++)
    if (w[i].st != WEFT_OK) fail_msg("worker %u: %s: %s", i, weft_status_name(w[i].st), w[i].why);
  weft_counters_t c1 = counters(env);
  assert_int_equal(c1.allocs - c0.allocs, c1.frees - c0.frees);
  assert_true(c1.cached_blocks > 0);
  return c1;
}

static void test_threads_share_the_cache(void **state) {
  tu_env_t *env = *state;
  (void)churn_eight_threads(env);
  assert_int_equal(tu_races(env), 0);
  assert_int_equal(weft_runtime_trim(env->rt), WEFT_OK);
  assert_int_equal(counters(env).cached_bytes, 0);
}

/* Eight threads churn with a bound a few blocks large: the bound holds whatever the threads'
 * streams did, no block is lost between the streams' caches, and trim gives everything back. */
static void test_threads_share_a_small_cache(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.stream_cache_bytes = 6 * N * 4;
  void *st;
  setup_with(&st, &o);
  tu_env_t *env = st;
  uint64_t live0 = top_stats(env).live_bytes;
  weft_counters_t c1 = churn_eight_threads(env);
  assert_true(c1.cached_bytes <= 6 * N * 4);
  /* What the caches hold is exactly what the resource still counts live beyond the start. */
  assert_int_equal(top_stats(env).live_bytes, live0 + c1.cached_bytes);
  assert_int_equal(weft_runtime_trim(env->rt), WEFT_OK);
  assert_int_equal(counters(env).cached_bytes, 0);
  assert_int_equal(top_stats(env).live_bytes, live0);
  teardown(&st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_same_stream_same_size_reuses_without_the_resource, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_stream_or_size_does_not_take_it, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reuse_after_a_read_elsewhere_is_ordered, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reused_block_written_elsewhere_waits_for_the_old_uses, setup, teardown),
      cmocka_unit_test(test_cache_is_bounded),
      cmocka_unit_test(test_cache_room_moves_between_streams),
      cmocka_unit_test(test_out_of_memory_empties_the_cache_first),
      cmocka_unit_test(test_out_of_memory_asks_once_when_nothing_is_cached),
      cmocka_unit_test_setup_teardown(test_runtime_trim_gives_cached_blocks_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_capture_does_not_use_the_cache, setup, teardown),
      cmocka_unit_test_setup_teardown(test_snapshot_shows_cached_blocks, setup, teardown),
      cmocka_unit_test(test_guard_turns_the_cache_off),
      cmocka_unit_test(test_release_leaves_no_cached_memory),
      cmocka_unit_test_setup_teardown(test_a_stale_free_never_claims_the_records_next_block, setup, teardown),
      cmocka_unit_test_setup_teardown(test_threads_share_the_cache, setup, teardown),
      cmocka_unit_test(test_threads_share_a_small_cache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
