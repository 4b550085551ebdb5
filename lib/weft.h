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
 *   - weft loads the CUDA driver at run time (WEFT_DRIVER, see weft_options_t); nothing links
 *     libcuda. Without a driver every call that needs the GPU returns WEFT_ERR_NO_DRIVER.
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
  X(ERR_NOT_READY, -14, "the work has not completed yet")

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
 * the README's table is generated from the same words. Sizes are in bytes, counts are plain. */
#define WEFT_OPTIONS_MAP(X)                                                                      \
  X(stream_count, unsigned, "WEFT_STREAM_COUNT", 8, 1, 64,                                      \
    "pool streams per runtime (all CU_STREAM_NON_BLOCKING)")                                    \
  X(high_priority_streams, unsigned, "WEFT_HIGH_PRIORITY_STREAMS", 2, 0, 64,                    \
    "how many of the pool streams get the device's highest priority; must be <= stream_count")  \
  X(event_ring, unsigned, "WEFT_EVENT_RING", 64, 4, 4096,                                       \
    "events per stream ring, a power of two; an evicted tick is waited on conservatively")      \
  X(memory, unsigned, "WEFT_MEMORY", WEFT_MEMORY_POOL, 0, 2,                                    \
    "bottom resource: 0 pool, 1 async (driver pool), 2 direct (cuMemAlloc)")                    \
  X(pool_chunk_bytes, uint64_t, "WEFT_POOL_CHUNK_BYTES", 64ull << 20, 1ull << 20, 1ull << 40,    \
    "bytes the pool requests from its upstream at a time (larger requests get their own chunk)") \
  X(budget_bytes, uint64_t, "WEFT_BUDGET_BYTES", 0, 0, UINT64_MAX,                              \
    "hard limit on live device bytes of the process on this device; 0 means no limit")          \
  X(guard, unsigned, "WEFT_GUARD", 0, 0, 1,                                                     \
    "1 adds canaries, poison on free, quarantine and stricter handle checks")                   \
  X(output_policy, unsigned, "WEFT_OUTPUT_POLICY", WEFT_OUTPUT_ERROR, 0, 1,                     \
    "graph relaunch with live outputs: 0 error, 1 free them automatically")

/** Runtime options. Start from weft_options_default() (or weft_options_from_env()), change
 * fields, pass to weft_runtime_create(). Plain data: copy it freely. */
typedef struct weft_options {
#define WEFT__OPTION_FIELD(field, type, env, def, lo, hi, doc) type field;
  WEFT_OPTIONS_MAP(WEFT__OPTION_FIELD)
#undef WEFT__OPTION_FIELD
  /** Budget shared by all processes that name the same key (POSIX shared memory "/weft-<key>"),
   * so parallel test processes on one GPU share one limit; NULL or "" means process-local.
   * Environment: WEFT_BUDGET_SHARED. Default NULL. */
  const char *budget_shared_key;
  /** CSV allocation log: a path, or NULL for none. Environment: WEFT_LOG. Default NULL. */
  const char *log_path;
} weft_options_t;

/** The built-in defaults, ignoring the environment. */
WEFT_API weft_options_t weft_options_default(void);
/** Overrides fields of *opts from WEFT_* environment variables that are set.
 * Errors: WEFT_ERR_INVALID_ARGUMENT naming the variable when one does not parse or is out of
 * range; *opts is unchanged then. */
WEFT_API WEFT_NODISCARD weft_status_t weft_options_from_env(weft_options_t *opts);
/** Checks every field. Errors: WEFT_ERR_INVALID_ARGUMENT naming the first bad field and its range
 * (weft_last_error()). */
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

/** Looks up `name` in the loaded driver library (for example the simulator's weft_sim_get_api,
 * see sim/weft_sim.h); NULL if absent or if no driver loads. */
WEFT_API void *weft_driver_symbol(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
