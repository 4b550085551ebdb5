/* streams/: the stream pool, its clocks, and the access tracker that orders work between streams.
 *
 * The model (README.md, "Concepts"; each piece is stated here):
 *   - every pool stream s has a tick counter; tick k names the k-th recorded point of s, and the
 *     ring event recorded right after the work it covers;
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
 * Points: (stream, tick) with tick 0 meaning "nothing". A tick may be *pending*: handed out (as a
 * point, or to a use whose work is enqueued) before its event is recorded. Its event is recorded
 * before anything else weft enqueues on that stream, and by anyone who must wait for it first;
 * a stream has at most one pending tick, and work enqueued meanwhile joins it. With lazy records
 * (weft__lane_t.deferred) a use's own tick stays pending and later uses join it too, until
 * another stream or the host needs it (a stream that was once waited on late turns eager:
 * weft__lane_t).
 *
 * Files: clock.c (domains, rings, the record and wait every other file builds on), tracker.c
 * (life cycle, uses, points, host knowledge), capture.c (capture sessions' clocks).
 *
 * Locks (ranks; take only in increasing rank): runtime registry 10 < a runtime's block table 15
 * < resources 20 < tracker 30. The tracker lock is one for the whole process (every runtime's
 * streams are lanes of one live clock domain, so that waits stay minimal across devices). The
 * tracker never calls out of streams/ while holding it, except to the driver.
 *
 * Busy lanes: a live use with its work (weft__tracker_use) enqueues that work without the lock,
 * so that threads driving different streams (different devices above all) enqueue in parallel.
 * Under the lock it issues its waits and records its accesses at a pending tick of its stream,
 * and marks the stream's lane busy; it enqueues the work unlocked; under the lock again it
 * records the tick's event (or leaves it deferred) and clears the lane, or, if the work failed,
 * puts the histories and the lane back as they were. A use that leaves its tick deferred (lazy
 * records, the common case: tracker.c, use_live) finishes everything but its stream's published
 * point before the work, and after it publishes the point and clears the lane without the lock
 * (the busy set is atomic, weft__lanes_atomic_t); only a failed work takes the lock again. A
 * joint use (an NCCL group) whose every stream defers does the same for all its streams. A
 * thread that waits for a busy lane therefore counts itself a waiter and looks again before it
 * sleeps (weft__clock_idle_wait), so that the clearing thread, which wakes the counted waiters,
 * cannot miss it (tests/streams/test_busy_lanes). While a lane is busy nobody else enqueues
 * on its stream, records on it, or waits for its pending tick: whoever must (a use of the same
 * stream, a use that conflicts with the busy use's accesses, a host wait) first waits until the
 * lane is idle (weft__clock_idle), then looks again. Nothing else observes a busy use's pending
 * tick, which is why putting it back is sound. A need of an older tick of a busy lane, whose
 * event is recorded, is waited for as it is: a thread stopped inside a busy use (an enqueue
 * waiting for room in a full queue) holds back nobody who needs only its earlier work (another
 * rank's thread, whose collectives that queue waits for).
 */
#ifndef WEFT_STREAMS_TRACKER_H
#define WEFT_STREAMS_TRACKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "lib/core/container.h"
#include "lib/core/driver.h"
#include "lib/core/lock.h"
#include "lib/core/trace.h"

#define WEFT__MAX_STREAMS 64

/* Lanes: the process has one live clock domain for the streams of all its runtimes, so that
 * waits stay minimal across devices as on one device. Runtime r's streams are its lanes
 * [tr->base, tr->base + tr->n) there; a capture's domain numbers only its runtime's streams, by
 * their index. A set of lanes is a weft__lanes_t. */
#define WEFT__MAX_LANES 128
typedef unsigned __int128 weft__lanes_t;
static inline weft__lanes_t weft__lane_bit(unsigned i) { return (weft__lanes_t)1 << i; }
/** Whether lane i is in m: one 64-bit word tested, shorter code than m & weft__lane_bit(i). */
static inline bool weft__lanes_has(weft__lanes_t m, unsigned i) {
  uint64_t w = (i & 64u) != 0 ? (uint64_t)(m >> 64) : (uint64_t)m;
  return ((w >> (i & 63u)) & 1u) != 0;
}
/** The lowest lane of a non-empty set. */
static inline unsigned weft__lanes_first(weft__lanes_t m) {
  uint64_t lo = (uint64_t)m;
  return lo != 0 ? (unsigned)__builtin_ctzll(lo) : 64u + (unsigned)__builtin_ctzll((uint64_t)(m >> 64));
}

/** A set of lanes that a thread not holding the tracker lock may leave: the live domain's busy
 * lanes (above, "Busy lanes"), whose fast uses clear their lane without the lock. Two words, each
 * changed by atomic read-modify-writes and read sequentially consistent (for
 * weft__cond_wait_unless); a reader sees each lane's bit as it was at some moment of its read. */
typedef struct weft__lanes_atomic {
  _Atomic uint64_t w[2];
} weft__lanes_atomic_t;
static inline weft__lanes_t weft__lanes_load(const weft__lanes_atomic_t *a) {
  return (weft__lanes_t)atomic_load(&a->w[1]) << 64 | atomic_load(&a->w[0]);
}
static inline bool weft__lanes_atomic_has(const weft__lanes_atomic_t *a, unsigned i) {
  return ((atomic_load(&a->w[(i >> 6) & 1u]) >> (i & 63u)) & 1u) != 0;
}
static inline void weft__lanes_add(weft__lanes_atomic_t *a, weft__lanes_t m) {
  if ((uint64_t)m != 0) atomic_fetch_or(&a->w[0], (uint64_t)m);
  if ((uint64_t)(m >> 64) != 0) atomic_fetch_or(&a->w[1], (uint64_t)(m >> 64));
}
static inline void weft__lanes_remove(weft__lanes_atomic_t *a, weft__lanes_t m) {
  if ((uint64_t)m != 0) atomic_fetch_and(&a->w[0], ~(uint64_t)m);
  if ((uint64_t)(m >> 64) != 0) atomic_fetch_and(&a->w[1], ~(uint64_t)(m >> 64));
}

