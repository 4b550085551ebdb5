/* The simulated NCCL (sim/nccl.c) on two simulated devices (WEFT_SIM_DEVICES=2 in BUILD):
 * communicators by ncclCommInitAll and by ncclCommInitRank from two threads; every collective
 * and send / receive gives the right data, in place too; a group fuses a rank's work (a send and
 * a receive posted in either order); a collective that starts before its input is written is a
 * race; a collective a rank never posts leaves the others waiting (a synchronisation times out);
 * bad arguments and injected faults return their ncclResult_t and queue nothing. */
#include <nccl.h>
#include <pthread.h>
#include <string.h>

#include "tests/sim/sim_test.h"

#define N 1024

static const weft_sim_api_t *api;
static CUcontext ctx[2];
static CUstream st[2];
static CUdeviceptr buf[2], out[2];
static ncclComm_t comm[2];

static void on(int dev) { CU_OK(cuCtxSetCurrent(ctx[dev])); }

static int setup(void **state) {
  (void)state;
  api = sim_test_init();
  CU_OK(cuCtxGetCurrent(&ctx[0]));
  CU_OK(cuDevicePrimaryCtxRetain(&ctx[1], 1));
  for (int d = 0; d < 2; d++) {
    on(d);
    st[d] = sim_test_stream();
    CU_OK(cuMemAlloc(&buf[d], 2 * N * sizeof(float)));
    CU_OK(cuMemAlloc(&out[d], 2 * N * sizeof(float)));
  }
  on(0);
  assert_int_equal(ncclCommInitAll(comm, 2, (int[]){0, 1}), ncclSuccess);
  return 0;
}

static void put(int d, CUdeviceptr p, const void *host, size_t bytes) {
  on(d);
  CU_OK(cuMemcpyHtoD(p, host, bytes));
}

static void get(int d, CUdeviceptr p, void *host, size_t bytes) {
  on(d);
  CU_OK(cuStreamSynchronize(st[d]));
  CU_OK(cuMemcpyDtoH(host, p, bytes));
}

static void test_communicators_say_who_they_are(void **state) {
  (void)state;
  int n, dev, rank;
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncclCommCount(comm[r], &n), ncclSuccess);
    assert_int_equal(ncclCommCuDevice(comm[r], &dev), ncclSuccess);
    assert_int_equal(ncclCommUserRank(comm[r], &rank), ncclSuccess);
    assert_int_equal(n, 2);
    assert_int_equal(dev, r);
    assert_int_equal(rank, r);
    ncclResult_t async = ncclInternalError;
    assert_int_equal(ncclCommGetAsyncError(comm[r], &async), ncclSuccess);
    assert_int_equal(async, ncclSuccess);
  }
  int v = 0;
  assert_int_equal(ncclGetVersion(&v), ncclSuccess);
  assert_int_equal(v, NCCL_VERSION_CODE);
}

/* Both ranks' in-place all-reduce (sum) of buf, in one group from this thread (under capture when
 * the streams capture). */
static void all_reduce_in_place(void) {
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    on(r);
    assert_int_equal(ncclAllReduce((void *)buf[r], (void *)buf[r], N, ncclFloat32, ncclSum, comm[r], st[r]), ncclSuccess);
  }
  assert_int_equal(ncclGroupEnd(), ncclSuccess);
}

static void test_all_reduce_in_place_from_one_thread(void **state) {
  (void)state;
  float h[2][N];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) h[r][i] = (float)(i + 1000 * r);
    put(r, buf[r], h[r], sizeof h[r]);
  }
  all_reduce_in_place();
  for (int r = 0; r < 2; r++) {
    float got[N];
    get(r, buf[r], got, sizeof got);
    for (int i = 0; i < N; i++) assert_true(got[i] == (float)(2 * i + 1000));
  }
  assert_int_equal(api->race_count(), 0);
}

