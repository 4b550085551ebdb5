/* streams/: the stream pool, per-stream event rings and the access tracker (vector clocks).
 *
 * The model (DESIGN.md, "The tracker"):
 *   - every pool stream s has a tick counter; tick k names the k-th recorded use on s, and the
 *     ring event recorded right after that use's work;
 *   - known[s][t] is the newest tick of stream t that work enqueued on s from now on is ordered
 *     after (directly or transitively); known[s][s] = tick[s];
 *   - each ring slot keeps the recording stream's clock (its known[] row) at the time of the
 *     record, so a wait merges the waited stream's knowledge and never re-issues an implied wait;
 *   - host_known[t] is the newest tick of t the host has seen complete (sync or query): no
 *     stream waits for it again;
 *   - each block's weft__access_state_t keeps its last write point and the newest read tick per
 *     stream since that write.
 * A use on s with accesses A waits for the maximal conflicting points not already implied; their
 * number is the number of cross-stream edges of the transitive reduction of the dependency graph.
 *
 * Points: (stream, tick) with tick 0 meaning "nothing". A stream whose known[] row grew by waits
 * since its last record is "dirty"; weft__tracker_point() then gives it a new tick whose event is
 * recorded lazily (when first waited on, or before the stream's next use), so that frees and
 * imports, which wait without doing work, are still captured by a point.
 *
 * Locks (ranks; take only in increasing rank): runtime registry (lib/runtime.c) 10 < resource
 * locks (lib/mem) 20 < tracker lock 30. The tracker never calls out of streams/ while holding its
 * lock, except to the driver.
 */
#ifndef WEFT_STREAMS_TRACKER_H
#define WEFT_STREAMS_TRACKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "lib/core/driver.h"

#define WEFT__MAX_STREAMS 64

/** A position in a stream: all work enqueued on `stream` up to tick `tick`. */
typedef struct weft__point {
  uint32_t stream; /* pool index */
  uint64_t tick;   /* 0: no work (always complete) */
} weft__point_t;

/** Per-block access history; embedded in each block record, zeroed for a new block. */
typedef struct weft__access_state {
  weft__point_t write;  /* last write (or the allocation point) */
  uint64_t reader_mask; /* bit t: stream t read since the write */
  uint64_t *reads;      /* [stream_count]: newest read tick per stream since the write; owned by
                           the record, valid where reader_mask has the bit */
} weft__access_state_t;

/** One access of a use, as the tracker sees it. */
typedef struct weft__use {
  weft__access_state_t *state;
  unsigned kind; /* weft_access_kind_t */
} weft__use_t;

typedef struct weft__tracker weft__tracker_t;
typedef struct weft__capture weft__capture_t;

/** One stream's clock state within a domain: its ticks and the ring of events that mark them. */
typedef struct weft__lane {
  uint64_t tick;        /* newest tick handed out on this stream in this domain */
  uint64_t recorded;    /* newest tick whose event is recorded (== tick unless one is pending) */
  bool dirty;           /* the stream's row grew by waits (or it got untracked work) since tick */
  CUevent *ring;        /* [ring_size] events, created lazily in capture domains */
  uint64_t *ring_tick;  /* [ring_size] tick recorded in each slot (0: empty) */
  uint64_t *ring_clock; /* [ring_size * n] clock snapshot per slot */
} weft__lane_t;

/** A clock domain: the live one (work that runs as it is enqueued) or one per capture (work
 * that becomes graph nodes). Ticks and events never cross domains: a capture's events are
 * recorded inside the capture and only waited on inside it, so no wait can raise
 * STREAM_CAPTURE_ISOLATION, and captured work never counts as done for live streams. */
typedef struct weft__domain {
  unsigned n, ring_size;
  uint64_t *known;      /* [n * n], row s = known[s][*] */
  uint64_t *host_known; /* [n]; stays 0 in capture domains (nothing captured runs) */
  weft__lane_t lane[WEFT__MAX_STREAMS];
  weft__capture_t *capture; /* NULL for the live domain */
} weft__domain_t;

/** A pool stream. Fields after `raw` are guarded by the tracker lock. */
struct weft_stream {
  weft__tracker_t *tr;   /* owner */
  void *runtime;         /* the weft_runtime_t it belongs to (opaque here) */
  unsigned index;        /* position in the pool */
  int priority;          /* driver priority value */
  bool high;             /* one of the high-priority streams */
  CUstream raw;          /* CU_STREAM_NON_BLOCKING */
  uint64_t last_used;    /* tracker-wide use sequence at the last use here (LRU) */
  weft__capture_t *capture; /* the capture this stream takes part in, or NULL */
  /* Set once code outside weft may have touched the raw stream (weft_stream_raw gave it out, or
   * it waited on an outside event): only then can a capture weft did not begin reach it, so only
   * then does weft ask the driver about it before each call (weft__capture_sync_state). */
  _Atomic bool exposed;
};

