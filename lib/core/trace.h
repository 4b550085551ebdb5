/* The timeline trace (weft_trace_start, WEFT_TRACE=path): Chrome / Perfetto trace-event JSON,
 * written as it happens (bounded memory: nothing is kept but the file). One track per stream
 * (pid = device, tid = stream index); uses are slices, each wait weft inserts is a flow arrow
 * from the event record it waits on to the waiting stream, allocations and frees are instants.
 * Host timestamps (CLOCK_MONOTONIC, microseconds); device ones on request (below). Every function is a no-op while no trace is
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
/** The track of a stream: its pool index, or, while it takes part in the capture whose driver id
 * is capture_id (> 0), a track of that capture's own (named "capture C, stream S"). */
unsigned weft__trace_tid(unsigned stream, uint64_t capture_id);

/* ---- device timestamps (WEFT_TRACE_DEVICE=1 while a trace is written) ----------------------
 * Each use on a live stream gets a pair of timing events around its work (after its waits,
 * before its record) and a second slice on the track "stream S (device)", placed on the host's
 * clock through one base event per device (recorded and synchronised when the first span
 * begins, so device times are shifted by at most that synchronisation's latency). Spans wait in
 * a bounded list; when it is full, and at weft_trace_stop or weft__trace_device_flush, their
 * events are synchronised and written. Adds two event records per use and host waits on
 * flushes: a debugging mode. */
typedef struct weft__trace_span weft__trace_span_t;
struct weft__driver;
extern _Atomic bool weft__trace_device_wanted;
/** Whether device timestamps are wanted (a trace is open and WEFT_TRACE_DEVICE=1). */
static inline bool weft__trace_device_on(void) {
  return weft__trace_on() && atomic_load_explicit(&weft__trace_device_wanted, memory_order_relaxed);
}
/** Records a span's start on `raw` (a live stream, current context); NULL if no span could be
 * made (the trace then has no device slice for this use). */
weft__trace_span_t *weft__trace_device_begin(const struct weft__driver *drv, int device, unsigned stream, void *raw);
/** Records the span's end on `raw`. The next slice written by this thread for the same stream
 * (weft__trace_slice) names it; a span never named is dropped. */
void weft__trace_device_end(weft__trace_span_t *sp, void *raw);
/** Forgets a span begun but not ended (its work failed). */
void weft__trace_device_drop(weft__trace_span_t *sp);
/** Writes every waiting span of `device` (synchronising their events) and forgets its base:
 * before the device's context goes (the runtime's release). */
void weft__trace_device_flush(int device);

/** Appends s to buf (at *at, capacity cap, kept NUL-terminated) as a JSON string body (escaped,
 * no quotes), as far as it fits; returns how many bytes of s it took. Shared by the trace and the
 * memory snapshot. */
size_t weft__json_escape(char *buf, size_t *at, size_t cap, const char *s);

#endif /* WEFT_CORE_TRACE_H */
