#include "tests/streams/program.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

void prog_init(prog_t *p, unsigned blocks, unsigned streams, unsigned elems) {
  memset(p, 0, sizeof *p);
  p->blocks = blocks;
  p->streams = streams;
  p->elems = elems;
}

void prog_free(prog_t *p) { free(p->use); }

void prog_add(prog_t *p, unsigned stream, int in0, int in1, int in2, int out0, int out1) {
  if (p->uses == p->cap) {
    p->cap = p->cap ? p->cap * 2 : 64;
    p->use = realloc(p->use, p->cap * sizeof *p->use);
  }
  p->use[p->uses++] = (prog_use_t){stream, {in0, in1, in2}, {out0, out1}};
}

static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void prog_random(prog_t *p, unsigned uses, uint64_t seed) {
  for (unsigned u = 0; u < uses; u++) {
    int in[3] = {-1, -1, -1}, out[2] = {-1, -1};
    unsigned nin = (unsigned)(next(&seed) % 4), nout = 1 + (unsigned)(next(&seed) % 2);
    for (unsigned i = 0; i < nin; i++) in[i] = (int)(next(&seed) % p->blocks);
    for (unsigned i = 0; i < nout; i++) {
      int b;
      do b = (int)(next(&seed) % p->blocks);
      while (i == 1 && b == out[0]);
      out[i] = b;
    }
    prog_add(p, (unsigned)(next(&seed) % p->streams), in[0], in[1], in[2], out[0], out[1]);
  }
}

/* ---- the independent reduction count ---------------------------------------------------- */

typedef struct bits {
  uint64_t *w;
} bits_t;

uint64_t prog_reduction_edges(const prog_t *p) {
  unsigned n = p->uses, words = (n + 63) / 64;
  uint64_t *anc = calloc((size_t)n * words, sizeof *anc);
  int *last_write = malloc(p->blocks * sizeof *last_write);
  int *last_on = malloc(p->streams * sizeof *last_on);
  /* readers since the last write, per block: a list of use indices */
  unsigned *nread = calloc(p->blocks, sizeof *nread);
  int **readers = calloc(p->blocks, sizeof *readers);
  for (unsigned b = 0; b < p->blocks; b++) {
    last_write[b] = -1;
    readers[b] = malloc(n * sizeof **readers);
  }
  for (unsigned s = 0; s < p->streams; s++) last_on[s] = -1;
  int *pred = malloc((n + 16) * sizeof *pred);
  uint64_t edges = 0;
  for (unsigned v = 0; v < n; v++) {
    const prog_use_t *u = &p->use[v];
    unsigned np = 0;
#define ADD(x)                                          \
  do {                                                  \
    int x_ = (x);                                       \
    if (x_ >= 0) {                                      \
      unsigned j_;                                      \
      for (j_ = 0; j_ < np && pred[j_] != x_; j_++) {}  \
      if (j_ == np) pred[np++] = x_;                    \
    }                                                   \
  } while (0)
    ADD(last_on[u->stream]);
    int writes[PROG_MAX_OUT + 1] = {-1, -1, -1};
    for (int i = 0; i < PROG_MAX_OUT; i++) writes[i] = u->out[i];
    for (int i = 0; i < PROG_MAX_IN; i++) {
      int b = u->in[i];
      if (b < 0) continue;
      ADD(last_write[b]);
    }
    for (int i = 0; i < PROG_MAX_OUT; i++) {
      int b = u->out[i];
      if (b < 0) continue;
      ADD(last_write[b]);
      for (unsigned r = 0; r < nread[b]; r++) ADD(readers[b][r]);
    }
#undef ADD
    uint64_t *av = &anc[(size_t)v * words];
    for (unsigned i = 0; i < np; i++) {
      const uint64_t *ap = &anc[(size_t)pred[i] * words];
      for (unsigned w = 0; w < words; w++) av[w] |= ap[w];
      av[pred[i] / 64] |= 1ull << (pred[i] % 64);
    }
    /* Edge pred[i] -> v is in the reduction unless another direct predecessor reaches it. */
    for (unsigned i = 0; i < np; i++) {
      int x = pred[i];
      if (p->use[x].stream == u->stream) continue;
      int redundant = 0;
      for (unsigned j = 0; j < np && !redundant; j++) {
        if (j == i) continue;
        const uint64_t *aj = &anc[(size_t)pred[j] * words];
        if (aj[x / 64] & (1ull << (x % 64))) redundant = 1;
      }
      if (!redundant) edges++;
    }
    /* Update block histories: reads first, then writes (a read-write is a write). */
    for (int i = 0; i < PROG_MAX_IN; i++) {
      int b = u->in[i];
      if (b < 0 || b == u->out[0] || b == u->out[1]) continue;
      unsigned r;
      for (r = 0; r < nread[b] && readers[b][r] != (int)v; r++) {}
      if (r == nread[b]) readers[b][nread[b]++] = (int)v;
    }
    for (int i = 0; i < PROG_MAX_OUT; i++) {
      int b = u->out[i];
      if (b < 0) continue;
      last_write[b] = (int)v;
      nread[b] = 0;
    }
    last_on[u->stream] = (int)v;
  }
  for (unsigned b = 0; b < p->blocks; b++) free(readers[b]);
  free(readers);
  free(nread);
  free(pred);
  free(last_on);
  free(last_write);
  free(anc);
  return edges;
}

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
