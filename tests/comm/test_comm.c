/* Communicators and collectives as tracked uses (issue 14), over two devices: in CI two simulated
 * devices and the simulated NCCL (WEFT_SIM_DEVICES=2, WEFT_NCCL=sim, see BUILD); on a machine
 * with two GPUs the real driver and NCCL (libnccl.so.2). Skipped with one device.
 *
 * The point: the program writes a collective's input on one stream, runs the collective on the
 * communicator's stream and reads its output on a third, with no event of its own; weft inserts
 * the waits (the oracle sees no race; with waits turned off it sees them), and the data is right. */
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/core/handle.h"
#include "lib/core/meta.h"
#include "lib/runtime/runtime.h"
#include "sim/weft_sim.h"
#include "tests/util/again.h"
#include "weft/weft.h"

#define N 4096 /* elements */

static const weft__driver_t *drv;
static const weft_sim_api_t *sim; /* NULL on a GPU */
static weft_runtime_t *rt[2];
static weft_comm_t *comm[2];
static int g_two;

static weft_stream_t *stream(int r, unsigned i) {
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(rt[r], i, &s), WEFT_OK);
  return s;
}

static weft_block_t alloc(int r, size_t bytes) {
  weft_block_t b;
  weft_status_t st = weft_alloc(rt[r], bytes, stream(r, 0), "comm", &b);
  if (st != WEFT_OK) fail_msg("weft_alloc: %s", weft_last_error());
  return b;
}

static void expect(int r, weft_block_t b, size_t offset, const float *want, size_t n) {
  float *got = malloc(n * sizeof *got);
  assert_int_equal(weft_copy_from_block(stream(r, 2), got, b, offset, n * sizeof *got), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(stream(r, 2)), WEFT_OK);
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) fail_msg("rank %d element %zu: %g, want %g", r, i, (double)got[i], (double)want[i]);
  free(got);
}

static uint64_t races(void) { return sim ? sim->race_count() : 0; }

static int setup(void **state) {
  (void)state;
  setenv("NCCL_SOCKET_IFNAME", "lo", 0); /* the GPU machines' NCCL bootstrap needs it */
  if (weft__driver_get(&drv) != WEFT_OK) return -1;
  sim = weft_sim_api(weft_driver_symbol);
  int n = 0;
  if (drv->cuDeviceGetCount(&n) != CUDA_SUCCESS) return -1;
  if (n < 2) return 0;
  g_two = 1;
  for (int r = 0; r < 2; r++)
    if (weft_runtime_get(r, NULL, &rt[r]) != WEFT_OK) return -1;
  weft_status_t st = weft_comm_init_all(rt, 2, comm);
  if (st != WEFT_OK) fprintf(stderr, "weft_comm_init_all: %s\n", weft_last_error());
  return st == WEFT_OK ? 0 : -1;
}

/* A thread captures a collective on its per-thread stream, ends the capture and ends; the
 * communicator is then destroyed from another thread. Nobody can ask the driver about that
 * per-thread stream any more, and its owner has ended: the capture is over. (Its entry counted as
 * active for good: weft_comm_destroy said BUSY, "1 open capture(s) hold its collectives", and
 * the runtime could never be released. Found by review.) */
static weft_comm_t *pc_comm[2];
static weft_status_t pc_st;

static void *per_thread_capture_body(void *arg) {
  (void)arg;
  weft_stream_t *pt;
  weft_block_t b = alloc(0, N * 4);
  weft_graph_t *g = NULL;
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = WEFT_CAPTURE_RELAXED;
  pc_st = weft_stream_adopt(rt[0], CU_STREAM_PER_THREAD, &pt);
  if (pc_st == WEFT_OK) pc_st = weft_capture_begin(pt, &o);
  if (pc_st == WEFT_OK) {
    pc_st = weft_all_reduce(pc_comm[0], b, 0, b, 0, N, WEFT_FLOAT32, WEFT_SUM, pt);
    weft_status_t e = weft_capture_end(pt, &g);
    if (pc_st == WEFT_OK) pc_st = e;
  }
  if (g != NULL) (void)weft_graph_destroy(g);
  if (pc_st == WEFT_OK) pc_st = weft_free(b, pt);
  return NULL;
}

static void test_a_communicator_goes_after_an_ended_threads_per_thread_capture(void **state) {
  (void)state;
  if (!g_two) skip();
  assert_int_equal(weft_comm_init_all(rt, 2, pc_comm), WEFT_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, per_thread_capture_body, NULL), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  if (pc_st != WEFT_OK) fail_msg("the capturing thread: %s", weft_status_name(pc_st));
  for (int r = 0; r < 2; r++) {
    weft_status_t st = weft_comm_destroy(pc_comm[r]);
    if (st != WEFT_OK) fail_msg("weft_comm_destroy, rank %d: %s: %s", r, weft_status_name(st), weft_last_error());
  }
}

/* The last case: the communicators and runtimes go, with nothing left (the group's teardown's
 * failures do not fail a cmocka run, a case's do). */
static void test_communicators_and_runtimes_go(void **state) {
  (void)state;
  if (!g_two) skip();
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_comm_destroy(comm[r]), WEFT_OK);
    assert_int_equal(weft_runtime_release(rt[r]), WEFT_OK);
  }
  assert_int_equal(races(), 0);
  g_two = 0; /* released */
}

static int teardown(void **state) {
  (void)state;
  if (!g_two) return 0;
  for (int r = 0; r < 2; r++) {
    weft_status_t st = weft_comm_destroy(comm[r]);
    if (st == WEFT_OK) st = weft_runtime_release(rt[r]);
    if (st != WEFT_OK) {
      fprintf(stderr, "teardown, rank %d: %s: %s\n", r, weft_status_name(st), weft_last_error());
      return -1;
    }
  }
  return 0;
}

static void test_communicators_know_their_rank_runtime_and_stream(void **state) {
  (void)state;
  if (!g_two) skip();
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_comm_rank(comm[r]), r);
    assert_int_equal(weft_comm_size(comm[r]), 2);
    assert_ptr_equal(weft_comm_runtime(comm[r]), rt[r]);
    assert_non_null(weft_comm_stream(comm[r]));
    assert_int_equal(weft_comm_check(comm[r]), WEFT_OK);
  }
  assert_int_equal(weft_comm_rank(NULL), -1);
  /* A runtime with a live communicator refuses its last release, and stays as it was. */
  assert_int_equal(weft_runtime_release(rt[0]), WEFT_ERR_BUSY);
  assert_int_equal(weft_runtime_device(rt[0]), 0);
  assert_int_equal(weft_comm_check(comm[0]), WEFT_OK);
}

/* Input written on stream 0, all-reduce on the communicator's stream, output read on stream 2:
 * no event of the program's, weft orders all three. */
static void run_all_reduce(weft_block_t *in, weft_block_t *out, int in_place) {
  for (int r = 0; r < 2; r++) {
    in[r] = alloc(r, N * 4);
    out[r] = in_place ? in[r] : alloc(r, N * 4);
    float h[N];
    for (int i = 0; i < N; i++) h[i] = (float)(i + 1000 * r);
    assert_int_equal(weft_copy_to_block(stream(r, 0), in[r], 0, h, sizeof h), WEFT_OK);
  }
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(weft_all_reduce(comm[r], in[r], 0, out[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  weft_status_t st = weft_comm_group_end();
  if (st != WEFT_OK) fail_msg("weft_comm_group_end: %s", weft_last_error());
}

static void test_all_reduce_waits_for_its_input_and_its_readers_wait_for_it(void **state) {
  (void)state;
  if (!g_two) skip();
  for (int in_place = 0; in_place < 2; in_place++) {
    weft_block_t in[2], out[2];
    run_all_reduce(in, out, in_place);
    float want[N];
    for (int i = 0; i < N; i++) want[i] = (float)(2 * i + 1000);
    for (int r = 0; r < 2; r++) expect(r, out[r], 0, want, N);
    assert_int_equal(races(), 0);
    for (int r = 0; r < 2; r++) {
      assert_int_equal(weft_free(in[r], stream(r, 0)), WEFT_OK);
      if (!in_place) assert_int_equal(weft_free(out[r], stream(r, 1)), WEFT_OK);
    }
  }
}

/* NCCL matches a communicator's operations across ranks in the order each rank's device runs
 * them, so on each rank they must run in the order they were posted, whatever streams they were
 * posted on (test_comm_long's thread-per-rank programs hung on 2 x H200: an eager collective and a
 * replayed graph's, on two streams of a rank that no wait ordered, ran in opposite orders on the
 * two devices). Two collectives of one communicator on two streams, on separate buffers: the
 * second must wait for the first on each rank (a wait issued), eager and as a graph launch. */
static uint64_t waits_of(int r) {
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(rt[r], &c), WEFT_OK);
  return c.waits_issued;
}

static void test_a_communicators_operations_run_in_posting_order_on_each_rank(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2], b[2];
  for (int r = 0; r < 2; r++) {
    a[r] = alloc(r, N * 4);
    b[r] = alloc(r, N * 4);
    assert_int_equal(weft_memset32(stream(r, 0), a[r], 0, 0, N * 4), WEFT_OK);
    assert_int_equal(weft_memset32(stream(r, 0), b[r], 0, 0, N * 4), WEFT_OK);
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  }
  /* Eager: all-reduce of a on stream 1, then of b on stream 2 (one weft group each). */
  uint64_t w0[2] = {waits_of(0), waits_of(1)};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(weft_comm_group_begin(), WEFT_OK);
    for (int r = 0; r < 2; r++)
      assert_int_equal(weft_all_reduce(comm[r], k ? b[r] : a[r], 0, k ? b[r] : a[r], 0, N, WEFT_FLOAT32, WEFT_SUM,
                                       stream(r, 1 + (unsigned)k)), WEFT_OK);
    assert_int_equal(weft_comm_group_end(), WEFT_OK);
  }
  for (int r = 0; r < 2; r++)
    if (waits_of(r) == w0[r]) fail_msg("rank %d: the second all-reduce (stream 2) did not wait for the first (stream 1)", r);
  /* A graph of rank r's all-reduce of b, launched on stream 3 after an eager all-reduce of a on
   * stream 1. */
  weft_graph_t *g[2];
  weft_exec_t *e[2];
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = WEFT_CAPTURE_RELAXED;
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
    assert_int_equal(weft_capture_begin(stream(r, 2), &o), WEFT_OK);
    assert_int_equal(weft_all_reduce(comm[r], b[r], 0, b[r], 0, N, WEFT_FLOAT32, WEFT_SUM, stream(r, 2)), WEFT_OK);
    assert_int_equal(weft_capture_end(stream(r, 2), &g[r]), WEFT_OK);
    assert_int_equal(weft_graph_instantiate(g[r], stream(r, 2), &e[r]), WEFT_OK);
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  }
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(weft_all_reduce(comm[r], a[r], 0, a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, stream(r, 1)), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  uint64_t w1[2] = {waits_of(0), waits_of(1)};
  for (int r = 0; r < 2; r++) assert_int_equal(weft_exec_launch(e[r], stream(r, 3)), WEFT_OK);
  for (int r = 0; r < 2; r++)
    if (waits_of(r) == w1[r]) fail_msg("rank %d: the graph's launch (stream 3) did not wait for the eager all-reduce (stream 1)", r);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  float want[N];
  for (int i = 0; i < N; i++) want[i] = 0;
  for (int r = 0; r < 2; r++) {
    expect(r, a[r], 0, want, N);
    expect(r, b[r], 0, want, N);
    assert_int_equal(weft_exec_destroy(e[r]), WEFT_OK);
    assert_int_equal(weft_graph_destroy(g[r]), WEFT_OK);
    assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
    assert_int_equal(weft_free(b[r], stream(r, 0)), WEFT_OK);
  }
  assert_int_equal(races(), 0);
}

