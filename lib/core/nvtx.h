/* NVTX ranges and marks in a "weft" domain (NVTX v3, header-only, from the CUDA toolkit), for
 * Nsight Systems and other NVTX tools: uses, the waits weft inserts, allocations and frees (tags
 * and sizes), captures, instantiation and graph launches. A tool attaches through
 * NVTX_INJECTION64_PATH (nsys sets it); without one every call here is a test of a flag read
 * once, and no message is formatted. Works on the simulator too (no driver involved). */
#ifndef WEFT_CORE_NVTX_H
#define WEFT_CORE_NVTX_H

#include <stdbool.h>

/** Whether an NVTX tool is attached (NVTX_INJECTION64_PATH was set at first use). */
bool weft__nvtx_on(void);
/** A mark / a range pushed / the innermost range popped, in the weft domain (no-ops without a tool). */
void weft__nvtx_mark(const char *message);
void weft__nvtx_push(const char *message);
void weft__nvtx_pop(void);

#endif /* WEFT_CORE_NVTX_H */
