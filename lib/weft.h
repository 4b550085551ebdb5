/* weft: automatic cross-stream dependencies, stream-ordered memory and capture-aware graphs for
 * the CUDA driver API.
 *
 * This header is the manual. Every function says what it does, who owns what, which stream
 * orders it and which errors it returns. Conventions that hold everywhere:
 *   - Every function that can fail returns a weft_status_t. On failure every object passed in is
 *     left exactly as it was and nothing is leaked; weft_last_error() then describes the failure
 *     in words on the calling thread, and after WEFT_ERR_DRIVER weft_last_driver_error() gives the
 *     driver's CUresult.
 *   - Output parameters are written only on success.
 *   - All functions are thread-safe unless a comment says otherwise.
 *   - A destroy (exec, graph, graph pool, builder, communicator) called from code that a weft
 *     call on the same object runs on the same thread (a capture handler) returns WEFT_ERR_BUSY
 *     and changes nothing: that call still reads the object.
 *   - weft loads the CUDA driver at run time (WEFT_DRIVER, see weft_options_t); nothing links
 *     libcuda. Without a driver every call that needs the GPU returns WEFT_ERR_NO_DRIVER.
 *
 * Work that reached a stream stays ordered. A call either enqueues its work or fails before
 * enqueuing any (then nothing changed; waits weft already issued for it may stay, which only
 * orders more). Once a use's work is enqueued (a launch, a copy, a graph launch, the work between
 * weft_use_begin and weft_use_end), the use is recorded and the call succeeds, even if the event
 * that marks its completion cannot be recorded at once: that event stays pending and is recorded
 * before anything else weft enqueues on that stream; any later use that must wait for the work
 * records it first, and fails without enqueuing anything if it still cannot. So a driver error
 * never leaves work running that a later free, reuse or read is not ordered after; at worst the
 * stream's next calls report the error. weft_free and resource calls follow the same rule:
 * WEFT_ERR_CORRUPTED from the guard means the block was freed (and its memory found damaged).
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0
#define WEFT_VERSION ((WEFT_VERSION_MAJOR << 16) | (WEFT_VERSION_MINOR << 8) | WEFT_VERSION_PATCH)

#if defined(__GNUC__)
#define WEFT_API __attribute__((visibility("default")))
#define WEFT_NODISCARD __attribute__((warn_unused_result))
#else
#define WEFT_API
#define WEFT_NODISCARD
#endif

/** The version of the library linked at run time, encoded as WEFT_VERSION. */
WEFT_API unsigned weft_version(void);

/* ------------------------------------------------------------------------------------------ */
/* Status                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* X(name, code, message). The one list of every status weft returns. */
#define WEFT_STATUS_MAP(X)                                                                      \
  X(OK, 0, "success")                                                                           \
  X(ERR_INVALID_ARGUMENT, -1, "invalid argument")                                               \
  X(ERR_NO_DRIVER, -2, "no usable CUDA driver (missing library, stub library or no device)")    \
  X(ERR_NOT_SUPPORTED, -3, "not supported by this driver, device or configuration")             \
  X(ERR_DRIVER, -4, "the CUDA driver returned an error (see weft_last_driver_error)")           \
  X(ERR_OUT_OF_MEMORY, -5, "out of device memory (the driver refused the allocation)")          \
  X(ERR_OVER_BUDGET, -6, "the allocation would exceed the configured memory budget")            \
  X(ERR_DOUBLE_FREE, -7, "the block was already freed")                                         \
  X(ERR_STALE_HANDLE, -8, "use after free: the handle refers to a freed or reused block")       \
  X(ERR_WRONG_DEVICE, -9, "the object belongs to another device or runtime")                    \
  X(ERR_CAPTURE, -10, "not allowed while a stream capture is active (capture violation)")       \
  X(ERR_BUSY, -11, "the object is busy or still in use")                                        \
  X(ERR_HOST_OUT_OF_MEMORY, -12, "out of host memory for weft's metadata")                      \
  X(ERR_CORRUPTED, -13, "guard check failed: memory around a block was overwritten")            \
  X(ERR_NOT_READY, -14, "the work has not completed yet")                                       \
  X(ERR_COMM, -15, "the collective library (NCCL) reported an error (see weft_last_error)")

typedef enum weft_status {
#define WEFT__STATUS_ENUM(name, code, msg) WEFT_##name = code,
  WEFT_STATUS_MAP(WEFT__STATUS_ENUM)
#undef WEFT__STATUS_ENUM
} weft_status_t;

/** A one-line description of `s` ("invalid argument"); never NULL, also for unknown codes. */
WEFT_API const char *weft_status_str(weft_status_t s);
/** The enumerator's name of `s` ("WEFT_ERR_INVALID_ARGUMENT"); "WEFT_UNKNOWN_STATUS" if unknown. */
WEFT_API const char *weft_status_name(weft_status_t s);
/** The detailed message of the last failure on this thread ("weft_alloc: bytes is 0"), or "" if
 * none. The pointer stays valid until the next failing weft call on this thread. */
WEFT_API const char *weft_last_error(void);
/** The CUresult behind the last WEFT_ERR_DRIVER / WEFT_ERR_OUT_OF_MEMORY / WEFT_ERR_NO_DRIVER on
 * this thread (CUDA_SUCCESS if none). */
WEFT_API CUresult weft_last_driver_error(void);
/** The name of a CUresult ("CUDA_ERROR_INVALID_VALUE"); works without a driver. */
WEFT_API const char *weft_driver_error_name(CUresult r);

/* ------------------------------------------------------------------------------------------ */
/* Options                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/** Which resource backs weft_alloc at the bottom of a runtime's stack. */
typedef enum weft_memory_kind {
  WEFT_MEMORY_POOL = 0,   /**< weft's own sub-allocator over chunks of the async resource */
  WEFT_MEMORY_ASYNC = 1,  /**< the driver's stream-ordered pool (cuMemAllocFromPoolAsync) */
  WEFT_MEMORY_DIRECT = 2, /**< cuMemAlloc / cuMemFree (synchronous, slow; for debugging) */
} weft_memory_kind_t;

/** What launching a graph does with outputs of its previous launch that are still live. */
typedef enum weft_output_policy {
  WEFT_OUTPUT_ERROR = 0,     /**< the launch fails with WEFT_ERR_BUSY naming the live output */
  WEFT_OUTPUT_AUTO_FREE = 1, /**< the outputs are freed by the launch (AUTO_FREE_ON_LAUNCH) */
} weft_output_policy_t;

/* X(field, type, env, default, min, max, doc): every option of a runtime. Documented once here;
 * the README's options table repeats the same words. Sizes are in bytes, counts are plain. */
#define WEFT_OPTIONS_MAP(X)                                                                      \
  X(stream_count, unsigned, "WEFT_STREAM_COUNT", 8, 1, 64,                                      \
    "pool streams per runtime (all CU_STREAM_NON_BLOCKING)")                                    \
  X(high_priority_streams, unsigned, "WEFT_HIGH_PRIORITY_STREAMS", 2, 0, 64,                    \
    "how many of the pool streams get the device's highest priority; must be <= stream_count")  \
  X(adopt_streams, unsigned, "WEFT_ADOPT_STREAMS", 8, 0, 63,                                    \
    "streams weft did not create that weft_stream_adopt can take in (at most 64 - stream_count)") \
  X(event_ring, unsigned, "WEFT_EVENT_RING", 64, 4, 4096,                                       \
    "events per stream ring, a power of two; an evicted tick is waited on conservatively")      \
  X(memory, unsigned, "WEFT_MEMORY", WEFT_MEMORY_POOL, 0, 2,                                    \
    "bottom resource: 0 pool, 1 async (driver pool), 2 direct (cuMemAlloc)")                    \
  X(pool_chunk_bytes, uint64_t, "WEFT_POOL_CHUNK_BYTES", 64ull << 20, 1ull << 20, 1ull << 40,    \
    "bytes the pool requests from its upstream at a time (larger requests get their own chunk)") \
  X(release_threshold, uint64_t, "WEFT_RELEASE_THRESHOLD", UINT64_MAX, 0, UINT64_MAX,            \
    "freed bytes the driver's pool under weft (memory 0 and 1) keeps cached at synchronisations") \
  X(budget_bytes, uint64_t, "WEFT_BUDGET_BYTES", 0, 0, UINT64_MAX,                              \
    "hard limit on live device bytes of the process on this device; 0 means no limit")          \
  X(guard, unsigned, "WEFT_GUARD", 0, 0, 1,                                                     \
    "1 adds canaries, poison on free, quarantine and stricter handle checks")                   \
  X(output_policy, unsigned, "WEFT_OUTPUT_POLICY", WEFT_OUTPUT_ERROR, 0, 1,                     \
    "graph relaunch with live outputs: 0 error, 1 free them automatically")                     \
  X(log_format, unsigned, "WEFT_LOG_FORMAT", 0, 0, 1,                                           \
    "columns of the log_path CSV: 0 weft's, 1 RMM's (Thread,Time,Action,Pointer,Size,Stream)")  \
  X(stream_cache_bytes, uint64_t, "WEFT_STREAM_CACHE_BYTES", 64ull << 20, 0, UINT64_MAX,        \
    "bytes of freed blocks the streams keep for their next weft_alloc of the same size (0: none)") \
  X(lazy_records, unsigned, "WEFT_LAZY_RECORDS", 1, 0, 1,                                       \
    "1: a stream's uses join one pending event, recorded only when another stream or the host needs it; " \
    "after a late wait on it (for an older use than the newest), after each use, until 16 waits in a row " \
    "need only its newest use")

/** Runtime options. Start from weft_options_default() (or weft_options_from_env()), change
 * fields, pass to weft_runtime_get(). Plain data: copy it freely. */
typedef struct weft_options {
#define WEFT__OPTION_FIELD(field, type, env, def, lo, hi, doc) type field;
  WEFT_OPTIONS_MAP(WEFT__OPTION_FIELD)
#undef WEFT__OPTION_FIELD
  /** Budget shared by all processes that name the same key (POSIX shared memory "/weft-<key>"),
   * so parallel test processes on one GPU share one limit; NULL or "" means process-local.
   * At most WEFT_BUDGET_KEY_MAX characters of [A-Za-z0-9_.-]. Environment: WEFT_BUDGET_SHARED.
   * Default NULL. */
  const char *budget_shared_key;
  /** CSV allocation log: a path of at most WEFT_LOG_PATH_MAX bytes, or NULL for none.
   * Environment: WEFT_LOG. Default NULL. */
  const char *log_path;
} weft_options_t;

