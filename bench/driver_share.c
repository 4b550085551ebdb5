/* driver_share: where the host time of weft's hot calls goes on a GPU host, inside the driver
 * calls weft makes or in weft's own code (issue 17's goals that are not met: their bounds).
 *
 * The process's driver table (lib/core/driver.c) is patched so that cuEventRecord,
 * cuCtxGetCurrent, cuLaunchKernel, cuStreamWaitEvent and cuStreamIsCapturing (weft's capture
 * probe) run through timers (the time-stamp counter, converted to ns by the run's own
 * calibration) that sum the time spent inside each call. The series (names[] below) run
 * interleaved, REPS samples of N operations each:
 *   - weft's uses (begin + end, one write): on a stream others wait on (it records each use's
 *     event: the tracker table's "others wait on" rows), on a stream nobody waits on (it records
 *     nothing), and with one edge (two streams writing one block in turn); weft_launch of a
 *     one-block kernel on a stream nobody waits on; weft_alloc + weft_free of 1 MiB on a pool
 *     stream, an adopted raw stream and the adopted legacy stream (the last two are exposed:
 *     weft asks the driver about captures before each call, as for PyTorch's streams);
 *   - their raw baselines: cuEventRecord on a raw stream, cuStreamWaitEvent + cuEventRecord in a
 *     ping-pong of two raw streams, cuLaunchKernel;
 *   - raw records that take the record's cost apart: of weft's ring events on weft's stream (no
 *     weft code), of raw events on weft's stream, of the ring events of a weft stream nobody
 *     waited on, of raw events each waited on once, on a raw stream another stream once waited
 *     on, after a cuCtxGetCurrent, after 4 or 8 KiB of code, after a weft use;
 *   - 16 loads that miss the caches, chained (each address read from the last) or independent,
 *     alone and before a raw launch: what a miss costs after a driver call;
 *   - weft_launch taken apart: the same use (begin + end) with nothing inside, then the raw launch
 *     on the same stream's handle (weft's code all before the launch instead of around it), and
 *     4 or 8 KiB of code before a raw launch.
 * For each: ns per operation in all, inside each timed call, and the rest (weft's own code, plus
 * the timers' own cost, which the raw rows show).
 *   bazel build -c opt //bench:driver_share && bazel-bin/bench/driver_share [N] [REPS]
 * On the simulator (WEFT_DRIVER=sim) it runs as well: no performance numbers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

#include "bench/bench.h"
#include "examples/pipeline/pipeline_kernels.h"
#include "examples/pipeline/pipeline_kernels_sim.h"
#include "lib/core/driver.h"
#include "lib/runtime/runtime.h"
#include "weft/weft.h"

#define RING 64

static CUresult(CUDAAPI *real_record)(CUevent, CUstream);
static CUresult(CUDAAPI *real_ctx_get)(CUcontext *);
static CUresult(CUDAAPI *real_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      CUstream, void **, void **);
static CUresult(CUDAAPI *real_wait)(CUstream, CUevent, unsigned);
static CUresult(CUDAAPI *real_is_capturing)(CUstream, CUstreamCaptureStatus *);
static uint64_t record_ticks, record_calls, ctx_ticks, ctx_calls, launch_ticks, wait_ticks, wait_calls, probe_ticks,
    probe_calls;

static CUresult CUDAAPI timed_record(CUevent e, CUstream s) {
  uint64_t t0 = __rdtsc();
  CUresult r = real_record(e, s);
  record_ticks += __rdtsc() - t0;
  record_calls++;
  return r;
}

static CUresult CUDAAPI timed_ctx_get(CUcontext *c) {
  uint64_t t0 = __rdtsc();
  CUresult r = real_ctx_get(c);
  ctx_ticks += __rdtsc() - t0;
  ctx_calls++;
  return r;
}

static CUresult CUDAAPI timed_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                     unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
  uint64_t t0 = __rdtsc();
  CUresult r = real_launch(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
  launch_ticks += __rdtsc() - t0;
  return r;
}

static CUresult CUDAAPI timed_wait(CUstream s, CUevent e, unsigned flags) {
  uint64_t t0 = __rdtsc();
  CUresult r = real_wait(s, e, flags);
  wait_ticks += __rdtsc() - t0;
  wait_calls++;
  return r;
}

static CUresult CUDAAPI timed_is_capturing(CUstream s, CUstreamCaptureStatus *status) {
  uint64_t t0 = __rdtsc();
  CUresult r = real_is_capturing(s, status);
  probe_ticks += __rdtsc() - t0;
  probe_calls++;
  return r;
}


enum { RAW, EAGER, LAZY, LAUNCH, WEFT_LAUNCH, RAW_WEFT, RAW_CTX, RAW_CODE4, RAW_CODE8, RAW_AFTER_USE, RAW_ON_WEFT,
       RAW_OWN_RING, RAW_WAITED_EVENTS, RAW_WAITED_STREAM, EDGE, RAW_EDGE, ALLOC_POOL, ALLOC_ADOPTED, ALLOC_LEGACY,
       CHASE, CHASE_LAUNCH, SPREAD, SPREAD_LAUNCH, USE_THEN_LAUNCH, CODE4_LAUNCH, CODE8_LAUNCH, SERIES };
static const char *const names[SERIES] = {
    "raw cuEventRecord (baseline)", "weft use, a stream others wait on", "weft use, a stream nobody waits on",
    "raw cuLaunchKernel (baseline)", "weft_launch, a stream nobody waits on",
    "raw cuEventRecord of weft's ring events on weft's stream", "cuCtxGetCurrent, then raw cuEventRecord",
    "4 KiB of code run, then raw cuEventRecord", "8 KiB of code run, then raw cuEventRecord",
    "weft use on a stream nobody waits on, then raw cuEventRecord",
    "raw cuEventRecord of raw events on weft's stream", "raw cuEventRecord of the ring events of a weft stream nobody waited on",
    "raw cuEventRecord of raw events each waited on once by another stream",
    "raw cuEventRecord of raw events on a raw stream another stream once waited on",
    "weft use with one edge (write after write, 2 streams)", "raw cuStreamWaitEvent + cuEventRecord (ping-pong)",
    "weft_alloc + weft_free, 1 MiB, a pool stream", "weft_alloc + weft_free, 1 MiB, an adopted raw stream",
    "weft_alloc + weft_free, 1 MiB, the adopted legacy stream",
    "16 dependent loads (a pointer chase over 512 KiB) alone", "16 dependent loads, then raw cuLaunchKernel",
    "16 independent loads (of the same 512 KiB) alone", "16 independent loads, then raw cuLaunchKernel",
    "weft use on a stream nobody waits on, then raw cuLaunchKernel on that stream",
    "4 KiB of code run, then raw cuLaunchKernel", "8 KiB of code run, then raw cuLaunchKernel"};

/* A cyclic chain of 64-byte nodes over 512 KiB (more than a first-level cache, less than a
 * second-level one) in random order: each load's address is the previous
 * load's value (what a use's walk from its stream to its lane, events and blocks' histories
 * looks like to the processor); beside it the same count of loads whose addresses are all known
 * at once. What a cache miss costs after a driver call, chained or not. */