/* A communicator whose collectives a weft graph holds (weft_capture_end) is not destroyed under it:
 * BUSY while the graph lives (its exec or not), destroyed once the graph is. NCCL's destroy waits
 * until such graphs are destroyed (on 2 x H200 a thread that destroyed the communicator first hung:
 * tests/conformance conformance_nccl), and the simulator refuses it. */
static void test_a_communicator_held_by_a_weft_graph_is_busy(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_comm_t *x[2];
  assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
  weft_block_t b[2];
  weft_graph_t *g[2];
  weft_exec_t *e[2];
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = WEFT_CAPTURE_RELAXED;
  for (int r = 0; r < 2; r++) {
    b[r] = alloc(r, N * 4);
    assert_int_equal(weft_memset32(stream(r, 0), b[r], 0, (uint32_t)r + 1, N * 4), WEFT_OK);
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
    assert_int_equal(weft_capture_begin(stream(r, 2), &o), WEFT_OK);
  }
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(weft_all_reduce(x[r], b[r], 0, b[r], 0, N, WEFT_UINT32, WEFT_SUM, stream(r, 2)), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_capture_end(stream(r, 2), &g[r]), WEFT_OK);
    assert_int_equal(weft_graph_instantiate(g[r], stream(r, 2), &e[r]), WEFT_OK);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_exec_launch(e[r], stream(r, 3)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  uint32_t got[N];
  assert_int_equal(weft_copy_from_block(stream(0, 2), got, b[0], 0, sizeof got), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(stream(0, 2)), WEFT_OK);
  for (size_t i = 0; i < N; i++) assert_int_equal(got[i], 3);
  /* With the exec and the graph, then with the graph alone: BUSY, the communicator still works. */
  for (int step = 0; step < 2; step++) {
    for (int r = 0; r < 2; r++) {
      weft_status_t st = weft_comm_destroy(x[r]);
      if (st != WEFT_ERR_BUSY) fail_msg("step %d rank %d: weft_comm_destroy: %s, want BUSY", step, r, weft_status_name(st));
      if (strstr(weft_last_error(), "weft graph") == NULL) fail_msg("the message does not say why: %s", weft_last_error());
      assert_int_equal(weft_comm_rank(x[r]), r);
    }
    for (int r = 0; r < 2 && step == 0; r++) assert_int_equal(weft_exec_destroy(e[r]), WEFT_OK);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_graph_destroy(g[r]), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_comm_destroy(x[r]), WEFT_OK);
    assert_int_equal(weft_free(b[r], stream(r, 0)), WEFT_OK);
  }
  assert_int_equal(races(), 0);
}

/* Positive control (simulator): the same program with weft's waits turned off races. */
static void test_without_waits_the_oracle_sees_the_races(void **state) {
  (void)state;
  if (!g_two || sim == NULL) skip();
  for (int r = 0; r < 2; r++) rt[r]->tracker.no_waits = true;
  weft_block_t in[2], out[2];
  run_all_reduce(in, out, 0);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  for (int r = 0; r < 2; r++) rt[r]->tracker.no_waits = false;
  assert_true(races() > 0);
  sim->reset_races();
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_free(in[r], stream(r, 0)), WEFT_OK);
    assert_int_equal(weft_free(out[r], stream(r, 0)), WEFT_OK);
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  }
}

static void test_every_collective_at_offsets(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2], b[2];
  for (int r = 0; r < 2; r++) {
    a[r] = alloc(r, 4 * N * 4);
    b[r] = alloc(r, 4 * N * 4);
    float h[2 * N];
    for (int i = 0; i < 2 * N; i++) h[i] = (float)(i * (r + 1));
    assert_int_equal(weft_copy_to_block(stream(r, 0), a[r], 1024, h, sizeof h), WEFT_OK); /* at an offset */
  }
  float want[2 * N];
  /* Broadcast from rank 1. */
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_broadcast(comm[r], a[r], 1024, b[r], 0, N, WEFT_FLOAT32, 1, NULL), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  for (int i = 0; i < N; i++) want[i] = (float)(2 * i);
  for (int r = 0; r < 2; r++) expect(r, b[r], 0, want, N);
  /* All-gather of N each, then reduce-scatter (sum) of 2N into N each. */
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_all_gather(comm[r], a[r], 1024, b[r], 0, N, WEFT_FLOAT32, NULL), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  for (int i = 0; i < N; i++) want[i] = (float)i, want[N + i] = (float)(2 * i);
  for (int r = 0; r < 2; r++) expect(r, b[r], 0, want, 2 * N);
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(weft_reduce_scatter(comm[r], a[r], 1024, b[r], 8 * N, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) want[i] = (float)(3 * (r * N + i));
    expect(r, b[r], 8 * N, want, N);
  }
  /* Send and receive both ways in one group, on another stream than the communicator's. */
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_send(comm[r], a[r], 1024, N, WEFT_FLOAT32, 1 - r, stream(r, 1)), WEFT_OK);
    assert_int_equal(weft_recv(comm[r], b[r], 0, N, WEFT_FLOAT32, 1 - r, stream(r, 1)), WEFT_OK);
  }
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) want[i] = (float)(i * (2 - r));
    expect(r, b[r], 0, want, N);
  }
  assert_int_equal(races(), 0);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
    assert_int_equal(weft_free(b[r], stream(r, 0)), WEFT_OK);
  }
}

/* A group larger than the group end's stack buffers (16 calls), over two streams of each rank:
 * every block's all-reduce waits for its input on stream 0, the data is right, and a reader on a
 * third stream waits for the all-reduce of its stream, whichever it was. */
static void test_a_large_group_over_two_streams_per_rank(void **state) {
  (void)state;
  if (!g_two) skip();
  enum { BLOCKS = 20, M = 256 };
  weft_block_t b[2][BLOCKS];
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < BLOCKS; k++) {
      b[r][k] = alloc(r, M * 4);
      float h[M];
      for (int i = 0; i < M; i++) h[i] = (float)(k * 1000 + i * (r + 1));
      assert_int_equal(weft_copy_to_block(stream(r, 0), b[r][k], 0, h, sizeof h), WEFT_OK);
    }
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int k = 0; k < BLOCKS; k++)
    for (int r = 0; r < 2; r++)
      assert_int_equal(weft_all_reduce(comm[r], b[r][k], 0, b[r][k], 0, M, WEFT_FLOAT32, WEFT_SUM,
                                       k % 2 ? stream(r, 1) : NULL),
                       WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  float want[M];
  for (int k = 0; k < BLOCKS; k++) {
    for (int i = 0; i < M; i++) want[i] = (float)(2 * k * 1000 + 3 * i);
    for (int r = 0; r < 2; r++) expect(r, b[r][k], 0, want, M);
  }
  assert_int_equal(races(), 0);
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < BLOCKS; k++) assert_int_equal(weft_free(b[r][k], stream(r, 0)), WEFT_OK);
}

/* Collectives on the calling thread's per-thread streams (adopted CU_STREAM_PER_THREAD, one per
 * rank's runtime), in a group over both devices, alone or beside a communicator's own stream: the data is right and
 * a reader on another stream waits for each (no race). NCCL uses a call's stream with the
 * communicator's device current, so each rank's handle names that device's per-thread stream,
 * whichever device the thread had current when it called. */
