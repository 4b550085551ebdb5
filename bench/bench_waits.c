/* Waits: how many cuStreamWaitEvent calls weft issues on the tracker tests' pattern suite, against
 * the minimum: the cross-stream edges of the transitive reduction of each program's dependency
 * graph. A hand-written program cannot be correct with fewer waits, so the minimum is the
 * baseline, and issued = minimal means zero redundant waits.
 *
 * The programs are those of tests/streams/test_tracker_programs.c (same patterns, same random
 * generator and seeds), run here as tracked uses with no work inside: the waits weft issues
 * depend only on the declared accesses, and the tests already prove the results right on the
 * simulator's race oracle and on the GPU. The reduction count is the independent one of
 * tests/streams/program.c (that target is private to tests/streams), kept in step with it. */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

#define MAX_IN 3
#define MAX_OUT 2

typedef struct use {
  unsigned stream;
  int in[MAX_IN];   /* block indices or -1 */
  int out[MAX_OUT]; /* block indices or -1; at least out[0] */
} use_t;

typedef struct prog {
  unsigned blocks, streams, uses, cap;
  use_t *use;
} prog_t;

static void prog_init(prog_t *p, unsigned blocks, unsigned streams) {
  memset(p, 0, sizeof *p);
  p->blocks = blocks;
  p->streams = streams;
}

