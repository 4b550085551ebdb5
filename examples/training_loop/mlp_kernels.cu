// The training-loop example's kernels. Host twins: mlp_kernels_sim.c (same arithmetic, mlp.h).
#include "examples/training_loop/mlp.h"

#define IDX (blockIdx.x * blockDim.x + threadIdx.x)

// h = relu(x w1 + b1): one thread per (b, j)
extern "C" __global__ void mlp_forward_hidden(const float *x, const float *w1, const float *b1, float *h) {
  int i = IDX;
  if (i < MLP_BATCH * MLP_HIDDEN) h[i] = mlp_hidden(x, w1, b1, i / MLP_HIDDEN, i % MLP_HIDDEN);
}
// yhat = h w2 + b2, dy = 2 (yhat - y) / B, loss[b] = (yhat - y)^2 / B: one thread per b
extern "C" __global__ void mlp_forward_loss(const float *h, const float *w2, const float *b2, const float *y, float *dy,
                                            float *loss) {
  int b = IDX;
  if (b < MLP_BATCH) {
    float e = mlp_out(h, w2, b2, b) - y[b];
    dy[b] = 2.0f * e / MLP_BATCH;
    loss[b] = e * e / MLP_BATCH;
  }
}
// dw2 (and db2 at index MLP_HIDDEN): one thread per j
extern "C" __global__ void mlp_backward_out(const float *h, const float *dy, float *dw2) {
  int j = IDX;
  if (j <= MLP_HIDDEN) dw2[j] = mlp_dw2(h, dy, j);
}
// dh: one thread per (b, j)
extern "C" __global__ void mlp_backward_hidden(const float *h, const float *dy, const float *w2, float *dh) {
  int i = IDX;
  if (i < MLP_BATCH * MLP_HIDDEN) dh[i] = mlp_dh(h, dy, w2, i / MLP_HIDDEN, i % MLP_HIDDEN);
}
// dw1 (rows 0..IN-1) and db1 (row IN): one thread per (k, j)
extern "C" __global__ void mlp_backward_in(const float *x, const float *dh, float *dw1) {
  int i = IDX;
  if (i < (MLP_IN + 1) * MLP_HIDDEN) dw1[i] = mlp_dw1(x, dh, i / MLP_HIDDEN, i % MLP_HIDDEN);
}
// p -= lr * g
extern "C" __global__ void mlp_sgd(float *p, const float *g, int n, float lr) {
  int i = IDX;
  if (i < n) p[i] -= lr * g[i];
}