static void test_collectives_on_per_thread_streams(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_stream_t *pt[2];
  weft_block_t b[2];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_stream_adopt(rt[r], CU_STREAM_PER_THREAD, &pt[r]), WEFT_OK);
    b[r] = alloc(r, N * 4);
    float h[N];
    for (int i = 0; i < N; i++) h[i] = (float)(i + 1000 * r);
    assert_int_equal(weft_copy_to_block(stream(r, 0), b[r], 0, h, sizeof h), WEFT_OK);
  }
  /* Round 0: both ranks on their per-thread streams; round 1: rank 1 first, on its communicator's
   * stream, then rank 0 on its per-thread stream. */
  for (int round = 0; round < 2; round++) {
    assert_int_equal(weft_comm_group_begin(), WEFT_OK);
    for (int k = 0; k < 2; k++) {
      int r = round == 0 ? k : 1 - k;
      weft_stream_t *on = round == 0 || r == 0 ? pt[r] : NULL;
      weft_status_t st = weft_all_reduce(comm[r], b[r], 0, b[r], 0, N, WEFT_FLOAT32, WEFT_SUM, on);
      if (st != WEFT_OK) fail_msg("weft_all_reduce, rank %d: %s: %s", r, weft_status_name(st), weft_last_error());
    }
    weft_status_t st = weft_comm_group_end();
    if (st != WEFT_OK) fail_msg("weft_comm_group_end, round %d: %s: %s", round, weft_status_name(st), weft_last_error());
    float want[N];
    for (int i = 0; i < N; i++) want[i] = (float)((2 * i + 1000) << round);
    for (int r = 0; r < 2; r++) expect(r, b[r], 0, want, N);
  }
  assert_int_equal(races(), 0);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(b[r], stream(r, 0)), WEFT_OK);
}

/* A group's uses are the trace's slices (weft_comm_group_end, one per stream), each naming its
 * blocks and kinds: the communicator's order block READ_WRITE, the send range READ, the receive
 * range WRITE; in place, one READ_WRITE. (The group's end traces the uses it resolved itself.) */
static void test_a_groups_uses_are_traced_with_their_blocks(void **state) {
  (void)state;
  if (!g_two) skip();
  const char *dir = getenv("TEST_TMPDIR");
  char path[512];
  snprintf(path, sizeof path, "%s/group_trace.json", dir ? dir : "/tmp");
  weft_block_t src[2], dst[2], inplace[2];
  static const char *const src_tag[2] = {"src0", "src1"}, *const dst_tag[2] = {"dst0", "dst1"},
                           *const in_tag[2] = {"inplace0", "inplace1"};
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_alloc(rt[r], N * 4, stream(r, 0), src_tag[r], &src[r]), WEFT_OK);
    assert_int_equal(weft_alloc(rt[r], N * 4, stream(r, 0), dst_tag[r], &dst[r]), WEFT_OK);
    assert_int_equal(weft_alloc(rt[r], N * 4, stream(r, 0), in_tag[r], &inplace[r]), WEFT_OK);
    assert_int_equal(weft_memset32(stream(r, 0), src[r], 0, 0, N * 4), WEFT_OK);
    assert_int_equal(weft_memset32(stream(r, 0), inplace[r], 0, 0, N * 4), WEFT_OK);
  }
  assert_int_equal(weft_trace_start(path), WEFT_OK);
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_all_reduce(comm[r], src[r], 0, dst[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
    assert_int_equal(weft_all_reduce(comm[r], inplace[r], 0, inplace[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  }
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  assert_int_equal(weft_trace_stop(), WEFT_OK);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[8192];
  int slices[2] = {0, 0};
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, "\"weft_comm_group_end\"") == NULL) continue;
    char want[4][96];
    int r = strstr(line, "\"src0\"") != NULL ? 0 : 1;
    snprintf(want[0], sizeof want[0], "{\"tag\": \"weft.comm.order\", \"kind\": \"RW\"}");
    snprintf(want[1], sizeof want[1], "{\"tag\": \"%s\", \"kind\": \"R\"}", src_tag[r]);
    snprintf(want[2], sizeof want[2], "{\"tag\": \"%s\", \"kind\": \"W\"}", dst_tag[r]);
    snprintf(want[3], sizeof want[3], "{\"tag\": \"%s\", \"kind\": \"RW\"}", in_tag[r]);
    for (int i = 0; i < 4; i++)
      if (strstr(line, want[i]) == NULL) fail_msg("rank %d's slice lacks %s: %s", r, want[i], line);
    assert_null(strstr(line, src_tag[1 - r])); /* one stream's use per slice */
    slices[r]++;
  }
  fclose(f);
  assert_int_equal(slices[0], 1);
  assert_int_equal(slices[1], 1);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_free(src[r], stream(r, 0)), WEFT_OK);
    assert_int_equal(weft_free(dst[r], stream(r, 0)), WEFT_OK);
    assert_int_equal(weft_free(inplace[r], stream(r, 0)), WEFT_OK);
  }
  assert_int_equal(races(), 0);
}

