/* weft's pool over a fake upstream and a fake tracker: which freed memory an allocation may take
 * on which stream, when it waits (once, for the freeing point only), when it grows, trim, and
 * clean failures (upstream refusals, failed waits, bad frees) with consistent statistics. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tests/mem/fake_runtime.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

typedef struct fixture {
  weft_runtime_t *rt;
  fake_upstream_t *up;
  weft_resource_t *pool;
} fixture_t;

static fixture_t fx;

static void make_pool(uint64_t chunk, uint64_t max) {
  fx.rt = fake_init(4);
  fx.up = fake_upstream_create(fx.rt);
  weft_pool_options_t o = weft_pool_options_default();
  o.chunk_bytes = chunk;
  o.max_bytes = max;
  assert_int_equal(weft_pool_create(fx.rt, &fx.up->base, &o, &fx.pool), WEFT_OK);
}

static void drop_pool(void) {
  weft_resource_destroy(fx.pool);
  assert_int_equal(fx.up->live_bytes, 0); /* every chunk went back */
  fake_upstream_destroy(fx.up);
}

static CUdeviceptr alloc_on(unsigned s, size_t bytes) {
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(fx.pool, bytes, fake_stream(s), "t", &p), WEFT_OK);
  assert_true(p % 256 == 0);
  return p;
}

static void free_on(unsigned s, CUdeviceptr p, size_t bytes) {
  fake_work(s); /* the last use, then the free */
  assert_int_equal(weft_resource_deallocate(fx.pool, p, bytes, fake_stream(s), "t"), WEFT_OK);
}

static void test_same_stream_reuses_at_once_without_waits_or_queries(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 1000);
  free_on(0, a, 1000);
  assert_int_equal(alloc_on(0, 1000), a);
  assert_int_equal(fake.waits, 0);
  assert_int_equal(fake.polls, 0);
  assert_int_equal(fx.up->allocs, 1);
  drop_pool();
}

static void test_other_stream_grows_rather_than_wait_for_running_work(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 1 * MIB);
  free_on(0, a, 1 * MIB);
  CUdeviceptr b = alloc_on(1, 1 * MIB); /* stream 0's free may still run: new chunk */
  assert_true(b != a);
  assert_int_equal(fake.waits, 0);
  assert_int_equal(fx.up->allocs, 2);
  drop_pool();
}

static void test_other_stream_reuses_once_the_free_is_known_complete(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 1 * MIB); /* the whole chunk: nothing idle beside it */
  free_on(0, a, 1 * MIB);
  fake_complete(0);
  assert_int_equal(alloc_on(1, 4096), a);
  assert_int_equal(fx.up->allocs, 1);
  assert_int_equal(fake.waits, 0);
  assert_true(fake.polls >= 1);
  /* Once retired, the range is idle: a third stream takes it without another query. */
  unsigned polls = fake.polls;
  free_on(1, a, 4096);
  fake_complete(1);
  alloc_on(2, 4096);
  assert_true(fake.polls <= polls + 1);
  drop_pool();
}

static void test_other_stream_reuses_when_already_ordered_after_the_free(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 1 * MIB);
  free_on(0, a, 1 * MIB);
  /* Stream 1 already waited for stream 0 up to its free (e.g. for data). */
  fake.known[1 * FAKE_STREAMS + 0] = fake.tick[0];
  assert_int_equal(alloc_on(1, 4096), a);
  assert_int_equal(fake.waits, 0);
  assert_int_equal(fake.polls, 0);
  drop_pool();
}

