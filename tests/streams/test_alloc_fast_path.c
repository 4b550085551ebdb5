/* The allocation fast path (lib/runtime/block.c, "the allocation fast path"; streams/tracker.c,
 * free_live) takes the same steps as weft_alloc's and weft_free's general paths, which
 * tracker.no_fast_path forces:
 * - random programs of allocations, frees (on the allocating stream or another), fills and reads
 *   on 6 streams, three of them exposed (weft_stream_raw: each call asks the driver about
 *   captures begun outside weft) and one the adopted legacy stream, each run on a fresh runtime
 *   with the fast path and without it, allocate and free as often, cache as many blocks, issue
 *   the same waits, skip the same, record the same events, with no race and every block's data
 *   right; with lazy and eager records, and with rings of 4 events (waits then served by newer
 *   events: the same ring evictions either way). The fast path must have taken most allocations and frees
 *   (rt->cache[].fast_takes, tracker.fast_frees), else the comparison proves nothing;
 * - a capture begun outside weft on an exposed stream is met: the allocation inside it is not
 *   handed the stream's cached block;
 * - every refused weft_alloc and weft_free gives the same status and message either way and
 *   leaves the stream usable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/runtime/runtime.h"
#include "tests/streams/refusals.h"
#include "tests/util/cmocka_env.h"

#define N 256        /* elements a fill writes */
#define SLOTS 24     /* blocks a program holds at most */
#define STREAMS 6    /* pool streams 0..4 (2..4 exposed), and the adopted legacy stream */

static unsigned seeds(void) {
  const char *e = getenv("WEFT_TEST_SEEDS");
  return e ? (unsigned)strtoul(e, NULL, 10) : 6;
}

static uint64_t next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

/* What a run did. */
typedef struct run {
  weft_counters_t c;     /* deltas over the program */
  uint64_t cached;       /* blocks the streams kept at the end, before the last frees */
  uint64_t fast_allocs;  /* allocations the fast path handed out */
  uint64_t fast_frees;   /* frees the tracker's fast path took */
  uint64_t ops_alloc, ops_free, races, wrong;
} run_t;

/* A fresh runtime of `streams` pool streams (no high-priority one), lazy records or not, event
 * rings of `ring` events (0: the default), with the fast paths on or off. */
static void fresh(tu_env_t *env, unsigned streams, unsigned lazy, unsigned ring, bool fast) {
  weft_options_t o = weft_options_default();
  o.stream_count = streams;
  o.high_priority_streams = 0;
  o.lazy_records = lazy;
  if (ring != 0) o.event_ring = ring;
  assert_int_equal(tu_init(env, &o), 0);
  env->rt->tracker.no_fast_path = !fast;
}

static uint64_t fast_takes(const weft_runtime_t *rt) {
  uint64_t n = 0;
  for (unsigned i = 0; i < WEFT__MAX_STREAMS; i++) n += rt->cache[i].fast_takes;
  return n;
}

