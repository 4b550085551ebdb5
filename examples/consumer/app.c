/* app.c: y = 2x with a copy stream and a compute stream; weft orders them from what each step
 * reads and writes. On a GPU, or on the simulator with WEFT_DRIVER=sim. */
#include <stdint.h>
#include <stdio.h>

#include "my_kernels.h"   /* weft_cuda_fatbin(name = "my_kernels"): the kernel, for a GPU */
#include "sim/weft_sim.h" /* @weft//sim:api: its twin, for the simulator (WEFT_DRIVER=sim) */
#include "weft/weft.h"    /* @weft//lib:weft */

#define CHECK(call)                                                                     \
  do {                                                                                  \
    weft_status_t st_ = (call);                                                         \
    if (st_ != WEFT_OK) {                                                               \
      fprintf(stderr, "%s: %s: %s\n", #call, weft_status_name(st_), weft_last_error()); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

enum { N = 1 << 20 };
static unsigned host_x[N], host_y[N];

/* What my_kernels.cu's `twice` does, on the CPU; and the bytes it touches, for the race oracle. */
static void twice_twin(const weft_sim_launch_t *l, void **params) {
  CUdeviceptr yd = *(CUdeviceptr *)params[0], xd = *(CUdeviceptr *)params[1];
  unsigned *y = (unsigned *)(uintptr_t)yd; /* on the simulator, device memory is host memory */
  const unsigned *x = (const unsigned *)(uintptr_t)xd;
  unsigned n = *(unsigned *)params[2];
  (void)l; /* the grid and block shape: not needed here */
  for (unsigned i = 0; i < n; i++) y[i] = 2 * x[i];
}
static size_t twice_ranges(const weft_sim_launch_t *l, void **params, weft_sim_range_t *out, size_t max) {
  size_t bytes = sizeof(unsigned) * *(unsigned *)params[2];
  (void)l;
  if (max >= 2) {
    out[0] = (weft_sim_range_t){*(CUdeviceptr *)params[0], bytes, WEFT_SIM_WRITE};
    out[1] = (weft_sim_range_t){*(CUdeviceptr *)params[1], bytes, WEFT_SIM_READ};
  }
  return 2;
}

/* weft loads the driver at run time and never links it: other driver calls are looked up. */
typedef CUresult (*module_load_fn)(CUmodule *module, const void *image);
typedef CUresult (*get_function_fn)(CUfunction *f, CUmodule module, const char *name);
typedef CUresult (*module_unload_fn)(CUmodule module);

int main(void) {
  weft_runtime_t *rt;
  CHECK(weft_runtime_get(0, NULL, &rt)); /* device 0; options from WEFT_* variables */

  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol); /* NULL on a GPU */
  if (sim != NULL && sim->register_kernel("twice", twice_twin, twice_ranges) != 0) return 1;
  module_load_fn load = (module_load_fn)weft_driver_symbol("cuModuleLoadData");
  get_function_fn get = (get_function_fn)weft_driver_symbol("cuModuleGetFunction");
  module_unload_fn unload = (module_unload_fn)weft_driver_symbol("cuModuleUnload");
  CUmodule module;
  CUfunction twice;
  if (load == NULL || get == NULL || unload == NULL || load(&module, my_kernels_fatbin) != CUDA_SUCCESS ||
      get(&twice, module, "twice") != CUDA_SUCCESS) {
    fprintf(stderr, "cannot load the kernel 'twice'\n");
    return 1;
  }

  weft_stream_t *copy, *compute;
  weft_block_t x, y;
  const size_t bytes = sizeof host_x;
  for (unsigned i = 0; i < N; i++) host_x[i] = i;
  CHECK(weft_stream_get(rt, 0, &copy));
  CHECK(weft_stream_get(rt, 1, &compute));
  CHECK(weft_alloc(rt, bytes, copy, "x", &x));            /* stream-ordered, from weft's pool */
  CHECK(weft_alloc(rt, bytes, compute, "y", &y));
  CHECK(weft_copy_to_block(copy, x, 0, host_x, bytes));   /* writes x on the copy stream */
  CUdeviceptr xp, yp;
  CHECK(weft_block_ptr(x, &xp));
  CHECK(weft_block_ptr(y, &yp));
  unsigned n = N;
  void *params[] = {&yp, &xp, &n};
  weft_access_t acc[] = {{x, WEFT_READ}, {y, WEFT_WRITE}};
  weft_launch_t k = {.func = twice, .grid = {N / 256}, .block = {256}, .params = params};
  CHECK(weft_launch(compute, &k, acc, 2));                /* waits for the copy: exactly one wait */
  CHECK(weft_copy_from_block(copy, host_y, y, 0, bytes)); /* waits for the kernel */
  CHECK(weft_free(x, compute));                           /* ordered after every use of x, any stream */
  CHECK(weft_block_synchronize(y));
  CHECK(weft_free(y, copy));

  for (unsigned i = 0; i < N; i++)
    if (host_y[i] != 2 * i) {
      fprintf(stderr, "y[%u] = %u, expected %u\n", i, host_y[i], 2 * i);
      return 1;
    }
  if (sim != NULL && sim->race_count() != 0) {
    sim->print_report(); /* an access weft did not order: never happens */
    return 1;
  }
  printf("y = 2x on %s: %u elements right\n", sim != NULL ? "the simulator" : "a GPU", (unsigned)N);
  if (unload(module) != CUDA_SUCCESS) return 1;
  CHECK(weft_runtime_release(rt));
  return 0;
}
