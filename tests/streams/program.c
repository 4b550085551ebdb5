#include "tests/streams/program.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

/* ---- running it ------------------------------------------------------------------------- */

uint64_t prog_run(const tu_env_t *env, const prog_t *p, uint64_t *waits, int must_match) {
  uint64_t wrong = 0;
  weft_block_t *blk = calloc(p->blocks, sizeof *blk);
  unsigned *model = malloc((size_t)p->blocks * p->elems * sizeof *model);
  weft_stream_t *s0;
  assert_int_equal(weft_stream_get(env->rt, 0, &s0), WEFT_OK);
  for (unsigned b = 0; b < p->blocks; b++) {
    assert_int_equal(weft_alloc(env->rt, (size_t)p->elems * 4, s0, "prog", &blk[b]), WEFT_OK);
    assert_int_equal(tu_fill(env, s0, blk[b], p->elems, b * 1000u), WEFT_OK);
    for (unsigned i = 0; i < p->elems; i++) model[(size_t)b * p->elems + i] = b * 1000u;
  }
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env->rt, &c0), WEFT_OK);
  const weft_block_t none = {0};
  unsigned *tmp = malloc(p->elems * sizeof *tmp);
  for (unsigned v = 0; v < p->uses; v++) {
    const prog_use_t *u = &p->use[v];
    weft_stream_t *s;
    assert_int_equal(weft_stream_get(env->rt, u->stream, &s), WEFT_OK);
    weft_block_t in[3], out[2];
    for (int i = 0; i < 3; i++) in[i] = u->in[i] >= 0 ? blk[u->in[i]] : none;
    for (int i = 0; i < 2; i++) out[i] = u->out[i] >= 0 ? blk[u->out[i]] : none;
    weft_status_t st = tu_combine(env, s, out[0], out[1], in[0], in[1], in[2], p->elems, v);
    if (st != WEFT_OK) fail_msg("use %u: %s: %s", v, weft_status_name(st), weft_last_error());
    /* The model, element-wise as the kernel does it. */
    for (unsigned i = 0; i < p->elems; i++) {
      unsigned val = v;
      if (u->in[0] >= 0) val += 7u * model[(size_t)u->in[0] * p->elems + i];
      if (u->in[1] >= 0) val += 13u * model[(size_t)u->in[1] * p->elems + i];
      if (u->in[2] >= 0) val += 17u * model[(size_t)u->in[2] * p->elems + i];
      tmp[i] = val;
    }
    for (unsigned i = 0; i < p->elems; i++) {
      if (u->out[0] >= 0) model[(size_t)u->out[0] * p->elems + i] = tmp[i];
      if (u->out[1] >= 0) model[(size_t)u->out[1] * p->elems + i] = tmp[i] ^ 0x55555555u;
    }
  }
  assert_int_equal(weft_runtime_counters(env->rt, &c1), WEFT_OK);
  *waits = c1.waits_issued - c0.waits_issued;
  for (unsigned b = 0; b < p->blocks; b++) {
    assert_int_equal(tu_read(s0, blk[b], tmp, (size_t)p->elems * 4), WEFT_OK);
    for (unsigned i = 0; i < p->elems; i++)
      if (tmp[i] != model[(size_t)b * p->elems + i]) {
        wrong++;
        if (must_match) fail_msg("block %u element %u: %u, expected %u", b, i, tmp[i], model[(size_t)b * p->elems + i]);
      }
    assert_int_equal(weft_free(blk[b], s0), WEFT_OK);
  }
  assert_int_equal(weft_runtime_synchronize(env->rt), WEFT_OK);
  free(tmp);
  free(model);
  free(blk);
  return wrong;
}
