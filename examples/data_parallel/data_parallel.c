/* Data-parallel training with weft's communicators: the training-loop example's MLP on K GPUs.
 * Each rank takes its slice of the global batch, computes gradients, all-reduces them (average)
 * in two buckets on the communicator's stream as soon as each is ready, and updates its weights.
 * No event is placed by hand: the all-reduce of the output layer's gradient waits for the kernel
 * that wrote it and runs while the hidden layer's backward pass goes on (weft's tracked uses),
 * and each update waits for its all-reduce.
 *
 * Launch modes, one binary:
 *   data_parallel [--steps N] [--ranks K]           one process driving K devices (default: all)
 *   data_parallel [--steps N] --rank R --world K --id-file F [--device D]
 *                                                   one process per device (D, default R): rank 0
 *                                                   writes the unique id to F, the others read it
 *                                                   (the mode a run across machines uses, F on a
 *                                                   shared disk, K the GPUs of all machines)
 *   data_parallel [--steps N] --rank-threads K --id-file F
 *                                                   the per-process mode's code with one thread
 *                                                   per rank, in one process
 * On the simulator (WEFT_DRIVER=sim, WEFT_NCCL=sim) every mode runs, the one-process-per-device
 * mode as separate processes too (the simulated NCCL joins them through the id's board).
 * The first half of the steps runs eagerly; then each rank's step is captured (its collectives
 * too) and replayed for the rest, the next batch copied in eagerly before each launch. Each rank
 * checks its weights against the same steps on one device over the whole (concatenated) batch,
 * within 1e-5 relative, and prints a hash of its weights (identical on every rank). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "examples/training_loop/mlp.h"
#include "examples/training_loop/mlp_kernels.h"
#include "examples/training_loop/mlp_kernels_sim.h"
#include "weft/weft.h"

#define CHECK(call)                                                                            \
  do {                                                                                         \
    weft_status_t st_ = (call);                                                                \
    if (st_ != WEFT_OK) {                                                                      \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, weft_status_name(st_), \
              weft_last_error());                                                              \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define NW1 (MLP_IN * MLP_HIDDEN)
#define NDW1 ((MLP_IN + 1) * MLP_HIDDEN) /* dw1 and db1 */
#define NDW2 (MLP_HIDDEN + 1)            /* dw2 and db2 */

typedef struct rank {
  int r, world;
  weft_runtime_t *rt;
  weft_comm_t *comm;
  CUfunction k[K_COUNT];
  weft_stream_t *compute, *copy, *host;
  weft_block_t x, y, w1, b1, w2, b2, loss, h, dy, dh, dw1, dw2;
  float lr;
} rank_t;

static int g_steps = 40;
static float *g_x, *g_y; /* the data: g_steps global batches of world * MLP_BATCH samples */

/* ---- driver functions weft has no wrapper for, from the library weft loaded ---- */

static CUresult (*p_retain)(CUcontext *, CUdevice);
static CUresult (*p_set)(CUcontext);
static CUresult (*p_load)(CUmodule *, const void *);
static CUresult (*p_func)(CUfunction *, CUmodule, const char *);

static void load_driver_functions(void) {
  *(void **)&p_retain = weft_driver_symbol("cuDevicePrimaryCtxRetain");
  *(void **)&p_set = weft_driver_symbol("cuCtxSetCurrent");
  *(void **)&p_load = weft_driver_symbol("cuModuleLoadData");
  *(void **)&p_func = weft_driver_symbol("cuModuleGetFunction");
  if (!p_retain || !p_set || !p_load || !p_func) fprintf(stderr, "the CUDA driver lacks module functions\n"), exit(1);
}

static CUdeviceptr ptr(weft_block_t b) {
  CUdeviceptr p;
  CHECK(weft_block_ptr(b, &p));
  return p;
}

static weft_block_t floats(rank_t *t, size_t n, const char *tag) {
  weft_block_t b;
  CHECK(weft_alloc(t->rt, n * sizeof(float), t->compute, tag, &b));
  return b;
}

static void launch(rank_t *t, int kernel, unsigned threads, void **params, const weft_access_t *acc, size_t n) {
  weft_launch_t l = {.func = t->k[kernel], .grid = {(threads + 127) / 128}, .block = {128}, .params = params};
  CHECK(weft_launch(t->compute, &l, acc, n));
}