/** A position in a stream: all work enqueued on `stream` up to tick `tick`. */
typedef struct weft__point {
  uint32_t stream; /* the stream's lane in the domain of the point (live: weft_stream_t.lane) */
  uint64_t tick;   /* 0: no work (always complete) */
} weft__point_t;

/** Per-block access history; embedded in each block record, zeroed for a new block. */
typedef struct weft__access_state {
  weft__point_t write;      /* last write (or the allocation point) */
  weft__lanes_t reader_mask; /* bit t: lane t read since the write */
  uint64_t *reads;          /* [reads_cap]: newest read tick per lane since the write; owned by
                               the record, valid where reader_mask has the bit */
  unsigned reads_cap;       /* grown under the tracker lock when a lane beyond it reads */
  const void *graph;    /* the capture (or graph builder) the block was allocated in: its memory
                           exists only in that graph, so only streams taking part in that capture
                           may use it; NULL for live memory */
  /* The newest deferred use that touched the block: its number in the domain
   * (weft__domain_t.use_seq) times two, plus one if it wrote the block (0: none). With lazy records it tells whether a
   * consumer of a joined deferred tick needs that tick's newest use (weft__clock_needed). */
  uint64_t last_use;
} weft__access_state_t;

/** The conflict rule (read-after-write, write-after-read, write-after-write), the one definition
 * shared by the stream tracker and the graph builder: every access must follow the block's last
 * write; a write must also follow every read since that write. Afterwards a write starts a new
 * history and a read joins the readers. */
static inline bool weft__rule_follows_reads(unsigned kind) { return (kind & 2u /* WEFT_WRITE */) != 0; }
static inline bool weft__rule_starts_history(unsigned kind) { return (kind & 2u /* WEFT_WRITE */) != 0; }

/** One access of a use, as the tracker sees it. */
typedef struct weft__use {
  weft__access_state_t *state;
  unsigned kind; /* weft_access_kind_t */
  uint64_t gen;  /* which block of the history's owner this is (its handle's generation), opaque
                    here: a capture keeps the first it sees per block for its summary; 0 unknown */
} weft__use_t;

typedef struct weft__tracker weft__tracker_t;
typedef struct weft__capture weft__capture_t;

/** One stream's clock state within a domain: its ticks and the ring of events that mark them. */
typedef struct weft__lane {
  unsigned ring_size;   /* power of two (the owning runtime's event_ring, or a capture's) */
  uint64_t tick;        /* newest tick handed out on this stream in this domain */
  uint64_t recorded;    /* newest tick whose event is recorded (tick - 1 while one is pending) */
  bool dirty;           /* the stream's row grew by waits (or it got untracked work) since tick */
  /* Lazy records (options.lazy_records, live domain only): a use's tick may stay pending after
   * its work ("deferred"); the next uses on the stream join it instead of recording it first, so
   * a stream nobody waits on records no event at all. A stream that needs the newest use of a
   * deferred tick records its event then, exactly at that point. The first time another stream
   * needs an older use of a tick that covers several (a late wait: weft__clock_needed), the
   * lane turns `eager`: from then on each use records its event at once, so a consumer enqueued
   * after later producer work still waits for exactly its point, until its waiters have needed
   * only its newest point for a while (`calm`: weft__clock_needed). */
  bool deferred;        /* the pending tick was left by a use's end and may be joined */
  bool eager;           /* a wait on one of this lane's joined ticks was late; it turns lazy
                           again after WEFT__CLOCK_CALM waits in a row for its newest tick */
  /* Exact waits (live domain; weft__tracker_exact): the lane carried work that waits for what
   * other streams enqueue later (collectives, send and receive, stream value waits), or waited
   * for such a lane. A wait for one of its points must then never be served by a later event:
   * the later one could cover work that waits for the waiter's own future (two ranks' threads,
   * one ahead: a deadlock). So it records each use's event (eager, above), and its ring never
   * drops an event the host does not know complete: a full ring asks the driver about its
   * oldest event and grows where that one has not completed (clock.c, keep_room). */
  bool exact;
  unsigned joined;      /* uses that joined the deferred tick after the one that took it */
  unsigned calm;        /* eager: waits in a row that needed the lane's newest tick */
  uint64_t last_use;    /* the number (weft__domain_t.use_seq) of the newest deferred use here */
  CUevent *ring;        /* [ring_size] events, created lazily in capture domains */
  uint64_t *ring_tick;  /* [ring_size] tick recorded in each slot (0: empty) */
  uint64_t *ring_clock; /* [ring_size * n] clock snapshot per slot */
  uint64_t *ring_us;    /* [ring_size] when each slot was recorded, while a trace is written */
  uint64_t *ring_use;   /* [ring_size] the newest use each slot's event covers (last_use), times
                           two, plus one if it covers several (a joined deferred tick) */
} weft__lane_t;

/** A clock domain: the live one (work that runs as it is enqueued) or one per capture (work
 * that becomes graph nodes). Ticks and events never cross domains: a capture's events are
 * recorded inside the capture and only waited on inside it, so no wait can raise
 * STREAM_CAPTURE_ISOLATION, and captured work never counts as done for live streams. */
typedef struct weft__domain {
  unsigned n;           /* lanes in use: [0, n) (the live domain's grows as runtimes come) */
  unsigned stride;      /* the length of a row and of a ring snapshot (>= n; the live domain's
                           grows with n, clock.c live_restride) */
  unsigned ring_size;   /* a capture's lanes' ring size */
  uint64_t *known;      /* [stride * stride], row s = known[s][*] */
  /* Per lane ([n] for a capture, [WEFT__MAX_LANES] for the live domain): */
  uint64_t *host_known; /* stays 0 in capture domains (nothing captured runs) */
  weft_stream_t **stream; /* the stream of each lane (NULL: none) */
  weft__lane_t *lane;
  weft__capture_t *capture; /* NULL for the live domain */
  weft__lanes_atomic_t busy; /* live domain: lanes whose use enqueues its work unlocked (above) */
  uint64_t use_seq;         /* deferred uses numbered so far (weft__access_state_t.last_use) */
} weft__domain_t;

