/* NCCL conformance (issue 14): the same program against the simulated NCCL (WEFT_DRIVER=sim and
 * WEFT_SIM_DEVICES=2, as //tests/conformance:conformance_nccl runs it) and against real NCCL on
 * a machine with two GPUs (libnccl.so.2, or WEFT_NCCL=path), so the simulator's NCCL answers as
 * NCCL does. CUDA goes through weft's driver table; NCCL is found with dlsym, as weft will load
 * it. Prints "conformance-nccl: <what> ok" per case, and "probe ..." lines for answers it does
 * not assert. Skips with fewer than two devices. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <nccl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"
#include "tests/util/child.h"

#define N 4096
#define OK(expr) assert_int_equal((int)(expr), (int)CUDA_SUCCESS)
#define NOK(expr) assert_int_equal((int)(expr), (int)ncclSuccess)

static const weft__driver_t *d;
static void *g_nccl; /* NULL: the simulator's */
static CUcontext ctx[2];
static CUstream st[2];
static CUdeviceptr buf[2], out[2];
static ncclComm_t comm[2];
static int g_two;

/* An NCCL entry point, from the simulator or the NCCL library. */
static void *sym(const char *name) {
  void *p = g_nccl ? dlsym(g_nccl, name) : weft_driver_symbol(name);
  if (p == NULL) fail_msg("no %s in NCCL", name);
  return p;
}
#define NCCL(fn) ((__typeof__(&fn))sym(#fn))

/* The driver and NCCL (the simulator's, or libnccl.so.2 / WEFT_NCCL on a GPU); g_two says
 * whether there are two devices. */
static int load(void) {
  if (weft__driver_get(&d) != WEFT_OK) return -1;
  int n = 0;
  if (d->cuDeviceGetCount(&n) != CUDA_SUCCESS) return -1;
  if (n < 2) return 0; /* every case skips */
  g_two = 1;
  if (weft_sim_api(weft_driver_symbol) == NULL) {
    setenv("NCCL_SOCKET_IFNAME", "lo", 0); /* the GPU machines' bootstrap needs it */
    const char *path = getenv("WEFT_NCCL");
    g_nccl = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (g_nccl == NULL) {
      fprintf(stderr, "conformance-nccl: %s\n", dlerror());
      return -1;
    }
  }
  return 0;
}

static int setup(void **state) {
  (void)state;
  if (load() != 0) return -1;
  if (!g_two) return 0;
  for (int dev = 0; dev < 2; dev++) {
    if (d->cuDevicePrimaryCtxRetain(&ctx[dev], dev) != CUDA_SUCCESS || d->cuCtxSetCurrent(ctx[dev]) != CUDA_SUCCESS ||
        d->cuStreamCreateWithPriority(&st[dev], CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
        d->cuMemAlloc(&buf[dev], 2 * N * 4) != CUDA_SUCCESS || d->cuMemAlloc(&out[dev], 2 * N * 4) != CUDA_SUCCESS)
      return -1;
  }
  int v = 0;
  ((__typeof__(&ncclGetVersion))(g_nccl ? dlsym(g_nccl, "ncclGetVersion") : weft_driver_symbol("ncclGetVersion")))(&v);
  printf("conformance-nccl: %s, NCCL %d\n", g_nccl ? "real NCCL" : "simulated NCCL", v);
  d->cuCtxSetCurrent(ctx[0]);
  ncclResult_t r =
      ((__typeof__(&ncclCommInitAll))(g_nccl ? dlsym(g_nccl, "ncclCommInitAll") : weft_driver_symbol("ncclCommInitAll")))(
          comm, 2, (int[]){0, 1});
  return r == ncclSuccess ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  if (!g_two) return 0;
  for (int r = 0; r < 2; r++) NCCL(ncclCommDestroy)(comm[r]);
  for (int dev = 0; dev < 2; dev++) {
    d->cuCtxSetCurrent(ctx[dev]);
    d->cuMemFree(buf[dev]);
    d->cuMemFree(out[dev]);
    d->cuStreamDestroy(st[dev]);
    d->cuDevicePrimaryCtxRelease(dev);
  }
  return 0;
}

static void on(int dev) { OK(d->cuCtxSetCurrent(ctx[dev])); }
static void put(int dev, CUdeviceptr p, const void *h, size_t bytes) {
  on(dev);
  OK(d->cuMemcpyHtoD(p, h, bytes));
}
static void get(int dev, CUdeviceptr p, void *h, size_t bytes) {
  on(dev);
  OK(d->cuStreamSynchronize(st[dev]));
  OK(d->cuMemcpyDtoH(h, p, bytes));
}

/* ---- a new communicator's first collectives under capture ---------------------------------------
 * NCCL makes a communicator's connections lazily: its collectives' (all-reduce, all-gather,
 * broadcast, reduce-scatter share them) at its first collective, its point-to-point ones at its
 * first send or receive, with CUDA calls a GLOBAL capture does not permit: ncclGroupEnd says
 * ncclInternalError and both captures end INVALIDATED; the connections are made all the same.
 * RELAXED and THREAD_LOCAL captures connect fine. Measured with NCCL 2.28.3 on 2 x H100 (this
 * case, run first in the process); the simulator's NCCL answers the same (sim/nccl.c, connect). */
static const char *capture_status(int r) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult q = d->cuStreamIsCapturing(st[r], &cs);
  return q != CUDA_SUCCESS ? "query failed" : cs == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active"
                                              : cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? "invalidated" : "none";
}