static void test_every_collective_gives_the_right_data(void **state) {
  (void)state;
  int32_t h[2][2 * N], got[2 * N];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 2 * N; i++) h[r][i] = i * (r + 1);
    put(r, buf[r], h[r], sizeof h[r]);
  }
  /* Broadcast from rank 1, then reduce (max) to rank 0, all-gather and reduce-scatter (sum). */
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncclBroadcast((void *)buf[r], (void *)out[r], N, ncclInt32, 1, comm[r], st[r]), ncclSuccess);
  assert_int_equal(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_int_equal(got[i], 2 * i);
  }
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncclReduce((void *)buf[r], (void *)out[r], N, ncclInt32, ncclMax, 0, comm[r], st[r]), ncclSuccess);
  assert_int_equal(ncclGroupEnd(), ncclSuccess);
  get(0, out[0], got, N * 4);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 2 * i);
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncclAllGather((void *)buf[r], (void *)out[r], N, ncclInt32, comm[r], st[r]), ncclSuccess);
  assert_int_equal(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, 2 * N * 4);
    for (int i = 0; i < N; i++) {
      assert_int_equal(got[i], i);
      assert_int_equal(got[N + i], 2 * i);
    }
  }
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncclReduceScatter((void *)buf[r], (void *)out[r], N, ncclInt32, ncclSum, comm[r], st[r]), ncclSuccess);
  assert_int_equal(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_int_equal(got[i], 3 * (r * N + i));
  }
  assert_int_equal(api->race_count(), 0);
}

static void test_send_and_receive_in_a_group_in_either_order(void **state) {
  (void)state;
  int32_t h[2][N], got[N];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) h[r][i] = 7 * i + r;
    put(r, buf[r], h[r], sizeof h[r]);
  }
  /* Rank 0 posts its send first, rank 1 its receive first: one fused operation each. */
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  assert_int_equal(ncclSend((void *)buf[0], N, ncclInt32, 1, comm[0], st[0]), ncclSuccess);
  assert_int_equal(ncclRecv((void *)out[0], N, ncclInt32, 1, comm[0], st[0]), ncclSuccess);
  assert_int_equal(ncclRecv((void *)out[1], N, ncclInt32, 0, comm[1], st[1]), ncclSuccess);
  assert_int_equal(ncclSend((void *)buf[1], N, ncclInt32, 0, comm[1], st[1]), ncclSuccess);
  assert_int_equal(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, sizeof got);
    for (int i = 0; i < N; i++) assert_int_equal(got[i], 7 * i + (1 - r));
  }
  assert_int_equal(api->race_count(), 0);
}

/* Both ranks' all-reduce (sum) of buf into out, in one group from this thread. */
static void all_reduce_buf_to_out(void) {
  assert_int_equal(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    on(r);
    assert_int_equal(ncclAllReduce((void *)buf[r], (void *)out[r], N, ncclFloat32, ncclSum, comm[r], st[r]), ncclSuccess);
  }
  assert_int_equal(ncclGroupEnd(), ncclSuccess);
}

/* Positive control: rank 0's input is written by a kernel on another stream of device 0 that the
 * collective's stream never waits for. */
static void test_collective_before_its_input_is_written_is_a_race(void **state) {
  (void)state;
  on(0);
  CUstream writer = sim_test_stream();
  CU_OK(sim_test_fill(writer, buf[0], N, 3));
  all_reduce_buf_to_out();
  on(0);
  CU_OK(cuCtxSynchronize());
  assert_true(api->race_count() >= 1);
  api->reset_races();
  /* With the wait, none. */
  CUevent e;
  CU_OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU_OK(sim_test_fill(writer, buf[0], N, 3));
  CU_OK(cuEventRecord(e, writer));
  CU_OK(cuStreamWaitEvent(st[0], e, 0));
  all_reduce_buf_to_out();
  on(0);
  CU_OK(cuCtxSynchronize());
  assert_int_equal(api->race_count(), 0);
  CU_OK(cuEventDestroy(e));
  CU_OK(cuStreamDestroy(writer));
}

typedef struct joiner {
  ncclUniqueId id;
  int rank;
  ncclComm_t comm;
  ncclResult_t r;
} joiner_t;

