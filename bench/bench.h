/* weft's benchmark harness: shared state, timing and reporting.
 *
 * Every section measures host time with CLOCK_MONOTONIC over many iterations, repeats that
 * `reps` times and reports the median, with the raw-driver baseline measured the same way in the
 * same run. Raw driver calls go through lib/core's driver table (weft__driver_get), the one
 * boundary every cu* call crosses, so the baseline pays the same indirect call weft pays.
 *
 * Output: markdown tables on stdout and one CSV row per sample (see report.c for the columns):
 * bench/results.py makes bench/RESULTS.md (medians, ratio ranges, goals, curves) from the CSV.
 */
#ifndef WEFT_BENCH_BENCH_H
#define WEFT_BENCH_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "lib/core/driver.h"
#include "weft/weft.h"

/** What every section needs. */
typedef struct bench {
  const weft__driver_t *drv;
  CUcontext ctx;     /* device 0's primary context, retained for the whole run and current */
  CUmodule module;   /* the pipeline example's kernel (examples/pipeline) */
  CUfunction lcg;    /* pipeline_transform: `rounds` LCG steps per element */
  int sim;           /* 1 on the simulator: figures are not performance numbers */
  int quick;         /* --quick: the smallest counts that still exercise every path */
  unsigned reps;     /* repetitions per figure (at most BENCH_MAX_REPS); the median is reported */
  FILE *csv;
} bench_t;

#define BENCH_MAX_REPS 16

/** Scales an iteration count for the machine: `gpu` on a GPU, a tenth on the simulator, a
 * hundredth with --quick; never below `floor`. */
unsigned bench_count(const bench_t *b, unsigned gpu, unsigned floor);

static inline uint64_t bench_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/** The median of n values (sorts them in place). */
double bench_median(double *v, unsigned n);

/** Fails the run: prints `what` and weft's last error, exits 1. */
_Noreturn void bench_die_weft(weft_status_t st, const char *what);
/** Fails the run on a driver error. */
_Noreturn void bench_die_cu(CUresult r, const char *what);
/** Fails the run with a message. */
_Noreturn void bench_die(const char *what);

#define BENCH_WEFT(call)                                  \
  do {                                                    \
    weft_status_t bench_st_ = (call);                     \
    if (bench_st_ != WEFT_OK) bench_die_weft(bench_st_, #call); \
  } while (0)
#define BENCH_CU(call)                                    \
  do {                                                    \
    CUresult bench_r_ = (call);                           \
    if (bench_r_ != CUDA_SUCCESS) bench_die_cu(bench_r_, #call); \
  } while (0)

/** Gets device 0's runtime with `opts`; the bench holds the only reference, so releasing it
 * destroys it and the next section can create it with other options. */
weft_runtime_t *bench_runtime(const weft_options_t *opts);

/* ---- the floor of a tracker (bench.c) ----
 * The least any thread-safe dependency tracker must do for one use, written out by hand for the
 * diagnostic rows "the floor of a tracker": in one hold of a mutex, read the history of each block
 * the use touches (the last write: stream and tick; the newest read of each stream), decide
 * whether the use's stream must wait for the other stream (it remembers what it waited for), and
 * write the histories back. Two streams (0, 1) and four blocks (0-3). The waits and records
 * themselves are the caller's, placed by hand. Its rows bound weft from below: what a tracker
 * built on a lock costs beside real driver calls before any code of its own. */

/** Forgets every history (before each sample). */
void bench_floor_reset(void);
/** One use on stream `side` (0 or 1) writing block `out` and reading block `in` (-1: none), in
 * `holds` mutex holds (1, or 2: weft's shape, a hold before the work and one after): returns
 * whether the use must wait for the other stream. */
bool bench_floor_use(unsigned side, int out, int in, int holds);

/* ---- report.c ----------------------------------------------------------------------------- */

/** Opens a section: a markdown heading (marked on the simulator) and a paragraph. */
void bench_section(const bench_t *b, const char *title, const char *about);
/** Starts a markdown table with `n` column names. */
void bench_table(const char *const *cols, unsigned n);
/** One series of a measured figure: sample() takes one sample (a timed loop: ns per operation,
 * us per step...) and returns it. `baseline` names the row of the same section and metric it is
 * compared with (NULL: none); `x` is the curve parameter (NULL: not a curve point). */
typedef struct bench_series {
  const char *row;
  const char *baseline;
  const char *x;
  double (*sample)(void *ctx);
  void *ctx;
} bench_series_t;

/** Measures series together: one untimed warm-up round, then b->reps rounds, each taking one
 * sample of every series in turn (interleaved: a drift of the machine falls on all of them
 * alike). Writes every sample to the CSV; medians[i] (if not NULL) gets series i's median. */
void bench_measure(const bench_t *b, const char *section, const char *metric, const char *unit,
                   const bench_series_t *series, size_t n, double *medians);
/** One CSV sample row, written as the section took it (rep counts from 0); also how a figure
 * that is not repeated (a count) is written, as rep 0. */
void bench_sample(const bench_t *b, const char *section, const char *row, const char *metric, const char *unit,
                  const char *baseline, const char *x, unsigned rep, double value);

/* ---- the sections, one file each ---------------------------------------------------------- */

void bench_alloc(bench_t *b);
void bench_comm(bench_t *b);
/** All-reduce with a process per rank: rank 1 is this binary again, run as bench_comm_child. */
void bench_comm_procs(bench_t *b);
/** Rank 1 of bench_comm_procs (weft_bench --comm-child ID_FILE QUICK REPS); returns the exit code. */
int bench_comm_child(int argc, char **argv);
void bench_dp(bench_t *b);
void bench_tracker(bench_t *b);
void bench_waits(bench_t *b);
void bench_replay(bench_t *b);
void bench_pipeline(bench_t *b);
void bench_curves(bench_t *b);

#endif /* WEFT_BENCH_BENCH_H */
