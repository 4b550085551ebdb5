/* The simulator's private types and cross-file prototypes, grouped by the file that owns them.
 *
 * Model in one paragraph: every driver call takes one global recursive mutex (sim__enter /
 * sim__leave), so all state below is only touched under it. Streams are FIFO queues of ops; the
 * scheduler (sched.c) executes *ready* ops (a stream's head whose wait is satisfied, or a ready
 * node of a graph launch at a stream's head) picked at random with a seeded PRNG, a few at every
 * call and as many as needed at synchronisations. Every executed op gets a vector clock (oracle.c)
 * from its stream, the host's clock at issue, the events it waited on and its graph
 * predecessors; each byte range it touches is checked against the range's last write and the
 * reads since (per mapped region, as an interval list). Captured work becomes graph nodes
 * (capture.c); graphs are instantiated into execs whose launches are ops (graph_exec.c).
 *
 * Lock order: sim.lock only. Host callbacks (cuLaunchHostFunc, host nodes) run with it held; the
 * lock is recursive so that a callback may call a harmless driver function, and the scheduler
 * never re-enters while a callback runs (sim.in_callback).
 */
#ifndef WEFT_SIM_INTERNAL_H
#define WEFT_SIM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "sim/funcs.h"
#include "sim/weft_sim.h"

/* Handle magics: every object a CU* handle points at starts with one, checked together with
 * membership in the live-handle set (core.c), so stale or foreign handles are rejected. */
#define SIM_MAGIC_CTX 0x43545831u
#define SIM_MAGIC_STREAM 0x5354524du
#define SIM_MAGIC_EVENT 0x45564e54u
#define SIM_MAGIC_POOL 0x504f4f4cu
#define SIM_MAGIC_MODULE 0x4d4f444cu
#define SIM_MAGIC_FUNC 0x46554e43u
#define SIM_MAGIC_GRAPH 0x47524150u
#define SIM_MAGIC_NODE 0x4e4f4445u
#define SIM_MAGIC_EXEC 0x45584543u

#define SIM_ALIGN 256u              /* device allocation alignment, bytes */
#define SIM_MAX_RACES_KEPT 1024u    /* race descriptions kept (all are counted) */
#define SIM_HOST_LANE 0u            /* vector-clock lane of the host (all host threads are one) */
#define SIM_MAX_DEVICES 8           /* WEFT_SIM_DEVICES: 1 (default) .. 8 */

/** A device's primary context (the only kind of context the simulator has). */
typedef struct sim__ctx {
  uint32_t magic;               /* SIM_MAGIC_CTX */
  int dev;
  int refs;                     /* cuDevicePrimaryCtxRetain count */
  uint32_t peers;               /* bit e: cuCtxEnablePeerAccess to device e's context */
} sim__ctx_t;

typedef struct sim__stream sim__stream_t;
typedef struct sim__event sim__event_t;
typedef struct sim__einst sim__einst_t;
typedef struct sim__pool sim__pool_t;
typedef struct sim__region sim__region_t;
typedef struct sim__alloc sim__alloc_t;
typedef struct sim__kernel sim__kernel_t;
typedef struct sim__graph sim__graph_t;
typedef struct sim__node sim__node_t;
typedef struct sim__exec sim__exec_t;
typedef struct sim__capture sim__capture_t;

/* ---- event.c: stream-order links ---- */

/** The streams a point follows in stream order (its own stream's earlier work and event waits,
 * not host synchronisations): per stream id, the newest issue count (sim__stream_t.issued)
 * followed. What a thread's end needs to know which pool allocations its per-thread stream's
 * work is ordered after (sim/stream.c, "a thread's end"). */
typedef struct sim__links {
  struct sim__link {
    int stream;
    uint64_t seq;
  } *v;
  size_t n, cap;
} sim__links_t;
/** dst follows what src follows (but streams gone: sim__links_forget). */
void sim__links_join(sim__links_t *dst, const sim__links_t *src);
/** Stream `stream` is gone: joins drop it from here on (so that links stay short). */
void sim__links_forget(int stream);
/** dst follows stream `stream` up to issue count seq. */
void sim__links_set(sim__links_t *dst, int stream, uint64_t seq);
/** The newest issue count of `stream` that l follows (0: none). */
uint64_t sim__links_get(const sim__links_t *l, int stream);
void sim__links_free(sim__links_t *l);

/* ---- oracle.c: vector clocks, snapshots, access history, races ---- */

/** A vector clock: v[lane] = newest tick of `lane` known to happen before; lanes >= n are 0. */
typedef struct sim__vc {
  uint32_t n, cap;
  uint32_t *v;
} sim__vc_t;