#define CHASE_LINES ((512u << 10) / 64u)
static void **g_chain; /* g_chain[i * 8]: the next node */
static void *g_at;
static unsigned g_spread_at;
static void chain_make(void) {
  g_chain = aligned_alloc(64, (size_t)CHASE_LINES * 64);
  unsigned *order = malloc(CHASE_LINES * sizeof *order);
  if (g_chain == NULL || order == NULL) exit(1);
  for (unsigned i = 0; i < CHASE_LINES; i++) order[i] = i;
  uint64_t x = 88172645463325252ull;
  for (unsigned i = CHASE_LINES - 1; i > 0; i--) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    unsigned j = (unsigned)(x % (i + 1)), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  for (unsigned i = 0; i < CHASE_LINES; i++) g_chain[(size_t)order[i] * 8] = &g_chain[(size_t)order[(i + 1) % CHASE_LINES] * 8];
  g_at = &g_chain[(size_t)order[0] * 8];
  free(order);
}
static __attribute__((noinline)) void chase16(void) {
  void *p = g_at;
  for (int i = 0; i < 16; i++) p = *(void *volatile *)p;
  g_at = p;
}
static __attribute__((noinline)) void spread16(void) {
  uintptr_t sum = 0;
  for (unsigned i = 0; i < 16; i++) {
    g_spread_at = (g_spread_at + 2531u) % CHASE_LINES; /* far apart, not a stride the prefetcher follows */
    sum += (uintptr_t)*(void *volatile *)&g_chain[(size_t)g_spread_at * 8];
  }
  __asm__ volatile("" ::"r"(sum));
}

