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

/* A thread's end (sim/stream.c): queued work on its per-thread stream on pool memory allocated in
 * that stream's order is reported (the GPU's teardown never returns there); other shapes are not
 * (tests/conformance "per-thread stream at a thread's end"; bench/data/h200x2-22cf2bd). The work is
 * kept queued until after the join: the per-thread stream first waits for a gate that the main
 * thread opens after it. */
typedef struct ending {
  const char *shape; /* "pu", "puf", "hu", "elsewhere", "plain" */
  CUevent gate;      /* recorded behind the closed gate */
  CUdeviceptr mem;   /* the memory the thread's memset writes (made by the thread for pu, puf, hu) */
  CUresult r;
} ending_t;

static void *ending_body(void *arg) {
  ending_t *e = arg;
  sim_test_thread_init();
  CUstream pt = CU_STREAM_PER_THREAD;
  e->r = cuStreamWaitEvent(pt, e->gate, 0);
  if (e->r == CUDA_SUCCESS && strcmp(e->shape, "hu") == 0) {
    CUstream h = sim_test_stream();
    CUevent done;
    e->r = cuMemAllocAsync(&e->mem, 4096, h);
    if (e->r == CUDA_SUCCESS) e->r = cuEventCreate(&done, CU_EVENT_DISABLE_TIMING);
    if (e->r == CUDA_SUCCESS) e->r = cuEventRecord(done, h);
    if (e->r == CUDA_SUCCESS) e->r = cuStreamWaitEvent(pt, done, 0);
    if (e->r == CUDA_SUCCESS) e->r = cuStreamSynchronize(h); /* (the host knowing it changes nothing) */
  } else if (e->r == CUDA_SUCCESS && (strcmp(e->shape, "pu") == 0 || strcmp(e->shape, "puf") == 0)) {
    e->r = cuMemAllocAsync(&e->mem, 4096, pt);
  }
  if (e->r == CUDA_SUCCESS) e->r = cuMemsetD32Async(e->mem, 7, 1024, pt);
  if (e->r == CUDA_SUCCESS && strcmp(e->shape, "puf") == 0) e->r = cuMemFreeAsync(e->mem, pt);
  return NULL;
}

static uint64_t end_thread_in_shape(const char *shape) {
  CUstream gate_stream = sim_test_stream(), s = sim_test_stream();
  CUdeviceptr flag;
  CU_OK(cuMemAlloc(&flag, 4096));
  CU_OK(cuMemsetD32Async(flag, 0, 1, s));
  CU_OK(cuStreamSynchronize(s));
  ending_t e = {shape, NULL, 0, CUDA_ERROR_UNKNOWN};
  CU_OK(cuEventCreate(&e.gate, CU_EVENT_DISABLE_TIMING));
  CU_OK(cuStreamWaitValue32(gate_stream, flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
  CU_OK(cuEventRecord(e.gate, gate_stream));
  if (strcmp(shape, "elsewhere") == 0) {
    CU_OK(cuMemAllocAsync(&e.mem, 4096, s));
    CU_OK(cuStreamSynchronize(s));
  } else if (strcmp(shape, "plain") == 0) {
    CU_OK(cuMemAlloc(&e.mem, 4096));
  }
  api->reset_races();
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, ending_body, &e), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  uint64_t reported = api->race_count();
  CU_OK(e.r);
  CU_OK(cuStreamWriteValue32(s, flag, 1, 0)); /* the gate opens */
  CU_OK(cuCtxSynchronize());
  if (strcmp(shape, "plain") == 0) CU_OK(cuMemFree(e.mem));
  else if (strcmp(shape, "puf") != 0) CU_OK(cuMemFreeAsync(e.mem, s));
  CU_OK(cuStreamSynchronize(s));
  CU_OK(cuMemFree(flag));
  CU_OK(cuEventDestroy(e.gate));
  CU_OK(cuStreamDestroy(gate_stream));
  CU_OK(cuStreamDestroy(s));
  api->reset_races();
  return reported;
}

static void test_a_threads_end_with_pool_work_queued_in_its_stream_order_is_reported(void **state) {
  (void)state;
  assert_int_equal(end_thread_in_shape("pu"), 1);
  assert_int_equal(end_thread_in_shape("puf"), 1); /* (its free queued too: missed before, found by review) */
  assert_int_equal(end_thread_in_shape("hu"), 1);
  assert_int_equal(end_thread_in_shape("elsewhere"), 0);
  assert_int_equal(end_thread_in_shape("plain"), 0);
}

/* A call on a default stream handle from a thread with no current context: INVALID_CONTEXT, as on
 * an H200 (found by review: INVALID_HANDLE for the enqueueing calls, after the thread-end model
 * stopped making a stream for no context). */
typedef struct no_ctx {
  CUresult r[6];
} no_ctx_t;

static void *calls_without_context(void *arg) {
  no_ctx_t *n = arg;
  CUevent ev = (CUevent)arg; /* (never used: the stream is looked up first) */
  CUdeviceptr p = 0;
  n->r[0] = cuMemsetD32Async(0x1000, 0, 1, CU_STREAM_PER_THREAD);
  n->r[1] = cuMemsetD32Async(0x1000, 0, 1, NULL);
  n->r[2] = cuEventRecord(ev, CU_STREAM_PER_THREAD);
  n->r[3] = cuMemAllocAsync(&p, 4096, CU_STREAM_PER_THREAD);
  n->r[4] = cuStreamSynchronize(CU_STREAM_PER_THREAD);
  n->r[5] = cuStreamQuery(CU_STREAM_LEGACY);
  return NULL;
}

static void test_default_handles_without_a_context_are_invalid_context(void **state) {
  (void)state;
  no_ctx_t n;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, calls_without_context, &n), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  for (int i = 0; i < 6; i++) assert_int_equal(n.r[i], CUDA_ERROR_INVALID_CONTEXT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_issuing_work_concurrently),
      cmocka_unit_test(test_trim_overlapping_an_enqueue_is_reported),
      cmocka_unit_test(test_trim_overlapping_an_enqueue_on_another_device_is_not_reported),
      cmocka_unit_test(test_a_threads_end_with_pool_work_queued_in_its_stream_order_is_reported),
      cmocka_unit_test(test_default_handles_without_a_context_are_invalid_context)};
  return cmocka_run_group_tests(tests, setup, NULL);
}
