/* What the tests of tests/torch share: the adapter's ABI (weft_torch.h) resolved with dlsym from
 * libweft_torch.so, as PyTorch's torch.cuda.memory does, and the driver weft loaded (the simulator
 * in CI, with its race oracle; a GPU when staged there) reached through weft_driver_symbol, as
 * PyTorch's own CUDA calls would reach it. Each test file is one program: the pointers are its
 * own (static). Include after <cmocka.h>. */
#ifndef WEFT_TESTS_TORCH_HARNESS_H
#define WEFT_TESTS_TORCH_HARNESS_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <cuda.h>

#include "sim/weft_sim.h"

/* The library's path: the first argument, else $WEFT_TORCH_LIB (staged for the GPU). */
static const char *lib_path = "lib/torch/libweft_torch.so";

/* main's arguments: the library's path as above; $WEFT_TEST_FILTER runs only the cases it names. */
static inline void harness_args(int argc, char **argv) {
  if (argc > 1) lib_path = argv[1];
  else if (getenv("WEFT_TORCH_LIB") != NULL) lib_path = getenv("WEFT_TORCH_LIB");
  if (getenv("WEFT_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
}

/* The adapter's ABI. */
static void *(*t_alloc)(ssize_t, int, CUstream);
static void (*t_free)(void *, ssize_t, int, CUstream);
static int (*t_use_begin)(int, CUstream, const uint64_t *, size_t, const uint64_t *, size_t);
static int (*t_use_end)(int, CUstream, const uint64_t *, size_t, const uint64_t *, size_t);
static int (*t_stats)(int, char *, size_t);
static int (*t_release)(int);
static void (*t_record)(void *, CUstream);
static void (*t_empty)(void);
static const char *(*t_error)(void);
static void *(*t_symbol)(const char *);
/* CUDAPluggableAllocator's graph-pool hooks (PyTorch's MempoolId_t is a pair of unsigned long
 * long passed by value; the filter, a std::function passed by value, arrives as a pointer).
 * Looked up, required only by the cases that use them. */
typedef struct { unsigned long long first, second; } mempool_id_t;
static void (*t_pool_begin)(int, mempool_id_t, const void *);
static void (*t_pool_end)(int, mempool_id_t);
static void (*t_pool_release)(int, mempool_id_t);
static const weft_sim_api_t *sim; /* NULL on a GPU */

/* The driver. */
static CUresult (*d_stream_create)(CUstream *, unsigned, int);
static CUresult (*d_memset)(CUdeviceptr, unsigned, size_t, CUstream);
static CUresult (*d_copy)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
static CUresult (*d_copy_peer)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
static CUresult (*d_dtoh)(void *, CUdeviceptr, size_t);
static CUresult (*d_sync)(CUstream);
static CUresult (*d_ctx_sync)(void);
static CUresult (*d_get_cur)(CUcontext *);
static CUresult (*d_set_cur)(CUcontext);
static CUresult (*d_begin)(CUstream, CUstreamCaptureMode);
static CUresult (*d_end)(CUstream, CUgraph *);
static CUresult (*d_inst)(CUgraphExec *, CUgraph, unsigned long long);
static CUresult (*d_launch)(CUgraphExec, CUstream);
static CUresult (*d_exec_destroy)(CUgraphExec);
static CUresult (*d_graph_destroy)(CUgraph);
static CUresult (*d_event_create)(CUevent *, unsigned);
static CUresult (*d_event_record)(CUevent, CUstream);
static CUresult (*d_wait_event)(CUstream, CUevent, unsigned);
static CUresult (*d_event_destroy)(CUevent);

#define SYM(var, lib, name)                                          \
  do {                                                               \
    *(void **)&(var) = dlsym(lib, name);                             \
    if ((var) == NULL) fail_msg("%s: no symbol %s", lib_path, name); \
  } while (0)
#define DRV(var, name)                                         \
  do {                                                         \
    *(void **)&(var) = t_symbol(name);                         \
    if ((var) == NULL) fail_msg("the driver has no %s", name); \
  } while (0)

/* dlopens the adapter and resolves everything above (the driver through the adapter, which loads
 * it at its first call to weft_driver_symbol); cuInit done. */
static void harness_resolve(void) {
  void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) fail_msg("dlopen: %s", dlerror());
  SYM(t_alloc, lib, "weft_torch_alloc");
  SYM(t_free, lib, "weft_torch_free");
  SYM(t_use_begin, lib, "weft_torch_use_begin");
  SYM(t_use_end, lib, "weft_torch_use_end");
  SYM(t_stats, lib, "weft_torch_stats");
  SYM(t_release, lib, "weft_torch_release_graph_pools");
  SYM(t_error, lib, "weft_torch_last_error");
  SYM(t_record, lib, "weft_torch_record_stream");
  SYM(t_empty, lib, "weft_torch_empty_cache");
  SYM(t_symbol, lib, "weft_driver_symbol");
  *(void **)&t_pool_begin = dlsym(lib, "weft_torch_begin_allocate_to_pool");
  *(void **)&t_pool_end = dlsym(lib, "weft_torch_end_allocate_to_pool");
  *(void **)&t_pool_release = dlsym(lib, "weft_torch_release_pool");
  CUresult (*init)(unsigned);
  DRV(init, "cuInit");
  if (init(0) != CUDA_SUCCESS) fail_msg("cuInit failed");
  sim = weft_sim_api(t_symbol);
  DRV(d_stream_create, "cuStreamCreateWithPriority");
  DRV(d_memset, "cuMemsetD32Async");
  DRV(d_copy, "cuMemcpyDtoDAsync_v2");
  DRV(d_copy_peer, "cuMemcpyPeerAsync");
  DRV(d_dtoh, "cuMemcpyDtoH_v2");
  DRV(d_sync, "cuStreamSynchronize");
  DRV(d_ctx_sync, "cuCtxSynchronize");
  DRV(d_get_cur, "cuCtxGetCurrent");
  DRV(d_set_cur, "cuCtxSetCurrent");
  DRV(d_begin, "cuStreamBeginCapture_v2");
  DRV(d_end, "cuStreamEndCapture");
  DRV(d_inst, "cuGraphInstantiateWithFlags");
  DRV(d_launch, "cuGraphLaunch");
  DRV(d_exec_destroy, "cuGraphExecDestroy");
  DRV(d_graph_destroy, "cuGraphDestroy");
  DRV(d_event_create, "cuEventCreate");
  DRV(d_event_record, "cuEventRecord");
  DRV(d_wait_event, "cuStreamWaitEvent");
  DRV(d_event_destroy, "cuEventDestroy_v2");
}

/* Device dev's primary context, retained for the program's life (as PyTorch's runtime keeps it). */
static CUcontext harness_primary(int dev) {
  CUresult (*dev_get)(CUdevice *, int);
  CUresult (*retain)(CUcontext *, CUdevice);
  DRV(dev_get, "cuDeviceGet");
  DRV(retain, "cuDevicePrimaryCtxRetain");
  CUdevice d;
  CUcontext c = NULL;
  if (dev_get(&d, dev) != CUDA_SUCCESS || retain(&c, d) != CUDA_SUCCESS) fail_msg("device %d's primary context", dev);
  return c;
}

/* The adapter's counter `key` of device dev (weft_torch_stats' JSON). */
static uint64_t harness_stat(int dev, const char *key) {
  char buf[2048], pat[64];
  if (t_stats(dev, buf, sizeof buf) <= 0) fail_msg("no stats for device %d", dev);
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *at = strstr(buf, pat);
  if (at == NULL) fail_msg("no %s in %s", key, buf);
  return strtoull(at + strlen(pat), NULL, 10);
}

/* On the simulator: no race, and no driver call on a stream or event after its destroy. */
static void check_races(void) {
  if (sim == NULL) return;
  if (sim->race_count() != 0) sim->print_report();
  assert_int_equal(sim->race_count(), 0);
  weft_sim_stats_t st;
  sim->stats(&st);
  assert_int_equal(st.destroyed_handle_uses, 0);
}

/* Thread-safe checks: cmocka's asserts longjmp and must stay on the test's thread, so worker
 * threads note failures (the first ten printed, the first kept) and the test's thread fails with
 * the first (check_errors). */
static pthread_mutex_t harness_err_lock = PTHREAD_MUTEX_INITIALIZER;
static char harness_err_msg[1024];
static atomic_int harness_errors;

static inline void note(const char *fmt, ...) {
  int k = atomic_fetch_add(&harness_errors, 1);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (k < 10) fprintf(stderr, "failure: %s\n", msg);
  pthread_mutex_lock(&harness_err_lock);
  if (harness_err_msg[0] == 0) snprintf(harness_err_msg, sizeof harness_err_msg, "%s", msg);
  pthread_mutex_unlock(&harness_err_lock);
}

#define CHECK(cond, ...)            \
  do {                              \
    if (!(cond)) note(__VA_ARGS__); \
  } while (0)

static inline void reset_errors(void) {
  atomic_store(&harness_errors, 0);
  harness_err_msg[0] = 0;
}

static inline void check_errors(void) {
  if (atomic_load(&harness_errors) != 0)
    fail_msg("%d failures in threads; first: %s", atomic_load(&harness_errors), harness_err_msg);
}

static inline unsigned word_at(CUdeviceptr p) {
  unsigned v = 0xdeadbeef;
  CHECK(d_dtoh(&v, p, 4) == CUDA_SUCCESS, "cuMemcpyDtoH(0x%llx) failed", (unsigned long long)p);
  return v;
}

/* The first and the last word of an n-byte tensor both hold v. */
static inline void expect_filled(CUdeviceptr p, size_t n, unsigned v, const char *what) {
  unsigned a = word_at(p), b = word_at(p + n - 4);
  CHECK(a == v && b == v, "%s: tensor 0x%llx (%zu bytes) holds %u..%u, expected %u", what, (unsigned long long)p, n, a,
        b, v);
}

/* Runs fn on n threads (at most 32), the t-th with args + t * arg_size, and joins them. */
static inline void run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size) {
  pthread_t th[32];
  for (int t = 0; t < n; t++) assert_int_equal(pthread_create(&th[t], NULL, fn, (char *)args + (size_t)t * arg_size), 0);
  for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
}

#endif /* WEFT_TESTS_TORCH_HARNESS_H */