/** A capture session as the tracker sees it: its clock domain, which pool streams take part,
 * and the capture-local history of every block touched inside it (the access summary). The
 * graph layer (graph/) owns the rest: memory nodes, outputs, the graph object. */
typedef struct weft__capture_block {
  weft__access_state_t *live; /* the block's live history (key) */
  weft__access_state_t local; /* its history inside the capture */
  unsigned kind;              /* union of the kinds used inside the capture */
  bool internal;              /* allocated inside the capture: not part of the summary */
} weft__capture_block_t;

struct weft__capture {
  weft__domain_t dom;
  weft__tracker_t *tr;
  weft_stream_t *origin;
  uint64_t id;                /* the driver's capture id */
  uint64_t joined;            /* bit mask of pool streams taking part (origin included) */
  CUstreamCaptureMode mode;
  bool foreign;               /* begun by code outside weft */
  pthread_t thread;           /* the beginning thread (THREAD_LOCAL / GLOBAL must end there) */
  weft__capture_block_t *blocks; /* [count], grown by doubling */
  size_t count, cap;
  size_t *index;              /* open-addressing hash: live pointer -> blocks index + 1 */
  size_t index_cap;
  void *owner;                /* graph/'s session object */
};

/** The tracker of one runtime: its device context, stream pool and live clocks. */
struct weft__tracker {
  pthread_mutex_t lock;   /* rank 30 */
  const weft__driver_t *drv;
  CUdevice device;
  CUcontext ctx;          /* the device's primary context, retained */
  int ordinal;
  unsigned n;             /* streams */
  unsigned n_high;        /* the last n_high streams are high priority */
  unsigned ring_size;     /* power of two */
  /* Embedded (never freed), so a stream handle outlives its runtime's release and is then
   * reported stale instead of dangling. Entries [0, n) are live. */
  weft_stream_t streams[WEFT__MAX_STREAMS];
  weft__domain_t live;
  uint64_t use_seq;       /* uses so far (LRU clock) */
  unsigned rr[2];         /* round-robin cursors per priority */
  unsigned captures;      /* active captures (any mode) on this runtime's streams */
  unsigned strict_captures; /* of those, GLOBAL mode: housekeeping must wait */
  bool no_waits;          /* testing: issue no waits at all (positive controls) */
  bool mem_ops64;         /* CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS */
  weft_counters_t counters;
};

/** Creates `n` streams (the last n_high high priority) with rings of `ring_size` events on the
 * primary context of `ordinal`. On failure nothing is left behind. */
weft_status_t weft__tracker_init(weft__tracker_t *tr, const weft__driver_t *drv, int ordinal, unsigned n,
                                 unsigned n_high, unsigned ring_size, void *runtime);
/** Synchronises and destroys streams and events; releases the context. */
void weft__tracker_destroy(weft__tracker_t *tr);
/** Makes the tracker's context current on the calling thread (cheap when it already is). */
weft_status_t weft__tracker_bind(weft__tracker_t *tr);

/** Creates a lane's events and ring if it has none yet. */
weft_status_t weft__lane_init(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l);
/** Destroys a lane's events and ring (tracker lock held or the domain unreachable). */
void weft__lane_free(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l);
/** Allocates a domain's clocks for n streams (rings are created lazily). */
weft_status_t weft__domain_init(weft__domain_t *d, unsigned n, unsigned ring_size, weft__capture_t *capture);
/** Frees a domain's clocks and every lane's events. */
void weft__domain_free(weft__tracker_t *tr, weft__domain_t *d);

/** Zeroes a new block's history; `reads` must have room for tr->n ticks. Sets the write point
 * to `alloc_point` (the allocation's position: later uses elsewhere wait for it). */
void weft__access_init(weft__access_state_t *st, uint64_t *reads, weft__point_t alloc_point);

/** Issues the waits `uses` need on s (see the file comment). Takes the tracker lock. On a driver
 * failure returns it; waits issued before the failure stay (harmless, conservative). */
weft_status_t weft__tracker_begin(weft_stream_t *s, const weft__use_t *uses, size_t n);
/** Records the work enqueued since begin: a new tick and ring event on s, and the accesses. */
weft_status_t weft__tracker_end(weft_stream_t *s, const weft__use_t *uses, size_t n);
/** begin; fn(arg) (enqueues the work; its failure aborts the use); end: atomically. */
weft_status_t weft__tracker_use(weft_stream_t *s, const weft__use_t *uses, size_t n,
                                weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg);