/* One group of kind k (0 all-reduce, 1 all-gather, 2 send/recv, 3 broadcast, 4 reduce-scatter) on
 * comms c, each rank's stream capturing in `mode` (-1: eager); prints the group's and the captures'
 * answers and checks them: the group ends with `want` and, captured, both captures end
 * INVALIDATED after a failure, else valid. */
static void probe_group(const char *what, ncclComm_t *c, int k, int mode, ncclResult_t want) {
  char line[400];
  for (int r = 0; r < 2 && mode >= 0; r++) {
    on(r);
    OK(d->cuStreamBeginCapture(st[r], (CUstreamCaptureMode)mode));
  }
  ncclResult_t calls = ncclSuccess, end;
  NCCL(ncclGroupStart)();
  for (int r = 0; r < 2; r++) {
    ncclResult_t x = ncclSuccess;
    if (k == 0) x = NCCL(ncclAllReduce)((void *)buf[r], (void *)buf[r], N, ncclFloat, ncclSum, c[r], (cudaStream_t)st[r]);
    if (k == 1) x = NCCL(ncclAllGather)((void *)buf[r], (void *)out[r], N / 2, ncclInt32, c[r], (cudaStream_t)st[r]);
    if (k == 2) {
      x = NCCL(ncclSend)((void *)buf[r], N, ncclInt32, 1 - r, c[r], (cudaStream_t)st[r]);
      if (x == ncclSuccess) x = NCCL(ncclRecv)((void *)out[r], N, ncclInt32, 1 - r, c[r], (cudaStream_t)st[r]);
    }
    if (k == 3) x = NCCL(ncclBroadcast)((void *)buf[r], (void *)out[r], N, ncclInt32, 0, c[r], (cudaStream_t)st[r]);
    if (k == 4) x = NCCL(ncclReduceScatter)((void *)buf[r], (void *)out[r], N / 2, ncclFloat, ncclSum, c[r], (cudaStream_t)st[r]);
    if (calls == ncclSuccess) calls = x;
  }
  end = NCCL(ncclGroupEnd)();
  snprintf(line, sizeof line, "%s: calls %d, group end %d (%s); capture rank 0 %s", what, (int)calls, (int)end,
           NCCL(ncclGetErrorString)(end), mode >= 0 ? capture_status(0) : "-");
  CUresult ends[2] = {CUDA_SUCCESS, CUDA_SUCCESS};
  for (int r = 0; r < 2 && mode >= 0; r++) {
    on(r);
    CUgraph g = NULL;
    ends[r] = d->cuStreamEndCapture(st[r], &g);
    if (g != NULL) d->cuGraphDestroy(g);
    snprintf(line + strlen(line), sizeof line - strlen(line), ", end %d", (int)ends[r]);
  }
  for (int r = 0; r < 2; r++) {
    on(r);
    d->cuStreamSynchronize(st[r]);
  }
  printf("probe %s\n", line);
  assert_int_equal(calls, ncclSuccess);
  assert_int_equal(end, want);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ends[r], want == ncclSuccess ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void test_first_collectives_under_capture(void **state) {
  (void)state;
  if (!g_two) skip();
  const int G = CU_STREAM_CAPTURE_MODE_GLOBAL, R = CU_STREAM_CAPTURE_MODE_RELAXED, T = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  const ncclResult_t ok = ncclSuccess, bad = ncclInternalError;
  static const char *kinds[] = {"all-reduce", "all-gather", "send/recv", "broadcast", "reduce-scatter"};
  const struct {
    int same;        /* 1: the communicators of the case before */
    int eager_first; /* kind run eagerly first on them (-1: none) */
    int kind, mode;
    ncclResult_t want;
  } p[] = {
      {0, -1, 0, G, bad}, /* a new pair's first collective, GLOBAL: refused, captures invalidated */
      {1, -1, 0, G, ok},  /* ... but connected: the next one is captured */
      {0, -1, 0, R, ok},  {0, -1, 0, T, ok}, {0, -1, 0, G, bad}, {0, -1, 2, R, ok}, {0, -1, 2, T, ok},
      {0, -1, 1, G, bad}, /* every collective kind connects the same */
      {0, 0, 1, G, ok},   {0, 0, 2, G, bad}, /* point-to-point connects apart */
      {0, 0, 3, G, ok},   {0, 0, 4, G, ok},  {0, 2, 0, G, bad},
  };
  ncclComm_t prev[2] = {NULL, NULL};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
    ncclComm_t c[2];
    if (p[i].same) {
      c[0] = prev[0];
      c[1] = prev[1];
    } else {
      on(0);
      NOK(NCCL(ncclCommInitAll)(c, 2, (int[]){0, 1}));
      if (prev[0] != NULL)
        for (int r = 0; r < 2; r++) NCCL(ncclCommAbort)(prev[r]);
    }
    char what[160];
    if (p[i].eager_first >= 0) {
      snprintf(what, sizeof what, "  eager %s first", kinds[p[i].eager_first]);
      probe_group(what, c, p[i].eager_first, -1, ok);
    }
    snprintf(what, sizeof what, "%s communicators%s: %s under a %s capture", p[i].same ? "the same" : "new",
             p[i].eager_first >= 0 ? " after it" : "", kinds[p[i].kind],
             p[i].mode == G ? "GLOBAL" : p[i].mode == R ? "RELAXED" : "THREAD_LOCAL");
    probe_group(what, c, p[i].kind, p[i].mode, p[i].want);
    prev[0] = c[0];
    prev[1] = c[1];
  }
  for (int r = 0; r < 2; r++) NCCL(ncclCommAbort)(prev[r]);
  printf("conformance-nccl: a communicator's first collective and first send/receive under a GLOBAL capture fail "
         "(ncclInternalError, captures invalidated) and connect it; RELAXED and THREAD_LOCAL connect fine ok\n");
}