static void test_bad_calls_and_nccl_failures_change_nothing(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a0 = alloc(0, N * 4), a1 = alloc(1, N * 4);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(rt[0], &c0), WEFT_OK);
  assert_int_equal(weft_all_reduce(comm[0], a1, 0, a0, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_ERR_WRONG_DEVICE);
  assert_int_equal(weft_all_reduce(comm[0], a0, 0, a0, 0, N, WEFT_FLOAT32, WEFT_SUM, stream(1, 0)), WEFT_ERR_WRONG_DEVICE);
  assert_int_equal(weft_all_reduce(comm[0], a0, 4, a0, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "pass its end"));
  assert_int_equal(weft_all_gather(comm[0], a0, 0, a0, 0, N, WEFT_FLOAT32, NULL), WEFT_ERR_INVALID_ARGUMENT); /* 2N out */
  assert_int_equal(weft_broadcast(comm[0], a0, 0, a0, 0, N, WEFT_FLOAT32, 2, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_all_reduce(comm[0], a0, 0, a0, 0, N, (weft_dtype_t)42, WEFT_SUM, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_all_reduce(comm[0], a0, 0, a0, 0, N, WEFT_FLOAT32, (weft_redop_t)9, NULL), WEFT_ERR_INVALID_ARGUMENT);
  /* Counts whose bytes overflow: count x 4 itself, and count x 4 x 2 ranks (an all-gather's receive). */
  assert_int_equal(weft_all_reduce(comm[0], a0, 0, a0, 0, SIZE_MAX / 2, WEFT_FLOAT32, WEFT_SUM, NULL),
                   WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "too large"));
  assert_int_equal(weft_all_gather(comm[0], a0, 0, a0, 0, SIZE_MAX / 8 + 1, WEFT_FLOAT32, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "too large"));
  assert_int_equal(weft_all_reduce(NULL, a0, 0, a0, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_comm_group_end(), WEFT_ERR_INVALID_ARGUMENT);
  /* A refused call in a group fails the group's end, which enqueues nothing. */
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  assert_int_equal(weft_all_reduce(comm[0], a0, 0, a0, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  assert_int_equal(weft_all_reduce(comm[1], a0, 0, a0, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_ERR_WRONG_DEVICE);
  assert_int_equal(weft_comm_group_end(), WEFT_ERR_WRONG_DEVICE);
  assert_int_equal(weft_runtime_counters(rt[0], &c1), WEFT_OK);
  assert_int_equal(c1.uses, c0.uses); /* no use recorded */
  /* NCCL's failure (an injected fault on the simulator) becomes WEFT_ERR_COMM with its message. */
  if (sim != NULL) {
    assert_int_equal((sim->fail)("ncclAllReduce:1:2"), 0);
    assert_int_equal(weft_all_reduce(comm[0], a0, 0, a0, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_ERR_COMM);
    assert_non_null(strstr(weft_last_error(), "NCCL error 2"));
    assert_int_equal((sim->fail)(""), 0);
    assert_int_equal(weft_runtime_counters(rt[0], &c1), WEFT_OK);
    assert_int_equal(c1.uses, c0.uses);
  }
  assert_int_equal(weft_free(a0, stream(0, 0)), WEFT_OK);
  assert_int_equal(weft_free(a1, stream(1, 0)), WEFT_OK);
  assert_int_equal(races(), 0);
}

/* A communicator destroyed by the thread whose open group calls on it: refused (BUSY, nothing
 * changed), since the group is inside it until its end; the group then runs whole, and the
 * destroy after the end succeeds. (Before, the destroy succeeded and the end refused the whole
 * group, STALE_HANDLE: the group stays inside its communicators now, entered once.) */
static void test_a_communicator_destroyed_inside_its_own_threads_group_is_busy(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_comm_t *x[2];
  assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  weft_counters_t c0[2], c1[2];
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_counters(rt[r], &c0[r]), WEFT_OK);
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(weft_all_reduce(x[r], a[r], 0, a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  assert_int_equal(weft_comm_destroy(x[1]), WEFT_ERR_BUSY);
  assert_non_null(strstr(weft_last_error(), "open group"));
  assert_int_equal(weft_comm_rank(x[1]), 1); /* still live */
  /* Nested: the inner end does not end the group, the destroy is still refused. */
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  assert_int_equal(weft_comm_destroy(x[0]), WEFT_ERR_BUSY);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_runtime_counters(rt[r], &c1[r]), WEFT_OK);
    assert_int_equal(c1[r].uses, c0[r].uses + 1); /* the group's use of each rank */
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(x[r]), WEFT_OK);
  /* Communicators are made outside a group: their eager connection is a group of its own (before,
   * it joined the open group, and a failed init's destroy of what it made was refused). */
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  x[0] = x[1] = NULL;
  assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "open weft_comm_group_begin"));
  assert_null(x[0]);
  weft_comm_id_t id;
  assert_int_equal(weft_comm_unique_id(&id), WEFT_OK);
  assert_int_equal(weft_comm_init_rank(rt[0], 1, &id, 0, &x[0]), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  /* A refused group stays inside nothing: its communicators go at once after its end. */
  assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  assert_int_equal(weft_all_reduce(x[0], a[0], 0, a[0], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  assert_int_equal(weft_all_reduce(x[1], a[1], 0, a[1], 0, N, (weft_dtype_t)99, WEFT_SUM, NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_comm_group_end(), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft__handle_entries(), 0); /* (this thread's own destroys do not wait for it) */
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(x[r]), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  assert_int_equal(races(), 0);
}

/* Opens a group (weft_comm_group_begin) and makes an in-place all-reduce of a[r] on x[r] for both
 * ranks in it; the first failure, the group left open either way. */
static weft_status_t open_and_reduce(weft_comm_t *const *x, const weft_block_t *a) {
  weft_status_t st = weft_comm_group_begin();
  for (int r = 0; r < 2 && st == WEFT_OK; r++) st = weft_all_reduce(x[r], a[r], 0, a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL);
  return st;
}

/* A communicator destroyed on another thread while a group that calls on it is open: the destroy
 * waits for the group's end, and the group runs whole (before, the destroy went ahead and the
 * end refused the group). The destroying thread says when it calls; the group's thread then
 * gives it time to get inside before it ends its group; whenever the destroy returns, the group's
 * end must have begun. */
typedef struct open_group {
  weft_comm_t **x;
  weft_block_t *a;
  atomic_int called;  /* the group's calls are made */
  atomic_int destroying; /* the other thread calls weft_comm_destroy */
  atomic_int ending;  /* the group's thread calls weft_comm_group_end */
  weft_status_t st;
} open_group_t;

static void *open_group_body(void *arg) {
  open_group_t *g = arg;
  g->st = open_and_reduce(g->x, g->a);
  atomic_store(&g->called, 1);
  while (!atomic_load(&g->destroying)) sched_yield();
  for (int i = 0; i < 2000; i++) sched_yield(); /* (only the test's power depends on it) */
  atomic_store(&g->ending, 1);
  weft_status_t end = weft_comm_group_end();
  if (g->st == WEFT_OK) g->st = end;
  return NULL;
}

static void test_a_destroy_on_another_thread_waits_for_the_groups_end(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  for (int round = 0; round < 4; round++) {
    weft_comm_t *x[2];
    assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
    open_group_t g = {x, a, 0, 0, 0, WEFT_OK};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, open_group_body, &g), 0);
    while (!atomic_load(&g.called)) sched_yield();
    atomic_store(&g.destroying, 1);
    assert_int_equal(weft_comm_destroy(x[round % 2]), WEFT_OK);
    if (!atomic_load(&g.ending)) fail_msg("round %d: the destroy returned while the group was open", round);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (g.st != WEFT_OK) fail_msg("round %d: the group: %s (%s)", round, weft_status_name(g.st), weft_last_error());
    assert_int_equal(weft_comm_destroy(x[1 - round % 2]), WEFT_OK);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  assert_int_equal(races(), 0);
}

/* A group over more communicators than it stays inside (comm.c's COMM_HELD, 8): the ones past
 * it are entered at their calls and again at the end. The group runs whole and its sums are
 * right, and the end leaves every entry it made (weft__handle_entries: the thread's own destroys
 * would not wait for one left behind). */
static void test_a_group_over_more_communicators_than_it_stays_inside(void **state) {
  (void)state;
  if (!g_two) skip();
  enum { PAIRS = 6 }; /* 12 communicators */
  weft_comm_t *x[PAIRS][2];
  for (int p = 0; p < PAIRS; p++) assert_int_equal(weft_comm_init_all(rt, 2, x[p]), WEFT_OK);
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  float *ones = malloc(N * sizeof *ones), *want = malloc(N * sizeof *want);
  for (size_t i = 0; i < N; i++) ones[i] = 1.0f, want[i] = (float)(1 << PAIRS);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_copy_to_block(stream(r, 0), a[r], 0, ones, N * 4), WEFT_OK);
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int p = 0; p < PAIRS; p++) { /* each pair's all-reduce doubles the sum; in order (the order block) */
    assert_int_equal(weft_comm_group_begin(), WEFT_OK);
    for (int r = 0; r < 2; r++)
      assert_int_equal(weft_all_reduce(x[p][r], a[r], 0, a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
    assert_int_equal(weft_comm_group_end(), WEFT_OK);
  }
  assert_int_equal(weft_comm_destroy(x[PAIRS - 1][1]), WEFT_ERR_BUSY); /* past COMM_HELD: still refused */
  assert_int_equal(weft__handle_entries(), 8);                         /* COMM_HELD of them kept */
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  assert_int_equal(weft__handle_entries(), 0); /* (this thread's own destroys do not wait for it) */
  for (int r = 0; r < 2; r++) expect(r, a[r], 0, want, N);
  for (int p = 0; p < PAIRS; p++)
    for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(x[p][r]), WEFT_OK);
  free(ones);
  free(want);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  assert_int_equal(races(), 0);
}

/* A communicator past the 8 a group stays inside, destroyed by another thread between its call
 * and the group's end, and its address taken at once by a new communicator: the end must see
 * that the call's communicator is gone (STALE_HANDLE, nothing enqueued), not run the call on the
 * new one; and the new one is not the group's (its destroy on the group's thread is no BUSY).
 * Before, the end checked only that the address was a live communicator. */
typedef struct destroyer {
  weft_comm_t **x, **y;
  weft_status_t st[3];
} destroyer_t;

/* Destroys the pair x, then makes the pair y (outside the group's thread, whose open group
 * refuses to make communicators). */
static void *destroy_pair(void *arg) {
  destroyer_t *d = arg;
  for (int r = 0; r < 2; r++) d->st[r] = weft_comm_destroy(d->x[r]);
  d->st[2] = weft_comm_init_all(rt, 2, d->y);
  return NULL;
}

static void test_a_destroyed_communicators_address_reused_inside_a_group_is_not_its_call(void **state) {
  (void)state;
  if (!g_two) skip();
  enum { PAIRS = 5 }; /* 10 communicators: the last pair is past the 8 kept */
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  int reused = 0;
  for (int round = 0; round < 2; round++) {
    weft_comm_t *x[PAIRS][2], *y[2];
    for (int p = 0; p < PAIRS; p++) assert_int_equal(weft_comm_init_all(rt, 2, x[p]), WEFT_OK);
    weft_counters_t c0[2], c1[2];
    assert_int_equal(weft_comm_group_begin(), WEFT_OK);
    for (int p = 0; p < PAIRS; p++)
      for (int r = 0; r < 2; r++)
        assert_int_equal(weft_all_reduce(x[p][r], a[r], 0, a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
    destroyer_t d = {x[PAIRS - 1], y, {WEFT_OK, WEFT_OK, WEFT_OK}};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, destroy_pair, &d), 0); /* (not kept: no wait for the end) */
    assert_int_equal(pthread_join(t, NULL), 0);
    if (d.st[0] != WEFT_OK || d.st[1] != WEFT_OK || d.st[2] != WEFT_OK) {
      (void)weft_comm_group_end();
      fail_msg("round %d: the other thread's destroys and init: %s %s %s", round, weft_status_name(d.st[0]),
               weft_status_name(d.st[1]), weft_status_name(d.st[2]));
    }
    for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_counters(rt[r], &c0[r]), WEFT_OK);
    int same = -1;
    for (int r = 0; r < 2; r++)
      for (int q = 0; q < 2; q++)
        if (y[q] == x[PAIRS - 1][r]) same = q;
    if (same >= 0) reused++;
    /* Round 1: the new communicator at the old address is destroyed on the group's thread first. */
    weft_status_t early = round == 1 && same >= 0 ? weft_comm_destroy(y[same]) : WEFT_OK;
    weft_status_t end = weft_comm_group_end();
    if (early != WEFT_OK)
      fail_msg("round %d: destroying the new communicator at the old one's address inside the group: %s, want OK",
               round, weft_status_name(early));
    if (same >= 0 && end != WEFT_ERR_STALE_HANDLE)
      fail_msg("round %d: the group's end with its call's communicator destroyed and its address reused: %s, want "
               "STALE_HANDLE", round, weft_status_name(end));
    for (int r = 0; r < 2; r++) {
      assert_int_equal(weft_runtime_counters(rt[r], &c1[r]), WEFT_OK);
      if (same >= 0) assert_int_equal(c1[r].uses, c0[r].uses); /* nothing enqueued */
    }
    for (int q = 0; q < 2; q++)
      if (!(round == 1 && q == same)) assert_int_equal(weft_comm_destroy(y[q]), WEFT_OK);
    for (int p = 0; p < PAIRS - 1; p++)
      for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(x[p][r]), WEFT_OK);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  assert_int_equal(races(), 0);
  if (reused < 2) skip(); /* the allocator gave the new communicators other addresses: not tested */
}

/* A communicator destroyed while another thread runs groups on it ("All functions are
 * thread-safe", weft.h): each group is enqueued whole or refused (STALE_HANDLE), the destroy
 * returns once no group is inside the communicator, nothing crashes (asan: no use after free) and
 * the oracle sees no race. */
typedef struct destroy_grouper {
  weft_comm_t **x;
  weft_block_t *a;
  atomic_uint done;   /* groups enqueued */
  weft_status_t last; /* the status that ended the loop */
  char why[256];
} destroy_grouper_t;

static void *destroy_group_loop(void *arg) {
  destroy_grouper_t *g = arg;
  for (;;) {
    weft_status_t st = weft_comm_group_begin();
    for (int r = 0; r < 2; r++) {
      weft_status_t c = weft_all_reduce(g->x[r], g->a[r], 0, g->a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL);
      if (st == WEFT_OK) st = c;
    }
    weft_status_t e = weft_comm_group_end();
    if (st == WEFT_OK) st = e;
    if (st != WEFT_OK) {
      g->last = st;
      snprintf(g->why, sizeof g->why, "%s", weft_last_error());
      return NULL;
    }
    atomic_fetch_add(&g->done, 1);
  }
}

static void test_a_communicator_destroyed_while_a_thread_runs_groups_on_it(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  unsigned fewest = UINT32_MAX;
  for (int round = 0; round < 10; round++) {
    weft_comm_t *x[2];
    assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
    destroy_grouper_t g = {x, a, 0, WEFT_OK, ""};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, destroy_group_loop, &g), 0);
    while (atomic_load(&g.done) < 5 && g.last == WEFT_OK) sched_yield();
    if (atomic_load(&g.done) < fewest) fewest = atomic_load(&g.done);
    assert_int_equal(weft_comm_destroy(x[round % 2]), WEFT_OK);
    pthread_join(t, NULL);
    if (g.last != WEFT_ERR_STALE_HANDLE)
      fail_msg("round %d: the group loop ended with %s (%s), not STALE_HANDLE", round, weft_status_name(g.last), g.why);
    assert_int_equal(weft_comm_destroy(x[1 - round % 2]), WEFT_OK);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  if (fewest < 5) skip(); /* the loop failed before the destroy: reported above */
  assert_int_equal(races(), 0);
}

/* The same race with captures: a thread captures each rank's all-reduce (one group), ends the
 * captures, on every other round instantiates and launches the graphs, and destroys them, while
 * this thread destroys rank 0's communicator over and over. A captured collective holds the
 * communicator from its call until its graph (and exec) go, so each destroy is BUSY until one
 * lands between a round's last graph destroy and its next call, and then the loop's next call is
 * STALE_HANDLE. Never another status, never the simulated NCCL's refusal to destroy a
 * communicator that a graph still names (a hazard, counted as a race): on a GPU that destroy
 * waits for ever (CUDA_SEMANTICS.md "Teardown order"). */
static atomic_int g_phase; /* where the loop is: 1 captures begun, 2 their group ended, 3 the captures
                              ended, 4 the graphs launched, 5 the graphs destroyed */
static void *captured_group_loop(void *arg) {
  destroy_grouper_t *g = arg;
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = WEFT_CAPTURE_RELAXED;
  for (unsigned round = 0;; round++) {
    weft_status_t st = WEFT_OK;
    int begun = 0;
    for (int r = 0; r < 2 && st == WEFT_OK; r++)
      if ((st = weft_capture_begin(stream(r, 2), &o)) == WEFT_OK) begun++;
    atomic_store(&g_phase, 1);
    if (st == WEFT_OK) st = weft_comm_group_begin();
    if (st == WEFT_OK) {
      for (int r = 0; r < 2; r++) {
        weft_status_t c = weft_all_reduce(g->x[r], g->a[r], 0, g->a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, stream(r, 2));
        if (st == WEFT_OK) st = c;
      }
      weft_status_t e = weft_comm_group_end();
      if (st == WEFT_OK) st = e;
    }
    if (st != WEFT_OK) snprintf(g->why, sizeof g->why, "%s", weft_last_error());
    if (st == WEFT_OK) atomic_store(&g_phase, 2);
    weft_graph_t *graph[2] = {NULL, NULL};
    weft_exec_t *ex[2] = {NULL, NULL};
    for (int r = 0; r < begun; r++) {
      weft_status_t e = weft_capture_end(stream(r, 2), &graph[r]);
      if (st == WEFT_OK && e != WEFT_OK) st = e, snprintf(g->why, sizeof g->why, "end: %s", weft_last_error());
    }
    if (st == WEFT_OK) atomic_store(&g_phase, 3);
    for (int r = 0; r < 2 && st == WEFT_OK && round % 2 == 1; r++)
      if ((st = weft_graph_instantiate(graph[r], stream(r, 3), &ex[r])) != WEFT_OK)
        snprintf(g->why, sizeof g->why, "instantiate: %s", weft_last_error());
    for (int r = 0; r < 2 && st == WEFT_OK && round % 2 == 1; r++)
      if ((st = weft_exec_launch(ex[r], stream(r, 3))) != WEFT_OK)
        snprintf(g->why, sizeof g->why, "launch: %s", weft_last_error());
    if (st == WEFT_OK && round % 2 == 1) atomic_store(&g_phase, 4);
    for (int r = 0; r < 2 && st == WEFT_OK && round % 2 == 1; r++)
      if ((st = weft_stream_synchronize(stream(r, 3))) != WEFT_OK)
        snprintf(g->why, sizeof g->why, "synchronize: %s", weft_last_error());
    for (int r = 0; r < 2; r++) {
      weft_status_t e = ex[r] != NULL ? weft_exec_destroy(ex[r]) : WEFT_OK;
      if (e == WEFT_OK && graph[r] != NULL) e = weft_graph_destroy(graph[r]);
      if (st == WEFT_OK && e != WEFT_OK) st = e, snprintf(g->why, sizeof g->why, "destroy: %s", weft_last_error());
    }
    if (st != WEFT_OK) {
      g->last = st;
      return NULL;
    }
    atomic_store(&g_phase, 5);
    atomic_fetch_add(&g->done, 1);
  }
}

static void test_a_communicator_destroyed_while_a_thread_captures_groups_on_it(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  unsigned busy = 0, rounds = 0;
  for (int round = 0; round < 12; round++) {
    weft_comm_t *x[2];
    assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
    destroy_grouper_t g = {x, a, 0, WEFT_OK, ""};
    atomic_store(&g_phase, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, captured_group_loop, &g), 0);
    /* The first destroy lands while the loop holds the communicator: its captures open, its
     * graphs made, or its execs launched, by round. */
    int target = 2 + round % 3;
    while ((atomic_load(&g.done) < 3 || atomic_load(&g_phase) != target) && g.last == WEFT_OK) continue;
    weft_status_t st;
    int victim = round % 2;
    while ((st = weft_comm_destroy(x[victim])) == WEFT_ERR_BUSY) busy++;
    if (st != WEFT_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", weft_last_error());
      pthread_join(t, NULL);
      fail_msg("round %d: weft_comm_destroy: %s (%s), want BUSY or OK", round, weft_status_name(st), why);
    }
    pthread_join(t, NULL);
    rounds += atomic_load(&g.done);
    if (g.last != WEFT_ERR_STALE_HANDLE)
      fail_msg("round %d: the capture loop ended with %s (%s), not STALE_HANDLE", round, weft_status_name(g.last), g.why);
    assert_int_equal(weft_comm_destroy(x[1 - victim]), WEFT_OK);
    if (races() != 0) fail_msg("round %d: %llu races or hazards", round, (unsigned long long)races());
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  assert_int_equal(races(), 0);
  print_message("%u destroys refused (BUSY) over %u captured rounds\n", busy, rounds);
  if (busy == 0) skip(); /* no destroy met a held communicator: the race was not tested */
}

/* The rest of that class: a buffer freed, or the runtime of a call's stream released, between a
 * group's call and its end. The end refuses the group (STALE_HANDLE) and enqueues nothing: no use
 * is recorded on any rank, and the oracle sees no race. */
static void test_a_buffer_freed_inside_a_group_fails_its_end(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)}, gone = alloc(1, N * 4);
  weft_counters_t c0[2], c1[2];
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_counters(rt[r], &c0[r]), WEFT_OK);
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  assert_int_equal(weft_all_reduce(comm[0], a[0], 0, a[0], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  assert_int_equal(weft_all_reduce(comm[1], gone, 0, gone, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  assert_int_equal(weft_free(gone, stream(1, 0)), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_ERR_STALE_HANDLE);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_runtime_counters(rt[r], &c1[r]), WEFT_OK);
    assert_int_equal(c1[r].uses, c0[r].uses);
  }
  /* A group on live buffers afterwards runs, and its result is the sum. */
  float *ones = malloc(N * sizeof *ones), *twos = malloc(N * sizeof *twos);
  for (size_t i = 0; i < N; i++) ones[i] = 1.0f, twos[i] = 2.0f;
  for (int r = 0; r < 2; r++) assert_int_equal(weft_copy_to_block(stream(r, 0), a[r], 0, ones, N * 4), WEFT_OK);
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(weft_all_reduce(comm[r], a[r], 0, a[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  for (int r = 0; r < 2; r++) expect(r, a[r], 0, twos, N);
  free(ones);
  free(twos);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  assert_int_equal(races(), 0);
}

/* A thread's group calls are kept in a buffer of the thread's own: it goes when the thread
 * ends (a program that runs each step's collectives on a new thread must not grow). */
typedef struct grouper {
  weft_block_t a[2];
  weft_status_t st;
} grouper_t;

static void *one_group(void *arg) {
  grouper_t *g = arg;
  g->st = open_and_reduce(comm, g->a);
  weft_status_t end = weft_comm_group_end();
  if (g->st == WEFT_OK) g->st = end;
  return NULL;
}

static void test_a_threads_group_buffer_goes_with_the_thread(void **state) {
  (void)state;
  if (!g_two) skip();
  grouper_t g = {{alloc(0, N * 4), alloc(1, N * 4)}, WEFT_OK};
  one_group(&g); /* whatever grows on a first group grows now, on this thread */
  assert_int_equal(g.st, WEFT_OK);
  weft__meta_stats_t m0, m1;
  weft__meta_stats(&m0);
  for (int i = 0; i < 8; i++) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, one_group, &g), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (g.st != WEFT_OK) fail_msg("thread %d: %s", i, weft_status_name(g.st));
  }
  weft__meta_stats(&m1);
  if (m1.live != m0.live)
    fail_msg("8 threads that each ran one group and ended left %lld metadata allocations behind",
             (long long)(m1.live - m0.live));
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(g.a[r], stream(r, 0)), WEFT_OK);
  assert_int_equal(races(), 0);
}

/* A thread that ends with its group open (a program's bug) leaves nothing that holds its
 * communicators: they are destroyed at once afterwards, and the next thread's groups run. */
static void *unended_group(void *arg) {
  open_group_t *g = arg;
  g->st = open_and_reduce(g->x, g->a);
  return NULL; /* no weft_comm_group_end */
}

static void test_a_thread_ending_with_its_group_open_holds_nothing(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  weft_comm_t *x[2];
  assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
  open_group_t g = {x, a, 0, 0, 0, WEFT_OK};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, unended_group, &g), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(g.st, WEFT_OK);
  /* (A destroy that waited for the ended thread would never return: the test's timeout.) */
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(x[r]), WEFT_OK);
  grouper_t next = {{a[0], a[1]}, WEFT_OK};
  pthread_create(&t, NULL, one_group, &next);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(next.st, WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  assert_int_equal(races(), 0);
}

/* A thread whose group is still open when weft's thread-exit destructors have run (a program's
 * own pthread key, made after weft's, ends the group in its destructor): the group went with the
 * thread's buffer, so its end says there is no group (INVALID_ARGUMENT) and touches nothing.
 * Before, the end read the freed buffer of calls and left entries the thread no longer had. */
static pthread_key_t late_key;
static weft_status_t late_end = WEFT_OK;
static atomic_int late_ran;

static void late_destructor(void *arg) {
  (void)arg;
  late_end = weft_comm_group_end();
  atomic_store(&late_ran, 1);
}

static void *group_ended_late(void *arg) {
  open_group_t *g = arg;
  g->st = open_and_reduce(g->x, g->a);
  (void)pthread_setspecific(late_key, g); /* its destructor runs after weft's (made later) */
  return NULL;
}

static void test_a_group_ended_after_the_threads_weft_state_went_is_no_group(void **state) {
  (void)state;
  if (!g_two) skip();
  weft_block_t a[2] = {alloc(0, N * 4), alloc(1, N * 4)};
  grouper_t warm = {{a[0], a[1]}, WEFT_OK};
  one_group(&warm); /* weft's thread keys exist before late_key */
  assert_int_equal(warm.st, WEFT_OK);
  assert_int_equal(pthread_key_create(&late_key, late_destructor), 0);
  weft_comm_t *x[2];
  assert_int_equal(weft_comm_init_all(rt, 2, x), WEFT_OK);
  weft_counters_t c0[2], c1[2];
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_counters(rt[r], &c0[r]), WEFT_OK);
  open_group_t g = {x, a, 0, 0, 0, WEFT_OK};
  atomic_store(&late_ran, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, group_ended_late, &g), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(pthread_key_delete(late_key), 0);
  assert_int_equal(g.st, WEFT_OK);
  if (!atomic_load(&late_ran)) fail_msg("the thread's late destructor did not run");
  if (late_end != WEFT_ERR_INVALID_ARGUMENT)
    fail_msg("the group's end after the thread's weft state went: %s, want INVALID_ARGUMENT", weft_status_name(late_end));
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_runtime_counters(rt[r], &c1[r]), WEFT_OK);
    assert_int_equal(c1[r].uses, c0[r].uses); /* nothing enqueued */
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(x[r]), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_free(a[r], stream(r, 0)), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  assert_int_equal(races(), 0);
}

