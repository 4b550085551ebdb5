/* Every driver entry point the simulator exports, as X(cuda.h name), then the NCCL functions of
 * its simulated NCCL (nccl.c).
 *
 * One list gives each function an id (sim__fn_t) for fault injection ("cuMemAlloc:3:2") and call
 * counting. The names are the *base* cuda.h names; X() must only stringify (#) or paste (##) its
 * argument so that cuda.h's versioning macros (cuMemAlloc -> cuMemAlloc_v2) never expand here.
 * It is lib/core/driver.h's WEFT_DRIVER_FUNCS, kept separately because sim/ may not include lib/.
 */
#ifndef WEFT_SIM_FUNCS_H
#define WEFT_SIM_FUNCS_H

#define SIM_FUNCS(X)                      \
  X(cuInit)                               \
  X(cuDriverGetVersion)                   \
  X(cuGetErrorName)                       \
  X(cuGetErrorString)                     \
  X(cuDeviceGet)                          \
  X(cuDeviceGetCount)                     \
  X(cuDeviceGetName)                      \
  X(cuDeviceGetAttribute)                 \
  X(cuDeviceTotalMem)                     \
  X(cuDevicePrimaryCtxRetain)             \
  X(cuDevicePrimaryCtxRelease)            \
  X(cuCtxSetCurrent)                      \
  X(cuCtxGetCurrent)                      \
  X(cuCtxSynchronize)                     \
  X(cuCtxGetStreamPriorityRange)          \
  X(cuStreamCreateWithPriority)           \
  X(cuStreamDestroy)                      \
  X(cuStreamQuery)                        \
  X(cuStreamSynchronize)                  \
  X(cuStreamWaitEvent)                    \
  X(cuStreamGetPriority)                  \
  X(cuStreamGetFlags)                     \
  X(cuStreamGetId)                        \
  X(cuStreamBeginCapture)                 \
  X(cuStreamEndCapture)                   \
  X(cuStreamIsCapturing)                  \
  X(cuStreamGetCaptureInfo)               \
  X(cuStreamUpdateCaptureDependencies)    \
  X(cuThreadExchangeStreamCaptureMode)    \
  X(cuStreamSetAttribute)                 \
  X(cuLaunchHostFunc)                     \
  X(cuStreamWriteValue32)                 \
  X(cuStreamWriteValue64)                 \
  X(cuStreamWaitValue32)                  \
  X(cuStreamWaitValue64)                  \
  X(cuEventCreate)                        \
  X(cuEventRecord)                        \
  X(cuEventRecordWithFlags)               \
  X(cuEventQuery)                         \
  X(cuEventSynchronize)                   \
  X(cuEventDestroy)                       \
  X(cuEventElapsedTime)                   \
  X(cuMemAlloc)                           \
  X(cuMemHostAlloc)                       \
  X(cuMemFreeHost)                        \
  X(cuPointerGetAttribute)                \
  X(cuMemFree)                            \
  X(cuMemGetInfo)                         \
  X(cuMemcpyHtoD)                         \
  X(cuMemcpyDtoH)                         \
  X(cuMemcpyHtoDAsync)                    \
  X(cuMemcpyDtoHAsync)                    \
  X(cuMemcpyDtoDAsync)                    \
  X(cuMemsetD8Async)                      \
  X(cuMemsetD32Async)                     \
  X(cuMemPoolCreate)                      \
  X(cuMemPoolDestroy)                     \
  X(cuMemPoolSetAttribute)                \
  X(cuMemPoolGetAttribute)                \
  X(cuMemPoolTrimTo)                      \
  X(cuMemPoolExportToShareableHandle)     \
  X(cuMemAllocFromPoolAsync)              \
  X(cuMemAllocAsync)                      \
  X(cuMemFreeAsync)                       \
  X(cuModuleLoadData)                     \
  X(cuModuleUnload)                       \
  X(cuModuleGetFunction)                  \
  X(cuLaunchKernel)                       \
  X(cuGraphCreate)                        \
  X(cuGraphDestroy)                       \
  X(cuGraphAddKernelNode)                 \
  X(cuGraphAddMemcpyNode)                 \
  X(cuGraphAddMemsetNode)                 \
  X(cuGraphAddHostNode)                   \
  X(cuGraphAddEmptyNode)                  \
  X(cuGraphAddEventRecordNode)            \
  X(cuGraphAddEventWaitNode)              \
  X(cuGraphAddMemAllocNode)               \
  X(cuGraphAddMemFreeNode)                \
  X(cuGraphMemAllocNodeGetParams)         \
  X(cuGraphAddDependencies)               \
  X(cuGraphGetNodes)                      \
  X(cuGraphGetEdges)                      \
  X(cuGraphNodeGetType)                   \
  X(cuGraphInstantiateWithFlags)          \
  X(cuGraphUpload)                        \
  X(cuGraphLaunch)                        \
  X(cuGraphExecDestroy)                   \
  X(cuDeviceGetGraphMemAttribute)         \
  X(cuDeviceSetGraphMemAttribute)         \
  X(cuDeviceGraphMemTrim)                 \
  X(cuDeviceCanAccessPeer)                \
  X(cuCtxEnablePeerAccess)                \
  X(cuCtxDisablePeerAccess)               \
  X(cuMemPoolSetAccess)                   \
  X(cuMemPoolGetAccess)                   \
  X(cuMemcpyPeerAsync)                    \
  X(ncclGetVersion)                       \
  X(ncclGetUniqueId)                      \
  X(ncclCommInitAll)                      \
  X(ncclCommInitRank)                     \
  X(ncclCommInitRankConfig)               \
  X(ncclCommDestroy)                      \
  X(ncclCommAbort)                        \
  X(ncclCommFinalize)                     \
  X(ncclCommCount)                        \
  X(ncclCommCuDevice)                     \
  X(ncclCommUserRank)                     \
  X(ncclCommGetAsyncError)                \
  X(ncclAllReduce)                        \
  X(ncclBroadcast)                        \
  X(ncclReduce)                           \
  X(ncclAllGather)                        \
  X(ncclReduceScatter)                    \
  X(ncclSend)                             \
  X(ncclRecv)                             \
  X(ncclGroupStart)                       \
  X(ncclGroupEnd)

typedef enum sim__fn {
#define SIM__FN_ENUM(name) SIM_FN_##name,
  SIM_FUNCS(SIM__FN_ENUM)
#undef SIM__FN_ENUM
  SIM_FN_COUNT
} sim__fn_t;

#endif /* WEFT_SIM_FUNCS_H */