/* Whether block b holds `value` in its first N elements (a tracked read, then synchronised). */
static bool holds(weft_stream_t *s, weft_block_t b, unsigned value) {
  unsigned got[N];
  assert_int_equal(tu_read(s, b, got, sizeof got), WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (got[i] != value) return false;
  return true;
}

static run_t run_program(uint64_t seed, unsigned lazy, unsigned ring, bool fast) {
  tu_env_t env;
  fresh(&env, 5, lazy, ring, fast);
  weft_stream_t *s[STREAMS];
  for (unsigned i = 0; i < 5; i++) s[i] = tu_stream(&env, i);
  for (unsigned i = 2; i < 5; i++) assert_non_null(weft_stream_raw(s[i])); /* exposed */
  assert_int_equal(weft_stream_adopt(env.rt, NULL, &s[5]), WEFT_OK);
  /* A scratch output per stream: a read of a slot elsewhere is a combine into it. */
  weft_block_t scratch[STREAMS];
  for (unsigned i = 0; i < STREAMS; i++)
    assert_int_equal(weft_alloc(env.rt, N * 4, s[i], "scratch", &scratch[i]), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  tu_reset_races(&env);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  uint64_t t0 = fast_takes(env.rt), f0 = env.rt->tracker.fast_frees;
  weft_block_t slot[SLOTS] = {{0}};
  unsigned on[SLOTS] = {0}, value[SLOTS] = {0};
  run_t r = {0};
  uint64_t x = 0x9E3779B97F4A7C15ull * seed;
  for (unsigned step = 0; step < 1500; step++) {
    unsigned k = (unsigned)(next(&x) % SLOTS), at = (unsigned)(next(&x) % STREAMS), what = (unsigned)(next(&x) % 10);
    if (slot[k].rec == NULL) {
      /* Three sizes, so that a stream's cache holds some and misses others. */
      size_t bytes = (size_t)N * 4 << (next(&x) % 3);
      assert_int_equal(weft_alloc(env.rt, bytes, s[at], "slot", &slot[k]), WEFT_OK);
      on[k] = at;
      value[k] = step + 1;
      assert_int_equal(tu_fill(&env, s[at], slot[k], N, value[k]), WEFT_OK);
      r.ops_alloc++;
    } else if (what < 4) {
      /* Freed on the allocating stream mostly, else on another: that free waits for the uses. */
      unsigned by = what < 3 ? on[k] : at;
      assert_int_equal(weft_free(slot[k], s[by]), WEFT_OK);
      slot[k] = (weft_block_t){0};
      r.ops_free++;
    } else if (what < 9) {
      weft_block_t none = {0};
      assert_int_equal(tu_combine(&env, s[at], scratch[at], none, slot[k], none, none, N, 1), WEFT_OK);
    } else if (step % 7 == 0) {
      if (!holds(s[at], slot[k], value[k])) r.wrong++;
    }
  }
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  r.cached = c1.cached_blocks;
  r.fast_allocs = fast_takes(env.rt) - t0;
  r.fast_frees = env.rt->tracker.fast_frees - f0;
  for (unsigned k = 0; k < SLOTS; k++)
    if (slot[k].rec != NULL) {
      if (!holds(s[on[k]], slot[k], value[k])) r.wrong++;
      assert_int_equal(weft_free(slot[k], s[on[k]]), WEFT_OK);
    }
  for (unsigned i = 0; i < STREAMS; i++) assert_int_equal(weft_free(scratch[i], s[i]), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  r.races = tu_races(&env);
  if (r.races != 0) tu_print_races(&env);
#define DELTA(f) r.c.f = c1.f - c0.f
  DELTA(uses);
  DELTA(allocs);
  DELTA(frees);
  DELTA(waits_issued);
  DELTA(waits_skipped);
  DELTA(events_recorded);
  DELTA(late_waits);
  DELTA(ring_evictions);
#undef DELTA
  assert_true(weft__tracker_is_valid(&env.rt->tracker));
  tu_fini(&env);
  return r;
}

static void same_steps(unsigned lazy, unsigned ring) {
  for (unsigned seed = 1; seed <= seeds(); seed++) {
    run_t a = run_program(seed, lazy, ring, true), b = run_program(seed, lazy, ring, false);
    printf("%s records, seed %u: allocs %llu / %llu (fast %llu / %llu), frees %llu / %llu (fast %llu / %llu), "
           "cached %llu / %llu, waits %llu / %llu, events %llu / %llu, ring evictions %llu / %llu\n",
           lazy ? "lazy" : "eager", seed, (unsigned long long)a.c.allocs, (unsigned long long)b.c.allocs,
           (unsigned long long)a.fast_allocs, (unsigned long long)b.fast_allocs, (unsigned long long)a.c.frees,
           (unsigned long long)b.c.frees, (unsigned long long)a.fast_frees, (unsigned long long)b.fast_frees,
           (unsigned long long)a.cached, (unsigned long long)b.cached, (unsigned long long)a.c.waits_issued,
           (unsigned long long)b.c.waits_issued, (unsigned long long)a.c.events_recorded,
           (unsigned long long)b.c.events_recorded, (unsigned long long)a.c.ring_evictions,
           (unsigned long long)b.c.ring_evictions);
    assert_int_equal(a.races, 0);
    assert_int_equal(b.races, 0);
    assert_int_equal(a.wrong, 0);
    assert_int_equal(b.wrong, 0);
    /* The precondition: the fast path handed out most of the allocations the caches could serve
     * and took most frees on the streams (a quarter of each at least); without it, none. */
    assert_true(a.fast_allocs * 4 >= a.ops_alloc);
    assert_true(a.fast_frees * 4 >= a.ops_free);
    assert_int_equal(b.fast_allocs, 0);
    assert_int_equal(b.fast_frees, 0);
    assert_int_equal(a.c.allocs, b.c.allocs);
    assert_int_equal(a.c.frees, b.c.frees);
    assert_int_equal(a.cached, b.cached);
    assert_int_equal(a.c.uses, b.c.uses);
    assert_int_equal(a.c.waits_issued, b.c.waits_issued);
    assert_int_equal(a.c.waits_skipped, b.c.waits_skipped);
    assert_int_equal(a.c.events_recorded, b.c.events_recorded);
    assert_int_equal(a.c.late_waits, b.c.late_waits);
    assert_int_equal(a.c.ring_evictions, b.c.ring_evictions);
    assert_true(a.c.waits_issued > 0); /* frees and reads on other streams: edges to compare */
    if (ring != 0) assert_true(a.c.ring_evictions > 0); /* small rings: waits served by newer events */
  }
}

static void test_programs_take_the_same_steps_lazy(void **state) {
  (void)state;
  same_steps(1, 0);
}
static void test_programs_take_the_same_steps_eager(void **state) {
  (void)state;
  same_steps(0, 0);
}
static void test_programs_take_the_same_steps_small_rings(void **state) {
  (void)state;
  same_steps(1, 4);
}

/* ---- a capture begun outside weft ------------------------------------------------------------- */

/* An exposed stream with a block in its cache; code outside weft begins a capture on its handle:
 * the next weft_alloc of that size is inside the capture (a graph's memory), not the cached
 * block, and the block stays cached; after the capture the cache serves it again. */
static void foreign_capture(bool fast) {
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  tu_env_t env;
  fresh(&env, 2, weft_options_default().lazy_records, 0, fast);
  weft_stream_t *s = tu_stream(&env, 0);
  CUstream raw = weft_stream_raw(s);
  weft_block_t a, g, b;
  CUdeviceptr pa, pg, pb;
  assert_int_equal(weft_alloc(env.rt, N * 4, s, "a", &a), WEFT_OK);
  assert_int_equal(weft_block_ptr(a, &pa), WEFT_OK);
  assert_int_equal(weft_free(a, s), WEFT_OK);
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  assert_int_equal(c.cached_blocks, 1);
  uint64_t t0 = fast_takes(env.rt);
  assert_int_equal(d->cuStreamBeginCapture(raw, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(weft_alloc(env.rt, N * 4, s, "g", &g), WEFT_OK);
  assert_int_equal(weft_block_ptr(g, &pg), WEFT_OK);
  assert_true(pg != pa);
  assert_int_equal(fast_takes(env.rt), t0);
  assert_int_equal(tu_fill(&env, s, g, N, 3), WEFT_OK);
  assert_int_equal(weft_free(g, s), WEFT_OK);
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  assert_int_equal(c.cached_blocks, 1);
  CUgraph graph;
  assert_int_equal(d->cuStreamEndCapture(raw, &graph), CUDA_SUCCESS);
  assert_int_equal(d->cuGraphDestroy(graph), CUDA_SUCCESS);
  /* The next call meets the end (the general path: weft still knew the capture), and the one
   * after it is the fast path's again. */
  assert_int_equal(weft_alloc(env.rt, N * 4, s, "b", &b), WEFT_OK);
  assert_int_equal(weft_block_ptr(b, &pb), WEFT_OK);
  assert_int_equal(pb, pa);
  assert_int_equal(fast_takes(env.rt), t0);
  assert_int_equal(weft_free(b, s), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, N * 4, s, "b", &b), WEFT_OK);
  assert_int_equal(weft_block_ptr(b, &pb), WEFT_OK);
  assert_int_equal(pb, pa);
  assert_int_equal(fast_takes(env.rt) - t0, fast ? 1 : 0);
  assert_int_equal(weft_free(b, s), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
  tu_fini(&env);
}

static void test_a_capture_begun_outside_weft_is_met(void **state) {
  (void)state;
  foreign_capture(true);
  foreign_capture(false);
}

/* ---- refused calls ---------------------------------------------------------------------------- */

/* The stream still allocates from its cache and frees into it. */
static void still_usable(const tu_env_t *env, weft_stream_t *s) {
  weft_block_t b;
  assert_int_equal(weft_alloc(env->rt, 4096, s, "again", &b), WEFT_OK);
  assert_int_equal(tu_fill(env, s, b, 16, 9), WEFT_OK);
  assert_int_equal(weft_free(b, s), WEFT_OK);
}

/* Every refused weft_alloc and weft_free on a fresh runtime, with the fast path on or off; out[i]
 * gets the i-th call's status and message. Returns how many calls it made. On the pool stream s
 * a failed capture question is not one (s is not exposed: no question is asked), so the calls
 * fail on the exposed stream s1 only. */
static size_t refusals(bool fast, refusal_t *out) {
  tu_env_t env;
  fresh(&env, 2, weft_options_default().lazy_records, 0, fast);
  weft_stream_t *s = tu_stream(&env, 0), *s1 = tu_stream(&env, 1);
  assert_non_null(weft_stream_raw(s1)); /* exposed */
  size_t k = 0;
  weft_block_t a, b, stale, none = {0};
  for (int i = 0; i < 2; i++) {
    weft_stream_t *on = i == 0 ? s : s1;
    still_usable(&env, on); /* a block of 4096 bytes in on's cache */
    out[k++] = refusal(weft_alloc(env.rt, 0, on, "zero", &a));
    out[k++] = refusal(weft_alloc(env.rt, 4096, on, "null out", NULL));
    out[k++] = refusal(weft_alloc(env.rt, (size_t)1 << 50, on, "huge", &a));
    out[k++] = refusal(weft_alloc(NULL, 4096, on, "no runtime", &a));
    out[k++] = refusal(weft_alloc(env.rt, 4096, NULL, "no stream", &a));
    still_usable(&env, on);
    /* A double free, and a free of a handle whose record the cache handed out again. */
    assert_int_equal(weft_alloc(env.rt, 4096, on, "a", &a), WEFT_OK);
    assert_int_equal(weft_free(a, on), WEFT_OK);
    out[k++] = refusal(weft_free(a, on));
    stale = a;
    assert_int_equal(weft_alloc(env.rt, 4096, on, "b", &b), WEFT_OK); /* a's record again */
    out[k++] = refusal(weft_free(stale, on));
    out[k++] = refusal(weft_free(none, on));
    out[k++] = refusal(weft_free(b, NULL));
    assert_int_equal(weft_free(b, on), WEFT_OK);
    still_usable(&env, on);
    /* The driver's capture question fails (the simulator's fault injection): the call returns
     * what the general path returns, nothing changed, and the next works. */
    if (env.sim != NULL && on == s1) {
      assert_int_equal(weft_alloc(env.rt, 4096, on, "b", &b), WEFT_OK);
      assert_int_equal((env.sim->fail)("cuStreamIsCapturing:1:CUDA_ERROR_UNKNOWN"), 0);
      out[k++] = refusal(weft_alloc(env.rt, 4096, on, "faulted", &a));
      assert_int_equal((env.sim->fail)("cuStreamIsCapturing:1:CUDA_ERROR_UNKNOWN"), 0);
      out[k++] = refusal(weft_free(b, on));
      assert_int_equal((env.sim->fail)(""), 0);
      assert_int_equal(weft_free(b, on), WEFT_OK);
      still_usable(&env, on);
    }
  }
  assert_int_equal(weft_alloc(env.rt, 4096, s, "kept", &a), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
  weft_runtime_t *rt = env.rt;
  tu_fini(&env);
  /* A released runtime's stream and block. */
  out[k++] = refusal(weft_alloc(rt, 4096, s, "released", &b));
  out[k++] = refusal(weft_free(a, s));
  return k;
}

static void test_refused_calls_are_the_general_paths(void **state) {
  (void)state;
  refusal_t fast[32], slow[32];
  size_t n = refusals(true, fast);
  assert_int_equal(refusals(false, slow), n);
  same_refusals(fast, slow, n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_programs_take_the_same_steps_lazy),
      cmocka_unit_test(test_programs_take_the_same_steps_eager),
      cmocka_unit_test(test_programs_take_the_same_steps_small_rings),
      cmocka_unit_test(test_a_capture_begun_outside_weft_is_met),
      cmocka_unit_test(test_refused_calls_are_the_general_paths),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