static void test_at_max_bytes_waits_once_for_the_freeing_point_only(void **state) {
  (void)state;
  make_pool(1 * MIB, 1 * MIB);
  CUdeviceptr a = alloc_on(0, 512 * KIB);
  free_on(0, a, 512 * KIB);
  uint64_t free_tick = fake.tick[0];
  for (int i = 0; i < 5; i++) fake_work(0); /* stream 0 goes on with unrelated work */
  CUdeviceptr b1 = alloc_on(1, 300 * KIB);
  CUdeviceptr b2 = alloc_on(1, 500 * KIB); /* does not fit beside b1 without a's range */
  (void)b1;
  assert_int_equal(b2 == a || b1 == a, 1);
  assert_int_equal(fake.waits, 1);
  assert_int_equal(fake.last_wait.stream, 0);
  assert_int_equal(fake.last_wait.tick, free_tick); /* not stream 0's newest tick */
  assert_int_equal(fx.up->allocs, 1);
  free_on(1, b1, 300 * KIB);
  free_on(1, b2, 500 * KIB);
  drop_pool();
}

static void test_fragments_freed_on_several_streams_are_gathered_before_failing(void **state) {
  (void)state;
  make_pool(1 * MIB, 1 * MIB);
  CUdeviceptr q[4];
  for (int i = 0; i < 4; i++) q[i] = alloc_on(0, 256 * KIB);
  for (int i = 0; i < 4; i++) free_on((unsigned)i, q[i], 256 * KIB); /* four lanes, none merged */
  CUdeviceptr big = alloc_on(0, 1 * MIB);
  assert_int_equal(big, q[0]);
  assert_int_equal(fake.waits, 3); /* one per other stream */
  free_on(0, big, 1 * MIB);
  drop_pool();
}

/* Two chunks wholly freed on streams 1 and 2, their frees still running; 1.5 MiB on stream 0
 * fits in neither (chunks never merge) and the cap leaves no room to grow: the host waits for
 * both frees (one synchronisation), the chunks go back and one of 1.5 MiB comes. */
static void pending_whole_chunks(void) {
  make_pool(1 * MIB, 2 * MIB);
  CUdeviceptr a = alloc_on(1, 1 * MIB), b = alloc_on(2, 1 * MIB);
  free_on(1, a, 1 * MIB);
  free_on(2, b, 1 * MIB);
}

static void test_at_max_bytes_waits_on_the_host_for_pending_whole_chunks_before_failing(void **state) {
  (void)state;
  pending_whole_chunks();
  CUdeviceptr c = alloc_on(0, 1536 * KIB);
  assert_int_equal(fake.syncs, 1);
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.reserved_bytes, 1536 * KIB);
  assert_int_equal(fx.up->frees, 2);
  free_on(0, c, 1536 * KIB);
  drop_pool();
}

static void test_full_pool_fails_cleanly_with_consistent_stats(void **state) {
  (void)state;
  make_pool(1 * MIB, 1 * MIB);
  CUdeviceptr a = alloc_on(0, 1 * MIB);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(fx.pool, 256, fake_stream(1), "t", &p), WEFT_ERR_OUT_OF_MEMORY);
  assert_int_equal(p, 0);
  assert_non_null(strstr(weft_last_error(), "max_bytes"));
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.live_bytes, 1 * MIB);
  assert_int_equal(st.reserved_bytes, 1 * MIB);
  assert_int_equal(st.failures, 1);
  assert_int_equal(st.allocs, 1);
  assert_int_equal(fake.syncs, 0); /* no chunk could go back: waiting would not help */
  free_on(0, a, 1 * MIB);
  drop_pool();
}

static void test_upstream_refusal_gives_its_error_and_changes_nothing(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  fx.up->fail_alloc = WEFT_ERR_DRIVER;
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(fx.pool, 4096, fake_stream(0), "t", &p), WEFT_ERR_DRIVER);
  assert_non_null(strstr(weft_last_error(), "fake upstream"));
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.reserved_bytes, 0);
  assert_int_equal(st.live_bytes, 0);
  fx.up->fail_alloc = WEFT_OK;
  alloc_on(0, 4096);
  drop_pool();
}

