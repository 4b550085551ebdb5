/* The driver boundary: the one table of CUDA driver entry points weft calls.
 *
 * Like mimalloc's prim.h, this is the only way any weft file reaches the driver; nothing else
 * calls a cu* function. The table is filled once per process by weft__driver_get() from the
 * library WEFT_DRIVER names (the real libcuda.so.1, the simulator, or a path). Entry points come
 * from cuGetProcAddress at the CUDA version of the headers we compiled against (so each pointer
 * has exactly the signature cuda.h declares), or from dlsym of the versioned symbol
 * ("cuMemAlloc_v2") when the library has no cuGetProcAddress, as the simulator does not.
 *
 * Optional entry points may be NULL; the features that need them return WEFT_ERR_NOT_SUPPORTED.
 *
 * In the process's table (weft__driver_get), the calls that enqueue work, build or end a capture
 * or map graph memory run inside the shared side of the graph gate (gate.h, driver.c's
 * WEFT__DRIVER_GATED); weft__driver_exclusive_begin/end keeps them all out around graph calls
 * (lib/mem/mem.h's WEFT__GRAPH_MEMORY). Tables loaded with weft__driver_load are not gated.
 */
#ifndef WEFT_CORE_DRIVER_H
#define WEFT_CORE_DRIVER_H

#include <stdbool.h>

#include "lib/core/gate.h"
#include "weft/weft.h"

/* X(name, required). `name` is the cuda.h name; the struct member and the pointer type follow
 * cuda.h's versioning macros (cuMemAlloc is cuMemAlloc_v2), so calls read like plain driver
 * calls: weft__drv->cuMemAlloc(&p, n). Required entry points exist in every driver >= 12.0.
 * Entry points are asked for at the headers' CUDA_VERSION, except those in
 * WEFT__DRIVER_ABI_12000 below. */