static void test_communicators(void **state) {
  (void)state;
  if (!g_two) skip();
  for (int r = 0; r < 2; r++) {
    int n, dev, rank;
    NOK(NCCL(ncclCommCount)(comm[r], &n));
    NOK(NCCL(ncclCommCuDevice)(comm[r], &dev));
    NOK(NCCL(ncclCommUserRank)(comm[r], &rank));
    assert_int_equal(n, 2);
    assert_int_equal(dev, r);
    assert_int_equal(rank, r);
    ncclResult_t a = ncclInternalError;
    NOK(NCCL(ncclCommGetAsyncError)(comm[r], &a));
    assert_int_equal(a, ncclSuccess);
  }
  printf("conformance-nccl: ncclCommInitAll: rank i on device i, no async error ok\n");
}

/* Both ranks' in-place all-reduce (sum) of buf, in one group from this thread (under capture when
 * the streams capture). */
static void all_reduce_in_place(void) {
  NOK(NCCL(ncclGroupStart)());
  for (int r = 0; r < 2; r++) {
    on(r);
    NOK(NCCL(ncclAllReduce)((void *)buf[r], (void *)buf[r], N, ncclFloat32, ncclSum, comm[r], (cudaStream_t)st[r]));
  }
  NOK(NCCL(ncclGroupEnd)());
}

