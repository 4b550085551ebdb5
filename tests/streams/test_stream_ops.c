/* Tracked stream operations: copies and memsets between blocks and host memory, host callbacks,
 * write-value / wait-value, the L2 hot-block window, importing outside events and streams, and
 * exporting a block's ready event. Each is one use: cross-stream order comes from the tracker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "tests/util/cmocka_env.h"

#define N 1024
static tu_env_t env;
static const weft__driver_t *drv;

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  if (tu_init(&env, &o) != 0) return -1;
  return weft__driver_get(&drv) == WEFT_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}
static void test_copies_and_memsets_across_streams(void **state) {
  (void)state;
  tu_reset_races(&env);
  static unsigned src[N], dst[N];
  for (unsigned i = 0; i < N; i++) src[i] = i * 3;
  weft_block_t a, b;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "a", &a), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "b", &b), WEFT_OK);
  assert_int_equal(weft_copy_to_block(tu_stream(&env, 1), a, 0, src, sizeof src), WEFT_OK);
  assert_int_equal(weft_copy_block(tu_stream(&env, 2), b, 0, a, 0, N * 4), WEFT_OK);
  assert_int_equal(weft_memset32(tu_stream(&env, 3), a, 0, 0xabcdu, 16 * 4), WEFT_OK);
  assert_int_equal(weft_memset8(tu_stream(&env, 4), b, 4 * 10, 0x11, 4), WEFT_OK);
  assert_int_equal(weft_copy_from_block(tu_stream(&env, 5), dst, b, 0, sizeof dst), WEFT_OK);
  assert_int_equal(weft_block_synchronize(b), WEFT_OK);
  for (unsigned i = 0; i < N; i++) assert_int_equal(dst[i], i == 10 ? 0x11111111u : i * 3);
  assert_int_equal(tu_read(tu_stream(&env, 6), a, dst, sizeof dst), WEFT_OK);
  for (unsigned i = 0; i < N; i++) assert_int_equal(dst[i], i < 16 ? 0xabcdu : i * 3);
  assert_int_equal(tu_races(&env), 0);
  /* Ranges are checked. */
  assert_int_equal(weft_copy_to_block(tu_stream(&env, 1), a, N * 4 - 2, src, 4), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_memset32(tu_stream(&env, 1), a, 2, 0, 4), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_memset32(tu_stream(&env, 1), a, 0, 0, 6), WEFT_ERR_INVALID_ARGUMENT); /* a size of 1.5 words */
  assert_non_null(strstr(weft_last_error(), "multiples of 4"));
  assert_int_equal(weft_copy_from_block(tu_stream(&env, 1), NULL, a, 0, 4), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_free(a, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
}

static void host_fn(void *user) { (*(int *)user)++; }

static void test_host_callback_runs_after_the_writer(void **state) {
  (void)state;
  int calls = 0;
  weft_block_t a;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "a", &a), WEFT_OK);
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), a, N, 1), WEFT_OK);
  weft_access_t r = {a, WEFT_READ};
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  assert_int_equal(weft_host_func(tu_stream(&env, 1), host_fn, &calls, &r, 1), WEFT_OK);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
  assert_int_equal(weft_stream_synchronize(tu_stream(&env, 1)), WEFT_OK);
  assert_int_equal(calls, 1);
  assert_int_equal(weft_host_func(tu_stream(&env, 1), NULL, NULL, NULL, 0), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_free(a, tu_stream(&env, 0)), WEFT_OK);
}

