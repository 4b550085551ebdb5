/* Tracker test programs: a list of uses (stream, blocks read, blocks written), the pattern suite,
 * random programs, and an independent count of the cross-stream edges in the transitive
 * reduction of a program's true dependency graph. Plain C with no test framework: the tests
 * (program.h) and the benchmarks (bench/bench_waits.c) share it. */
#pragma once

#include <stdint.h>

#define PROG_MAX_IN 3
#define PROG_MAX_OUT 2

typedef struct prog_use {
  unsigned stream;
  int in[PROG_MAX_IN];   /* block indices or -1 */
  int out[PROG_MAX_OUT]; /* block indices or -1; at least out[0] */
} prog_use_t;

typedef struct prog {
  unsigned blocks, streams, elems;
  unsigned uses, cap;
  prog_use_t *use;
} prog_t;

void prog_init(prog_t *p, unsigned blocks, unsigned streams, unsigned elems);
void prog_free(prog_t *p);
void prog_add(prog_t *p, unsigned stream, int in0, int in1, int in2, int out0, int out1);
/** A random program of `uses` uses (seeded). */
void prog_random(prog_t *p, unsigned uses, uint64_t seed);

/** Cross-stream edges of the transitive reduction of the dependency graph (RAW, WAR, WAW and
 * stream order), computed from scratch with reachability bitsets. */
uint64_t prog_reduction_edges(const prog_t *p);

/** The pattern suite. Each initialises *p (64-element blocks). */
void prog_fork_join(prog_t *p);
void prog_pipeline(prog_t *p);
void prog_diamond(prog_t *p);
void prog_all_to_all(prog_t *p);
