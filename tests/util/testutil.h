/* Shared test setup: a runtime, the test kernels (fatbin on a GPU, host twins on the simulator),
 * the simulator's race count, and a tracked launch of weft_test_combine. */
#pragma once

#include <stdint.h>

#include "sim/weft_sim.h"
#include "weft/weft.h"

typedef struct tu_env {
  weft_runtime_t *rt;
  CUmodule module;
  CUfunction combine, fill;
  const weft_sim_api_t *sim; /* NULL on a GPU */
  unsigned spin_ns;          /* kernels spin this long before writing (GPU: 50 us by default) */
  CUcontext ctx;             /* the device's primary context, where the module is loaded */
  int split;                 /* tu_combine / tu_fill: weft_use_begin, the raw launch on
                              * weft_stream_raw's handle, weft_use_end (else one weft_launch) */
  int no_context;            /* tu_combine / tu_fill: each from a thread with no current context,
                              * which weft must leave so (the test fails otherwise) */
} tu_env_t;

/** Gets the runtime of device 0 with `opts` (NULL: defaults), loads the kernels. Returns 0 or
 * fails the test. WEFT_TEST_SPIN_NS overrides the spin. */
int tu_init(tu_env_t *env, const weft_options_t *opts);
/** tu_init on device `ordinal`: its runtime, with the test kernels loaded in its context. */
int tu_init_device(tu_env_t *env, int ordinal, const weft_options_t *opts);
/** Releases the runtime and unloads the module. */
void tu_fini(tu_env_t *env);
/** Races the simulator's oracle has reported, plus driver calls on destroyed handles (the real
 * driver may crash there; weft_sim_stats_t.destroyed_handle_uses, never reset); 0 on a GPU, where
 * correctness is checked by data. */
uint64_t tu_races(const tu_env_t *env);
/** Prints the simulator's race report (no-op on a GPU). */
void tu_print_races(const tu_env_t *env);
/** Forgets races found so far. */
void tu_reset_races(const tu_env_t *env);

/** weft_test_combine as one tracked use: out0/out1 written, in0..in2 read (null blocks, {0},
 * are left out). An output equal to an input is declared READ_WRITE. */
weft_status_t tu_combine(const tu_env_t *env, weft_stream_t *s, weft_block_t out0, weft_block_t out1, weft_block_t in0,
                         weft_block_t in1, weft_block_t in2, unsigned n, unsigned salt);
/** weft_test_fill as one tracked use (a write of dst). */
weft_status_t tu_fill(const tu_env_t *env, weft_stream_t *s, weft_block_t dst, unsigned n, unsigned value);
/** Copies a block to the host (tracked, then synchronised). */
weft_status_t tu_read(weft_stream_t *s, weft_block_t b, void *host, size_t bytes);
