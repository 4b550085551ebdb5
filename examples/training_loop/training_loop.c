/* weft's main demo: a small MLP trained with SGD on synthetic data.
 *
 * Each step runs forward, loss, backward and update; its temporaries are allocated and freed
 * inside the step; the output layer's backward pass runs on a side stream, and the next batch
 * is copied in on a third stream while the step runs. weft orders all of it: no event is
 * written by hand. The demo trains N steps eagerly, then captures one step per input buffer
 * into CUDA graphs and trains the same N steps again from the same initial weights by replaying
 * them, and checks that both runs agree bit for bit and that the loss fell.
 *
 *   training_loop [--steps N]      (default 300 on a GPU, 60 on the simulator) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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


typedef struct trainer {
  weft_runtime_t *rt;
  CUfunction k[K_COUNT];
  weft_stream_t *compute, *side, *copy, *host;
  weft_block_t x[2], y[2];         /* double-buffered batch */
  weft_block_t w1, b1, w2, b2;     /* parameters */
  weft_block_t loss;               /* per-sample loss of the latest step */
  float lr;
} trainer_t;

static weft_block_t alloc_floats(trainer_t *t, size_t n, const char *tag) {
  weft_block_t b;
  CHECK(weft_alloc(t->rt, n * sizeof(float), t->compute, tag, &b));
  return b;
}

static CUdeviceptr ptr(weft_block_t b) {
  CUdeviceptr p;
  CHECK(weft_block_ptr(b, &p));
  return p;
}

/* One kernel launch as a tracked use: `acc` says what it reads and writes. */
static void launch(trainer_t *t, weft_stream_t *s, int kernel, unsigned threads, void **params, const weft_access_t *acc,
                   size_t n) {
  weft_launch_t l = {.func = t->k[kernel], .grid = {(threads + 127) / 128}, .block = {128}, .params = params};
  CHECK(weft_launch(s, &l, acc, n));
}

static void sgd(trainer_t *t, weft_stream_t *s, weft_block_t p, weft_block_t g, size_t offset, int n) {
  CUdeviceptr pp = ptr(p), gp = ptr(g) + offset * sizeof(float);
  void *params[] = {&pp, &gp, &n, &t->lr};
  weft_access_t acc[] = {{p, WEFT_READ_WRITE}, {g, WEFT_READ}};
  launch(t, s, K_SGD, (unsigned)n, params, acc, 2);
}

/* One training step on batch buffer `buf`. The same code runs eagerly and under capture. */
static weft_status_t step(weft_stream_t *s, void *arg) {
  trainer_t *t = ((trainer_t **)arg)[0];
  int buf = *(int *)((trainer_t **)arg)[1];
  weft_block_t h = alloc_floats(t, MLP_BATCH * MLP_HIDDEN, "h"), dy = alloc_floats(t, MLP_BATCH, "dy");
  weft_block_t dw2 = alloc_floats(t, MLP_HIDDEN + 1, "dw2"), dh = alloc_floats(t, MLP_BATCH * MLP_HIDDEN, "dh");
  weft_block_t dw1 = alloc_floats(t, (MLP_IN + 1) * MLP_HIDDEN, "dw1");
  CUdeviceptr x = ptr(t->x[buf]), y = ptr(t->y[buf]), w1 = ptr(t->w1), b1 = ptr(t->b1), w2 = ptr(t->w2), b2 = ptr(t->b2);
  CUdeviceptr ph = ptr(h), pdy = ptr(dy), pdw2 = ptr(dw2), pdh = ptr(dh), pdw1 = ptr(dw1), ploss = ptr(t->loss);
  {
    void *p[] = {&x, &w1, &b1, &ph};
    weft_access_t a[] = {{t->x[buf], WEFT_READ}, {t->w1, WEFT_READ}, {t->b1, WEFT_READ}, {h, WEFT_WRITE}};
    launch(t, s, K_HIDDEN, MLP_BATCH * MLP_HIDDEN, p, a, 4);
  }
  {
    void *p[] = {&ph, &w2, &b2, &y, &pdy, &ploss};
    weft_access_t a[] = {{h, WEFT_READ},  {t->w2, WEFT_READ}, {t->b2, WEFT_READ},
                         {t->y[buf], WEFT_READ}, {dy, WEFT_WRITE}, {t->loss, WEFT_WRITE}};
    launch(t, s, K_LOSS, MLP_BATCH, p, a, 6);
  }
  /* The output layer's gradient and update on the side stream, concurrently with dh. */
  {
    void *p[] = {&ph, &pdy, &pdw2};
    weft_access_t a[] = {{h, WEFT_READ}, {dy, WEFT_READ}, {dw2, WEFT_WRITE}};
    launch(t, t->side, K_BOUT, MLP_HIDDEN + 1, p, a, 3);
  }
  {
    void *p[] = {&ph, &pdy, &w2, &pdh};
    weft_access_t a[] = {{h, WEFT_READ}, {dy, WEFT_READ}, {t->w2, WEFT_READ}, {dh, WEFT_WRITE}};
    launch(t, s, K_BHIDDEN, MLP_BATCH * MLP_HIDDEN, p, a, 4);
  }
  sgd(t, t->side, t->w2, dw2, 0, MLP_HIDDEN); /* waits for the read of w2 above: write-after-read */
  sgd(t, t->side, t->b2, dw2, MLP_HIDDEN, 1);
  {
    void *p[] = {&x, &pdh, &pdw1};
    weft_access_t a[] = {{t->x[buf], WEFT_READ}, {dh, WEFT_READ}, {dw1, WEFT_WRITE}};
    launch(t, s, K_BIN, (MLP_IN + 1) * MLP_HIDDEN, p, a, 3);
  }
  sgd(t, s, t->w1, dw1, 0, MLP_IN * MLP_HIDDEN);
  sgd(t, s, t->b1, dw1, MLP_IN * MLP_HIDDEN, MLP_HIDDEN);
  CHECK(weft_free(h, s));
  CHECK(weft_free(dy, s));
  CHECK(weft_free(dh, s));
  CHECK(weft_free(dw1, s));
  CHECK(weft_free(dw2, t->side));
  return WEFT_OK;
}

