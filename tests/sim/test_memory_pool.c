/* Device memory and stream-ordered pools: alignment, accounting, copies and sets, big
 * allocations, pool attributes and their defaults, export, and the pool's reuse rules. */
#include <string.h>
#include <unistd.h>

#include "tests/sim/sim_test.h"

static const weft_sim_api_t *api;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

static void test_alloc_is_256_byte_aligned_and_counted(void **state) {
  (void)state;
  size_t free0, total, free1;
  CU_OK(cuMemGetInfo(&free0, &total));
  CUdeviceptr p[8];
  for (int i = 0; i < 8; i++) {
    CU_OK(cuMemAlloc(&p[i], 1 + (size_t)i * 1000));
    assert_int_equal(p[i] % 256, 0);
  }
  CU_OK(cuMemGetInfo(&free1, &total));
  assert_true(free1 < free0);
  for (int i = 0; i < 8; i++) CU_OK(cuMemFree(p[i]));
  CU_OK(cuMemGetInfo(&free1, &total));
  assert_int_equal(free1, free0);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemFree(p[0]));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&p[0], 0));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(NULL, 16));
}

static void test_many_64_MiB_allocations_live_at_once(void **state) {
  (void)state;
  enum { K = 24 };
  CUdeviceptr p[K];
  for (int i = 0; i < K; i++) CU_OK(cuMemAlloc(&p[i], 64u << 20));
  CUstream s = sim_test_stream();
  for (int i = 0; i < K; i++) CU_OK(sim_test_fill(s, p[i] + (60u << 20), 1024, (unsigned)i));
  CU_OK(cuStreamSynchronize(s));
  for (int i = 0; i < K; i++) assert_int_equal(sim_test_read(p[i] + (60u << 20), 1023), (unsigned)i);
  for (int i = 0; i < K; i++) CU_OK(cuMemFree(p[i]));
  CU_OK(cuStreamDestroy(s));
}

static void test_copies_and_sets_move_the_bytes(void **state) {
  (void)state;
  CUdeviceptr a, b;
  CU_OK(cuMemAlloc(&a, 4096));
  CU_OK(cuMemAlloc(&b, 4096));
  CUstream s = sim_test_stream();
  unsigned char host[4096], back[4096];
  for (int i = 0; i < 4096; i++) host[i] = (unsigned char)(i * 7);
  CU_OK(cuMemcpyHtoDAsync(a, host, sizeof host, s));
  memset(host, 0, sizeof host); /* staged at the call: changing it now changes nothing */
  CU_OK(cuMemcpyDtoDAsync(b, a, 4096, s));
  CU_OK(cuMemsetD8Async(b, 0xab, 16, s));
  CU_OK(cuMemsetD32Async(b + 16, 0x01020304u, 4, s));
  CU_OK(cuMemcpyDtoHAsync(back, b, sizeof back, s));
  CU_OK(cuStreamSynchronize(s));
  for (int i = 0; i < 16; i++) assert_int_equal(back[i], 0xab);
  unsigned w;
  memcpy(&w, back + 20, 4);
  assert_int_equal(w, 0x01020304u);
  for (int i = 32; i < 4096; i++) assert_int_equal(back[i], (unsigned char)(i * 7));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemsetD32Async(b + 2, 0, 1, s));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoDAsync(a + 4000, host, 4096, s));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(a, NULL, 16));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuMemFree(a));
  CU_OK(cuMemFree(b));
}

static CUmemoryPool new_pool(CUmemAllocationHandleType handles) {
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  props.handleTypes = handles;
  CUmemoryPool pool;
  CU_OK(cuMemPoolCreate(&pool, &props));
  return pool;
}

static cuuint64_t attr64(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  CU_OK(cuMemPoolGetAttribute(pool, a, &v));
  return v;
}

static void test_pool_attribute_defaults_and_counters(void **state) {
  (void)state;
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
  int on = 0;
  CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &on));
  assert_int_equal(on, 1);
  CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
  assert_int_equal(on, 1);
  CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &on));
  assert_int_equal(on, 1);
  cuuint64_t max = UINT64_MAX;
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), UINT64_MAX);
  CUstream s = sim_test_stream();
  CUdeviceptr p, q;
  CU_OK(cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s));
  CU_OK(cuMemAllocFromPoolAsync(&q, 1 << 20, pool, s));
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 2u << 20);
  assert_true(attr64(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 2u << 20);
  CU_OK(cuMemFreeAsync(q, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1u << 20);
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 2u << 20);
  cuuint64_t zero = 0, one = 1;
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1u << 20);
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero));
  /* the freed megabyte is cached (threshold max) until trimmed */
  assert_true(attr64(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 2u << 20);
  CU_OK(cuMemPoolTrimTo(pool, 0));
  assert_true(attr64(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) < 2u << 20);
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), attr64(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuMemPoolDestroy(pool));
  CU_IS(CUDA_ERROR_INVALID_HANDLE, cuMemPoolTrimTo(pool, 0));
  CU_OK(cuStreamDestroy(s));
}