/* p -= lr * g[offset ..] */
static void sgd(rank_t *t, weft_block_t p, weft_block_t g, size_t offset, int n, float lr) {
  CUdeviceptr pp = ptr(p), gp = ptr(g) + offset * sizeof(float);
  void *params[] = {&pp, &gp, &n, &lr};
  weft_access_t acc[] = {{p, WEFT_READ_WRITE}, {g, WEFT_READ}};
  launch(t, K_SGD, (unsigned)n, params, acc, 2);
}

static void set_weights(rank_t *t);

/* A rank on device `dev`: runtime, kernels (in its device's context), streams, buffers. */
static void rank_init(rank_t *t, int r, int world, int dev) {
  memset(t, 0, sizeof *t);
  t->r = r;
  t->world = world;
  t->lr = 0.1f;
  CHECK(weft_runtime_get(dev, NULL, &t->rt));
  CUcontext ctx;
  CUmodule mod;
  if (p_retain(&ctx, dev) != CUDA_SUCCESS || p_set(ctx) != CUDA_SUCCESS || p_load(&mod, mlp_kernels_fatbin) != CUDA_SUCCESS)
    fprintf(stderr, "rank %d: cannot load the kernels on device %d\n", r, dev), exit(1);
  for (int i = 0; i < K_COUNT; i++)
    if (p_func(&t->k[i], mod, mlp_kernel_name(i)) != CUDA_SUCCESS) exit(1);
  CHECK(weft_stream_get(t->rt, 0, &t->compute));
  CHECK(weft_stream_get(t->rt, 2, &t->copy));
  CHECK(weft_stream_get(t->rt, 3, &t->host));
  t->x = floats(t, MLP_BATCH * MLP_IN, "x");
  t->y = floats(t, MLP_BATCH, "y");
  t->w1 = floats(t, NW1, "w1");
  t->b1 = floats(t, MLP_HIDDEN, "b1");
  t->w2 = floats(t, MLP_HIDDEN, "w2");
  t->b2 = floats(t, 1, "b2");
  t->loss = floats(t, MLP_BATCH, "loss");
  t->h = floats(t, MLP_BATCH * MLP_HIDDEN, "h");
  t->dy = floats(t, MLP_BATCH, "dy");
  t->dh = floats(t, MLP_BATCH * MLP_HIDDEN, "dh");
  t->dw1 = floats(t, NDW1, "dw1");
  t->dw2 = floats(t, NDW2, "dw2");
  set_weights(t);
}

/* Slice `slice` of global batch i into t's input buffers (on the copy stream, eagerly: it waits for
 * the work that last read them, a replayed step included). */
static void copy_in(rank_t *t, int i, int slice) {
  size_t base = ((size_t)i * t->world + (size_t)slice) * MLP_BATCH;
  CHECK(weft_copy_to_block(t->copy, t->x, 0, g_x + base * MLP_IN, MLP_BATCH * MLP_IN * sizeof(float)));
  CHECK(weft_copy_to_block(t->copy, t->y, 0, g_y + base, MLP_BATCH * sizeof(float)));
}

/* Forward and the output layer's backward pass on the input buffers: loss, dy, dw2. */
static void forward_and_out(rank_t *t) {
  CUdeviceptr x = ptr(t->x), y = ptr(t->y), w1 = ptr(t->w1), b1 = ptr(t->b1), w2 = ptr(t->w2), b2 = ptr(t->b2);
  CUdeviceptr h = ptr(t->h), dy = ptr(t->dy), dw2 = ptr(t->dw2), loss = ptr(t->loss);
  void *p1[] = {&x, &w1, &b1, &h};
  weft_access_t a1[] = {{t->x, WEFT_READ}, {t->w1, WEFT_READ}, {t->b1, WEFT_READ}, {t->h, WEFT_WRITE}};
  launch(t, K_HIDDEN, MLP_BATCH * MLP_HIDDEN, p1, a1, 4);
  void *p2[] = {&h, &w2, &b2, &y, &dy, &loss};
  weft_access_t a2[] = {{t->h, WEFT_READ},  {t->w2, WEFT_READ}, {t->b2, WEFT_READ},
                        {t->y, WEFT_READ}, {t->dy, WEFT_WRITE}, {t->loss, WEFT_WRITE}};
  launch(t, K_LOSS, MLP_BATCH, p2, a2, 6);
  void *p3[] = {&h, &dy, &dw2};
  weft_access_t a3[] = {{t->h, WEFT_READ}, {t->dy, WEFT_READ}, {t->dw2, WEFT_WRITE}};
  launch(t, K_BOUT, NDW2, p3, a3, 3);
}

