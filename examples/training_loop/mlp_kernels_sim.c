/* Host twins of mlp_kernels.cu for the simulator, and the byte ranges each launch touches. */
#include <stdint.h>

#include "examples/training_loop/mlp.h"
#include "examples/training_loop/mlp_kernels_sim.h"
#include "sim/weft_sim.h"
#include "weft/weft.h"

#define P(type, i) (*(type *)params[i])
#define R(i, n, a) (weft_sim_range_t){(CUdeviceptr)(uintptr_t)P(void *, i), (size_t)(n) * sizeof(float), a}

static size_t put(weft_sim_range_t *out, size_t max, const weft_sim_range_t *r, size_t n) {
  for (size_t i = 0; i < n && i < max; i++) out[i] = r[i];
  return n;
}

static void fwd_hidden(const weft_sim_launch_t *l, void **params) {
  (void)l;
  const float *x = P(float *, 0), *w1 = P(float *, 1), *b1 = P(float *, 2);
  float *h = P(float *, 3);
  for (int i = 0; i < MLP_BATCH * MLP_HIDDEN; i++) h[i] = mlp_hidden(x, w1, b1, i / MLP_HIDDEN, i % MLP_HIDDEN);
}
static size_t fwd_hidden_r(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  weft_sim_range_t r[] = {R(0, MLP_BATCH * MLP_IN, WEFT_SIM_READ), R(1, MLP_IN * MLP_HIDDEN, WEFT_SIM_READ),
                          R(2, MLP_HIDDEN, WEFT_SIM_READ), R(3, MLP_BATCH * MLP_HIDDEN, WEFT_SIM_WRITE)};
  return put(out, max, r, 4);
}

static void fwd_loss(const weft_sim_launch_t *l, void **params) {
  (void)l;
  const float *h = P(float *, 0), *w2 = P(float *, 1), *b2 = P(float *, 2), *y = P(float *, 3);
  float *dy = P(float *, 4), *loss = P(float *, 5);
  for (int b = 0; b < MLP_BATCH; b++) {
    float e = mlp_out(h, w2, b2, b) - y[b];
    dy[b] = 2.0f * e / MLP_BATCH;
    loss[b] = e * e / MLP_BATCH;
  }
}
static size_t fwd_loss_r(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  weft_sim_range_t r[] = {R(0, MLP_BATCH * MLP_HIDDEN, WEFT_SIM_READ), R(1, MLP_HIDDEN, WEFT_SIM_READ),
                          R(2, 1, WEFT_SIM_READ), R(3, MLP_BATCH, WEFT_SIM_READ), R(4, MLP_BATCH, WEFT_SIM_WRITE),
                          R(5, MLP_BATCH, WEFT_SIM_WRITE)};
  return put(out, max, r, 6);
}

static void bwd_out(const weft_sim_launch_t *l, void **params) {
  (void)l;
  const float *h = P(float *, 0), *dy = P(float *, 1);
  float *dw2 = P(float *, 2);
  for (int j = 0; j <= MLP_HIDDEN; j++) dw2[j] = mlp_dw2(h, dy, j);
}
static size_t bwd_out_r(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  weft_sim_range_t r[] = {R(0, MLP_BATCH * MLP_HIDDEN, WEFT_SIM_READ), R(1, MLP_BATCH, WEFT_SIM_READ),
                          R(2, MLP_HIDDEN + 1, WEFT_SIM_WRITE)};
  return put(out, max, r, 3);
}

static void bwd_hidden(const weft_sim_launch_t *l, void **params) {
  (void)l;
  const float *h = P(float *, 0), *dy = P(float *, 1), *w2 = P(float *, 2);
  float *dh = P(float *, 3);
  for (int i = 0; i < MLP_BATCH * MLP_HIDDEN; i++) dh[i] = mlp_dh(h, dy, w2, i / MLP_HIDDEN, i % MLP_HIDDEN);
}
static size_t bwd_hidden_r(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  weft_sim_range_t r[] = {R(0, MLP_BATCH * MLP_HIDDEN, WEFT_SIM_READ), R(1, MLP_BATCH, WEFT_SIM_READ),
                          R(2, MLP_HIDDEN, WEFT_SIM_READ), R(3, MLP_BATCH * MLP_HIDDEN, WEFT_SIM_WRITE)};
  return put(out, max, r, 4);
}

static void bwd_in(const weft_sim_launch_t *l, void **params) {
  (void)l;
  const float *x = P(float *, 0), *dh = P(float *, 1);
  float *dw1 = P(float *, 2);
  for (int i = 0; i < (MLP_IN + 1) * MLP_HIDDEN; i++) dw1[i] = mlp_dw1(x, dh, i / MLP_HIDDEN, i % MLP_HIDDEN);
}
static size_t bwd_in_r(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  weft_sim_range_t r[] = {R(0, MLP_BATCH * MLP_IN, WEFT_SIM_READ), R(1, MLP_BATCH * MLP_HIDDEN, WEFT_SIM_READ),
                          R(2, (MLP_IN + 1) * MLP_HIDDEN, WEFT_SIM_WRITE)};
  return put(out, max, r, 3);
}

static void sgd(const weft_sim_launch_t *l, void **params) {
  (void)l;
  float *p = P(float *, 0);
  const float *g = P(float *, 1);
  int n = P(int, 2);
  float lr = P(float, 3);
  for (int i = 0; i < n; i++) p[i] -= lr * g[i];
}
static size_t sgd_r(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  int n = P(int, 2);
  weft_sim_range_t r[] = {R(0, n, WEFT_SIM_READ_WRITE), R(1, n, WEFT_SIM_READ)};
  return put(out, max, r, 2);
}

int mlp_register_sim(void) {
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL) return 0;
  static const size_t p4[] = {8, 8, 8, 8}, p6[] = {8, 8, 8, 8, 8, 8}, p3[] = {8, 8, 8}, psgd[] = {8, 8, 4, 4};
  sim->register_kernel_params("mlp_forward_hidden", fwd_hidden, fwd_hidden_r, 4, p4);
  sim->register_kernel_params("mlp_forward_loss", fwd_loss, fwd_loss_r, 6, p6);
  sim->register_kernel_params("mlp_backward_out", bwd_out, bwd_out_r, 3, p3);
  sim->register_kernel_params("mlp_backward_hidden", bwd_hidden, bwd_hidden_r, 4, p4);
  sim->register_kernel_params("mlp_backward_in", bwd_in, bwd_in_r, 3, p3);
  sim->register_kernel_params("mlp_sgd", sgd, sgd_r, 4, psgd);
  return 1;
}
