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
#include <nccl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"

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

static int setup(void **state) {
  (void)state;
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

static void test_all_reduce_in_place(void **state) {
  (void)state;
  if (!g_two) skip();
  static float h[2][N], got[N];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++) h[r][i] = (float)(i + 1000 * r);
    put(r, buf[r], h[r], N * 4);
  }
  all_reduce_in_place();
  for (int r = 0; r < 2; r++) {
    get(r, buf[r], got, N * 4);
    for (int i = 0; i < N; i++) assert_true(got[i] == (float)(2 * i + 1000));
  }
  printf("conformance-nccl: all-reduce in place, one thread, one group ok\n");
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_communicators),
      cmocka_unit_test(test_all_reduce_in_place),
      cmocka_unit_test(test_collectives),
      cmocka_unit_test(test_send_receive),
      cmocka_unit_test(test_captured_all_reduce),
      cmocka_unit_test(test_bad_arguments),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
