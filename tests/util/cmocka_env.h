/* cmocka helpers over tu_env_t (include after <cmocka.h>): each fails the running test on error,
 * so a test reads as its steps. Header-only: testutil itself is also used without cmocka. */
#pragma once

#include "tests/util/testutil.h"

/** Pool stream i of env's runtime; fails the test if there is none. */
static inline weft_stream_t *tu_stream(const tu_env_t *env, unsigned i) {
  weft_stream_t *s = NULL;
  assert_int_equal(weft_stream_get(env->rt, i, &s), WEFT_OK);
  return s;
}

/** A block of `bytes` allocated on pool stream i; fails the test (with weft's message) if not. */
static inline weft_block_t tu_alloc(const tu_env_t *env, size_t bytes, unsigned i, const char *tag) {
  weft_block_t b;
  weft_status_t r = weft_alloc(env->rt, bytes, tu_stream(env, i), tag, &b);
  if (r != WEFT_OK) fail_msg("weft_alloc: %s: %s", weft_status_name(r), weft_last_error());
  return b;
}