/** The longest options.log_path, in bytes without the terminating NUL (the runtime keeps a copy). */
#define WEFT_LOG_PATH_MAX 511
/** The longest shared budget key (options.budget_shared_key, weft_budget_create), in characters. */
#define WEFT_BUDGET_KEY_MAX 128

/** The built-in defaults, ignoring the environment. */
WEFT_API weft_options_t weft_options_default(void);
/** Overrides fields of *opts from WEFT_* environment variables that are set (an empty one counts
 * as unset). A numeric variable is decimal digits, optionally followed by one K, M or G (2^10,
 * 2^20, 2^30; either case): no sign, whitespace or 0x, and leading zeros are not octal ("010" is
 * 10). Errors: WEFT_ERR_INVALID_ARGUMENT naming the variable when one does not parse, overflows
 * 64 bits or is out of range, or when weft_options_validate() rejects the result; *opts is
 * unchanged then. */
WEFT_API WEFT_NODISCARD weft_status_t weft_options_from_env(weft_options_t *opts);
/** Checks every field: numeric ranges, the cross-field rules, the lengths of log_path and
 * budget_shared_key and the key's characters. Errors: WEFT_ERR_INVALID_ARGUMENT naming the first
 * bad field and its range (weft_last_error()). */
WEFT_API WEFT_NODISCARD weft_status_t weft_options_validate(const weft_options_t *opts);
/** Writes one line per option (name, value, environment variable, meaning) to `out`. */
WEFT_API void weft_options_print(const weft_options_t *opts, FILE *out);

/* ------------------------------------------------------------------------------------------ */
/* Driver                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/** What weft loaded as the CUDA driver. */
typedef struct weft_driver_info {
  const char *path;     /**< the library weft opened ("libcuda.so.1", a path, or "sim") */
  int version;          /**< cuDriverGetVersion(), e.g. 13000 */
  int device_count;     /**< cuDeviceGetCount() */
  int is_simulator;     /**< 1 when the CPU simulator answers instead of a GPU */
  int via_proc_address; /**< 1 when entry points came from cuGetProcAddress, 0 from dlsym */
  unsigned missing_optional; /**< optional entry points the driver lacks */
} weft_driver_info_t;

/** Loads the driver once per process (thread-safe) from the WEFT_DRIVER environment variable:
 * unset or "" → libcuda.so.1; "sim" → the simulator (linked into the program, else
 * libweft_sim.so); anything else → that path. Calls cuInit(0).
 * Errors: WEFT_ERR_NO_DRIVER (library missing, a stub library, no entry points, cuInit failed);
 * the same answer is returned on every later call. */
WEFT_API WEFT_NODISCARD weft_status_t weft_driver_info(weft_driver_info_t *info);

/* ------------------------------------------------------------------------------------------ */
/* Runtime                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/** One per CUDA device ordinal and process: owns the stream pool, the tracker, the memory
 * resources and the counters. Reference counted; every function on it is thread-safe.
 * The calling thread's current context: a call that reaches the driver for a runtime and needs a
 * current context (an allocation, a synchronisation, a capture, work on the legacy or per-thread
 * stream) makes that device's primary context current on the thread (as cudaSetDevice would) and
 * leaves it current; weft_launch and weft_use_begin / weft_use_end on a stream that names its
 * context need none (the driver's stream-ordered calls take it from the stream) and leave the
 * thread's current context as it was. A thread that mixes weft with other CUDA code and several
 * devices sets its device again after a weft call for another device; the PyTorch adapter
 * (lib/torch) does so for every call. */
typedef struct weft_runtime weft_runtime_t;
/** A pooled CU_STREAM_NON_BLOCKING stream of a runtime (never the legacy NULL stream). Stream
 * handles stay valid as long as their runtime. */
typedef struct weft_stream weft_stream_t;

/** Gets the runtime of device `device`, creating it on first use with `opts` (NULL: defaults
 * plus WEFT_* environment overrides) and retaining it: every successful get needs one
 * weft_runtime_release(). Later gets return the same runtime and ignore `opts`.
 * Errors: INVALID_ARGUMENT (bad options, out is NULL), NO_DRIVER, WRONG_DEVICE (no such
 * ordinal), DRIVER / OUT_OF_MEMORY (creating streams or events failed; nothing is left behind),
 * BUSY (the process's 128 stream lanes, stream_count + adopt_streams per runtime, are taken). */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_get(int device, const weft_options_t *opts, weft_runtime_t **out);
/** Adds a reference. Errors: STALE_HANDLE if the runtime was already released to zero. */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_retain(weft_runtime_t *rt);
/** Drops a reference; the last one synchronises the runtime's streams, frees every live block,
 * destroys streams, events and resources. A later weft_runtime_get() creates it anew; a call on a
 * handle of the released runtime (or any of its streams and blocks) returns STALE_HANDLE.
 * Errors: STALE_HANDLE (already released), BUSY (a capture on one of its streams is active, or
 * graphs, graph pools, builders or resources made from it still exist; nothing changed),
 * DRIVER (the last release: a teardown call failed; the first failure is reported, and the
 * runtime is released all the same, as close(2) closes: the rest is torn down, what the driver
 * refused to destroy is left to it, and a retry says STALE_HANDLE). */
WEFT_API weft_status_t weft_runtime_release(weft_runtime_t *rt);
/** The device ordinal, or -1 for a released runtime. */
WEFT_API int weft_runtime_device(const weft_runtime_t *rt);
/** The options the runtime was created with. Errors: STALE_HANDLE. */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_options(const weft_runtime_t *rt, weft_options_t *out);
/** Blocks until all work on all of the runtime's streams is complete; afterwards no stream waits
 * for any of that work again. A capture that code outside weft begins on an exposed stream during
 * the call is left intact (the call then fails with CAPTURE). Errors: STALE_HANDLE, CAPTURE (a
 * stream is capturing), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_synchronize(weft_runtime_t *rt);
/** Records the points weft left pending on the runtime's exposed streams (weft_stream_raw,
 * weft_stream_adopt): a free's or an allocation's there, recorded otherwise when another stream
 * or the host first needs it. Call it before code outside weft begins a capture on such a
 * stream: while the capture lasts, a pending point of that stream cannot be recorded (the event
 * would land in the capture). A stream already capturing is skipped. Cheap when nothing is
 * pending. Errors: STALE_HANDLE, DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_record_pending(weft_runtime_t *rt);
/** Gives back what the runtime holds beyond its live blocks: the blocks its streams cached for
 * reuse (options.stream_cache_bytes), each freed to its resource on its stream, then the stack's
 * idle memory (weft_resource_trim of weft_runtime_resource, keeping nothing). A stream taking
 * part in a capture keeps its cache. Errors: STALE_HANDLE, INVALID_ARGUMENT, CAPTURE, DRIVER
 * (the first failure; the rest is given back regardless). */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_trim(weft_runtime_t *rt);
/** Lets rt's device access peer's memory, so that work on rt's streams may use peer's blocks
 * (weft_launch, weft_use_begin and the tracked operations take blocks of other runtimes; see
 * "Blocks of other devices" below): enables peer access from rt's context to peer's
 * (cuCtxEnablePeerAccess) and gives rt's device read-write access to the memory pools of peer's
 * resource stack (cuMemPoolSetAccess). weft calls it at the first such use; call it earlier to
 * keep its cost out of a measured region. Lasts until either runtime's last release; idempotent;
 * rt == peer does nothing. Graph pools and resources made with weft_*_create are not covered.
 * Errors: STALE_HANDLE, NOT_SUPPORTED (the devices cannot access each other's memory:
 * cuDeviceCanAccessPeer says no; copy with weft_copy_block, which needs no access), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_enable_peer_access(weft_runtime_t *rt, weft_runtime_t *peer);

/** Per-runtime counters (monotonic since creation). */
typedef struct weft_counters {
  uint64_t uses;             /**< weft_use_end calls (tracked pieces of work) */
  uint64_t accesses;         /**< block accesses declared by those uses */
  uint64_t waits_issued;     /**< cuStreamWaitEvent calls weft made */
  uint64_t waits_skipped;    /**< conflicts that needed no wait: already implied by stream order,
                                  earlier waits (transitively) or host knowledge */
  uint64_t waits_host_known; /**< of waits_skipped, those skipped because the host saw the work
                                  complete */
  uint64_t events_recorded;  /**< cuEventRecord calls */
  uint64_t ring_evictions;   /**< waits on an evicted tick served by a newer event */
  uint64_t late_waits;       /**< waits for an event that covers later uses of its stream than the
                                  one needed (options.lazy_records: those uses joined one tick);
                                  that stream then records after each use, until its waiters
                                  have needed only its newest use 16 times in a row */
  uint64_t busy_waits;       /**< times a call waited for another thread's use to finish enqueuing
                                  its work on a stream: a use of the same stream, a use that
                                  conflicts with that work, or a host wait on it (uses enqueue
                                  their work without weft's lock, so other streams never wait) */
  uint64_t allocs, frees;    /**< weft_alloc / weft_free successes */
  uint64_t cached_blocks;    /**< freed blocks the streams keep now (options.stream_cache_bytes) */
  uint64_t cached_bytes;     /**< their bytes (still live for the resource stack) */
  uint64_t ring_growths;     /**< event rings doubled rather than drop an event the device had not
                                  completed: a stream whose waits must stay exact (one that ran a
                                  collective, send, receive or stream value wait, or waited for
                                  such a stream, in a process of several runtimes for collectives)
                                  never lets a later event stand in for a needed one */
  uint64_t staged_copies;    /**< host copies of pageable memory made through the runtime's
                                  page-locked buffers, a chunk of up to 1 MiB each
                                  (weft_copy_to_block, weft_copy_from_block) */
  uint64_t stage_buffers;    /**< those page-locked buffers the runtime holds now (1 MiB each) */
} weft_counters_t;
/** Reads the counters. Errors: STALE_HANDLE, INVALID_ARGUMENT. */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_counters(const weft_runtime_t *rt, weft_counters_t *out);
/** Prints the counters, the stream pool and memory statistics to `out`. */
WEFT_API void weft_runtime_print(const weft_runtime_t *rt, FILE *out);