/** A pool stream. `raw`, `index`, `tr`, `runtime`, `high`, `priority` never change after the
 * tracker's init; the rest is guarded by the tracker lock unless its comment says otherwise. */
struct weft_stream {
  /* What every use reads and writes comes first, in one cache line (the struct is aligned to
   * one), the rest in the next. */
  _Alignas(64) weft__tracker_t *tr; /* owner */
  void *runtime;         /* the weft_runtime_t it belongs to (opaque here) */
  CUstream raw;          /* pool: CU_STREAM_NON_BLOCKING; adopted: the caller's (NULL is the legacy stream) */
  /* The capture this stream takes part in, or NULL. Written under the tracker lock; read without
   * it (acquire) only by the thread that may begin or end that capture. */
  _Atomic(weft__capture_t *) capture;
  /* 1 + the tick weft__tracker_point would give now in the live domain, published under the
   * lock whenever the lane changes (weft__clock_publish), or by a deferred fast use after its
   * work, before it clears its busy lane (weft__tracker_exit: nothing changes a busy lane), or
   * 0: take it under the lock (the lane has work or waits since its tick, a busy use holds it,
   * or the stream is per-thread). Read without the lock (acquire) by weft__tracker_point: the
   * pool stamps each free with it. */
  _Atomic uint64_t point;
  uint64_t last_used;    /* tracker-wide use sequence at the last use here (LRU) */
  unsigned index;        /* position in the pool (its lane in its runtime's capture domains) */
  unsigned lane;         /* its lane in the live domain: tr->base + index */
  /* Threads dropping a foreign capture of this stream its owner ended, from before they unlink it
   * until its on_drop has run (lib/runtime/stream.c): a call that finds no capture waits for them. */
  _Atomic unsigned dropping;
  /* CU_STREAM_PER_THREAD names a different stream on each thread: adopted, it is the adopting
   * thread's (`owner`, that thread's serial: weft__tracker_owns), usable only there, and its
   * ticks are recorded at once (nobody else may record on it). `owner` changes, under the lock,
   * only when an ended owner's slot is taken back (weft__tracker_reclaim); read without it. */
  bool per_thread;
  /* Set once code outside weft may have touched the raw stream (weft_stream_raw gave it out, or
   * it waited on an outside event): only then can a capture weft did not begin reach it, so only
   * then does the runtime ask the driver about it before each call. */
  _Atomic bool exposed;
  bool use_open;         /* weft_use_begin without its weft_use_end yet */
  /* Its live lane is exact (weft__lane_t.exact), readable without the lock: set under it, once
   * (cleared only when an ended thread's per-thread slot is taken back: weft__tracker_reclaim). */
  _Atomic bool exact;
  uint64_t use_print;    /* fingerprint of the open use's accesses (weft__tracker_fingerprint) */
  _Atomic uint64_t owner;
  struct weft__owner *owner_of; /* the owner thread's record: whether it has ended (tracker.c;
                                   read and swapped under its own lock, g_owner_lock) */
  weft__trace_span_t *span; /* the device-timestamp span of the use in progress (trace.h), or NULL */
  /* The newest driver id of a foreign capture whose capture handler has returned on this stream
   * (0: none yet): until then other threads' calls on the stream wait (lib/runtime/stream.c). */
  _Atomic uint64_t handled;
  int priority;          /* driver priority value */
  unsigned holds;        /* host waits on the raw stream in progress (weft__tracker_hold) */
  bool high;             /* one of the high-priority streams */
  /* A stream weft did not create, taken in by weft__tracker_adopt (set once, under the lock,
   * before n_adopted counts it): never destroyed by weft. */
  bool adopted;
};

/* The fields a use reads and writes share the stream's first cache line (above). */
_Static_assert(offsetof(struct weft_stream, exact) < 64 && sizeof(struct weft_stream) == 128,
               "weft_stream_t: the hot fields fit its first line, the whole two");

/** Whether s's raw handle names its context: every stream but the default ones (the legacy NULL
 * stream, CU_STREAM_PER_THREAD), which stand for the calling thread's current context's. A
 * stream-ordered call on a stream that names its context (a launch, a record, a wait, a memset, a
 * copy, a graph launch, a stream-ordered allocation or free, a host function) needs no context
 * current on the thread: with none, each runs (H200, tests/conformance "no current context"). */
static inline bool weft__stream_names_context(const weft_stream_t *s) {
  return s->raw != NULL && s->raw != CU_STREAM_LEGACY && s->raw != CU_STREAM_PER_THREAD;
}

/* A capture's collectives held alive: by the capture itself while it ends (weft__capture_t.hold),
 * then by the weft graph it made (graph/). NCCL's ncclCommDestroy waits until the graphs that
 * captured a communicator's collectives are destroyed (on the thread that would destroy them, for
 * ever: tests/conformance conformance_nccl), so weft_comm_destroy (comm/) asks first. */
typedef struct weft__capture_hold {
  uint64_t id; /* the driver's capture id; 0: not linked */
  struct weft__capture_hold *prev, *next;
} weft__capture_hold_t;

/** A block as a capture sees it: its history inside the capture, keyed by its live history. */
typedef struct weft__capture_block {
  weft__access_state_t *live; /* the block's live history (key) */
  weft__access_state_t local; /* its history inside the capture */
  unsigned kind;              /* union of the kinds used inside the capture */
  uint64_t gen;               /* weft__use_t.gen of its first use inside the capture (0: unknown) */
  bool internal;              /* allocated inside the capture: not part of the summary */
  bool freed;                 /* internal and freed inside the capture: not an output */
} weft__capture_block_t;

