/* Kernels: the registry of host twins, modules, functions and cuLaunchKernel.
 *
 * A "kernel" is a host function registered by name (weft_sim_api_t.register_kernel) with a
 * function that lists the byte ranges a launch reads and writes. Any non-NULL module image
 * "contains" every registered kernel; cuModuleGetFunction finds one by name. Registry entries are
 * never freed (ops and race records keep pointers to them and their names); re-registering a name
 * replaces its twin in place.
 *
 * Arguments: when the kernel's parameter sizes are known (register_kernel_params), a launch
 * copies the values into a blob, each argument at a 16-byte aligned offset, as the driver copies
 * them at launch; otherwise the caller's kernelParams array itself is kept (see weft_sim.h).
 */
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

static sim__kernel_t *g_kernels;

static sim__kernel_t *kernel_find(const char *name) {
  for (sim__kernel_t *k = g_kernels; k != NULL; k = k->next)
    if (strcmp(k->name, name) == 0) return k;
  return NULL;
}

int sim__register_kernel(const char *name, weft_sim_kernel_fn fn, weft_sim_ranges_fn ranges, int nparams,
                         const size_t *param_bytes) {
  if (name == NULL || fn == NULL) return -1;
  sim__kernel_t *k = kernel_find(name);
  if (k == NULL) {
    k = sim__xcalloc(1, sizeof *k);
    size_t n = strlen(name) + 1;
    k->name = sim__xmalloc(n);
    memcpy(k->name, name, n);
    k->next = g_kernels;
    g_kernels = k;
  }
  k->fn = fn;
  k->ranges = ranges;
  free(k->param_bytes);
  k->param_bytes = NULL;
  k->nparams = nparams;
  if (nparams > 0) {
    k->param_bytes = sim__xmalloc((size_t)nparams * sizeof *k->param_bytes);
    memcpy(k->param_bytes, param_bytes, (size_t)nparams * sizeof *k->param_bytes);
  }
  return 0;
}

/* ---- modules and functions ---- */

typedef struct sim_func {
  uint32_t magic;
  struct sim_func *next; /* in its module */
  sim__kernel_t *k;
} sim_func_t;

typedef struct sim_module {
  uint32_t magic;
  sim_func_t *funcs;
} sim_module_t;

static CUresult module_load(CUmodule *out, const void *image) {
  if (out == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  sim_module_t *m = sim__xcalloc(1, sizeof *m);
  m->magic = SIM_MAGIC_MODULE;
  sim__handle_add(m);
  *out = (CUmodule)m;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) { SIM_CALL(cuModuleLoadData, module_load(module, image)); }

static CUresult module_unload(CUmodule h) {
  sim_module_t *m = sim__handle_get(h, SIM_MAGIC_MODULE);
  if (m == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__handle_remove(m);
  for (sim_func_t *f = m->funcs, *next; f != NULL; f = next) {
    next = f->next;
    sim__handle_remove(f);
    free(f);
  }
  free(m);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) { SIM_CALL(cuModuleUnload, module_unload(hmod)); }

static CUresult module_get_function(CUfunction *out, CUmodule h, const char *name) {
  if (out == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
  sim_module_t *m = sim__handle_get(h, SIM_MAGIC_MODULE);
  if (m == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__kernel_t *k = kernel_find(name);
  if (k == NULL) return CUDA_ERROR_NOT_FOUND;
  for (sim_func_t *f = m->funcs; f != NULL; f = f->next) {
    if (f->k == k) {
      *out = (CUfunction)f;
      return CUDA_SUCCESS;
    }
  }
  sim_func_t *f = sim__xcalloc(1, sizeof *f);
  f->magic = SIM_MAGIC_FUNC;
  f->k = k;
  f->next = m->funcs;
  m->funcs = f;
  sim__handle_add(f);
  *out = (CUfunction)f;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  SIM_CALL(cuModuleGetFunction, module_get_function(hfunc, hmod, name));
}

/* ---- launches ---- */

CUresult sim__kernel_action(sim__action_t *act, CUfunction hf, const unsigned grid[3], const unsigned block[3],
                            unsigned shared, void **params, void **extra) {
  sim_func_t *f = sim__handle_get(hf, SIM_MAGIC_FUNC);
  if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
  for (int i = 0; i < 3; i++)
    if (grid[i] == 0 || block[i] == 0) return CUDA_ERROR_INVALID_VALUE;
  if ((uint64_t)block[0] * block[1] * block[2] > 1024 || block[2] > 64 || grid[1] > 65535 || grid[2] > 65535)
    return CUDA_ERROR_INVALID_VALUE;
  if (shared > 232448) return CUDA_ERROR_INVALID_VALUE;
  if (extra != NULL) return sim__unimplemented();
  sim__kernel_t *k = f->k;
  if (k->nparams > 0 && params == NULL) return CUDA_ERROR_INVALID_VALUE;
  memset(act, 0, sizeof *act);
  act->kind = SIM_ACT_KERNEL;
  act->u.kernel.k = k;
  memcpy(act->u.kernel.cfg.grid, grid, sizeof act->u.kernel.cfg.grid);
  memcpy(act->u.kernel.cfg.block, block, sizeof act->u.kernel.cfg.block);
  act->u.kernel.cfg.shared_bytes = shared;
  if (k->nparams < 0) {
    act->u.kernel.params = params;
    return CUDA_SUCCESS;
  }
  size_t total = 0;
  for (int i = 0; i < k->nparams; i++) total += (k->param_bytes[i] + 15) & ~(size_t)15;
  act->u.kernel.owned = 1;
  act->u.kernel.nparams = (unsigned)k->nparams;
  act->u.kernel.blob = sim__xmalloc(total);
  act->u.kernel.blob_bytes = total;
  act->u.kernel.params = sim__xmalloc(((size_t)k->nparams + 1) * sizeof(void *));
  size_t off = 0;
  for (int i = 0; i < k->nparams; i++) {
    char *slot = (char *)act->u.kernel.blob + off;
    memcpy(slot, params[i], k->param_bytes[i]);
    act->u.kernel.params[i] = slot;
    off += (k->param_bytes[i] + 15) & ~(size_t)15;
  }
  return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shared, CUstream hs,
                       void **params, void **extra) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  /* No current context needed: the stream names it; the default streams, without one, were
   * refused above (H200, tests/conformance "no current context"). */
  CUresult r;
  if (s->cap != NULL && s->cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  sim__action_t act;
  if ((r = sim__kernel_action(&act, f, grid, block, shared, params, extra)) != CUDA_SUCCESS) return r;
  return sim__submit(s, &act, CU_GRAPH_NODE_TYPE_KERNEL);
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
  const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ}, block[3] = {blockDimX, blockDimY, blockDimZ};
  SIM_CALL(cuLaunchKernel, launch(f, grid, block, sharedMemBytes, hStream, kernelParams, extra));
}