static void test_upstream_out_of_memory_releases_idle_chunks_and_retries(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  fx.up->capacity = 3 * MIB;
  CUdeviceptr a = alloc_on(0, 1 * MIB), b = alloc_on(0, 1 * MIB);
  free_on(0, a, 1 * MIB);
  free_on(0, b, 1 * MIB);
  fake_complete(0);
  CUdeviceptr big = alloc_on(1, 2 * MIB + 4096); /* needs both idle chunks returned */
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.reserved_bytes, 2 * MIB + 4096);
  free_on(1, big, 2 * MIB + 4096);
  drop_pool();
}

static void test_failed_wait_fails_the_allocation_and_keeps_the_range(void **state) {
  (void)state;
  make_pool(1 * MIB, 1 * MIB);
  CUdeviceptr a = alloc_on(0, 1 * MIB);
  free_on(0, a, 1 * MIB);
  fake.fail_order = WEFT_ERR_DRIVER;
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(fx.pool, 4096, fake_stream(1), "t", &p), WEFT_ERR_DRIVER);
  fake.fail_order = WEFT_OK;
  assert_int_equal(alloc_on(1, 1 * MIB), a);
  assert_int_equal(fake.waits, 1);
  drop_pool();
}

static void test_bad_frees_are_rejected_and_leave_the_block_live(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 1000);
  assert_int_equal(weft_resource_deallocate(fx.pool, a + 256, 1000, fake_stream(0), "t"), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_deallocate(fx.pool, a, 5000, fake_stream(0), "t"), WEFT_ERR_INVALID_ARGUMENT);
  free_on(0, a, 1000);
  assert_int_equal(weft_resource_deallocate(fx.pool, a, 1000, fake_stream(0), "t"), WEFT_ERR_INVALID_ARGUMENT);
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.frees, 1);
  assert_int_equal(st.failures, 3);
  drop_pool();
}

static void test_zero_and_huge_sizes_are_invalid(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(fx.pool, 0, fake_stream(0), "t", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_allocate(fx.pool, SIZE_MAX, fake_stream(0), "t", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_allocate(fx.pool, SIZE_MAX - 100, fake_stream(0), "t", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_allocate(fx.pool, (1ull << 48) + 1, fake_stream(0), "t", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(fx.up->allocs, 0);
  drop_pool();
}

static void test_trim_releases_whole_chunks_only_after_their_frees_complete(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 1 * MIB), b = alloc_on(1, 1 * MIB), c = alloc_on(1, 4096);
  free_on(0, a, 1 * MIB);
  free_on(1, b, 1 * MIB);
  assert_int_equal(weft_resource_trim(fx.pool, 0), WEFT_OK);
  assert_int_equal(fx.up->live_count, 3); /* nothing known complete yet */
  fake_complete(0);
  fake_complete(1);
  assert_int_equal(weft_resource_trim(fx.pool, 0), WEFT_OK);
  assert_int_equal(fx.up->live_count, 1); /* c's chunk stays */
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.reserved_bytes, 1 * MIB);
  assert_int_equal(st.reserved_peak, 3 * MIB);
  free_on(1, c, 4096);
  fake_complete(1);
  assert_int_equal(weft_resource_trim(fx.pool, 1 * MIB), WEFT_OK); /* keep 1 MiB */
  assert_int_equal(fx.up->live_count, 1);
  assert_int_equal(weft_resource_trim(fx.pool, 0), WEFT_OK);
  assert_int_equal(fx.up->live_count, 0);
  drop_pool();
}

static void test_large_block_gets_its_own_chunk_kept_for_its_size_then_trimmed(void **state) {
  (void)state;
  make_pool(4 * MIB, 0); /* large: >= 2 MiB; kept: up to 8 MiB */
  CUdeviceptr small = alloc_on(0, 4096);
  CUdeviceptr a = alloc_on(1, 5 * MIB + 3);
  assert_int_equal(fx.up->allocs, 2);
  assert_int_equal(fx.up->live_bytes, 4 * MIB + 5 * MIB + 256);
  free_on(1, a, 5 * MIB + 3);
  /* Kept whole for the next request of its size: the same stream takes it back with no upstream
   * call, no wait and no query. */
  assert_int_equal(fx.up->live_bytes, 4 * MIB + 5 * MIB + 256);
  unsigned polls = fake.polls;
  assert_int_equal(alloc_on(1, 5 * MIB + 3), a);
  assert_int_equal(fx.up->allocs, 2);
  assert_int_equal(fake.waits, 0);
  assert_int_equal(fake.polls, polls);
  /* A small request never carves a kept chunk. */
  free_on(1, a, 5 * MIB + 3);
  CUdeviceptr s2[4];
  for (int i = 0; i < 4; i++) { /* three fit beside `small`, the fourth takes a new chunk */
    s2[i] = alloc_on(1, 1 * MIB);
    assert_true(s2[i] < a || s2[i] >= a + 5 * MIB + 256);
  }
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.reserved_bytes, fx.up->live_bytes);
  assert_int_equal(fx.up->live_count, 3);
  for (int i = 0; i < 4; i++) free_on(1, s2[i], 1 * MIB);
  /* A kept chunk freed at the resource level again is refused, and stays kept. */
  assert_int_equal(weft_resource_deallocate(fx.pool, a, 5 * MIB + 3, fake_stream(1), "t"), WEFT_ERR_INVALID_ARGUMENT);
  /* Trim gives kept chunks back at once, on the stream that freed them (stream order covers the
   * free); a shared chunk goes back once its frees are known complete. */
  assert_int_equal(weft_resource_trim(fx.pool, 0), WEFT_OK);
  assert_int_equal(fx.up->live_count, 2);
  assert_int_equal(fx.up->last_free_stream, 1);
  assert_int_equal(fake.waits, 0);
  fake_complete(1);
  assert_int_equal(weft_resource_trim(fx.pool, 0), WEFT_OK);
  assert_int_equal(fx.up->live_count, 1); /* small's chunk stays */
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.reserved_bytes, 4 * MIB);
  free_on(0, small, 4096);
  drop_pool();
}