static void test_release_threshold_zero_returns_memory_at_sync(void **state) {
  (void)state;
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  CU_OK(cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s));
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(attr64(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
  CU_OK(cuMemPoolDestroy(pool));
  CU_OK(cuStreamDestroy(s));
}

static void test_export_needs_a_handle_type_at_creation(void **state) {
  (void)state;
  CUmemoryPool plain = new_pool(CU_MEM_HANDLE_TYPE_NONE), ipc = new_pool(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = -1;
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemPoolExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CU_OK(cuMemPoolExportToShareableHandle(&fd, ipc, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  assert_true(fd >= 0);
  close(fd);
  CU_OK(cuMemPoolDestroy(plain));
  CU_OK(cuMemPoolDestroy(ipc));
}

static void test_same_stream_reuses_a_freed_block_at_once(void **state) {
  (void)state;
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  CUstream s = sim_test_stream();
  CUdeviceptr p, q;
  CU_OK(cuMemAllocFromPoolAsync(&p, 4096, pool, s));
  CU_OK(sim_test_fill(s, p, 1024, 1));
  CU_OK(cuMemFreeAsync(p, s));
  CU_OK(cuMemAllocFromPoolAsync(&q, 4096, pool, s));
  assert_int_equal(q, p);
  CU_OK(sim_test_fill(s, q, 1024, 2));
  CU_OK(cuMemFreeAsync(q, s));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuMemPoolDestroy(pool));
  CU_OK(cuStreamDestroy(s));
}

static void test_other_stream_reuses_only_a_free_known_to_be_done(void **state) {
  (void)state;
  CUmemoryPool pool = new_pool(CU_MEM_HANDLE_TYPE_NONE);
  cuuint64_t max = UINT64_MAX;
  CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
  CUstream a = sim_test_stream(), b = sim_test_stream();
  CUdeviceptr p, q, r;
  CU_OK(cuMemAllocFromPoolAsync(&p, 4096, pool, a));
  CU_OK(sim_test_fill(a, p, 1024, 1));
  CU_OK(cuMemFreeAsync(p, a));
  CU_OK(cuMemAllocFromPoolAsync(&q, 4096, pool, b));
  assert_true(q != p); /* the free is not ordered before b's allocation */
  CU_OK(sim_test_fill(b, q, 1024, 2));
  CU_OK(cuStreamSynchronize(a));
  CU_OK(cuMemAllocFromPoolAsync(&r, 4096, pool, b));
  assert_int_equal(r, p); /* now the host knows the free ran */
  CU_OK(sim_test_fill(b, r, 1024, 3));
  CU_OK(cuMemFreeAsync(q, b));
  CU_OK(cuMemFreeAsync(r, b));
  CU_OK(cuStreamSynchronize(b));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuMemPoolDestroy(pool));
  CU_OK(cuStreamDestroy(a));
  CU_OK(cuStreamDestroy(b));
}

static void test_cuMemAlloc_memory_can_be_freed_in_stream_order(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  size_t free0, free1, total;
  CU_OK(cuMemGetInfo(&free0, &total));
  CU_OK(cuMemAlloc(&p, 1 << 20));
  CU_OK(sim_test_fill(s, p, 1024, 1));
  CU_OK(cuMemFreeAsync(p, s));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemFree(p)); /* already freed */
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuMemGetInfo(&free1, &total));
  assert_int_equal(free1, free0);
  CU_OK(cuMemFree(0));
  CUdeviceptr z = 1;
  CU_OK(cuMemAllocAsync(&z, 0, s));
  assert_int_equal(z, 0);
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuStreamDestroy(s));
}

static void test_default_pool_alloc_async(void **state) {
  (void)state;
  CUstream s = sim_test_stream();
  CUdeviceptr p;
  CU_OK(cuMemAllocAsync(&p, 1000, s));
  assert_int_equal(p % 256, 0);
  CU_OK(sim_test_fill(s, p, 250, 5));
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(sim_test_read(p, 249), 5);
  CU_OK(cuMemFreeAsync(p, s));
  CU_IS(CUDA_ERROR_INVALID_VALUE, cuMemFreeAsync(p, s)); /* double free */
  CU_OK(cuStreamSynchronize(s));
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuStreamDestroy(s));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_is_256_byte_aligned_and_counted),
      cmocka_unit_test(test_many_64_MiB_allocations_live_at_once),
      cmocka_unit_test(test_copies_and_sets_move_the_bytes),
      cmocka_unit_test(test_pool_attribute_defaults_and_counters),
      cmocka_unit_test(test_release_threshold_zero_returns_memory_at_sync),
      cmocka_unit_test(test_export_needs_a_handle_type_at_creation),
      cmocka_unit_test(test_same_stream_reuses_a_freed_block_at_once),
      cmocka_unit_test(test_other_stream_reuses_only_a_free_known_to_be_done),
      cmocka_unit_test(test_cuMemAlloc_memory_can_be_freed_in_stream_order),
      cmocka_unit_test(test_default_pool_alloc_async),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
