// Kernels of the GPU smoke test. The simulator runs tests/kernels/smoke_kernels_sim.c instead.
extern "C" __global__ void weft_smoke_iota(unsigned *out, unsigned n, unsigned scale) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * scale;
}