static void test_kept_large_chunk_goes_to_another_stream_only_when_ordered_or_complete(void **state) {
  (void)state;
  make_pool(4 * MIB, 0); /* large: >= 2 MiB; kept: up to 8 MiB */
  CUdeviceptr a = alloc_on(1, 3 * MIB);
  free_on(1, a, 3 * MIB);
  fake.known[2 * FAKE_STREAMS + 1] = fake.tick[1]; /* stream 2 is ordered after stream 1's free */
  assert_int_equal(alloc_on(2, 3 * MIB), a);
  free_on(2, a, 3 * MIB);
  fake_complete(2); /* the host sees stream 2's free complete: stream 3 takes it (one query) */
  unsigned polls = fake.polls;
  assert_int_equal(alloc_on(3, 3 * MIB), a);
  assert_int_equal(fake.polls, polls + 1);
  free_on(3, a, 3 * MIB);
  /* Stream 0 is not ordered after stream 3's free, which may still run: a new chunk, and the
   * kept one goes back on stream 3, where stream order covers its free. */
  CUdeviceptr b = alloc_on(0, 3 * MIB);
  assert_true(b != a);
  assert_int_equal(fx.up->last_free_stream, 3);
  assert_int_equal(fx.up->allocs, 2);
  assert_int_equal(fx.up->live_count, 1);
  assert_int_equal(fake.waits, 0);
  free_on(0, b, 3 * MIB);
  drop_pool();
}

