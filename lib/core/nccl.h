/* The NCCL boundary: the one table of NCCL entry points weft calls, loaded at run time like the
 * driver (driver.h), never linked.
 *
 * WEFT_NCCL names the library: unset or empty, "libnccl.so.2" (the system's, or PyTorch's when
 * it is already loaded); "sim", the simulated NCCL of the loaded simulator (WEFT_DRIVER=sim);
 * anything else, a path. Entry points come from dlsym of nccl.h's names, checked against the
 * signatures of the nccl.h weft compiled with (2.28).
 */
#ifndef WEFT_CORE_NCCL_H
#define WEFT_CORE_NCCL_H

#include <nccl.h>

#include "weft/weft.h"

#define WEFT_NCCL_FUNCS(X) \
  X(ncclGetVersion)        \
  X(ncclGetUniqueId)       \
  X(ncclCommInitRank)      \
  X(ncclCommInitAll)       \
  X(ncclCommDestroy)       \
  X(ncclCommAbort)         \
  X(ncclCommCount)         \
  X(ncclCommCuDevice)      \
  X(ncclCommUserRank)      \
  X(ncclCommGetAsyncError) \
  X(ncclAllReduce)         \
  X(ncclBroadcast)         \
  X(ncclReduce)            \
  X(ncclAllGather)         \
  X(ncclReduceScatter)     \
  X(ncclSend)              \
  X(ncclRecv)              \
  X(ncclGroupStart)        \
  X(ncclGroupEnd)          \
  X(ncclGetErrorString)    \
  X(ncclGetLastError)

/** The loaded NCCL. Immutable after weft__nccl_get() returned it. */
typedef struct weft__nccl {
#define WEFT__NCCL_MEMBER(name) __typeof__(name) *name;
  WEFT_NCCL_FUNCS(WEFT__NCCL_MEMBER)
#undef WEFT__NCCL_MEMBER
  void *handle; /* dlopen handle (NULL for the simulator's) */
  int version;  /* ncclGetVersion */
  char path[256];
} weft__nccl_t;

/** The process's NCCL, loading it on first use (thread-safe, once).
 * Errors: WEFT_ERR_NOT_SUPPORTED with the reason (no library, a missing entry point, WEFT_NCCL=sim
 * without the simulator as the driver); repeated on every call. */
weft_status_t weft__nccl_get(const weft__nccl_t **out);

/** Records NCCL's failure `r` of `what` (with NCCL's own message) and returns WEFT_ERR_COMM, or
 * WEFT_ERR_INVALID_ARGUMENT for ncclInvalidArgument / ncclInvalidUsage. */
weft_status_t weft__nccl_fail(const weft__nccl_t *n, ncclResult_t r, const char *what);

#endif /* WEFT_CORE_NCCL_H */