/* ------------------------------------------------------------------------------------------ */
/* Streams                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef enum weft_priority {
  WEFT_PRIORITY_NORMAL = 0, /**< the device's least priority */
  WEFT_PRIORITY_HIGH = 1,   /**< the device's greatest priority */
} weft_priority_t;

/** Pool stream `index` (0 .. stream_count-1; the last high_priority_streams are high priority).
 * Errors: STALE_HANDLE, INVALID_ARGUMENT (index out of range). */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_get(weft_runtime_t *rt, unsigned index, weft_stream_t **out);
/** The next stream of the given priority, round-robin. Errors: STALE_HANDLE, NOT_SUPPORTED (no
 * stream of that priority in the pool), INVALID_ARGUMENT. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_next(weft_runtime_t *rt, weft_priority_t prio, weft_stream_t **out);
/* weft_stream_auto() is declared after weft_access_t below. */
/** The driver stream, for the program's own launches inside a use (see weft_use_begin); NULL for
 * NULL or a stream of a released runtime (weft_last_error says which). Code outside weft may then
 * enqueue on it or begin a capture on it: weft records that stream's events at once from then on
 * (options.lazy_records) and asks the driver about captures on it. */
WEFT_API CUstream weft_stream_raw(const weft_stream_t *s);
/** The stream's index in its pool, or -1 for an invalid handle. */
WEFT_API int weft_stream_index(const weft_stream_t *s);
/** The runtime the stream belongs to. */
WEFT_API weft_runtime_t *weft_stream_runtime(const weft_stream_t *s);
/** The driver's priority value (cuStreamGetPriority) and the stream's unique id (cuStreamGetId;
 * NOT_SUPPORTED on drivers without it). */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_priority(const weft_stream_t *s, int *out);
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_id(const weft_stream_t *s, unsigned long long *out);
/** Blocks until the stream's work is complete; the host then knows it, and no stream waits for
 * it again. Errors: STALE_HANDLE, CAPTURE (the stream is capturing), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_synchronize(weft_stream_t *s);
/** Non-blocking: WEFT_OK if all work is complete (the host then knows it), NOT_READY if not. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_query(weft_stream_t *s);
/** The weft stream for `raw`, a CUstream weft did not create: another library's stream (of the
 * runtime's device), the legacy default stream (NULL or CU_STREAM_LEGACY), or the calling
 * thread's per-thread default stream (CU_STREAM_PER_THREAD; that weft stream is then usable on
 * this thread only, others get INVALID_ARGUMENT and adopt their own). Work on it is tracked like
 * on a pool stream: uses there wait for, and are waited for by, conflicting uses on other streams
 * with the same minimal-wait rules, and weft_alloc on it hands out memory usable there with no
 * wait (stream order), as a framework's caching allocator does. Adopting the same handle again
 * gives the same weft stream; an adoption lasts as long as the runtime (a per-thread stream's, as
 * long as its thread, below) and takes one of options.adopt_streams slots (each thread's CU_STREAM_PER_THREAD is a stream of its own, also
 * after another thread that ended had the same pthread_t: a thread keeps its slot while it lives;
 * once every slot is taken, an ended thread's slot is taken back for the next adopting thread,
 * after a wait for the ended thread's work there); weft never destroys the stream (keep it alive
 * while weft may use it: until the runtime is released). Code outside weft may enqueue on it and capture it:
 * weft asks the driver about its capture state before each call on it, and a free there is
 * ordered after everything enqueued on it before the free, weft's or not (as cuMemFreeAsync):
 * another stream reuses the memory only after that work. weft never records an event into a
 * capture outside code began on it, whichever thread begins it (it asks the driver before and
 * after each record for others, and instead of synchronising the stream it records an event and
 * waits for that), so no weft call invalidates such a capture. A use's point there is recorded
 * at once; a free's or an allocation's point is recorded when another stream or the host first
 * needs it (an event per free would double the cost of a framework's allocation pair), which
 * cannot happen while outside code captures the stream: memory freed there is then reused
 * elsewhere only once the capture has ended, and a use elsewhere of a block allocated there
 * since its last use fails with CAPTURE (nothing changed) until then. Before beginning a capture
 * on it, call weft_runtime_record_pending (the PyTorch adapter does, in its capture hook) and
 * neither happens. A per-thread stream differs in two ways, as only its own thread can name it:
 * every point there is recorded at once (a free's and an allocation's too), and only that thread
 * asks the driver about its captures (other threads go by what weft last learnt, until that
 * thread's next call on it, or its end). When a thread that adopted its per-thread stream ends,
 * a thread-exit handler waits until weft's own work on that stream (of each runtime where it
 * still holds a slot) is complete, before the driver tears the stream down: on the GPU, that
 * teardown with work still queued on memory of a stream-ordered pool allocated in the stream's
 * order (weft's pool grows from one) never returns, so the thread would never end
 * (CUDA_SEMANTICS.md). The thread's end thus blocks until that work is done; work other code
 * enqueued there after weft's is not waited for (queue none on pool memory that may still be
 * pending when the thread ends). Not on the main thread (exit() does not tear its streams down),
 * nor for a stream in a capture weft knows; needs the C library's __cxa_thread_atexit_impl
 * (glibc; elsewhere synchronise the stream before the thread ends). weft_stream_index gives stream_count and above for
 * adopted streams; weft_stream_raw gives `raw` back.
 * Errors: STALE_HANDLE, INVALID_ARGUMENT (NULL out, or one of weft's own pool streams), BUSY
 * (every slot is taken: by other libraries' streams, live threads, or ended threads whose slot
 * cannot be taken back now, as one in a capture weft knows or with a host wait in progress),
 * DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_adopt(weft_runtime_t *rt, CUstream raw, weft_stream_t **out);
/** Whether work enqueued on s now would be captured: *out is 1 while s takes part in a capture,
 * weft's or one begun by code outside weft (asked of the driver for streams outside code can
 * reach), 0 otherwise. Errors: STALE_HANDLE, INVALID_ARGUMENT, DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_is_capturing(weft_stream_t *s, int *out);

/* ------------------------------------------------------------------------------------------ */
/* Blocks and uses                                                                             */
/* ------------------------------------------------------------------------------------------ */

/** A handle to one device allocation: a record pointer and the generation it was issued for.
 * Plain data: copy it freely. A handle whose block was freed (or whose record now holds another
 * allocation) is stale: every call with it returns STALE_HANDLE (or DOUBLE_FREE for weft_free). */
typedef struct weft_block {
  struct weft__block *rec; /**< private record; NULL means "no block" */
  uint64_t gen;            /**< generation of the record when the handle was issued */
} weft_block_t;

typedef enum weft_access_kind {
  WEFT_READ = 1,
  WEFT_WRITE = 2,
  WEFT_READ_WRITE = 3,
} weft_access_kind_t;

/** One block touched by a piece of work, and how. */
typedef struct weft_access {
  weft_block_t block;
  weft_access_kind_t kind;
} weft_access_t;

/** The stream of `prio` that needs the fewest waits for `accesses` (e.g. the last writer's),
 * ties going to the least recently used; streams taking part in a capture are not candidates.
 * n may be 0 (then: least recently used). Errors: STALE_HANDLE (a block or the runtime),
 * WRONG_DEVICE, NOT_SUPPORTED, INVALID_ARGUMENT, CAPTURE (every stream of that priority takes
 * part in a capture). */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_auto(weft_runtime_t *rt, weft_priority_t prio, const weft_access_t *accesses, size_t n, weft_stream_t **out);

/** Device address of a block. Errors: STALE_HANDLE, INVALID_ARGUMENT. */
WEFT_API WEFT_NODISCARD weft_status_t weft_block_ptr(weft_block_t b, CUdeviceptr *out);
/** Size in bytes as requested. Errors: STALE_HANDLE, INVALID_ARGUMENT. */
WEFT_API WEFT_NODISCARD weft_status_t weft_block_size(weft_block_t b, size_t *out);
/** The interned tag given at allocation ("" if none); valid for the process's life. */
WEFT_API const char *weft_block_tag(weft_block_t b);

/** Makes stream `s` wait for exactly the earlier work that conflicts with `accesses`
 * (read-after-write, write-after-read, write-after-write) and is not already ordered before it
 * (by stream order, earlier waits, or the host having seen it complete). Then enqueue the work on
 * weft_stream_raw(s) and call weft_use_end() with the same accesses. A use takes effect at
 * weft_use_end: host threads that use one block concurrently must order those uses themselves.
 * The same block may appear more than once (the strongest kind counts). One use may be open per
 * stream; one-call operations (weft_launch, copies) on s may run while it is open.
 *
 * Blocks of other devices: `accesses` may name blocks of other runtimes (devices) as well; s's
 * device then needs access to their memory, which weft enables at the first such use
 * (weft_runtime_enable_peer_access). The streams of every runtime of the process share one
 * clock, so such a use waits for exactly the conflicting work of the other devices' streams (a
 * cross-device event wait each, as few as on one device: the transitive reduction), and their
 * later conflicting work waits for it the same way. On a capturing stream such a block joins the
 * graph's access summary like any other, so each launch is ordered that way. The process has
 * 128 stream lanes in all: each runtime takes stream_count + adopt_streams of them (BUSY from
 * weft_runtime_get when they are taken).
 * Errors: STALE_HANDLE (a block or the runtime), INVALID_ARGUMENT (bad kind, NULL with n > 0),
 * BUSY (s already has an open use), DRIVER (a wait failed; nothing recorded), and with blocks of
 * other devices NOT_SUPPORTED (the devices cannot access each other's memory; nothing done). */
WEFT_API WEFT_NODISCARD weft_status_t weft_use_begin(weft_stream_t *s, const weft_access_t *accesses, size_t n);
/** Records the work enqueued since weft_use_begin as the newest use of every block in `accesses`
 * and closes the use (see "Work that reached a stream stays ordered" above).
 * Errors: as weft_use_begin; INVALID_ARGUMENT when s has no open use or `accesses` differ from
 * those given to weft_use_begin (the use then stays open). */