static void test_kept_large_chunks_are_bounded_and_go_back_oldest_first_after_their_free(void **state) {
  (void)state;
  make_pool(4 * MIB, 0); /* large: >= 2 MiB; kept: up to 8 MiB */
  enum { N = 12 };
  CUdeviceptr p[N];
#define SIZE(i) (2 * MIB + (uint64_t)(i) * 256 * KIB) /* all large, all different */
  for (int i = 0; i < N; i++) p[i] = alloc_on(0, SIZE(i));
  for (int i = 0; i < N; i++) free_on(0, p[i], SIZE(i));
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_true(fx.up->live_count < N); /* older ones went back */
  assert_true(st.reserved_bytes == fx.up->live_bytes);
  assert_int_equal(fake.waits, 0); /* freed on stream 0, given back on stream 0: stream order */
  /* The newest is still kept, the oldest is not. */
  assert_int_equal(alloc_on(0, SIZE(N - 1)), p[N - 1]);
  uint64_t allocs = fx.up->allocs;
  CUdeviceptr again = alloc_on(0, 3 * MIB);
  assert_int_equal(fx.up->allocs, allocs + 1);
  /* A miss on another stream gives the kept chunks back with no wait: on the stream that freed
   * them, where stream order covers their free. */
  free_on(0, again, 3 * MIB);
  uint64_t frees = fx.up->frees;
  CUdeviceptr q = alloc_on(1, 20 * MIB);
  assert_int_equal(fx.up->frees, frees + 1);
  assert_int_equal(fx.up->last_free_stream, 0);
  assert_int_equal(fake.waits, 0);
  free_on(1, q, 20 * MIB);
  free_on(0, p[N - 1], SIZE(N - 1));
#undef SIZE
  drop_pool();
}

static void test_constructor_rejects_bad_arguments(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(4);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *r = NULL;
  weft_pool_options_t o = weft_pool_options_default();
  assert_int_equal(weft_pool_create(NULL, &up->base, &o, &r), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_pool_create(rt, NULL, &o, &r), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_pool_create(rt, &up->base, &o, NULL), WEFT_ERR_INVALID_ARGUMENT);
  o.chunk_bytes = 0;
  assert_int_equal(weft_pool_create(rt, &up->base, &o, &r), WEFT_ERR_INVALID_ARGUMENT);
  o = weft_pool_options_default();
  o.max_bytes = o.chunk_bytes - 1;
  assert_int_equal(weft_pool_create(rt, &up->base, &o, &r), WEFT_ERR_INVALID_ARGUMENT);
  fake.released = 1;
  assert_int_equal(weft_pool_create(rt, &up->base, NULL, &r), WEFT_ERR_STALE_HANDLE);
  assert_null(r);
  fake_upstream_destroy(up);
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Random sizes 256 B .. 64 MiB (log-uniform), frees on random streams, the device finishing
 * streams at random: peak reserved / peak live stays low. */
static void test_random_workload_keeps_reserved_close_to_live(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 3; seed++) {
    make_pool(64 * MIB, 0);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull;
    enum { SLOTS = 256 };
    CUdeviceptr p[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    for (int step = 0; step < 100000; step++) {
      unsigned k = (unsigned)(rng(&s) % SLOTS), st = (unsigned)(rng(&s) % 4);
      if (p[k]) {
        free_on(st, p[k], sz[k]);
        p[k] = 0;
      } else {
        unsigned lg = 8 + (unsigned)(rng(&s) % 19);            /* 2^8 .. 2^26 */
        sz[k] = (size_t)((1ull << lg) + rng(&s) % (1ull << lg));
        if (sz[k] > 64 * MIB) sz[k] = 64 * MIB;
        p[k] = alloc_on(st, sz[k]);
      }
      if (rng(&s) % 4 == 0) fake_complete((unsigned)(rng(&s) % 4));
    }
    weft_resource_stats_t st;
    weft_resource_stats(fx.pool, &st);
    double ratio = (double)st.reserved_peak / (double)st.live_peak;
    print_message("seed %llu: peak live %.1f MiB, peak reserved %.1f MiB, ratio %.3f, waits %u\n",
                  (unsigned long long)seed, st.live_peak / 1048576.0, st.reserved_peak / 1048576.0, ratio, fake.waits);
    assert_true(ratio <= 1.15);
    for (int k = 0; k < SLOTS; k++)
      if (p[k]) free_on(0, p[k], sz[k]);
    drop_pool();
  }
}

/* ---- each stream's cache of its recent frees (pool.c, CACHE_SLOTS) ---- */

/* A cached free is the block's free: a second free of it is refused, and it is handed out once. */
static void test_a_cached_free_is_taken_again_once_and_never_freed_twice(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr keep = alloc_on(0, 4096); /* live bytes enough that the dispatch asks the pool */
  CUdeviceptr a = alloc_on(0, 1000);
  free_on(0, a, 1000);
  assert_int_equal(weft_resource_deallocate(fx.pool, a, 1000, fake_stream(0), "t"), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "was freed"));
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.live_bytes, 4096);
  assert_int_equal(st.frees, 1);
  assert_int_equal(alloc_on(0, 1000), a);
  CUdeviceptr b = alloc_on(0, 1000);
  assert_true(b != a);
  free_on(0, a, 1000);
  free_on(0, b, 1000);
  free_on(0, keep, 4096);
  drop_pool();
}

