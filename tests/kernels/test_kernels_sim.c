/* Host twins of tests/kernels/test_kernels.cu: the same arithmetic on the CPU, plus the byte
 * ranges each launch reads and writes for the simulator's race oracle. */
#include <stddef.h>
#include <stdint.h>

#include "sim/weft_sim.h"
#include "tests/kernels/test_kernels_sim.h"
#include "weft/weft.h"

#define ARG(type, i) (*(type *)params[i])

static void combine(const weft_sim_launch_t *l, void **params) {
  unsigned *out0 = ARG(unsigned *, 0), *out1 = ARG(unsigned *, 1);
  const unsigned *in0 = ARG(const unsigned *, 2), *in1 = ARG(const unsigned *, 3), *in2 = ARG(const unsigned *, 4);
  unsigned n = ARG(unsigned, 5), salt = ARG(unsigned, 6);
  (void)l;
  for (unsigned i = 0; i < n; i++) {
    unsigned v = salt;
    if (in0) v += 7u * in0[i];
    if (in1) v += 13u * in1[i];
    if (in2) v += 17u * in2[i];
    if (out0) out0[i] = v;
    if (out1) out1[i] = v ^ 0x55555555u;
  }
}

static size_t combine_ranges(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  size_t bytes = (size_t)ARG(unsigned, 5) * 4, k = 0;
  weft_sim_range_t all[5];
  for (int i = 0; i < 5; i++) {
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ARG(void *, i);
    if (p != 0) all[k++] = (weft_sim_range_t){p, bytes, i < 2 ? WEFT_SIM_WRITE : WEFT_SIM_READ};
  }
  for (size_t i = 0; i < k && i < max; i++) out[i] = all[i];
  return k;
}

static void fill(const weft_sim_launch_t *l, void **params) {
  (void)l;
  unsigned *dst = ARG(unsigned *, 0);
  unsigned n = ARG(unsigned, 1), value = ARG(unsigned, 2);
  for (unsigned i = 0; i < n; i++) dst[i] = value;
}

static size_t fill_ranges(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  if (max >= 1) out[0] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t)ARG(void *, 0), (size_t)ARG(unsigned, 1) * 4, WEFT_SIM_WRITE};
  return 1;
}

/* tests/kernels/smoke_kernels.cu: out[i] = i * scale. */
static void smoke_iota(const weft_sim_launch_t *l, void **params) {
  (void)l;
  unsigned *out = ARG(unsigned *, 0);
  unsigned n = ARG(unsigned, 1), scale = ARG(unsigned, 2);
  for (unsigned i = 0; i < n; i++) out[i] = i * scale;
}

static size_t smoke_iota_ranges(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  if (max >= 1) out[0] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t)ARG(void *, 0), (size_t)ARG(unsigned, 1) * 4, WEFT_SIM_WRITE};
  return 1;
}

int weft_test_kernels_register_sim(void) {
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL) return 0;
  /* With the argument sizes, the simulator copies the arguments at launch as the driver does. */
  static const size_t combine_args[] = {8, 8, 8, 8, 8, 4, 4, 4}, fill_args[] = {8, 4, 4, 4}, iota_args[] = {8, 4, 4};
  sim->register_kernel_params("weft_test_combine", combine, combine_ranges, 8, combine_args);
  sim->register_kernel_params("weft_test_fill", fill, fill_ranges, 4, fill_args);
  sim->register_kernel_params("weft_smoke_iota", smoke_iota, smoke_iota_ranges, 3, iota_args);
  return 1;
}
