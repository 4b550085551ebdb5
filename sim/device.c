/* The simulated devices and their primary contexts, peer access, context synchronisation, and
 * graph memory attributes.
 *
 * WEFT_SIM_DEVICES devices (default 1, at most 8), each a "weft-sim H100": compute capability
 * 9.0, 132 SMs, memory WEFT_SIM_MEMORY (default 80 GiB) each. Attributes not listed below read as
 * 0, like a feature the device lacks; the PCI bus id tells devices apart. Every device can access
 * every other's memory (cuDeviceCanAccessPeer), as the two NVLinked H100s of the project's GPU
 * machine can, unless WEFT_SIM_PEER=0. Peer access is what those H100s answer
 * (tests/conformance/README.md, "two devices"): cuCtxEnablePeerAccess needs flags 0, refuses the
 * context's own device (PEER_ACCESS_UNSUPPORTED), a second enable (PEER_ACCESS_ALREADY_ENABLED) and
 * a disable of what was not enabled (PEER_ACCESS_NOT_ENABLED).
 */
#include <string.h>

#include "sim/internal.h"

static const struct { CUdevice_attribute attr; int value; } g_attrs[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536},
    {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512},
    {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1},
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x1b},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3},
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448},
    {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, 32505856},
    {CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, 134213632},
    {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR},
    {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 1},
    {CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, 4},
};

static const char g_name[] = "weft-sim H100";

static int valid_dev(CUdevice dev) { return dev >= 0 && dev < sim.ndev; }

static CUresult device_get(CUdevice *out, int ordinal) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *out = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) { SIM_CALL(cuDeviceGet, device_get(device, ordinal)); }

static CUresult device_count(int *out) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  *out = sim.ndev;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) { SIM_CALL(cuDeviceGetCount, device_count(count)); }

static CUresult device_name(char *name, int len, CUdevice dev) {
  if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  size_t n = (size_t)len - 1 < sizeof g_name - 1 ? (size_t)len - 1 : sizeof g_name - 1;
  memcpy(name, g_name, n);
  name[n] = '\0';
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) { SIM_CALL(cuDeviceGetName, device_name(name, len, dev)); }

static CUresult device_attribute(int *out, CUdevice_attribute attr, CUdevice dev) {
  if (out == NULL || attr <= 0 || attr >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *out = 0;
  for (size_t i = 0; i < sizeof g_attrs / sizeof g_attrs[0]; i++)
    if (g_attrs[i].attr == attr) *out = g_attrs[i].value;
  if (attr == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) *out += (int)dev * 0x20;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  SIM_CALL(cuDeviceGetAttribute, device_attribute(pi, attrib, dev));
}

static CUresult total_mem(size_t *out, CUdevice dev) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *out = (size_t)sim.memory_limit;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) { SIM_CALL(cuDeviceTotalMem, total_mem(bytes, dev)); }

/* ---- the primary contexts ---- */

static CUresult primary_retain(CUcontext *out, CUdevice dev) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  sim__ctx_t *c = &sim.ctxs[dev];
  if (c->refs++ == 0) sim__handle_add(c);
  *out = (CUcontext)c;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  SIM_CALL(cuDevicePrimaryCtxRetain, primary_retain(pctx, dev));
}

