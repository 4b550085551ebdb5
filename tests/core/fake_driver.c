/* A library whose cuInit succeeds and which has no other entry point: weft__driver_load runs its
 * cuInit, then finds a required entry point missing. It counts cuInit calls in a variable that
 * lives as long as the library stays mapped. */
#include <cuda.h>

int fake_driver_inits;

CUresult CUDAAPI cuInit(unsigned int flags) {
  (void)flags;
  fake_driver_inits++;
  return CUDA_SUCCESS;
}
