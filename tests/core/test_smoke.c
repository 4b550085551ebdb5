/* The smoke test: load the driver (the real one on a GPU, the simulator elsewhere), retain the
 * primary context, load the embedded fatbin, run a kernel and check its result on the host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "tests/kernels/smoke_kernels.h"
#include "tests/kernels/test_kernels_sim.h"

#define N 1000

static void test_kernel_runs_and_writes_expected_values(void **state) {
  (void)state;
  const weft__driver_t *d;
  weft_status_t st = weft__driver_get(&d);
  if (st != WEFT_OK) fail_msg("no driver: %s", weft_last_error());
  weft_test_kernels_register_sim();
  CUdevice dev;
  CUcontext ctx;
  char name[128];
  assert_int_equal(d->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  assert_int_equal(d->cuDeviceGetName(name, sizeof name, dev), CUDA_SUCCESS);
  int major = 0, minor = 0;
  assert_int_equal(d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), CUDA_SUCCESS);
  assert_int_equal(d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), CUDA_SUCCESS);
  printf("smoke: driver %s (version %d, %s), device 0: %s, sm_%d%d\n", d->info.path, d->info.version,
         d->info.is_simulator ? "simulator" : "GPU", name, major, minor);
  assert_int_equal(d->cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  assert_int_equal(d->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUmodule mod;
  CUfunction fn;
  assert_int_equal(d->cuModuleLoadData(&mod, smoke_kernels_fatbin), CUDA_SUCCESS);
  assert_int_equal(d->cuModuleGetFunction(&fn, mod, "weft_smoke_iota"), CUDA_SUCCESS);
  CUdeviceptr p;
  assert_int_equal(d->cuMemAlloc(&p, N * sizeof(unsigned)), CUDA_SUCCESS);
  CUstream s;
  assert_int_equal(d->cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  unsigned n = N, scale = 3;
  void *params[] = {&p, &n, &scale};
  assert_int_equal(d->cuLaunchKernel(fn, (N + 127) / 128, 1, 1, 128, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
  static unsigned host[N];
  assert_int_equal(d->cuMemcpyDtoHAsync(host, p, sizeof host, s), CUDA_SUCCESS);
  assert_int_equal(d->cuStreamSynchronize(s), CUDA_SUCCESS);
  for (unsigned i = 0; i < N; i++) assert_int_equal(host[i], i * 3);
  printf("smoke: weft_smoke_iota wrote %u values, all correct\n", N);
  assert_int_equal(d->cuStreamDestroy(s), CUDA_SUCCESS);
  assert_int_equal(d->cuMemFree(p), CUDA_SUCCESS);
  assert_int_equal(d->cuModuleUnload(mod), CUDA_SUCCESS);
  assert_int_equal(d->cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kernel_runs_and_writes_expected_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
