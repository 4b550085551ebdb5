// Kernels of the conformance test (tests/conformance). The simulator runs their host twins in
// conformance_kernels_sim.c instead; keep the two in step.
extern "C" __global__ void weft_conf_fill(unsigned *out, unsigned n, unsigned value) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

extern "C" __global__ void weft_conf_copy(unsigned *dst, const unsigned *src, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
