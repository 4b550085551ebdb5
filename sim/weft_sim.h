/* The simulator's own API: kernel host twins, the race oracle and fault injection.
 *
 * libweft_sim.so exports the CUDA driver functions weft uses (lib/core/driver.h) with cuda.h's
 * exact signatures and runs them on the CPU. It also exports one function of its own,
 * weft_sim_get_api(), returning the table below. Programs never link the simulator: weft loads it
 * (WEFT_DRIVER=sim) into a private namespace, and a program reaches this table through the loaded
 * driver:
 *
 *     const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);  // NULL on a real GPU
 *     if (sim) sim->register_kernel("my_kernel", my_kernel_twin, my_kernel_ranges);
 *
 * Device memory is ordinary host memory and a CUdeviceptr is a host address, but programs should
 * still read and write it with cuMemcpy* so that the same code runs on a GPU.
 *
 * Environment:
 *   WEFT_SIM_SEED=<u64>      scheduler seed (default 1); the same seed gives the same interleaving
 *   WEFT_SIM_MEMORY=<bytes>  memory of each device, reported and enforced (default 80 GiB; K/M/G)
 *   WEFT_SIM_DEVICES=<n>     devices, 1 (default) to 8, every one a peer of every other
 *   WEFT_SIM_PEER=0          no device can access another's memory (cuDeviceCanAccessPeer 0)
 *   WEFT_SIM_FAIL=<spec>     fault injection, see weft_sim_api_t.fail
 *   WEFT_SIM_REPORT=1        print the race report to stderr at exit
 *   WEFT_SIM_ORACLE=0        turn the race oracle off (faster)
 *   WEFT_SIM_LAZY=1          a device far behind the host: ordinary calls run no work,
 *                            synchronisations run what they wait for, a query runs one op a
 *                            quarter of the time (so it mostly says NOT_READY)
 */
#ifndef WEFT_SIM_H
#define WEFT_SIM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2 added register_kernel_params (appended; version-1 users are unaffected). */
#define WEFT_SIM_API_VERSION 2

/** How a kernel touches a byte range. */
typedef enum weft_sim_access { WEFT_SIM_READ = 1, WEFT_SIM_WRITE = 2, WEFT_SIM_READ_WRITE = 3 } weft_sim_access_t;

/** One device byte range a kernel launch touches. */
typedef struct weft_sim_range {
  CUdeviceptr ptr;   /**< first byte */
  size_t bytes;      /**< length in bytes (0 ranges are ignored) */
  weft_sim_access_t access;
} weft_sim_range_t;

/** The launch configuration a twin receives. */
typedef struct weft_sim_launch {
  unsigned grid[3];  /**< gridDimX/Y/Z */
  unsigned block[3]; /**< blockDimX/Y/Z */
  unsigned shared_bytes;
} weft_sim_launch_t;

/** A kernel's host twin: does on the CPU what the kernel does on the GPU. `params` is the
 * kernelParams array of cuLaunchKernel (params[i] points at argument i). */
typedef void (*weft_sim_kernel_fn)(const weft_sim_launch_t *launch, void **params);
/** Declares the byte ranges a launch with these arguments reads and writes, for the oracle.
 * Writes at most `max` entries into `out` and returns how many it wrote (or would need, if more
 * than max: the simulator then calls again with a larger array). */
typedef size_t (*weft_sim_ranges_fn)(const weft_sim_launch_t *launch, void **params, weft_sim_range_t *out, size_t max);

/** One race the oracle found: two operations touching overlapping bytes, at least one writing,
 * with no happens-before order between them. */
typedef struct weft_sim_race {
  uint64_t first_op, second_op;     /**< operation sequence numbers (in issue order) */
  char first_desc[96], second_desc[96]; /**< "kernel weft_smoke_iota on stream 3" etc. */
  int first_stream, second_stream;  /**< simulator stream ids; -1 for the host, -2 for a graph node */
  CUdeviceptr ptr;                  /**< first byte of the overlap */
  size_t bytes;                     /**< overlap length */
  int first_writes, second_writes;  /**< whether each side wrote */
} weft_sim_race_t;