/** A capture session as the tracker sees it: its clock domain, which pool streams take part,
 * and the capture-local history of every block touched inside it (which is also the graph's
 * access summary and, for blocks allocated inside and not freed, its outputs). */
struct weft__capture {
  weft__domain_t dom;
  weft__tracker_t *tr;
  weft_stream_t *origin;
  uint64_t id;                /* the driver's capture id */
  uint64_t joined;            /* bit mask of pool streams taking part (origin included) */
  CUstreamCaptureMode mode;
  bool foreign;               /* begun by code outside weft */
  /* Collectives, sends or receives were posted into it (weft__capture_note_collective): a launch
   * of its graph waits for what other ranks launch, so its stream keeps exact waits. */
  bool collectives;
  /* With collectives: held under id from just before the driver's capture ends until freed
   * (weft__capture_end, weft__capture_free), so its graph can take over the hold. */
  weft__capture_hold_t hold;
  pthread_t thread;           /* the beginning thread (THREAD_LOCAL / GLOBAL must end there) */
  /* Where weft_alloc on a taking-part stream allocates: the capture's allocation context, set by
   * whoever began it (a graph memory-node resource, or a graph pool), as PyTorch's
   * beginAllocateToPool tells its allocator. Never NULL. */
  weft_resource_t *alloc_to;
  /* A foreign capture given another allocation context (weft__capture_redirect): called once
   * when the capture is dropped (its owner ended it), before its blocks are forgotten, to give
   * that context back. No lock held. */
  void (*on_drop)(weft__capture_t *c);
  uint64_t trace_us;          /* when it began, while a trace is written (its slice) */
  weft__vec_t blocks;         /* weft__capture_block_t, in first-touch order */
  weft__map_t index;          /* live history pointer -> blocks index + 1 */
};

/** The tracker of one runtime: its device context, stream pool, and its lanes in the process's
 * live clock domain. */
struct weft__tracker {
  /* What every use reads comes first, in one cache line (the counters a use adds to follow):
   * a use's cost on a GPU host grows with the lines it touches beside the driver's
   * (tools/host_instr.sh, "lines, cold"). The embedded streams come last. */
  /* Rank 30: one lock for every tracker of the process (weft__clock_lock), as they share the
   * live domain. */
  _Alignas(64) weft__lock_t *lock;
  const weft__driver_t *drv;
  CUcontext ctx;          /* the device's primary context, retained */
  weft__domain_t *live;   /* the process's live domain (weft__clock_lanes_take) */
  uint64_t use_seq;       /* uses so far (LRU clock) */
  uint64_t fast_uses;     /* uses and split opens / closes the fast path took (tests check it ran) */
  unsigned n_pool;        /* pool streams: [0, n_pool) */
  /* Adopted streams so far, in lanes [n_pool, n_pool + n_adopted): written under the lock (after
   * the lane is set up, release), read anywhere (acquire). */
  _Atomic unsigned n_adopted;
  unsigned base;          /* its first lane in the live domain */
  bool lazy;              /* options.lazy_records (set once after init) */
  bool no_fast_path;      /* testing: every use and every weft_alloc / weft_free takes its general
                           * path (tracker.c, "the live fast path"; lib/runtime/block.c, "the
                           * allocation fast path"), which the fast one must match step for step */
  bool no_waits;          /* testing: issue no waits at all (positive controls) */
  bool mem_ops64;         /* CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS */
  weft_counters_t counters;
  weft__cond_t unheld;    /* signalled when a stream's holds drop to 0 (with lock) */
  bool ending;            /* its last release began: no new host wait (owner_exit) */
  CUdevice device;
  int ordinal;
  unsigned n;             /* lanes: the pool streams, then room for adopted streams */
  unsigned n_high;        /* the last n_high pool streams are high priority */
  unsigned ring_size;     /* power of two */
  /* Events of ended captures (CUevent), under the lock: the next captures' rings take them, so a
   * capture creates events only beyond what earlier ones made, and ending one destroys nothing
   * (what cannot fail cannot leak). Capacity for every event captures made, which is
   * `capture_events`. Destroyed with the tracker. */
  weft__vec_t spare_events;
  size_t capture_events;
  unsigned rr[2];         /* round-robin cursors per priority */
  /* Active captures (any mode) on this runtime's streams. Written under the lock, read anywhere. */
  _Atomic unsigned captures;
  uint64_t fast_frees;    /* frees into a stream's cache the fast path took (free_live) */
  /* Embedded (never freed), so a stream handle outlives its runtime's release and is then
   * reported stale instead of dangling. Entries [0, n) are live. */
  weft_stream_t streams[WEFT__MAX_STREAMS];
};

/* The fields every use reads share the tracker's first cache line (above). */
_Static_assert(offsetof(struct weft__tracker, mem_ops64) < 64, "weft__tracker_t: the hot fields fit its first line");

/* ---- life cycle (tracker.c) ------------------------------------------------------------------- */

/** Creates `n` pool streams (the last n_high high priority) with rings of `ring_size` events on
 * the primary context of `ordinal`, and room for `n_adopt` adopted streams (n + n_adopt <=
 * WEFT__MAX_STREAMS). On failure nothing is left behind. */
weft_status_t weft__tracker_init(weft__tracker_t *tr, const weft__driver_t *drv, int ordinal, unsigned n,
                                 unsigned n_high, unsigned n_adopt, unsigned ring_size, void *runtime);
/** The tracked stream for `raw`, a stream weft did not create (any stream of the tracker's
 * context, the legacy NULL stream, CU_STREAM_PER_THREAD): the one adopted before for the same
 * handle (and, for CU_STREAM_PER_THREAD, the same thread), else a new lane with its own event
 * ring. Adoption lasts as long as the tracker, but for a per-thread stream whose thread has ended,
 * whose slot weft__tracker_reclaim may give to another thread. Errors: INVALID_ARGUMENT (one of
 * weft's own pool streams), BUSY (every adoption slot taken: options.adopt_streams), DRIVER. */