/** The point covering all work and waits enqueued on s so far (may hand out a pending tick). */
weft__point_t weft__tracker_point(weft_stream_t *s);
/** True when work enqueued on s from now on is ordered after p without a new wait. */
bool weft__tracker_is_ordered(weft_stream_t *s, weft__point_t p);
/** Makes s wait for p unless already ordered (at most one cuStreamWaitEvent). */
weft_status_t weft__tracker_order(weft_stream_t *s, weft__point_t p);
/** Non-blocking: true if p is complete (then the host knows it). Never call under capture. */
bool weft__tracker_poll(weft__tracker_t *tr, weft__point_t p);
/** The point a new access of `kind` to a block with history st would wait for: for writes, the
 * newest of write and reads, as a set; this returns their count and fills out[] (<= n+1). */
size_t weft__tracker_conflicts(weft__tracker_t *tr, const weft__access_state_t *st, unsigned kind, weft__point_t *out);

/** Host synchronisation, adding host knowledge. */
weft_status_t weft__tracker_sync_stream(weft_stream_t *s);
weft_status_t weft__tracker_sync_all(weft__tracker_t *tr);
weft_status_t weft__tracker_sync_points(weft__tracker_t *tr, const weft__point_t *pts, size_t n);
/** Queries s (CUDA_ERROR_NOT_READY → WEFT_ERR_NOT_READY); success adds host knowledge. */
weft_status_t weft__tracker_query_stream(weft_stream_t *s);

/** The stream of priority `high` needing the fewest waits for `uses`, ties to the LRU. */
weft_stream_t *weft__tracker_auto(weft__tracker_t *tr, bool high, const weft__use_t *uses, size_t n);
/** Notes work on s that the tracker did not enqueue (a stream-ordered allocation, say): later
 * points of s cover it. */
void weft__tracker_touch(weft_stream_t *s);
/** Makes s wait for an outside event / stream; s becomes dirty (later points cover it). */
weft_status_t weft__tracker_import_event(weft_stream_t *s, CUevent ev);

/* ---- captures (streams/capture.c) ---------------------------------------------------------- */

/** Begins a weft capture on s (cuStreamBeginCapture in `mode`), or adopts a foreign one already
 * active on s (`foreign`, with its driver id). s takes part; its later uses are captured.
 * Errors: CAPTURE (s already takes part in a capture), DRIVER, HOST_OUT_OF_MEMORY. */
weft_status_t weft__capture_begin(weft_stream_t *s, CUstreamCaptureMode mode, bool foreign, uint64_t id,
                                  weft__capture_t **out);
/** Pulls pool stream t into c (t waits on a captured event of the origin: a fork). */
weft_status_t weft__capture_join(weft__capture_t *c, weft_stream_t *t);
/** Rejoins every forked stream to the origin, ends the capture (cuStreamEndCapture) and gives
 * the graph. The session stays readable (its blocks) until weft__capture_free(). On failure the
 * capture is ended anyway (no stream is left capturing) and *graph is NULL. */
weft_status_t weft__capture_end(weft__capture_t *c, CUgraph *graph);
/** Forgets a foreign capture that its owner ended (no driver calls on the graph). */
void weft__capture_abandon(weft__capture_t *c);
/** Frees the session's memory and events (after end or abandon). */
void weft__capture_free(weft__capture_t *c);
/** The capture-local record of a block, creating it (internal blocks are those allocated inside
 * the capture). NULL when out of host memory. Tracker lock held by the caller. */
weft__capture_block_t *weft__capture_block(weft__capture_t *c, weft__access_state_t *live, bool internal);
/** True while a capture could see driver housekeeping done by this thread now (event queries,
 * pool attributes, synchronisations): any GLOBAL capture of the runtime, or a THREAD_LOCAL
 * one begun by this thread. */
bool weft__capture_blocks_housekeeping(weft__tracker_t *tr);
/** Drops foreign captures that their owners have ended (so that they stop holding back
 * housekeeping). Takes the tracker lock; call it without locks held. */
void weft__capture_refresh(weft__tracker_t *tr);
/** Called when a foreign capture is adopted (true) or dropped (false); graph/ sets it to keep
 * its side of the session. */
extern void (*weft__capture_foreign_hook)(weft__capture_t *c, bool adopted);
/** Checks that s is in the capture state weft believes, adopting a foreign capture begun on s
 * or dropping one that its owner ended. Called by every public function taking a stream; costs
 * one driver query for exposed streams (and those in a foreign capture), nothing otherwise. */
weft_status_t weft__capture_sync_state(weft_stream_t *s);

/** Checks the clock invariants (rows dominate their ring snapshots, known[s][s] == tick,
 * host_known <= ticks). Takes the lock. */
bool weft__tracker_is_valid(weft__tracker_t *tr);

/** The one upward hook (implemented by lib/runtime.c): a runtime handle's tracker, or NULL with
 * STALE_HANDLE recorded in weft_last_error() when the runtime was released. Lets lower layers
 * (lib/mem) take weft_runtime_t* in their public constructors. */
weft__tracker_t *weft__runtime_tracker(weft_runtime_t *rt);

#endif /* WEFT_STREAMS_TRACKER_H */
