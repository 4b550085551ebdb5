/* Device, context, streams and events: properties, queries that tell the truth, waits, timing,
 * host functions, and errors for wrong handles and NULL pointers. */
#include <string.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

static void test_device_reports_an_h100_like_device(void **state) {
  (void)state;
  int v, count;
  CU_OK(cuDriverGetVersion(&v));
  assert_int_equal(v, 13000);
  CU_OK(cuDeviceGetCount(&count));
  assert_int_equal(count, 1);
  char name[64];
  CU_OK(cuDeviceGetName(name, sizeof name, 0));
  assert_string_equal(name, "weft-sim H100");
  CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  assert_int_equal(v, 9);
  CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0));
  assert_int_equal(v, 0);
  CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  assert_int_equal(v, 132);
  size_t total;
  CU_OK(cuDeviceTotalMem(&total, 0));
  assert_int_equal(total, 80ull << 30);
  CU_IS(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 1));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0));
  int least, greatest;
  CU_OK(cuCtxGetStreamPriorityRange(&least, &greatest));
  assert_int_equal(least, 0);
  assert_int_equal(greatest, -5);
}

static void test_error_names_and_strings(void **state) {
  (void)state;
  const char *s;
  CU_OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  assert_string_equal(s, "CUDA_ERROR_OUT_OF_MEMORY");
  CU_OK(cuGetErrorString(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, &s));
  assert_string_equal(s, "stream capture isolation");
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuGetErrorName((CUresult)123456, &s));
  assert_null(s);
}

static void test_stream_flags_priorities_and_ids(void **state) {
  (void)state;
  CUstream a, b;
  CU_OK(cuStreamCreateWithPriority(&a, CU_STREAM_NON_BLOCKING, -10));
  CU_OK(cuStreamCreateWithPriority(&b, CU_STREAM_DEFAULT, 3));
  unsigned flags;
  int prio;
  CU_OK(cuStreamGetFlags(a, &flags));
  assert_int_equal(flags, CU_STREAM_NON_BLOCKING);
  CU_OK(cuStreamGetPriority(a, &prio));
  assert_int_equal(prio, -5);
  CU_OK(cuStreamGetPriority(b, &prio));
  assert_int_equal(prio, 0);
  unsigned long long ia, ib;
  CU_OK(cuStreamGetId(a, &ia));
  CU_OK(cuStreamGetId(b, &ib));
  assert_true(ib > ia);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuStreamCreateWithPriority(&a, 0x10, 0));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuStreamGetFlags(a, NULL));
  CUstreamAttrValue v;
  memset(&v, 0, sizeof v);
  v.accessPolicyWindow.num_bytes = 4096;
  v.accessPolicyWindow.hitRatio = 0.5f;
  v.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
  CU_OK(cuStreamSetAttribute(a, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuStreamDestroy(b));
  /* destroyed handles are rejected */
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuStreamGetFlags(a, &flags));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuStreamDestroy(b));
}

/* A stream used after cuStreamDestroy: the real driver may crash there (an H100 did, in
 * cuMemFreeAsync on a destroyed stream, bench/data/h100x2-9894ad9), so the simulator answers
 * INVALID_HANDLE and counts the use (stats.destroyed_handle_uses, printed), for tests to catch;
 * a new stream later made at the same address is not counted. */