/** An immutable, reference-counted copy of the host clock, shared by every op issued while the
 * host clock did not change (so issuing an op costs no vector copy). */
typedef struct sim__snap {
  int refs;
  sim__vc_t vc;
} sim__snap_t;

/** Who made an access: enough to order it (lane, tick) and to describe it in a race report. */
typedef struct sim__who {
  uint64_t op;       /* global issue sequence number */
  uint32_t lane;     /* vector-clock lane of the timeline that executed it */
  uint32_t tick;     /* its tick on that lane */
  int stream;        /* stream id, -1 host, -2 graph node */
  const char *what;  /* static string: "kernel", "memcpy HtoD", "alloc", ... */
  const char *name;  /* kernel name (owned by the registry, never freed) or NULL */
} sim__who_t;

/** The clock of the op being executed, and who it is. */
typedef struct sim__actx {
  const sim__vc_t *vc;
  sim__who_t who;
  int dev; /* the device running it (kernels touch only memory it may access); -1 for the host */
} sim__actx_t;

/** One interval of a region's history: bytes [lo, hi) share a last write and reads since. */
typedef struct sim__seg {
  uintptr_t lo, hi;
  sim__who_t w;
  int has_w;
  uint32_t nreads, capreads;
  sim__who_t *reads; /* at most one per lane; none ordered before another */
} sim__seg_t;

/** Sorted, non-overlapping segments (gaps are bytes never touched). */
typedef struct sim__hist {
  sim__seg_t *s;
  size_t n, cap;
} sim__hist_t;

void sim__vc_free(sim__vc_t *vc);
void sim__vc_join(sim__vc_t *dst, const sim__vc_t *src);
void sim__vc_copy(sim__vc_t *dst, const sim__vc_t *src);
void sim__vc_set(sim__vc_t *vc, uint32_t lane, uint32_t tick);
static inline uint32_t sim__vc_get(const sim__vc_t *vc, uint32_t lane) {
  return lane < vc->n ? vc->v[lane] : 0;
}
/** The current host clock as a shared snapshot (a new reference). */
sim__snap_t *sim__snap_host(void);
void sim__snap_unref(sim__snap_t *s);
/** Joins `vc` into the host clock (a host synchronisation). */
void sim__host_join(const sim__vc_t *vc);
/** Ticks the host lane for a host access and fills ctx with the host's clock. */
void sim__host_access_ctx(sim__actx_t *ctx, const char *what);
/** Begins the accesses of one op (race de-duplication is per op). */
void sim__oracle_begin(void);
/** Records an access to [ptr, ptr+bytes) by ctx; reports races. Checks that the bytes lie in an
 * allocated region (else reports an invalid access and returns -1 so the caller skips it). */
int sim__oracle_access(CUdeviceptr ptr, size_t bytes, int writes, const sim__actx_t *ctx);
/** Only validates that [ptr, ptr+bytes) lies in an allocated region (oracle off). */
int sim__range_valid(CUdeviceptr ptr, size_t bytes);
void sim__hist_free(sim__hist_t *h);
void sim__race_report(void);
/** Reports a host-side hazard as a race of its own (no bytes): `first` and `second` describe the
 * two overlapping driver calls. */
void sim__hazard_report(const char *first, const char *second);
/** Destroys every stream of device `dev` but its NULL stream (its primary context was released to
 * nothing). */
void sim__streams_destroy_all(int dev);

/* ---- sched.c: PRNG, actions, ops, the scheduler ---- */

typedef enum sim__act_kind {
  SIM_ACT_KERNEL,
  SIM_ACT_MEMCPY,
  SIM_ACT_MEMSET,
  SIM_ACT_HOST,
  SIM_ACT_EMPTY,
  SIM_ACT_EVENT_RECORD,
  SIM_ACT_EVENT_WAIT,
  SIM_ACT_WRITE_VALUE,
  SIM_ACT_WAIT_VALUE,
  SIM_ACT_MEM_ALLOC,
  SIM_ACT_MEM_FREE,
  SIM_ACT_GRAPH,
  SIM_ACT_NCCL /* a rank's fused NCCL operation (nccl.c): runs with its partners at once */
} sim__act_kind_t;

typedef enum sim__copy_dir { SIM_HTOD, SIM_DTOH, SIM_DTOD, SIM_HTOH } sim__copy_dir_t;

/** One unit of device work: what a stream op or a graph node does. Owns what it points to
 * (kernel argument copies, staged host data, references on events, allocations, execs). */
