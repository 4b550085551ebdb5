/* The data-parallel step (issue 14): does an all-reduce hide behind the backward pass it follows?
 *
 * A synthetic step per rank: 64 MiB of gradients (a model of 16 M float32 parameters) in
 * `buckets` buckets, written one after the other by a compute kernel (the pipeline example's LCG
 * kernel, `rounds` steps per element; the "backward pass"), each all-reduced (sum, float32 data)
 * on the communicator's stream as soon as it is written (weft_all_reduce: the stream waits for
 * that bucket's kernel only), then a short kernel reading every bucket (the "update", which
 * waits for every all-reduce). `rounds` is calibrated on the GPU so that the all-reduces alone
 * take 25-50% of the compute alone: the case of an all-reduce at least 30% of the
 * compute. The same step with hand-placed events and raw NCCL on the same streams is the
 * baseline.
 *
 * Two shapes of the backward kernel, each a row set with x naming it:
 *   "264 blocks, 4 buckets"    one wave: 2 blocks of 256 threads per SM of an H100, each running
 *                              the whole kernel. NCCL's kernels share SMs with blocks that never
 *                              retire, and every block waits for the slowest: nothing hides.
 *   "4224 blocks, 16 buckets"  many waves (4 at full occupancy on 132 SMs), as a backward pass's
 *                              GEMM tiles are: blocks retire continuously, the high-priority
 *                              communication stream's blocks take the freed SMs, and the rest
 *                              of the kernel balances over the others.
 * WEFT_BENCH_DP_BLOCKS and WEFT_BENCH_DP_BUCKETS (both set) measure one shape of their own.
 *
 * Measured, each as the median of repetitions of `steps` steps ending in one synchronisation:
 *   compute alone   the step on one GPU without all-reduces (the one-GPU step at the same
 *                   per-GPU work);
 *   all-reduce alone the buckets' all-reduces on two GPUs without compute;
 *   step on two GPUs the whole step on two GPUs, one thread driving both ranks.
 * Goal (issue 14): the two-GPU step <= 1.15 x the one-GPU step. The overlap column says how much
 * of the all-reduce time the step hid: (compute + all-reduce - step) / all-reduce. Needs two
 * devices and NCCL; skipped otherwise. */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "examples/pipeline/pipeline_kernels.h"
#include "lib/core/nccl.h"

#define MAX_BUCKETS 16
#define TOTAL_MIB 64 /* gradient bytes per rank, split into `buckets` buckets */

typedef struct rank {
  weft_runtime_t *rt;
  weft_comm_t *comm;
  ncclComm_t nc;        /* the NCCL communicator under comm (adopted) */
  CUevent done[MAX_BUCKETS]; /* the raw baseline's hand-placed events */
  weft_stream_t *compute;
  CUfunction lcg;
  weft_block_t grad[MAX_BUCKETS], seed;
} rank_t;

typedef struct dp {
  bench_t *b;
  rank_t r[2];
  unsigned n;      /* elements per bucket */
  unsigned rounds; /* LCG steps per element of the compute kernel */
  unsigned blocks; /* blocks of 256 threads of the compute kernel */
  int buckets;     /* gradient buckets (at most MAX_BUCKETS) */
} dp_t;

/* The LCG kernel as a use on r's compute stream: out = LCG^rounds(in) over n elements, with
 * `blocks` blocks of 256 threads. */
static void lcg(rank_t *r, weft_block_t out, weft_block_t in, unsigned n, unsigned rounds, unsigned blocks) {
  CUdeviceptr po, pi;
  BENCH_WEFT(weft_block_ptr(out, &po));
  BENCH_WEFT(weft_block_ptr(in, &pi));
  void *params[] = {&po, &pi, &n, &rounds};
  weft_access_t acc[] = {{out, WEFT_WRITE}, {in, WEFT_READ}};
  weft_launch_t l = {.func = r->lcg, .grid = {blocks}, .block = {256}, .params = params};
  BENCH_WEFT(weft_launch(r->compute, &l, acc, 2));
}

/* The "backward" of a bucket: its gradient from the seed. */
static void compute(dp_t *d, rank_t *r, int bucket, unsigned rounds) { lcg(r, r->grad[bucket], r->seed, d->n, rounds, d->blocks); }

/* The update: reads every bucket (a short kernel writing the seed, which the next step reads). */
static void update(dp_t *d, rank_t *r) {
  for (int k = 0; k < d->buckets; k++) lcg(r, r->seed, r->grad[k], d->n / 64, 1, 64);
}

typedef enum { COMPUTE_ALONE, ALLREDUCE_ALONE, STEP, RAW_STEP } what_t;