/* The hidden layer's backward pass: dh, dw1. */
static void backward_in(rank_t *t) {
  CUdeviceptr x = ptr(t->x), w2 = ptr(t->w2), h = ptr(t->h), dy = ptr(t->dy), dh = ptr(t->dh), dw1 = ptr(t->dw1);
  void *p1[] = {&h, &dy, &w2, &dh};
  weft_access_t a1[] = {{t->h, WEFT_READ}, {t->dy, WEFT_READ}, {t->w2, WEFT_READ}, {t->dh, WEFT_WRITE}};
  launch(t, K_BHIDDEN, MLP_BATCH * MLP_HIDDEN, p1, a1, 4);
  void *p2[] = {&x, &dh, &dw1};
  weft_access_t a2[] = {{t->x, WEFT_READ}, {t->dh, WEFT_READ}, {t->dw1, WEFT_WRITE}};
  launch(t, K_BIN, NDW1, p2, a2, 3);
}

static void update(rank_t *t, weft_block_t dw1, weft_block_t dw2, float lr) {
  sgd(t, t->w2, dw2, 0, MLP_HIDDEN, lr);
  sgd(t, t->b2, dw2, MLP_HIDDEN, 1, lr);
  sgd(t, t->w1, dw1, 0, NW1, lr);
  sgd(t, t->b1, dw1, NW1, MLP_HIDDEN, lr);
}

static float read_loss(rank_t *t);

/* One step's work of the ranks t[0..n) driven by this thread (n is 1 with one process or thread
 * per rank), after their inputs are in: buckets are all-reduced in a group over the ranks, each as
 * soon as it is written. The same code runs eagerly and under capture. */
static void compute_step(rank_t *t, int n) {
  for (int k = 0; k < n; k++) forward_and_out(&t[k]);
  CHECK(weft_comm_group_begin()); /* bucket 1: the output layer's gradient (dw2, db2) */
  for (int k = 0; k < n; k++) CHECK(weft_all_reduce(t[k].comm, t[k].dw2, 0, t[k].dw2, 0, NDW2, WEFT_FLOAT32, WEFT_AVG, NULL));
  CHECK(weft_comm_group_end());
  for (int k = 0; k < n; k++) backward_in(&t[k]); /* overlaps bucket 1's all-reduce */
  CHECK(weft_comm_group_begin()); /* bucket 2: the hidden layer's gradient (dw1, db1) */
  for (int k = 0; k < n; k++) CHECK(weft_all_reduce(t[k].comm, t[k].dw1, 0, t[k].dw1, 0, NDW1, WEFT_FLOAT32, WEFT_AVG, NULL));
  CHECK(weft_comm_group_end());
  for (int k = 0; k < n; k++) update(&t[k], t[k].dw1, t[k].dw2, t[k].lr);
}

/* Each rank's step captured on its compute stream (RELAXED: one thread captures every rank's),
 * the communicator's stream joined, and instantiated. */
static void capture_steps(rank_t *t, int n, weft_graph_t **g, weft_exec_t **e) {
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = WEFT_CAPTURE_RELAXED;
  for (int k = 0; k < n; k++) {
    CHECK(weft_capture_begin(t[k].compute, &o));
    CHECK(weft_capture_join(t[k].compute, weft_comm_stream(t[k].comm)));
  }
  compute_step(t, n);
  for (int k = 0; k < n; k++) {
    CHECK(weft_capture_end(t[k].compute, &g[k]));
    CHECK(weft_graph_instantiate(g[k], t[k].compute, &e[k]));
  }
}

