#include "tests/util/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/driver.h"
#include "tests/kernels/test_kernels.h"
#include "tests/kernels/test_kernels_sim.h"

int tu_init(tu_env_t *env, const weft_options_t *opts) { return tu_init_device(env, 0, opts); }

int tu_init_device(tu_env_t *env, int ordinal, const weft_options_t *opts) {
  memset(env, 0, sizeof *env);
  weft_status_t st = weft_runtime_get(ordinal, opts, &env->rt);
  if (st != WEFT_OK) {
    fprintf(stderr, "tu_init: weft_runtime_get: %s: %s\n", weft_status_name(st), weft_last_error());
    return -1;
  }
  const weft__driver_t *drv;
  if (weft__driver_get(&drv) != WEFT_OK) return -1;
  /* The module is loaded into the device's primary context (the runtime's, retained by it). */
  CUdevice dev;
  CUcontext ctx;
  if (drv->cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || drv->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
    return -1;
  (void)drv->cuDevicePrimaryCtxRelease(dev);
  if (drv->cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return -1;
  env->ctx = ctx;
  weft_test_kernels_register_sim();
  env->sim = weft_sim_api(weft_driver_symbol);
  if (drv->cuModuleLoadData(&env->module, test_kernels_fatbin) != CUDA_SUCCESS ||
      drv->cuModuleGetFunction(&env->combine, env->module, "weft_test_combine") != CUDA_SUCCESS ||
      drv->cuModuleGetFunction(&env->fill, env->module, "weft_test_fill") != CUDA_SUCCESS) {
    fprintf(stderr, "tu_init: cannot load the test kernels\n");
    return -1;
  }
  env->spin_ns = env->sim ? 0 : 50000;
  const char *spin = getenv("WEFT_TEST_SPIN_NS");
  if (spin != NULL) env->spin_ns = (unsigned)strtoul(spin, NULL, 10);
  return 0;
}

void tu_fini(tu_env_t *env) {
  const weft__driver_t *drv;
  if (env->module != NULL && weft__driver_get(&drv) == WEFT_OK) {
    if (env->ctx != NULL) (void)drv->cuCtxSetCurrent(env->ctx);
    drv->cuModuleUnload(env->module);
  }
  if (env->rt != NULL) (void)weft_runtime_release(env->rt);
  memset(env, 0, sizeof *env);
}

uint64_t tu_races(const tu_env_t *env) {
  if (env->sim == NULL) return 0;
  weft_sim_stats_t st;
  env->sim->stats(&st); /* a driver call on a destroyed handle: the simulator printed it */
  return env->sim->race_count() + st.destroyed_handle_uses;
}
void tu_print_races(const tu_env_t *env) {
  if (env->sim) env->sim->print_report();
}
void tu_reset_races(const tu_env_t *env) {
  if (env->sim) env->sim->reset_races();
}

static CUdeviceptr ptr_of(weft_block_t b) {
  CUdeviceptr p = 0;
  if (b.rec != NULL && weft_block_ptr(b, &p) != WEFT_OK) return 0;
  return p;
}

/* weft_launch, or (env->split) the split form around a raw launch. */
static weft_status_t launch_as_asked(const tu_env_t *env, weft_stream_t *s, const weft_launch_t *l,
                                     const weft_access_t *acc, size_t n) {
  if (!env->split) return weft_launch(s, l, acc, n);
  const weft__driver_t *drv;
  weft_status_t st = weft__driver_get(&drv);
  if (st == WEFT_OK) st = weft_use_begin(s, acc, n);
  if (st != WEFT_OK) return st;
  CUresult r = drv->cuLaunchKernel(l->func, l->grid[0], 1, 1, l->block[0], 1, 1, 0, weft_stream_raw(s), l->params, NULL);
  st = weft_use_end(s, acc, n);
  return r != CUDA_SUCCESS ? WEFT_ERR_DRIVER : st;
}

/* One tracked launch: weft_launch, or (env->split) the split form around a raw launch; with
 * env->no_context, from no current context, which it must leave so. */
static weft_status_t launch(const tu_env_t *env, weft_stream_t *s, const weft_launch_t *l, const weft_access_t *acc,
                            size_t n) {
  const weft__driver_t *drv = NULL;
  if (env->no_context && (weft__driver_get(&drv) != WEFT_OK || drv->cuCtxSetCurrent(NULL) != CUDA_SUCCESS)) {
    fprintf(stderr, "tu: no current context could be set\n");
    return WEFT_ERR_DRIVER;
  }
  weft_status_t st = launch_as_asked(env, s, l, acc, n);
  CUcontext cur = NULL;
  if (st == WEFT_OK && env->no_context && (drv->cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != NULL)) {
    fprintf(stderr, "tu: a tracked launch on stream %d made context %p current\n", weft_stream_index(s), (void *)cur);
    return WEFT_ERR_INVALID_ARGUMENT; /* (the caller's test fails on it) */
  }
  return st;
}

weft_status_t tu_combine(const tu_env_t *env, weft_stream_t *s, weft_block_t out0, weft_block_t out1, weft_block_t in0,
                         weft_block_t in1, weft_block_t in2, unsigned n, unsigned salt) {
  weft_block_t outs[2] = {out0, out1}, ins[3] = {in0, in1, in2};
  weft_access_t acc[5];
  size_t k = 0;
  for (int i = 0; i < 2; i++) {
    if (outs[i].rec == NULL) continue;
    weft_access_kind_t kind = WEFT_WRITE;
    for (int j = 0; j < 3; j++)
      if (ins[j].rec == outs[i].rec) kind = WEFT_READ_WRITE;
    acc[k++] = (weft_access_t){outs[i], kind};
  }
  for (int j = 0; j < 3; j++) {
    if (ins[j].rec == NULL || ins[j].rec == out0.rec || ins[j].rec == out1.rec) continue;
    acc[k++] = (weft_access_t){ins[j], WEFT_READ};
  }
  CUdeviceptr p[5] = {ptr_of(out0), ptr_of(out1), ptr_of(in0), ptr_of(in1), ptr_of(in2)};
  unsigned spin = env->spin_ns;
  void *params[8] = {&p[0], &p[1], &p[2], &p[3], &p[4], &n, &salt, &spin};
  weft_launch_t l = {.func = env->combine, .grid = {(n + 255) / 256 < 64 ? (n + 255) / 256 : 64}, .block = {256}, .params = params};
  return launch(env, s, &l, acc, k);
}

weft_status_t tu_fill(const tu_env_t *env, weft_stream_t *s, weft_block_t dst, unsigned n, unsigned value) {
  CUdeviceptr p = ptr_of(dst);
  unsigned spin = env->spin_ns;
  void *params[4] = {&p, &n, &value, &spin};
  weft_launch_t l = {.func = env->fill, .grid = {(n + 255) / 256 < 64 ? (n + 255) / 256 : 64}, .block = {256}, .params = params};
  weft_access_t a = {dst, WEFT_WRITE};
  return launch(env, s, &l, &a, 1);
}

weft_status_t tu_read(weft_stream_t *s, weft_block_t b, void *host, size_t bytes) {
  weft_status_t st = weft_copy_from_block(s, host, b, 0, bytes);
  return st != WEFT_OK ? st : weft_stream_synchronize(s);
}