WEFT_API WEFT_NODISCARD weft_status_t weft_use_end(weft_stream_t *s, const weft_access_t *accesses, size_t n);

/** A kernel launch as the driver takes it. */
typedef struct weft_launch {
  CUfunction func;
  unsigned grid[3];      /**< grid dimensions; 0 is read as 1 */
  unsigned block[3];     /**< block dimensions; 0 is read as 1 */
  unsigned shared_bytes; /**< dynamic shared memory */
  void **params;         /**< kernelParams for cuLaunchKernel */
} weft_launch_t;

/** weft_use_begin + cuLaunchKernel on s + weft_use_end, atomically as far as other threads'
 * uses can tell (uses of s, or conflicting with these accesses, wait for the launch to be
 * enqueued; other streams' go on meanwhile). Errors: as weft_use_begin; DRIVER if the launch fails (the use is not
 * recorded then, though waits already issued stay). */
WEFT_API WEFT_NODISCARD weft_status_t weft_launch(weft_stream_t *s, const weft_launch_t *launch, const weft_access_t *accesses, size_t n);

/** Blocks the host until all recorded work touching the block is complete (the host then knows
 * it). Errors: STALE_HANDLE, CAPTURE, DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_block_synchronize(weft_block_t b);

/* ------------------------------------------------------------------------------------------ */
/* Work weft does not see                                                                      */
/* ------------------------------------------------------------------------------------------ */

/** Makes s wait for `event` (recorded by code outside weft); later uses on s are ordered after it.
 * Errors: STALE_HANDLE, INVALID_ARGUMENT, DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_import_event(weft_stream_t *s, CUevent event);
/** Makes s wait for all work enqueued so far on `other` (a stream outside weft).
 * Errors: STALE_HANDLE, INVALID_ARGUMENT, DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_import_stream(weft_stream_t *s, CUstream other);
/** Gives an event (owned by the caller: cuEventDestroy it) that completes when every recorded use
 * of the block that a new access of `kind` would have to wait for is complete: for WEFT_READ the
 * last write, for WEFT_WRITE also the reads since. Code outside weft waits on it before touching
 * the block. Errors: STALE_HANDLE, INVALID_ARGUMENT, DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_block_export_event(weft_block_t b, weft_access_kind_t kind, CUevent *out);

/* ------------------------------------------------------------------------------------------ */
/* Tracked stream operations: each is one use with the accesses it implies                     */
/* ------------------------------------------------------------------------------------------ */

/** cuMemcpyHtoDAsync into block `dst` at byte `offset` (a WRITE of dst). Page-locked `src`
 * (cuMemHostAlloc, cuMemHostRegister) is copied directly and must stay valid until the copy
 * completes. Pageable `src` is first copied into page-locked buffers of the runtime, 1 MiB at a
 * time, so it may be reused as soon as the call returns (the driver's own staging of pageable
 * memory waits for the stream inside the call for larger copies, 8 MiB on an H200, where weft
 * holds its gate: see weft_copy_from_block). Inside a capture the copy is a graph node reading `src` at each launch.
 * Errors: as weft_use_begin; INVALID_ARGUMENT (range outside the block); CAPTURE when code outside
 * weft began capturing the (exposed) stream during the call. A driver failure part way through a
 * copy of several chunks leaves the chunks before it copied (each a use of its own).
 * weft_counters_t.staged_copies counts the chunks copied through the runtime's buffers. */
WEFT_API WEFT_NODISCARD weft_status_t weft_copy_to_block(weft_stream_t *s, weft_block_t dst, size_t offset, const void *src, size_t bytes);
/** cuMemcpyDtoHAsync from block `src` (a READ). Page-locked `dst` (cuMemHostAlloc,
 * cuMemHostRegister): the call returns at once and the data is in `dst` once the stream reaches
 * it (weft_stream_synchronize or weft_block_synchronize). Pageable `dst`: the driver would return
 * only once the stream reached the copy, and while waiting inside weft's enqueue it would keep
 * other threads' graph calls and uses out, which the awaited work may need (a thread per rank
 * with collectives hung so); weft copies through page-locked buffers of the runtime, 1 MiB at a
 * time, waits for each holding nothing, and returns with the data in `dst`. Inside a capture the
 * copy is a graph node writing `dst` at each launch. Errors: as weft_copy_to_block. */
WEFT_API WEFT_NODISCARD weft_status_t weft_copy_from_block(weft_stream_t *s, void *dst, weft_block_t src, size_t offset, size_t bytes);
/** cuMemcpyDtoDAsync (READ src, WRITE dst). */
WEFT_API WEFT_NODISCARD weft_status_t weft_copy_block(weft_stream_t *s, weft_block_t dst, size_t dst_offset, weft_block_t src, size_t src_offset, size_t bytes);
/* weft_copy_block between devices: dst and src may be blocks of two runtimes when s is a stream
 * of one of them; ordered as any use of another device's block (weft_use_begin, "Blocks of other
 * devices"). It is a peer copy (cuMemcpyPeerAsync), which needs no peer access. Not inside a
 * capture (CAPTURE, nothing done: CUDA cannot capture a peer copy). WRONG_DEVICE when s belongs
 * to neither block's runtime. */
/** cuMemsetD8Async / cuMemsetD32Async over a range of the block (a WRITE). For D32, offset and
 * bytes must be multiples of 4. */
WEFT_API WEFT_NODISCARD weft_status_t weft_memset8(weft_stream_t *s, weft_block_t dst, size_t offset, unsigned char value, size_t bytes);
WEFT_API WEFT_NODISCARD weft_status_t weft_memset32(weft_stream_t *s, weft_block_t dst, size_t offset, unsigned value, size_t bytes);
/** cuLaunchHostFunc with the given accesses (the function touches those blocks' memory from the
 * host: only meaningful for host-visible memory, or as an ordering point). */
WEFT_API WEFT_NODISCARD weft_status_t weft_host_func(weft_stream_t *s, CUhostFn fn, void *user, const weft_access_t *accesses, size_t n);
/** cuStreamWriteValue32/64 of `value` at byte `offset` of the block (a WRITE). The block's
 * memory must come from cuMemAlloc (a direct resource, or wrapped memory): the driver refuses
 * memory from stream-ordered pools, and weft then returns NOT_SUPPORTED saying so. NOT_SUPPORTED
 * also where the driver or device lacks (64-bit) stream memory operations. */
WEFT_API WEFT_NODISCARD weft_status_t weft_write_value32(weft_stream_t *s, weft_block_t dst, size_t offset, uint32_t value);
WEFT_API WEFT_NODISCARD weft_status_t weft_write_value64(weft_stream_t *s, weft_block_t dst, size_t offset, uint64_t value);
/** cuStreamWaitValue32/64: the stream waits until the word at `offset` satisfies `flags`
 * (CU_STREAM_WAIT_VALUE_GEQ/EQ/AND/NOR) against `value` (a READ). Same memory rule as above. The
 * stream's waits become exact (see the collectives below): a wait for its earlier work is never
 * served by an event after the value wait, which may wait for what the waiter does later. */
WEFT_API WEFT_NODISCARD weft_status_t weft_wait_value32(weft_stream_t *s, weft_block_t src, size_t offset, uint32_t value, unsigned flags);
WEFT_API WEFT_NODISCARD weft_status_t weft_wait_value64(weft_stream_t *s, weft_block_t src, size_t offset, uint64_t value, unsigned flags);
/** Sets the stream's L2 access-policy window to the block (hit_ratio in [0,1], persisting hits,
 * streaming misses); pass a null block ({0}) to clear it. NOT_SUPPORTED where unavailable. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stream_set_hot_block(weft_stream_t *s, weft_block_t b, float hit_ratio);

/* ------------------------------------------------------------------------------------------ */
/* Memory: blocks                                                                              */
/* ------------------------------------------------------------------------------------------ */

/** Allocates `bytes` (> 0) of device memory, usable by work on `s` enqueued after this call and
 * by work on any other stream through the tracker (the first use there waits as needed). `tag`
 * (may be NULL) is interned and shows in logs and statistics. Inside a capture on s the
 * allocation becomes a graph memory-allocation node (see Graphs).
 * Errors: INVALID_ARGUMENT (bytes 0 or too large, NULL out), STALE_HANDLE, OVER_BUDGET,
 * OUT_OF_MEMORY (the driver refused), HOST_OUT_OF_MEMORY, DRIVER. On OVER_BUDGET and
 * OUT_OF_MEMORY the message gives the request, live and reserved bytes, the budget, the top three
 * tags by live bytes and the resource's reason (with its largest free range), after the OOM
 * handler (weft_set_oom_handler) had its say. */
WEFT_API WEFT_NODISCARD weft_status_t weft_alloc(weft_runtime_t *rt, size_t bytes, weft_stream_t *s, const char *tag, weft_block_t *out);
/** Frees the block on stream s: s first waits for every outstanding use of the block on every
 * stream, and the memory is handed out again only once that free is ordered before the new
 * user (no record_stream needed). The handle and all its copies become stale. Outside captures,
 * s keeps the block for its next weft_alloc of the same size (options.stream_cache_bytes; not
 * with the guard or a log): that allocation takes it with no resource or driver call. Cached
 * memory goes back to the resource when the cache is full, when an allocation runs out of
 * memory, at weft_runtime_trim and at the runtime's release. On the adopted
 * legacy stream while a blocking stream is capturing (torch.cuda.graph), where any work would
 * invalidate that capture, the free is deferred: it returns OK at once and happens on the legacy
 * stream at the first weft_alloc, weft_free, weft_free_ptr or weft_runtime_synchronize of the
 * runtime after the capture ended (allocation there meanwhile is refused with CAPTURE).
 * Errors: DOUBLE_FREE (already freed), STALE_HANDLE (the record now holds another block),
 * WRONG_DEVICE (s belongs to another runtime), CAPTURE (the block was allocated outside the
 * capture now active on s), DRIVER. On error the block is still live. */
