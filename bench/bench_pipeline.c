/* Pipeline: chunks flow copy-in -> compute -> copy-out, triple-buffered, three ways in one run:
 *   weft       three pool streams, ordering entirely from the declared accesses;
 *   hand-made  three raw streams with the events a careful programmer places by hand;
 *   one stream everything in order on one raw stream (no overlap, no events).
 * Time is host wall time from the first enqueue to the end of the last copy-out; every run's
 * output is checked element by element, and on the simulator its race oracle must find nothing
 * (the run fails otherwise).
 *
 * Copies overlap kernels only from page-locked host memory. lib/core's driver table has no
 * host-allocation entry points, so cuMemHostAlloc / cuMemFreeHost are looked up by name in the
 * loaded driver (weft_driver_symbol); the simulator has neither and gets pageable memory. */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "examples/pipeline/pipeline_kernels_sim.h"
#include "sim/weft_sim.h"

#define BUFFERS 3

typedef CUresult (*host_alloc_fn)(void **pp, size_t bytes, unsigned flags);
typedef CUresult (*host_free_fn)(void *p);

typedef struct job {
  unsigned chunks, elems, iters;
  size_t chunk_bytes;
  unsigned *in, *out; /* chunks * elems each */
  unsigned mul, add;  /* the compute stage as one affine map, for the check */
  int pinned;
} job_t;

static void *host_alloc(size_t bytes, int *pinned) {
  host_alloc_fn f = (host_alloc_fn)weft_driver_symbol("cuMemHostAlloc");
  void *p = NULL;
  *pinned = f != NULL && f(&p, bytes, 0) == CUDA_SUCCESS;
  if (!*pinned) p = malloc(bytes);
  if (p == NULL) bench_die("pipeline: no host memory");
  return p;
}

static void host_free(void *p, int pinned) {
  if (!pinned) {
    free(p);
    return;
  }
  host_free_fn f = (host_free_fn)weft_driver_symbol("cuMemFreeHost");
  BENCH_CU(f(p));
}

static void check(const job_t *j, const char *variant) {
  size_t n = (size_t)j->chunks * j->elems;
  for (size_t i = 0; i < n; i++) {
    unsigned want = j->mul * j->in[i] + j->add;
    if (j->out[i] != want) {
      fprintf(stderr, "weft_bench: pipeline (%s): element %zu is %u, expected %u\n", variant, i, j->out[i], want);
      exit(1);
    }
  }
}

static void launch_raw(const bench_t *b, const job_t *j, CUdeviceptr out, CUdeviceptr in, CUstream s) {
  unsigned n = j->elems, iters = j->iters, grid = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  void *params[4] = {&out, &in, &n, &iters};
  BENCH_CU(b->drv->cuLaunchKernel(b->lcg, grid, 1, 1, 256, 1, 1, 0, s, params, NULL));
}

/* ---- weft ----------------------------------------------------------------------------------- */

typedef struct weft_side {
  weft_runtime_t *rt;
  weft_stream_t *s[3];
  weft_block_t din[BUFFERS], dout[BUFFERS];
} weft_side_t;

