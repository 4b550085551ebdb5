/* The MLP of the training-loop example: shapes and the kernels' arithmetic, shared by the CUDA
 * kernels (mlp_kernels.cu) and their host twins (mlp_kernels_sim.c) so both compute the same
 * thing in the same order. One output element per thread, fixed summation order: results are
 * deterministic, so eager and replayed steps agree bit for bit. */
#pragma once

#define MLP_BATCH 256
#define MLP_IN 32
#define MLP_HIDDEN 64

#ifdef __CUDACC__
#define MLP_FN __host__ __device__ static inline
#else
#define MLP_FN static inline
#endif

/* h[b][j] = relu(b1[j] + sum_k x[b][k] w1[k][j]) */
MLP_FN float mlp_hidden(const float *x, const float *w1, const float *b1, int b, int j) {
  float a = b1[j];
  for (int k = 0; k < MLP_IN; k++) a += x[b * MLP_IN + k] * w1[k * MLP_HIDDEN + j];
  return a > 0.0f ? a : 0.0f;
}
/* yhat[b] = b2 + sum_j h[b][j] w2[j] */
MLP_FN float mlp_out(const float *h, const float *w2, const float *b2, int b) {
  float a = b2[0];
  for (int j = 0; j < MLP_HIDDEN; j++) a += h[b * MLP_HIDDEN + j] * w2[j];
  return a;
}
/* dw2[j] = sum_b h[b][j] dy[b]; (j == MLP_HIDDEN: db2 = sum_b dy[b]) */
MLP_FN float mlp_dw2(const float *h, const float *dy, int j) {
  float a = 0.0f;
  for (int b = 0; b < MLP_BATCH; b++) a += (j < MLP_HIDDEN ? h[b * MLP_HIDDEN + j] : 1.0f) * dy[b];
  return a;
}
/* dh[b][j] = dy[b] w2[j] if h[b][j] > 0 */
MLP_FN float mlp_dh(const float *h, const float *dy, const float *w2, int b, int j) {
  return h[b * MLP_HIDDEN + j] > 0.0f ? dy[b] * w2[j] : 0.0f;
}
/* dw1[k][j] = sum_b x[b][k] dh[b][j]; (k == MLP_IN: db1[j] = sum_b dh[b][j]) */
MLP_FN float mlp_dw1(const float *x, const float *dh, int k, int j) {
  float a = 0.0f;
  for (int b = 0; b < MLP_BATCH; b++) a += (k < MLP_IN ? x[b * MLP_IN + k] : 1.0f) * dh[b * MLP_HIDDEN + j];
  return a;
}

#ifndef __CUDACC__
/* The kernels of mlp_kernels.cu, by index (the host side of both examples loads them by name). */
enum { K_HIDDEN, K_LOSS, K_BOUT, K_BHIDDEN, K_BIN, K_SGD, K_COUNT };
static inline const char *mlp_kernel_name(int k) {
  static const char *const names[K_COUNT] = {"mlp_forward_hidden", "mlp_forward_loss", "mlp_backward_out",
                                             "mlp_backward_hidden", "mlp_backward_in", "mlp_sgd"};
  return names[k];
}
#endif