/* Cached frees serve other sizes (merged with their neighbours) before the pool grows. */
static void test_cached_frees_serve_a_larger_request_before_the_pool_grows(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 512 * KIB), b = alloc_on(0, 512 * KIB); /* the whole chunk */
  free_on(0, a, 512 * KIB);
  free_on(0, b, 512 * KIB);
  assert_int_equal(alloc_on(0, 1 * MIB), a);
  assert_int_equal(fx.up->allocs, 1);
  assert_int_equal(fake.waits, 0);
  free_on(0, a, 1 * MIB);
  drop_pool();
}

/* Another stream takes a cached free once the host sees it complete, rather than grow. */
static void test_a_cached_free_goes_to_another_stream_once_complete(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 512 * KIB), b = alloc_on(0, 512 * KIB); /* the whole chunk */
  free_on(0, a, 512 * KIB);
  fake_complete(0);
  assert_int_equal(alloc_on(1, 512 * KIB), a);
  assert_int_equal(fx.up->allocs, 1);
  assert_int_equal(fake.waits, 0);
  free_on(1, a, 512 * KIB);
  free_on(0, b, 512 * KIB);
  drop_pool();
}

/* A trim gives back a chunk whose only block sits in a stream's cache, once its free is complete. */
static void test_trim_gives_back_a_chunk_whose_block_sits_in_a_cache(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(0, 1000);
  free_on(0, a, 1000);
  fake_complete(0);
  assert_int_equal(weft_resource_trim(fx.pool, 0), WEFT_OK);
  assert_int_equal(fx.up->live_bytes, 0);
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_int_equal(st.reserved_bytes, 0);
  drop_pool();
}

typedef struct seen {
  uint64_t segment_bytes, free_bytes;
  CUdeviceptr cached;
  unsigned cached_lane;
} seen_t;

static void on_segment(void *ctx, const weft_segment_t *g) { ((seen_t *)ctx)->segment_bytes += g->bytes; }

static void on_free_range(void *ctx, const weft_free_range_t *r) {
  seen_t *v = ctx;
  v->free_bytes += r->bytes;
  if (r->ptr == v->cached) v->cached_lane = r->lane;
}

/* A snapshot shows a cached free as a free range of the stream that freed it. */
static void test_a_snapshot_shows_cached_frees_as_free_ranges_of_their_stream(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr a = alloc_on(2, 1000), b = alloc_on(2, 1000);
  free_on(2, a, 1000);
  seen_t v = {0, 0, a, 99};
  fx.pool->ops->segments(fx.pool, on_segment, on_free_range, &v);
  assert_int_equal(v.segment_bytes, 1 * MIB);
  assert_int_equal(v.free_bytes, 1 * MIB - 1024); /* all but b */
  assert_int_equal(v.cached_lane, 2);
  free_on(2, b, 1000);
  drop_pool();
}

/* Stream 1 frees n blocks of 4 KiB with a live block between each two (no merging). */
static void free_apart(CUdeviceptr *x, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    x[i] = alloc_on(1, 4096);
    (void)alloc_on(1, 4096); /* a neighbour that stays live */
  }
}