static void test_a_destroyed_stream_used_again_is_counted(void **state) {
  (void)state;
  weft_sim_stats_t s0, s1;
  api->stats(&s0);
  CUstream a;
  CU_OK(cuStreamCreateWithPriority(&a, CU_STREAM_NON_BLOCKING, 0));
  CU_OK(cuStreamSynchronize(a));
  CU_OK(cuStreamDestroy(a));
  assert_int_equal(cuStreamSynchronize(a), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(cuStreamQuery(a), CUDA_ERROR_INVALID_HANDLE);
  api->stats(&s1);
  assert_int_equal(s1.destroyed_handle_uses - s0.destroyed_handle_uses, 2);
  /* Handles never made are not counted as destroyed ones. */
  assert_int_equal(cuStreamQuery((CUstream)(uintptr_t)0x1234560), CUDA_ERROR_INVALID_HANDLE);
  api->stats(&s0);
  assert_int_equal(s0.destroyed_handle_uses, s1.destroyed_handle_uses);
  /* Streams made afterwards (one may get the old address back) work and count nothing. */
  CUstream b[8];
  for (int i = 0; i < 8; i++) CU_OK(cuStreamCreateWithPriority(&b[i], CU_STREAM_NON_BLOCKING, 0));
  for (int i = 0; i < 8; i++) CU_OK(cuStreamSynchronize(b[i]));
  for (int i = 0; i < 8; i++) CU_OK(cuStreamDestroy(b[i]));
  api->stats(&s1);
  assert_int_equal(s1.destroyed_handle_uses, s0.destroyed_handle_uses);
}

static void test_query_is_not_ready_until_the_work_ran(void **state) {
  (void)state;
  CUdeviceptr flag;
  CU_OK(cuMemAlloc(&flag, 256));
  CU_OK(cuMemsetD32Async(flag, 0, 1, NULL));
  CU_OK(cuStreamSynchronize(NULL));
  CUstream a = sim_test_stream(), b = sim_test_stream();
  CUevent e;
  CU_OK(cuEventCreate(&e, 0));
  CU_OK(cuStreamWaitValue32(a, flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
  CU_OK(cuEventRecord(e, a));
  for (int i = 0; i < 10; i++) {
    CU_IS(CUDA_ERROR_NOT_READY, cuEventQuery(e));
    CU_IS(CUDA_ERROR_NOT_READY, cuStreamQuery(a));
  }
  CU_OK(cuStreamWriteValue32(b, flag, 1, 0));
  CU_OK(cuEventSynchronize(e));
  CU_OK(cuEventQuery(e));
  CU_OK(cuStreamSynchronize(b));
  CU_OK(cuStreamQuery(a));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuStreamDestroy(b));
  CU_OK(cuMemFree(flag));
}

static void test_sync_that_can_never_complete_fails_instead_of_hanging(void **state) {
  (void)state;
  CUdeviceptr flag;
  CU_OK(cuMemAlloc(&flag, 256));
  CU_OK(cuMemsetD32Async(flag, 0, 1, NULL));
  CUstream a = sim_test_stream(), b = sim_test_stream();
  CU_OK(cuStreamSynchronize(NULL));
  CU_OK(cuStreamWaitValue32(a, flag, 5, CU_STREAM_WAIT_VALUE_EQ));
  CU_IS(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(a));
  CU_OK(cuStreamWriteValue32(b, flag, 5, 0));
  CU_OK(cuStreamSynchronize(a));
  CU_OK(cuStreamSynchronize(b));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuStreamDestroy(b));
  CU_OK(cuMemFree(flag));
}

static void test_wait_value_conditions(void **state) {
  (void)state;
  CUdeviceptr flag;
  CU_OK(cuMemAlloc(&flag, 256));
  CUstream a = sim_test_stream();
  CU_OK(cuStreamWriteValue64(a, flag, 0x0f0ull, 0));
  CU_OK(cuStreamWaitValue64(a, flag, 0x010ull, CU_STREAM_WAIT_VALUE_AND));
  CU_OK(cuStreamWaitValue64(a, flag, 0x0f0ull, CU_STREAM_WAIT_VALUE_EQ));
  CU_OK(cuStreamWaitValue64(a, flag, 0x0efull, CU_STREAM_WAIT_VALUE_GEQ));
  CU_OK(cuStreamWaitValue64(a, flag, 0x00full, CU_STREAM_WAIT_VALUE_NOR));
  CU_OK(cuStreamSynchronize(a));
  CU_OK(cuStreamWaitValue64(a, flag, 0x00full, CU_STREAM_WAIT_VALUE_AND)); /* 0xf0 & 0x0f == 0 */
  CU_IS(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(a));
  CU_OK(cuStreamWriteValue64(NULL, flag, 0x1ull, 0));
  CU_OK(cuStreamSynchronize(a));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(a, flag + 1, 0, 0));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuStreamWriteValue32(a, 16, 0, 0));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuMemFree(flag));
}

static CUstream g_cb_stream;
static int g_cb_ran;
static CUresult g_cb_sync;

static void callback(void *arg) {
  unsigned long long id;
  assert_int_equal(cuStreamGetId(g_cb_stream, &id), CUDA_SUCCESS);
  g_cb_sync = cuStreamSynchronize(g_cb_stream);
  *(int *)arg += 1;
  g_cb_ran++;
}