/* Steps [0, g_steps): the first half eagerly, the rest by replaying each rank's captured step. */
static void train(rank_t *t, int n, float *first) {
  weft_graph_t **g = calloc((size_t)n, sizeof *g);
  weft_exec_t **e = calloc((size_t)n, sizeof *e);
  for (int i = 0; i < g_steps; i++) {
    for (int k = 0; k < n; k++) copy_in(&t[k], i, t[k].r);
    if (i < g_steps / 2) {
      compute_step(t, n);
    } else {
      if (e[0] == NULL) capture_steps(t, n, g, e);
      for (int k = 0; k < n; k++) CHECK(weft_exec_launch(e[k], t[k].compute));
    }
    if (i == 0) *first = read_loss(&t[0]);
  }
  for (int k = 0; k < n; k++) {
    CHECK(weft_runtime_synchronize(t[k].rt));
    if (e[k] != NULL) CHECK(weft_exec_destroy(e[k]));
    if (g[k] != NULL) CHECK(weft_graph_destroy(g[k]));
  }
  free(g);
  free(e);
}

static void read_weights(rank_t *t, float *w) {
  CHECK(weft_copy_from_block(t->host, w, t->w1, 0, NW1 * sizeof(float)));
  CHECK(weft_copy_from_block(t->host, w + NW1, t->w2, 0, MLP_HIDDEN * sizeof(float)));
  CHECK(weft_stream_synchronize(t->host));
}

static float read_loss(rank_t *t) {
  float l[MLP_BATCH];
  CHECK(weft_copy_from_block(t->host, l, t->loss, 0, sizeof l));
  CHECK(weft_stream_synchronize(t->host));
  double s = 0;
  for (int b = 0; b < MLP_BATCH; b++) s += l[b];
  return (float)s;
}

/* The initial weights, the same on every rank. */
static void initial_weights(float *w1, float *b1, float *w2, float *b2) {
  unsigned s = 11;
  for (int i = 0; i < NW1; i++) w1[i] = ((float)(rand_r(&s) % 10000) / 10000.0f - 0.5f) * 0.5f;
  for (int i = 0; i < MLP_HIDDEN; i++) b1[i] = 0.01f, w2[i] = ((float)(rand_r(&s) % 10000) / 10000.0f - 0.5f) * 0.3f;
  b2[0] = 0.0f;
}

static void set_weights(rank_t *t) {
  float w1[NW1], b1[MLP_HIDDEN], w2[MLP_HIDDEN], b2[1];
  initial_weights(w1, b1, w2, b2);
  CHECK(weft_copy_to_block(t->copy, t->w1, 0, w1, sizeof w1));
  CHECK(weft_copy_to_block(t->copy, t->b1, 0, b1, sizeof b1));
  CHECK(weft_copy_to_block(t->copy, t->w2, 0, w2, sizeof w2));
  CHECK(weft_copy_to_block(t->copy, t->b2, 0, b2, sizeof b2));
  CHECK(weft_stream_synchronize(t->copy)); /* the host arrays are on the stack */
}

/* The same steps on t's device alone over the whole batch of t->world slices: every slice's
 * gradient at the same weights, their average (the sum of each times 1 / world, which for two
 * slices rounds exactly as NCCL's average does), then the update. Uses t's buffers (its
 * data-parallel run is over) with weights of its own. */