typedef struct joiner {
  weft_comm_id_t id;
  int rank;
  weft_comm_t *c;
  weft_status_t st;
} joiner_t;

static void *join(void *arg) {
  joiner_t *j = arg;
  j->st = weft_comm_init_rank(rt[j->rank], 2, &j->id, j->rank, &j->c);
  return NULL;
}

/* One thread per rank, as one process per GPU would: a unique id, then each rank joins. */
static void test_ranks_join_by_unique_id_and_a_destroyed_communicator_is_stale(void **state) {
  (void)state;
  if (!g_two) skip();
  joiner_t j[2];
  assert_int_equal(weft_comm_unique_id(&j[0].id), WEFT_OK);
  j[1].id = j[0].id;
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    j[r].rank = r;
    assert_int_equal(pthread_create(&t[r], NULL, join, &j[r]), 0);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_join(t[r], NULL), 0);
  for (int r = 0; r < 2; r++) {
    if (j[r].st != WEFT_OK) fail_msg("rank %d: %s", r, weft_status_name(j[r].st));
    assert_int_equal(weft_comm_rank(j[r].c), r);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(j[r].c), WEFT_OK);
  assert_int_equal(weft_comm_destroy(j[0].c), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(weft_comm_init_rank(rt[0], 2, NULL, 0, &j[0].c), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_comm_init_rank(rt[0], 2, &j[0].id, 2, &j[0].c), WEFT_ERR_INVALID_ARGUMENT);
}

