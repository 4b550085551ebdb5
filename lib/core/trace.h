/* The timeline trace (weft_trace_start, WEFT_TRACE=path): Chrome / Perfetto trace-event JSON,
 * written as it happens (bounded memory: nothing is kept but the file). One track per stream
 * (pid = device, tid = stream index); uses are slices, each wait weft inserts is a flow arrow
 * from the event record it waits on to the waiting stream, allocations and frees are instants.
 * Host timestamps (CLOCK_MONOTONIC, microseconds). Every function is a no-op while no trace is
 * open; weft__trace_on() is the one cheap check callers make first. Thread-safe. */
#ifndef WEFT_CORE_TRACE_H
#define WEFT_CORE_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern _Atomic int weft__trace_active;

/** Whether a trace is being written. */
static inline bool weft__trace_on(void) { return atomic_load_explicit(&weft__trace_active, memory_order_relaxed) != 0; }
/** Microseconds of CLOCK_MONOTONIC. */
uint64_t weft__trace_now_us(void);
/** Opens the trace named by WEFT_TRACE once per process, if set (called when a runtime is made). */
void weft__trace_from_env(void);
/** A slice on (device, stream) from ts for dur microseconds; args_json is a JSON object or NULL. */
void weft__trace_slice(int device, unsigned stream, const char *name, uint64_t ts, uint64_t dur, const char *args_json);
/** An instant event on (device, stream). */
void weft__trace_instant(int device, unsigned stream, const char *name, const char *args_json);
/** A wait weft inserted: a flow arrow from stream `from` at `recorded_us` (when the event waited
 * on was recorded) to stream `to` now. One arrow per wait. */
void weft__trace_wait(int device, unsigned from, uint64_t recorded_us, unsigned to);
/** Appends s to buf (at *at, capacity cap, kept NUL-terminated) as a JSON string body (escaped,
 * no quotes), as far as it fits; returns how many bytes of s it took. Shared by the trace and the
 * memory snapshot. */
size_t weft__json_escape(char *buf, size_t *at, size_t cap, const char *s);

#endif /* WEFT_CORE_TRACE_H */
