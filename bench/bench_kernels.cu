// Kernels of weft's benchmarks. Host twins for the simulator: bench_kernels_sim.c.
#include <stdint.h>

// The pipeline's compute stage: out[i] = in[i] after `iters` steps of the LCG
// x = 1664525 x + 1013904223 (mod 2^32). Integer arithmetic makes the result exact, so the host
// can check every element; `iters` sets how long the stage runs against the copies.
extern "C" __global__ void weft_bench_lcg(unsigned *out, const unsigned *in, unsigned n, unsigned iters) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned x = in[i];
    for (unsigned k = 0; k < iters; k++) x = 1664525u * x + 1013904223u;
    out[i] = x;
  }
}