/* Destroying the pool waits for each stream's newest free, cached or not: here the newest is in
 * the cache, an older one already among the free ranges. */
static void test_destroy_waits_for_a_streams_newest_free_in_its_cache(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr x[2];
  free_apart(x, 2);
  free_on(1, x[0], 4096);
  (void)alloc_on(0, 1 * MIB); /* a new chunk: the caches are flushed before growing */
  free_on(1, x[1], 4096);     /* cached */
  uint64_t newest = fake.tick[1];
  assert_int_equal(weft_resource_destroy(fx.pool), WEFT_OK);
  assert_int_equal(fake.last_wait.stream, 1);
  assert_int_equal(fake.last_wait.tick, newest);
  fake_upstream_destroy(fx.up);
}

/* A full cache sends the next free to the free ranges; when the cache is flushed later, its
 * older frees must not make a lane's newest free point look older than it is. */
static void test_destroy_waits_for_a_streams_newest_free_after_its_cache_was_flushed(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  CUdeviceptr x[9];
  free_apart(x, 9);
  for (unsigned i = 0; i < 9; i++) free_on(1, x[i], 4096); /* 8 cached, the 9th a free range */
  uint64_t newest = fake.tick[1];
  (void)alloc_on(0, 1 * MIB); /* the caches are flushed before growing */
  assert_int_equal(weft_resource_destroy(fx.pool), WEFT_OK);
  assert_int_equal(fake.last_wait.stream, 1);
  assert_int_equal(fake.last_wait.tick, newest);
  fake_upstream_destroy(fx.up);
}

typedef struct churn {
  unsigned me;
  uint64_t allocs, bad_frees, peak_seen; /* successes, refused frees; the highest live count read */
  int failed;
} churn_t;

static atomic_bool g_churning;

static void *thread_churn(void *arg) {
  churn_t *c = arg;
  uint64_t s = c->me + 1;
  CUdeviceptr p[32] = {0};
  size_t sz[32];
  for (int i = 0; i < 20000 && !c->failed; i++) {
    unsigned k = (unsigned)(rng(&s) % 32);
    if (p[k]) {
      /* Now and then a wrong size first: refused, counted as a failure, the block still live. */
      if (i % 97 == 0 && weft_resource_deallocate(fx.pool, p[k], sz[k] + MIB, fake_stream(c->me), "t") !=
                             WEFT_ERR_INVALID_ARGUMENT)
        c->failed = 1;
      if (i % 97 == 0) c->bad_frees++;
      if (weft_resource_deallocate(fx.pool, p[k], sz[k], fake_stream(c->me), "t") != WEFT_OK) c->failed = 1;
      p[k] = 0;
    } else {
      sz[k] = 1 + (size_t)(rng(&s) % 100000);
      if (weft_resource_allocate(fx.pool, sz[k], fake_stream(c->me), "t", &p[k]) != WEFT_OK) c->failed = 1;
      else c->allocs++;
    }
  }
  for (int k = 0; k < 32; k++)
    if (p[k] && weft_resource_deallocate(fx.pool, p[k], sz[k], fake_stream(c->me), "t") != WEFT_OK) c->failed = 1;
  return NULL;
}

/* Reads the counts while the others churn (the pool keeps them under its lock, readers load them
 * without it): live bytes never exceed the peak read after them. */
static void *thread_read_counts(void *arg) {
  churn_t *c = arg;
  while (atomic_load(&g_churning)) {
    weft_resource_stats_t st;
    weft_resource_stats(fx.pool, &st);
    if (st.live_bytes > st.live_peak) {
      weft_resource_stats_t again;
      weft_resource_stats(fx.pool, &again);
      if (st.live_bytes > again.live_peak) c->failed = 1;
    }
    if (st.live_bytes > c->peak_seen) c->peak_seen = st.live_bytes;
  }
  return NULL;
}