/* Rank-dependent inputs into buf (h keeps them), and the check of their sum. */
static void put_inputs(float h[2][N]) {
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) h[r][i] = (float)(i + 1000 * r);
    put(r, buf[r], h[r], N * 4);
  }
}

static void expect_sums(void) {
  static float got[N];
  for (int r = 0; r < 2; r++) {
    get(r, buf[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_true(got[i] == (float)(2 * i + 1000));
  }
}

static void test_all_reduce_in_place(void **state) {
  (void)state;
  if (!g_two) skip();
  static float h[2][N];
  put_inputs(h);
  all_reduce_in_place();
  expect_sums();
  printf("conformance-nccl: all-reduce in place, one thread, one group ok\n");
}

/* A call's stream given as cudaStreamPerThread (CU_STREAM_PER_THREAD), device 0 current for both
 * ranks' calls: NCCL uses the stream with the communicator's device current, so each rank's work
 * runs on its own device's per-thread stream and the sums come out (the simulator's post resolves
 * a default handle against the communicator's device). */
static void test_all_reduce_on_per_thread_streams(void **state) {
  (void)state;
  if (!g_two) skip();
  static float h[2][N];
  put_inputs(h);
  on(0);
  NOK(NCCL(ncclGroupStart)());
  for (int r = 0; r < 2; r++)
    NOK(NCCL(ncclAllReduce)((void *)buf[r], (void *)buf[r], N, ncclFloat32, ncclSum, comm[r], cudaStreamPerThread));
  NOK(NCCL(ncclGroupEnd)());
  for (int r = 0; r < 2; r++) {
    on(r);
    OK(d->cuStreamSynchronize(CU_STREAM_PER_THREAD));
  }
  expect_sums();
  printf("conformance-nccl: nccl per-thread stream, device 0 current for both ranks ok\n");
}

static void test_collectives(void **state) {
  (void)state;
  if (!g_two) skip();
  static int32_t h[2][2 * N], got[2 * N];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 2 * N; i++) h[r][i] = i * (r + 1);
    put(r, buf[r], h[r], sizeof h[r]);
  }
  NOK(NCCL(ncclGroupStart)());
  for (int r = 0; r < 2; r++)
    NOK(NCCL(ncclBroadcast)((void *)buf[r], (void *)out[r], N, ncclInt32, 1, comm[r], (cudaStream_t)st[r]));
  NOK(NCCL(ncclGroupEnd)());
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_int_equal(got[i], 2 * i);
  }
  NOK(NCCL(ncclGroupStart)());
  for (int r = 0; r < 2; r++)
    NOK(NCCL(ncclReduce)((void *)buf[r], (void *)out[r], N, ncclInt32, ncclMax, 0, comm[r], (cudaStream_t)st[r]));
  NOK(NCCL(ncclGroupEnd)());
  get(0, out[0], got, N * 4);
  for (int i = 0; i < N; i++) assert_int_equal(got[i], 2 * i);
  NOK(NCCL(ncclGroupStart)());
  for (int r = 0; r < 2; r++)
    NOK(NCCL(ncclAllGather)((void *)buf[r], (void *)out[r], N, ncclInt32, comm[r], (cudaStream_t)st[r]));
  NOK(NCCL(ncclGroupEnd)());
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, 2 * N * 4);
    for (int i = 0; i < N; i++) {
      assert_int_equal(got[i], i);
      assert_int_equal(got[N + i], 2 * i);
    }
  }
  NOK(NCCL(ncclGroupStart)());
  for (int r = 0; r < 2; r++)
    NOK(NCCL(ncclReduceScatter)((void *)buf[r], (void *)out[r], N, ncclInt32, ncclSum, comm[r], (cudaStream_t)st[r]));
  NOK(NCCL(ncclGroupEnd)());
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_int_equal(got[i], 3 * (r * N + i));
  }
  printf("conformance-nccl: broadcast, reduce (max), all-gather, reduce-scatter (sum) give the right data ok\n");
}