weft_status_t weft__tracker_adopt(weft__tracker_t *tr, CUstream raw, weft_stream_t **out);
/** The calling thread's serial number: 1, 2, ... in the order threads first ask; no other thread
 * of the process gets it (a pthread_t is given again to a new thread once the old one ended). */
uint64_t weft__tracker_thread_serial(void);
/** True unless s is a per-thread stream that another thread adopted (a new thread with an ended
 * thread's pthread_t has another per-thread stream, so threads are told apart by serial). */
static inline bool weft__tracker_owns(const weft_stream_t *s) {
  return !s->per_thread ||
         atomic_load_explicit(&((weft_stream_t *)s)->owner, memory_order_relaxed) == weft__tracker_thread_serial();
}
/** Whether s is a per-thread stream whose owner thread has ended (it can never be asked about
 * again: a capture weft knows on it is over for weft). */
bool weft__tracker_owner_ended(weft_stream_t *s);
/** Takes back, for the calling thread's CU_STREAM_PER_THREAD, the slot of a per-thread stream
 * whose owner has ended (weft__tracker_adopt found every slot taken): one in no capture, with no
 * host wait in progress, no busy use and no pending tick. Its newest event is waited for (the
 * lock released meanwhile; the slot is the caller's from the moment it is chosen), then its lane
 * starts again (weft__clock_renew) and *out is the caller's stream. BUSY (nothing recorded) when
 * no slot qualifies; DRIVER when the wait fails (the slot is given back as it was, an ended
 * owner's). */
weft_status_t weft__tracker_reclaim(weft__tracker_t *tr, weft_stream_t **out);
/** Whether lane i holds a stream (a pool stream, or an adopted one). */
static inline bool weft__tracker_lane_used(weft__tracker_t *tr, unsigned i) {
  return i < tr->n_pool + atomic_load_explicit(&tr->n_adopted, memory_order_acquire);
}
/** Synchronises and destroys streams and events; releases the context. Returns the first driver
 * failure (everything is torn down regardless: a failed destroy leaves that driver object to the
 * driver, which frees it with the context). */
weft_status_t weft__tracker_destroy(weft__tracker_t *tr);
/** Makes the tracker's context current on the calling thread (cheap when it already is). */
weft_status_t weft__tracker_bind(weft__tracker_t *tr);
/** weft__tracker_bind where the stream-ordered calls about to be made on s (of tr) need it: only
 * for a default stream (weft__stream_names_context); otherwise nothing, and the thread's current
 * context stays as it was (the cuCtxGetCurrent a bind makes costs 25-50 ns on a GPU host:
 * bench/data/h200-driver-share-bfb22d0). */
static inline weft_status_t weft__tracker_bind_for(weft__tracker_t *tr, const weft_stream_t *s) {
  return weft__stream_names_context(s) ? WEFT_OK : weft__tracker_bind(tr);
}

/* ---- uses (tracker.c) -------------------------------------------------------------------------- */

/** The free of a block on s: issues the waits `uses` (its write) need on s (see the file comment).
 * On an exposed stream (weft__tracker_expose) s gets a new pending tick (deferred with lazy
 * records, else the lane dirty): work code outside weft enqueued there before the free is covered
 * by that point, which the resource stamps the memory with. Takes the tracker lock. On a driver failure returns it; waits issued before the
 * failure stay (harmless, conservative). */
weft_status_t weft__tracker_free_begin(weft_stream_t *s, const weft__use_t *uses, size_t n);
/** The free of a live block that s keeps for its next allocation (the stream cache,
 * lib/runtime/cache.c): free_begin's waits (and dirty lane), then, in the same lock hold, its
 * history restarts at s's point, as a new block's on s (weft__tracker_new_block). So handing the
 * block out again needs no tracker call. Inside a capture (begun meanwhile) only the waits.
 * Binds s's context itself, only where it makes a driver call (the live fast path, tracker.c:
 * free_live); the caller need not have bound it. */
weft_status_t weft__tracker_free_kept(weft_stream_t *s, weft__access_state_t *st);
/** Makes s's live lane exact (weft__lane_t.exact) before a use whose work waits for what other
 * streams enqueue later: a collective, send or receive (comm/), a stream value wait. s's pending
 * tick is recorded first, so that the work before stays apart from that use (not for an exposed
 * stream, which code outside weft may capture, nor while s captures). Once set it stays for the lane's life; cheap then
 * (one atomic load). Takes the tracker lock the first time; a failed record leaves nothing set. */
weft_status_t weft__tracker_exact(weft_stream_t *s);
/** Runtimes (trackers) holding lanes of the process's live domain now: with one, no wait can
 * cross devices. */
unsigned weft__tracker_runtimes(void);
/** Records the work enqueued since begin as the newest use of every block in `uses`. The use is
 * recorded even when its event cannot be recorded at once (the tick stays pending, see above):
 * work that reached the stream stays ordered. */
weft_status_t weft__tracker_end(weft_stream_t *s, const weft__use_t *uses, size_t n);
/* What a busy use changed in its lane and in a block's history, to put back if its work fails
 * (tracker.c; here for weft__use_ticket_t's size). */
typedef struct weft__lane_was {
  uint64_t tick, recorded, last_use;
  unsigned joined;
  bool dirty, deferred;
} weft__lane_was_t;
typedef struct weft__undo {
  weft__point_t write;
  weft__lanes_t reader_mask;
  uint64_t read; /* reads[lane] (a read's; a write leaves reads[] alone) */
  uint64_t last_use;
} weft__undo_t;
#define WEFT__LIVE_USES 16 /* accesses of a use the live fast path takes */

/** A deferred fast use in progress (weft__tracker_enter .. weft__tracker_exit): its accesses
 * recorded at its stream's pending tick, its lane busy, the lock not held. Lives in the caller's
 * frame; `uses` must stay valid until the exit. Fields private to tracker.c. */