static void reference(rank_t *t, float *w) {
  rank_t ref = *t;
  ref.w1 = floats(t, NW1, "ref w1");
  ref.b1 = floats(t, MLP_HIDDEN, "ref b1");
  ref.w2 = floats(t, MLP_HIDDEN, "ref w2");
  ref.b2 = floats(t, 1, "ref b2");
  set_weights(&ref);
  int world = t->world;
  weft_block_t *g1 = calloc((size_t)world, sizeof *g1), *g2 = calloc((size_t)world, sizeof *g2);
  for (int s = 0; s < world; s++) g1[s] = floats(t, NDW1, "ref dw1"), g2[s] = floats(t, NDW2, "ref dw2");
  weft_block_t avg1 = floats(t, NDW1, "ref avg dw1"), avg2 = floats(t, NDW2, "ref avg dw2");
  for (int i = 0; i < g_steps; i++) {
    for (int s = 0; s < world; s++) {
      copy_in(&ref, i, s);
      forward_and_out(&ref);
      backward_in(&ref);
      CHECK(weft_copy_block(t->compute, g1[s], 0, ref.dw1, 0, NDW1 * sizeof(float)));
      CHECK(weft_copy_block(t->compute, g2[s], 0, ref.dw2, 0, NDW2 * sizeof(float)));
    }
    CHECK(weft_memset32(t->compute, avg1, 0, 0, NDW1 * sizeof(float)));
    CHECK(weft_memset32(t->compute, avg2, 0, 0, NDW2 * sizeof(float)));
    for (int s = 0; s < world; s++) { /* avg += g / world, as p -= lr g with lr = -1 / world */
      sgd(&ref, avg1, g1[s], 0, NDW1, -1.0f / (float)world);
      sgd(&ref, avg2, g2[s], 0, NDW2, -1.0f / (float)world);
    }
    update(&ref, avg1, avg2, ref.lr);
  }
  CHECK(weft_free(avg1, t->compute));
  CHECK(weft_free(avg2, t->compute));
  read_weights(&ref, w);
  for (int s = 0; s < world; s++) {
    CHECK(weft_free(g1[s], t->compute));
    CHECK(weft_free(g2[s], t->compute));
  }
  CHECK(weft_free(ref.w1, t->compute));
  CHECK(weft_free(ref.b1, t->compute));
  CHECK(weft_free(ref.w2, t->compute));
  CHECK(weft_free(ref.b2, t->compute));
  free(g1);
  free(g2);
}

static void make_data(int world) {
  size_t n = (size_t)g_steps * (size_t)world * MLP_BATCH;
  g_x = malloc(n * MLP_IN * sizeof *g_x);
  g_y = malloc(n * sizeof *g_y);
  float a[MLP_IN];
  unsigned s = 7;
  for (int k = 0; k < MLP_IN; k++) a[k] = (float)(rand_r(&s) % 10000) / 10000.0f - 0.5f;
  for (size_t i = 0; i < n; i++) {
    float d = 0;
    for (int k = 0; k < MLP_IN; k++) {
      float v = 2.0f * (float)(rand_r(&s) % 10000) / 10000.0f - 1.0f;
      g_x[i * MLP_IN + k] = v;
      d += v * a[k];
    }
    g_y[i] = 0.5f * sinf(2.0f * d);
  }
}

