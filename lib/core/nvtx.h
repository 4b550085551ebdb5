/* NVTX ranges and marks in a "weft" domain (NVTX v3, header-only, from the CUDA toolkit), for
 * Nsight Systems and other NVTX tools: uses, the waits weft inserts, allocations and frees (tags
 * and sizes), captures, instantiation and graph launches. A tool attaches through
 * NVTX_INJECTION64_PATH (nsys sets it); without one every call here is a test of a flag read
 * once, and no message is formatted. Works on the simulator too (no driver involved). */
#ifndef WEFT_CORE_NVTX_H
#define WEFT_CORE_NVTX_H

#include <stdatomic.h>
#include <stdbool.h>

/* 0: not asked yet, 1: no tool, 2: a tool is attached (nvtx.c). */
extern _Atomic int weft__nvtx_state;
/** Reads NVTX_INJECTION64_PATH once and creates the domain when a tool is attached. */
bool weft__nvtx_init(void);
/** Whether an NVTX tool is attached: one relaxed load on the hot path. */
static inline bool weft__nvtx_on(void) {
  int s = atomic_load_explicit(&weft__nvtx_state, memory_order_acquire);
  return s == 0 ? weft__nvtx_init() : s == 2;
}
/** A mark / a range pushed / the innermost range popped, in the weft domain (no-ops without a
 * tool: the check is inline, the call out of line). */
void weft__nvtx_mark_on(const char *message);
void weft__nvtx_push_on(const char *message);
void weft__nvtx_pop_on(void);
static inline void weft__nvtx_mark(const char *message) {
  if (weft__nvtx_on()) weft__nvtx_mark_on(message);
}
static inline void weft__nvtx_push(const char *message) {
  if (weft__nvtx_on()) weft__nvtx_push_on(message);
}
static inline void weft__nvtx_pop(void) {
  if (weft__nvtx_on()) weft__nvtx_pop_on();
}

#endif /* WEFT_CORE_NVTX_H */