static void prog_add(prog_t *p, unsigned stream, int in0, int in1, int in2, int out0, int out1) {
  if (p->uses == p->cap) {
    p->cap = p->cap ? p->cap * 2 : 64;
    p->use = realloc(p->use, p->cap * sizeof *p->use);
    if (p->use == NULL) bench_die("waits: no host memory");
  }
  p->use[p->uses++] = (use_t){stream, {in0, in1, in2}, {out0, out1}};
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* 0..3 blocks read, 1..2 (distinct) written, on a random stream: prog_random of the tests. */
static void prog_random(prog_t *p, unsigned uses, uint64_t seed) {
  for (unsigned u = 0; u < uses; u++) {
    int in[3] = {-1, -1, -1}, out[2] = {-1, -1};
    unsigned nin = (unsigned)(splitmix(&seed) % 4), nout = 1 + (unsigned)(splitmix(&seed) % 2);
    for (unsigned i = 0; i < nin; i++) in[i] = (int)(splitmix(&seed) % p->blocks);
    for (unsigned i = 0; i < nout; i++) {
      int b;
      do b = (int)(splitmix(&seed) % p->blocks);
      while (i == 1 && b == out[0]);
      out[i] = b;
    }
    prog_add(p, (unsigned)(splitmix(&seed) % p->streams), in[0], in[1], in[2], out[0], out[1]);
  }
}

/* Adds x to the predecessor set pred[0..*np) unless absent (-1) or present. */
static void add_pred(int *pred, unsigned *np, int x) {
  if (x < 0) return;
  for (unsigned j = 0; j < *np; j++)
    if (pred[j] == x) return;
  pred[(*np)++] = x;
}

/* Cross-stream edges of the transitive reduction of the dependency graph (RAW, WAR, WAW and
 * stream order), from scratch with one ancestor bitset per use: an edge x -> v is in the
 * reduction unless another direct predecessor of v already has x as an ancestor. */
static uint64_t reduction_edges(const prog_t *p) {
  unsigned n = p->uses, words = (n + 63) / 64;
  uint64_t *anc = calloc((size_t)n * words, sizeof *anc);
  int *last_write = malloc(p->blocks * sizeof *last_write), *last_on = malloc(p->streams * sizeof *last_on);
  unsigned *nread = calloc(p->blocks, sizeof *nread);
  int *readers = malloc((size_t)p->blocks * n * sizeof *readers); /* per block: readers since its write */
  int *pred = malloc((n + 16) * sizeof *pred);
  if (!anc || !last_write || !last_on || !nread || !readers || !pred) bench_die("waits: no host memory");
  for (unsigned b = 0; b < p->blocks; b++) last_write[b] = -1;
  for (unsigned s = 0; s < p->streams; s++) last_on[s] = -1;
  uint64_t edges = 0;
  for (unsigned v = 0; v < n; v++) {
    const use_t *u = &p->use[v];
    unsigned np = 0;
    add_pred(pred, &np, last_on[u->stream]);
    for (int i = 0; i < MAX_IN; i++)
      if (u->in[i] >= 0) add_pred(pred, &np, last_write[u->in[i]]);
    for (int i = 0; i < MAX_OUT; i++) {
      int b = u->out[i];
      if (b < 0) continue;
      add_pred(pred, &np, last_write[b]);
      for (unsigned r = 0; r < nread[b]; r++) add_pred(pred, &np, readers[(size_t)b * n + r]);
    }
    uint64_t *av = &anc[(size_t)v * words];
    for (unsigned i = 0; i < np; i++) {
      const uint64_t *ap = &anc[(size_t)pred[i] * words];
      for (unsigned w = 0; w < words; w++) av[w] |= ap[w];
      av[pred[i] / 64] |= 1ull << (pred[i] % 64);
    }
    for (unsigned i = 0; i < np; i++) {
      int x = pred[i], redundant = 0;
      if (p->use[x].stream == u->stream) continue;
      for (unsigned j = 0; j < np && !redundant; j++)
        if (j != i && (anc[(size_t)pred[j] * words + (unsigned)x / 64] & (1ull << (x % 64)))) redundant = 1;
      if (!redundant) edges++;
    }
    /* Block histories: reads first, then writes (a block both read and written is written). */
    for (int i = 0; i < MAX_IN; i++) {
      int b = u->in[i];
      if (b < 0 || b == u->out[0] || b == u->out[1]) continue;
      unsigned r;
      for (r = 0; r < nread[b] && readers[(size_t)b * n + r] != (int)v; r++) {}
      if (r == nread[b]) readers[(size_t)b * n + nread[b]++] = (int)v;
    }
    for (int i = 0; i < MAX_OUT; i++)
      if (u->out[i] >= 0) {
        last_write[u->out[i]] = (int)v;
        nread[u->out[i]] = 0;
      }
    last_on[u->stream] = (int)v;
  }
  free(pred);
  free(readers);
  free(nread);
  free(last_on);
  free(last_write);
  free(anc);
  return edges;
}

/* The accesses of a use, as the tests' weft_test_combine launch declares them: outputs written
 * (read-write when also an input), the other inputs read. */
static size_t accesses_of(const use_t *u, const weft_block_t *blk, weft_access_t *acc) {
  size_t k = 0;
  for (int i = 0; i < MAX_OUT; i++) {
    if (u->out[i] < 0) continue;
    weft_access_kind_t kind = WEFT_WRITE;
    for (int j = 0; j < MAX_IN; j++)
      if (u->in[j] == u->out[i]) kind = WEFT_READ_WRITE;
    acc[k++] = (weft_access_t){blk[u->out[i]], kind};
  }
  for (int j = 0; j < MAX_IN; j++)
    if (u->in[j] >= 0 && u->in[j] != u->out[0] && u->in[j] != u->out[1])
      acc[k++] = (weft_access_t){blk[u->in[j]], WEFT_READ};
  return k;
}

typedef struct tally {
  uint64_t uses, waits, minimal, skipped;
  double ns; /* host time of all uses */
} tally_t;

/* Runs the program on a quiet runtime (blocks allocated, then synchronised, so that the count
 * starts from nothing outstanding) and adds its figures to *t. */
static void run(weft_runtime_t *rt, weft_stream_t *const *s, const prog_t *p, tally_t *t) {
  weft_block_t *blk = calloc(p->blocks, sizeof *blk);
  if (blk == NULL) bench_die("waits: no host memory");
  for (unsigned b = 0; b < p->blocks; b++) BENCH_WEFT(weft_alloc(rt, 256, s[0], "waits", &blk[b]));
  BENCH_WEFT(weft_runtime_synchronize(rt));
  weft_counters_t c0, c1;
  BENCH_WEFT(weft_runtime_counters(rt, &c0));
  uint64_t t0 = bench_now_ns();
  for (unsigned v = 0; v < p->uses; v++) {
    weft_access_t acc[MAX_IN + MAX_OUT];
    size_t k = accesses_of(&p->use[v], blk, acc);
    weft_stream_t *on = s[p->use[v].stream];
    BENCH_WEFT(weft_use_begin(on, acc, k));
    BENCH_WEFT(weft_use_end(on, acc, k));
  }
  t->ns += (double)(bench_now_ns() - t0);
  BENCH_WEFT(weft_runtime_counters(rt, &c1));
  for (unsigned b = 0; b < p->blocks; b++) BENCH_WEFT(weft_free(blk[b], s[0]));
  BENCH_WEFT(weft_runtime_synchronize(rt));
  free(blk);
  t->uses += p->uses;
  t->waits += c1.waits_issued - c0.waits_issued;
  t->skipped += c1.waits_skipped - c0.waits_skipped;
  t->minimal += reduction_edges(p);
}

static void row(const bench_t *b, const char *name, unsigned streams, const tally_t *t) {
  printf("| %s | %u | %llu | %llu | %llu | %lld | %.2f | %llu | %.0f |\n", name, streams, (unsigned long long)t->uses,
         (unsigned long long)t->waits, (unsigned long long)t->minimal, (long long)t->waits - (long long)t->minimal,
         t->minimal ? (double)t->waits / (double)t->minimal : 1.0, (unsigned long long)t->skipped,
         t->ns / (double)t->uses);
  bench_csv(b, "waits", name, "waits issued", (double)t->waits, "waits", "minimal (transitive reduction)",
            (double)t->minimal);
  bench_csv(b, "waits", name, "host ns per use", t->ns / (double)t->uses, "ns", NULL, 0);
}

static void fork_join(prog_t *p) {
  prog_init(p, 17, 8);
  prog_add(p, 0, -1, -1, -1, 0, -1);
  for (unsigned i = 1; i < 8; i++) prog_add(p, i, 0, -1, -1, (int)i, -1);
  for (unsigned i = 1; i < 8; i += 3)
    prog_add(p, 0, (int)i, i + 1 < 8 ? (int)i + 1 : -1, i + 2 < 8 ? (int)i + 2 : -1, 16, -1);
}

/* copy-in on 0, compute on 1, copy-out on 2, double-buffered. */
static void pipeline(prog_t *p) {
  prog_init(p, 6, 3);
  for (unsigned c = 0; c < 40; c++) {
    int x = (int)(c % 2), y = 2 + (int)(c % 2), z = 4 + (int)(c % 2);
    prog_add(p, 0, -1, -1, -1, x, -1);
    prog_add(p, 1, x, -1, -1, y, -1);
    prog_add(p, 2, y, -1, -1, z, -1);
  }
}

static void diamond(prog_t *p) {
  prog_init(p, 4, 4);
  for (int r = 0; r < 10; r++) {
    prog_add(p, 0, 3, -1, -1, 0, -1);
    prog_add(p, 1, 0, -1, -1, 1, -1);
    prog_add(p, 2, 0, -1, -1, 2, -1);
    prog_add(p, 3, 1, 2, -1, 3, -1);
  }
}

/* Each stream writes its block, then reads three others' and writes its second block. */
static void all_to_all(prog_t *p) {
  prog_init(p, 16, 8);
  for (int round = 0; round < 3; round++) {
    for (unsigned i = 0; i < 8; i++) prog_add(p, i, (int)(8 + i), -1, -1, (int)i, -1);
    for (unsigned i = 0; i < 8; i++)
      prog_add(p, i, (int)((i + 1) % 8), (int)((i + 3) % 8), (int)((i + 5) % 8), (int)(8 + i), -1);
  }
}

void bench_waits(bench_t *b) {
  bench_section(b, "Waits issued vs minimal",
                "`cuStreamWaitEvent` calls weft issued on the tracker's pattern suite, against the cross-stream "
                "edges of the transitive reduction of each program's dependency graph: the fewest waits any "
                "correct program can issue. *Skipped*: conflicts weft found already ordered (stream order, "
                "earlier waits, host knowledge) and did not wait for. *ns/use*: host time of a "
                "`weft_use_begin` + `weft_use_end` on the pattern, waits included.");
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  o.event_ring = 4096; /* no evictions: an evicted tick is waited on conservatively, not minimally */
  weft_runtime_t *rt = bench_runtime(&o);
  weft_stream_t *s[8];
  for (unsigned i = 0; i < 8; i++) BENCH_WEFT(weft_stream_get(rt, i, &s[i]));
  static const char *const cols[] = {"pattern", "streams", "uses", "waits issued", "minimal",
                                     "redundant", "issued / minimal", "skipped", "ns/use"};
  bench_table(cols, 9);
  static const struct {
    const char *name;
    void (*build)(prog_t *p);
  } patterns[] = {{"fork-join", fork_join}, {"pipeline", pipeline}, {"diamond", diamond}, {"all-to-all", all_to_all}};
  for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
    prog_t p;
    patterns[i].build(&p);
    tally_t t = {0};
    run(rt, s, &p, &t);
    row(b, patterns[i].name, p.streams, &t);
    free(p.use);
  }
  unsigned seeds = b->quick ? 2 : 12;
  tally_t t = {0};
  for (unsigned seed = 1; seed <= seeds; seed++) {
    prog_t p;
    prog_init(&p, 50, 8);
    prog_random(&p, 1000, seed);
    run(rt, s, &p, &t);
    free(p.use);
  }
  char name[64];
  snprintf(name, sizeof name, "random: %u seeds x 1000 uses, 50 blocks", seeds);
  row(b, name, 8, &t);
  BENCH_WEFT(weft_runtime_release(rt));
  printf("\n");
}
