/* Scale gate (issue 11): random programs of up to millions of operations over 8 pool streams,
 * mixing stream-ordered allocation and frees on any stream, fill/combine uses, host
 * synchronisation, asynchronous copies to the host checked against a sequential model, and
 * captures (joined streams, graph memory nodes or private pools, summary blocks, blocks
 * allocated and freed inside, outputs) replayed at random later points among eager work.
 *
 * Every checked value must equal the model and, on the simulator, the race oracle must report
 * nothing. run_scale() runs one seed; scale.c's main() reads the environment:
 *   WEFT_TEST_SEEDS   seeds: "7", "1-5", "1,3,10-12" (default "1-2")
 *   WEFT_TEST_OPS     operations per seed (default 20000)
 *   WEFT_TEST_RINGS   event ring sizes, "4,8,64": seed s runs with entry s mod count, so a seed
 *                     keeps its ring whatever the list (default: WEFT_EVENT_RING, else 64)
 *   WEFT_TEST_POLICY  output policy: "error", "auto" or "mixed" (default mixed: seeds that are
 *                     multiples of 3 run with WEFT_OUTPUT_AUTO_FREE); WEFT_OUTPUT_POLICY, when set,
 *                     wins
 *   WEFT_TEST_STOP    1: stop a seed at its first race or wrong value (for bisecting)
 *   WEFT_TEST_TRACE   N: print every operation from op N on (stderr)
 *   WEFT_TEST_KEEP_GOING 1: run every seed even after one failed
 *   WEFT_TEST_JOIN_EARLY 1: weft_capture_join only before a capture's first alloc or use
 *                     (steers around the capture-join bug, to look for others)
 *   WEFT_TEST_SAFE_CAPTURE 1: steer around the capture bugs found by this test: the streams
 *                     of a capture are synchronised before it begins and joined at once, each
 *                     captured alloc is followed by a fill on its stream, and a capture touches
 *                     fewer than 32 blocks
 *   WEFT_TEST_CAPTURES 0: no captures (eager work only)
 *   WEFT_TEST_NO_WAITS 1: positive control: the tracker issues no waits, and the run passes only
 *                     if every seed is caught (races on the simulator, wrong values anywhere)
 *   WEFT_TEST_DESTROY_IN_CAPTURE 0: destroy finished graphs only while no capture is active
 *                     (default 1: also during captures; destroying a private-pool graph frees its
 *                     chunks, which must not invalidate a GLOBAL capture on another stream)
 * plus the simulator's own (WEFT_SIM_LAZY, WEFT_SIM_ORACLE, ...). The simulator is reseeded with
 * the test seed at the start of each seed.
 *
 * A failure prints "FAIL seed S ring R policy P op N: <what differed>" and, per failed seed, a
 * "reproduce:" line with the environment that replays it. To shrink it: run that with
 * WEFT_TEST_STOP=1 WEFT_TEST_TRACE=0 2> t.trace, then tools/scale_shrink.py t.trace (delta
 * debugging over the trace's ops with //tests/scale:replay); tests/scale/repros holds the
 * shrunk reproducers of the bugs this gate found, each a //tests/scale:repro_* test. */
#pragma once

#include <stdint.h>

typedef struct scale_cfg {
  uint64_t seed;
  long ops;
  unsigned ring;   /* event ring size */
  unsigned policy; /* weft_output_policy_t */
  int stop;        /* stop at the first race or wrong value */
  long trace_from; /* print ops from this index (-1: never) */
  int no_waits;    /* positive control: the tracker issues no waits */
} scale_cfg_t;

typedef struct scale_result {
  long ops_done;
  double seconds;
  uint64_t races;
  long first_race_op;  /* op after which the oracle first reported a race (-1: none) */
  long mismatches;     /* wrong words seen */
  long first_bad_op;   /* op of the first wrong value's check (-1: none) */
  long errors;         /* unexpected statuses (each ends the seed) */
  long captures, launches, host_reads, syncs, allocs, frees, uses;
  uint64_t waits_issued, ring_evictions;
} scale_result_t;

/** Runs one seed; returns 0 if it passed (no race, no wrong value, no unexpected status). */
int run_scale(const scale_cfg_t *cfg, scale_result_t *res);