/* NCCL's own entry point, from the library weft loads (the simulator's with WEFT_NCCL=sim). */
static void *nccl_sym(const char *name) {
  const char *w = getenv("WEFT_NCCL");
  if (w != NULL && strcmp(w, "sim") == 0) return weft_driver_symbol(name);
  void *h = dlopen(w != NULL && *w ? w : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  return h != NULL ? dlsym(h, name) : NULL;
}

/* A communicator the program made: weft tracks its collectives and leaves it to its owner. */
static void test_adopted_communicator_is_tracked_and_left_to_its_owner(void **state) {
  (void)state;
  if (!g_two) skip();
  __typeof__(&ncclCommInitAll) init_all = (__typeof__(&ncclCommInitAll))nccl_sym("ncclCommInitAll");
  __typeof__(&ncclCommCount) count = (__typeof__(&ncclCommCount))nccl_sym("ncclCommCount");
  __typeof__(&ncclCommDestroy) destroy = (__typeof__(&ncclCommDestroy))nccl_sym("ncclCommDestroy");
  assert_non_null(init_all);
  assert_non_null(count);
  assert_non_null(destroy);
  ncclComm_t nc[2];
  assert_int_equal(init_all(nc, 2, (int[]){0, 1}), ncclSuccess);
  weft_comm_t *a[2];
  assert_int_equal(weft_comm_adopt(rt[1], nc[0], &a[0]), WEFT_ERR_WRONG_DEVICE);
  assert_int_equal(weft_comm_adopt(rt[0], NULL, &a[0]), WEFT_ERR_INVALID_ARGUMENT);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_adopt(rt[r], nc[r], &a[r]), WEFT_OK);
  weft_block_t b[2];
  for (int r = 0; r < 2; r++) {
    b[r] = alloc(r, N * 4);
    float h[N];
    for (int i = 0; i < N; i++) h[i] = (float)(r + 1);
    assert_int_equal(weft_copy_to_block(stream(r, 0), b[r], 0, h, sizeof h), WEFT_OK);
  }
  assert_int_equal(weft_comm_group_begin(), WEFT_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_all_reduce(a[r], b[r], 0, b[r], 0, N, WEFT_FLOAT32, WEFT_MAX, NULL), WEFT_OK);
  assert_int_equal(weft_comm_group_end(), WEFT_OK);
  float want[N];
  for (int i = 0; i < N; i++) want[i] = 2.0f;
  for (int r = 0; r < 2; r++) expect(r, b[r], 0, want, N);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_comm_destroy(a[r]), WEFT_OK);
  int n = 0;
  assert_int_equal(count(nc[0], &n), ncclSuccess); /* still the owner's */
  assert_int_equal(n, 2);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_free(b[r], stream(r, 0)), WEFT_OK);
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(destroy(nc[r]), ncclSuccess);
  assert_int_equal(races(), 0);
}

/* A small workload of every communicator call, with the first call of one NCCL function failing
 * (simulator fault injection): each call either succeeds or fails with a status and NCCL's
 * message, and once the workload has cleaned up (retrying destroys, as weft.h allows) no device
 * memory, block or communicator is left and no use of a failed call was recorded. */
static int workload(const char *fault) {
  weft_comm_t *c[2] = {NULL, NULL};
  int failures = 0;
  weft_status_t st = weft_comm_init_all(rt, 2, c);
  if (st != WEFT_OK) {
    assert_true(st == WEFT_ERR_COMM || st == WEFT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(weft_last_error(), "NCCL error"));
    assert_null(c[0]);
    return 1;
  }
  weft_block_t b[2];
  for (int r = 0; r < 2; r++) {
    b[r] = alloc(r, 2 * N * 4);
    assert_int_equal(weft_memset32(stream(r, 0), b[r], 0, 1, 2 * N * 4), WEFT_OK);
  }
  weft_counters_t before[2], after[2];
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_counters(rt[r], &before[r]), WEFT_OK);
  for (int round = 0; round < 3; round++) {
    if ((st = weft_comm_group_begin()) != WEFT_OK) failures++;
    for (int r = 0; r < 2; r++) {
      weft_status_t a = round == 0   ? weft_all_reduce(c[r], b[r], 0, b[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL)
                        : round == 1 ? weft_all_gather(c[r], b[r], 0, b[r], 0, N, WEFT_FLOAT32, NULL)
                                     : weft_send(c[r], b[r], 0, N, WEFT_FLOAT32, 1 - r, NULL);
      if (a != WEFT_OK) failures++;
      if (round == 2 && weft_recv(c[r], b[r], 4 * N, N, WEFT_FLOAT32, 1 - r, NULL) != WEFT_OK) failures++;
    }
    st = weft_comm_group_end();
    if (st != WEFT_OK) {
      failures++;
      assert_true(st == WEFT_ERR_COMM || st == WEFT_ERR_INVALID_ARGUMENT);
      assert_non_null(strstr(weft_last_error(), "NCCL"));
    }
  }
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
    assert_int_equal(weft_runtime_counters(rt[r], &after[r]), WEFT_OK);
    /* A group that failed records its uses with no work (conservative): never more than 3. */
    assert_true(after[r].uses - before[r].uses <= 3);
    assert_int_equal(weft_free(b[r], stream(r, 0)), WEFT_OK);
    if (weft_comm_destroy(c[r]) != WEFT_OK) {
      failures++;
      assert_int_equal(weft_comm_destroy(c[r]), WEFT_OK); /* the retry succeeds: nothing changed */
    }
  }
  (void)fault;
  return failures;
}