WEFT_API WEFT_NODISCARD weft_status_t weft_free(weft_block_t b, weft_stream_t *s);
/** The live block whose memory starts at `ptr` (a hash lookup), or else the one that contains it
 * (a walk of the live blocks): for code that knows memory only by its address, as frameworks
 * do. Errors: STALE_HANDLE, INVALID_ARGUMENT (no live block there, null ptr or out). */
WEFT_API WEFT_NODISCARD weft_status_t weft_block_find(weft_runtime_t *rt, CUdeviceptr ptr, weft_block_t *out);
/** weft_free of the live block that starts at `ptr` (the free-by-pointer of a framework's
 * allocator). Errors: those of weft_free; INVALID_ARGUMENT when no live block starts at ptr. */
WEFT_API WEFT_NODISCARD weft_status_t weft_free_ptr(weft_runtime_t *rt, CUdeviceptr ptr, weft_stream_t *s);
/** Wraps memory weft did not allocate as a tracked block (never freed by weft; weft_free only
 * forgets it, after ordering as usual). Errors: INVALID_ARGUMENT, STALE_HANDLE. */
WEFT_API WEFT_NODISCARD weft_status_t weft_block_wrap(weft_runtime_t *rt, CUdeviceptr ptr, size_t bytes, const char *tag, weft_block_t *out);

/* ------------------------------------------------------------------------------------------ */
/* Memory: resources                                                                           */
/* ------------------------------------------------------------------------------------------ */

/** Statistics of a resource. weft counts the calls it dispatches to every resource (live bytes
 * and their peak, successful calls, failures); reserved bytes are the resource's own answer
 * (what it holds from upstream or the driver), equal to live bytes when it has none. */
typedef struct weft_resource_stats {
  uint64_t live_bytes, live_peak;         /**< handed out and not yet given back */
  uint64_t reserved_bytes, reserved_peak; /**< held from upstream or the driver */
  uint64_t allocs, frees, failures;       /**< counts of successful calls and of failures */
} weft_resource_stats_t;

typedef struct weft_resource weft_resource_t;

/** The interface every resource and adaptor implements, shaped like RMM's
 * device_memory_resource. Write your own by embedding weft_resource_t (zeroed) as the first
 * member of your struct and filling an ops table; check it with weft_resource_conformance().
 * Calls may come from many threads at once. A resource writes only what is its own: weft checks
 * arguments and keeps the counts (weft_resource_stats_t) for every call it dispatches.
 *   allocate:   memory for `bytes` usable by work on `s` enqueued after the call. If it enqueues
 *               work on s itself (a fill, a stream-ordered allocation), later uses are ordered
 *               after that work.
 *   deallocate: `p` (from allocate with the same bytes) may be reused once the work on `s`
 *               enqueued before the call is complete; the caller has already made s wait for
 *               every use of p. WEFT_ERR_CORRUPTED means freed, but damaged memory was found
 *               around it; any other failure means nothing happened.
 *   stats:      may be NULL; otherwise sets reserved_bytes and reserved_peak of *out (the rest
 *               is filled by weft before the call).
 *   trim:       may be NULL (then a trim passes to the upstream, if any); otherwise gives cached
 *               memory back to the upstream/driver, keeping at least `keep` bytes.
 *   destroy:    release everything the resource holds (its own memory only, never upstream),
 *               finishing what it can and returning the first failure (may be NULL).
 * Adaptors call their upstream through weft_resource_allocate / weft_resource_deallocate so that
 * it is counted too. `tag` is the block's interned tag (never NULL; "" if none). */
/** A piece of device memory a resource holds from upstream (for weft_memory_snapshot). */
typedef struct weft_segment {
  CUdeviceptr base;
  uint64_t bytes;
  int dedicated; /**< 1: holds one large block */
} weft_segment_t;
/** A free range inside a segment; `lane` is the pool stream whose free it waits for (stream_count
 * and above: free for anyone). */
typedef struct weft_free_range {
  CUdeviceptr ptr;
  uint64_t bytes;
  unsigned lane;
} weft_free_range_t;

typedef struct weft_resource_ops {
  const char *name;
  weft_status_t (*allocate)(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag, CUdeviceptr *out);
  weft_status_t (*deallocate)(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s, const char *tag);
  void (*stats)(const weft_resource_t *self, weft_resource_stats_t *out);
  weft_status_t (*trim)(weft_resource_t *self, size_t keep);
  weft_status_t (*destroy)(weft_resource_t *self);
  /** Optional: reports every segment and free range (under the resource's lock: the callbacks
   * must not call weft). */
  void (*segments)(const weft_resource_t *self, void (*segment)(void *ctx, const weft_segment_t *s),
                   void (*free_range)(void *ctx, const weft_free_range_t *r), void *ctx);
} weft_resource_ops_t;

/** What weft counts for a resource (updated atomically by weft; never write it). */
typedef struct weft_resource_counts {
  uint64_t live_bytes, live_peak, allocs, frees, failures;
} weft_resource_counts_t;

struct weft_resource {
  const weft_resource_ops_t *ops;
  weft_resource_t *upstream;  /**< the resource this one draws from, or NULL at the bottom */
  weft_runtime_t *rt;         /**< the runtime whose device and streams it serves */
  weft_resource_counts_t counts; /**< kept by weft, see weft_resource_stats() */
};

/** Calls through the interface, with argument checks (bytes 1..2^48, a stream of the resource's
 * runtime, p not 0), counted in the resource's statistics. */
WEFT_API WEFT_NODISCARD weft_status_t weft_resource_allocate(weft_resource_t *r, size_t bytes, weft_stream_t *s, const char *tag, CUdeviceptr *out);
WEFT_API WEFT_NODISCARD weft_status_t weft_resource_deallocate(weft_resource_t *r, CUdeviceptr p, size_t bytes, weft_stream_t *s, const char *tag);
/** The resource's statistics (zeros for NULL). */
WEFT_API void weft_resource_stats(const weft_resource_t *r, weft_resource_stats_t *out);
/** Gives cached memory back (the resource's trim, else its upstream's). Errors: CAPTURE (a capture
 * that could see the driver calls is active), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_resource_trim(weft_resource_t *r, size_t keep);
/** Destroys a resource the caller created (not one the runtime owns): it gives back everything
 * it holds, finishing what it can, and returns the first failure (the resource is gone either
 * way). Errors: STALE_HANDLE (a resource made by weft_*_create that was destroyed already),
 * INVALID_ARGUMENT (NULL), BUSY (it still backs the runtime's weft_alloc, or a resource made by
 * weft_*_create draws from it: destroy that one first; nothing changes), DRIVER. */
WEFT_API weft_status_t weft_resource_destroy(weft_resource_t *r);
/** Runs weft's resource conformance suite against `r` (as RMM's mr_ref_test_basic): allocations
 * of many sizes on `s` and `other` (two streams of r's runtime), alignment to 256 bytes, no two
 * live ranges overlapping, frees on the allocating and on another stream (each stream made to
 * wait for the other's allocations first, as the contract asks of every free), a trim, and statistics that add up. Every block it allocates is freed again;
 * the resource's counts grow. Writes one line per failed check to `report` (if not NULL) and
 * returns the number of failed checks (0: conforming). weft's own resources all pass it. */
WEFT_API unsigned weft_resource_conformance(weft_resource_t *r, weft_stream_t *s, weft_stream_t *other, FILE *report);
/** The runtime's current top resource (what weft_alloc uses). */
WEFT_API weft_resource_t *weft_runtime_resource(weft_runtime_t *rt);
/** Makes `r` the runtime's top resource (weft_alloc draws from it). The caller keeps ownership
 * and must not destroy it while the runtime uses it. Errors: BUSY (blocks are live),
 * STALE_HANDLE, INVALID_ARGUMENT. */
WEFT_API WEFT_NODISCARD weft_status_t weft_runtime_set_resource(weft_runtime_t *rt, weft_resource_t *r);

/** What an allocation that ran out of memory asked for and what the runtime held then: given to
 * the OOM handler, and (in words) to weft_last_error(). Pointers are valid during the call. */
typedef struct weft_oom_info {
  size_t requested;          /**< bytes asked for */
  const char *tag;           /**< the allocation's tag ("" if none) */
  int stream;                /**< weft_stream_index of the allocating stream */
  weft_status_t status;      /**< OUT_OF_MEMORY or OVER_BUDGET */
  uint64_t live_bytes;       /**< handed out by the runtime's resource (weft_resource_stats_t) */
  uint64_t reserved_bytes;   /**< held by it from the driver */
  uint64_t budget_bytes;     /**< options.budget_bytes (0: none) */
  const char *top_tags[3];   /**< the tags with the most live bytes, most first (NULL: fewer) */
  uint64_t top_tag_bytes[3]; /**< their live bytes */
  const char *reason;        /**< the resource's own message (sizes, largest free range) */
} weft_oom_info_t;
/** Called, with no lock of weft held, when weft_alloc is about to fail for want of memory. It may
 * free blocks (weft_free) and return nonzero to have the allocation tried once more; 0 lets it
 * fail. Like PyTorch's OOM observers, it also sees every failure. */
typedef int (*weft_oom_handler_t)(weft_runtime_t *rt, const weft_oom_info_t *info, void *user);
/** Sets (fn) or removes (NULL) the runtime's OOM handler. Errors: STALE_HANDLE. */
WEFT_API WEFT_NODISCARD weft_status_t weft_set_oom_handler(weft_runtime_t *rt, weft_oom_handler_t fn, void *user);

/** Writes a JSON snapshot of the runtime's device memory to `out`: every segment its resources
 * hold (pool chunks, dedicated chunks, and the chunks of its graph pools), each with its owner
 * ("pool", "graph pool"), the live blocks inside (address, size, tag, allocating stream,
 * generation, allocation time) and the free ranges (with the stream whose free they wait for);
 * live blocks outside any segment (graph outputs in graph memory, wrapped or direct memory);
 * the blocks the streams cached ("cached": freed, memory held for reuse, counted live by the
 * resource; totals.cached_blocks / cached_bytes); totals by owner, tag and stream; free bytes, the largest free range and fragmentation
 * (1 - largest / free). The stack's segments agree with weft_resource_stats of the runtime's
 * resource, a graph pool's with weft_graph_pool_reserved. tools/weft_view.html draws it.
 * With WEFT_SNAPSHOT_ON_OOM=path, weft_alloc writes one there when it fails for want of memory.
 * Errors: STALE_HANDLE, INVALID_ARGUMENT (NULL out), HOST_OUT_OF_MEMORY. */
