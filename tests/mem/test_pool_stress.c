/* weft's pool under the real runtime and tracker, on the simulator and on a GPU: 8 streams,
 * random sizes from 256 B to 64 MiB, writes (memsets, fill and combine kernels, block copies),
 * reads and frees on random streams through weft_alloc / weft_free, the pool reusing memory
 * across streams as soon as the tracker allows. Every read must see the value last written (on
 * a GPU the test kernels spin 50 us before writing, so a missing dependency shows as wrong data),
 * the simulator's race oracle must find nothing, and peak reserved / peak live stays <= 1.15.
 * A pool with little room must still serve (waiting instead of growing). The same binary runs
 * as test_pool_stress_lazy with WEFT_SIM_LAZY=1: a simulated device far behind the host, so that
 * frees stay pending as long as on a GPU.
 *
 * Each block is written and read in two windows, its first and its last WINDOW bytes (the whole
 * block when smaller): on the simulator device memory is host memory, and writing 64 MiB per
 * operation would take minutes. Reads copy PEEK bytes at a random place of a window into a
 * per-stream readback block (a tracked read on the reading stream, no host sync per read); the
 * readback blocks go to the host in batches.
 *
 * Simulator-only (skipped inside the tests on a GPU, which checks by data instead): the race
 * counts. The positive control (a tracker issuing no waits) must fail the checks on both: races
 * on the simulator, wrong data on a GPU.
 * WEFT_TEST_SEED and WEFT_TEST_OPS override the seeds and the operation counts; a failure names
 * the seed and the operation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/runtime/runtime.h"
#include "tests/util/testutil.h"

enum {
  STREAMS = 8,
  MAX_SLOTS = 256,
  WINDOW = 16 << 10, /* bytes written and checked at each end of a block */
  PEEK = 64,         /* bytes of one read */
  READS = 128,       /* reads per stream per batch: a batch ends in a synchronisation, which also
                        bounds how far the host runs ahead of the device */
};

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* One workload. */
typedef struct config {
  uint64_t seed;
  long ops;
  unsigned slots;        /* blocks live at most at once */
  unsigned max_lg;       /* sizes are 2^8 .. 2^(max_lg+1) (log-uniform), at most 64 MiB */
  uint64_t chunk_bytes;  /* the pool's chunk */
  uint64_t max_bytes;    /* the pool's limit; 0 none */
  bool no_waits;         /* positive control: the tracker issues no waits */
} config_t;

typedef struct slot {
  weft_block_t b;
  size_t size;  /* bytes requested, a multiple of 4 */
  size_t win;   /* bytes of each window: min(WINDOW, size) */
  unsigned val; /* the word both windows hold once the last write is done */
} slot_t;

typedef struct pending_read {
  unsigned want;
  long op;
  unsigned slot;
} pending_read_t;

/* The state of one run. */
typedef struct stress {
  tu_env_t env;
  weft_resource_t *bottom, *pool;   /* the runtime's resource and the pool over it */
  const config_t *cfg;
  weft_stream_t *s[STREAMS];
  slot_t slot[MAX_SLOTS];
  CUdeviceptr readback_mem[STREAMS];
  weft_block_t readback[STREAMS];   /* READS * PEEK bytes per stream, wrapped (not from the pool) */
  pending_read_t pending[STREAMS][READS];
  unsigned npending[STREAMS];
  unsigned host[STREAMS][READS * PEEK / 4];
  uint64_t r;                       /* the workload's random state */
  long allocs, frees, writes, reads_checked;
  long mismatches;                  /* wrong words seen (counted, not failed, in the positive control) */
} stress_t;

static stress_t S;

static unsigned grid_for(unsigned n) { return (n + 255) / 256 < 64 ? (n + 255) / 256 : 64; }

static CUdeviceptr ptr_of(weft_block_t b) {
  CUdeviceptr p = 0;
  assert_int_equal(weft_block_ptr(b, &p), WEFT_OK);
  return p;
}

