// The first program's kernel: y[i] = 2 x[i]. extern "C" keeps the name cuModuleGetFunction looks for.
extern "C" __global__ void twice(unsigned *y, const unsigned *x, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2 * x[i];
}