static void test_host_function_may_call_a_harmless_driver_function(void **state) {
  (void)state;
  g_cb_stream = sim_test_stream();
  int count = 0;
  CU_OK(cuLaunchHostFunc(g_cb_stream, callback, &count));
  CU_OK(cuLaunchHostFunc(g_cb_stream, callback, &count));
  CU_OK(cuStreamSynchronize(g_cb_stream));
  assert_int_equal(count, 2);
  assert_int_equal(g_cb_ran, 2);
  assert_int_equal(g_cb_sync, CUDA_ERROR_NOT_PERMITTED);
  CU_OK(cuStreamDestroy(g_cb_stream));
}

static void noop(void *p) { (void)p; }

static void test_event_timing(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUevent a, b, nt;
  CU_OK(cuEventCreate(&a, 0));
  CU_OK(cuEventCreate(&b, CU_EVENT_BLOCKING_SYNC));
  CU_OK(cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING));
  float ms = -1;
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime(&ms, a, b)); /* never recorded */
  CU_OK(cuEventRecord(a, s));
  CU_OK(cuLaunchHostFunc(s, noop, NULL));
  CU_OK(cuEventRecordWithFlags(b, s, 0));
  CU_OK(cuEventRecord(nt, s));
  CU_OK(cuEventSynchronize(b));
  CU_OK(cuEventElapsedTime(&ms, a, b));
  assert_true(ms > 0.0f);
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime(&ms, a, nt));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuEventElapsedTime(NULL, a, b));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuEventCreate(&a, CU_EVENT_INTERPROCESS));
  CU_OK(cuEventDestroy(a));
  CU_OK(cuEventDestroy(b));
  CU_OK(cuEventDestroy(nt));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(a));
  CU_OK(cuStreamDestroy(s));
}

static void test_wait_on_an_event_never_recorded_is_a_no_op(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUevent e;
  CU_OK(cuEventCreate(&e, 0));
  CU_OK(cuEventQuery(e));
  CU_OK(cuStreamWaitEvent(s, e, 0));
  CU_OK(cuStreamSynchronize(s));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuStreamWaitEvent(s, e, 0x8));
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(s));
}

static void test_legacy_stream_runs_ordinary_work(void **state) {
  (void)state;
  CUdeviceptr p;
  CU_OK(cuMemAlloc(&p, 4096));
  CU_OK(sim_test_fill(NULL, p, 1024, 42));
  CU_OK(sim_test_fill(CU_STREAM_LEGACY, p, 512, 7));
  CU_OK(cuStreamSynchronize(NULL));
  assert_int_equal(sim_test_read(p, 0), 7);
  assert_int_equal(sim_test_read(p, 1023), 42);
  unsigned long long id;
  CU_OK(cuStreamGetId(NULL, &id));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuMemFree(p));
}

static void test_work_of_a_destroyed_stream_still_runs(void **state) {
  (void)state;
  CUdeviceptr p;
  CU_OK(cuMemAlloc(&p, 4096));
  CUstream s = sim_test_stream();
  CU_OK(sim_test_fill(s, p, 1024, 9));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuCtxSynchronize());
  assert_int_equal(sim_test_read(p, 5), 9);
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuMemFree(p));
}

static void test_kernel_launch_checks_its_configuration(void **state) {
  (void)state;
  CUfunction f = sim_test_kernel("sim_test_fill");
  CUdeviceptr p = 0;
  unsigned n = 0, v = 0;
  void *args[] = {&p, &n, &v};
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, NULL, args, NULL));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel((CUfunction)&n, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
  CUmodule m;
  CU_OK(cuModuleLoadData(&m, "x"));
  CUfunction g;
  CU_IS(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction(&g, m, "no_such_kernel"));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuModuleLoadData(&m, NULL));
  CU_OK(cuModuleUnload(m));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_reports_an_h100_like_device),
      cmocka_unit_test(test_error_names_and_strings),
      cmocka_unit_test(test_stream_flags_priorities_and_ids),
      cmocka_unit_test(test_a_destroyed_stream_used_again_is_counted),
      cmocka_unit_test(test_query_is_not_ready_until_the_work_ran),
      cmocka_unit_test(test_sync_that_can_never_complete_fails_instead_of_hanging),
      cmocka_unit_test(test_wait_value_conditions),
      cmocka_unit_test(test_host_function_may_call_a_harmless_driver_function),
      cmocka_unit_test(test_event_timing),
      cmocka_unit_test(test_wait_on_an_event_never_recorded_is_a_no_op),
      cmocka_unit_test(test_legacy_stream_runs_ordinary_work),
      cmocka_unit_test(test_work_of_a_destroyed_stream_still_runs),
      cmocka_unit_test(test_kernel_launch_checks_its_configuration),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