static void *join_rank(void *arg) {
  joiner_t *j = arg;
  if (cuCtxSetCurrent(ctx[j->rank]) != CUDA_SUCCESS) return NULL;
  j->r = ncclCommInitRank(&j->comm, 2, j->id, j->rank);
  return NULL;
}

static void test_init_rank_from_two_threads_then_a_missing_partner_times_out(void **state) {
  (void)state;
  ncclUniqueId id;
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  joiner_t j[2] = {{id, 0, NULL, ncclInternalError}, {id, 1, NULL, ncclInternalError}};
  pthread_t t[2];
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&t[r], NULL, join_rank, &j[r]), 0);
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_join(t[r], NULL), 0);
  for (int r = 0; r < 2; r++) assert_int_equal(j[r].r, ncclSuccess);
  int rank;
  assert_int_equal(ncclCommUserRank(j[1].comm, &rank), ncclSuccess);
  assert_int_equal(rank, 1);
  /* Only rank 0 posts: its stream never gets past the all-reduce. */
  on(0);
  assert_int_equal(ncclAllReduce((void *)buf[0], (void *)out[0], N, ncclFloat32, ncclSum, j[0].comm, st[0]), ncclSuccess);
  CU_IS(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(st[0]));
  assert_int_equal(ncclCommDestroy(j[0].comm), ncclInvalidUsage); /* its operation is still queued */
  on(1);
  assert_int_equal(ncclAllReduce((void *)buf[1], (void *)out[1], N, ncclFloat32, ncclSum, j[1].comm, st[1]), ncclSuccess);
  CU_OK(cuStreamSynchronize(st[1]));
  on(0);
  CU_OK(cuStreamSynchronize(st[0]));
  for (int r = 0; r < 2; r++) assert_int_equal(ncclCommDestroy(j[r].comm), ncclSuccess);
  assert_int_equal(api->race_count(), 0);
}

/* ncclCommAbort drops the rank's queued operations, as NCCL aborts uncompleted ones: the stream
 * goes on past them with nothing written, the communicator is gone at once, and the partner's
 * operation, posted later, waits for a rank that is no more (a synchronisation times out). */
static void test_abort_drops_the_queued_operations(void **state) {
  (void)state;
  ncclComm_t c[2];
  on(0);
  assert_int_equal(ncclCommInitAll(c, 2, (int[]){0, 1}), ncclSuccess);
  float before[N], got[N];
  for (int i = 0; i < N; i++) before[i] = (float)(-i);
  put(0, out[0], before, sizeof before);
  on(0);
  assert_int_equal(ncclAllReduce((void *)buf[0], (void *)out[0], N, ncclFloat32, ncclSum, c[0], st[0]), ncclSuccess);
  CU_IS(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(st[0])); /* rank 1 never posted */
  assert_int_equal(ncclCommDestroy(c[0]), ncclInvalidUsage);     /* destroy refuses: still queued */
  assert_int_equal(ncclCommAbort(c[0]), ncclSuccess);            /* abort drops it */
  int n;
  assert_int_equal(ncclCommCount(c[0], &n), ncclInvalidArgument); /* gone */
  CU_OK(cuStreamSynchronize(st[0]));
  get(0, out[0], got, sizeof got);
  assert_memory_equal(got, before, sizeof got); /* nothing written */
  on(1);
  assert_int_equal(ncclAllReduce((void *)buf[1], (void *)out[1], N, ncclFloat32, ncclSum, c[1], st[1]), ncclSuccess);
  CU_IS(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(st[1]));
  assert_int_equal(ncclCommAbort(c[1]), ncclSuccess);
  CU_OK(cuStreamSynchronize(st[1]));
  assert_int_equal(api->race_count(), 0);
}

/* Captured collectives: each rank's stream captured (RELAXED, one thread), an in-place all-reduce
 * in one group, the graphs instantiated and launched three times with new inputs in between, an
 * eager all-reduce between two launches: right data every time, no race. */