/* weft_test_fill over [off, off+bytes) of b: one tracked write of b. */
static void fill(weft_stream_t *s, weft_block_t b, size_t off, size_t bytes, unsigned value) {
  CUdeviceptr p = ptr_of(b) + off;
  unsigned n = (unsigned)(bytes / 4), spin = S.env.spin_ns;
  void *params[4] = {&p, &n, &value, &spin};
  weft_launch_t l = {.func = S.env.fill, .grid = {grid_for(n)}, .block = {256}, .params = params};
  weft_access_t a = {b, WEFT_WRITE};
  assert_int_equal(weft_launch(s, &l, &a, 1), WEFT_OK);
}

/* weft_test_combine: out[off..] = salt + 7 * in[in_off..] over `bytes`; writes out, reads in. */
static void combine(weft_stream_t *s, weft_block_t out, size_t off, weft_block_t in, size_t in_off, size_t bytes,
                    unsigned salt) {
  CUdeviceptr o = ptr_of(out) + off, i = ptr_of(in) + in_off, none = 0;
  unsigned n = (unsigned)(bytes / 4), spin = S.env.spin_ns;
  void *params[8] = {&o, &none, &i, &none, &none, &n, &salt, &spin};
  weft_launch_t l = {.func = S.env.combine, .grid = {grid_for(n)}, .block = {256}, .params = params};
  weft_access_t a[2] = {{out, WEFT_WRITE}, {in, WEFT_READ}};
  assert_int_equal(weft_launch(s, &l, a, 2), WEFT_OK);
}

/* A random live slot other than k whose windows are at least as large as k's, or -1. */
static int source_for(unsigned k) {
  unsigned j = (unsigned)(rng(&S.r) % S.cfg->slots);
  for (unsigned t = 0; t < S.cfg->slots; t++, j = (j + 1) % S.cfg->slots)
    if (j != k && S.slot[j].b.rec != NULL && S.slot[j].win >= S.slot[k].win) return (int)j;
  return -1;
}

/* Writes both windows of slot k on s with one of four kinds of work, chosen by `how`. */
static void write_slot(unsigned k, weft_stream_t *s, unsigned how) {
  slot_t *d = &S.slot[k];
  size_t tail = d->size - d->win;
  int j = how >= 2 ? source_for(k) : -1;
  if (how >= 2 && j < 0) how = how - 2; /* no suitable source: a memset or a fill instead */
  unsigned v = (unsigned)rng(&S.r);
  switch (how) {
    case 0:
      assert_int_equal(weft_memset32(s, d->b, 0, v, d->win), WEFT_OK);
      if (tail) assert_int_equal(weft_memset32(s, d->b, tail, v, d->win), WEFT_OK);
      break;
    case 1:
      fill(s, d->b, 0, d->win, v);
      if (tail) fill(s, d->b, tail, d->win, v);
      break;
    case 2: {
      slot_t *src = &S.slot[j];
      combine(s, d->b, 0, src->b, 0, d->win, v);
      if (tail) combine(s, d->b, tail, src->b, src->size - d->win, d->win, v);
      v += 7u * src->val;
      break;
    }
    default: {
      slot_t *src = &S.slot[j];
      assert_int_equal(weft_copy_block(s, d->b, 0, src->b, 0, d->win), WEFT_OK);
      if (tail) assert_int_equal(weft_copy_block(s, d->b, tail, src->b, src->size - d->win, d->win), WEFT_OK);
      v = src->val;
      break;
    }
  }
  d->val = v;
  S.writes++;
}