WEFT_API WEFT_NODISCARD weft_status_t weft_memory_snapshot(weft_runtime_t *rt, FILE *out);

/** Starts writing a timeline trace to `path` (Chrome / Perfetto trace-event JSON: open it in
 * ui.perfetto.dev or chrome://tracing): one track per stream (pool, adopted) of every runtime,
 * each use a slice named by its operation with its accesses (tags and kinds), each wait weft
 * inserts a flow arrow from the event it waits on to the waiting use, allocations and frees as
 * instants with sizes and tags. Work captured into a graph goes on tracks of its capture
 * ("capture C, stream S"), with the capture itself as a slice from begin to end. Host timestamps;
 * with WEFT_TRACE_DEVICE=1 in the environment when the trace starts, each use on a live stream
 * also gets a slice on "stream S (device)" timed by a pair of events around its work (placed on
 * the host clock through one synchronised base event per device; read back, with host waits,
 * every 4096 uses, at weft_trace_stop and at the runtime's release): a debugging mode. Written
 * as it happens (memory stays bounded); WEFT_TRACE=path starts one when the first runtime is
 * made (stopped at exit).
 * Errors: INVALID_ARGUMENT (no path, cannot open), BUSY (a trace is being written). */
WEFT_API WEFT_NODISCARD weft_status_t weft_trace_start(const char *path);
/** Finishes and closes the trace (nothing to do without one). Errors: INVALID_ARGUMENT (writing failed). */
WEFT_API WEFT_NODISCARD weft_status_t weft_trace_stop(void);

/** cuMemAlloc / cuMemFree. Frees synchronise the freeing stream first. */
WEFT_API WEFT_NODISCARD weft_status_t weft_direct_create(weft_runtime_t *rt, weft_resource_t **out);

/** Options of the driver's stream-ordered pool resource. */
typedef struct weft_async_options {
  uint64_t initial_reserve;   /**< bytes allocated and freed at creation to warm the pool; default 0 */
  uint64_t max_size;          /**< pool size limit (CUmemPoolProps.maxSize); 0 = no limit */
  uint64_t release_threshold; /**< bytes kept cached at synchronisation; default UINT64_MAX */
  int reuse_follow_event_dependencies; /**< CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, default 1 */
  int reuse_allow_opportunistic;       /**< CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, default 1 */
  int reuse_allow_internal_dependencies; /**< CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, default 1 */
  CUmemAllocationHandleType handle_type; /**< shareable handle type for IPC; default CU_MEM_HANDLE_TYPE_NONE */
} weft_async_options_t;
WEFT_API weft_async_options_t weft_async_options_default(void);
/** A resource over a new cuMemPool of the runtime's device. Errors: NOT_SUPPORTED (driver
 * without pools), INVALID_ARGUMENT, DRIVER, OUT_OF_MEMORY (initial reserve). */
WEFT_API WEFT_NODISCARD weft_status_t weft_async_create(weft_runtime_t *rt, const weft_async_options_t *opts, weft_resource_t **out);
/** The underlying pool, for attributes weft does not wrap. */
WEFT_API CUmemoryPool weft_async_pool(const weft_resource_t *async);
/** cuMemPoolGetAttribute / SetAttribute (setting a *_HIGH counter to 0 resets it).
 * Errors: CAPTURE (a capture that could see it is active), INVALID_ARGUMENT (not an async
 * resource), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_async_get_attribute(weft_resource_t *async, CUmemPool_attribute attr, uint64_t *value);
WEFT_API WEFT_NODISCARD weft_status_t weft_async_set_attribute(weft_resource_t *async, CUmemPool_attribute attr, uint64_t value);
/** Exports the pool's shareable handle (IPC) into *handle (an int file descriptor for
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). Errors: NOT_SUPPORTED (no handle type configured). */
WEFT_API WEFT_NODISCARD weft_status_t weft_async_export(weft_resource_t *async, void *handle);

/** Options of weft's own pool. */
typedef struct weft_pool_options {
  uint64_t chunk_bytes;    /**< bytes requested from upstream at a time; default options.pool_chunk_bytes */
  uint64_t max_bytes;      /**< most bytes held from upstream; 0 = no limit */
  int release_empty_chunks; /**< give a chunk back to upstream when it becomes wholly free at trim; default 1 */
} weft_pool_options_t;
WEFT_API weft_pool_options_t weft_pool_options_default(void);
/** weft's sub-allocator over chunks from `upstream`: O(1) fit with splitting and coalescing,
 * size classes for small blocks and TLSF for large, stream-ordered reuse (same stream at once;
 * another stream only once the free is known complete or after one wait). */
WEFT_API WEFT_NODISCARD weft_status_t weft_pool_create(weft_runtime_t *rt, weft_resource_t *upstream, const weft_pool_options_t *opts, weft_resource_t **out);

/** A hard limit: an allocation that would take the live bytes over `limit` fails with
 * OVER_BUDGET (never reaching upstream). With a `shared_key`, every process naming the same key
 * on the same device shares one limit (POSIX shared memory), and the share of a process that died
 * is reclaimed. Errors: INVALID_ARGUMENT, DRIVER (shared memory could not be set up). */
WEFT_API WEFT_NODISCARD weft_status_t weft_budget_create(weft_runtime_t *rt, weft_resource_t *upstream, uint64_t limit, const char *shared_key, weft_resource_t **out);
/** Bytes charged to the budget now, by all processes sharing it. */
WEFT_API uint64_t weft_budget_used(const weft_resource_t *budget);

/** A sink for log lines (one CSV line, no newline); `user` is passed back. */
typedef void (*weft_log_sink_fn)(void *user, const char *line);
/** Logs every allocate and deallocate as CSV: thread,time_ns,action,ptr,bytes,stream,device,tag
 * (a header line first) to `path` (if not NULL) or to `sink`. Errors: INVALID_ARGUMENT (neither
 * or both given), DRIVER (file cannot be opened; the message says why). */
WEFT_API WEFT_NODISCARD weft_status_t weft_logging_create(weft_runtime_t *rt, weft_resource_t *upstream, const char *path, weft_log_sink_fn sink, void *user, weft_resource_t **out);
/** weft_logging_create in RMM's columns, Thread,Time,Action,Pointer,Size,Stream (Time in seconds
 * since the epoch, Action allocate / deallocate / "allocate failure" / "deallocate failure",
 * Stream the CUstream handle): what RMM's replay benchmark reads. Same errors. */
WEFT_API WEFT_NODISCARD weft_status_t weft_logging_create_rmm(weft_runtime_t *rt, weft_resource_t *upstream, const char *path, weft_log_sink_fn sink, void *user, weft_resource_t **out);

/** Per-tag statistics kept by the stats adaptor. */
typedef struct weft_tag_stats {
  const char *tag;
  uint64_t live_bytes, live_peak, allocs, frees;
} weft_tag_stats_t;
/** Counts current, peak and totals, overall and by tag. */
WEFT_API WEFT_NODISCARD weft_status_t weft_stats_create(weft_runtime_t *rt, weft_resource_t *upstream, weft_resource_t **out);
/** Copies up to `max` tags' statistics; returns how many tags there are. */
WEFT_API size_t weft_stats_by_tag(const weft_resource_t *stats, weft_tag_stats_t *out, size_t max);

/** Guard options. */
typedef struct weft_guard_options {
  size_t canary_bytes;     /**< bytes of canary before and after each block; default 256 */
  int poison_on_free;      /**< fill freed blocks with 0xDB; default 1 */
  size_t quarantine_count; /**< freed blocks held back from reuse; default 64 */
  uint64_t quarantine_bytes; /**< most bytes held in quarantine; default 256 MiB */
} weft_guard_options_t;
WEFT_API weft_guard_options_t weft_guard_options_default(void);
/** Canaries around each block, checked when it is freed (CORRUPTED names the block and the first
 * bad byte; the block is then freed anyway), poison on free, quarantine. */
WEFT_API WEFT_NODISCARD weft_status_t weft_guard_create(weft_runtime_t *rt, weft_resource_t *upstream, const weft_guard_options_t *opts, weft_resource_t **out);

/* ------------------------------------------------------------------------------------------ */
/* Graphs: capture, explicit building, replay                                                  */
/* ------------------------------------------------------------------------------------------ */

/** A captured or built CUDA graph together with its access summary (the blocks from outside
 * the graph that it reads or writes) and its outputs (blocks it allocates and does not free). */
typedef struct weft_graph weft_graph_t;
/** An instantiated graph: launch it on pool streams; its outputs become live blocks. */
typedef struct weft_exec weft_exec_t;
/** Device memory reserved for graphs that replay in the order they were captured (as PyTorch's
 * graph pools): their temporaries share it. */
typedef struct weft_graph_pool weft_graph_pool_t;

typedef enum weft_capture_mode {
  WEFT_CAPTURE_GLOBAL = 0,       /**< CU_STREAM_CAPTURE_MODE_GLOBAL (the default, the safest) */
  WEFT_CAPTURE_THREAD_LOCAL = 1, /**< CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */
  WEFT_CAPTURE_RELAXED = 2,      /**< CU_STREAM_CAPTURE_MODE_RELAXED */
} weft_capture_mode_t;

typedef enum weft_graph_memory {
  WEFT_GRAPH_MEMORY_NODES = 0,        /**< allocations become graph memory nodes; the driver
                                           shares physical memory between graphs */
  WEFT_GRAPH_MEMORY_PRIVATE_POOL = 1, /**< allocations come from a weft graph pool; addresses
                                           stay reserved; graphs replayed in order may share it */
} weft_graph_memory_t;

typedef struct weft_capture_options {
  weft_capture_mode_t mode;   /**< default WEFT_CAPTURE_GLOBAL */
  weft_graph_memory_t memory; /**< default WEFT_GRAPH_MEMORY_NODES */
  weft_graph_pool_t *pool;    /**< PRIVATE_POOL only: the pool to draw from; NULL: the graph gets
                                   a pool of its own */
} weft_capture_options_t;
WEFT_API weft_capture_options_t weft_capture_options_default(void);

