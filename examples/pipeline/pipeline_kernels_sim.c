/* Host side of pipeline_kernels.cu: the reference result and the simulator twin (the same values,
 * plus the byte ranges each launch reads and writes for the simulator's race oracle). */
#include "examples/pipeline/pipeline_kernels_sim.h"

#include <stddef.h>
#include <stdint.h>

#include "sim/weft_sim.h"
#include "weft/weft.h"

/* By squaring: all powers of one map commute, so the order of composition does not matter. */
void pipeline_transform_map(unsigned rounds, unsigned *mul, unsigned *add) {
  unsigned m = 1, a = 0, sm = 1664525u, sa = 1013904223u;
  for (; rounds != 0; rounds >>= 1) {
    if (rounds & 1) {
      a = sm * a + sa;
      m = sm * m;
    }
    sa = sm * sa + sa;
    sm = sm * sm;
  }
  *mul = m;
  *add = a;
}

#define ARG(type, i) (*(type *)params[i])

static void transform(const weft_sim_launch_t *l, void **params) {
  (void)l;
  unsigned *out = ARG(unsigned *, 0);
  const unsigned *in = ARG(const unsigned *, 1);
  unsigned n = ARG(unsigned, 2), mul, add;
  pipeline_transform_map(ARG(unsigned, 3), &mul, &add);
  for (unsigned i = 0; i < n; i++) out[i] = mul * in[i] + add;
}

static size_t transform_ranges(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  size_t bytes = (size_t)ARG(unsigned, 2) * 4;
  weft_sim_range_t r[2] = {{(CUdeviceptr)(uintptr_t)ARG(void *, 0), bytes, WEFT_SIM_WRITE},
                           {(CUdeviceptr)(uintptr_t)ARG(void *, 1), bytes, WEFT_SIM_READ}};
  for (size_t i = 0; i < 2 && i < max; i++) out[i] = r[i];
  return 2;
}

int pipeline_kernels_register_sim(void) {
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL) return 0;
  /* With the argument sizes, the simulator copies the arguments at launch as the driver does. */
  static const size_t args[] = {8, 8, 4, 4};
  sim->register_kernel_params("pipeline_transform", transform, transform_ranges, 4, args);
  return 1;
}