static void test_send_receive(void **state) {
  (void)state;
  if (!g_two) skip();
  static int32_t h[2][N], got[N];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) h[r][i] = 7 * i + r;
    put(r, buf[r], h[r], N * 4);
  }
  NOK(NCCL(ncclGroupStart)());
  NOK(NCCL(ncclSend)((void *)buf[0], N, ncclInt32, 1, comm[0], (cudaStream_t)st[0]));
  NOK(NCCL(ncclRecv)((void *)out[0], N, ncclInt32, 1, comm[0], (cudaStream_t)st[0]));
  NOK(NCCL(ncclRecv)((void *)out[1], N, ncclInt32, 0, comm[1], (cudaStream_t)st[1]));
  NOK(NCCL(ncclSend)((void *)buf[1], N, ncclInt32, 0, comm[1], (cudaStream_t)st[1]));
  NOK(NCCL(ncclGroupEnd)());
  for (int r = 0; r < 2; r++) {
    get(r, out[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_int_equal(got[i], 7 * i + (1 - r));
  }
  printf("conformance-nccl: send and receive in one group, posted in either order ok\n");
}

static void test_captured_all_reduce(void **state) {
  (void)state;
  if (!g_two) skip();
  CUgraph g[2];
  CUgraphExec x[2];
  for (int r = 0; r < 2; r++) {
    on(r);
    OK(d->cuStreamBeginCapture(st[r], CU_STREAM_CAPTURE_MODE_RELAXED));
  }
  all_reduce_in_place();
  for (int r = 0; r < 2; r++) {
    on(r);
    OK(d->cuStreamEndCapture(st[r], &g[r]));
    OK(d->cuGraphInstantiateWithFlags(&x[r], g[r], 0));
  }
  static float h[2][N], got[N];
  for (int launch = 0; launch < 3; launch++) {
    for (int r = 0; r < 2; r++) {
      for (int i = 0; i < N; i++) h[r][i] = (float)(i * (launch + 1) + r);
      put(r, buf[r], h[r], N * 4);
    }
    for (int r = 0; r < 2; r++) {
      on(r);
      OK(d->cuGraphLaunch(x[r], st[r]));
    }
    for (int r = 0; r < 2; r++) {
      get(r, buf[r], got, N * 4);
      for (int i = 0; i < N; i++) assert_true(got[i] == h[0][i] + h[1][i]);
    }
  }
  for (int r = 0; r < 2; r++) {
    on(r);
    OK(d->cuGraphExecDestroy(x[r]));
    OK(d->cuGraphDestroy(g[r]));
  }
  printf("conformance-nccl: an all-reduce captured on each rank's stream (RELAXED, one thread, one group) "
         "replays with new inputs ok\n");
}

/* ncclCommDestroy while the rank's all-reduce is still queued: NCCL finalizes the communicator
 * first (it flushes the rank's issued operations), so the destroy waits for the all-reduce and
 * returns ncclSuccess, and the sum is right. The all-reduce of rank 0 sits behind a stream wait
 * on a flag in device memory that the main thread sets only once a second thread is about to
 * destroy the communicators, so it cannot have run when the destroy begins. */
typedef struct destroyer {
  ncclComm_t cm[2];
  ncclResult_t r[2];
  atomic_int calling;
} destroyer_t;

static void *destroy_both(void *arg) {
  destroyer_t *x = arg;
  atomic_store(&x->calling, 1);
  for (int r = 0; r < 2; r++) x->r[r] = NCCL(ncclCommDestroy)(x->cm[r]);
  return NULL;
}

static void test_destroy_waits_for_queued_operations(void **state) {
  (void)state;
  if (!g_two) skip();
  destroyer_t x = {.r = {ncclInternalError, ncclInternalError}};
  on(0);
  NOK(NCCL(ncclCommInitAll)(x.cm, 2, (int[]){0, 1}));
  static float h[2][N], got[N];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) h[r][i] = (float)(3 * i + 7 * r);
    put(r, buf[r], h[r], N * 4);
  }
  on(0);
  CUdeviceptr flag;
  CUstream side;
  OK(d->cuMemAlloc(&flag, 4));
  OK(d->cuStreamCreateWithPriority(&side, CU_STREAM_NON_BLOCKING, 0));
  OK(d->cuMemsetD32Async(flag, 0, 1, side));
  OK(d->cuStreamSynchronize(side));
  OK(d->cuStreamWaitValue32(st[0], flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
  NOK(NCCL(ncclGroupStart)());
  for (int r = 0; r < 2; r++)
    NOK(NCCL(ncclAllReduce)((void *)buf[r], (void *)buf[r], N, ncclFloat32, ncclSum, x.cm[r], (cudaStream_t)st[r]));
  NOK(NCCL(ncclGroupEnd)());
  on(0);
  assert_int_equal(d->cuStreamQuery(st[0]), CUDA_ERROR_NOT_READY);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, destroy_both, &x), 0);
  while (!atomic_load(&x.calling)) sched_yield();
  on(0);
  OK(d->cuStreamWriteValue32(side, flag, 1, 0));
  pthread_join(t, NULL);
  for (int r = 0; r < 2; r++) {
    get(r, buf[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_true(got[i] == (float)(6 * i + 7));
  }
  on(0);
  OK(d->cuStreamSynchronize(side));
  OK(d->cuStreamDestroy(side));
  OK(d->cuMemFree(flag));
  assert_int_equal(x.r[0], ncclSuccess);
  assert_int_equal(x.r[1], ncclSuccess);
  printf("conformance-nccl: ncclCommDestroy with the rank's all-reduce still queued waits for it ok\n");
}

/* ---- a communicator destroyed while a graph of its collectives is alive ---------------------------
 * ncclCommDestroy waits until the graphs that captured the communicator's collectives are
 * destroyed, so a thread that destroys the communicator before its graphs never returns (NCCL
 * 2.28.3 on 2 x H200: CUDA_SEMANTICS.md, and tests/comm test_comm_edges hung there for 300 s).
 * With the graphs and their execs destroyed first it returns ncclSuccess. The simulator's NCCL
 * refuses such a destroy (ncclInvalidUsage, a hazard reported) instead of hanging. Shown in a child
 * process (this program with --graph-child MODE), killed after 20 s. */

/* The child: both ranks connected by an eager all-reduce, an all-reduce of each captured (RELAXED,
 * one group), instantiated and launched once; then, with mode "graphs_first", the execs and graphs
 * destroyed; then both communicators destroyed. Exit 0: both destroys returned ncclSuccess; 3: one
 * refused (the simulator); 2: a set-up step failed. */
static int graph_child(const char *mode) {
  if (setup(NULL) != 0 || !g_two) return 2;
  bool graphs_first = strcmp(mode, "graphs_first") == 0;
  CUgraph g[2] = {NULL, NULL};
  CUgraphExec x[2] = {NULL, NULL};
  for (int pass = 0; pass < 2; pass++) { /* eager, then captured */
    for (int r = 0; r < 2 && pass == 1; r++)
      if (d->cuCtxSetCurrent(ctx[r]) != CUDA_SUCCESS ||
          d->cuStreamBeginCapture(st[r], CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS)
        return 2;
    ncclResult_t e = NCCL(ncclGroupStart)();
    for (int r = 0; r < 2 && e == ncclSuccess; r++)
      e = NCCL(ncclAllReduce)((void *)buf[r], (void *)buf[r], N, ncclFloat32, ncclSum, comm[r], (cudaStream_t)st[r]);
    ncclResult_t end = NCCL(ncclGroupEnd)();
    if (e != ncclSuccess || end != ncclSuccess) return 2;
    for (int r = 0; r < 2 && pass == 1; r++)
      if (d->cuCtxSetCurrent(ctx[r]) != CUDA_SUCCESS || d->cuStreamEndCapture(st[r], &g[r]) != CUDA_SUCCESS ||
          d->cuGraphInstantiateWithFlags(&x[r], g[r], 0) != CUDA_SUCCESS)
        return 2;
  }
  for (int r = 0; r < 2; r++)
    if (d->cuCtxSetCurrent(ctx[r]) != CUDA_SUCCESS || d->cuGraphLaunch(x[r], st[r]) != CUDA_SUCCESS) return 2;
  for (int r = 0; r < 2; r++)
    if (d->cuCtxSetCurrent(ctx[r]) != CUDA_SUCCESS || d->cuStreamSynchronize(st[r]) != CUDA_SUCCESS) return 2;
  for (int r = 0; r < 2 && graphs_first; r++)
    if (d->cuCtxSetCurrent(ctx[r]) != CUDA_SUCCESS || d->cuGraphExecDestroy(x[r]) != CUDA_SUCCESS ||
        d->cuGraphDestroy(g[r]) != CUDA_SUCCESS)
      return 2;
  for (int r = 0; r < 2; r++)
    if (NCCL(ncclCommDestroy)(comm[r]) != ncclSuccess) return 3;
  return 0;
}

/* Runs the child in `mode`; its exit status, or -1 when it was still running after `seconds`. */
static int run_graph_child(const char *mode, int seconds) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", "conformance_nccl", "--graph-child", mode, (char *)NULL);
    _exit(127);
  }
  return tu_wait_child(pid, seconds);
}

