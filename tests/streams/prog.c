#include "tests/streams/prog.h"

#include <stdlib.h>
#include <string.h>

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

/* ---- the pattern suite ------------------------------------------------------------------ */

void prog_fork_join(prog_t *p) {
  prog_init(p, 17, 8, 256);
  prog_add(p, 0, -1, -1, -1, 0, -1);                                      /* A on 0 */
  for (unsigned i = 1; i < 8; i++) prog_add(p, i, 0, -1, -1, (int)i, -1); /* B_i on i, reads A */
  for (unsigned i = 1; i < 8; i += 3)
    prog_add(p, 0, (int)i, i + 1 < 8 ? (int)i + 1 : -1, i + 2 < 8 ? (int)i + 2 : -1, 16, -1);
}

/* copy-in on 0, compute on 1, copy-out on 2, double-buffered: X0 X1 Y0 Y1 Z0 Z1. */
void prog_pipeline(prog_t *p) {
  prog_init(p, 6, 3, 256);
  for (unsigned c = 0; c < 40; c++) {
    int x = (int)(c % 2), y = 2 + (int)(c % 2), z = 4 + (int)(c % 2);
    prog_add(p, 0, -1, -1, -1, x, -1);
    prog_add(p, 1, x, -1, -1, y, -1);
    prog_add(p, 2, y, -1, -1, z, -1);
  }
}

void prog_diamond(prog_t *p) {
  prog_init(p, 4, 4, 256);
  for (int r = 0; r < 10; r++) {
    prog_add(p, 0, 3, -1, -1, 0, -1);
    prog_add(p, 1, 0, -1, -1, 1, -1);
    prog_add(p, 2, 0, -1, -1, 2, -1);
    prog_add(p, 3, 1, 2, -1, 3, -1);
  }
}

/* Each stream writes its block, then reads three others' and writes its second block. */
void prog_all_to_all(prog_t *p) {
  prog_init(p, 16, 8, 256);
  for (int round = 0; round < 3; round++) {
    for (unsigned i = 0; i < 8; i++) prog_add(p, i, (int)(8 + i), -1, -1, (int)i, -1);
    for (unsigned i = 0; i < 8; i++)
      prog_add(p, i, (int)((i + 1) % 8), (int)((i + 3) % 8), (int)((i + 5) % 8), (int)(8 + i), -1);
  }
}