typedef struct sim__action {
  sim__act_kind_t kind;
  union {
    struct {
      sim__kernel_t *k;
      weft_sim_launch_t cfg;
      void **params; /* what the twin gets */
      void *blob;    /* owned copies of the arguments (NULL when passed through) */
      size_t blob_bytes;
      unsigned nparams;
      int owned;     /* params/blob are owned copies */
    } kernel;
    struct {
      sim__copy_dir_t dir;
      CUdeviceptr dst_dev, src_dev;
      void *dst_host;
      const void *src_host;
      void *staged; /* owned copy of the host source of a stream HtoD copy */
      size_t bytes;
    } copy;
    struct {
      CUdeviceptr dst;
      unsigned value, elem; /* elem: element size in bytes, 1, 2 or 4 */
      size_t width, height, pitch; /* width in elements; pitch in bytes */
    } set;
    struct {
      CUhostFn fn;
      void *data;
    } host;
    struct {
      sim__event_t *ev;   /* referenced */
      sim__einst_t *inst; /* referenced: the record this op completes, or waits for */
    } event;
    struct {
      CUdeviceptr addr;
      uint64_t value;
      unsigned flags;
      int is64;
    } value;
    struct {
      sim__alloc_t *a;  /* graph allocation (referenced), or the pool allocation being freed */
      CUdeviceptr ptr;  /* pool allocation: found by address when it runs (the object may be gone) */
      size_t size;
    } mem;
    struct {
      sim__exec_t *exec;   /* referenced */
      sim__einst_t **inst; /* per node: event instance bound at the launch call (record/wait) */
      uint64_t seq;        /* this launch's place among the exec's launches (exec.launched) */
    } graph;
    struct {
      struct fused *fused; /* owned (nccl.c) */
    } nccl;
  } u;
} sim__action_t;

/** A queued stream operation. */
typedef struct sim__op {
  struct sim__op *next;
  uint64_t id;       /* global issue order */
  uint64_t seq;      /* this stream's issue counter after issuing it */
  sim__snap_t *snap; /* host clock at issue (oracle on), referenced */
  sim__action_t act;
} sim__op_t;

uint64_t sim__rand(void);
void sim__seed(uint64_t seed);
/** Queues `act` on s (not capturing). Takes ownership of act's contents. */
void sim__enqueue(sim__stream_t *s, sim__action_t *act);
/** The background progress every call to fn makes: 0-3 ready ops at random; in lazy mode
 * (WEFT_SIM_LAZY=1) none, except rarely one at a query, so that the device runs behind. */
void sim__progress(sim__fn_t fn);
/** Runs ready ops until done(arg) holds; CUDA_ERROR_LAUNCH_TIMEOUT if nothing can run first. */
CUresult sim__run_until(int (*done)(void *), void *arg);
/** Runs until every queue is empty (or nothing can run: then LAUNCH_TIMEOUT). */
CUresult sim__drain(void);
/** Performs an action with the clock in ctx (oracle checks, then the effect). */
void sim__action_run(sim__action_t *act, const sim__actx_t *ctx, sim__einst_t *bound);
/** Whether an action that waits can run now. */
int sim__action_ready(const sim__action_t *act, const sim__einst_t *bound);
/** Extra clock an action joins before it runs (event instance, memop writer), or NULL. */
const sim__vc_t *sim__action_incoming(const sim__action_t *act, const sim__einst_t *bound);
void sim__action_release(sim__action_t *act);
/** Deep copy (graph nodes into execs). */
void sim__action_clone(sim__action_t *dst, const sim__action_t *src);
const char *sim__action_what(const sim__action_t *act);
void sim__busy_add(sim__stream_t *s);
void sim__busy_remove(sim__stream_t *s);

/* ---- core.c: global state, entry/exit, handles, api table ---- */

typedef struct sim__thread {
  CUcontext ctx;                /* current context */
  CUstreamCaptureMode mode;     /* cuThreadExchangeStreamCaptureMode */
  int registered;               /* 1 once its end is watched (sim__thread_watch), 2 once it ended */
  int stream_without_ctx;       /* the current call named a default stream handle with no context */
  uint64_t enqueue_bits;        /* per nesting level of sim__enter: 1 where that call enqueues */
  uint8_t enqueue_dev[64];      /* per nesting level: the device it was counted on (core.c) */
  unsigned depth;               /* nesting level of sim__enter */
  sim__stream_t *enqueued;      /* the stream the current call last enqueued on (sim__enqueue) */
  sim__stream_t *per_thread[SIM_MAX_DEVICES]; /* this thread's per-thread stream of each device
                                                 (CU_STREAM_PER_THREAD), made at first use */
  uint64_t per_thread_gen[SIM_MAX_DEVICES];   /* the device's context generation it was made in */
} sim__thread_t;

