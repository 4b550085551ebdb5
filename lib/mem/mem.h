/* lib/mem internals shared by the resource files: size checks, statistics bookkeeping, the
 * resource lock, and the helpers every resource uses to reach its runtime's tracker.
 *
 * Locks: every resource has one pthread mutex of rank 20 (streams/tracker.h lists the ranks). A
 * resource may call tracker functions (rank 30) while holding it, never the reverse. A resource
 * may also call its upstream while holding its own lock: stacks are acyclic (an upstream never
 * calls down), so nested resource locks are always taken top to bottom of one stack.
 */
#ifndef WEFT_MEM_MEM_H
#define WEFT_MEM_MEM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "lib/core/debug.h"
#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/tracker.h"
#include "weft/weft.h"

/* The largest request any resource accepts: 2^48 bytes (256 TiB), far above any device and low
 * enough that adding alignment, canaries or chunk rounding can never overflow 64 bits. */
#define WEFT__MEM_MAX_BYTES (1ull << 48)

/* weft_resource_t.ops->name of each built-in resource, also used to recognise them. */
extern const weft_resource_ops_t weft__direct_ops, weft__async_ops, weft__pool_ops, weft__budget_ops,
    weft__logging_ops, weft__stats_ops, weft__guard_ops;

/** Checks a request size: INVALID_ARGUMENT naming `who` for 0 and for more than
 * WEFT__MEM_MAX_BYTES. */
weft_status_t weft__mem_check_bytes(const char *who, size_t bytes);

/** The tracker of `rt`, or NULL after recording INVALID_ARGUMENT (rt NULL) or STALE_HANDLE (the
 * runtime hook's answer) for `who`; *status receives the code. */
weft__tracker_t *weft__mem_tracker(const char *who, weft_runtime_t *rt, weft_status_t *status);

/** Checks that `s` is a stream of `tr` (WRONG_DEVICE otherwise, INVALID_ARGUMENT when NULL). */
weft_status_t weft__mem_check_stream(const char *who, const weft__tracker_t *tr, const weft_stream_t *s);

/** Checks an adaptor's upstream: not NULL, has allocate and deallocate, and serves `rt`. */
weft_status_t weft__mem_check_upstream(const char *who, weft_runtime_t *rt, const weft_resource_t *up);

/** Initialises a resource mutex (rank 20). */
weft_status_t weft__mem_lock_init(pthread_mutex_t *m, const char *who);

/* Statistics bookkeeping on a weft_resource_stats_t; the caller holds the resource's lock (or
 * owns the struct alone). */
static inline void weft__rstats_live(weft_resource_stats_t *st, uint64_t bytes) {
  st->live_bytes += bytes;
  if (st->live_bytes > st->live_peak) st->live_peak = st->live_bytes;
  st->allocs++;
}
static inline void weft__rstats_unlive(weft_resource_stats_t *st, uint64_t bytes) {
  WEFT_ASSERT_INTERNAL(st->live_bytes >= bytes);
  st->live_bytes -= bytes;
  st->frees++;
}
static inline void weft__rstats_reserve(weft_resource_stats_t *st, uint64_t bytes) {
  st->reserved_bytes += bytes;
  if (st->reserved_bytes > st->reserved_peak) st->reserved_peak = st->reserved_bytes;
}
static inline void weft__rstats_unreserve(weft_resource_stats_t *st, uint64_t bytes) {
  WEFT_ASSERT_INTERNAL(st->reserved_bytes >= bytes);
  st->reserved_bytes -= bytes;
}

/** True when any pool stream of `tr` is capturing (or the query fails): pool housekeeping that a
 * capture could see (attributes, trims) must not run then. Sets CAPTURE / DRIVER for `who`. */
weft_status_t weft__mem_check_no_capture(const char *who, weft__tracker_t *tr);

#endif /* WEFT_MEM_MEM_H */