static void test_captured_all_reduce_replays(void **state) {
  (void)state;
  CUgraph g[2];
  CUgraphExec x[2];
  for (int r = 0; r < 2; r++) {
    on(r);
    CU_OK(cuStreamBeginCapture(st[r], CU_STREAM_CAPTURE_MODE_RELAXED));
  }
  all_reduce_in_place();
  for (int r = 0; r < 2; r++) {
    on(r);
    CU_OK(cuStreamEndCapture(st[r], &g[r]));
    CU_OK(cuGraphInstantiateWithFlags(&x[r], g[r], 0));
  }
  for (int launch = 0; launch < 4; launch++) {
    float h[2][N], got[N];
    for (int r = 0; r < 2; r++) {
      for (int i = 0; i < N; i++) h[r][i] = (float)(i * (launch + 1) + r);
      put(r, buf[r], h[r], sizeof h[r]);
    }
    if (launch == 2) { /* an eager one between launches: sequence numbers stay in step */
      all_reduce_buf_to_out();
      for (int r = 0; r < 2; r++) {
        get(r, out[r], got, sizeof got);
        for (int i = 0; i < N; i++) assert_true(got[i] == h[0][i] + h[1][i]);
      }
    }
    for (int r = 0; r < 2; r++) {
      on(r);
      CU_OK(cuGraphLaunch(x[r], st[r]));
    }
    for (int r = 0; r < 2; r++) {
      get(r, buf[r], got, sizeof got);
      for (int i = 0; i < N; i++) assert_true(got[i] == h[0][i] + h[1][i]);
    }
  }
  for (int r = 0; r < 2; r++) {
    on(r);
    CU_OK(cuGraphExecDestroy(x[r]));
    CU_OK(cuGraphDestroy(g[r]));
  }
  assert_int_equal(api->race_count(), 0);
}

static void test_bad_arguments_and_faults_queue_nothing(void **state) {
  (void)state;
  on(0);
  assert_int_equal(ncclBroadcast((void *)buf[0], (void *)out[0], N, ncclInt32, 2, comm[0], st[0]), ncclInvalidArgument);
  assert_int_equal(ncclSend((void *)buf[0], N, ncclInt32, -1, comm[0], st[0]), ncclInvalidArgument);
  assert_int_equal(ncclAllReduce((void *)buf[0], (void *)out[0], N, ncclFloat16, ncclSum, comm[0], st[0]),
                   ncclInvalidArgument); /* not modelled */
  assert_int_equal(ncclAllReduce((void *)buf[0], (void *)out[0], N, ncclFloat32, ncclSum, comm[0], st[1]),
                   ncclInvalidArgument); /* a stream of another device */
  assert_int_equal(ncclAllReduce((void *)buf[0], (void *)out[0], N, ncclFloat32, ncclSum, NULL, st[0]),
                   ncclInvalidArgument);
  assert_int_equal(ncclGroupEnd(), ncclInvalidUsage);
  assert_int_equal((api->fail)("ncclAllReduce:1:2"), 0);
  assert_int_equal(ncclAllReduce((void *)buf[0], (void *)out[0], N, ncclFloat32, ncclSum, comm[0], st[0]), ncclSystemError);
  assert_int_equal((api->fail)(""), 0);
  /* Nothing was queued: the next all-reduce pair runs, and the stream drains. */
  all_reduce_buf_to_out();
  for (int r = 0; r < 2; r++) {
    on(r);
    CU_OK(cuStreamSynchronize(st[r]));
  }
  assert_int_equal(api->race_count(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_communicators_say_who_they_are),
      cmocka_unit_test(test_all_reduce_in_place_from_one_thread),
      cmocka_unit_test(test_every_collective_gives_the_right_data),
      cmocka_unit_test(test_send_and_receive_in_a_group_in_either_order),
      cmocka_unit_test(test_collective_before_its_input_is_written_is_a_race),
      cmocka_unit_test(test_init_rank_from_two_threads_then_a_missing_partner_times_out),
      cmocka_unit_test(test_captured_all_reduce_replays),
      cmocka_unit_test(test_abort_drops_the_queued_operations),
      cmocka_unit_test(test_bad_arguments_and_faults_queue_nothing),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