/* Checks rank t's weights against the one-device run; prints them hashed. 0 when they agree. */
static int check(rank_t *t) {
  float w[NW1 + MLP_HIDDEN], ref[NW1 + MLP_HIDDEN];
  read_weights(t, w);
  reference(t, ref);
  double worst = 0;
  uint64_t hash = 1469598103934665603ull;
  for (int i = 0; i < NW1 + MLP_HIDDEN; i++) {
    double rel = fabs((double)w[i] - ref[i]) / fmax(fabs((double)ref[i]), 1e-3);
    if (rel > worst) worst = rel;
    uint32_t bits;
    memcpy(&bits, &w[i], 4);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  printf("rank %d: weights hash %016llx, largest relative difference to one device on the whole batch %.2e (%s)\n",
         t->r, (unsigned long long)hash, worst, worst <= 1e-5 ? "ok" : "TOO LARGE");
  return worst <= 1e-5 ? 0 : 1;
}

/* ---- one process, every device ---- */

static int run_all(int world) {
  rank_t *t = calloc((size_t)world, sizeof *t);
  weft_runtime_t **rts = calloc((size_t)world, sizeof *rts);
  weft_comm_t **comms = calloc((size_t)world, sizeof *comms);
  for (int r = 0; r < world; r++) rank_init(&t[r], r, world, r), rts[r] = t[r].rt;
  CHECK(weft_comm_init_all(rts, world, comms));
  for (int r = 0; r < world; r++) t[r].comm = comms[r];
  float first = 0, last = 0;
  train(t, world, &first);
  last = read_loss(&t[0]);
  printf("one process, %d devices: loss of rank 0's slice %.5f -> %.5f over %d steps (%d eager, %d replayed)\n", world,
         first, last, g_steps, g_steps / 2, g_steps - g_steps / 2);
  int bad = last < first ? 0 : 1;
  for (int r = 0; r < world; r++) bad |= check(&t[r]);
  for (int r = 0; r < world; r++) CHECK(weft_comm_destroy(comms[r]));
  free(t);
  free(rts);
  free(comms);
  return bad;
}

/* ---- one process (or thread) per device ---- */

typedef struct per_rank {
  int r, world, dev;
  const char *id_file;
  int bad;
} per_rank_t;

static void *run_rank(void *arg) {
  per_rank_t *pr = arg;
  weft_comm_id_t id;
  if (pr->r == 0) {
    CHECK(weft_comm_unique_id(&id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", pr->id_file);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, pr->id_file) != 0)
      fprintf(stderr, "rank 0: cannot write %s\n", pr->id_file), exit(1);
  } else {
    FILE *f = NULL;
    for (int tries = 0; tries < 6000 && (f = fopen(pr->id_file, "rb")) == NULL; tries++) usleep(10000);
    if (f == NULL || fread(&id, sizeof id, 1, f) != 1) fprintf(stderr, "rank %d: no id in %s\n", pr->r, pr->id_file), exit(1);
    fclose(f);
  }
  rank_t t;
  rank_init(&t, pr->r, pr->world, pr->dev);
  CHECK(weft_comm_init_rank(t.rt, pr->world, &id, pr->r, &t.comm));
  float first = 0;
  train(&t, 1, &first);
  float last = read_loss(&t);
  printf("rank %d of %d: loss of its slice %.5f -> %.5f over %d steps (%d eager, %d replayed)\n", pr->r, pr->world,
         first, last, g_steps, g_steps / 2, g_steps - g_steps / 2);
  pr->bad = (last < first ? 0 : 1) | check(&t);
  CHECK(weft_comm_destroy(t.comm));
  return NULL;
}

int main(int argc, char **argv) {
  int ranks = 0, rank = -1, world = 0, threads = 0, device = -1;
  const char *id_file = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--steps") == 0) g_steps = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--ranks") == 0) ranks = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--rank") == 0) rank = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--world") == 0) world = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--rank-threads") == 0) threads = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--id-file") == 0) id_file = argv[i + 1];
    else if (strcmp(argv[i], "--device") == 0) device = atoi(argv[i + 1]);
    else return fprintf(stderr, "unknown argument %s\n", argv[i]), 2;
  }
  if (g_steps < 2) g_steps = 2;
  load_driver_functions();
  mlp_register_sim();
  weft_driver_info_t info;
  CHECK(weft_driver_info(&info));
  int ndev = info.device_count;
  printf("weft data_parallel: MLP %d-%d-1, %d samples a rank a step, %d steps, %d device(s)%s\n", MLP_IN, MLP_HIDDEN,
         MLP_BATCH, g_steps, ndev, info.is_simulator ? " (simulated, with the simulated NCCL)" : "");
  if (threads > 0 || rank >= 0) {
    int w = threads > 0 ? threads : world;
    if (device < 0) device = rank;
    if (id_file == NULL || w < 1 || (threads > 0 && w > ndev) || (threads == 0 && (rank >= w || device >= ndev)))
      return fprintf(stderr, "need --id-file, 0 <= rank < world, and a device (--device) of the %d here\n", ndev), 2;
    make_data(w);
    per_rank_t *pr = calloc((size_t)w, sizeof *pr);
    int bad = 0;
    if (threads > 0) {
      pthread_t *th = calloc((size_t)w, sizeof *th);
      for (int r = 0; r < w; r++) pr[r] = (per_rank_t){r, w, r, id_file, 0}, pthread_create(&th[r], NULL, run_rank, &pr[r]);
      for (int r = 0; r < w; r++) pthread_join(th[r], NULL), bad |= pr[r].bad;
      free(th);
    } else {
      pr[0] = (per_rank_t){rank, w, device, id_file, 0};
      run_rank(&pr[0]);
      bad = pr[0].bad;
    }
    free(pr);
    printf("%s\n", bad ? "FAILED" : "OK");
    return bad;
  }
  int w = ranks > 0 ? ranks : ndev;
  if (w < 1 || w > ndev) return fprintf(stderr, "--ranks %d: %d device(s)\n", w, ndev), 2;
  make_data(w);
  int bad = run_all(w);
  printf("%s\n", bad ? "FAILED" : "OK");
  return bad;
}