/* Synthetic regression: y = 0.5 sin(2 x.a) + x.b, inputs uniform in [-1, 1]. */
static void make_data(float *x, float *y, int steps, unsigned seed) {
  float a[MLP_IN], b[MLP_IN];
  srand(seed);
  for (int k = 0; k < MLP_IN; k++) a[k] = (float)rand() / RAND_MAX - 0.5f, b[k] = ((float)rand() / RAND_MAX - 0.5f) * 0.3f;
  for (long i = 0; i < (long)steps * MLP_BATCH; i++) {
    float da = 0, db = 0;
    for (int k = 0; k < MLP_IN; k++) {
      float v = 2.0f * rand() / RAND_MAX - 1.0f;
      x[i * MLP_IN + k] = v;
      da += v * a[k];
      db += v * b[k];
    }
    y[i] = 0.5f * sinf(2.0f * da) + db;
  }
}

static void init_params(trainer_t *t, unsigned seed) {
  static float w1[MLP_IN * MLP_HIDDEN], b1[MLP_HIDDEN], w2[MLP_HIDDEN], b2[1];
  srand(seed);
  for (int i = 0; i < MLP_IN * MLP_HIDDEN; i++) w1[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.5f;
  for (int i = 0; i < MLP_HIDDEN; i++) b1[i] = 0.01f, w2[i] = ((float)rand() / RAND_MAX - 0.5f) * 0.3f;
  b2[0] = 0;
  CHECK(weft_copy_to_block(t->copy, t->w1, 0, w1, sizeof w1));
  CHECK(weft_copy_to_block(t->copy, t->b1, 0, b1, sizeof b1));
  CHECK(weft_copy_to_block(t->copy, t->w2, 0, w2, sizeof w2));
  CHECK(weft_copy_to_block(t->copy, t->b2, 0, b2, sizeof b2));
  CHECK(weft_stream_synchronize(t->copy)); /* the host arrays are static: keep the copy simple */
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float read_loss(trainer_t *t) {
  float l[MLP_BATCH];
  CHECK(weft_copy_from_block(t->host, l, t->loss, 0, sizeof l));
  CHECK(weft_stream_synchronize(t->host));
  double sum = 0;
  for (int b = 0; b < MLP_BATCH; b++) sum += l[b];
  return (float)sum;
}

static void read_params(trainer_t *t, float *out) {
  CHECK(weft_copy_from_block(t->host, out, t->w1, 0, MLP_IN * MLP_HIDDEN * sizeof(float)));
  CHECK(weft_copy_from_block(t->host, out + MLP_IN * MLP_HIDDEN, t->w2, 0, MLP_HIDDEN * sizeof(float)));
  CHECK(weft_stream_synchronize(t->host));
}

/* Copies batch i into buffer i % 2 (tracked: waits for the step that last read that buffer). */
static void copy_in(trainer_t *t, const float *hx, const float *hy, int i) {
  int buf = i % 2;
  CHECK(weft_copy_to_block(t->copy, t->x[buf], 0, hx + (size_t)i * MLP_BATCH * MLP_IN, MLP_BATCH * MLP_IN * sizeof(float)));
  CHECK(weft_copy_to_block(t->copy, t->y[buf], 0, hy + (size_t)i * MLP_BATCH, MLP_BATCH * sizeof(float)));
}

int main(int argc, char **argv) {
  trainer_t t = {.lr = 0.1f};
  CHECK(weft_runtime_get(0, NULL, &t.rt));
  weft_driver_info_t info;
  CHECK(weft_driver_info(&info));
  int steps = info.is_simulator ? 60 : 300;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
  if (steps < 10) steps = 10;
  /* Driver calls weft has no wrapper for come from the library weft loaded. */
  CUresult (*device_get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))weft_driver_symbol("cuDeviceGet");
  CUresult (*device_name)(char *, int, CUdevice) = (CUresult(*)(char *, int, CUdevice))weft_driver_symbol("cuDeviceGetName");
  CUresult (*module_load)(CUmodule *, const void *) = (CUresult(*)(CUmodule *, const void *))weft_driver_symbol("cuModuleLoadData");
  CUresult (*get_function)(CUfunction *, CUmodule, const char *) =
      (CUresult(*)(CUfunction *, CUmodule, const char *))weft_driver_symbol("cuModuleGetFunction");
  CUresult (*module_unload)(CUmodule) = (CUresult(*)(CUmodule))weft_driver_symbol("cuModuleUnload");
  if (!device_get || !device_name || !module_load || !get_function || !module_unload)
    return fprintf(stderr, "the CUDA driver lacks module functions\n"), 1;
  char name[128] = "simulator";
  CUdevice dev;
  if (device_get(&dev, 0) == CUDA_SUCCESS) device_name(name, sizeof name, dev);
  printf("weft training_loop: MLP %d-%d-1, batch %d, %d steps, on %s%s\n", MLP_IN, MLP_HIDDEN, MLP_BATCH, steps, name,
         info.is_simulator ? " (no GPU: the CPU simulator runs the kernels' host twins)" : "");
  mlp_register_sim();
  CUmodule mod;
  if (module_load(&mod, mlp_kernels_fatbin) != CUDA_SUCCESS) return fprintf(stderr, "cannot load kernels\n"), 1;
  for (int i = 0; i < K_COUNT; i++)
    if (get_function(&t.k[i], mod, mlp_kernel_name(i)) != CUDA_SUCCESS) return 1;
  CHECK(weft_stream_get(t.rt, 0, &t.compute));
  CHECK(weft_stream_get(t.rt, 1, &t.side));
  CHECK(weft_stream_get(t.rt, 2, &t.copy));
  CHECK(weft_stream_get(t.rt, 3, &t.host));
  for (int b = 0; b < 2; b++) {
    t.x[b] = alloc_floats(&t, MLP_BATCH * MLP_IN, "x");
    t.y[b] = alloc_floats(&t, MLP_BATCH, "y");
  }
  t.w1 = alloc_floats(&t, MLP_IN * MLP_HIDDEN, "w1");
  t.b1 = alloc_floats(&t, MLP_HIDDEN, "b1");
  t.w2 = alloc_floats(&t, MLP_HIDDEN, "w2");
  t.b2 = alloc_floats(&t, 1, "b2");
  t.loss = alloc_floats(&t, MLP_BATCH, "loss");
  float *hx = malloc(sizeof(float) * MLP_BATCH * MLP_IN * (size_t)(steps + 1));
  float *hy = malloc(sizeof(float) * MLP_BATCH * (size_t)(steps + 1));
  make_data(hx, hy, steps + 1, 7);

  /* ---- eager ---- */
  init_params(&t, 11);
  int buf = 0;
  trainer_t *tp = &t;
  void *arg[2] = {tp, &buf};
  float eager_loss[3] = {0}, replay_loss[3] = {0};
  copy_in(&t, hx, hy, 0);
  CHECK(weft_runtime_synchronize(t.rt));
  weft_counters_t c0, c1, c2;
  CHECK(weft_runtime_counters(t.rt, &c0));
  double t0 = now_s();
  for (int i = 0; i < steps; i++) {
    copy_in(&t, hx, hy, i + 1); /* the next batch, while this step runs */
    buf = i % 2;
    step(t.compute, arg);
    if (i == 0) eager_loss[0] = read_loss(&t);
    if (i == steps / 2) eager_loss[1] = read_loss(&t);
  }
  CHECK(weft_runtime_synchronize(t.rt));
  double eager_s = now_s() - t0;
  eager_loss[2] = read_loss(&t);
  CHECK(weft_runtime_counters(t.rt, &c1));
  float *pe = malloc(sizeof(float) * (MLP_IN + 1) * MLP_HIDDEN), *pr = malloc(sizeof(float) * (MLP_IN + 1) * MLP_HIDDEN);
  read_params(&t, pe);
  weft_resource_stats_t mem;
  weft_resource_stats(weft_runtime_resource(t.rt), &mem);

  /* ---- capture one step per buffer, replay ---- */
  weft_graph_t *g[2];
  weft_exec_t *e[2];
  for (int b = 0; b < 2; b++) {
    buf = b;
    CHECK(weft_capture_begin(t.compute, NULL));
    CHECK(weft_capture_join(t.compute, t.side));
    step(t.compute, arg);
    CHECK(weft_capture_end(t.compute, &g[b]));
    CHECK(weft_graph_instantiate(g[b], t.compute, &e[b]));
  }
  init_params(&t, 11);
  copy_in(&t, hx, hy, 0);
  CHECK(weft_runtime_synchronize(t.rt));
  t0 = now_s();
  for (int i = 0; i < steps; i++) {
    copy_in(&t, hx, hy, i + 1);
    CHECK(weft_exec_launch(e[i % 2], t.compute));
    if (i == 0) replay_loss[0] = read_loss(&t);
    if (i == steps / 2) replay_loss[1] = read_loss(&t);
  }
  CHECK(weft_runtime_synchronize(t.rt));
  double replay_s = now_s() - t0;
  replay_loss[2] = read_loss(&t);
  CHECK(weft_runtime_counters(t.rt, &c2));
  read_params(&t, pr);
  float maxdiff = 0;
  for (int i = 0; i < MLP_IN * MLP_HIDDEN + MLP_HIDDEN; i++) maxdiff = fmaxf(maxdiff, fabsf(pe[i] - pr[i]));
  weft_graph_memory_stats_t gm = {0};
  if (weft_graph_memory_stats(t.rt, &gm) != WEFT_OK) memset(&gm, 0, sizeof gm);

  printf("loss (eager):  step 1 %.5f   step %d %.5f   step %d %.5f\n", eager_loss[0], steps / 2 + 1, eager_loss[1], steps,
         eager_loss[2]);
  printf("loss (replay): step 1 %.5f   step %d %.5f   step %d %.5f\n", replay_loss[0], steps / 2 + 1, replay_loss[1],
         steps, replay_loss[2]);
  printf("time per step: eager %.1f us, graph replay %.1f us (%.2fx)%s\n", eager_s / steps * 1e6, replay_s / steps * 1e6,
         eager_s / replay_s, info.is_simulator ? "  [simulator: not performance numbers]" : "");
  printf("eager vs replay: max |weight difference| = %g over %d weights (%s)\n", maxdiff, MLP_IN * MLP_HIDDEN + MLP_HIDDEN,
         maxdiff == 0 ? "bit for bit identical" : "DIFFERENT");
  printf("memory: eager peak live %.1f KiB, peak reserved %.1f MiB; graph memory high %.1f KiB used, %.1f MiB reserved\n",
         mem.live_peak / 1024.0, mem.reserved_peak / 1048576.0, gm.used_high / 1024.0, gm.reserved_high / 1048576.0);
  printf("waits: eager %llu issued, %llu skipped as implied; replay %llu issued over %d launches\n",
         (unsigned long long)(c1.waits_issued - c0.waits_issued), (unsigned long long)(c1.waits_skipped - c0.waits_skipped),
         (unsigned long long)(c2.waits_issued - c1.waits_issued), steps);
  int ok = eager_loss[2] < 0.7f * eager_loss[0] && maxdiff == 0 && replay_loss[2] == eager_loss[2];
  printf("%s\n", ok ? "OK: the loss fell and both runs agree" : "FAILED");
  for (int b = 0; b < 2; b++) {
    CHECK(weft_exec_destroy(e[b]));
    CHECK(weft_graph_destroy(g[b]));
  }
  module_unload(mod);
  CHECK(weft_runtime_release(t.rt));
  free(hx);
  free(hy);
  free(pe);
  free(pr);
  return ok ? 0 : 1;
}
