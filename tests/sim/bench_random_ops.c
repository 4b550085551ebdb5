/* A 100,000-operation random multi-stream program under the simulator with the oracle on: how
 * long it takes (printed, not asserted), and that a correctly synchronised program has no race
 * and computes what a sequential model computes.
 *
 * 8 streams, 32 buffers. Each operation picks a stream and one or two buffers, waits for the
 * event of each buffer's last use when that was on another stream, does a kernel, a copy, a set,
 * a pool allocation or a host function, and records the buffers' events. WEFT_BENCH_OPS overrides
 * the count (sanitizer builds run fewer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/sim/sim_test.h"

#define STREAMS 8
#define BUFS 32
#define N 256u /* elements per buffer */

static const weft_sim_api_t *api;
static unsigned g_host_calls;

static void host_fn(void *p) {
  (void)p;
  g_host_calls++;
}

static uint64_t rng = 88172645463325252ull;
static unsigned rnd(unsigned n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (unsigned)(rng % n);
}

static CUstream streams[STREAMS];
static CUdeviceptr bufs[BUFS];
static CUevent events[BUFS];
static int last[BUFS]; /* stream of the buffer's last use, -1 none */
static unsigned model[BUFS][N];

static void order(int s, int b) {
  if (last[b] >= 0 && last[b] != s) CU_OK(cuStreamWaitEvent(streams[s], events[b], 0));
}

static void done(int s, int b) {
  CU_OK(cuEventRecord(events[b], streams[s]));
  last[b] = s;
}

static void test_random_program(void **state) {
  (void)state;
  unsigned ops = 100000;
  const char *env = getenv("WEFT_BENCH_OPS");
  if (env) ops = (unsigned)strtoul(env, NULL, 10);
  for (int i = 0; i < STREAMS; i++) streams[i] = sim_test_stream();
  for (int b = 0; b < BUFS; b++) {
    CU_OK(cuMemAlloc(&bufs[b], N * 4));
    CU_OK(cuEventCreate(&events[b], CU_EVENT_DISABLE_TIMING));
    CU_OK(cuMemsetD32Async(bufs[b], 0, N, streams[0]));
    last[b] = -1;
  }
  CU_OK(cuStreamSynchronize(streams[0]));
  weft_sim_stats_t before, after;
  api->stats(&before);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (unsigned i = 0; i < ops; i++) {
    int s = (int)rnd(STREAMS), d = (int)rnd(BUFS), src = (int)rnd(BUFS);
    unsigned kind = rnd(100);
    if (kind < 40 && src != d) {
      order(s, d);
      order(s, src);
      CU_OK(sim_test_add(streams[s], bufs[d], bufs[src], N));
      for (unsigned k = 0; k < N; k++) model[d][k] += model[src][k];
      done(s, d);
      done(s, src);
    } else if (kind < 60) {
      unsigned v = rnd(1000);
      order(s, d);
      CU_OK(sim_test_fill(streams[s], bufs[d], N, v));
      for (unsigned k = 0; k < N; k++) model[d][k] = v;
      done(s, d);
    } else if (kind < 70 && src != d) {
      order(s, d);
      order(s, src);
      CU_OK(cuMemcpyDtoDAsync(bufs[d], bufs[src], N * 4, streams[s]));
      memcpy(model[d], model[src], sizeof model[d]);
      done(s, d);
      done(s, src);
    } else if (kind < 80) {
      unsigned v = rnd(7);
      order(s, d);
      CU_OK(cuMemsetD32Async(bufs[d] + N * 2, v, N / 2, streams[s]));
      for (unsigned k = N / 2; k < N; k++) model[d][k] = v;
      done(s, d);
    } else if (kind < 90) {
      CUdeviceptr tmp;
      CU_OK(cuMemAllocAsync(&tmp, N * 4, streams[s]));
      order(s, d);
      CU_OK(sim_test_copy(streams[s], tmp, bufs[d], N));
      CU_OK(sim_test_add(streams[s], bufs[d], tmp, N));
      for (unsigned k = 0; k < N; k++) model[d][k] *= 2;
      done(s, d);
      CU_OK(cuMemFreeAsync(tmp, streams[s]));
    } else if (kind < 97) {
      CU_OK(cuLaunchHostFunc(streams[s], host_fn, NULL));
    } else if (kind < 99) {
      CUresult r = cuStreamQuery(streams[s]);
      assert_true(r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY);
    } else {
      CU_OK(cuStreamSynchronize(streams[s]));
    }
  }
  CU_OK(cuCtxSynchronize());
  clock_gettime(CLOCK_MONOTONIC, &t1);
  api->stats(&after);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  printf("bench_random_ops: %u operations issued, %llu ops executed, %llu driver calls, %llu races, %.3f s "
         "(%.2f us per executed op), oracle on\n",
         ops, (unsigned long long)(after.ops_executed - before.ops_executed),
         (unsigned long long)(after.api_calls - before.api_calls), (unsigned long long)api->race_count(), secs,
         secs * 1e6 / (double)(after.ops_executed - before.ops_executed + 1));
  if (api->race_count()) api->print_report();
  assert_int_equal(api->race_count(), 0);
  for (int b = 0; b < BUFS; b++) {
    unsigned host[N];
    CU_OK(cuMemcpyDtoH(host, bufs[b], sizeof host));
    assert_memory_equal(host, model[b], sizeof host);
  }
  for (int b = 0; b < BUFS; b++) {
    CU_OK(cuMemFree(bufs[b]));
    CU_OK(cuEventDestroy(events[b]));
  }
  for (int i = 0; i < STREAMS; i++) CU_OK(cuStreamDestroy(streams[i]));
}

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_random_program)};
  return cmocka_run_group_tests(tests, setup, NULL);
}