#define WEFT_DRIVER_FUNCS(X)                \
  X(cuInit, 1)                              \
  X(cuDriverGetVersion, 1)                  \
  X(cuGetErrorName, 1)                      \
  X(cuGetErrorString, 1)                    \
  X(cuDeviceGet, 1)                         \
  X(cuDeviceGetCount, 1)                    \
  X(cuDeviceGetName, 1)                     \
  X(cuDeviceGetAttribute, 1)                \
  X(cuDeviceTotalMem, 1)                    \
  X(cuDevicePrimaryCtxRetain, 1)            \
  X(cuDevicePrimaryCtxRelease, 1)           \
  X(cuCtxSetCurrent, 1)                     \
  X(cuCtxGetCurrent, 1)                     \
  X(cuCtxSynchronize, 1)                    \
  X(cuCtxGetStreamPriorityRange, 1)         \
  X(cuStreamCreateWithPriority, 1)          \
  X(cuStreamDestroy, 1)                     \
  X(cuStreamQuery, 1)                       \
  X(cuStreamSynchronize, 1)                 \
  X(cuStreamWaitEvent, 1)                   \
  X(cuStreamGetPriority, 1)                 \
  X(cuStreamGetFlags, 1)                    \
  X(cuStreamGetId, 0)                       \
  X(cuStreamBeginCapture, 1)                \
  X(cuStreamEndCapture, 1)                  \
  X(cuStreamIsCapturing, 1)                 \
  X(cuStreamGetCaptureInfo, 0)              \
  X(cuStreamUpdateCaptureDependencies, 0)   \
  X(cuThreadExchangeStreamCaptureMode, 1)   \
  X(cuStreamSetAttribute, 0)                \
  X(cuLaunchHostFunc, 1)                    \
  X(cuStreamWriteValue32, 0)                \
  X(cuStreamWriteValue64, 0)                \
  X(cuStreamWaitValue32, 0)                 \
  X(cuStreamWaitValue64, 0)                 \
  X(cuEventCreate, 1)                       \
  X(cuEventRecord, 1)                       \
  X(cuEventRecordWithFlags, 1)              \
  X(cuEventQuery, 1)                        \
  X(cuEventSynchronize, 1)                  \
  X(cuEventDestroy, 1)                      \
  X(cuEventElapsedTime, 0)                  \
  X(cuMemAlloc, 1)                          \
  X(cuMemFree, 1)                           \
  X(cuMemGetInfo, 1)                        \
  X(cuMemcpyHtoD, 1)                        \
  X(cuMemcpyDtoH, 1)                        \
  X(cuMemcpyHtoDAsync, 1)                   \
  X(cuMemcpyDtoHAsync, 1)                   \
  X(cuMemcpyDtoDAsync, 1)                   \
  X(cuMemsetD8Async, 1)                     \
  X(cuMemsetD32Async, 1)                    \
  X(cuMemPoolCreate, 0)                     \
  X(cuMemPoolDestroy, 0)                    \
  X(cuMemPoolSetAttribute, 0)               \
  X(cuMemPoolGetAttribute, 0)               \
  X(cuMemPoolTrimTo, 0)                     \
  X(cuMemPoolExportToShareableHandle, 0)    \
  X(cuMemAllocFromPoolAsync, 0)             \
  X(cuMemAllocAsync, 0)                     \
  X(cuMemFreeAsync, 0)                      \
  X(cuModuleLoadData, 1)                    \
  X(cuModuleUnload, 1)                      \
  X(cuModuleGetFunction, 1)                 \
  X(cuLaunchKernel, 1)                      \
  X(cuGraphCreate, 1)                       \
  X(cuGraphDestroy, 1)                      \
  X(cuGraphAddKernelNode, 1)                \
  X(cuGraphAddMemcpyNode, 1)                \
  X(cuGraphAddMemsetNode, 1)                \
  X(cuGraphAddHostNode, 1)                  \
  X(cuGraphAddEmptyNode, 1)                 \
  X(cuGraphAddEventRecordNode, 1)           \
  X(cuGraphAddEventWaitNode, 1)             \
  X(cuGraphAddMemAllocNode, 0)              \
  X(cuGraphAddMemFreeNode, 0)               \
  X(cuGraphMemAllocNodeGetParams, 0)        \
  X(cuGraphAddDependencies, 1)              \
  X(cuGraphGetNodes, 1)                     \
  X(cuGraphGetEdges, 1)                     \
  X(cuGraphNodeGetType, 1)                  \
  X(cuGraphInstantiateWithFlags, 1)         \
  X(cuGraphUpload, 1)                       \
  X(cuGraphLaunch, 1)                       \
  X(cuGraphExecDestroy, 1)                  \
  X(cuDeviceGetGraphMemAttribute, 0)        \
  X(cuDeviceSetGraphMemAttribute, 0)        \
  X(cuDeviceGraphMemTrim, 0)               \
  X(cuDeviceCanAccessPeer, 0)               \
  X(cuCtxEnablePeerAccess, 0)               \
  X(cuCtxDisablePeerAccess, 0)              \
  X(cuMemPoolSetAccess, 0)                  \
  X(cuMemPoolGetAccess, 0)                  \
  X(cuMemcpyPeerAsync, 0)                   \
  X(cuMemHostAlloc, 0)                      \
  X(cuMemFreeHost, 0)                       \
  X(cuPointerGetAttribute, 0)

/* cuGetProcAddress(cuCtxSynchronize, 13000) returns cuCtxSynchronize_v2(CUcontext), while
 * cuda.h 13.0 declares cuCtxSynchronize(void): measured on an H200 with driver 580, calling the
 * v2 pointer without an argument returns CONTEXT_IS_DESTROYED. These are resolved at 12000. */
#define WEFT__DRIVER_ABI_12000(name) (__builtin_strcmp(name, "cuCtxSynchronize") == 0)

/** The loaded driver. Immutable after weft__driver_get() returned it. */
typedef struct weft__driver {
#define WEFT__DRIVER_MEMBER(name, required) __typeof__(name) *name;
  WEFT_DRIVER_FUNCS(WEFT__DRIVER_MEMBER)
#undef WEFT__DRIVER_MEMBER
  void *handle;           /* dlopen handle */
  weft_driver_info_t info;
  char path[256];         /* backing store of info.path */
} weft__driver_t;

/** The process's driver, loading it on first use (thread-safe, once).
 * Errors: WEFT_ERR_NO_DRIVER with the reason in weft_last_error(); repeated on every call. */
weft_status_t weft__driver_get(const weft__driver_t **out);

/** While inside, no other thread is in a call of the process's table that enqueues work, builds
 * or ends a capture, or maps graph memory on the device of `ctx` (every device if NULL or a
 * context weft did not make); such calls wait (gate.h says why: graph calls). Not nested, and not
 * called from inside such a call. */