/** Counters of what the simulator did. */
typedef struct weft_sim_stats {
  uint64_t ops_executed;    /**< stream operations and graph nodes executed */
  uint64_t api_calls;       /**< driver calls made */
  uint64_t unimplemented;   /**< calls of driver functions the simulator does not implement */
  uint64_t races;           /**< races found so far (same as race_count()) */
  uint64_t bytes_in_use;    /**< device bytes allocated now (all kinds) */
  uint64_t faults_injected; /**< calls failed by fault injection */
  /** uses of a handle after its destroy (answered INVALID_HANDLE; the real driver may crash
   * there): each printed to stderr (the first 10), for tests to check as they check races */
  uint64_t destroyed_handle_uses;
} weft_sim_stats_t;

typedef struct weft_sim_api {
  unsigned version; /**< WEFT_SIM_API_VERSION */
  /** Registers (or replaces) the twin of the kernel called `name` in every module;
   * cuModuleGetFunction(name) then finds it. `ranges` may be NULL (the launch touches nothing
   * the oracle should know). Returns 0, or -1 if name or fn is NULL. Thread-safe. */
  int (*register_kernel)(const char *name, weft_sim_kernel_fn fn, weft_sim_ranges_fn ranges);
  /** Races found since start or the last reset. */
  uint64_t (*race_count)(void);
  /** Copies up to `max` race descriptions (oldest first, at most the first 1024 kept) into `out`;
   * returns how many were copied. */
  size_t (*races)(weft_sim_race_t *out, size_t max);
  /** Forgets found races (the access history stays). */
  void (*reset_races)(void);
  /** Prints every kept race, one paragraph each, and the count, to stderr. */
  void (*print_report)(void);
  /** Fault injection. spec is a ';'-separated list of "NAME:N:CODE" (the Nth call of driver
   * function NAME, counting from 1 after this call, fails with CUresult CODE) or "NAME:N+:CODE"
   * (the Nth call and every later one fail). NAME is cuda.h's name (cuMemAlloc, not
   * cuMemAlloc_v2); CODE is a number or a CUresult name (CUDA_ERROR_OUT_OF_MEMORY). NULL or ""
   * clears all faults. Returns 0, or -1 on a malformed spec (and then changes nothing).
   * (cmocka defines a macro fail(): call it as (api->fail)(spec) there.) */
  int (*fail)(const char *spec);
  /** Reseeds the scheduler. */
  void (*seed)(uint64_t seed);
  void (*stats)(weft_sim_stats_t *out);
  /** Turns the oracle on or off; returns the previous setting. */
  int (*set_oracle)(int on);
  /** (version >= 2) Like register_kernel, and also gives the size in bytes of each of the
   * kernel's `nparams` arguments, so that cuLaunchKernel and kernel nodes copy the argument
   * values when they are issued, as the real driver does. Kernels registered with
   * register_kernel get the caller's kernelParams pointers at execution time instead: their
   * arguments must then stay valid until the launch has run (a synchronisation). Returns 0, or
   * -1 if name or fn is NULL, or param_bytes is NULL while nparams > 0. Thread-safe. */
  int (*register_kernel_params)(const char *name, weft_sim_kernel_fn fn, weft_sim_ranges_fn ranges,
                                unsigned nparams, const size_t *param_bytes);
} weft_sim_api_t;

/** Exported by the simulator. */
const weft_sim_api_t *weft_sim_get_api(void);
/** Exported by the simulator: "weft-sim <version>". Its presence marks a library as the simulator. */
const char *weft_sim_version(void);

/** The simulator's table if the loaded driver is the simulator, else NULL. `lookup` is
 * weft_driver_symbol (or dlsym on a handle bound to the first argument). */
static inline const weft_sim_api_t *weft_sim_api(void *(*lookup)(const char *name)) {
  const weft_sim_api_t *(*get)(void) = (const weft_sim_api_t *(*)(void))lookup("weft_sim_get_api");
  return get ? get() : NULL;
}

#ifdef __cplusplus
}
#endif
#endif /* WEFT_SIM_H */