/* The raw baseline's bucket: the compute kernel, an event, the communicator's stream waiting on
 * it, ncclAllReduce there (what a program writes by hand). */
static void raw_bucket(dp_t *d, const weft__nccl_t *nl, int bkt, unsigned rounds) {
  const weft__driver_t *drv = d->b->drv;
  for (int k = 0; k < 2; k++) {
    rank_t *r = &d->r[k];
    CUdeviceptr out, in;
    BENCH_WEFT(weft_block_ptr(r->grad[bkt], &out));
    BENCH_WEFT(weft_block_ptr(r->seed, &in));
    void *params[] = {&out, &in, &d->n, &rounds};
    CUstream cs = weft_stream_raw(r->compute), ms = weft_stream_raw(weft_comm_stream(r->comm));
    BENCH_CU(drv->cuLaunchKernel(r->lcg, d->blocks, 1, 1, 256, 1, 1, 0, cs, params, NULL));
    BENCH_CU(drv->cuEventRecord(r->done[bkt], cs));
    BENCH_CU(drv->cuStreamWaitEvent(ms, r->done[bkt], 0));
  }
  if (nl->ncclGroupStart() != ncclSuccess) bench_die("ncclGroupStart");
  for (int k = 0; k < 2; k++) {
    CUdeviceptr g;
    BENCH_WEFT(weft_block_ptr(d->r[k].grad[bkt], &g));
    if (nl->ncclAllReduce((void *)g, (void *)g, d->n, ncclFloat32, ncclSum, d->r[k].nc,
                          (cudaStream_t)weft_stream_raw(weft_comm_stream(d->r[k].comm))) != ncclSuccess)
      bench_die("ncclAllReduce");
  }
  if (nl->ncclGroupEnd() != ncclSuccess) bench_die("ncclGroupEnd");
}

/* Microseconds per step of `what` over `steps` steps. */
static double run(dp_t *d, what_t what, unsigned steps, unsigned rounds) {
  int nranks = what == COMPUTE_ALONE ? 1 : 2;
  for (int k = 0; k < nranks; k++) BENCH_WEFT(weft_runtime_synchronize(d->r[k].rt));
  uint64_t t0 = bench_now_ns();
  const weft__nccl_t *nl = NULL;
  if (what == RAW_STEP && weft__nccl_get(&nl) != WEFT_OK) bench_die("no NCCL");
  for (unsigned s = 0; s < steps && what == RAW_STEP; s++) {
    for (int bkt = 0; bkt < d->buckets; bkt++) raw_bucket(d, nl, bkt, rounds);
    /* The update waits for the all-reduces: the compute stream waits on the comm stream. */
    for (int k = 0; k < 2; k++) {
      rank_t *r = &d->r[k];
      BENCH_CU(d->b->drv->cuEventRecord(r->done[0], weft_stream_raw(weft_comm_stream(r->comm))));
      BENCH_CU(d->b->drv->cuStreamWaitEvent(weft_stream_raw(r->compute), r->done[0], 0));
      for (int bkt = 0; bkt < d->buckets; bkt++) {
        CUdeviceptr out, in;
        BENCH_WEFT(weft_block_ptr(r->seed, &out));
        BENCH_WEFT(weft_block_ptr(r->grad[bkt], &in));
        unsigned one = 1, n = d->n / 64;
        void *params[] = {&out, &in, &n, &one};
        BENCH_CU(d->b->drv->cuLaunchKernel(r->lcg, 64, 1, 1, 256, 1, 1, 0, weft_stream_raw(r->compute), params, NULL));
      }
    }
  }
  for (unsigned s = 0; s < steps && what != RAW_STEP; s++) {
    for (int bkt = 0; bkt < d->buckets; bkt++) {
      if (what != ALLREDUCE_ALONE)
        for (int k = 0; k < nranks; k++) compute(d, &d->r[k], bkt, rounds);
      if (what == COMPUTE_ALONE) continue;
      BENCH_WEFT(weft_comm_group_begin());
      for (int k = 0; k < 2; k++)
        BENCH_WEFT(weft_all_reduce(d->r[k].comm, d->r[k].grad[bkt], 0, d->r[k].grad[bkt], 0, d->n, WEFT_FLOAT32, WEFT_SUM,
                                   NULL));
      BENCH_WEFT(weft_comm_group_end());
    }
    if (what != ALLREDUCE_ALONE)
      for (int k = 0; k < nranks; k++) update(d, &d->r[k]);
  }
  for (int k = 0; k < nranks; k++) BENCH_WEFT(weft_runtime_synchronize(d->r[k].rt));
  return (double)(bench_now_ns() - t0) / steps / 1000.0;
}