void weft__driver_exclusive_begin(CUcontext ctx);
void weft__driver_exclusive_end(void);
/** Tells the gate that `ctx` is device `ordinal`'s context (a runtime's, at its creation): calls
 * with it current enter that device's shared side. Thread-safe; idempotent. */
void weft__driver_gate_context(CUcontext ctx, int ordinal);
/** The gate's device set of `ctx` (WEFT__GATE_ALL if weft did not make it). */
weft__gate_devices_t weft__driver_gate_devices(CUcontext ctx);
/** The driver's graph calls run one at a time in the process, and while none of them runs no
 * other thread is inside a driver call that enqueues work (the exclusive side of the graph gate,
 * lib/core/gate.h): allocation and free nodes, instantiate with its upload, launch, the free of
 * an output, exec and graph destroy, trim. Run at once from several threads they crashed libcuda
 * (580.159.04, H200: a SIGSEGV inside cuMemFreeAsync of a graph output about once in ten runs
 * of tests/threads); run while other threads enqueued work they were followed by wrong results
 * (H200 and H100, tests/conformance/README.md "graph calls"). `ctx` is the context of the graph's
 * device (the gate is per device); `stmt` holds driver calls only. */
#define WEFT__GRAPH_MEMORY(ctx, stmt)   \
  do {                                  \
    weft__driver_exclusive_begin(ctx);  \
    stmt;                               \
    weft__driver_exclusive_end();       \
  } while (0)

/** Loads a driver from `spec` ("", "sim" or a path) into *drv without touching the process's
 * table: what weft__driver_get() uses, and what tests call to try several libraries in one
 * process. On failure *drv holds nothing to release. */
weft_status_t weft__driver_load(const char *spec, weft__driver_t *drv);
/** Forgets a driver loaded by weft__driver_load() (the library stays mapped). */
void weft__driver_unload(weft__driver_t *drv);

/** Turns a failed CUresult into a weft status and records it for weft_last_driver_error():
 * OUT_OF_MEMORY → WEFT_ERR_OUT_OF_MEMORY, capture errors → WEFT_ERR_CAPTURE, NOT_SUPPORTED →
 * WEFT_ERR_NOT_SUPPORTED, NOT_READY → WEFT_ERR_NOT_READY, anything else → WEFT_ERR_DRIVER.
 * `what` names the call for weft_last_error(). */
weft_status_t weft__driver_fail(CUresult r, const char *what);

/** weft's eager driver work runs in RELAXED capture mode (cuThreadExchangeStreamCaptureMode),
 * as PyTorch does around its allocator's calls: a call the driver deems unsafe under capture
 * (queries, synchronisations, stream-ordered and synchronous allocation, pool attributes) then
 * never invalidates a capture that anyone began, in any mode, on any stream or thread. Use it only
 * for work on streams that are not capturing and for host waits on live work: weft has already
 * refused or captured whatever belongs to a capture. Scopes nest (one exchange at the outermost).
 * The scope's own work stands whatever the exchanges return: a failed restore is tried once more,
 * and if that fails too the thread owes its mode, which the next scope on the thread restores (a
 * failed entry leaves the scope in the thread's own mode). */
typedef struct weft__relaxed {
  bool changed; /* this scope exchanged the mode (the outermost) */
  CUstreamCaptureMode prev;
} weft__relaxed_t;
weft__relaxed_t weft__relax(const weft__driver_t *drv);
void weft__unrelax(const weft__driver_t *drv, weft__relaxed_t r);
/** `stmt` (driver calls) in a RELAXED scope. */
#define WEFT__RELAXED(drv, stmt)                           \
  do {                                                     \
    weft__relaxed_t weft__rx_ = weft__relax(drv);          \
    stmt;                                                  \
    weft__unrelax((drv), weft__rx_);                       \
  } while (0)

/** Shorthand for the common pattern: on failure of the driver call `expr`, return its status. */
#define WEFT__CU_TRY(expr)                                          \
  do {                                                              \
    CUresult weft__r_ = (expr);                                     \
    if (weft__r_ != CUDA_SUCCESS) return weft__driver_fail(weft__r_, #expr); \
  } while (0)

#endif /* WEFT_CORE_DRIVER_H */