static void run_weft(const bench_t *b, const job_t *j, const weft_side_t *w) {
  for (unsigned c = 0; c < j->chunks; c++) {
    unsigned k = c % BUFFERS;
    size_t at = (size_t)c * j->elems;
    BENCH_WEFT(weft_copy_to_block(w->s[0], w->din[k], 0, j->in + at, j->chunk_bytes));
    CUdeviceptr out, in;
    BENCH_WEFT(weft_block_ptr(w->dout[k], &out));
    BENCH_WEFT(weft_block_ptr(w->din[k], &in));
    unsigned n = j->elems, iters = j->iters;
    void *params[4] = {&out, &in, &n, &iters};
    weft_launch_t l = {.func = b->lcg, .grid = {(n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096}, .block = {256},
                       .params = params};
    weft_access_t acc[2] = {{w->dout[k], WEFT_WRITE}, {w->din[k], WEFT_READ}};
    BENCH_WEFT(weft_launch(w->s[1], &l, acc, 2));
    BENCH_WEFT(weft_copy_from_block(w->s[2], j->out + at, w->dout[k], 0, j->chunk_bytes));
  }
  BENCH_WEFT(weft_runtime_synchronize(w->rt));
}

/* ---- raw: hand-placed events on three streams, and one stream ----------------------------- */

typedef struct raw_side {
  CUstream s[3];
  CUdeviceptr din[BUFFERS], dout[BUFFERS];
  CUevent in_done[BUFFERS], comp_done[BUFFERS], out_done[BUFFERS];
} raw_side_t;

/* The events a programmer places by hand: compute waits for its copy-in, copy-out for its
 * compute; a buffer is refilled only after the stage that read it the previous time. */
static unsigned run_events(const bench_t *b, const job_t *j, const raw_side_t *r) {
  const weft__driver_t *d = b->drv;
  unsigned waits = 0;
  for (unsigned c = 0; c < j->chunks; c++) {
    unsigned k = c % BUFFERS;
    size_t at = (size_t)c * j->elems;
    if (c >= BUFFERS) {
      BENCH_CU(d->cuStreamWaitEvent(r->s[0], r->comp_done[k], 0));
      waits++;
    }
    BENCH_CU(d->cuMemcpyHtoDAsync(r->din[k], j->in + at, j->chunk_bytes, r->s[0]));
    BENCH_CU(d->cuEventRecord(r->in_done[k], r->s[0]));
    BENCH_CU(d->cuStreamWaitEvent(r->s[1], r->in_done[k], 0));
    waits++;
    if (c >= BUFFERS) {
      BENCH_CU(d->cuStreamWaitEvent(r->s[1], r->out_done[k], 0));
      waits++;
    }
    launch_raw(b, j, r->dout[k], r->din[k], r->s[1]);
    BENCH_CU(d->cuEventRecord(r->comp_done[k], r->s[1]));
    BENCH_CU(d->cuStreamWaitEvent(r->s[2], r->comp_done[k], 0));
    waits++;
    BENCH_CU(d->cuMemcpyDtoHAsync(j->out + at, r->dout[k], j->chunk_bytes, r->s[2]));
    BENCH_CU(d->cuEventRecord(r->out_done[k], r->s[2]));
  }
  for (int i = 0; i < 3; i++) BENCH_CU(d->cuStreamSynchronize(r->s[i]));
  return waits;
}

static void run_one_stream(const bench_t *b, const job_t *j, const raw_side_t *r) {
  const weft__driver_t *d = b->drv;
  for (unsigned c = 0; c < j->chunks; c++) {
    unsigned k = c % BUFFERS;
    size_t at = (size_t)c * j->elems;
    BENCH_CU(d->cuMemcpyHtoDAsync(r->din[k], j->in + at, j->chunk_bytes, r->s[0]));
    launch_raw(b, j, r->dout[k], r->din[k], r->s[0]);
    BENCH_CU(d->cuMemcpyDtoHAsync(j->out + at, r->dout[k], j->chunk_bytes, r->s[0]));
  }
  BENCH_CU(d->cuStreamSynchronize(r->s[0]));
}

/* ---- measuring ------------------------------------------------------------------------------ */

enum { WEFT, EVENTS, ONE_STREAM, VARIANTS };

/* One variant as a series: each sample is one run, checked; us per chunk. */
typedef struct figure {
  const bench_t *b;
  job_t *j;
  int variant;
  const weft_side_t *w;
  const raw_side_t *r;
  double us, waits; /* median us per chunk; waits per chunk of the last run */
} figure_t;

static const char *const variant_name[] = {"weft, automatic waits", "hand-placed events, 3 raw streams",
                                           "one raw stream"};

static double one_run(void *arg) {
  figure_t *f = arg;
  job_t *j = f->j;
  memset(j->out, 0, (size_t)j->chunks * j->chunk_bytes);
  weft_counters_t c0, c1;
  unsigned waits = 0;
  if (f->variant == WEFT) BENCH_WEFT(weft_runtime_counters(f->w->rt, &c0));
  uint64_t t0 = bench_now_ns();
  if (f->variant == WEFT) run_weft(f->b, j, f->w);
  else if (f->variant == EVENTS) waits = run_events(f->b, j, f->r);
  else run_one_stream(f->b, j, f->r);
  uint64_t t1 = bench_now_ns();
  if (f->variant == WEFT) {
    BENCH_WEFT(weft_runtime_counters(f->w->rt, &c1));
    waits = (unsigned)(c1.waits_issued - c0.waits_issued);
  }
  check(j, variant_name[f->variant]);
  f->waits = (double)waits / j->chunks;
  return (double)(t1 - t0) / 1e3 / j->chunks;
}

/* The three variants interleaved; fails the run if the simulator's oracle finds a race. */
static void measure(const bench_t *b, figure_t *f) {
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  if (sim != NULL) sim->reset_races();
  bench_series_t series[VARIANTS];
  for (int v = 0; v < VARIANTS; v++)
    series[v] = (bench_series_t){variant_name[v], v == EVENTS ? NULL : variant_name[EVENTS], NULL, one_run, &f[v]};
  double med[VARIANTS];
  bench_measure(b, "pipeline", "us per chunk", "us", series, VARIANTS, med);
  for (int v = 0; v < VARIANTS; v++) f[v].us = med[v];
  if (sim != NULL && sim->race_count() != 0) {
    sim->print_report();
    fprintf(stderr, "weft_bench: pipeline: the simulator found unordered accesses\n");
    exit(1);
  }
}

static void row(const bench_t *b, const job_t *j, unsigned streams, const figure_t *f, const figure_t *base) {
  double gbs = 2.0 * (double)j->chunk_bytes / (f->us * 1e-6) / 1e9;
  char ratio[24] = "baseline";
  if (f != base) snprintf(ratio, sizeof ratio, "%.3fx", f->us / base->us);
  printf("| %s | %u | %.1f | %.2f | %.2f | %s |", variant_name[f->variant], streams, f->us, gbs, f->waits, ratio);
  if (b->sim) printf(" 0 |");
  printf("\n");
}

void bench_pipeline(bench_t *b) {
  job_t j = {.chunks = b->quick ? 6 : b->sim ? 12 : 48, .elems = b->quick ? 4096 : b->sim ? 16384 : 1u << 20,
             .iters = 1024};
  j.chunk_bytes = (size_t)j.elems * 4;
  size_t total = (size_t)j.chunks * j.chunk_bytes;
  int out_pinned;
  j.in = host_alloc(total, &j.pinned);
  j.out = host_alloc(total, &out_pinned);
  for (size_t i = 0; i < (size_t)j.chunks * j.elems; i++) j.in[i] = (unsigned)i * 2654435761u + 12345u;
  pipeline_transform_map(j.iters, &j.mul, &j.add);
  char about[512];
  snprintf(about, sizeof about,
           "%u chunks of %zu KiB, three device buffers per stage, compute = %u LCG steps per element. Host "
           "memory: %s. *vs hand-placed*: time ratio to three raw streams with hand-placed events (goal: "
           "weft within 2%%, and faster than one stream). GB/s counts bytes copied in and out.",
           j.chunks, j.chunk_bytes / 1024, j.iters,
           j.pinned && out_pinned ? "page-locked (cuMemHostAlloc)" : "pageable (the driver has no cuMemHostAlloc)");
  bench_section(b, "Pipeline: copy-in -> compute -> copy-out", about);

  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  weft_side_t w = {.rt = bench_runtime(&o)};
  for (unsigned i = 0; i < 3; i++) BENCH_WEFT(weft_stream_get(w.rt, i, &w.s[i]));
  const weft__driver_t *d = b->drv;
  raw_side_t r;
  for (int i = 0; i < 3; i++) BENCH_CU(d->cuStreamCreateWithPriority(&r.s[i], CU_STREAM_NON_BLOCKING, 0));
  for (int k = 0; k < BUFFERS; k++) {
    BENCH_WEFT(weft_alloc(w.rt, j.chunk_bytes, w.s[0], "pipeline in", &w.din[k]));
    BENCH_WEFT(weft_alloc(w.rt, j.chunk_bytes, w.s[0], "pipeline out", &w.dout[k]));
    BENCH_CU(d->cuMemAlloc(&r.din[k], j.chunk_bytes));
    BENCH_CU(d->cuMemAlloc(&r.dout[k], j.chunk_bytes));
    CUevent *ev[3] = {&r.in_done[k], &r.comp_done[k], &r.out_done[k]};
    for (int e = 0; e < 3; e++) BENCH_CU(d->cuEventCreate(ev[e], CU_EVENT_DISABLE_TIMING));
  }

  figure_t f[VARIANTS];
  for (int v = 0; v < VARIANTS; v++) f[v] = (figure_t){.b = b, .j = &j, .variant = v, .w = &w, .r = &r};
  measure(b, f);
  static const char *const cols[] = {"variant", "streams", "us per chunk", "GB/s", "waits per chunk",
                                     "vs hand-placed", "races found by the simulator"};
  bench_table(cols, b->sim ? 7 : 6);
  row(b, &j, 3, &f[WEFT], &f[EVENTS]);
  row(b, &j, 3, &f[EVENTS], &f[EVENTS]);
  row(b, &j, 1, &f[ONE_STREAM], &f[EVENTS]);
  printf("\nSpeed-up of weft over one stream: %.2fx (medians; the three variants interleaved).\n\n",
         f[ONE_STREAM].us / f[WEFT].us);
  for (int v = 0; v < VARIANTS; v++)
    bench_sample(b, "pipeline", variant_name[v], "waits per chunk", "waits", NULL, NULL, 0, f[v].waits);

  for (int k = 0; k < BUFFERS; k++) {
    BENCH_WEFT(weft_free(w.din[k], w.s[0]));
    BENCH_WEFT(weft_free(w.dout[k], w.s[0]));
    BENCH_CU(d->cuMemFree(r.din[k]));
    BENCH_CU(d->cuMemFree(r.dout[k]));
    CUevent ev[3] = {r.in_done[k], r.comp_done[k], r.out_done[k]};
    for (int e = 0; e < 3; e++) BENCH_CU(d->cuEventDestroy(ev[e]));
  }
  for (int i = 0; i < 3; i++) BENCH_CU(d->cuStreamDestroy(r.s[i]));
  BENCH_WEFT(weft_runtime_release(w.rt));
  host_free(j.in, j.pinned);
  host_free(j.out, out_pinned);
}
