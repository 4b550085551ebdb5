/* Host twins of tests/kernels/conformance_kernels.cu, with the byte ranges each launch touches. */
#include "tests/kernels/conformance_kernels_sim.h"

#include <string.h>

/* weft_conf_fill(unsigned *out, unsigned n, unsigned value) */
static void fill_twin(const weft_sim_launch_t *launch, void **params) {
  (void)launch;
  unsigned *out = *(unsigned **)params[0];
  unsigned n = *(const unsigned *)params[1], value = *(const unsigned *)params[2];
  for (unsigned i = 0; i < n; i++) out[i] = value;
}

static size_t fill_ranges(const weft_sim_launch_t *launch, void **params, weft_sim_range_t *out, size_t max) {
  (void)launch;
  if (max >= 1)
    out[0] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t) * (unsigned **)params[0],
                                (size_t) * (const unsigned *)params[1] * sizeof(unsigned), WEFT_SIM_WRITE};
  return 1;
}

/* weft_conf_copy(unsigned *dst, const unsigned *src, unsigned n) */
static void copy_twin(const weft_sim_launch_t *launch, void **params) {
  (void)launch;
  unsigned *dst = *(unsigned **)params[0];
  const unsigned *src = *(const unsigned **)params[1];
  memmove(dst, src, (size_t) * (const unsigned *)params[2] * sizeof(unsigned));
}

static size_t copy_ranges(const weft_sim_launch_t *launch, void **params, weft_sim_range_t *out, size_t max) {
  (void)launch;
  size_t bytes = (size_t) * (const unsigned *)params[2] * sizeof(unsigned);
  if (max >= 2) {
    out[0] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t) * (unsigned **)params[0], bytes, WEFT_SIM_WRITE};
    out[1] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t) * (const unsigned **)params[1], bytes, WEFT_SIM_READ};
  }
  return 2;
}

int weft_conf_register_sim_kernels(const weft_sim_api_t *api) {
  static const size_t fill_sizes[] = {sizeof(void *), sizeof(unsigned), sizeof(unsigned)};
  static const size_t copy_sizes[] = {sizeof(void *), sizeof(void *), sizeof(unsigned)};
  if (api->version >= 2)
    return api->register_kernel_params("weft_conf_fill", fill_twin, fill_ranges, 3, fill_sizes) ||
           api->register_kernel_params("weft_conf_copy", copy_twin, copy_ranges, 3, copy_sizes);
  return api->register_kernel("weft_conf_fill", fill_twin, fill_ranges) ||
         api->register_kernel("weft_conf_copy", copy_twin, copy_ranges);
}