/* Copies every stream's pending reads to the host, waits, and checks them. */
static void flush_reads(void) {
  for (unsigned t = 0; t < STREAMS; t++) {
    if (S.npending[t] == 0) continue;
    for (unsigned i = 0; i < S.npending[t]; i++)
      for (unsigned w = 0; w < PEEK / 4; w++) S.host[t][i * (PEEK / 4) + w] = ~S.pending[t][i].want;
    assert_int_equal(weft_copy_from_block(S.s[t], S.host[t], S.readback[t], 0, (size_t)S.npending[t] * PEEK), WEFT_OK);
  }
  assert_int_equal(weft_runtime_synchronize(S.env.rt), WEFT_OK);
  for (unsigned t = 0; t < STREAMS; t++) {
    for (unsigned i = 0; i < S.npending[t]; i++) {
      const pending_read_t *pr = &S.pending[t][i];
      for (unsigned w = 0; w < PEEK / 4; w++) {
        unsigned got = S.host[t][i * (PEEK / 4) + w];
        if (got == pr->want) continue;
        S.mismatches++;
        if (!S.cfg->no_waits)
          fail_msg("seed %llu op %ld: a read of slot %u on stream %u saw 0x%08x, not 0x%08x",
                   (unsigned long long)S.cfg->seed, pr->op, pr->slot, t, got, pr->want);
      }
      S.reads_checked++;
    }
    /* A read that never happens must not find the right value left over from this batch. */
    if (S.npending[t] != 0) assert_int_equal(weft_memset32(S.s[t], S.readback[t], 0, 0xEEEEEEEEu, READS * PEEK), WEFT_OK);
    S.npending[t] = 0;
  }
}

/* A tracked read of PEEK bytes at a random place of one of slot k's windows, on s. */
static void read_slot(unsigned k, unsigned t, long op) {
  slot_t *d = &S.slot[k];
  size_t base = rng(&S.r) % 2 ? d->size - d->win : 0;
  size_t off = base + 4 * (size_t)(rng(&S.r) % ((d->win - PEEK) / 4 + 1));
  unsigned i = S.npending[t]++;
  S.pending[t][i] = (pending_read_t){d->val, op, k};
  assert_int_equal(weft_copy_block(S.s[t], S.readback[t], (size_t)i * PEEK, d->b, off, PEEK), WEFT_OK);
  if (S.npending[t] == READS) flush_reads();
}

static size_t random_size(unsigned max_lg) {
  unsigned lg = 8 + (unsigned)(rng(&S.r) % (max_lg - 7));
  size_t size = (size_t)((1ull << lg) + rng(&S.r) % (1ull << lg));
  if (size > (64u << 20)) size = 64u << 20;
  return size & ~(size_t)3;
}

/* Runs one workload; returns the races the simulator's oracle found (0 on a GPU). Fills *stats
 * with the pool's statistics at the end and *mismatches with the wrong words reads saw. */