/* Code run once with no data and no calls (eight-byte no-ops): 4 KiB, about the code of a
 * recording use (tools/host_instr.sh eager1: 58 lines), and 8 KiB. */
static __attribute__((noinline)) void code4(void) {
  __asm__ volatile(".rept 512\n\t.byte 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00\n\t.endr" ::: "memory");
}
static __attribute__((noinline)) void code8(void) {
  __asm__ volatile(".rept 1024\n\t.byte 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00\n\t.endr" ::: "memory");
}

int main(int argc, char **argv) {
  unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 100000, reps = argc > 2 ? (unsigned)atoi(argv[2]) : 15;
  if (n == 0 || reps == 0 || reps > 101) {
    fprintf(stderr, "usage: driver_share [N > 0] [REPS 1-101]\n");
    return 2;
  }
  weft_runtime_t *rt;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0; /* plain streams, as the raw one */
  BENCH_WEFT(weft_runtime_get(0, &o, &rt));
  const weft__driver_t *cd;
  BENCH_WEFT(weft__driver_get(&cd));
  weft__driver_t *d = (weft__driver_t *)cd; /* the process's table: writable storage */
  weft_stream_t *s[3];
  for (unsigned k = 0; k < 3; k++) BENCH_WEFT(weft_stream_get(rt, k, &s[k]));
  weft_block_t blk, own, late[2];
  BENCH_WEFT(weft_alloc(rt, 256, s[0], "share", &blk));
  BENCH_WEFT(weft_alloc(rt, 256, s[2], "share.own", &own));
  for (int i = 0; i < 2; i++) BENCH_WEFT(weft_alloc(rt, 256, s[0], "share.late", &late[i]));
  CUstream raw, raw2, other;
  CUevent ev[RING], ev2[RING], waited[RING];
  BENCH_CU(d->cuStreamCreateWithPriority(&raw, CU_STREAM_NON_BLOCKING, 0));
  BENCH_CU(d->cuStreamCreateWithPriority(&raw2, CU_STREAM_NON_BLOCKING, 0));
  BENCH_CU(d->cuStreamCreateWithPriority(&other, CU_STREAM_NON_BLOCKING, 0));
  for (int i = 0; i < RING; i++) {
    BENCH_CU(d->cuEventCreate(&ev2[i], CU_EVENT_DISABLE_TIMING));
    BENCH_CU(d->cuEventCreate(&waited[i], CU_EVENT_DISABLE_TIMING));
    BENCH_CU(d->cuEventRecord(waited[i], raw)); /* each waited on once by another stream */
    BENCH_CU(d->cuStreamWaitEvent(other, waited[i], 0));
  }
  { /* raw2: another stream waited on one event of it, once */
    CUevent e;
    BENCH_CU(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    BENCH_CU(d->cuEventRecord(e, raw2));
    BENCH_CU(d->cuStreamWaitEvent(other, e, 0));
    BENCH_CU(d->cuStreamSynchronize(other));
    BENCH_CU(d->cuEventDestroy(e));
  }
  /* The harness's kernel (examples/pipeline), one block of 256 threads, one LCG round. */
  pipeline_kernels_register_sim();
  CUmodule module;
  CUfunction fn;
  BENCH_CU(d->cuModuleLoadData(&module, pipeline_kernels_fatbin));
  BENCH_CU(d->cuModuleGetFunction(&fn, module, "pipeline_transform"));
  CUdeviceptr ptr;
  BENCH_WEFT(weft_block_ptr(own, &ptr));
  /* Streams weft adopts (exposed: code outside weft may begin captures on them, so weft asks
   * the driver before each use), as the PyTorch adapter does with PyTorch's streams. */
  CUstream raw3;
  BENCH_CU(d->cuStreamCreateWithPriority(&raw3, CU_STREAM_NON_BLOCKING, 0));
  weft_stream_t *adopted, *legacy;
  BENCH_WEFT(weft_stream_adopt(rt, raw3, &adopted));
  BENCH_WEFT(weft_stream_adopt(rt, CU_STREAM_LEGACY, &legacy));
  unsigned elems = 64, rounds = 1;
  void *params[] = {&ptr, &ptr, &elems, &rounds};
  weft_launch_t launch = {.func = fn, .grid = {1}, .block = {256}, .params = params};
  for (int i = 0; i < RING; i++) BENCH_CU(d->cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
  BENCH_WEFT(weft_runtime_synchronize(rt));

  chain_make();
  real_record = d->cuEventRecord;
  real_ctx_get = d->cuCtxGetCurrent;
  real_launch = d->cuLaunchKernel;
  real_wait = d->cuStreamWaitEvent;
  real_is_capturing = d->cuStreamIsCapturing;
  d->cuStreamWaitEvent = timed_wait;
  d->cuStreamIsCapturing = timed_is_capturing;
  d->cuEventRecord = timed_record;
  d->cuCtxGetCurrent = timed_ctx_get;
  d->cuLaunchKernel = timed_launch;

  /* The time-stamp counter's ns, from this run. */
  uint64_t c0 = __rdtsc(), n0 = bench_now_ns();
  while (bench_now_ns() - n0 < 200000000u) {
  }
  double ns_per_tick = (double)(bench_now_ns() - n0) / (double)(__rdtsc() - c0);

  static double v[SERIES][9][101];
  for (unsigned rep = 0; rep < reps + 1; rep++) { /* rep 0 warms up */
    for (unsigned k = 0; k < SERIES; k++) {
      if (k == EAGER || k == RAW_WEFT) { /* s[1] waits for an older use of s[0]: s[0] records each use (bench_tracker.c keep_eager) */
        weft_access_t w0 = {late[0], WEFT_WRITE}, w1 = {late[1], WEFT_WRITE}, r0 = {late[0], WEFT_READ};
        BENCH_WEFT(weft_use_begin(s[0], &w0, 1));
        BENCH_WEFT(weft_use_end(s[0], &w0, 1));
        BENCH_WEFT(weft_use_begin(s[0], &w1, 1));
        BENCH_WEFT(weft_use_end(s[0], &w1, 1));
        BENCH_WEFT(weft_use_begin(s[1], &r0, 1));
        BENCH_WEFT(weft_use_end(s[1], &r0, 1));
      }
      weft_access_t a = {k == EAGER ? blk : own, k == WEFT_LAUNCH || k == USE_THEN_LAUNCH ? WEFT_READ_WRITE : WEFT_WRITE};
      weft_stream_t *on = s[k == EAGER ? 0 : 2];
      record_ticks = record_calls = ctx_ticks = ctx_calls = launch_ticks = wait_ticks = wait_calls = probe_ticks =
          probe_calls = 0;
      uint64_t t0 = __rdtsc();
      for (unsigned i = 0; i < n; i++) {
        if (k == RAW) {
          BENCH_CU(d->cuEventRecord(ev[i % RING], raw));
        } else if (k == RAW_WEFT) {
          const weft__lane_t *l = &s[0]->tr->live->lane[s[0]->lane];
          BENCH_CU(d->cuEventRecord(l->ring[i & (l->ring_size - 1)], s[0]->raw));
        } else if (k == RAW_CTX) {
          CUcontext cur;
          BENCH_CU(d->cuCtxGetCurrent(&cur));
          BENCH_CU(d->cuEventRecord(ev[i % RING], raw));
        } else if (k == RAW_CODE4 || k == RAW_CODE8) {
          if (k == RAW_CODE4) code4();
          else code8();
          BENCH_CU(d->cuEventRecord(ev[i % RING], raw));
        } else if (k == RAW_AFTER_USE) {
          BENCH_WEFT(weft_use_begin(on, &a, 1));
          BENCH_WEFT(weft_use_end(on, &a, 1));
          BENCH_CU(d->cuEventRecord(ev[i % RING], raw));
        } else if (k == RAW_ON_WEFT) {
          BENCH_CU(d->cuEventRecord(ev[i % RING], s[0]->raw));
        } else if (k == RAW_OWN_RING) {
          const weft__lane_t *l = &s[2]->tr->live->lane[s[2]->lane];
          BENCH_CU(d->cuEventRecord(l->ring[i & (l->ring_size - 1)], s[2]->raw));
        } else if (k == RAW_WAITED_EVENTS) {
          BENCH_CU(d->cuEventRecord(waited[i % RING], raw));
        } else if (k == RAW_WAITED_STREAM) {
          BENCH_CU(d->cuEventRecord(ev2[i % RING], raw2));
        } else if (k == EDGE) {
          weft_access_t w = {blk, WEFT_WRITE};
          BENCH_WEFT(weft_use_begin(s[i & 1], &w, 1));
          BENCH_WEFT(weft_use_end(s[i & 1], &w, 1));
        } else if (k == RAW_EDGE) {
          CUstream me = i & 1 ? raw2 : raw, other_s = i & 1 ? raw : raw2;
          (void)other_s;
          BENCH_CU(d->cuStreamWaitEvent(me, i & 1 ? ev[(i + RING - 1) % RING] : ev2[(i + RING - 1) % RING], 0));
          BENCH_CU(d->cuEventRecord(i & 1 ? ev2[i % RING] : ev[i % RING], me));
        } else if (k == ALLOC_POOL || k == ALLOC_ADOPTED || k == ALLOC_LEGACY) {
          weft_stream_t *as = k == ALLOC_POOL ? s[2] : k == ALLOC_ADOPTED ? adopted : legacy;
          weft_block_t b;
          BENCH_WEFT(weft_alloc(rt, 1u << 20, as, "share.pair", &b));
          BENCH_WEFT(weft_free(b, as));
        } else if (k == CHASE || k == CHASE_LAUNCH || k == SPREAD || k == SPREAD_LAUNCH) {
          if (k == CHASE || k == CHASE_LAUNCH) chase16();
          else spread16();
          if (k == CHASE_LAUNCH || k == SPREAD_LAUNCH) BENCH_CU(d->cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, raw, params, NULL));
        } else if (k == USE_THEN_LAUNCH) {
          BENCH_WEFT(weft_use_begin(on, &a, 1));
          BENCH_WEFT(weft_use_end(on, &a, 1));
          BENCH_CU(d->cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, on->raw, params, NULL));
        } else if (k == CODE4_LAUNCH || k == CODE8_LAUNCH) {
          if (k == CODE4_LAUNCH) code4();
          else code8();
          BENCH_CU(d->cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, raw, params, NULL));
        } else if (k == LAUNCH) {
          BENCH_CU(d->cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, raw, params, NULL));
        } else if (k == WEFT_LAUNCH) {
          BENCH_WEFT(weft_launch(on, &launch, &a, 1));
        } else {
          BENCH_WEFT(weft_use_begin(on, &a, 1));
          BENCH_WEFT(weft_use_end(on, &a, 1));
        }
      }
      uint64_t t1 = __rdtsc();
      if (rep > 0) {
        v[k][0][rep - 1] = (double)(t1 - t0) * ns_per_tick / n;
        v[k][1][rep - 1] = (double)record_ticks * ns_per_tick / n;
        v[k][2][rep - 1] = (double)ctx_ticks * ns_per_tick / n;
        v[k][3][rep - 1] = (double)record_calls / n;
        v[k][4][rep - 1] = (double)launch_ticks * ns_per_tick / n;
        v[k][5][rep - 1] = (double)wait_ticks * ns_per_tick / n;
        v[k][6][rep - 1] = (double)probe_ticks * ns_per_tick / n;
        v[k][7][rep - 1] = (double)probe_calls / n;
        v[k][8][rep - 1] = (double)ctx_calls / n;
      }
      BENCH_CU(d->cuStreamSynchronize(raw));
      BENCH_CU(d->cuStreamSynchronize(raw2));
      BENCH_WEFT(weft_runtime_synchronize(rt));
      if (k == RAW_WEFT || k == RAW_OWN_RING) BENCH_WEFT(weft_runtime_synchronize(rt)); /* (weft's events recorded behind its back: all complete now) */
    }
  }
  d->cuEventRecord = real_record;
  d->cuCtxGetCurrent = real_ctx_get;
  d->cuLaunchKernel = real_launch;
  d->cuStreamWaitEvent = real_wait;
  d->cuStreamIsCapturing = real_is_capturing;

  printf("driver_share: %u samples of %u operations per series, interleaved; medians, ns per operation "
         "(time-stamp counter, %.4f ns per tick)\n\n", reps, n, ns_per_tick);
  printf("| series | total | inside cuEventRecord | inside cuCtxGetCurrent | inside cuLaunchKernel | inside "
         "cuStreamWaitEvent | inside cuStreamIsCapturing | the rest | records per op | context gets per op | "
         "capture probes per op |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double med[SERIES][9];
  for (unsigned k = 0; k < SERIES; k++) {
    double rest[101];
    for (unsigned r = 0; r < reps; r++)
      rest[r] = v[k][0][r] - v[k][1][r] - v[k][2][r] - v[k][4][r] - v[k][5][r] - v[k][6][r];
    for (unsigned m = 0; m < 9; m++) med[k][m] = bench_median(v[k][m], reps);
    printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", names[k], med[k][0],
           med[k][1], med[k][2], med[k][4], med[k][5], med[k][6], bench_median(rest, reps), med[k][3], med[k][8], med[k][7]);
  }
  printf("\nweft eager - raw record: %.1f ns (inside the record: %+.1f ns per record against the raw one's); "
         "the lazy use in all: %.1f ns\n",
         med[EAGER][0] - med[RAW][0], med[EAGER][3] > 0 ? med[EAGER][1] / med[EAGER][3] - med[RAW][1] : 0.0,
         med[LAZY][0]);
  printf("weft_launch - cuLaunchKernel: %.1f ns (inside the launch: %+.1f ns against the raw one's)\n",
         med[WEFT_LAUNCH][0] - med[LAUNCH][0], med[WEFT_LAUNCH][4] - med[LAUNCH][4]);
  BENCH_WEFT(weft_free(blk, s[0]));
  BENCH_WEFT(weft_free(own, s[2]));
  for (int i = 0; i < 2; i++) BENCH_WEFT(weft_free(late[i], s[0]));
  for (int i = 0; i < RING; i++) {
    BENCH_CU(d->cuEventDestroy(ev[i]));
    BENCH_CU(d->cuEventDestroy(ev2[i]));
    BENCH_CU(d->cuEventDestroy(waited[i]));
  }
  BENCH_CU(d->cuStreamDestroy(raw));
  BENCH_CU(d->cuStreamDestroy(raw2));
  BENCH_WEFT(weft_runtime_synchronize(rt));
  BENCH_CU(d->cuStreamDestroy(other));
  BENCH_CU(d->cuModuleUnload(module));
  BENCH_WEFT(weft_runtime_release(rt)); /* (raw3 goes with the primary context weft releases) */
  free(g_chain);
  return 0;
}