static double median_of(dp_t *d, what_t what, unsigned steps, unsigned rounds) {
  double v[BENCH_MAX_REPS];
  unsigned reps = d->b->reps < BENCH_MAX_REPS ? d->b->reps : BENCH_MAX_REPS;
  for (unsigned k = 0; k < reps; k++) v[k] = run(d, what, steps, rounds);
  return bench_median(v, reps);
}

/* One of the four ways as a series of bench_measure. */
typedef struct way {
  dp_t *d;
  what_t what;
  unsigned steps, rounds;
} way_t;

static double one_way(void *arg) {
  way_t *w = arg;
  return run(w->d, w->what, w->steps, w->rounds);
}

/* Measures one shape of the backward kernel: allocates the buckets, calibrates, measures the
 * four ways interleaved, prints a table row and frees the buckets. */
static void measure_shape(dp_t *d, unsigned blocks, int buckets) {
  bench_t *b = d->b;
  d->blocks = blocks;
  d->buckets = buckets;
  d->n = (unsigned)(((b->quick ? 4u : TOTAL_MIB) << 20) / 4 / (unsigned)buckets);
  for (int k = 0; k < 2; k++) {
    rank_t *r = &d->r[k];
    for (int bkt = 0; bkt < buckets; bkt++)
      BENCH_WEFT(weft_alloc(r->rt, (size_t)d->n * 4, r->compute, "grad", &r->grad[bkt]));
    BENCH_WEFT(weft_alloc(r->rt, (size_t)d->n * 4, r->compute, "seed", &r->seed));
    BENCH_WEFT(weft_memset32(r->compute, r->seed, 0, 7, (size_t)d->n * 4));
  }
  char x[64];
  snprintf(x, sizeof x, "%u blocks, %d buckets", blocks, buckets);
  unsigned steps = bench_count(b, 20, 2);
  /* Calibration: double the rounds until compute alone takes 2 x the all-reduces alone (the
   * all-reduces are then 25-50% of it). */
  double ar = median_of(d, ALLREDUCE_ALONE, steps, 1);
  unsigned rounds = 1;
  while (!b->sim && rounds < (1u << 16) && run(d, COMPUTE_ALONE, steps, rounds) < 2.0 * ar) rounds *= 2;
  /* The four ways interleaved, repetition by repetition. */
  static const char *const names[] = {"compute alone, 1 GPU", "all-reduces alone, 2 GPUs",
                                      "step on 2 GPUs (weft)", "step on 2 GPUs, hand-placed events + raw NCCL"};
  way_t ways[4];
  bench_series_t series[4];
  for (int k = 0; k < 4; k++) {
    ways[k] = (way_t){d, (what_t)k, steps, rounds};
    /* The step's baseline is one GPU (the goal's ratio); the hand-placed step is compared with
     * weft's by the table below. */
    series[k] = (bench_series_t){names[k], k == STEP ? names[COMPUTE_ALONE] : k == RAW_STEP ? names[STEP] : NULL,
                                 x, one_way, &ways[k]};
  }
  double med[4];
  bench_measure(b, "dp", "us per step", "us", series, 4, med);
  double comp = med[COMPUTE_ALONE], step2 = med[STEP], raw2 = med[RAW_STEP];
  ar = med[ALLREDUCE_ALONE];
  printf("| %u | %d | %u | %.1f | %.1f | %.2f | %.1f | %.3f | %.0f%% | %.1f | %.3f |\n", blocks, buckets, rounds, comp, ar,
         ar / comp, step2, step2 / comp, 100.0 * (comp + ar - step2) / ar, raw2, step2 / raw2);
  bench_sample(b, "dp", "compute kernel", "LCG rounds (calibrated)", "rounds", NULL, x, 0, rounds);
  for (int k = 0; k < 2; k++) {
    rank_t *r = &d->r[k];
    for (int bkt = 0; bkt < buckets; bkt++) BENCH_WEFT(weft_free(r->grad[bkt], r->compute));
    BENCH_WEFT(weft_free(r->seed, r->compute));
    BENCH_WEFT(weft_runtime_synchronize(r->rt));
  }
}

