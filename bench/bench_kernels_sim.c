/* Host twins of bench/bench_kernels.cu: the same results on the CPU, plus the byte ranges each
 * launch reads and writes for the simulator's race oracle. */
#include "bench/bench_kernels_sim.h"

#include <stddef.h>
#include <stdint.h>

#include "sim/weft_sim.h"
#include "weft/weft.h"

#define ARG(type, i) (*(type *)params[i])

void weft_bench_lcg_map(unsigned iters, unsigned *mul, unsigned *add) {
  /* Square-and-multiply over affine maps, so the twin and the checks cost O(log iters) per
   * call instead of iters per element: (a, c) then (b, d) composes to (b*a, b*c + d). */
  unsigned m = 1, a = 0, sm = 1664525u, sa = 1013904223u;
  for (unsigned k = iters; k != 0; k >>= 1) {
    if (k & 1) {
      a = sm * a + sa;
      m = sm * m;
    }
    sa = sm * sa + sa;
    sm = sm * sm;
  }
  *mul = m;
  *add = a;
}

static void lcg(const weft_sim_launch_t *l, void **params) {
  (void)l;
  unsigned *out = ARG(unsigned *, 0);
  const unsigned *in = ARG(const unsigned *, 1);
  unsigned n = ARG(unsigned, 2), mul, add;
  weft_bench_lcg_map(ARG(unsigned, 3), &mul, &add);
  for (unsigned i = 0; i < n; i++) out[i] = mul * in[i] + add;
}

static size_t lcg_ranges(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  (void)l;
  size_t bytes = (size_t)ARG(unsigned, 2) * 4;
  weft_sim_range_t r[2] = {{(CUdeviceptr)(uintptr_t)ARG(void *, 0), bytes, WEFT_SIM_WRITE},
                           {(CUdeviceptr)(uintptr_t)ARG(void *, 1), bytes, WEFT_SIM_READ}};
  for (size_t i = 0; i < 2 && i < max; i++) out[i] = r[i];
  return 2;
}

int weft_bench_kernels_register_sim(void) {
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL) return 0;
  /* With the argument sizes, the simulator copies the arguments at launch as the driver does. */
  static const size_t lcg_args[] = {8, 8, 4, 4};
  sim->register_kernel_params("weft_bench_lcg", lcg, lcg_ranges, 4, lcg_args);
  return 1;
}