static void test_write_value_then_wait_value_orders_streams(void **state) {
  (void)state;
  tu_reset_races(&env);
  /* Stream memory operations need cuMemAlloc memory: a pool block is refused clearly... */
  weft_block_t pooled;
  assert_int_equal(weft_alloc(env.rt, 64, tu_stream(&env, 0), "pooled", &pooled), WEFT_OK);
  assert_int_equal(weft_write_value32(tu_stream(&env, 1), pooled, 0, 7), WEFT_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(weft_last_error(), "weft_direct_create"));
  assert_int_equal(weft_free(pooled, tu_stream(&env, 0)), WEFT_OK);
  /* ... and memory from a direct resource, wrapped as a block, works. */
  weft_resource_t *direct;
  assert_int_equal(weft_direct_create(env.rt, &direct), WEFT_OK);
  CUdeviceptr raw_flag;
  assert_int_equal(weft_resource_allocate(direct, 64, tu_stream(&env, 0), "flag", &raw_flag), WEFT_OK);
  weft_block_t flag;
  assert_int_equal(weft_block_wrap(env.rt, raw_flag, 64, "flag", &flag), WEFT_OK);
  assert_int_equal(weft_memset32(tu_stream(&env, 0), flag, 0, 0, 64), WEFT_OK);
  /* 64-bit operations exist only where the device says so; elsewhere they are NOT_SUPPORTED. */
  CUdevice dev;
  int ops64 = 0;
  assert_int_equal(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  assert_int_equal(drv->cuDeviceGetAttribute(&ops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev), CUDA_SUCCESS);
  weft_status_t want64 = ops64 ? WEFT_OK : WEFT_ERR_NOT_SUPPORTED;
  printf("64-bit stream memory operations: %s\n", ops64 ? "supported" : "not supported");
#define EXPECT(call, want)                                                                      \
  do {                                                                                          \
    weft_status_t r_ = (call);                                                                  \
    if (r_ != (want)) fail_msg("%s: %s: %s", #call, weft_status_name(r_), weft_last_error());  \
  } while (0)
  EXPECT(weft_write_value32(tu_stream(&env, 1), flag, 0, 7), WEFT_OK);
  EXPECT(weft_write_value64(tu_stream(&env, 1), flag, 8, 0x1122334455667788ull), want64);
  EXPECT(weft_wait_value32(tu_stream(&env, 2), flag, 0, 7, CU_STREAM_WAIT_VALUE_EQ), WEFT_OK);
  EXPECT(weft_wait_value64(tu_stream(&env, 2), flag, 8, 0x1122334455667788ull, CU_STREAM_WAIT_VALUE_GEQ), want64);
  assert_int_equal(weft_stream_synchronize(tu_stream(&env, 2)), WEFT_OK);
  uint64_t host[2];
  assert_int_equal(tu_read(tu_stream(&env, 3), flag, host, 16), WEFT_OK);
  assert_int_equal(host[0] & 0xffffffffu, 7);
  if (ops64) assert_int_equal(host[1], 0x1122334455667788ull);
  else assert_int_equal(host[1], 0);
  assert_int_equal(weft_write_value32(tu_stream(&env, 1), flag, 2, 7), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_write_value64(tu_stream(&env, 1), flag, 60, 7), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(flag, tu_stream(&env, 0)), WEFT_OK); /* forgets the wrapped block, after its uses */
  assert_int_equal(weft_resource_deallocate(direct, raw_flag, 64, tu_stream(&env, 0), "flag"), WEFT_OK);
  weft_resource_destroy(direct);
}

/* A value wait waits for a write that comes later (here the host's). Another stream that needs
 * only the work before it must not wait for it: with lazy records that work and the value wait
 * could join one tick, and a wait for the earlier work would be served by the event after the
 * value wait. The reader's stream then waited for the flag, and the host, waiting for the
 * reader before writing the flag, never did (the simulator reports the deadlock at once:
 * CUDA_ERROR_LAUNCH_TIMEOUT). weft__tracker_exact keeps such a stream's waits exact. */
static void test_a_value_wait_is_not_covered_by_a_wait_for_earlier_work(void **state) {
  (void)state;
  tu_reset_races(&env);
  weft_options_t o;
  assert_int_equal(weft_runtime_options(env.rt, &o), WEFT_OK);
  if (!o.lazy_records) skip();
  weft_resource_t *direct;
  assert_int_equal(weft_direct_create(env.rt, &direct), WEFT_OK);
  CUdeviceptr raw_flag;
  assert_int_equal(weft_resource_allocate(direct, 64, tu_stream(&env, 0), "flag", &raw_flag), WEFT_OK);
  weft_block_t flag, x, y;
  assert_int_equal(weft_block_wrap(env.rt, raw_flag, 64, "flag", &flag), WEFT_OK);
  assert_int_equal(weft_memset32(tu_stream(&env, 0), flag, 0, 0, 64), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "x", &x), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 1), "y", &y), WEFT_OK);
  const uint32_t one = 1;
  /* Stream 0: writes x, then waits for the flag. Stream 1: reads x. */
  assert_int_equal(weft_memset32(tu_stream(&env, 0), x, 0, 5, N * 4), WEFT_OK);
  assert_int_equal(weft_wait_value32(tu_stream(&env, 0), flag, 0, 1, CU_STREAM_WAIT_VALUE_EQ), WEFT_OK);
  assert_int_equal(weft_copy_block(tu_stream(&env, 1), y, 0, x, 0, N * 4), WEFT_OK);
  weft_status_t st = weft_stream_synchronize(tu_stream(&env, 1));
  if (st != WEFT_OK) {
    (void)drv->cuMemcpyHtoD(raw_flag, &one, sizeof one); /* let stream 0 go before failing */
    fail_msg("the reader waited for the value wait: %s: %s", weft_status_name(st), weft_last_error());
  }
  /* The host writes the flag; stream 0 goes on. */
  assert_int_equal(drv->cuMemcpyHtoD(raw_flag, &one, sizeof one), CUDA_SUCCESS);
  assert_int_equal(weft_stream_synchronize(tu_stream(&env, 0)), WEFT_OK);
  unsigned host[N];
  assert_int_equal(tu_read(tu_stream(&env, 2), y, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++) assert_int_equal(host[i], 5);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_free(y, tu_stream(&env, 1)), WEFT_OK);
  assert_int_equal(weft_free(flag, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_resource_deallocate(direct, raw_flag, 64, tu_stream(&env, 0), "flag"), WEFT_OK);
  weft_resource_destroy(direct);
}