static void test_destroy_with_a_live_graph(void **state) {
  (void)state;
  if (!g_two) skip();
  fflush(stdout);
  int live = run_graph_child("live", 20);
  int graphs_first = run_graph_child("graphs_first", 60);
  printf("probe ncclCommDestroy with a live graph of its all-reduce: child %s; graphs destroyed first: child %d\n",
         live == -1 ? "still running after 20 s, killed" : live == 3 ? "refused (3)" : "ended", graphs_first);
  assert_int_not_equal(live, 2);
  assert_int_equal(live, g_nccl != NULL ? -1 : 3); /* the GPU blocks; the simulator refuses */
  assert_int_equal(graphs_first, 0);
  printf("conformance-nccl: ncclCommDestroy blocks while a graph of its collectives is alive (the simulator refuses "
         "it), and returns once the graphs are destroyed first ok\n");
}

static void test_bad_arguments(void **state) {
  (void)state;
  if (!g_two) skip();
  on(0);
  assert_int_equal(NCCL(ncclBroadcast)((void *)buf[0], (void *)out[0], N, ncclInt32, 2, comm[0], (cudaStream_t)st[0]),
                   ncclInvalidArgument);
  assert_int_equal(NCCL(ncclSend)((void *)buf[0], N, ncclInt32, -1, comm[0], (cudaStream_t)st[0]), ncclInvalidArgument);
  assert_int_equal(NCCL(ncclAllReduce)((void *)buf[0], (void *)out[0], N, ncclFloat32, ncclSum, NULL, (cudaStream_t)st[0]),
                   ncclInvalidArgument);
  printf("probe GroupEnd without GroupStart: %d\n", (int)NCCL(ncclGroupEnd)());
  printf("conformance-nccl: a root or peer out of range and a null communicator are ncclInvalidArgument ok\n");
}

