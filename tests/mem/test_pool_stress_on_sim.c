/* weft's pool under the real tracker on the simulator: 8 streams, random sizes, writes, reads and
 * frees on random streams through weft_alloc / weft_free, the pool reusing memory across streams
 * as soon as the tracker allows. The race oracle must find nothing, every read must see the
 * value last written, and a pool with little room must still serve (waiting instead of growing).
 * The seed is printed on failure; WEFT_TEST_SEED and WEFT_TEST_OPS override. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sim/weft_sim.h"
#include "streams/tracker.h"
#include "weft/weft.h"

enum { STREAMS = 8, SLOTS = 64, READS = 512, PEEK = 16 };

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

typedef struct pending_read {
  unsigned char got[PEEK];
  unsigned char want;
} pending_read_t;

static uint64_t run(uint64_t seed, long ops, uint64_t max_bytes, bool no_waits) {
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  assert_non_null(sim);
  sim->seed(seed);
  sim->reset_races();
  weft_options_t o = weft_options_default();
  o.memory = WEFT_MEMORY_DIRECT;
  o.stream_count = STREAMS;
  weft_runtime_t *rt = NULL;
  assert_int_equal(weft_runtime_get(0, &o, &rt), WEFT_OK);
  weft_resource_t *bottom = weft_runtime_resource(rt), *pool = NULL;
  weft_pool_options_t po = weft_pool_options_default();
  po.chunk_bytes = 4 << 20;
  po.max_bytes = max_bytes;
  assert_int_equal(weft_pool_create(rt, bottom, &po, &pool), WEFT_OK);
  assert_int_equal(weft_runtime_set_resource(rt, pool), WEFT_OK);
  weft__runtime_tracker(rt)->no_waits = no_waits;
  weft_stream_t *s[STREAMS];
  for (unsigned i = 0; i < STREAMS; i++) assert_int_equal(weft_stream_get(rt, i, &s[i]), WEFT_OK);

  weft_block_t blk[SLOTS];
  size_t size[SLOTS];
  unsigned char val[SLOTS];
  memset(blk, 0, sizeof blk);
  static pending_read_t reads[READS];
  unsigned nreads = 0;
  uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
  for (long op = 0; op < ops; op++) {
    unsigned k = (unsigned)(rng(&r) % SLOTS);
    weft_stream_t *st = s[rng(&r) % STREAMS];
    if (blk[k].rec == NULL) {
      unsigned lg = 8 + (unsigned)(rng(&r) % 11); /* 256 B .. 512 KiB */
      size[k] = (size_t)((1u << lg) + rng(&r) % (1u << lg));
      weft_status_t stt = weft_alloc(rt, size[k], st, "stress", &blk[k]);
      if (stt != WEFT_OK && no_waits) continue;
      if (stt != WEFT_OK) fail_msg("seed %llu op %ld: weft_alloc: %s", (unsigned long long)seed, op, weft_last_error());
      val[k] = (unsigned char)rng(&r);
      assert_int_equal(weft_memset8(st, blk[k], 0, val[k], size[k]), WEFT_OK);
      continue;
    }
    switch (rng(&r) % 4) {
      case 0:
        assert_int_equal(weft_free(blk[k], st), WEFT_OK);
        blk[k].rec = NULL;
        break;
      case 1:
        val[k] = (unsigned char)rng(&r);
        assert_int_equal(weft_memset8(st, blk[k], 0, val[k], size[k]), WEFT_OK);
        break;
      default: {
        pending_read_t *pr = &reads[nreads++];
        pr->want = val[k];
        size_t off = (size_t)(rng(&r) % (size[k] - (size[k] < PEEK ? size[k] : PEEK) + 1));
        size_t n = size[k] < PEEK ? size[k] : PEEK;
        memset(pr->got, pr->want, PEEK);
        assert_int_equal(weft_copy_from_block(st, pr->got, blk[k], off, n), WEFT_OK);
        break;
      }
    }
    if (nreads == READS || op == ops - 1) {
      assert_int_equal(weft_runtime_synchronize(rt), WEFT_OK);
      for (unsigned i = 0; i < nreads; i++)
        for (unsigned j = 0; j < PEEK; j++)
          if (!no_waits && reads[i].got[j] != reads[i].want)
            fail_msg("seed %llu: a read saw %u, not %u", (unsigned long long)seed, reads[i].got[j], reads[i].want);
      nreads = 0;
    }
  }
  for (unsigned k = 0; k < SLOTS; k++)
    if (blk[k].rec) assert_int_equal(weft_free(blk[k], s[k % STREAMS]), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt), WEFT_OK);
  uint64_t races = sim->race_count();
  if (no_waits) {
    sim->reset_races();
    weft__runtime_tracker(rt)->no_waits = false;
    assert_int_equal(weft_runtime_set_resource(rt, bottom), WEFT_OK);
    weft_resource_destroy(pool);
    assert_int_equal(weft_runtime_release(rt), WEFT_OK);
    return races;
  }
  if (races != 0) {
    sim->print_report();
    fail_msg("seed %llu: %llu races", (unsigned long long)seed, (unsigned long long)races);
  }
  weft_resource_stats_t stp;
  weft_resource_stats(pool, &stp);
  print_message("seed %llu: %ld ops, peak live %.1f MiB, peak reserved %.1f MiB\n", (unsigned long long)seed, ops,
                stp.live_peak / 1048576.0, stp.reserved_peak / 1048576.0);
  assert_int_equal(stp.live_bytes, 0);
  if (max_bytes) assert_true(stp.reserved_peak <= max_bytes);
  assert_int_equal(weft_runtime_set_resource(rt, bottom), WEFT_OK);
  weft_resource_destroy(pool);
  assert_int_equal(weft_runtime_release(rt), WEFT_OK);
  return 0;
}

static long ops_from_env(long def) {
  const char *e = getenv("WEFT_TEST_OPS");
  return e ? atol(e) : def;
}

static void test_random_streams_never_race_on_reused_memory(void **state) {
  (void)state;
  const char *e = getenv("WEFT_TEST_SEED");
  if (e) {
    run(strtoull(e, NULL, 0), ops_from_env(20000), 0, false);
    return;
  }
  for (uint64_t seed = 1; seed <= 3; seed++) run(seed, ops_from_env(20000), 0, false);
}

static void test_small_pool_waits_instead_of_growing_and_never_races(void **state) {
  (void)state;
  for (uint64_t seed = 11; seed <= 12; seed++) run(seed, ops_from_env(10000), 12 << 20, false);
}

/* Positive control: the same workload with the tracker issuing no waits at all races. */
static void test_without_waits_the_oracle_reports_races(void **state) {
  (void)state;
  assert_true(run(5, 5000, 0, true) > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_streams_never_race_on_reused_memory),
      cmocka_unit_test(test_small_pool_waits_instead_of_growing_and_never_races),
      cmocka_unit_test(test_without_waits_the_oracle_reports_races),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