static void test_hot_block_window(void **state) {
  (void)state;
  weft_block_t a;
  assert_int_equal(weft_alloc(env.rt, 1 << 20, tu_stream(&env, 0), "hot", &a), WEFT_OK);
  assert_int_equal(weft_stream_set_hot_block(tu_stream(&env, 0), a, 0.6f), WEFT_OK);
  assert_int_equal(weft_stream_set_hot_block(tu_stream(&env, 0), a, 1.5f), WEFT_ERR_INVALID_ARGUMENT);
  weft_block_t nul = {0};
  assert_int_equal(weft_stream_set_hot_block(tu_stream(&env, 0), nul, 0.0f), WEFT_OK);
  assert_int_equal(weft_free(a, tu_stream(&env, 0)), WEFT_OK);
}

/* Work weft does not see: an outside stream writes, weft imports it; weft exports a ready event
 * that outside code waits on. */
static void test_import_and_export(void **state) {
  (void)state;
  tu_reset_races(&env);
  weft_block_t a, out;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "a", &a), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "out", &out), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  CUstream outside;
  assert_int_equal(drv->cuStreamCreateWithPriority(&outside, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  CUdeviceptr pa;
  assert_int_equal(weft_block_ptr(a, &pa), WEFT_OK);
  assert_int_equal(drv->cuMemsetD32Async(pa, 5, N, outside), CUDA_SUCCESS);
  assert_int_equal(weft_stream_import_stream(tu_stream(&env, 1), outside), WEFT_OK);
  const weft_block_t none = {0};
  assert_int_equal(tu_combine(&env, tu_stream(&env, 1), out, none, a, none, none, N, 1), WEFT_OK);
  /* Export: outside code waits for out's writer before reading it. */
  CUevent ready;
  assert_int_equal(weft_block_export_event(out, WEFT_READ, &ready), WEFT_OK);
  assert_int_equal(drv->cuStreamWaitEvent(outside, ready, 0), CUDA_SUCCESS);
  static unsigned host[N];
  CUdeviceptr po;
  assert_int_equal(weft_block_ptr(out, &po), WEFT_OK);
  assert_int_equal(drv->cuMemcpyDtoHAsync(host, po, sizeof host, outside), CUDA_SUCCESS);
  assert_int_equal(drv->cuStreamSynchronize(outside), CUDA_SUCCESS);
  for (unsigned i = 0; i < N; i++) assert_int_equal(host[i], 36);
  assert_int_equal(drv->cuEventDestroy(ready), CUDA_SUCCESS);
  /* Importing an event directly. */
  CUevent ev;
  assert_int_equal(drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  assert_int_equal(drv->cuMemsetD32Async(pa, 9, N, outside), CUDA_SUCCESS);
  assert_int_equal(drv->cuEventRecord(ev, outside), CUDA_SUCCESS);
  assert_int_equal(weft_stream_import_event(tu_stream(&env, 2), ev), WEFT_OK);
  assert_int_equal(tu_combine(&env, tu_stream(&env, 2), out, none, a, none, none, N, 0), WEFT_OK);
  assert_int_equal(tu_read(tu_stream(&env, 2), out, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++) assert_int_equal(host[i], 63);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_stream_import_event(tu_stream(&env, 2), NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_stream_import_stream(tu_stream(&env, 2), NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(drv->cuEventDestroy(ev), CUDA_SUCCESS);
  assert_int_equal(drv->cuStreamSynchronize(outside), CUDA_SUCCESS);
  assert_int_equal(drv->cuStreamDestroy(outside), CUDA_SUCCESS);
  assert_int_equal(weft_free(a, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_free(out, tu_stream(&env, 0)), WEFT_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_copies_and_memsets_across_streams),
      cmocka_unit_test(test_host_callback_runs_after_the_writer),
      cmocka_unit_test(test_write_value_then_wait_value_orders_streams),
      cmocka_unit_test(test_a_value_wait_is_not_covered_by_a_wait_for_earlier_work),
      cmocka_unit_test(test_hot_block_window),
      cmocka_unit_test(test_import_and_export),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
