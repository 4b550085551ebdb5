/* Host threads calling the simulator at once: each thread works on its own stream and buffer (no
 * race may be reported), and one host function per stream calls back into the driver. A
 * cuDeviceGraphMemTrim that overlaps another thread's enqueueing call is reported as a race
 * (tests/conformance/README.md, "graph calls"); one with no such call is not, nor one beside
 * enqueues on another device only (the gate is per device: lib/core/gate.h). Meant to be run
 * under --config=tsan too. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "tests/sim/sim_test.h"

#define THREADS 4
#define ROUNDS 200

static const weft_sim_api_t *api;

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

static void count(void *p) {
  unsigned long long id;
  CUstream s = *(CUstream *)p;
  cuStreamGetId(s, &id); /* a harmless call from a callback */
}

typedef struct job {
  CUdeviceptr a, b;
  CUstream s;
  int failures;
} job_t;

static void *work(void *arg) {
  job_t *j = arg;
  CUcontext ctx;
  if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    j->failures++;
    return NULL;
  }
  for (unsigned r = 0; r < ROUNDS; r++) {
    j->failures += sim_test_fill(j->s, j->a, 256, r) != CUDA_SUCCESS;
    j->failures += sim_test_copy(j->s, j->b, j->a, 256) != CUDA_SUCCESS;
    j->failures += cuLaunchHostFunc(j->s, count, &j->s) != CUDA_SUCCESS;
    if (r % 16 == 0) {
      j->failures += cuStreamSynchronize(j->s) != CUDA_SUCCESS;
      unsigned v = 0;
      j->failures += cuMemcpyDtoH(&v, j->b + 4 * 255, 4) != CUDA_SUCCESS;
      j->failures += v != r;
    }
  }
  j->failures += cuStreamSynchronize(j->s) != CUDA_SUCCESS;
  cuDevicePrimaryCtxRelease(0);
  return NULL;
}

static void test_threads_issuing_work_concurrently(void **state) {
  (void)state;
  job_t jobs[THREADS];
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) {
    CU_OK(cuMemAlloc(&jobs[i].a, 1024));
    CU_OK(cuMemAlloc(&jobs[i].b, 1024));
    jobs[i].s = sim_test_stream();
    jobs[i].failures = 0;
  }
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, work, &jobs[i]), 0);
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(jobs[i].failures, 0);
    assert_int_equal(sim_test_read(jobs[i].b, 0), ROUNDS - 1);
    CU_OK(cuStreamDestroy(jobs[i].s));
    CU_OK(cuMemFree(jobs[i].a));
    CU_OK(cuMemFree(jobs[i].b));
  }
  assert_int_equal(api->race_count(), 0);
}

static atomic_int stop_recording;

static int record_device; /* the device the recorders work on */

static void *record_until_stopped(void *arg) {
  CUcontext ctx;
  if (cuDevicePrimaryCtxRetain(&ctx, record_device) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    *(int *)arg = 1;
    return NULL;
  }
  CUstream s = sim_test_stream();
  CUevent e;
  int failures = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS;
  while (!atomic_load(&stop_recording)) failures += cuEventRecord(e, s) != CUDA_SUCCESS;
  failures += cuStreamSynchronize(s) != CUDA_SUCCESS;
  failures += cuEventDestroy(e) != CUDA_SUCCESS;
  failures += cuStreamDestroy(s) != CUDA_SUCCESS;
  *(int *)arg = failures;
  return NULL;
}

/* Trims of device `trim_device` while 3 threads record events on device `record_device`, until a
 * race is reported or 5,000,000 trims: the number of races. */
static uint64_t trims_beside_recorders(int trim_device) {
  enum { RECORDERS = 3 };
  pthread_t t[RECORDERS];
  int failures[RECORDERS];
  atomic_store(&stop_recording, 0);
  for (int i = 0; i < RECORDERS; i++) assert_int_equal(pthread_create(&t[i], NULL, record_until_stopped, &failures[i]), 0);
  for (long i = 0; i < 5000000 && api->race_count() == 0; i++) CU_OK(cuDeviceGraphMemTrim(trim_device));
  atomic_store(&stop_recording, 1);
  for (int i = 0; i < RECORDERS; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(failures[i], 0);
  }
  return api->race_count();
}

/* The gate is per device (lib/core/gate.h): a trim of device 1 may overlap enqueues on device 0,
 * and one of device 0 is still reported. Needs WEFT_SIM_DEVICES=2 (else a skip). */
static void test_trim_overlapping_an_enqueue_on_another_device_is_not_reported(void **state) {
  (void)state;
  int n = 0;
  CU_OK(cuDeviceGetCount(&n));
  if (n < 2) skip();
  api->reset_races();
  record_device = 0;
  /* Bounded by time, not by a race: 200,000 trims of device 1 beside the recorders. */
  atomic_store(&stop_recording, 0);
  enum { RECORDERS = 3 };
  pthread_t t[RECORDERS];
  int failures[RECORDERS];
  for (int i = 0; i < RECORDERS; i++) assert_int_equal(pthread_create(&t[i], NULL, record_until_stopped, &failures[i]), 0);
  for (long i = 0; i < 200000; i++) CU_OK(cuDeviceGraphMemTrim(1));
  atomic_store(&stop_recording, 1);
  for (int i = 0; i < RECORDERS; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(failures[i], 0);
  }
  assert_int_equal(api->race_count(), 0);
  /* The control: the same with trims of device 0. */
  assert_true(trims_beside_recorders(0) > 0);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_non_null(strstr(r.first_desc, "device 0"));
  api->reset_races();
}

static void test_trim_overlapping_an_enqueue_is_reported(void **state) {
  (void)state;
  api->reset_races();
  record_device = 0;
  for (int i = 0; i < 100; i++) CU_OK(cuDeviceGraphMemTrim(0)); /* alone: no hazard */
  assert_int_equal(api->race_count(), 0);
  /* Bounded: the recorders enter cuEventRecord millions of times a second. */
  assert_true(trims_beside_recorders(0) > 0);
  weft_sim_race_t r;
  assert_int_equal(api->races(&r, 1), 1);
  assert_non_null(strstr(r.second_desc, "cuDeviceGraphMemTrim"));
  assert_non_null(strstr(r.first_desc, "cuEventRecord"));
  api->reset_races();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_issuing_work_concurrently),
      cmocka_unit_test(test_trim_overlapping_an_enqueue_is_reported),
      cmocka_unit_test(test_trim_overlapping_an_enqueue_on_another_device_is_not_reported)};
  return cmocka_run_group_tests(tests, setup, NULL);
}