/* A group one of whose calls NCCL refuses (rank 1's broadcast names root 2 of 2 ranks): the call
 * returns ncclInvalidArgument, ncclGroupEnd fails, nothing of the group runs (rank 0's all-reduce
 * in it neither runs nor waits for a partner), the thread is out of the group, and the next
 * group's all-reduces pair as if the failed group never was. */
static void test_a_failed_group_runs_nothing_and_the_next_pairs(void **state) {
  (void)state;
  if (!g_two) skip();
  static float h[2][N], got[N];
  put_inputs(h);
  NOK(NCCL(ncclGroupStart)());
  on(0);
  NOK(NCCL(ncclAllReduce)((void *)buf[0], (void *)buf[0], N, ncclFloat32, ncclSum, comm[0], (cudaStream_t)st[0]));
  on(1);
  assert_int_equal(NCCL(ncclBroadcast)((void *)buf[1], (void *)out[1], N, ncclFloat32, 2, comm[1], (cudaStream_t)st[1]),
                   ncclInvalidArgument);
  ncclResult_t e = NCCL(ncclGroupEnd)();
  printf("probe: ncclGroupEnd of a group with a refused call: %d\n", (int)e);
  assert_int_not_equal(e, ncclSuccess);
  for (int r = 0; r < 2; r++) { /* nothing ran: the inputs are as they were */
    get(r, buf[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_true(got[i] == h[r][i]);
  }
  all_reduce_in_place(); /* outside any group again, and its calls pair */
  expect_sums();
  printf("conformance-nccl: a group with a refused call fails at its end, runs nothing, and the next group pairs ok\n");
}

/* ---- ranks in two processes ---- */

/* This process's rank `rank` of a two-rank communicator from the id in `id_file` (rank 0 made
 * it), on device `rank`: an in-place float all-reduce of rank-dependent values, checked. Returns
 * 0 when the result is right. Used by both processes of test_two_processes_all_reduce. */
static int process_rank(int rank, const ncclUniqueId *id) {
  CUcontext c;
  CUstream s;
  CUdeviceptr p;
  if (d->cuDevicePrimaryCtxRetain(&c, rank) != CUDA_SUCCESS || d->cuCtxSetCurrent(c) != CUDA_SUCCESS ||
      d->cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
      d->cuMemAlloc(&p, N * 4) != CUDA_SUCCESS)
    return 1;
  static float h[N];
  for (int i = 0; i < N; i++) h[i] = (float)(i + 1000 * rank);
  ncclComm_t cm;
  int bad = d->cuMemcpyHtoD(p, h, sizeof h) != CUDA_SUCCESS;
  bad |= NCCL(ncclCommInitRank)(&cm, 2, *id, rank) != ncclSuccess;
  if (!bad) {
    bad |= NCCL(ncclAllReduce)((void *)p, (void *)p, N, ncclFloat32, ncclSum, cm, (cudaStream_t)s) != ncclSuccess;
    bad |= d->cuStreamSynchronize(s) != CUDA_SUCCESS || d->cuMemcpyDtoH(h, p, sizeof h) != CUDA_SUCCESS;
    for (int i = 0; !bad && i < N; i++) bad |= h[i] != (float)(2 * i + 1000);
    bad |= NCCL(ncclCommDestroy)(cm) != ncclSuccess;
  }
  d->cuMemFree(p);
  d->cuStreamDestroy(s);
  d->cuDevicePrimaryCtxRelease(rank);
  return bad;
}

/* The child: rank 1 (`--rank1 ID_FILE`). */
static int child_main(const char *id_file) {
  if (load() != 0 || !g_two) return 1;
  ncclUniqueId id;
  FILE *f = fopen(id_file, "rb");
  if (f == NULL || fread(&id, sizeof id, 1, f) != 1) return 1;
  fclose(f);
  return process_rank(1, &id);
}

static void test_two_processes_all_reduce(void **state) {
  (void)state;
  if (!g_two) skip();
  ncclUniqueId id;
  NOK(NCCL(ncclGetUniqueId)(&id));
  char dir[] = "/tmp/weft-conformance-XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/id", dir);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(&id, sizeof id, 1, f), 1);
  assert_int_equal(fclose(f), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", "conformance_nccl", "--rank1", path, (char *)NULL);
    _exit(127);
  }
  int bad = process_rank(0, &id);
  int status = 0;
  time_t until = time(NULL) + 60;
  while (waitpid(pid, &status, WNOHANG) == 0 && time(NULL) < until) usleep(10000);
  if (time(NULL) >= until) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    fail_msg("rank 1's process did not end within 60 s");
  }
  unlink(path);
  rmdir(dir);
  assert_int_equal(bad, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  on(0);
  printf("conformance-nccl: ranks in two processes sharing a unique id (a file): all-reduce ok\n");
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--rank1") == 0) return child_main(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--graph-child") == 0) return graph_child(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_first_collectives_under_capture), /* first: no devices connected yet */
      cmocka_unit_test(test_communicators),
      cmocka_unit_test(test_all_reduce_in_place),
      cmocka_unit_test(test_all_reduce_on_per_thread_streams),
      cmocka_unit_test(test_collectives),
      cmocka_unit_test(test_send_receive),
      cmocka_unit_test(test_captured_all_reduce),
      cmocka_unit_test(test_destroy_waits_for_queued_operations),
      cmocka_unit_test(test_destroy_with_a_live_graph),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_a_failed_group_runs_nothing_and_the_next_pairs),
      cmocka_unit_test(test_two_processes_all_reduce),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