typedef struct sim__state {
  pthread_mutex_t lock;         /* recursive; guards everything in this struct and all objects */
  int initialized;              /* cuInit succeeded */
  int in_callback;              /* > 0 while a host callback runs: the scheduler does not step */
  int oracle;                   /* race oracle on */
  int lazy;                     /* WEFT_SIM_LAZY=1: work runs only when a sync or query needs it */
  uint64_t queue_depth;         /* WEFT_SIM_QUEUE_DEPTH: an enqueue waits while its stream has more queued */
  uint64_t rng;                 /* scheduler PRNG state */
  uint64_t memory_limit;        /* bytes of memory of each device (WEFT_SIM_MEMORY) */
  uint64_t reserved;            /* bytes reserved from all devices now, all kinds */
  uint64_t dev_reserved[SIM_MAX_DEVICES]; /* of them, per device */
  int ndev;                     /* devices (WEFT_SIM_DEVICES) */
  int no_peer;                  /* WEFT_SIM_PEER=0: no device can access another's memory */
  sim__ctx_t ctxs[SIM_MAX_DEVICES]; /* primary contexts */
  uint64_t next_op_id;
  uint32_t next_lane;           /* lane 0 is the host */
  int next_stream_id;
  uint64_t next_capture_id;
  sim__vc_t host_vc;            /* the host's clock */
  sim__snap_t *host_snap;       /* cached snapshot of host_vc, or NULL when stale */
  sim__vc_t retired_vc;         /* clocks of destroyed streams that finished */
  sim__stream_t *null_streams[SIM_MAX_DEVICES]; /* each device's legacy stream (handle 0) */
  uint64_t ctx_gen[SIM_MAX_DEVICES]; /* each device's primary context's generation: a thread's
                                        per-thread stream of an older one went with it */
  sim__stream_t **busy;         /* streams with queued ops */
  size_t nbusy, capbusy;
  sim__stream_t **streams;      /* every stream alive (for cuCtxSynchronize) */
  size_t nstreams, capstreams;
  sim__capture_t *captures;     /* active captures, linked */
  sim__pool_t *default_pools[SIM_MAX_DEVICES];
  weft_sim_stats_t stats;
  uint64_t races;               /* counted races */
  weft_sim_race_t *race_log;    /* the first SIM_MAX_RACES_KEPT */
  size_t nrace_log;
  int report_at_exit;
  /* graph memory counters (cuDeviceGetGraphMemAttribute) */
  uint64_t graph_used, graph_used_high, graph_reserved, graph_reserved_high;
} sim__state_t;

extern sim__state_t sim;

/** Takes the lock and does the per-call work (count, init check, fault, progress). Returns
 * CUDA_SUCCESS or the code the call must return; sim__leave() must follow either way. */
CUresult sim__enter(sim__fn_t fn, int needs_init);
void sim__leave(void);
/** A call's result as the GPU gives it: INVALID_CONTEXT where the call named a default stream
 * handle with no current context (sim__stream_get), else r. */
CUresult sim__leave_result(CUresult r);
/** A graph call (`what`) is running on device `dev`: reports a hazard when another thread is inside
 * a driver call that enqueues work on that device (entered with a context of `dev` current, maybe
 * still waiting for the lock). Lock held. */
void sim__graph_call_check(int dev, const char *what);
/** After a call that enqueued: waits, as the driver does, until its stream has room (no more than
 * sim.queue_depth operations queued); CUDA_ERROR_LAUNCH_TIMEOUT where it never gets room (a hang
 * on a GPU). Lock held. */