static uint64_t run(const config_t *cfg, weft_resource_stats_t *stats, long *mismatches) {
  memset(&S, 0, sizeof S);
  S.cfg = cfg;
  assert_true(cfg->slots <= MAX_SLOTS);
  weft_options_t o = weft_options_default();
  o.memory = WEFT_MEMORY_ASYNC; /* the pool below sits on the driver's pool, as in a default runtime */
  o.stream_count = STREAMS;
  o.stream_cache_bytes = 0; /* the pool's own reuse is under test, not the stream cache's */
  assert_int_equal(tu_init(&S.env, &o), 0);
  if (S.env.sim) {
    S.env.sim->seed(cfg->seed);
    S.env.sim->reset_races();
  }
  const weft__driver_t *drv;
  assert_int_equal(weft__driver_get(&drv), WEFT_OK);
  weft_runtime_t *rt = S.env.rt;
  weft_resource_t *bottom = S.bottom = weft_runtime_resource(rt), *pool = NULL;
  weft_pool_options_t po = weft_pool_options_default();
  po.chunk_bytes = cfg->chunk_bytes;
  po.max_bytes = cfg->max_bytes;
  assert_int_equal(weft_pool_create(rt, bottom, &po, &pool), WEFT_OK);
  S.pool = pool;
  assert_int_equal(weft_runtime_set_resource(rt, pool), WEFT_OK);
  rt->tracker.no_waits = cfg->no_waits;
  for (unsigned t = 0; t < STREAMS; t++) {
    assert_int_equal(weft_stream_get(rt, t, &S.s[t]), WEFT_OK);
    assert_int_equal(drv->cuMemAlloc(&S.readback_mem[t], READS * PEEK), CUDA_SUCCESS);
    assert_int_equal(weft_block_wrap(rt, S.readback_mem[t], READS * PEEK, "readback", &S.readback[t]), WEFT_OK);
  }

  S.r = cfg->seed * 0x9E3779B97F4A7C15ull + 1;
  for (long op = 0; op < cfg->ops; op++) {
    unsigned k = (unsigned)(rng(&S.r) % cfg->slots), t = (unsigned)(rng(&S.r) % STREAMS);
    slot_t *d = &S.slot[k];
    if (d->b.rec == NULL) {
      d->size = random_size(cfg->max_lg);
      d->win = d->size < WINDOW ? d->size : WINDOW;
      weft_status_t st = weft_alloc(rt, d->size, S.s[t], "stress", &d->b);
      if (st != WEFT_OK && cfg->no_waits) continue;
      if (st != WEFT_OK)
        fail_msg("seed %llu op %ld: weft_alloc(%zu): %s", (unsigned long long)cfg->seed, op, d->size, weft_last_error());
      S.allocs++;
      /* The first write comes from any stream: the tracker orders it after the allocation. */
      write_slot(k, S.s[rng(&S.r) % STREAMS], (unsigned)(rng(&S.r) % 2));
      continue;
    }
    unsigned what = (unsigned)(rng(&S.r) % 8);
    if (what == 0) {
      assert_int_equal(weft_free(d->b, S.s[t]), WEFT_OK);
      d->b.rec = NULL;
      S.frees++;
    } else if (what <= 4) {
      write_slot(k, S.s[t], what - 1);
    } else {
      read_slot(k, t, op);
    }
  }
  flush_reads();
  for (unsigned k = 0; k < cfg->slots; k++)
    if (S.slot[k].b.rec) assert_int_equal(weft_free(S.slot[k].b, S.s[k % STREAMS]), WEFT_OK);
  for (unsigned t = 0; t < STREAMS; t++) assert_int_equal(weft_free(S.readback[t], S.s[t]), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt), WEFT_OK);
  for (unsigned t = 0; t < STREAMS; t++) assert_int_equal(drv->cuMemFree(S.readback_mem[t]), CUDA_SUCCESS);
  uint64_t races = tu_races(&S.env);
  if (races != 0 && !cfg->no_waits) {
    tu_print_races(&S.env);
    fail_msg("seed %llu: %llu races", (unsigned long long)cfg->seed, (unsigned long long)races);
  }
  tu_reset_races(&S.env);
  rt->tracker.no_waits = false;
  *mismatches = S.mismatches;
  weft_resource_stats(pool, stats);
  if (!cfg->no_waits) {
    print_message("seed %llu: %ld ops (%ld allocs, %ld frees, %ld writes, %ld reads checked), peak live %.1f MiB, "
                  "peak reserved %.1f MiB\n",
                  (unsigned long long)cfg->seed, cfg->ops, S.allocs, S.frees, S.writes, S.reads_checked,
                  stats->live_peak / 1048576.0, stats->reserved_peak / 1048576.0);
    assert_int_equal(stats->live_bytes, 0);
    assert_int_equal(stats->allocs, S.allocs);
    assert_int_equal(stats->frees, S.allocs);
    assert_true(S.reads_checked > 0);
  }
  assert_int_equal(weft_runtime_set_resource(rt, bottom), WEFT_OK);
  weft_resource_destroy(pool);
  tu_fini(&S.env);
  return races;
}

/* After a failure: gives the runtime back so that the next test gets a fresh one (a pool still
 * holding live blocks is left behind). */
static int teardown(void **state) {
  (void)state;
  if (S.env.rt != NULL && S.pool != NULL && weft_runtime_set_resource(S.env.rt, S.bottom) == WEFT_OK)
    weft_resource_destroy(S.pool);
  if (S.env.rt != NULL) tu_fini(&S.env);
  memset(&S, 0, sizeof S);
  return 0;
}

