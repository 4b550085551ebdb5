/* Test programs for the tracker: a list of uses (stream, blocks read, blocks written) run
 * through weft_test_combine, a sequential reference model, and an independent count of the
 * cross-stream edges in the transitive reduction of the program's true dependency graph. */
#pragma once

#include <stdint.h>

#include "tests/util/testutil.h"

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

/** Runs the program on env: allocates and initialises the blocks, synchronises (so the count
 * starts from a quiet device), runs every use, and returns the waits issued by the program
 * itself in *waits. Then compares every block with the sequential model and returns the number
 * of wrong elements (failing the test on the first one if `must_match`), and frees the blocks. */
uint64_t prog_run(const tu_env_t *env, const prog_t *p, uint64_t *waits, int must_match);