static void test_nccl_faults_leave_nothing_behind(void **state) {
  (void)state;
  if (!g_two || sim == NULL) skip(); /* fault injection */
  static const char *const fns[] = {"ncclCommInitAll", "ncclCommCount", "ncclCommUserRank", "ncclAllReduce",
                                    "ncclAllGather", "ncclSend", "ncclRecv", "ncclGroupStart",
                                    "ncclGroupEnd", "ncclCommDestroy"};
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
  weft_sim_stats_t s0, s1;
  sim->stats(&s0);
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s:1:2", fns[i]); /* the first call: ncclSystemError */
    assert_int_equal((sim->fail)(spec), 0);
    int failures = workload(spec);
    assert_int_equal((sim->fail)(""), 0);
    if (failures == 0) fail_msg("%s: the fault fired nowhere", fns[i]);
    for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_trim(rt[r]), WEFT_OK);
    sim->stats(&s1);
    assert_int_equal(s1.races, s0.races);
  }
  /* Nothing left: the runtimes hold what they held before (their caches trimmed). */
  sim->stats(&s1);
  assert_true(s1.bytes_in_use <= s0.bytes_in_use);
  assert_int_equal(workload(NULL), 0); /* and everything works again */
}

/* A group with dependencies on both sides (its input written by a copy on another stream, its
 * output read by a copy on a third), so that it needs event records and stream waits, and each
 * rank's call and the group's end touch driver and NCCL calls. Every call's status is counted:
 * OK, or an error with a message. The blocks are freed at the end (a failed free is retried once:
 * weft.h, nothing changed). `check`: the results must be the sums. Returns the failed calls. */
static const char *g_after = "no fault"; /* the fault cell the clean workload follows, for messages */

static int dependent_workload(bool check) {
  static float src[2][2][N], out[2][N];
  int failures = 0;
  weft_block_t x[2] = {{0}, {0}};
  for (int r = 0; r < 2; r++)
    if (weft_alloc(rt[r], N * 4, stream(r, 1), "dependent", &x[r]) != WEFT_OK) failures++;
  /* A collective needs every rank: with a block missing, none is called (NCCL would wait). */
  for (int round = 0; round < 2 && x[0].rec != NULL && x[1].rec != NULL; round++) {
    for (int r = 0; r < 2; r++) {
      for (size_t i = 0; i < N; i++) src[round][r][i] = (float)(r + 1 + round);
      if (weft_copy_to_block(stream(r, 1), x[r], 0, src[round][r], N * 4) != WEFT_OK) failures++;
    }
    if (weft_comm_group_begin() != WEFT_OK) failures++;
    for (int r = 0; r < 2; r++)
      if (weft_all_reduce(comm[r], x[r], 0, x[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL) != WEFT_OK) failures++;
    if (weft_comm_group_end() != WEFT_OK) {
      failures++;
      assert_true(weft_last_error()[0] != '\0');
    }
    for (int r = 0; r < 2; r++) {
      if (weft_copy_from_block(stream(r, 2), out[r], x[r], 0, N * 4) != WEFT_OK) failures++;
      if (weft_stream_synchronize(stream(r, 2)) != WEFT_OK) failures++;
    }
    if (check && failures != 0) fail_msg("after %s: round %d: %d calls failed: %s", g_after, round, failures, weft_last_error());
    if (check && races() != 0) {
      sim->print_report();
      fail_msg("round %d: races", round);
    }
    for (int r = 0; check && r < 2; r++)
      for (size_t i = 0; i < N; i++)
        if (out[r][i] != (float)(3 + 2 * round))
          fail_msg("after %s: round %d rank %d element %zu: %g, want %d", g_after, round, r, i, (double)out[r][i],
                   3 + 2 * round);
  }
  for (int r = 0; r < 2; r++)
    if (x[r].rec != NULL) TU_AGAIN(&failures, g_after, weft_free(x[r], stream(r, 0)));
  return failures;
}

#define AGAIN(failures, call) TU_AGAIN(failures, g_after, call)

/* The training loop's form: each rank's step captured (RELAXED, one thread captures both ranks),
 * the communicator's stream joined, a memset of the bucket and the group's all-reduce inside,
 * then both graphs instantiated and launched twice. A call that failed either gave up its part
 * cleanly (a capture that did not begin or whose end failed, a group that enqueued nothing) or,
 * where the other rank needs it to go on (a launch whose partner already runs) or it frees
 * something (a destroy, a free), is made again at once, which must succeed. `check`: every call must succeed and the sums be right. */
static int captured_workload(bool check) {
  static float out[2][N];
  int failures = 0;
  weft_stream_t *cs[2] = {stream(0, 1), stream(1, 1)};
  weft_block_t x[2] = {{0}, {0}};
  for (int r = 0; r < 2; r++)
    if (weft_alloc(rt[r], N * 4, cs[r], "captured", &x[r]) != WEFT_OK) failures++;
  if (x[0].rec != NULL && x[1].rec != NULL) {
    weft_capture_options_t o = weft_capture_options_default();
    o.mode = WEFT_CAPTURE_RELAXED;
    int began[2] = {0, 0}, joined = 0;
    for (int r = 0; r < 2; r++) {
      if (weft_capture_begin(cs[r], &o) != WEFT_OK) {
        failures++;
        continue;
      }
      began[r] = 1;
      if (weft_capture_join(cs[r], weft_comm_stream(comm[r])) == WEFT_OK) joined++;
      else failures++;
    }
    if (joined == 2) {
      const unsigned bits[2] = {0x3f800000u, 0x40000000u}; /* 1.0f, 2.0f */
      for (int r = 0; r < 2; r++)
        if (weft_memset32(cs[r], x[r], 0, bits[r], N * 4) != WEFT_OK) failures++;
      if (weft_comm_group_begin() != WEFT_OK) failures++;
      for (int r = 0; r < 2; r++)
        if (weft_all_reduce(comm[r], x[r], 0, x[r], 0, N, WEFT_FLOAT32, WEFT_SUM, NULL) != WEFT_OK) failures++;
      if (weft_comm_group_end() != WEFT_OK) failures++;
    }
    weft_graph_t *g[2] = {NULL, NULL};
    /* A failed end ends the capture all the same, with no graph (as cuStreamEndCapture's
     * failures do on GPUs): that rank's step is lost and neither rank's graph is launched. */
    for (int r = 0; r < 2; r++)
      if (began[r] && weft_capture_end(cs[r], &g[r]) != WEFT_OK) failures++;
    for (int r = 0; r < 2; r++) {
      int capturing = 1;
      assert_int_equal(weft_stream_is_capturing(cs[r], &capturing), WEFT_OK);
      if (capturing) fail_msg("after %s: rank %d's stream still captures", g_after, r);
    }
    weft_exec_t *e[2] = {NULL, NULL};
    for (int r = 0; r < 2 && g[0] != NULL && g[1] != NULL; r++)
      if (weft_graph_instantiate(g[r], cs[r], &e[r]) != WEFT_OK) failures++;
    for (int rep = 0; rep < 2 && e[0] != NULL && e[1] != NULL; rep++) {
      /* Rank 0's graph waits on the GPU for rank 1's: once one launched, the other must. */
      AGAIN(&failures, weft_exec_launch(e[0], cs[0]));
      AGAIN(&failures, weft_exec_launch(e[1], cs[1]));
    }
    for (int r = 0; r < 2; r++) {
      if (weft_copy_from_block(stream(r, 2), out[r], x[r], 0, N * 4) != WEFT_OK) failures++;
      if (weft_stream_synchronize(stream(r, 2)) != WEFT_OK) failures++;
    }
    if (check && failures != 0) fail_msg("after %s: %d calls failed: %s", g_after, failures, weft_last_error());
    for (int r = 0; check && r < 2; r++)
      for (size_t i = 0; i < N; i++)
        if (out[r][i] != 3.0f) fail_msg("after %s: rank %d element %zu: %g, want 3", g_after, r, i, (double)out[r][i]);
    for (int r = 0; r < 2; r++) {
      if (e[r] != NULL) AGAIN(&failures, weft_exec_destroy(e[r]));
      if (g[r] != NULL) AGAIN(&failures, weft_graph_destroy(g[r]));
    }
  }
  for (int r = 0; r < 2; r++)
    if (x[r].rec != NULL) AGAIN(&failures, weft_free(x[r], cs[r]));
  return failures;
}

/* ---- a thread per rank under faults ---- */

typedef struct rank_worker {
  int r;
  weft_block_t x;
  int failed;     /* calls that failed once */
  char why[384];  /* a call that failed twice, or wrong data */
} rank_worker_t;

/* A call made again once if it failed (a fault fails one call): the second must succeed. */
static bool once_more(rank_worker_t *w, weft_status_t first, weft_status_t (*again)(rank_worker_t *, void *), void *arg,
                      const char *what) {
  if (first == WEFT_OK) return true;
  w->failed++;
  weft_status_t st = again(w, arg);
  if (st == WEFT_OK) return true;
  if (w->why[0] == '\0') snprintf(w->why, sizeof w->why, "rank %d: %s made again: %s", w->r, what, weft_last_error());
  return false;
}

typedef struct rank_args {
  const float *src;
  float *out;
} rank_args_t;

static weft_status_t put_x(rank_worker_t *w, void *a) {
  return weft_copy_to_block(stream(w->r, 1), w->x, 0, ((rank_args_t *)a)->src, N * 4);
}
static weft_status_t reduce_x(rank_worker_t *w, void *a) {
  (void)a;
  return weft_all_reduce(comm[w->r], w->x, 0, w->x, 0, N, WEFT_FLOAT32, WEFT_SUM, NULL);
}
static weft_status_t get_x(rank_worker_t *w, void *a) {
  return weft_copy_from_block(stream(w->r, 2), ((rank_args_t *)a)->out, w->x, 0, N * 4);
}
static weft_status_t sync_out(rank_worker_t *w, void *a) {
  (void)a;
  return weft_stream_synchronize(stream(w->r, 2));
}

/* One rank on its own thread, as a process per GPU runs it: its input written on one stream, its
 * all-reduce (one call, no group) on the communicator's stream, its output read on a third, three
 * rounds. Every call that fails is made again at once, so even under a fault the sums must be
 * right: a failed call enqueued nothing and changed nothing. */
static void *rank_loop(void *arg) {
  rank_worker_t *w = arg;
  static float src[2][3][N], out[2][N];
  for (int round = 0; round < 3 && w->why[0] == '\0'; round++) {
    for (size_t i = 0; i < N; i++) src[w->r][round][i] = (float)(w->r + 1 + 10 * round);
    rank_args_t a = {src[w->r][round], out[w->r]};
    if (!once_more(w, put_x(w, &a), put_x, &a, "weft_copy_to_block") ||
        !once_more(w, reduce_x(w, &a), reduce_x, &a, "weft_all_reduce") ||
        !once_more(w, get_x(w, &a), get_x, &a, "weft_copy_from_block") ||
        !once_more(w, sync_out(w, &a), sync_out, &a, "weft_stream_synchronize"))
      break;
    for (size_t i = 0; i < N; i++)
      if (out[w->r][i] != (float)(3 + 20 * round)) {
        snprintf(w->why, sizeof w->why, "rank %d round %d element %zu: %g, want %d", w->r, round, i,
                 (double)out[w->r][i], 3 + 20 * round);
        break;
      }
  }
  return NULL;
}

/* Both ranks' loops on two threads; returns the calls that failed once (the test fails on a
 * call that failed twice or on wrong data). */
static int ranks_on_threads(bool check) {
  rank_worker_t w[2];
  pthread_t th[2];
  for (int r = 0; r < 2; r++) {
    w[r] = (rank_worker_t){.r = r};
    TU_AGAIN(&w[r].failed, g_after, weft_alloc(rt[r], N * 4, stream(r, 1), "rank", &w[r].x));
  }
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_loop, &w[r]), 0);
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
  for (int r = 0; r < 2; r++)
    if (w[r].why[0] != '\0') fail_msg("after %s: %s", g_after, w[r].why);
  for (int r = 0; r < 2; r++) TU_AGAIN(&w[r].failed, g_after, weft_free(w[r].x, stream(r, 1)));
  int failed = w[0].failed + w[1].failed;
  if (check && failed != 0) fail_msg("after %s: %d calls failed without a fault", g_after, failed);
  return failed;
}