/** Begins capturing the work of pool stream s (NULL options: defaults). Until weft_capture_end,
 * uses on s (and on streams joined with weft_capture_join) are recorded, not run:
 * hazards between them become captured event record/wait pairs; weft_alloc on them becomes a
 * graph allocation node (or a private-pool allocation); weft_free of a block allocated in the
 * capture becomes a free node. Blocks last touched before the capture are never waited on inside
 * it (that would be a capture isolation error): they form the graph's access summary, ordered
 * when the graph is launched. Freeing a block from before the capture inside it is refused
 * (CAPTURE): the free would happen at every launch.
 * Errors: STALE_HANDLE, INVALID_ARGUMENT, CAPTURE (s already takes part in a capture), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_capture_begin(weft_stream_t *s, const weft_capture_options_t *opts);
/** Pulls pool stream t into the capture running on `origin` (a fork: t waits on a captured
 * event of origin); weft rejoins it before the capture ends.
 * Errors: CAPTURE (origin is not capturing under weft, or t takes part elsewhere), WRONG_DEVICE. */
WEFT_API WEFT_NODISCARD weft_status_t weft_capture_join(weft_stream_t *origin, weft_stream_t *t);
/** Rejoins the joined streams, ends the capture and gives the graph. Handles of blocks allocated
 * inside the capture become stale (the exec's outputs replace them after each launch). The
 * capture is ended even when this fails (e.g. CAPTURE if something invalidated it).
 * Errors: CAPTURE (s has no weft capture, or it was invalidated), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_capture_end(weft_stream_t *s, weft_graph_t **out);
/** begin, fn(s, user), end: the capture is always ended, even when fn fails (then its status is
 * returned and no graph is made). */
WEFT_API WEFT_NODISCARD weft_status_t weft_capture_run(weft_stream_t *s, const weft_capture_options_t *opts,
                                                       weft_status_t (*fn)(weft_stream_t *s, void *user), void *user,
                                                       weft_graph_t **out);

/** Destroys a graph (and, with it, a private graph pool made for it alone).
 * Errors: STALE_HANDLE (destroyed already), BUSY (an exec of it still exists, or outputs of its
 * launches are still live), DRIVER (cuGraphDestroy failed: nothing changed, destroy it again; or
 * its own graph pool could not be freed: the graph is gone, the pool stays counted against the
 * runtime). */
WEFT_API weft_status_t weft_graph_destroy(weft_graph_t *g);
/** The driver's graph (owned by weft). */
WEFT_API CUgraph weft_graph_raw(const weft_graph_t *g);
/** Number of outputs (blocks allocated in the graph and not freed there). */
WEFT_API size_t weft_graph_output_count(const weft_graph_t *g);
/** Copies up to `max` entries of the access summary; returns how many there are. */
WEFT_API size_t weft_graph_summary(const weft_graph_t *g, weft_access_t *out, size_t max);

/** Instantiates g (at most one exec per graph) and uploads it to `upload`'s stream.
 * Errors: BUSY (g already has an exec), STALE_HANDLE, DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_graph_instantiate(weft_graph_t *g, weft_stream_t *upload, weft_exec_t **out);
/** Launches on pool stream s: waits for the hazards of the access summary, launches, and records
 * the launch as one use of every summarised block. The outputs are then live blocks with a new
 * generation (weft_exec_output). With live outputs of the previous launch, the runtime's
 * output_policy decides: WEFT_OUTPUT_ERROR gives BUSY; WEFT_OUTPUT_AUTO_FREE frees them (their
 * old handles become stale).
 * Errors: BUSY, STALE_HANDLE (a summarised block was freed since the capture), CAPTURE (s is
 * capturing), DRIVER. */
WEFT_API WEFT_NODISCARD weft_status_t weft_exec_launch(weft_exec_t *e, weft_stream_t *s);
/** Output i of the latest launch ({0} before the first launch or once freed).
 * Errors: INVALID_ARGUMENT (i out of range). */
WEFT_API WEFT_NODISCARD weft_status_t weft_exec_output(const weft_exec_t *e, size_t i, weft_block_t *out);
/** Destroys an exec (the driver frees it after its launches complete). Live outputs stay live
 * blocks until freed, and keep the graph (weft_graph_destroy says BUSY until then).
 * Errors: STALE_HANDLE (destroyed already), BUSY (from a capture handler that a launch of it
 * runs), DRIVER (cuGraphExecDestroy failed: nothing changed). */
WEFT_API weft_status_t weft_exec_destroy(weft_exec_t *e);

/** A pool for WEFT_GRAPH_MEMORY_PRIVATE_POOL captures. */
WEFT_API WEFT_NODISCARD weft_status_t weft_graph_pool_create(weft_runtime_t *rt, weft_graph_pool_t **out);
/** Bytes the pool holds from the device. */
WEFT_API uint64_t weft_graph_pool_reserved(const weft_graph_pool_t *p);
/** Whether ptr lies in memory of pool p (for an allocator that must tell a graph's memory from
 * its own when the framework frees by pointer): 1 or 0 (0 for a stale handle). */
WEFT_API int weft_graph_pool_owns(const weft_graph_pool_t *p, CUdeviceptr ptr);
/** For a capture that code outside weft began on s (or forked s into), e.g. torch.cuda.graph:
 * weft_alloc on s inside it takes memory from graph pool p instead of graph memory nodes, as
 * PyTorch's beginAllocateToPool tells its allocator. Addresses are fixed for the graph; a free
 * inside the capture makes its range reusable later in the same capture, in stream order; what
 * is still allocated when the owner ends the capture belongs to the owner's graph (handles
 * become stale, weft_graph_pool_owns says yes) and stays reserved until p is destroyed. Calling
 * it again for the same capture and pool does nothing. Streams forked into the capture are
 * separate weft sessions: one pool serves one of them at a time.
 * Errors: CAPTURE (no outside capture is active on s), BUSY (p serves another capture, or this
 * capture allocates to another pool already), WRONG_DEVICE, STALE_HANDLE. */
WEFT_API WEFT_NODISCARD weft_status_t weft_capture_allocate_to(weft_stream_t *s, weft_graph_pool_t *p);
/** Called when weft first meets, on stream s, a capture that code outside weft began (or forked s
 * into), with the driver's id of that capture: the moment to choose where weft_alloc inside it
 * allocates (weft_capture_allocate_to), before anything is allocated there. weft meets such a
 * capture in any call on s that asks the driver (weft_alloc, weft_free, weft_use_begin, ...): a
 * framework's allocator needs no capture query of its own. Runs on the calling thread with no
 * weft lock held; may call weft. A status other than WEFT_OK fails the call that met the capture
 * with that status (the capture stays known to weft; allocations in it then use graph memory
 * nodes). */
typedef weft_status_t (*weft_capture_handler_t)(weft_stream_t *s, uint64_t capture_id, void *user);
/** Sets (fn NULL: clears) the runtime's handler of captures begun outside weft. A handler belongs
 * to one life of the runtime (cleared at its last release). Errors: STALE_HANDLE,
 * INVALID_ARGUMENT. */
WEFT_API WEFT_NODISCARD weft_status_t weft_set_capture_handler(weft_runtime_t *rt, weft_capture_handler_t fn, void *user);
/** Waits for the last launch that used the pool's memory, then frees it.
 * Errors: STALE_HANDLE (destroyed already), BUSY (graphs, or captures being begun on another
 * thread, still use it), CAPTURE / DRIVER (the wait or a cuMemFree failed: the pool stays with the
 * chunks not yet freed, no capture may draw from it any more, and a second destroy frees the rest). */
WEFT_API weft_status_t weft_graph_pool_destroy(weft_graph_pool_t *p);

/** The device's graph memory counters (cuDeviceGetGraphMemAttribute). */
typedef struct weft_graph_memory_stats {
  uint64_t used, used_high, reserved, reserved_high; /**< bytes */
} weft_graph_memory_stats_t;
WEFT_API WEFT_NODISCARD weft_status_t weft_graph_memory_stats(weft_runtime_t *rt, weft_graph_memory_stats_t *out);
/** cuDeviceGraphMemTrim: unused graph memory goes back to the system. Like every graph call of
 * weft (instantiate, launch, the free of an output, destroy, allocations inside a capture), it
 * runs while no other thread is inside a driver call of weft that enqueues work on the same
 * device; such calls wait for it (on driver 580.159.04, H100 and H200, graph calls that overlapped
 * them were followed by wrong results; across devices they did not: tests/conformance/README.md,
 * "graph calls"; WEFT_GATE in the README). Work that you enqueue through the driver yourself is
 * not held back. Errors: CAPTURE (a capture that could see it is active). */
WEFT_API WEFT_NODISCARD weft_status_t weft_graph_memory_trim(weft_runtime_t *rt);

/** An explicit graph under construction: nodes with declared accesses; edges come from the same
 * rules as streams (each node depends on the maximal conflicting earlier nodes, no redundant
 * edge; a node that must follow several readers of a block depends on one empty join node
 * after them, shared by every later node that must, instead of an edge per reader). */
typedef struct weft_builder weft_builder_t;
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_create(weft_runtime_t *rt, weft_builder_t **out);
/** A memory-allocation node (cuGraphAddMemAllocNode); the handle is usable in this builder. */
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_alloc(weft_builder_t *b, size_t bytes, const char *tag, weft_block_t *out);
/** A memory-free node (cuGraphAddMemFreeNode) for a block allocated in this builder, after
 * every node that touches it. Errors: CAPTURE (block from outside the builder). */
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_free(weft_builder_t *b, weft_block_t blk);
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_kernel(weft_builder_t *b, const weft_launch_t *l, const weft_access_t *acc, size_t n, CUgraphNode *node);
/** A device-to-device copy node (READ src, WRITE dst). */
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_copy(weft_builder_t *b, weft_block_t dst, size_t dst_offset, weft_block_t src, size_t src_offset, size_t bytes, CUgraphNode *node);
/** A 32-bit memset node (WRITE dst); offset and bytes multiples of 4. */
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_memset32(weft_builder_t *b, weft_block_t dst, size_t offset, unsigned value, size_t bytes, CUgraphNode *node);
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_host(weft_builder_t *b, CUhostFn fn, void *user, const weft_access_t *acc, size_t n, CUgraphNode *node);
/** An empty node ordered after the conflicting earlier nodes of `acc` (a barrier). */
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_empty(weft_builder_t *b, const weft_access_t *acc, size_t n, CUgraphNode *node);
/** Turns the builder into a graph (the builder is consumed, also on failure). */
WEFT_API WEFT_NODISCARD weft_status_t weft_builder_finish(weft_builder_t *b, weft_graph_t **out);
/** Abandons a builder and its graph. Errors: STALE_HANDLE (destroyed or finished already),
 * INVALID_ARGUMENT (NULL). */
