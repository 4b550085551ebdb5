// The pipeline example's compute stage. Its host twin for the simulator is in
// pipeline_kernels_sim.c.
//
// out[i] = in[i] after `rounds` steps of x = 1664525 x + 1013904223 (mod 2^32): exact integer
// arithmetic, so the host can check every element, and `rounds` sets how long the stage runs
// next to the copies.
extern "C" __global__ void pipeline_transform(unsigned *out, const unsigned *in, unsigned n, unsigned rounds) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned x = in[i];
    for (unsigned r = 0; r < rounds; r++) x = 1664525u * x + 1013904223u;
    out[i] = x;
  }
}