/* Faults at every call: each function of `fns` (driver or NCCL) fails at its Nth call in
 * `workload`, for N = 1, 2, ... until the Nth call is not reached. After each: no race (a failure
 * never leaves work unordered), no device memory left once the caches are trimmed, and the same
 * workload without faults gives the right sums (nothing half-done stays behind). */
static void sweep(const char *const *fns, size_t nf, int (*workload)(bool check)) {
  for (int r = 0; r < 2; r++) {
    assert_int_equal(weft_runtime_synchronize(rt[r]), WEFT_OK);
    assert_int_equal(weft_runtime_trim(rt[r]), WEFT_OK);
  }
  assert_int_equal(workload(true), 0);
  for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_trim(rt[r]), WEFT_OK);
  weft_sim_stats_t s0, s1;
  sim->stats(&s0);
  unsigned cells = 0;
  for (size_t f = 0; f < nf; f++) {
    unsigned fired = 0;
    for (unsigned n = 1; n <= 16; n++) {
      char spec[80];
      snprintf(spec, sizeof spec, "%s:%u:%s", fns[f], n, strncmp(fns[f], "nccl", 4) == 0 ? "2" : "999");
      sim->stats(&s1);
      uint64_t before = s1.faults_injected;
      assert_int_equal((sim->fail)(spec), 0);
      g_after = spec;
      (void)workload(false);
      assert_int_equal((sim->fail)(""), 0);
      sim->stats(&s1);
      if (s1.faults_injected == before) break; /* the Nth call was not reached */
      fired++;
      cells++;
      for (int r = 0; r < 2; r++) {
        weft_status_t st = weft_runtime_synchronize(rt[r]);
        if (st != WEFT_OK) fail_msg("%s: weft_runtime_synchronize after the fault: %s", spec, weft_last_error());
      }
      if (s1.races != s0.races) {
        sim->print_report();
        fail_msg("%s: %llu races", spec, (unsigned long long)(s1.races - s0.races));
      }
      int clean = workload(true);
      if (clean != 0) fail_msg("%s: the workload without faults failed %d calls: %s", spec, clean, weft_last_error());
      for (int r = 0; r < 2; r++) assert_int_equal(weft_runtime_trim(rt[r]), WEFT_OK);
      sim->stats(&s1);
      if (s1.bytes_in_use > s0.bytes_in_use)
        fail_msg("%s: %llu device bytes left", spec, (unsigned long long)(s1.bytes_in_use - s0.bytes_in_use));
    }
    g_after = "no fault";
    if (fired == 0) fail_msg("%s: the fault fired nowhere", fns[f]);
  }
  print_message("fault cells: %u\n", cells);
}

static void test_faults_at_every_call_of_a_dependent_group(void **state) {
  (void)state;
  if (!g_two || sim == NULL) skip(); /* fault injection */
  static const char *const fns[] = {"cuEventRecord", "cuStreamWaitEvent", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
                                    "cuCtxSetCurrent", "cuCtxGetCurrent", "cuStreamSynchronize", "ncclGroupStart",
                                    "ncclGroupEnd", "ncclAllReduce"};
  sweep(fns, sizeof fns / sizeof fns[0], dependent_workload);
}

static void test_faults_at_every_call_of_ranks_on_threads(void **state) {
  (void)state;
  if (!g_two || sim == NULL) skip(); /* fault injection */
  static const char *const fns[] = {"cuEventRecord", "cuStreamWaitEvent", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
                                    "cuCtxSetCurrent", "cuCtxGetCurrent", "cuStreamSynchronize", "ncclAllReduce"};
  sweep(fns, sizeof fns / sizeof fns[0], ranks_on_threads);
}

static void test_faults_at_every_call_of_captured_steps(void **state) {
  (void)state;
  if (!g_two || sim == NULL) skip(); /* fault injection */
  static const char *const fns[] = {"cuStreamBeginCapture", "cuStreamEndCapture", "cuStreamGetCaptureInfo",
                                    "cuStreamIsCapturing", "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecDestroy",
                                    "cuGraphDestroy", "cuEventRecord", "cuStreamWaitEvent", "cuMemsetD32Async",
                                    "ncclGroupEnd", "ncclAllReduce"};
  sweep(fns, sizeof fns / sizeof fns[0], captured_workload);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_communicators_know_their_rank_runtime_and_stream),
      cmocka_unit_test(test_all_reduce_waits_for_its_input_and_its_readers_wait_for_it),
      cmocka_unit_test(test_a_communicators_operations_run_in_posting_order_on_each_rank),
      cmocka_unit_test(test_a_communicator_held_by_a_weft_graph_is_busy),
      cmocka_unit_test(test_without_waits_the_oracle_sees_the_races),
      cmocka_unit_test(test_every_collective_at_offsets),
      cmocka_unit_test(test_a_large_group_over_two_streams_per_rank),
      cmocka_unit_test(test_a_groups_uses_are_traced_with_their_blocks),
      cmocka_unit_test(test_collectives_on_per_thread_streams),
      cmocka_unit_test(test_bad_calls_and_nccl_failures_change_nothing),
      cmocka_unit_test(test_a_communicator_destroyed_inside_its_own_threads_group_is_busy),
      cmocka_unit_test(test_a_destroy_on_another_thread_waits_for_the_groups_end),
      cmocka_unit_test(test_a_thread_ending_with_its_group_open_holds_nothing),
      cmocka_unit_test(test_a_group_ended_after_the_threads_weft_state_went_is_no_group),
      cmocka_unit_test(test_a_group_over_more_communicators_than_it_stays_inside),
      cmocka_unit_test(test_a_communicator_destroyed_while_a_thread_runs_groups_on_it),
      cmocka_unit_test(test_a_communicator_destroyed_while_a_thread_captures_groups_on_it),
      cmocka_unit_test(test_a_destroyed_communicators_address_reused_inside_a_group_is_not_its_call),
      cmocka_unit_test(test_a_buffer_freed_inside_a_group_fails_its_end),
      cmocka_unit_test(test_a_threads_group_buffer_goes_with_the_thread),
      cmocka_unit_test(test_ranks_join_by_unique_id_and_a_destroyed_communicator_is_stale),
      cmocka_unit_test(test_adopted_communicator_is_tracked_and_left_to_its_owner),
      cmocka_unit_test(test_nccl_faults_leave_nothing_behind),
      cmocka_unit_test(test_faults_at_every_call_of_a_dependent_group), /* also: the faults above left nothing */
      cmocka_unit_test(test_faults_at_every_call_of_captured_steps),
      cmocka_unit_test(test_faults_at_every_call_of_ranks_on_threads),
      cmocka_unit_test(test_a_communicator_goes_after_an_ended_threads_per_thread_capture),
      cmocka_unit_test(test_communicators_and_runtimes_go),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
