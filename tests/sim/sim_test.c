/* Shared helpers of the simulator's unit tests (see sim_test.h). */
#include "tests/sim/sim_test.h"

#include <string.h>

static void fill_twin(const weft_sim_launch_t *l, void **p) {
  (void)l;
  unsigned *dst = *(unsigned **)p[0];
  unsigned n = *(unsigned *)p[1], v = *(unsigned *)p[2];
  for (unsigned i = 0; i < n; i++) dst[i] = v;
}

static size_t fill_ranges(const weft_sim_launch_t *l, void **p, weft_sim_range_t *out, size_t max) {
  (void)l;
  if (max >= 1) out[0] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t) * (unsigned **)p[0], *(unsigned *)p[1] * 4u, WEFT_SIM_WRITE};
  return 1;
}

static void copy_twin(const weft_sim_launch_t *l, void **p) {
  (void)l;
  unsigned *dst = *(unsigned **)p[0];
  const unsigned *src = *(const unsigned **)p[1];
  unsigned n = *(unsigned *)p[2];
  memmove(dst, src, (size_t)n * 4);
}

static void add_twin(const weft_sim_launch_t *l, void **p) {
  (void)l;
  unsigned *dst = *(unsigned **)p[0];
  const unsigned *src = *(const unsigned **)p[1];
  unsigned n = *(unsigned *)p[2];
  for (unsigned i = 0; i < n; i++) dst[i] += src[i];
}

static size_t binary_ranges(weft_sim_access_t dst_access, void **p, weft_sim_range_t *out, size_t max) {
  size_t bytes = (size_t)*(unsigned *)p[2] * 4;
  if (max >= 2) {
    out[0] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t) * (unsigned **)p[0], bytes, dst_access};
    out[1] = (weft_sim_range_t){(CUdeviceptr)(uintptr_t) * (unsigned **)p[1], bytes, WEFT_SIM_READ};
  }
  return 2;
}

static size_t copy_ranges(const weft_sim_launch_t *l, void **p, weft_sim_range_t *out, size_t max) {
  (void)l;
  return binary_ranges(WEFT_SIM_WRITE, p, out, max);
}

static size_t add_ranges(const weft_sim_launch_t *l, void **p, weft_sim_range_t *out, size_t max) {
  (void)l;
  return binary_ranges(WEFT_SIM_READ_WRITE, p, out, max);
}

static CUmodule g_module;

void sim_test_thread_init(void) {
  CUcontext ctx;
  assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

const weft_sim_api_t *sim_test_init(void) {
  const weft_sim_api_t *api = weft_sim_get_api();
  assert_non_null(api);
  assert_int_equal(cuInit(0), CUDA_SUCCESS);
  sim_test_thread_init();
  static const size_t fill_sizes[] = {sizeof(void *), 4, 4}, pair_sizes[] = {sizeof(void *), sizeof(void *), 4};
  assert_int_equal(api->register_kernel_params("sim_test_fill", fill_twin, fill_ranges, 3, fill_sizes), 0);
  assert_int_equal(api->register_kernel_params("sim_test_copy", copy_twin, copy_ranges, 3, pair_sizes), 0);
  assert_int_equal(api->register_kernel_params("sim_test_add", add_twin, add_ranges, 3, pair_sizes), 0);
  if (g_module == NULL) assert_int_equal(cuModuleLoadData(&g_module, "image"), CUDA_SUCCESS);
  return api;
}

CUfunction sim_test_kernel(const char *name) {
  CUfunction f;
  assert_int_equal(cuModuleGetFunction(&f, g_module, name), CUDA_SUCCESS);
  return f;
}

CUstream sim_test_stream(void) {
  CUstream s;
  assert_int_equal(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  return s;
}

static CUresult launch3(const char *name, CUstream s, CUdeviceptr a, CUdeviceptr b, unsigned n, int b_is_value, unsigned v) {
  void *pa = (void *)(uintptr_t)a, *pb = (void *)(uintptr_t)b;
  void *args[3];
  args[0] = &pa;
  args[1] = b_is_value ? (void *)&n : (void *)&pb;
  args[2] = b_is_value ? (void *)&v : (void *)&n;
  return cuLaunchKernel(sim_test_kernel(name), (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, NULL);
}

CUresult sim_test_fill(CUstream s, CUdeviceptr dst, unsigned n, unsigned value) {
  return launch3("sim_test_fill", s, dst, 0, n, 1, value);
}
CUresult sim_test_copy(CUstream s, CUdeviceptr dst, CUdeviceptr src, unsigned n) {
  return launch3("sim_test_copy", s, dst, src, n, 0, 0);
}
CUresult sim_test_add(CUstream s, CUdeviceptr dst, CUdeviceptr src, unsigned n) {
  return launch3("sim_test_add", s, dst, src, n, 0, 0);
}

unsigned sim_test_read(CUdeviceptr p, unsigned i) {
  unsigned v = 0;
  assert_int_equal(cuMemcpyDtoH(&v, p + (CUdeviceptr)i * 4, 4), CUDA_SUCCESS);
  return v;
}