typedef struct weft__use_ticket {
  weft_stream_t *s;
  const weft__use_t *uses;
  size_t n;
  uint64_t point;     /* the stream's point to publish after the work */
  uint64_t last_used; /* s->last_used before, put back after a failure */
  weft__lane_was_t was;
  weft__undo_t undo[WEFT__LIVE_USES];
} weft__use_ticket_t;

/** Signalled when a busy lane becomes idle ("Busy lanes" above), with the lock or, after a
 * deferred fast use's work, without it (weft__tracker_exit); every use ends a busy time, and the
 * signal costs nothing while no thread waits (clock.c; clock.h waits for it). */
extern weft__cond_t weft__clock_idle;

/** weft__tracker_use in two halves around work the caller enqueues itself (weft_launch: the
 * driver's call from the caller's own frame, with nothing of weft's after it but the exit). True
 * where the use is a plain live use (at most WEFT__LIVE_USES accesses, the ticket's room) that
 * leaves its tick deferred (lazy records): its waits are
 * issued, into *st; with *st OK its accesses are recorded and s is busy ("Busy lanes" above) until
 * weft__tracker_exit(t, ...), which the caller must call after enqueuing the work (or failing
 * to). False, nothing done, otherwise: the caller takes weft__tracker_use. */
bool weft__tracker_enter(weft_stream_t *s, const weft__use_t *uses, size_t n, weft__use_ticket_t *t,
                         weft_status_t *st);
/** weft__tracker_exit after a failed work: under the lock, everything the use recorded is put
 * back (its histories, lane, counters) and s is idle again. */
void weft__tracker_exit_failed(weft__use_ticket_t *t);
/** Ends a use begun by weft__tracker_enter: `work` is whether its work was enqueued (WEFT_OK) or
 * why not. After success, without the lock: s's point is published, its lane cleared, and the
 * threads waiting for it woken (weft__clock_idle_wait's second look makes the unlocked clear
 * safe). Returns `work`. */
static inline weft_status_t weft__tracker_exit(weft__use_ticket_t *t, weft_status_t work) {
  if (__builtin_expect(work != WEFT_OK, 0)) {
    weft__tracker_exit_failed(t);
    return work;
  }
  weft_stream_t *s = t->s;
  atomic_store_explicit(&s->point, t->point, memory_order_release);
  weft__lanes_remove(&s->tr->live->busy, weft__lane_bit(s->lane));
  weft__cond_broadcast_unlocked(&weft__clock_idle);
  return WEFT_OK;
}

/** begin; fn(s, arg) (enqueues the work; its failure aborts the use, leaving every history as
 * it was); end. A live use runs fn without the lock, s busy meanwhile ("Busy lanes" above): to
 * other threads' uses it is one step all the same. tr's context must be current. A plain use
 * takes tracker.c's live fast path, the same steps in fewer instructions. */
weft_status_t weft__tracker_use(weft_stream_t *s, const weft__use_t *uses, size_t n,
                                weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg);
/** One use of each of k distinct live streams around one fn(s[0], arg) that enqueues the work
 * of all of them (an NCCL group: one call for every rank, on several devices): each stream
 * waits for what uses[i][0..n[i]) need, fn runs once without the lock (every stream busy
 * meanwhile), then each stream's uses are recorded, or, when fn failed, nothing is. Where every
 * stream leaves its tick deferred (lazy records), the uses are recorded before fn and the lanes
 * cleared after it without the lock, as weft__tracker_enter / _exit do for one stream (a failed
 * fn takes the lock again and puts every stream back). A stream's context is bound only for its
 * own waits and record. CAPTURE when a stream takes part in a
 * capture or is a per-thread stream (take the split form there); INVALID_ARGUMENT for more than
 * 64 streams. */
weft_status_t weft__tracker_use_joint(weft_stream_t *const *s, weft__use_t *const *uses, const size_t *n, size_t k,
                                      weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg);
/** The split form's bracket (weft_use_begin / weft_use_end): opens a use on s (BUSY when one is
 * open) after its waits, or closes the open one (INVALID_ARGUMENT when none is open or when
 * `print` differs from the opening accesses'). `print` is weft__tracker_fingerprint(). Each binds
 * tr's context itself where it makes a driver call (a plain deferred use makes none). Both are
 * weft__tracker_bracket, one function: a use's begin and end then run the same code. */
weft_status_t weft__tracker_bracket(weft_stream_t *s, const weft__use_t *uses, size_t n, uint64_t print, bool open);
static inline weft_status_t weft__tracker_open(weft_stream_t *s, const weft__use_t *uses, size_t n, uint64_t print) {
  return weft__tracker_bracket(s, uses, n, print, true);
}
static inline weft_status_t weft__tracker_close(weft_stream_t *s, const weft__use_t *uses, size_t n, uint64_t print) {
  return weft__tracker_bracket(s, uses, n, print, false);
}

/** Zeroes a new block's history (live memory); `reads` has room for `cap` ticks (cap >=
 * weft__tracker_lanes() for live memory; the tracker grows it when a later lane reads). */
void weft__access_init(weft__access_state_t *st, uint64_t *reads, unsigned cap);
/** Lanes in use in the process's live domain now: room a new block's `reads` needs. */
unsigned weft__tracker_lanes(void);
/** Starts the history of a block just allocated on s: its first users elsewhere wait for
 * everything s did up to now. Inside a capture the block becomes internal to it (allocated
 * there: an output unless freed there), under `gen`, the generation it is published with.
 * HOST_OUT_OF_MEMORY leaves nothing changed. */
weft_status_t weft__tracker_new_block(weft_stream_t *s, weft__access_state_t *st, uint64_t gen);
/** Notes that a block allocated inside s's capture was freed there (it is not an output). */
void weft__tracker_free_block(weft_stream_t *s, weft__access_state_t *st);

/* ---- points, ordering, host knowledge (tracker.c) ------------------------------------------------ */

/** The point covering all work and waits enqueued on s so far (may hand out a pending tick).
 * Without the lock when the lane has published it (weft_stream_t.point): what other threads
 * enqueue on s meanwhile may or may not be covered, as with the lock. */