static CUresult primary_release(CUdevice dev) {
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  sim__ctx_t *c = &sim.ctxs[dev];
  if (c->refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c->refs == 0) {
    sim__handle_remove(c);
    c->peers = 0;
    for (int e = 0; e < sim.ndev; e++) sim.ctxs[e].peers &= ~(1u << dev);
    /* The context goes, and the streams made in it with it: later calls on them fail (H100,
     * driver 580.159.04: cuStreamDestroy gives INVALID_HANDLE; tests/conformance). */
    sim__streams_destroy_all(dev);
    sim.ctx_gen[dev]++; /* every thread's per-thread stream of dev went too */
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { SIM_CALL(cuDevicePrimaryCtxRelease, primary_release(dev)); }

static CUresult ctx_set_current(CUcontext ctx) {
  if (ctx != NULL && sim__handle_get(ctx, SIM_MAGIC_CTX) == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  sim__self()->ctx = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) { SIM_CALL(cuCtxSetCurrent, ctx_set_current(ctx)); }

static CUresult ctx_get_current(CUcontext *out) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  *out = sim__self()->ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) { SIM_CALL(cuCtxGetCurrent, ctx_get_current(pctx)); }

/* ---- peer access ---- */

static CUresult can_access_peer(int *out, CUdevice dev, CUdevice peer) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_dev(dev) || !valid_dev(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *out = dev != peer && !sim.no_peer;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
  SIM_CALL(cuDeviceCanAccessPeer, can_access_peer(canAccessPeer, dev, peerDev));
}

/* The current context and a peer context handle, both live. */
static CUresult peer_pair(CUcontext peer, sim__ctx_t **cur, sim__ctx_t **other) {
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  *other = sim__handle_get(peer, SIM_MAGIC_CTX);
  if (*other == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *cur = (sim__ctx_t *)sim__self()->ctx;
  return CUDA_SUCCESS;
}

static CUresult enable_peer(CUcontext peer, unsigned flags) {
  sim__ctx_t *cur, *other;
  CUresult r = peer_pair(peer, &cur, &other);
  if (r != CUDA_SUCCESS) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (other->dev == cur->dev || sim.no_peer) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (cur->peers & (1u << other->dev)) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  cur->peers |= 1u << other->dev;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  SIM_CALL(cuCtxEnablePeerAccess, enable_peer(peerContext, Flags));
}

static CUresult disable_peer(CUcontext peer) {
  sim__ctx_t *cur, *other;
  CUresult r = peer_pair(peer, &cur, &other);
  if (r != CUDA_SUCCESS) return r;
  if (!(cur->peers & (1u << other->dev))) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  cur->peers &= ~(1u << other->dev);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext) {
  SIM_CALL(cuCtxDisablePeerAccess, disable_peer(peerContext));
}

int sim__dev_can_touch(int dev, const sim__alloc_t *a) {
  if (a == NULL || a->dev == dev) return 1;
  if (a->pool != NULL) return (a->pool->access >> dev) & 1u;
  return (sim.ctxs[dev].peers >> a->dev) & 1u;
}

static CUresult ctx_synchronize(void) {
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if ((r = sim__capture_unsafe()) != CUDA_SUCCESS) return r;
  if ((r = sim__drain()) != CUDA_SUCCESS) return r;
  for (size_t i = 0; i < sim.nstreams; i++) sim__host_join(&sim.streams[i]->vc); /* (every device's: a superset) */
  sim__host_join(&sim.retired_vc);
  sim__pools_release();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void) { SIM_CALL(cuCtxSynchronize, ctx_synchronize()); }

static CUresult priority_range(int *least, int *greatest) {
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
  SIM_CALL(cuCtxGetStreamPriorityRange, priority_range(leastPriority, greatestPriority));
}

/* ---- graph memory attributes ---- */

void sim__device_graph_used(int64_t delta) {
  sim.graph_used += (uint64_t)delta;
  if (sim.graph_used > sim.graph_used_high) sim.graph_used_high = sim.graph_used;
  sim.stats.bytes_in_use += (uint64_t)delta;
}

void sim__device_graph_reserved(int64_t delta) {
  sim.graph_reserved += (uint64_t)delta;
  if (sim.graph_reserved > sim.graph_reserved_high) sim.graph_reserved_high = sim.graph_reserved;
}

static CUresult graph_mem_get(CUdevice dev, CUgraphMem_attribute attr, void *value) {
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t *v = value;
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *v = sim.graph_used; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *v = sim.graph_used_high; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *v = sim.graph_reserved; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *v = sim.graph_reserved_high; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value) {
  SIM_CALL(cuDeviceGetGraphMemAttribute, graph_mem_get(device, attr, value));
}

/* Only the high watermarks can be set, and only to 0 (which resets them to the current value). */
static CUresult graph_mem_set(CUdevice dev, CUgraphMem_attribute attr, void *value) {
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == NULL || *(cuuint64_t *)value != 0) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: sim.graph_used_high = sim.graph_used; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: sim.graph_reserved_high = sim.graph_reserved; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value) {
  SIM_CALL(cuDeviceSetGraphMemAttribute, graph_mem_set(device, attr, value));
}

static CUresult graph_mem_trim(CUdevice dev) {
  if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
  sim__graph_call_check((int)dev, "cuDeviceGraphMemTrim");
  sim__galloc_trim();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) { SIM_CALL(cuDeviceGraphMemTrim, graph_mem_trim(device)); }