void bench_dp(bench_t *b) {
  bench_section(b, "Data-parallel step: all-reduce behind the backward pass",
                "64 MiB of gradients (16 M float32 parameters) in buckets written one after the other by a compute "
                "kernel, each all-reduced on the communicator's stream as soon as it is written, then an update reading "
                "all of them; one thread drives both ranks. Two kernel shapes: one wave (264 blocks, 4 buckets) and "
                "many waves (4224 blocks, 16 buckets; WEFT_BENCH_DP_BLOCKS and WEFT_BENCH_DP_BUCKETS choose another). "
                "Compute calibrated so that the all-reduces alone take 25-50% of the compute alone. Microseconds per "
                "step, medians. Goal: two GPUs <= 1.15 x one GPU.");
  int ndev = 0;
  BENCH_CU(b->drv->cuDeviceGetCount(&ndev));
  weft_comm_id_t probe;
  if (ndev < 2 || weft_comm_unique_id(&probe) != WEFT_OK) {
    printf("skipped: %s\n\n", ndev < 2 ? "one device" : weft_last_error());
    return;
  }
  dp_t d = {.b = b};
  unsigned shape_blocks[2] = {264, 4224};
  int shape_buckets[2] = {4, 16}, shapes = 2;
  const char *blocks = getenv("WEFT_BENCH_DP_BLOCKS"), *buckets = getenv("WEFT_BENCH_DP_BUCKETS");
  if (blocks != NULL && atoi(blocks) > 0 && buckets != NULL && atoi(buckets) > 0) {
    shapes = 1;
    shape_blocks[0] = (unsigned)atoi(blocks);
    shape_buckets[0] = atoi(buckets) < MAX_BUCKETS ? atoi(buckets) : MAX_BUCKETS;
  }
  d.r[0].rt = bench_runtime(NULL);
  BENCH_WEFT(weft_runtime_get(1, NULL, &d.r[1].rt));
  const weft__nccl_t *nl;
  BENCH_WEFT(weft__nccl_get(&nl));
  ncclComm_t nc[2];
  if (nl->ncclCommInitAll(nc, 2, (int[]){0, 1}) != ncclSuccess) bench_die("ncclCommInitAll");
  weft_comm_t *comms[2];
  for (int k = 0; k < 2; k++) BENCH_WEFT(weft_comm_adopt(d.r[k].rt, nc[k], &comms[k]));
  CUmodule mod1 = NULL;
  for (int k = 0; k < 2; k++) {
    rank_t *r = &d.r[k];
    r->comm = comms[k];
    r->nc = nc[k];
    BENCH_WEFT(weft_stream_get(r->rt, 0, &r->compute));
    /* The kernel and the baseline's events in the rank's device's context. */
    CUcontext c = b->ctx;
    if (k == 1) BENCH_CU(b->drv->cuDevicePrimaryCtxRetain(&c, 1));
    BENCH_CU(b->drv->cuCtxSetCurrent(c));
    if (k == 0) {
      r->lcg = b->lcg;
    } else {
      BENCH_CU(b->drv->cuModuleLoadData(&mod1, pipeline_kernels_fatbin));
      BENCH_CU(b->drv->cuModuleGetFunction(&r->lcg, mod1, "pipeline_transform"));
    }
    for (int e = 0; e < MAX_BUCKETS; e++) BENCH_CU(b->drv->cuEventCreate(&r->done[e], CU_EVENT_DISABLE_TIMING));
    BENCH_CU(b->drv->cuCtxSetCurrent(b->ctx));
  }
  static const char *const cols[] = {"blocks", "buckets", "LCG rounds", "compute alone (1 GPU) us",
                                     "all-reduce alone us", "all-reduce / compute", "step on 2 GPUs us",
                                     "2 GPUs / 1 GPU", "all-reduce hidden", "hand-placed events + raw NCCL us",
                                     "weft / hand-placed"};
  bench_table(cols, 11);
  for (int k = 0; k < shapes; k++) measure_shape(&d, shape_blocks[k], shape_buckets[k]);
  printf("\n");
  for (int k = 0; k < 2; k++) {
    rank_t *r = &d.r[k];
    BENCH_WEFT(weft_comm_destroy(r->comm));
    if (nl->ncclCommDestroy(r->nc) != ncclSuccess) bench_die("ncclCommDestroy");
    for (int e = 0; e < MAX_BUCKETS; e++) BENCH_CU(b->drv->cuEventDestroy(r->done[e]));
  }
  if (mod1 != NULL) {
    CUcontext c1;
    BENCH_CU(b->drv->cuDevicePrimaryCtxRetain(&c1, 1));
    BENCH_CU(b->drv->cuCtxSetCurrent(c1));
    BENCH_CU(b->drv->cuModuleUnload(mod1));
    BENCH_CU(b->drv->cuCtxSetCurrent(b->ctx));
    BENCH_CU(b->drv->cuDevicePrimaryCtxRelease(1));
    BENCH_CU(b->drv->cuDevicePrimaryCtxRelease(1));
  }
  BENCH_WEFT(weft_runtime_release(d.r[1].rt));
  BENCH_WEFT(weft_runtime_release(d.r[0].rt));
}