weft__point_t weft__tracker_point(weft_stream_t *s);
/** True when work enqueued on s from now on is ordered after p without a new wait. */
bool weft__tracker_is_ordered(weft_stream_t *s, weft__point_t p);
/** Makes s wait for p unless already ordered (at most one cuStreamWaitEvent). */
weft_status_t weft__tracker_order(weft_stream_t *s, weft__point_t p);
/** Non-blocking: true if p (a live point) is complete (then the host knows it). The query runs
 * in RELAXED capture mode: it never disturbs a capture. */
bool weft__tracker_poll(weft__tracker_t *tr, weft__point_t p);
/** The points a new access of `kind` to a block with history st would wait for (<= n+1; the
 * last write, and for writes the reads since). */
size_t weft__tracker_conflicts(weft__tracker_t *tr, const weft__access_state_t *st, unsigned kind, weft__point_t *out);

/** Host synchronisation of live work, adding host knowledge (RELAXED: no capture is disturbed).
 * CAPTURE for a stream that is capturing. */
weft_status_t weft__tracker_sync_stream(weft_stream_t *s);
weft_status_t weft__tracker_sync_all(weft__tracker_t *tr);
weft_status_t weft__tracker_sync_points(weft__tracker_t *tr, const weft__point_t *pts, size_t n);
/** Queries s (CUDA_ERROR_NOT_READY → WEFT_ERR_NOT_READY); success adds host knowledge. */
weft_status_t weft__tracker_query_stream(weft_stream_t *s);

/** The stream of priority `high` needing the fewest waits for `uses`, ties to the LRU. */
weft_stream_t *weft__tracker_auto(weft__tracker_t *tr, bool high, const weft__use_t *uses, size_t n);
/** Notes work on s that the tracker did not enqueue (a stream-ordered allocation, a canary
 * fill): later points of s cover it. Call it after enqueuing that work. */
void weft__tracker_touch(weft_stream_t *s);
/** Marks s exposed (code outside weft may now enqueue on its raw stream, or begin a capture on
 * it): a deferred tick (lazy records) is recorded now, while s is surely not capturing, and s's
 * uses record eagerly from then on. Only a free's tick and an allocation's point are left pending
 * there (an event per free would double the cost of PyTorch's allocation pair through the
 * adapter: bench/data/h200x2-17559f1): whoever records them for another stream or the host asks
 * the driver before and after, and never leaves an event in a capture outside code began on s
 * (weft__clock_slot); while such a capture lasts they cannot be recorded (CAPTURE for a use that
 * needs them) unless weft__tracker_record_pending recorded them before it began. */
void weft__tracker_expose(weft_stream_t *s);
/** Records the pending tick of every exposed live stream of tr that takes part in no capture (the
 * driver asked before and after each record, as weft__clock_slot does): what code outside weft
 * calls before it begins a capture on such a stream (weft_runtime_record_pending). Takes the
 * lock per stream. Returns the first failure other than a stream found capturing (skipped). */
weft_status_t weft__tracker_record_pending(weft__tracker_t *tr);
/** Makes s wait for an outside event; s becomes dirty (later points cover it). */
weft_status_t weft__tracker_import_event(weft_stream_t *s, CUevent ev);
/** Keeps s out of captures while the caller waits on its raw stream on the host (without the
 * lock): a capture begun on s, or joining s, waits until weft__tracker_unhold. CAPTURE when s
 * already takes part in a capture. */
weft_status_t weft__tracker_hold(weft_stream_t *s, const char *fn);
void weft__tracker_unhold(weft_stream_t *s);
/** Holds a pool stream that takes part in no capture (as weft__tracker_hold), for driver work that
 * belongs to no stream in particular (giving chunks back, reserving, teardown): one weft knows
 * no capture of, and, if it was exposed (weft_stream_raw), one the driver says is not capturing
 * either. NULL, with CAPTURE recorded for `fn`, when every stream takes part in a capture. (Code
 * outside weft may begin a capture on an exposed stream at any moment; weft can only ask.) */
weft_stream_t *weft__tracker_hold_live(weft__tracker_t *tr, const char *fn);
/** The capture s takes part in (NULL: none) and its allocation context, read under the lock. */
weft__capture_t *weft__tracker_capture_of(weft_stream_t *s, weft_resource_t **alloc_to);
/** Whether s takes part in a capture: weft__tracker_capture_of's pointer alone, inline (written
 * under the lock, read atomically): the hot check of every resource call. */
static inline bool weft__tracker_in_capture(weft_stream_t *s) {
  return atomic_load_explicit(&s->capture, memory_order_acquire) != NULL;
}

/** An order-independent fingerprint of a use's accesses (for the split form's checks): n plus
 * the sum of weft__tracker_print_one over the accesses. */
uint64_t weft__tracker_fingerprint(const weft__use_t *uses, size_t n);
/** One access's term of weft__tracker_fingerprint, for callers that sum it while they resolve
 * the accesses (one pass instead of two). Block records are 8-aligned, so the kind sits in the
 * low bits; the xor-shift keeps swapped kinds apart. It catches mistakes, not adversaries. */
static inline uint64_t weft__tracker_print_one(const weft__access_state_t *state, unsigned kind) {
  uint64_t x = ((uint64_t)(uintptr_t)state | (uint64_t)kind) * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 32);
}

/** Checks the clock invariants (rows dominate their ring snapshots, known[s][s] == tick,
 * host_known <= ticks, at most one pending tick). Takes the lock. */
bool weft__tracker_is_valid(weft__tracker_t *tr);
/** The trace track of s now: its own, or its capture's (weft__trace_tid). Takes the lock. */
unsigned weft__tracker_trace_tid(weft_stream_t *s);

/* ---- captures (capture.c) ------------------------------------------------------------------------ */