WEFT_API weft_status_t weft_builder_destroy(weft_builder_t *b);

/* ------------------------------------------------------------------------------------------ */
/* Collectives: NCCL communicators whose operations are tracked uses                           */
/* ------------------------------------------------------------------------------------------ */

/* weft drives NCCL, loaded at run time (never linked): WEFT_NCCL names the library (unset:
 * libnccl.so.2; "sim": the simulator's NCCL, with WEFT_DRIVER=sim; else a path). A collective is
 * a use like any other: its send buffers are READ and its receive buffers WRITTEN, so the stream
 * it runs on first waits for exactly the work that wrote or reads them, and later work waits for
 * it (no hand-placed events around NCCL). Collectives of one rank order against the other ranks
 * through NCCL itself. Errors from NCCL become WEFT_ERR_COMM (WEFT_ERR_INVALID_ARGUMENT for its
 * invalid-argument and invalid-usage results) with NCCL's message in weft_last_error(). */

/** A communicator: one rank of an NCCL communicator, bound to one runtime (device). */
typedef struct weft_comm weft_comm_t;
/** What every rank of one communicator is created from (ncclUniqueId's 128 bytes). */
typedef struct weft_comm_id {
  char bytes[128];
} weft_comm_id_t;
/** Element types (NCCL's). */
typedef enum weft_dtype {
  WEFT_INT8 = 0, WEFT_UINT8 = 1, WEFT_INT32 = 2, WEFT_UINT32 = 3, WEFT_INT64 = 4, WEFT_UINT64 = 5,
  WEFT_FLOAT16 = 6, WEFT_FLOAT32 = 7, WEFT_FLOAT64 = 8, WEFT_BFLOAT16 = 9,
} weft_dtype_t;
/** Reductions (NCCL's). */
typedef enum weft_redop { WEFT_SUM = 0, WEFT_PROD = 1, WEFT_MAX = 2, WEFT_MIN = 3, WEFT_AVG = 4 } weft_redop_t;

/** A new unique id, made by one rank and given to the others (a file, a socket, MPI).
 * Errors: NOT_SUPPORTED (no NCCL), COMM. */
WEFT_API WEFT_NODISCARD weft_status_t weft_comm_unique_id(weft_comm_id_t *out);
/** Rank `rank` of `nranks` on rt's device, from the id every rank shares: blocks until every
 * rank joined, as ncclCommInitRank does (one process per GPU, or one thread per rank). Like
 * weft_comm_init_all, it then makes the communicator's collective connections with one eager
 * all-reduce of one element: NCCL makes them at a communicator's first collective, with CUDA
 * calls a GLOBAL capture does not permit (ncclInternalError, the capture invalidated), so a
 * program's first collective may then be captured in any mode. Send and receive connect apart,
 * at a communicator's first send or receive: make that one outside a GLOBAL capture (eagerly,
 * or in a RELAXED or THREAD_LOCAL capture). A communicator from weft_comm_adopt is as its
 * program left it. Not inside the calling thread's open group, nor a capture handler its end runs
 * (INVALID_ARGUMENT).
 * Errors: INVALID_ARGUMENT, STALE_HANDLE, NOT_SUPPORTED (no NCCL), COMM. */
WEFT_API WEFT_NODISCARD weft_status_t weft_comm_init_rank(weft_runtime_t *rt, int nranks, const weft_comm_id_t *id, int rank, weft_comm_t **out);
/** One communicator over the runtimes rts[0..n) of this process (rank i on rts[i]'s device), as
 * ncclCommInitAll; out[i] is rank i. Nothing is made on failure. Errors: those of
 * weft_comm_init_rank, WRONG_DEVICE (two runtimes of one device). */
WEFT_API WEFT_NODISCARD weft_status_t weft_comm_init_all(weft_runtime_t *const *rts, int n, weft_comm_t **out);
/** Takes in a communicator the program made (an ncclComm_t of rt's device, from the same NCCL
 * library weft loads): weft tracks its collectives but never destroys it. */
WEFT_API WEFT_NODISCARD weft_status_t weft_comm_adopt(weft_runtime_t *rt, void *nccl_comm, weft_comm_t **out);
/** Destroys the communicator (ncclCommDestroy, unless adopted); its collectives already enqueued
 * complete. A graph captured with its collectives names it: destroy it only after those graphs and
 * their execs (NCCL's destroy waits until they are gone: with them alive it blocks, for ever when
 * the calling thread is the one to destroy them). A weft graph (weft_capture_end) holding them
 * makes the destroy BUSY; weft cannot see graphs of captures that ended outside it. An open group
 * of another thread that calls on it is inside it until its weft_comm_group_end, for the group's
 * first 8 communicators (host memory permitting): the destroy waits for that end. So two threads must not each destroy a
 * communicator that the other's open group calls on: each would wait for the other. A further
 * communicator of a group is entered at each call, and held during the end (a destroy then is
 * BUSY); destroyed between its call and the end, it makes the end fail (STALE_HANDLE).
 * Errors: STALE_HANDLE, BUSY (a capture holding its collectives is still open, or a weft graph
 * made by one is alive; the calling thread's open group calls on it; a call of this thread on it
 * runs this destroy from a capture handler, the group's end included; another thread's group end
 * holds it: nothing done), COMM (NCCL refused: the communicator stays). */
WEFT_API weft_status_t weft_comm_destroy(weft_comm_t *c);
/** This rank, the number of ranks, the runtime, and the stream collectives run on by default (a
 * pool stream of the runtime chosen at creation, the last high-priority one when there is one). */
WEFT_API int weft_comm_rank(const weft_comm_t *c);
WEFT_API int weft_comm_size(const weft_comm_t *c);
WEFT_API weft_runtime_t *weft_comm_runtime(const weft_comm_t *c);
WEFT_API weft_stream_t *weft_comm_stream(const weft_comm_t *c);
/** NCCL's asynchronous error of the communicator (ncclCommGetAsyncError): OK, or COMM with
 * NCCL's message. */
WEFT_API WEFT_NODISCARD weft_status_t weft_comm_check(weft_comm_t *c);

/** Collectives. Buffers are blocks of c's runtime at byte offsets; `count` is in elements of
 * `dt` (per rank where NCCL says so: all-gather's send, reduce-scatter's receive); send and
 * receive may be the same block and offset (in place). `s` is a stream of c's runtime, NULL for
 * weft_comm_stream(c). Inside weft_comm_group_begin/end the call is recorded and enqueued at the
 * end. Errors: INVALID_ARGUMENT (a range outside its block, a bad type, root or peer; NCCL's
 * invalid argument), WRONG_DEVICE (a block or stream of another runtime), STALE_HANDLE, CAPTURE,
 * COMM. On error nothing was enqueued and no use recorded.
 * Exact waits: in a process of several runtimes, a collective posted by a call (or a group) that
 * does not span every runtime (a thread per rank) makes its stream's waits exact: no wait for a
 * point of it, or of a stream that waits for it, is served by a later event, which could cover
 * collectives the waiting rank has not posted yet (a deadlock). Such a stream records an event
 * after each use, and its event ring grows rather than drop one the device has not completed
 * (weft_counters_t.ring_growths). A group from one thread over every runtime needs none. */
WEFT_API WEFT_NODISCARD weft_status_t weft_all_reduce(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv, size_t recv_offset, size_t count, weft_dtype_t dt, weft_redop_t op, weft_stream_t *s);
WEFT_API WEFT_NODISCARD weft_status_t weft_broadcast(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv, size_t recv_offset, size_t count, weft_dtype_t dt, int root, weft_stream_t *s);
WEFT_API WEFT_NODISCARD weft_status_t weft_reduce_scatter(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv, size_t recv_offset, size_t recv_count, weft_dtype_t dt, weft_redop_t op, weft_stream_t *s);
WEFT_API WEFT_NODISCARD weft_status_t weft_all_gather(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv, size_t recv_offset, size_t send_count, weft_dtype_t dt, weft_stream_t *s);
WEFT_API WEFT_NODISCARD weft_status_t weft_send(weft_comm_t *c, weft_block_t send, size_t send_offset, size_t count, weft_dtype_t dt, int peer, weft_stream_t *s);
WEFT_API WEFT_NODISCARD weft_status_t weft_recv(weft_comm_t *c, weft_block_t recv, size_t recv_offset, size_t count, weft_dtype_t dt, int peer, weft_stream_t *s);
/** Groups the collectives this thread calls until the matching end (nestable), as
 * ncclGroupStart/End: required to drive several ranks from one thread, and for sends and
 * receives between the same ranks. At the end every stream of the group waits for what its
 * calls need, then NCCL enqueues the group, then the uses are recorded. The group's blocks must
 * not be used by other threads until weft_comm_group_end returns. A call is checked when it is
 * made. Its communicator stays live until the group's end (weft_comm_destroy says how); past the
 * group's first 8 communicators, one destroyed meanwhile makes the end fail. A thread that ends
 * with its group open drops the group. A capture handler that the end runs (weft meets a capture
 * on one of the group's streams) may not begin a group: BUSY. Errors of the end: those of the
 * collectives (nothing is enqueued then; STALE_HANDLE for a block freed since its call), COMM;
 * INVALID_ARGUMENT with no open group. */
WEFT_API WEFT_NODISCARD weft_status_t weft_comm_group_begin(void);
WEFT_API WEFT_NODISCARD weft_status_t weft_comm_group_end(void);

/** Looks up `name` in the loaded driver library (for example the simulator's weft_sim_get_api,
 * see sim/weft_sim.h); NULL if absent or if no driver loads. */
WEFT_API void *weft_driver_symbol(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