/* Threads allocating and freeing at once (one stream each; the fake's ticks stay still), a fifth
 * reading the counts: every count is exact at the end. */
static void test_threads_share_one_pool(void **state) {
  (void)state;
  make_pool(1 * MIB, 0);
  pthread_t t[5];
  churn_t c[5] = {{.me = 0}, {.me = 1}, {.me = 2}, {.me = 3}, {.me = 4}};
  atomic_store(&g_churning, true);
  assert_int_equal(pthread_create(&t[4], NULL, thread_read_counts, &c[4]), 0);
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, thread_churn, &c[i]), 0);
  uint64_t allocs = 0, bad = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    assert_false(c[i].failed);
    allocs += c[i].allocs;
    bad += c[i].bad_frees;
  }
  atomic_store(&g_churning, false);
  pthread_join(t[4], NULL);
  assert_false(c[4].failed);
  weft_resource_stats_t st;
  weft_resource_stats(fx.pool, &st);
  assert_true(bad > 0); /* premise: refused frees happened */
  assert_int_equal(st.live_bytes, 0);
  assert_int_equal(st.allocs, allocs);
  assert_int_equal(st.frees, allocs);
  assert_int_equal(st.failures, bad);
  assert_true(st.live_peak >= c[4].peak_seen);
  assert_true(st.live_peak > 0);
  drop_pool();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_stream_reuses_at_once_without_waits_or_queries),
      cmocka_unit_test(test_other_stream_grows_rather_than_wait_for_running_work),
      cmocka_unit_test(test_other_stream_reuses_once_the_free_is_known_complete),
      cmocka_unit_test(test_other_stream_reuses_when_already_ordered_after_the_free),
      cmocka_unit_test(test_at_max_bytes_waits_once_for_the_freeing_point_only),
      cmocka_unit_test(test_fragments_freed_on_several_streams_are_gathered_before_failing),
      cmocka_unit_test(test_at_max_bytes_waits_on_the_host_for_pending_whole_chunks_before_failing),
      cmocka_unit_test(test_full_pool_fails_cleanly_with_consistent_stats),
      cmocka_unit_test(test_upstream_refusal_gives_its_error_and_changes_nothing),
      cmocka_unit_test(test_upstream_out_of_memory_releases_idle_chunks_and_retries),
      cmocka_unit_test(test_failed_wait_fails_the_allocation_and_keeps_the_range),
      cmocka_unit_test(test_bad_frees_are_rejected_and_leave_the_block_live),
      cmocka_unit_test(test_zero_and_huge_sizes_are_invalid),
      cmocka_unit_test(test_trim_releases_whole_chunks_only_after_their_frees_complete),
      cmocka_unit_test(test_large_block_gets_its_own_chunk_kept_for_its_size_then_trimmed),
      cmocka_unit_test(test_kept_large_chunk_goes_to_another_stream_only_when_ordered_or_complete),
      cmocka_unit_test(test_kept_large_chunks_are_bounded_and_go_back_oldest_first_after_their_free),
      cmocka_unit_test(test_constructor_rejects_bad_arguments),
      cmocka_unit_test(test_random_workload_keeps_reserved_close_to_live),
      cmocka_unit_test(test_a_cached_free_is_taken_again_once_and_never_freed_twice),
      cmocka_unit_test(test_cached_frees_serve_a_larger_request_before_the_pool_grows),
      cmocka_unit_test(test_a_cached_free_goes_to_another_stream_once_complete),
      cmocka_unit_test(test_trim_gives_back_a_chunk_whose_block_sits_in_a_cache),
      cmocka_unit_test(test_a_snapshot_shows_cached_frees_as_free_ranges_of_their_stream),
      cmocka_unit_test(test_destroy_waits_for_a_streams_newest_free_in_its_cache),
      cmocka_unit_test(test_destroy_waits_for_a_streams_newest_free_after_its_cache_was_flushed),
      cmocka_unit_test(test_threads_share_one_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