static long ops_from_env(long def) {
  const char *e = getenv("WEFT_TEST_OPS");
  return e ? atol(e) : def;
}

/* Issue 5's stress test: >= 100,000 operations over several seeds. */
static void test_random_streams_never_race_on_reused_memory(void **state) {
  (void)state;
  config_t c = {.ops = ops_from_env(25000), .slots = 256, .max_lg = 25, .chunk_bytes = 64ull << 20};
  const char *e = getenv("WEFT_TEST_SEED");
  uint64_t first = e ? strtoull(e, NULL, 0) : 1, last = e ? first : 4;
  for (c.seed = first; c.seed <= last; c.seed++) {
    weft_resource_stats_t st;
    long mismatches;
    assert_int_equal(run(&c, &st, &mismatches), 0);
    assert_int_equal(mismatches, 0);
    double ratio = (double)st.reserved_peak / (double)st.live_peak;
    print_message("seed %llu: peak reserved / peak live %.3f\n", (unsigned long long)c.seed, ratio);
    if (ratio > 1.15) fail_msg("seed %llu: peak reserved / peak live %.3f > 1.15", (unsigned long long)c.seed, ratio);
  }
}

/* A pool capped at 12 MiB must serve the workload by waiting for frees, never growing past the
 * cap. The workload's live set is at most 32 slots x 256 KiB = 8 MiB, two thirds of the cap, so
 * an OUT_OF_MEMORY can only come from the pool failing to reuse memory. (With 64 slots, a worst
 * case of 16 MiB, it legitimately failed now and then: enough bytes free, none contiguous.) The
 * simulator, being cheap, runs 20 seeds; WEFT_TEST_SMALL_SEEDS=N runs seeds 11..N for sweeps. */
static void test_small_pool_waits_instead_of_growing_and_never_races(void **state) {
  (void)state;
  config_t c = {.ops = ops_from_env(10000), .slots = 32, .max_lg = 18, .chunk_bytes = 4 << 20, .max_bytes = 12 << 20};
  const char *sweep = getenv("WEFT_TEST_SMALL_SEEDS");
  uint64_t last = sweep ? strtoull(sweep, NULL, 0) : weft_sim_api(weft_driver_symbol) != NULL ? 30 : 12;
  for (c.seed = 11; c.seed <= last; c.seed++) {
    weft_resource_stats_t st;
    long mismatches;
    assert_int_equal(run(&c, &st, &mismatches), 0);
    assert_int_equal(mismatches, 0);
    assert_true(st.reserved_peak <= c.max_bytes);
  }
}

/* Positive control: the same workload with the tracker issuing no waits fails the checks. On the
 * simulator the oracle reports races; on a GPU the reads see wrong data (a read on one stream
 * overtakes a kernel on another that spins before writing). Sizes stay below the pool's
 * dedicated-chunk threshold, so no memory goes back to the driver while unordered work runs. */
static void test_without_waits_the_checks_fail(void **state) {
  (void)state;
  config_t c = {.seed = 5, .ops = 5000, .slots = 64, .max_lg = 18, .chunk_bytes = 4 << 20, .no_waits = true};
  weft_resource_stats_t st;
  long mismatches;
  uint64_t races = run(&c, &st, &mismatches);
  print_message("without waits: %llu races, %ld wrong words read\n", (unsigned long long)races, mismatches);
  if (weft_sim_api(weft_driver_symbol) != NULL)
    assert_true(races > 0);
  else
    assert_true(mismatches > 0);
}

static int group_setup(void **state) {
  (void)state;
  if (weft_sim_api(weft_driver_symbol) == NULL)
    print_message("GPU: simulator-only checks skipped: race counts of the oracle (every read is checked by data "
                  "instead)\n");
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_random_streams_never_race_on_reused_memory, teardown),
      cmocka_unit_test_teardown(test_small_pool_waits_instead_of_growing_and_never_races, teardown),
      cmocka_unit_test_teardown(test_without_waits_the_checks_fail, teardown),
  };
  return cmocka_run_group_tests(tests, group_setup, NULL);
}