/** Begins a weft capture on s (cuStreamBeginCapture in `mode`), or adopts a foreign one already
 * active on s (`foreign`, with its driver id). s takes part; its later uses are captured, and
 * weft_alloc on it allocates from `alloc_to`. A foreign capture that another stream of s's
 * runtime takes part in already (its owner forked it onto s: an event recorded on a capturing
 * stream, waited for on s) is joined instead, in the same lock hold: one driver capture is one
 * weft capture, whichever stream and thread weft met it on first; *out is then NULL. weft did not
 * see the fork, so s knows nothing of the other streams' captured work: a use on s that
 * conflicts with it waits for it inside the capture.
 * A foreign capture is adopted (or joined) only if the driver, asked again in that lock hold,
 * still says s captures `id`: a thread whose earlier look is stale (the owner ended the capture
 * since) adopts nothing, so no other thread ever sees weft take part in an ended capture; then
 * OK with *out NULL and *ended true (ended may be NULL where foreign is false).
 * Errors: CAPTURE (s already takes part in a capture), DRIVER, HOST_OUT_OF_MEMORY. */
weft_status_t weft__capture_begin(weft_stream_t *s, CUstreamCaptureMode mode, bool foreign, uint64_t id,
                                  weft_resource_t *alloc_to, weft__capture_t **out, bool *ended);
/** Pulls pool stream t into the weft capture whose origin is `origin` (t waits on a captured
 * event of the origin: a fork). CAPTURE when origin is not the origin of a weft capture, or t
 * takes part in another. */
weft_status_t weft__capture_join(weft_stream_t *origin, weft_stream_t *t);
/** Ends the weft capture whose origin is s: rejoins every forked stream to the origin, ends it
 * (cuStreamEndCapture), detaches it and gives it (*out, to free with weft__capture_free; its
 * blocks stay readable) and the graph. CAPTURE (and *out NULL) when s is not the origin of a weft
 * capture. On any other failure the capture is ended anyway (no stream is left capturing), *out
 * is set and *graph is NULL. */
weft_status_t weft__capture_end(weft_stream_t *s, weft__capture_t **out, CUgraph *graph);
/** Whether s takes part in a foreign capture (adopted by weft), and its driver id. */
bool weft__capture_foreign_of(weft_stream_t *s, uint64_t *id);
/** Detaches the foreign capture with driver id `id` that s takes part in, which its owner ended
 * (no driver calls on the graph): every stream that took part leaves it. Gives it to the caller
 * to free; NULL when s has no such capture any more (another thread dropped it first). */
weft__capture_t *weft__capture_drop_foreign(weft_stream_t *s, uint64_t id);
/** Notes that a collective, send or receive is posted into the capture s takes part in (none:
 * nothing): its graph's launches wait for the other ranks' (weft__capture_t.collectives). Takes
 * the lock. */
void weft__capture_note_collective(weft_stream_t *s);
/** The foreign capture s takes part in (begun outside weft), or NULL. */
weft__capture_t *weft__capture_foreign(weft_stream_t *s);
/** Makes weft_alloc in foreign capture c allocate from `to`, with `on_drop` to run when the
 * capture is dropped. CAPTURE when c is no longer s's capture; BUSY when c was redirected to
 * another context already. */
weft_status_t weft__capture_redirect(weft_stream_t *s, weft__capture_t *c, weft_resource_t *to,
                                     void (*on_drop)(weft__capture_t *c));
/** Frees the session's memory and events (after end or abandon). */
void weft__capture_free(weft__capture_t *c);
/** weft__capture_status's rare half (capture.c): the id of the capture the driver says s takes
 * part in (cuStreamGetCaptureInfo, which also answers *cs again). */
CUresult weft__capture_status_id(const weft_stream_t *s, CUstreamCaptureStatus *cs, uint64_t *id);
/** The driver's word on s's capture state, raw: the one place weft asks it. cuStreamIsCapturing
 * (13 ns against cuStreamGetCaptureInfo's 19 on an H200, CUDA_SEMANTICS.md, with the same
 * answers, STREAM_CAPTURE_IMPLICIT included: tests/conformance); cuStreamGetCaptureInfo as well,
 * for the capture's id, only where a capture is there and id is wanted (*id 0 otherwise, or
 * where the driver has no cuStreamGetCaptureInfo). id may be NULL. Inline: every allocation and
 * free on a stream outside code can reach asks it (the rare half is out of line). */
static inline CUresult weft__capture_status(const weft_stream_t *s, CUstreamCaptureStatus *cs, uint64_t *id) {
  *cs = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = s->tr->drv->cuStreamIsCapturing(s->raw, cs);
  if (id != NULL) *id = 0;
  if (__builtin_expect(r == CUDA_SUCCESS && *cs != CU_STREAM_CAPTURE_STATUS_NONE && id != NULL, 0))
    r = weft__capture_status_id(s, cs, id);
  return r;
}
/** weft__capture_probe's failure (capture.c): records the driver's refusal r. */
weft_status_t weft__capture_probe_failed(CUresult r);
/** What the driver says of s: whether a capture is active on it, and its id. s is the calling
 * thread's (weft__tracker_owns): another thread's per-thread stream cannot be named. Inline, as
 * weft__capture_status. */
static inline weft_status_t weft__capture_probe(weft_stream_t *s, bool *active, uint64_t *id) {
  WEFT_ASSERT_INTERNAL(weft__tracker_owns(s));
  CUstreamCaptureStatus cs;
  CUresult r = weft__capture_status(s, &cs, id);
  *active = r == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (__builtin_expect(r != CUDA_SUCCESS, 0)) return weft__capture_probe_failed(r);
  return WEFT_OK;
}

/** Links h (not linked) under capture `id`: weft__capture_held(id) is true until h is unlinked.
 * An id of 0 (none known) links nothing. */
void weft__capture_hold_link(weft__capture_hold_t *h, uint64_t id);
/** Unlinks h if it is linked. */
void weft__capture_hold_unlink(weft__capture_hold_t *h);
/** Whether a hold of capture `id` is linked. */
bool weft__capture_held(uint64_t id);

#endif /* WEFT_STREAMS_TRACKER_H */