CUresult sim__queue_room(void);
#define SIM_CALL(fn, expr)                                 \
  do {                                                     \
    CUresult sim_r_ = sim__enter(SIM_FN_##fn, 1);          \
    if (sim_r_ == CUDA_SUCCESS) sim_r_ = (expr);           \
    if (sim_r_ == CUDA_SUCCESS) sim_r_ = sim__queue_room(); \
    sim_r_ = sim__leave_result(sim_r_);                    \
    sim__leave();                                          \
    return sim_r_;                                         \
  } while (0)
sim__thread_t *sim__self(void);
/** CUDA_ERROR_INVALID_CONTEXT unless the calling thread has a current context. */
CUresult sim__need_ctx(void);
/** The device of the calling thread's current context (0 when it has none). */
int sim__cur_dev(void);
/** Device d's legacy stream. */
static inline sim__stream_t *sim__null_stream(int dev) { return sim.null_streams[dev]; }
/** Whether work on device `dev` may touch memory of allocation a (its own device's memory, a
 * peer's with cuCtxEnablePeerAccess for cuMemAlloc memory, or cuMemPoolSetAccess for a pool's). */
int sim__dev_can_touch(int dev, const sim__alloc_t *a);
void sim__handle_add(void *obj);
void sim__handle_remove(void *obj);
/** obj if it is a live handle with this magic, else NULL. */
void *sim__handle_get(const void *obj, uint32_t magic);
void *sim__xmalloc(size_t n);
void *sim__xcalloc(size_t n, size_t size);
void *sim__xrealloc(void *p, size_t n);
/** Grows *arr (elements of `size` bytes) to hold at least `need` elements. */
void sim__grow(void *arr, size_t *cap, size_t need, size_t size);
/** Counts a call of something the simulator does not implement; returns NOT_SUPPORTED. */
CUresult sim__unimplemented(void);

/* ---- device.c: device, context, graph memory attributes ---- */

void sim__device_graph_used(int64_t delta);
void sim__device_graph_reserved(int64_t delta);

/* ---- stream.c ---- */

struct sim__stream {
  uint32_t magic;
  int id;                     /* cuStreamGetId; 0 for the legacy stream */
  int dev;                    /* the device of the context it was made in */
  int is_null;                /* a device's legacy stream */
  unsigned flags;
  int priority;
  uint32_t lane;              /* vector-clock lane */
  sim__op_t *head, *tail;
  uint64_t issued, done;      /* ops issued, ops completed (stream order) */
  sim__links_t links;         /* the other streams its issued work follows (event waits) */
  int pooled;                 /* a pool allocation was made on it: others may follow it (links) */
  uint64_t room_taken;        /* queued ops that take room in the launch queue (sched.c: not event
                                 records or waits) */
  sim__vc_t vc;               /* clock of the last executed op */
  sim__snap_t *last_snap;     /* the host snapshot last joined (skip re-joining it) */
  int destroyed;              /* user destroyed it; freed once idle */
  int busy_index;             /* index in sim.busy, -1 if idle */
  size_t all_index;           /* index in sim.streams */
  /* capture */
  sim__capture_t *cap;        /* the capture this stream takes part in, or NULL */
  sim__node_t **deps;         /* its current capture dependencies */
  size_t ndeps, capdeps;
  CUgraphEdgeData *edge_buf;  /* zeroed edge data returned by cuStreamGetCaptureInfo */
  size_t capedge;
  CUaccessPolicyWindow apw;   /* recorded CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW */
  int has_apw;
};

/** The stream behind a handle, or NULL: 0 and CU_STREAM_LEGACY are the current device's legacy
 * stream, CU_STREAM_PER_THREAD the calling thread's per-thread stream of it (sim__stream_default). */
sim__stream_t *sim__stream_get(CUstream h);
/** A default handle (0, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD) as device dev's: its legacy
 * stream, or the calling thread's per-thread stream of dev, made at first use: a blocking stream
 * of its own (it can be captured, unlike the legacy stream), destroyed with dev's primary context.
 * Any other handle: NULL. */
sim__stream_t *sim__stream_default(CUstream h, int dev);
/** Made once, at the first driver call: the key whose destructor ends a thread's driver state
 * (sim__thread_end). */
void sim__thread_end_key(void);
/** At a thread's first driver call: its end is seen (sim__thread_end runs then). */
void sim__thread_watch(void);
/** Frees a destroyed stream once idle. */
void sim__stream_maybe_free(sim__stream_t *s);
/** Submits act to s: a graph node when s captures, else a queued op. Takes ownership of act's
 * contents in every case. `type` is the node type when captured. */
CUresult sim__submit(sim__stream_t *s, sim__action_t *act, CUgraphNodeType type);

/* ---- event.c ---- */


struct sim__einst {
  int refs;
  int done;
  sim__links_t links; /* what the recording point follows in stream order (its stream's included) */
  sim__vc_t vc;       /* clock of the recording point (oracle on) */
  uint64_t time;      /* virtual time at completion (ops executed) */
};

struct sim__event {
  uint32_t magic;
  unsigned flags;
  int dev;                  /* the device of the context it was made in: recorded only there */
  int refs;                 /* user handle + ops/nodes referencing it */
  int destroyed;
  sim__einst_t *latest;     /* latest non-captured record, or NULL if never recorded */
  sim__capture_t *cap;      /* capture it was last recorded in (NULL if outside) */
  sim__node_t **cap_deps;   /* the capture dependencies at that record */
  size_t ncap_deps;
  int cap_ended;            /* last recorded in a capture that has ended: unusable until re-recorded */
};

sim__einst_t *sim__einst_new(void);
void sim__einst_unref(sim__einst_t *i);
void sim__einst_complete(sim__einst_t *i, const sim__vc_t *vc);
void sim__event_ref(sim__event_t *e);
void sim__event_unref(sim__event_t *e);
/** Forgets capture state of events recorded into cap (at its end). */
void sim__events_capture_ended(sim__capture_t *cap);

/* ---- memory.c: regions, allocations, copies ---- */

typedef enum sim__alloc_kind { SIM_ALLOC_PLAIN, SIM_ALLOC_POOL, SIM_ALLOC_GRAPH } sim__alloc_kind_t;

/** A mapped range of host memory standing for device memory, with its access history. */
struct sim__region {
  uintptr_t base;
  size_t size;          /* mapped bytes */
  int allocated;        /* an allocation is live in it (in execution order) */
  int counted;          /* counted in sim.reserved */
  sim__hist_t hist;
  sim__who_t last_free; /* who freed it last (for use-after-free reports) */
  int has_last_free;
};

/** One allocation as the host sees it. */
struct sim__alloc {
  sim__alloc_kind_t kind;
  int dev;               /* the device whose memory it is */
  CUdeviceptr ptr;
  size_t bytes;          /* requested */
  size_t size;           /* rounded to SIM_ALIGN */
  sim__region_t *region;
  int host_valid;        /* in the address map: API calls may name it */
  /* pool allocations */
  sim__pool_t *pool;
  int alloc_stream;      /* the stream id it was allocated on, and that stream's issue count */
  uint64_t alloc_seq;    /* after the allocation (sim__links_t) */
  struct sim__chunk *chunk;
  /* graph allocations */
  int refs;              /* graph nodes and exec nodes naming it */
  int live;              /* allocated in execution order */
  int host_live;         /* allocated as the host sees it (launched, not yet freed) */
  int mapped;            /* counted in graph reserved memory */
  int inflight;          /* launches issued and not completed of execs that allocate it */
  size_t list_index;     /* in graph.c's list of graph allocations */
  CUmemPoolProps props;
};

sim__region_t *sim__region_new(size_t size);
void sim__region_free(sim__region_t *r);
sim__region_t *sim__region_find(uintptr_t p);
/** Reserves `size` bytes of device `dev` against WEFT_SIM_MEMORY; 0 or -1 when over it. */
int sim__reserve(int dev, uint64_t size);
void sim__unreserve(int dev, uint64_t size);
void sim__addr_insert(sim__alloc_t *a);
void sim__addr_remove(sim__alloc_t *a);
/** The host-valid allocation whose base is exactly p, or NULL. */
sim__alloc_t *sim__addr_exact(CUdeviceptr p);
/** Whether [p, p+n) lies inside one host-valid allocation. */
int sim__addr_contains(CUdeviceptr p, size_t n);
/** The host-valid allocation containing [p, p+n), or NULL. */
sim__alloc_t *sim__addr_owner(CUdeviceptr p, size_t n);
size_t sim__round(size_t n);
/** Runs the stream-ordered free of a cuMemAlloc allocation (cuMemFreeAsync accepts them). */
void sim__plain_free_executed(sim__alloc_t *a, const sim__actx_t *ctx);

/* ---- pool.c ---- */

typedef struct sim__chunk {
  struct sim__chunk *next;
  sim__region_t *region;
  size_t size;
  uint32_t free_lane;   /* lane of the stream that freed it */
  uint32_t free_tick;   /* tick of the free (once executed) */
  int executed;         /* the free has run */
  sim__alloc_t *pending; /* the allocation whose free has not run yet (NULL once it ran) */
} sim__chunk_t;

struct sim__pool {
  uint32_t magic;
  CUmemPoolProps props;     /* props.location.id: the device whose memory it holds */
  uint32_t access;          /* bit d: device d may access its memory (its own always) */
  uint64_t threshold;
  int reuse_follow, reuse_opportunistic, reuse_internal;
  uint64_t reserved, reserved_high, used, used_high;
  sim__chunk_t *free;   /* freed chunks, newest first */
  size_t live;          /* allocations not yet freed (host view) + frees not yet executed */
  int destroyed;
  int is_default;
};

sim__pool_t *sim__pool_new(const CUmemPoolProps *props);
/** At a synchronisation: releases freed memory above each pool's release threshold. */
void sim__pools_release(void);
void sim__pool_free_executed(sim__alloc_t *a, const sim__who_t *who);
/** Frees a graph allocation or pool allocation in stream order (cuMemFreeAsync, not captured). */

/* ---- nccl.c: the simulated NCCL ---- */

/** Whether the fused NCCL operation of act can run: every partner is at its stream's head. */
int sim__nccl_ready(const sim__action_t *act);
/** Runs the fused NCCL operation at s's head together with its partners, popping all of them. */
void sim__nccl_run(sim__stream_t *s);
void sim__nccl_release(sim__action_t *act);
/** Whether any NCCL operation is queued (waiting for partners, or not yet run). */
/** Whether the queued NCCL action `act` names a buffer for which in(ptr) holds. */
int sim__nccl_names(const sim__action_t *act, int (*in)(CUdeviceptr));
int sim__nccl_pending(void);
/** Whether a queued NCCL operation may wait for a rank of another process (whose posts only a
 * look at the board sees: the scheduler polls). */
int sim__nccl_remote_pending(void);
/** How long a synchronisation waits for NCCL partners that do not come (WEFT_SIM_NCCL_WAIT_MS,
 * default 10000 ms). */
long sim__nccl_wait_ms(void);
/** t plus ms milliseconds (a deadline for pthread_cond_timedwait). */
struct timespec sim__after_ms(struct timespec t, long ms);
/** A captured NCCL operation's copy for a graph (instantiation). */
void sim__nccl_clone(sim__action_t *dst, const sim__action_t *src);
/** At a launch's start: each NCCL node of x becomes an operation of this launch (sequence numbers
 * taken now, in node order), queued with its clique. */
void sim__nccl_exec_start(sim__exec_t *x);
/** Whether NCCL node `node` of the running launch of x can run (its partners are ready too). */
int sim__nccl_node_ready(const sim__exec_t *x, size_t node);
/** Runs NCCL node `node` of x's running launch with its partners (graph nodes or stream ops),
 * finishing every one of them. */
void sim__nccl_run_node(sim__exec_t *x, size_t node);
/** Finishes node `node` of x's running launch that ran elsewhere (its successors, the launch's
 * end: then the launch's stream head is popped). */
void sim__exec_finish_node(sim__exec_t *x, size_t node);
/** Completes and removes the op at s's head (sched.c). */
void sim__pop_head(sim__stream_t *s);

/* ---- module.c: kernel registry, modules, launches ---- */

struct sim__kernel {
  struct sim__kernel *next;
  char *name;
  weft_sim_kernel_fn fn;
  weft_sim_ranges_fn ranges;
  int nparams;              /* -1: unknown, arguments are passed through */
  size_t *param_bytes;
};

int sim__register_kernel(const char *name, weft_sim_kernel_fn fn, weft_sim_ranges_fn ranges,
                         int nparams, const size_t *param_bytes);
/** Fills a kernel action, copying the arguments when their sizes are known. */
CUresult sim__kernel_action(sim__action_t *act, CUfunction f, const unsigned grid[3],
                            const unsigned block[3], unsigned shared, void **params, void **extra);

/* ---- capture.c ---- */

struct sim__capture {
  sim__capture_t *next;      /* in sim.captures */
  uint64_t id;
  CUstreamCaptureMode mode;
  pthread_t thread;          /* the thread that began it */
  sim__stream_t *origin;
  sim__graph_t *graph;
  int invalidated;
  sim__stream_t **streams;   /* streams taking part (origin first) */
  size_t nstreams, capstreams;
  sim__event_t **events;     /* events recorded into it (referenced), reset at its end */
  size_t nevents, capevents;
};

/** Adds a node doing act to s's capture with s's dependencies, which become {node}. */
CUresult sim__capture_add(sim__stream_t *s, sim__action_t *act, CUgraphNodeType type, sim__node_t **out);
/** For an unsafe call: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (and invalidates the captures that
 * forbid it) when the calling thread may not make one now, else CUDA_SUCCESS. */
CUresult sim__capture_unsafe(void);
/** The legacy stream while a blocking stream is capturing: a call on handle NULL or
 * CU_STREAM_LEGACY would make it depend on the capture, so it returns STREAM_CAPTURE_IMPLICIT; a
 * call that enqueues work also invalidates the capture (H100, tools/probes/probe_legacy_capture;
 * a query alone does not). CUDA_SUCCESS for any other handle or when no blocking stream captures. */
CUresult sim__legacy_implicit(CUstream h, int enqueues);
void sim__capture_invalidate(sim__capture_t *c);
/** s joins capture c with dependencies deps (a fork). */
void sim__capture_join(sim__stream_t *s, sim__capture_t *c, sim__node_t *const *deps, size_t n);
/** Replaces or extends s's capture dependencies. */
void sim__stream_set_deps(sim__stream_t *s, sim__node_t *const *deps, size_t n, int add);
/** s leaves its capture (it is being destroyed); a capture losing its origin ends, graph dropped. */
void sim__capture_stream_leave(sim__stream_t *s);

/* ---- graph.c ---- */

struct sim__node {
  uint32_t magic;
  sim__graph_t *g;
  CUgraphNodeType type;
  sim__action_t act;
  size_t index;              /* position in g->nodes */
  sim__node_t **in, **out;   /* dependencies and dependents */
  size_t nin, capin, nout, capout;
};

struct sim__graph {
  uint32_t magic;
  int refs;                  /* user handle + execs + a capture building it */
  int destroyed;
  sim__node_t **nodes;
  size_t n, cap;
  int live_execs;            /* execs instantiated and not destroyed */
  int mem_nodes;             /* number of memory nodes */
};

sim__graph_t *sim__graph_new(void);
void sim__graph_unref(sim__graph_t *g);
/** Adds a node (validating deps belong to g); takes ownership of act. */
CUresult sim__graph_add(sim__graph_t *g, CUgraphNodeType type, sim__action_t *act,
                        sim__node_t *const *deps, size_t ndeps, sim__node_t **out);
sim__node_t *sim__node_get(CUgraphNode h);
/** A new graph allocation of `bytes` (address fixed now). */
sim__alloc_t *sim__galloc_new(size_t bytes, const CUmemPoolProps *props);
void sim__galloc_ref(sim__alloc_t *a);
void sim__galloc_unref(sim__alloc_t *a);
/** The graph allocation with base p (host-valid), or NULL. */
sim__alloc_t *sim__galloc_find(CUdeviceptr p);
/** Executes an alloc/free node of a graph allocation. */
void sim__galloc_exec_alloc(sim__alloc_t *a, const sim__actx_t *ctx);
void sim__galloc_exec_free(sim__alloc_t *a, const sim__actx_t *ctx);
void sim__galloc_trim(void);

/* ---- graph_exec.c ---- */

typedef struct sim__xnode {
  sim__action_t act;
  CUgraphNodeType type;
  struct fused *nccl;        /* an NCCL node's operation of the running launch (nccl.c), or NULL */
  size_t *succ;
  size_t nsucc, npred;
  uint32_t chain;            /* index into exec->lanes: nodes of one chain are totally ordered */
} sim__xnode_t;

struct sim__exec {
  uint32_t magic;
  int refs;                  /* user handle + queued launches */
  int destroyed;
  unsigned long long flags;
  sim__graph_t *graph;       /* referenced (for the one-exec rule) */
  sim__xnode_t *nodes;
  size_t n;
  uint32_t *lanes, *ticks;   /* per chain */
  uint32_t nchains;
  sim__alloc_t **outputs;    /* graph allocations allocated and not freed by the graph */
  size_t noutputs;
  /* Launches start in the order of their cuGraphLaunch calls, whatever their streams (CUDA: each
   * launch is ordered behind any previous launch of the exec): the last launch call's number and
   * the last started one's. */
  uint64_t launched, started;
  /* the launch running now (launches of one exec are serialised) */
  int running;
  sim__stream_t *run_stream;
  uint64_t run_id;           /* op id base of this launch's nodes */
  size_t *pending;           /* per node: predecessors not yet done */
  size_t *ready;             /* node indices ready to run */
  size_t nready, ndone;
  sim__einst_t **inst;       /* per node: bound event instance (record/wait nodes) */
  sim__vc_t *nvc;            /* per node clock */
  sim__vc_t start_vc;        /* clock of the launch point */
  sim__vc_t done_vc;         /* clock when the last launch completed */
};

/** Scheduler hooks for a graph launch at a stream's head. */
void sim__exec_start(sim__stream_t *s, sim__op_t *op);
/** Runs ready node i of the running launch; returns 1 when the launch completed. */
int sim__exec_step(sim__exec_t *x, size_t ready_index);
int sim__exec_node_ready(const sim__exec_t *x, size_t node);
void sim__exec_unref(sim__exec_t *x);

/* ---- fault.c ---- */

/** The injected failure for this call of fn, or CUDA_SUCCESS. */
CUresult sim__fault_check(sim__fn_t fn);
int sim__fault_set(const char *spec);
/** cuda.h's name of fn ("cuMemAlloc"). */
const char *sim__fn_name(sim__fn_t fn);
const char *sim__error_name(CUresult r);

#endif /* WEFT_SIM_INTERNAL_H */
