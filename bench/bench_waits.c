/* Waits: how many cuStreamWaitEvent calls weft issues on the tracker tests' pattern suite, against
 * the minimum: the cross-stream edges of the transitive reduction of each program's dependency
 * graph. A hand-written program cannot be correct with fewer waits, so the minimum is the
 * baseline, and issued = minimal means zero redundant waits.
 *
 * The programs are those of tests/streams/test_tracker_programs.c (same patterns, same random
 * generator and seeds), run here as tracked uses with no work inside: the waits weft issues
 * depend only on the declared accesses, and the tests already prove the results right on the
 * simulator's race oracle and on the GPU. Programs, patterns and the independent reduction
 * count come from tests/streams/prog.h, shared with the tests. */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "tests/streams/prog.h"

/* The accesses of a use, as the tests' weft_test_combine launch declares them: outputs written
 * (read-write when also an input), the other inputs read. */
static size_t accesses_of(const prog_use_t *u, const weft_block_t *blk, weft_access_t *acc) {
  size_t k = 0;
  for (int i = 0; i < PROG_MAX_OUT; i++) {
    if (u->out[i] < 0) continue;
    weft_access_kind_t kind = WEFT_WRITE;
    for (int j = 0; j < PROG_MAX_IN; j++)
      if (u->in[j] == u->out[i]) kind = WEFT_READ_WRITE;
    acc[k++] = (weft_access_t){blk[u->out[i]], kind};
  }
  for (int j = 0; j < PROG_MAX_IN; j++)
    if (u->in[j] >= 0 && u->in[j] != u->out[0] && u->in[j] != u->out[1])
      acc[k++] = (weft_access_t){blk[u->in[j]], WEFT_READ};
  return k;
}

typedef struct tally {
  uint64_t uses, waits, minimal, skipped, late;
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
    weft_access_t acc[PROG_MAX_IN + PROG_MAX_OUT];
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
  t->late += c1.late_waits - c0.late_waits;
  t->minimal += prog_reduction_edges(p);
}

static void row(const bench_t *b, const char *name, unsigned streams, const tally_t *t) {
  printf("| %s | %u | %llu | %llu | %llu | %lld | %.2f | %llu | %llu | %.0f |\n", name, streams,
         (unsigned long long)t->uses, (unsigned long long)t->waits, (unsigned long long)t->minimal,
         (long long)t->waits - (long long)t->minimal, t->minimal ? (double)t->waits / (double)t->minimal : 1.0,
         (unsigned long long)t->late, (unsigned long long)t->skipped, t->ns / (double)t->uses);
  /* The pattern is the x of its pair: each pattern's count beside its own minimum. */
  bench_sample(b, "waits", "weft, waits issued", "waits", "waits", "minimal (transitive reduction)", name, 0,
               (double)t->waits);
  bench_sample(b, "waits", "minimal (transitive reduction)", "waits", "waits", NULL, name, 0, (double)t->minimal);
  bench_sample(b, "waits", "weft, late waits (lazy records)", "waits", "waits", NULL, name, 0, (double)t->late);
  bench_sample(b, "waits", name, "host ns per use", "ns", NULL, NULL, 0, t->ns / (double)t->uses);
}

void bench_waits(bench_t *b) {
  bench_section(b, "Waits issued vs minimal",
                "`cuStreamWaitEvent` calls weft issued on the tracker's pattern suite, against the cross-stream "
                "edges of the transitive reduction of each program's dependency graph: the fewest waits any "
                "correct program can issue. *Late*: waits for an event that covers later uses of its stream "
                "too (options.lazy_records, the default: those uses joined one tick); such a wait may imply a "
                "later need, so issued can fall below minimal (never above), and equals it while late is 0. "
                "*Skipped*: conflicts weft found already ordered (stream order, earlier waits, host "
                "knowledge) and did not wait for. *ns/use*: host time of a `weft_use_begin` + `weft_use_end` "
                "on the pattern, waits included.");
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  o.event_ring = 4096; /* no evictions: an evicted tick is waited on conservatively, not minimally */
  weft_runtime_t *rt = bench_runtime(&o);
  weft_stream_t *s[8];
  for (unsigned i = 0; i < 8; i++) BENCH_WEFT(weft_stream_get(rt, i, &s[i]));
  static const char *const cols[] = {"pattern", "streams", "uses", "waits issued", "minimal",
                                     "issued - minimal", "issued / minimal", "late", "skipped", "ns/use"};
  bench_table(cols, 10);
  static const struct {
    const char *name;
    void (*build)(prog_t *p);
  } patterns[] = {{"fork-join", prog_fork_join},
                   {"pipeline", prog_pipeline},
                   {"diamond", prog_diamond},
                   {"all-to-all", prog_all_to_all}};
  for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
    prog_t p;
    patterns[i].build(&p);
    tally_t t = {0};
    run(rt, s, &p, &t);
    row(b, patterns[i].name, p.streams, &t);
    prog_free(&p);
  }
  unsigned seeds = b->quick ? 2 : 12;
  tally_t t = {0};
  for (unsigned seed = 1; seed <= seeds; seed++) {
    prog_t p;
    prog_init(&p, 50, 8, 64);
    prog_random(&p, 1000, seed);
    run(rt, s, &p, &t);
    prog_free(&p);
  }
  char name[64];
  snprintf(name, sizeof name, "random: %u seeds x 1000 uses, 50 blocks", seeds);
  row(b, name, 8, &t);
  BENCH_WEFT(weft_runtime_release(rt));
  printf("\n");
}
