// Kernels shared by weft's tests, benchmarks and examples. Their host twins for the simulator
// are in test_kernels_sim.c; the two must compute the same values.
#include <stdint.h>

// Spins for about `spin_ns` nanoseconds (thread 0 of each block; the others wait at the
// barrier), so that a missing dependency lets another stream observe stale data.
__device__ void weft_test_spin(unsigned spin_ns) {
  if (spin_ns == 0) return;
  if (threadIdx.x == 0) {
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < spin_ns);
  }
  __syncthreads();
}

// out0[i] = salt + 7*in0[i] + 13*in1[i] + 17*in2[i] (null inputs count as 0);
// out1[i] = out0[i] ^ 0x55555555. Any pointer may be null; an output may alias an input.
extern "C" __global__ void weft_test_combine(unsigned *out0, unsigned *out1, const unsigned *in0, const unsigned *in1,
                                             const unsigned *in2, unsigned n, unsigned salt, unsigned spin_ns) {
  weft_test_spin(spin_ns);
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned v = salt;
    if (in0) v += 7u * in0[i];
    if (in1) v += 13u * in1[i];
    if (in2) v += 17u * in2[i];
    if (out0) out0[i] = v;
    if (out1) out1[i] = v ^ 0x55555555u;
  }
}

// dst[i] = value (after spinning).
extern "C" __global__ void weft_test_fill(unsigned *dst, unsigned n, unsigned value, unsigned spin_ns) {
  weft_test_spin(spin_ns);
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = value;
}
