/* Running tracker test programs (prog.h) on a runtime, checked against a sequential model. */
#pragma once

#include <stdint.h>

#include "tests/streams/prog.h"
#include "tests/util/testutil.h"

/** Runs the program on env: allocates and initialises the blocks, synchronises (so the count
 * starts from a quiet device), runs every use, and returns the waits issued by the program
 * itself in *waits. Then compares every block with the sequential model and returns the number
 * of wrong elements (failing the test on the first one if `must_match`), and frees the blocks. */
uint64_t prog_run(const tu_env_t *env, const prog_t *p, uint64_t *waits, int must_match);
