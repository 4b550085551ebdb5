/* Scale gate: random programs with a sequential model (see scale.h for what and how). */
#include "tests/scale/scale.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/runtime/runtime.h"
#include "tests/util/testutil.h"

enum {
  STREAMS = 8,
  MAXE = 64,       /* most elements of a block */
  MINE = 16,       /* fewest */
  MAX_SLOTS = 192, /* live blocks known to the model (eager blocks and graph outputs) */
  MAX_EAGER_LIVE = 48,
  MAX_INNER = 12,  /* blocks allocated inside one capture */
  MAX_SUM = 24,    /* blocks from outside one capture */
  MAX_GOPS = 48,   /* uses inside one capture */
  MAX_GRAPHS = 16, /* graph records (execs and graphs waiting for their outputs' frees) */
  MAX_EXECS = 5,   /* live execs */
  MAX_PENDING = 24 /* host reads not yet known complete */
};

#define NONE INT_MIN
#define INNER(k) (-(k)-1)
#define IS_INNER(r) ((r) < 0 && (r) != NONE)
#define INNER_IDX(r) (-(r)-1)

enum { OP_FILL = 1, OP_COMBINE = 2 };

typedef struct gop {
  unsigned char kind;
  int out[2], in[3]; /* slot (>= 0), INNER(k) or NONE */
  unsigned n, arg;   /* elements; fill value or combine salt */
} gop_t;

typedef struct slot {
  bool live;
  weft_block_t h;
  unsigned size, defined; /* elements; elements [0, defined) have known values */
  unsigned val[MAXE];
  int pins;       /* live execs whose access summary holds it */
  int graph;      /* graph record whose output it is, or -1 */
  int cap;        /* touched in the current capture: 1 read, 2 written, 3 both (0: not) */
  unsigned cdef;  /* defined elements as the capture sees them */
  long born, last_write;
} slot_t;

typedef struct inner {
  weft_block_t h;
  unsigned size, defined;
  bool alive;
} inner_t;

typedef struct grec {
  bool used;
  weft_graph_t *g;
  weft_exec_t *e; /* NULL once destroyed (the graph waits for its outputs' frees) */
  weft_graph_memory_t mem;
  gop_t ops[MAX_GOPS];
  unsigned nops, ninner, nout, nsum;
  unsigned inner_size[MAX_INNER], inner_def[MAX_INNER];
  unsigned out_inner[MAX_INNER]; /* output i is inner block out_inner[i] */
  int out_slot[MAX_INNER];       /* slot of output i of the latest launch, or -1 */
  int sum_slot[MAX_SUM];         /* the summary's blocks (-1: freed on purpose) */
  unsigned live_outputs;
  int launches_left;
  long id, launches;
} grec_t;

typedef struct pread {
  bool used;
  unsigned stream;
  weft_block_t h;
  int slot;
  unsigned n;
  long op, born, last_write; /* the read's op; the block's allocation and last write */
  unsigned buf[MAXE], exp[MAXE];
} pread_t;

typedef struct capture {
  bool active;
  unsigned origin, mask, joined, target;
  weft_graph_memory_t mem;
  inner_t inner[MAX_INNER];
  unsigned ninner;
  gop_t ops[MAX_GOPS];
  unsigned nops;
  int touched[MAX_SUM];
  unsigned ntouched;
  long begun;
} capture_t;

static struct {
  const scale_cfg_t *cfg;
  scale_result_t *res;
  tu_env_t env;
  weft_stream_t *s[STREAMS];
  uint64_t rng;
  long op;
  bool failed;
  slot_t slot[MAX_SLOTS];
  grec_t gr[MAX_GRAPHS];
  pread_t pr[MAX_PENDING];
  capture_t c;
  long graph_ids;
  bool destroy_in_capture;
  bool join_early;   /* joins only before the capture's first alloc or use */
  bool safe_capture; /* steer around the known pending-tick bugs (see scale.h) */
  bool no_captures;
  long fail_lines;
  bool fatal; /* the failure ends the seed: always printed */
} S;

/* ---- helpers -------------------------------------------------------------------------------- */

static uint64_t next64(void) {
  uint64_t z = (S.rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static unsigned rnd(unsigned n) { return n ? (unsigned)(next64() % n) : 0; }
static bool chance(unsigned per_mille) { return rnd(1000) < per_mille; }

static void failf(const char *fmt, ...) {
  S.failed = true;
  if (++S.fail_lines > 12 && !S.fatal) {
    if (S.fail_lines == 13) fprintf(stderr, "FAIL seed %" PRIu64 ": (further failure lines of this seed suppressed)\n", S.cfg->seed);
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL seed %" PRIu64 " ring %u policy %s op %ld: ", S.cfg->seed, S.cfg->ring,
          S.cfg->policy == WEFT_OUTPUT_AUTO_FREE ? "auto" : "error", S.op);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  S.failed = true;
}

static void trace(const char *fmt, ...) {
  if (S.cfg->trace_from < 0 || S.op < S.cfg->trace_from) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "op %ld: ", S.op);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* A call's status must be `want`; otherwise the seed fails (returns -1 from the caller). */
#define EXPECT(call, want)                                                                              \
  do {                                                                                                  \
    weft_status_t st_ = (call);                                                                         \
    if (st_ != (want)) {                                                                                \
      S.res->errors++;                                                                                  \
      S.fatal = true;                                                                                   \
      failf("%s gave %s (%s), expected %s", #call, weft_status_name(st_), weft_last_error(),         \
            weft_status_name(want));                                                                    \
      return -1;                                                                                        \
    }                                                                                                   \
  } while (0)

static bool in_capture_stream(unsigned s) { return S.c.active && (S.c.mask >> s & 1u); }

/* A stream outside the capture (any stream when none is active). */
static unsigned eager_stream(void) {
  for (;;) {
    unsigned s = rnd(STREAMS);
    if (!in_capture_stream(s)) return s;
  }
}

static unsigned capture_stream(void) {
  for (;;) {
    unsigned s = rnd(STREAMS);
    if (S.c.mask >> s & 1u) return s;
  }
}

static unsigned live_slots(void) {
  unsigned n = 0;
  for (unsigned i = 0; i < MAX_SLOTS; i++) n += S.slot[i].live;
  return n;
}

static int free_slot(void) {
  for (unsigned i = 0; i < MAX_SLOTS; i++)
    if (!S.slot[i].live) return (int)i;
  return -1;
}

/* Eager work may touch a live block unless the running capture touched it (then it is pinned
 * to the graph being captured). */
static bool eager_ok(int i) { return S.slot[i].live && S.slot[i].cap == 0; }

/* A random slot satisfying `ok` (and with defined elements if need_def), or -1. */
static int pick_slot(bool (*ok)(int), bool need_def) {
  int cand[MAX_SLOTS];
  unsigned n = 0;
  for (int i = 0; i < MAX_SLOTS; i++)
    if (ok(i) && (!need_def || S.slot[i].defined > 0)) cand[n++] = i;
  return n ? cand[rnd(n)] : -1;
}

static void slot_init(int i, weft_block_t h, unsigned size, int graph) {
  slot_t *b = &S.slot[i];
  memset(b, 0, sizeof *b);
  b->live = true;
  b->h = h;
  b->size = size;
  b->graph = graph;
  b->born = S.op;
  b->last_write = -1;
}

/* ---- the model -------------------------------------------------------------------------------- */

typedef struct view {
  unsigned (*inner_val)[MAXE]; /* replay: contents of the graph's own blocks */
  unsigned *inner_def;
} view_t;

static unsigned *vals(const view_t *v, int r) { return IS_INNER(r) ? v->inner_val[INNER_IDX(r)] : S.slot[r].val; }
static void mark_written(const view_t *v, int r, unsigned n) {
  if (IS_INNER(r)) {
    unsigned *d = &v->inner_def[INNER_IDX(r)];
    if (*d < n) *d = n;
  } else {
    if (S.slot[r].defined < n) S.slot[r].defined = n;
    S.slot[r].last_write = S.op;
  }
}

/* Applies one use as the kernels do: element-wise, all inputs read before outputs written. */
static void model_apply(const gop_t *o, const view_t *v) {
  unsigned tmp[MAXE];
  if (o->kind == OP_FILL) {
    unsigned *d = vals(v, o->out[0]);
    for (unsigned i = 0; i < o->n; i++) d[i] = o->arg;
    mark_written(v, o->out[0], o->n);
    return;
  }
  static const unsigned mul[3] = {7u, 13u, 17u};
  for (unsigned i = 0; i < o->n; i++) tmp[i] = o->arg;
  for (int j = 0; j < 3; j++) {
    if (o->in[j] == NONE) continue;
    const unsigned *src = vals(v, o->in[j]);
    for (unsigned i = 0; i < o->n; i++) tmp[i] += mul[j] * src[i];
  }
  for (int k = 0; k < 2; k++) {
    if (o->out[k] == NONE) continue;
    unsigned *d = vals(v, o->out[k]);
    for (unsigned i = 0; i < o->n; i++) d[i] = k == 0 ? tmp[i] : tmp[i] ^ 0x55555555u;
    mark_written(v, o->out[k], o->n);
  }
}

/* ---- pending host reads ---------------------------------------------------------------------- */

static void check_read(pread_t *p) {
  long bad = 0;
  for (unsigned i = 0; i < p->n; i++) {
    if (p->buf[i] == p->exp[i]) continue;
    if (bad++ < 3)
      failf("wrong value: slot %d (allocated or launched at op %ld, last written at op %ld; read issued at op %ld on "
            "stream %u, %u elements) element %u is %u, expected %u",
            p->slot, p->born, p->last_write, p->op, p->stream, p->n, i, p->buf[i], p->exp[i]);
  }
  if (bad) {
    if (S.res->first_bad_op < 0) S.res->first_bad_op = S.op;
    S.res->mismatches += bad;
  }
  p->used = false;
}

/* Reads known complete: on stream s (s < 0: all), or of block h (when h.rec != NULL). */
static void complete_reads(int s, weft_block_t h) {
  for (unsigned i = 0; i < MAX_PENDING; i++) {
    pread_t *p = &S.pr[i];
    if (!p->used) continue;
    if (h.rec != NULL ? (p->h.rec == h.rec && p->h.gen == h.gen) : (s < 0 || (unsigned)s == p->stream))
      check_read(p);
  }
}

static unsigned pending_reads(void) {
  unsigned n = 0;
  for (unsigned i = 0; i < MAX_PENDING; i++) n += S.pr[i].used;
  return n;
}

/* ---- graph records -------------------------------------------------------------------------- */

/* Destroys a graph whose exec is gone and whose outputs are all freed, also while a capture is
 * active (destroying a graph with its own private pool frees the pool's chunks, which must not
 * invalidate a GLOBAL capture on another stream); with WEFT_TEST_DESTROY_IN_CAPTURE=0 such a
 * graph waits for the next step outside captures (sweep_graphs). */
static int graph_destroy_if_done(int gi) {
  grec_t *g = &S.gr[gi];
  if (g->e != NULL || g->live_outputs != 0) return 0;
  if (S.c.active && !S.destroy_in_capture) return 0;
  EXPECT(weft_graph_destroy(g->g), WEFT_OK);
  trace("graph %ld destroyed", g->id);
  g->used = false;
  return 0;
}

/* The model's side of a free (weft_free already succeeded or the launch freed it). */
static int forget_slot(int i) {
  slot_t *b = &S.slot[i];
  b->live = false;
  if (b->graph >= 0) {
    grec_t *g = &S.gr[b->graph];
    for (unsigned k = 0; k < g->nout; k++)
      if (g->out_slot[k] == i) g->out_slot[k] = -1;
    g->live_outputs--;
    return graph_destroy_if_done(b->graph);
  }
  return 0;
}

/* ---- eager operations ----------------------------------------------------------------------- */

static int do_alloc(unsigned s) {
  int i = free_slot();
  if (i < 0) return 0;
  unsigned size = MINE + rnd(MAXE - MINE + 1);
  weft_block_t h;
  trace("alloc slot %d (%u elements) on stream %u", i, size, s);
  EXPECT(weft_alloc(S.env.rt, (size_t)size * 4, S.s[s], "scale", &h), WEFT_OK);
  slot_init(i, h, size, -1);
  S.res->allocs++;
  return 0;
}

static int do_free(int i, unsigned s) {
  slot_t *b = &S.slot[i];
  weft_block_t h = b->h;
  trace("free slot %d on stream %u%s", i, s, b->graph >= 0 ? " (graph output)" : "");
  EXPECT(weft_free(h, S.s[s]), WEFT_OK);
  S.res->frees++;
  if (chance(60)) {
    CUdeviceptr p;
    EXPECT(weft_block_ptr(h, &p), WEFT_ERR_STALE_HANDLE);
    EXPECT(weft_free(h, S.s[s]), WEFT_ERR_DOUBLE_FREE);
  }
  return forget_slot(i);
}

static bool freeable(int i) { return eager_ok(i) && S.slot[i].pins == 0; }

/* A use issued now (eager): runs the kernel and updates the model. */
static int issue(const gop_t *o, unsigned s, const weft_block_t *hout, const weft_block_t *hin) {
  static const weft_block_t none = {0};
  if (o->kind == OP_FILL) {
    EXPECT(tu_fill(&S.env, S.s[s], hout[0], o->n, o->arg), WEFT_OK);
  } else {
    EXPECT(tu_combine(&S.env, S.s[s], hout[0], o->out[1] != NONE ? hout[1] : none, hin[0],
                      o->in[1] != NONE ? hin[1] : none, o->in[2] != NONE ? hin[2] : none, o->n, o->arg),
           WEFT_OK);
  }
  S.res->uses++;
  return 0;
}

static void trace_gop(const gop_t *o, unsigned s, const char *where) {
  if (S.cfg->trace_from < 0 || S.op < S.cfg->trace_from) return;
  char b[5][16];
  const int *r[5] = {&o->out[0], &o->out[1], &o->in[0], &o->in[1], &o->in[2]};
  for (int k = 0; k < 5; k++) {
    if (*r[k] == NONE) snprintf(b[k], sizeof b[k], "-");
    else if (IS_INNER(*r[k])) snprintf(b[k], sizeof b[k], "i%d", INNER_IDX(*r[k]));
    else snprintf(b[k], sizeof b[k], "%d", *r[k]);
  }
  if (o->kind == OP_FILL) trace("%s fill slot %s n %u on stream %u", where, b[0], o->n, s);
  else trace("%s combine out %s,%s in %s,%s,%s n %u on stream %u", where, b[0], b[1], b[2], b[3], b[4], o->n, s);
}

static int eager_use(unsigned s) {
  gop_t o = {.out = {NONE, NONE}, .in = {NONE, NONE, NONE}};
  weft_block_t hout[2] = {{0}}, hin[3] = {{0}};
  if (chance(250)) {
    int d = pick_slot(eager_ok, false);
    if (d < 0) return 0;
    o.kind = OP_FILL;
    o.out[0] = d;
    o.n = chance(750) ? S.slot[d].size : 1 + rnd(S.slot[d].size);
    o.arg = (unsigned)next64();
    hout[0] = S.slot[d].h;
  } else {
    o.kind = OP_COMBINE;
    unsigned nin = 1 + rnd(3), nout = 1 + rnd(2);
    o.n = MAXE;
    for (unsigned j = 0; j < nin; j++) {
      int x = pick_slot(eager_ok, true);
      if (x < 0) return 0;
      o.in[j] = x;
      hin[j] = S.slot[x].h;
      if (S.slot[x].defined < o.n) o.n = S.slot[x].defined;
    }
    for (unsigned k = 0; k < nout; k++) {
      int y = pick_slot(eager_ok, false);
      if (y < 0 || (k == 1 && y == o.out[0])) break;
      o.out[k] = y;
      hout[k] = S.slot[y].h;
      if (S.slot[y].size < o.n) o.n = S.slot[y].size;
    }
    if (o.out[0] == NONE) return 0;
    o.arg = (unsigned)next64();
  }
  trace_gop(&o, s, "eager");
  if (issue(&o, s, hout, hin)) return -1;
  view_t v = {0};
  model_apply(&o, &v);
  return 0;
}

static int host_read(unsigned s) {
  int i = pick_slot(eager_ok, true);
  if (i < 0) return 0;
  pread_t *p = NULL;
  for (unsigned k = 0; k < MAX_PENDING && p == NULL; k++)
    if (!S.pr[k].used) p = &S.pr[k];
  if (p == NULL) return 0;
  slot_t *b = &S.slot[i];
  p->used = true;
  p->stream = s;
  p->h = b->h;
  p->slot = i;
  p->n = b->defined;
  p->op = S.op;
  p->born = b->born;
  p->last_write = b->last_write;
  memcpy(p->exp, b->val, p->n * sizeof *p->exp);
  memset(p->buf, 0xee, sizeof p->buf);
  trace("read slot %d (%u elements) to the host on stream %u", i, p->n, s);
  EXPECT(weft_copy_from_block(S.s[s], p->buf, b->h, 0, (size_t)p->n * 4), WEFT_OK);
  S.res->host_reads++;
  return 0;
}

static int host_sync(void) {
  unsigned k = rnd(100), s = rnd(STREAMS);
  S.res->syncs++;
  if (k < 40) {
    trace("stream_synchronize %u", s);
    EXPECT(weft_stream_synchronize(S.s[s]), WEFT_OK);
    complete_reads((int)s, (weft_block_t){0});
  } else if (k < 70) {
    weft_status_t st = weft_stream_query(S.s[s]);
    trace("stream_query %u: %s", s, weft_status_name(st));
    if (st == WEFT_OK) complete_reads((int)s, (weft_block_t){0});
    else if (st != WEFT_ERR_NOT_READY) EXPECT(st, WEFT_OK);
  } else if (k < 92) {
    int i = pick_slot(eager_ok, false);
    if (i < 0) return 0;
    trace("block_synchronize slot %d", i);
    EXPECT(weft_block_synchronize(S.slot[i].h), WEFT_OK);
    complete_reads(-1, S.slot[i].h);
  } else {
    trace("runtime_synchronize");
    EXPECT(weft_runtime_synchronize(S.env.rt), WEFT_OK);
    complete_reads(-1, (weft_block_t){0});
  }
  return 0;
}

/* ---- graphs: launch, destroy ----------------------------------------------------------------- */

/* Whether exec gi can be launched now without freeing a block another graph (or the running
 * capture) still needs. */
static bool launchable(int gi) {
  const grec_t *g = &S.gr[gi];
  if (!g->used || g->e == NULL) return false;
  for (unsigned k = 0; k < g->nsum; k++)
    if (g->sum_slot[k] >= 0 && S.slot[g->sum_slot[k]].cap != 0) return false;
  unsigned need = 0;
  for (unsigned k = 0; k < g->nout; k++) {
    int o = g->out_slot[k];
    if (o < 0) need++;
    else if (S.slot[o].pins != 0 || S.slot[o].cap != 0) return false;
  }
  unsigned freeslots = MAX_SLOTS - live_slots();
  return freeslots >= need + 1;
}

static int exec_launch(int gi, unsigned s) {
  grec_t *g = &S.gr[gi];
  bool auto_free = S.cfg->policy == WEFT_OUTPUT_AUTO_FREE;
  if (g->live_outputs != 0) {
    if (!auto_free && chance(300)) {
      trace("launch graph %ld on stream %u with live outputs: BUSY expected", g->id, s);
      EXPECT(weft_exec_launch(g->e, S.s[s]), WEFT_ERR_BUSY);
    }
    /* Free the previous outputs ourselves (always under ERROR, sometimes under AUTO_FREE). */
    if (!auto_free || chance(300))
      for (unsigned k = 0; k < g->nout; k++)
        if (g->out_slot[k] >= 0 && (!auto_free || chance(500)))
          if (do_free(g->out_slot[k], eager_stream())) return -1;
  }
  weft_block_t old[MAX_INNER];
  int old_slot[MAX_INNER];
  for (unsigned k = 0; k < g->nout; k++) {
    old_slot[k] = g->out_slot[k];
    old[k] = old_slot[k] >= 0 ? S.slot[old_slot[k]].h : (weft_block_t){0};
  }
  trace("launch graph %ld on stream %u (%u ops, %u summary, %u outputs)", g->id, s, g->nops, g->nsum, g->nout);
  EXPECT(weft_exec_launch(g->e, S.s[s]), WEFT_OK);
  S.res->launches++;
  g->launches++;
  /* Auto-freed outputs of the previous launch. */
  for (unsigned k = 0; k < g->nout; k++) {
    if (old_slot[k] < 0) continue;
    CUdeviceptr p;
    EXPECT(weft_block_ptr(old[k], &p), WEFT_ERR_STALE_HANDLE);
    trace("slot %d auto-freed", old_slot[k]);
    if (forget_slot(old_slot[k])) return -1;
  }
  /* Replay the captured uses on the model. */
  unsigned ival[MAX_INNER][MAXE], idef[MAX_INNER];
  for (unsigned k = 0; k < g->ninner; k++) idef[k] = 0;
  memset(ival, 0, sizeof ival);
  view_t v = {ival, idef};
  for (unsigned k = 0; k < g->nops; k++) model_apply(&g->ops[k], &v);
  for (unsigned k = 0; k < g->nout; k++) {
    weft_block_t h;
    EXPECT(weft_exec_output(g->e, k, &h), WEFT_OK);
    if (h.rec == NULL) {
      failf("graph %ld: output %u of the launch is a null block", g->id, k);
      S.res->errors++;
      return -1;
    }
    int i = free_slot();
    unsigned in = g->out_inner[k];
    slot_init(i, h, g->inner_size[in], gi);
    S.slot[i].defined = idef[in];
    S.slot[i].last_write = S.op;
    memcpy(S.slot[i].val, ival[in], sizeof S.slot[i].val);
    g->out_slot[k] = i;
    g->live_outputs++;
    trace("graph %ld output %u is slot %d", g->id, k, i);
  }
  g->launches_left--;
  return 0;
}

static int exec_destroy(int gi) {
  grec_t *g = &S.gr[gi];
  trace("destroy exec of graph %ld (%ld launches, %u live outputs)", g->id, g->launches, g->live_outputs);
  EXPECT(weft_exec_destroy(g->e), WEFT_OK);
  g->e = NULL;
  for (unsigned k = 0; k < g->nsum; k++)
    if (g->sum_slot[k] >= 0) S.slot[g->sum_slot[k]].pins--;
  if (g->live_outputs != 0) EXPECT(weft_graph_destroy(g->g), WEFT_ERR_BUSY);
  return graph_destroy_if_done(gi);
}

/* Frees a summary block on purpose: the next launch must say STALE_HANDLE and change nothing. */
static int stale_summary(int gi) {
  grec_t *g = &S.gr[gi];
  int k = -1;
  for (unsigned j = 0; j < g->nsum && k < 0; j++) {
    int i = g->sum_slot[j];
    if (i >= 0 && S.slot[i].pins == 1 && S.slot[i].cap == 0) k = (int)j;
  }
  if (k < 0) return 0;
  for (unsigned j = 0; j < g->nout; j++)
    if (g->out_slot[j] >= 0 && (S.slot[g->out_slot[j]].pins != 0 || S.slot[g->out_slot[j]].cap != 0)) return 0;
  if (S.cfg->policy != WEFT_OUTPUT_AUTO_FREE)
    for (unsigned j = 0; j < g->nout; j++)
      if (g->out_slot[j] >= 0 && do_free(g->out_slot[j], eager_stream())) return -1;
  int i = g->sum_slot[k];
  trace("free summary block slot %d of graph %ld on purpose", i, g->id);
  S.slot[i].pins--;
  g->sum_slot[k] = -1;
  if (do_free(i, eager_stream())) return -1;
  EXPECT(weft_exec_launch(g->e, S.s[eager_stream()]), WEFT_ERR_STALE_HANDLE);
  for (unsigned j = 0; j < g->nout; j++) {
    weft_block_t h;
    EXPECT(weft_exec_output(g->e, j, &h), WEFT_OK);
    int o = g->out_slot[j];
    if (o >= 0 && (h.rec != S.slot[o].h.rec || h.gen != S.slot[o].h.gen)) {
      failf("graph %ld: a failed launch changed output %u", g->id, j);
      S.res->errors++;
      return -1;
    }
    CUdeviceptr p;
    if (o >= 0) EXPECT(weft_block_ptr(h, &p), WEFT_OK);
  }
  return exec_destroy(gi);
}

static int pick_exec(bool need_launchable) {
  int cand[MAX_GRAPHS];
  unsigned n = 0;
  for (int i = 0; i < MAX_GRAPHS; i++)
    if (S.gr[i].used && S.gr[i].e != NULL && (!need_launchable || launchable(i))) cand[n++] = i;
  return n ? cand[rnd(n)] : -1;
}

static unsigned live_execs(void) {
  unsigned n = 0;
  for (int i = 0; i < MAX_GRAPHS; i++) n += S.gr[i].used && S.gr[i].e != NULL;
  return n;
}

static int free_grec(void) {
  for (int i = 0; i < MAX_GRAPHS; i++)
    if (!S.gr[i].used) return i;
  return -1;
}

/* ---- captures -------------------------------------------------------------------------------- */

static int capture_begin(void) {
  capture_t *c = &S.c;
  memset(c, 0, sizeof *c);
  c->origin = rnd(STREAMS);
  c->mem = chance(500) ? WEFT_GRAPH_MEMORY_NODES : WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  c->target = 2 + rnd(chance(200) ? MAX_GOPS - 2 : 16);
  c->begun = S.op;
  weft_capture_options_t o = weft_capture_options_default();
  o.memory = c->mem;
  unsigned join[3], nj = 0;
  if (S.safe_capture) {
    /* Streams that take part start with nothing pending: the host has seen their work. */
    nj = rnd(4);
    for (unsigned j = 0; j < nj; j++) {
      join[j] = rnd(STREAMS);
      for (unsigned i = 0; i < j; i++)
        if (join[i] == join[j] || join[j] == c->origin) join[j] = STREAMS;
      if (join[j] == c->origin) join[j] = STREAMS;
    }
    for (unsigned j = 0; j <= nj; j++) {
      unsigned t = j == nj ? c->origin : join[j];
      if (t == STREAMS) continue;
      trace("stream_synchronize %u", t);
      EXPECT(weft_stream_synchronize(S.s[t]), WEFT_OK);
      complete_reads((int)t, (weft_block_t){0});
    }
  }
  trace("capture_begin on stream %u (%s)", c->origin, c->mem == WEFT_GRAPH_MEMORY_NODES ? "memory nodes" : "private pool");
  EXPECT(weft_capture_begin(S.s[c->origin], &o), WEFT_OK);
  c->active = true;
  c->mask = 1u << c->origin;
  S.res->captures++;
  for (unsigned j = 0; j < nj; j++) {
    if (join[j] == STREAMS) continue;
    trace("capture_join stream %u", join[j]);
    EXPECT(weft_capture_join(S.s[c->origin], S.s[join[j]]), WEFT_OK);
    c->mask |= 1u << join[j];
    c->joined++;
  }
  return 0;
}

/* Outside blocks the capture may touch: live, and already touched or room in the summary. */
static bool cap_room(unsigned fresh) {
  /* WEFT_TEST_SAFE_CAPTURE: fewer than 32 blocks per capture (weft's capture block table grows at
   * 32, and a use that grows it keeps stale pointers into the old table). */
  return S.c.ntouched + fresh <= MAX_SUM && (!S.safe_capture || S.c.ntouched + S.c.ninner + fresh < 32);
}
static bool cap_outside_ok(int i) { return S.slot[i].live && (S.slot[i].cap != 0 || cap_room(1)); }

static unsigned cap_defined(int r) {
  if (IS_INNER(r)) return S.c.inner[INNER_IDX(r)].defined;
  return S.slot[r].cap ? S.slot[r].cdef : S.slot[r].defined;
}
static unsigned cap_size(int r) { return IS_INNER(r) ? S.c.inner[INNER_IDX(r)].size : S.slot[r].size; }
static weft_block_t cap_handle(int r) { return IS_INNER(r) ? S.c.inner[INNER_IDX(r)].h : S.slot[r].h; }

/* A block for a use inside the capture: an inner block (often) or an outside one. */
static int cap_pick(bool need_def) {
  int cand[MAX_INNER];
  unsigned n = 0;
  for (unsigned k = 0; k < S.c.ninner; k++)
    if (S.c.inner[k].alive && (!need_def || S.c.inner[k].defined > 0)) cand[n++] = INNER((int)k);
  if (n > 0 && chance(600)) return cand[rnd(n)];
  int cands[MAX_SLOTS];
  unsigned m = 0;
  for (int i = 0; i < MAX_SLOTS; i++)
    if (cap_outside_ok(i) && (!need_def || cap_defined(i) > 0)) cands[m++] = i;
  if (m > 0) return cands[rnd(m)];
  return n > 0 ? cand[rnd(n)] : NONE;
}

static void cap_touch(int r, int how, unsigned n) {
  if (IS_INNER(r)) {
    inner_t *in = &S.c.inner[INNER_IDX(r)];
    if (how == 2 && in->defined < n) in->defined = n;
    return;
  }
  slot_t *b = &S.slot[r];
  if (b->cap == 0) {
    S.c.touched[S.c.ntouched++] = r;
    b->cdef = b->defined;
  }
  b->cap |= how;
  if (how == 2 && b->cdef < n) b->cdef = n;
}

static int capture_use(unsigned s) {
  gop_t o = {.out = {NONE, NONE}, .in = {NONE, NONE, NONE}};
  if (S.c.nops == MAX_GOPS) return 0;
  if (chance(250)) {
    int d = cap_pick(false);
    if (d == NONE) return 0;
    o.kind = OP_FILL;
    o.out[0] = d;
    o.n = chance(750) ? cap_size(d) : 1 + rnd(cap_size(d));
    o.arg = (unsigned)next64();
  } else {
    o.kind = OP_COMBINE;
    unsigned nin = 1 + rnd(3), nout = 1 + rnd(2);
    o.n = MAXE;
    for (unsigned j = 0; j < nin; j++) {
      int x = cap_pick(true);
      if (x == NONE) return 0;
      o.in[j] = x;
      if (cap_defined(x) < o.n) o.n = cap_defined(x);
    }
    for (unsigned k = 0; k < nout; k++) {
      int y = cap_pick(false);
      if (y == NONE || (k == 1 && y == o.out[0])) break;
      o.out[k] = y;
      if (cap_size(y) < o.n) o.n = cap_size(y);
    }
    if (o.out[0] == NONE) return 0;
    o.arg = (unsigned)next64();
  }
  /* The summary has room for every outside block of this use? */
  unsigned fresh = 0;
  const int *refs[5] = {&o.out[0], &o.out[1], &o.in[0], &o.in[1], &o.in[2]};
  for (int k = 0; k < 5; k++)
    if (*refs[k] >= 0 && S.slot[*refs[k]].cap == 0) fresh++;
  if (!cap_room(fresh)) return 0;
  weft_block_t hout[2] = {{0}}, hin[3] = {{0}};
  for (int k = 0; k < 2; k++)
    if (o.out[k] != NONE) hout[k] = cap_handle(o.out[k]);
  for (int j = 0; j < 3; j++)
    if (o.in[j] != NONE) hin[j] = cap_handle(o.in[j]);
  trace_gop(&o, s, "captured");
  if (issue(&o, s, hout, hin)) return -1;
  for (int j = 0; j < 3; j++)
    if (o.in[j] != NONE) cap_touch(o.in[j], 1, o.n);
  for (int k = 0; k < 2; k++)
    if (o.out[k] != NONE) cap_touch(o.out[k], 2, o.n);
  S.c.ops[S.c.nops++] = o;
  return 0;
}

static int capture_alloc(unsigned s) {
  if (S.c.ninner == MAX_INNER || (S.safe_capture && (S.c.nops == MAX_GOPS || !cap_room(1)))) return 0;
  inner_t *in = &S.c.inner[S.c.ninner];
  in->size = MINE + rnd(MAXE - MINE + 1);
  trace("captured alloc i%u (%u elements) on stream %u", S.c.ninner, in->size, s);
  EXPECT(weft_alloc(S.env.rt, (size_t)in->size * 4, S.s[s], "inner", &in->h), WEFT_OK);
  in->alive = true;
  in->defined = 0;
  S.c.ninner++;
  S.res->allocs++;
  if (S.safe_capture) {
    /* A use right after the alloc, on its stream: its pending point gets its event at once. */
    gop_t o = {.kind = OP_FILL, .out = {INNER((int)S.c.ninner - 1), NONE}, .in = {NONE, NONE, NONE},
               .n = in->size, .arg = (unsigned)next64()};
    weft_block_t h[2] = {in->h, {0}};
    trace_gop(&o, s, "captured");
    if (issue(&o, s, h, NULL)) return -1;
    cap_touch(o.out[0], 2, o.n);
    S.c.ops[S.c.nops++] = o;
  }
  return 0;
}

static int capture_free(unsigned s) {
  int cand[MAX_INNER];
  unsigned n = 0;
  for (unsigned k = 0; k < S.c.ninner; k++)
    if (S.c.inner[k].alive) cand[n++] = (int)k;
  if (n == 0) return 0;
  int k = cand[rnd(n)];
  trace("captured free i%d on stream %u", k, s);
  EXPECT(weft_free(S.c.inner[k].h, S.s[s]), WEFT_OK);
  S.c.inner[k].alive = false;
  S.res->frees++;
  return 0;
}

static int capture_end(void) {
  capture_t *c = &S.c;
  int gi = free_grec();
  weft_graph_t *g;
  trace("capture_end on stream %u (%u uses, %u inner, %u outside blocks, streams 0x%x)", c->origin, c->nops,
        c->ninner, c->ntouched, c->mask);
  EXPECT(weft_capture_end(S.s[c->origin], &g), WEFT_OK);
  c->active = false;
  grec_t *r = &S.gr[gi];
  memset(r, 0, sizeof *r);
  r->used = true;
  r->g = g;
  r->mem = c->mem;
  r->id = S.graph_ids++;
  r->nops = c->nops;
  memcpy(r->ops, c->ops, c->nops * sizeof *c->ops);
  r->ninner = c->ninner;
  for (unsigned k = 0; k < c->ninner; k++) {
    r->inner_size[k] = c->inner[k].size;
    r->inner_def[k] = c->inner[k].defined;
    if (c->inner[k].alive) {
      r->out_slot[r->nout] = -1;
      r->out_inner[r->nout++] = k;
    }
  }
  for (unsigned k = 0; k < c->ninner; k++) {
    CUdeviceptr p;
    if (k == 0 || chance(100)) EXPECT(weft_block_ptr(c->inner[k].h, &p), WEFT_ERR_STALE_HANDLE);
  }
  if (weft_graph_output_count(g) != r->nout) {
    failf("capture: %zu graph outputs, the model has %u", weft_graph_output_count(g), r->nout);
    S.res->errors++;
    return -1;
  }
  /* The access summary: exactly the outside blocks touched, written ones with WRITE. */
  weft_access_t sum[MAX_SUM + 1];
  size_t ns = weft_graph_summary(g, sum, MAX_SUM + 1);
  if (ns != c->ntouched) {
    failf("capture: summary of %zu blocks, the model touched %u", ns, c->ntouched);
    S.res->errors++;
    return -1;
  }
  for (unsigned k = 0; k < c->ntouched; k++) {
    slot_t *b = &S.slot[c->touched[k]];
    size_t j = 0;
    while (j < ns && (sum[j].block.rec != b->h.rec || sum[j].block.gen != b->h.gen)) j++;
    if (j == ns || ((sum[j].kind & WEFT_WRITE) != 0) != ((b->cap & 2) != 0) || sum[j].kind == 0) {
      failf("capture: slot %d (touched %d) is %s in the summary", c->touched[k], b->cap,
            j == ns ? "missing" : sum[j].kind == WEFT_READ ? "READ" : sum[j].kind == WEFT_WRITE ? "WRITE" : "READ_WRITE");
      S.res->errors++;
      return -1;
    }
    r->sum_slot[r->nsum++] = c->touched[k];
    b->pins++;
    b->cap = 0;
  }
  unsigned up = eager_stream();
  trace("instantiate graph %ld on stream %u", r->id, up);
  EXPECT(weft_graph_instantiate(g, S.s[up], &r->e), WEFT_OK);
  r->launches_left = 2 + (int)rnd(12);
  return 0;
}

static int capture_step(void) {
  capture_t *c = &S.c;
  unsigned k = rnd(1000);
  if (c->nops >= c->target || c->nops == MAX_GOPS) return capture_end();
  if (k < 40 && c->joined < 3 && !S.safe_capture && (!S.join_early || (c->nops == 0 && c->ninner == 0))) {
    unsigned t = eager_stream();
    trace("capture_join stream %u", t);
    EXPECT(weft_capture_join(S.s[c->origin], S.s[t]), WEFT_OK);
    c->mask |= 1u << t;
    c->joined++;
    return 0;
  }
  if (k < 50) { /* freeing a block from outside inside the capture is refused */
    int i = pick_slot(eager_ok, false);
    if (i < 0) return 0;
    unsigned s = capture_stream();
    trace("captured free of outside slot %d on stream %u: CAPTURE expected", i, s);
    EXPECT(weft_free(S.slot[i].h, S.s[s]), WEFT_ERR_CAPTURE);
    CUdeviceptr p;
    EXPECT(weft_block_ptr(S.slot[i].h, &p), WEFT_OK);
    return 0;
  }
  if (k < 150) return capture_alloc(capture_stream());
  if (k < 220) return capture_free(capture_stream());
  if (k < 800) return capture_use(capture_stream());
  /* Eager work on the other streams, on blocks the capture has not touched. */
  unsigned s = eager_stream();
  if (k < 840) return live_slots() < MAX_EAGER_LIVE ? do_alloc(s) : 0;
  if (k < 870) {
    int i = pick_slot(freeable, false);
    return i < 0 ? 0 : do_free(i, s);
  }
  if (k < 890) return host_read(s);
  if (k < 900) {
    int gi = pick_exec(true);
    return gi < 0 ? 0 : exec_launch(gi, s);
  }
  return eager_use(s);
}

/* ---- one step outside captures --------------------------------------------------------------- */

static int sweep_graphs(void) {
  for (int i = 0; i < MAX_GRAPHS; i++)
    if (S.gr[i].used && graph_destroy_if_done(i)) return -1;
  return 0;
}

static int eager_step(void) {
  if (sweep_graphs()) return -1;
  unsigned k = rnd(1000);
  unsigned live = live_slots();
  unsigned s = rnd(STREAMS);
  if (k < 90 || live < 6) return live < MAX_EAGER_LIVE ? do_alloc(s) : 0;
  if (k < 170) {
    int i = pick_slot(freeable, false);
    return i < 0 ? 0 : do_free(i, s);
  }
  if (k < 230) return host_read(s);
  if (k < 270 || pending_reads() == MAX_PENDING) return host_sync();
  if (k < 275) {
    if (S.no_captures || live_execs() >= MAX_EXECS || free_grec() < 0) return 0;
    return capture_begin();
  }
  if (k < 318) {
    int gi = pick_exec(true);
    if (gi < 0) return 0;
    if (S.gr[gi].launches_left <= 0) return exec_destroy(gi);
    return exec_launch(gi, s);
  }
  if (k < 321) {
    int gi = pick_exec(false);
    return gi < 0 ? 0 : exec_destroy(gi);
  }
  if (k < 322) {
    int gi = pick_exec(false);
    return gi < 0 ? 0 : stale_summary(gi);
  }
  return eager_use(s);
}

/* ---- one seed -------------------------------------------------------------------------------- */

static void poll_races(void) {
  if (S.env.sim == NULL) return;
  uint64_t n = S.env.sim->race_count();
  if (n == S.res->races) return;
  if (S.res->first_race_op < 0) {
    S.res->first_race_op = S.op;
    weft_sim_race_t r[2];
    size_t m = S.env.sim->races(r, 2);
    for (size_t i = 0; i < m; i++)
      failf("race: %zu bytes at 0x%llx: %s %s (sim op %" PRIu64 ") and %s %s (sim op %" PRIu64 "), unordered", r[i].bytes,
            (unsigned long long)r[i].ptr, r[i].first_writes ? "written by" : "read by", r[i].first_desc, r[i].first_op,
            r[i].second_writes ? "written by" : "read by", r[i].second_desc, r[i].second_op);
  }
  S.res->races = n;
  S.failed = true;
}

/* Ends everything: the capture, execs, reads; checks every live block; frees all. */
static int finish(void) {
  S.op = S.cfg->ops; /* failures below are reported as "op <ops>" (the final check) */
  if (S.c.active && capture_end()) return -1;
  if (sweep_graphs()) return -1;
  for (int i = 0; i < MAX_GRAPHS; i++)
    if (S.gr[i].used && S.gr[i].e != NULL && exec_destroy(i)) return -1;
  EXPECT(weft_runtime_synchronize(S.env.rt), WEFT_OK);
  complete_reads(-1, (weft_block_t){0});
  for (int i = 0; i < MAX_SLOTS; i++) {
    slot_t *b = &S.slot[i];
    if (!b->live) continue;
    if (b->defined > 0) {
      pread_t *p = &S.pr[0];
      p->used = true;
      p->stream = (unsigned)i % STREAMS;
      p->h = b->h;
      p->slot = i;
      p->n = b->defined;
      p->op = S.op;
      p->born = b->born;
      p->last_write = b->last_write;
      memcpy(p->exp, b->val, p->n * sizeof *p->exp);
      EXPECT(weft_copy_from_block(S.s[p->stream], p->buf, b->h, 0, (size_t)p->n * 4), WEFT_OK);
      EXPECT(weft_block_synchronize(b->h), WEFT_OK);
      check_read(p);
    }
    if (b->pins != 0) {
      failf("slot %d still pinned at the end", i);
      return -1;
    }
    EXPECT(weft_free(b->h, S.s[rnd(STREAMS)]), WEFT_OK);
    if (forget_slot(i)) return -1;
  }
  EXPECT(weft_runtime_synchronize(S.env.rt), WEFT_OK);
  for (int i = 0; i < MAX_GRAPHS; i++)
    if (S.gr[i].used) {
      failf("graph %ld left over", S.gr[i].id);
      return -1;
    }
  poll_races();
  return 0;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int run_scale(const scale_cfg_t *cfg, scale_result_t *res) {
  memset(&S, 0, sizeof S);
  memset(res, 0, sizeof *res);
  res->first_race_op = res->first_bad_op = -1;
  S.cfg = cfg;
  S.res = res;
  S.rng = cfg->seed * 0x2545f4914f6cdd1dull + 11;
  const char *dic = getenv("WEFT_TEST_DESTROY_IN_CAPTURE");
  S.destroy_in_capture = dic == NULL || atoi(dic) != 0;
  const char *je = getenv("WEFT_TEST_JOIN_EARLY");
  S.join_early = je != NULL && atoi(je) != 0;
  const char *sc = getenv("WEFT_TEST_SAFE_CAPTURE");
  S.safe_capture = sc != NULL && atoi(sc) != 0;
  const char *nc = getenv("WEFT_TEST_CAPTURES");
  S.no_captures = nc != NULL && atoi(nc) == 0;
  weft_options_t o = weft_options_default();
  if (weft_options_from_env(&o) != WEFT_OK) {
    fprintf(stderr, "FAIL: bad WEFT_* option: %s\n", weft_last_error());
    return -1;
  }
  o.event_ring = cfg->ring;
  o.output_policy = cfg->policy;
  if (tu_init(&S.env, &o) != 0) {
    fprintf(stderr, "FAIL: tu_init\n");
    return -1;
  }
  if (cfg->no_waits) S.env.rt->tracker.no_waits = true;
  if (S.env.sim != NULL) {
    S.env.sim->seed(cfg->seed);
    S.env.sim->reset_races();
  }
  int rc = 0;
  for (unsigned i = 0; i < STREAMS; i++)
    if (weft_stream_get(S.env.rt, i, &S.s[i]) != WEFT_OK) {
      fprintf(stderr, "FAIL: weft_stream_get %u: %s\n", i, weft_last_error());
      rc = -1;
    }
  weft_counters_t c0, c1;
  if (rc == 0 && weft_runtime_counters(S.env.rt, &c0) != WEFT_OK) rc = -1;
  double t0 = now();
  for (S.op = 0; S.op < cfg->ops; S.op++) {
    rc = S.c.active ? capture_step() : eager_step();
    poll_races();
    if (rc != 0 || (cfg->stop && S.failed)) {
      S.op++; /* ops_done counts the failing op: WEFT_TEST_OPS=ops_done reproduces it */
      break;
    }
  }
  res->ops_done = S.op;
  if (rc == 0 && !(cfg->stop && S.failed)) rc = finish();
  res->seconds = now() - t0;
  if (weft_runtime_counters(S.env.rt, &c1) == WEFT_OK) {
    res->waits_issued = c1.waits_issued - c0.waits_issued;
    res->ring_evictions = c1.ring_evictions - c0.ring_evictions;
  }
  /* After an unexpected status the runtime may hold a capture or live blocks: end what we can. */
  if (rc != 0 || S.failed) {
    if (S.c.active) {
      weft_graph_t *g;
      if (weft_capture_end(S.s[S.c.origin], &g) == WEFT_OK) (void)weft_graph_destroy(g);
    }
    for (int i = 0; i < MAX_GRAPHS; i++)
      if (S.gr[i].used && S.gr[i].e != NULL) (void)weft_exec_destroy(S.gr[i].e);
  }
  S.env.rt->tracker.no_waits = false;
  tu_fini(&S.env);
  return rc != 0 || S.failed ? -1 : 0;
}

/* ---- main: the environment ------------------------------------------------------------------- */

static size_t parse_list(const char *s, uint64_t *out, size_t max) {
  size_t n = 0;
  while (s && *s && n < max) {
    char *end;
    uint64_t a = strtoull(s, &end, 10), b = a;
    if (end == s) break;
    if (*end == '-') {
      s = end + 1;
      b = strtoull(s, &end, 10);
    }
    for (uint64_t x = a; x <= b && n < max; x++) out[n++] = x;
    s = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') break;
  }
  return n;
}

/* Runs one seed in a child process on the simulator, so that it starts fresh for every seed: its
 * race oracle keeps a clock entry per graph chain ever launched, and a long list of seeds in one
 * process would slow down seed after seed. A real driver cannot be used in a child forked after
 * cuInit: there the seed runs in this process. Returns run_scale's answer (-1: the child died). */
static int run_isolated(const scale_cfg_t *c, scale_result_t *r, bool fork_ok) {
  memset(r, 0, sizeof *r);
  if (!fork_ok) return run_scale(c, r);
  int fd[2];
  if (pipe(fd) != 0) return run_scale(c, r);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return run_scale(c, r);
  }
  if (pid == 0) {
    close(fd[0]);
    int rc = run_scale(c, r);
    fflush(stdout);
    fflush(stderr);
    if (write(fd[1], &rc, sizeof rc) != (ssize_t)sizeof rc || write(fd[1], r, sizeof *r) != (ssize_t)sizeof *r) _exit(3);
    _exit(0);
  }
  close(fd[1]);
  int rc = -1;
  bool got = read(fd[0], &rc, sizeof rc) == (ssize_t)sizeof rc && read(fd[0], r, sizeof *r) == (ssize_t)sizeof *r;
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    printf("FAIL seed %" PRIu64 ": the child process died (status 0x%x)\n", c->seed, status);
    r->errors++;
    return -1;
  }
  return rc;
}

int main(void) {
  static uint64_t seeds[100000];
  uint64_t rings[16];
  const char *e = getenv("WEFT_TEST_SEEDS");
  size_t nseeds = parse_list(e && *e ? e : "1-2", seeds, sizeof seeds / sizeof *seeds);
  e = getenv("WEFT_TEST_OPS");
  long ops = e && *e ? atol(e) : 20000;
  size_t nrings = parse_list(getenv("WEFT_TEST_RINGS"), rings, 16);
  if (nrings == 0) {
    weft_options_t o = weft_options_default();
    if (weft_options_from_env(&o) != WEFT_OK) {
      fprintf(stderr, "bad WEFT_* option: %s\n", weft_last_error());
      return 2;
    }
    rings[nrings++] = o.event_ring;
  }
  e = getenv("WEFT_TEST_POLICY");
  const char *policy = e && *e ? e : "mixed";
  const char *forced = getenv("WEFT_OUTPUT_POLICY");
  e = getenv("WEFT_TEST_TRACE");
  long trace_from = e && *e ? atol(e) : -1;
  e = getenv("WEFT_TEST_STOP");
  int stop = e && atoi(e) != 0;
  e = getenv("WEFT_TEST_KEEP_GOING");
  int keep_going = e && atoi(e) != 0;
  e = getenv("WEFT_TEST_NO_WAITS");
  int no_waits = e && atoi(e) != 0;
  e = getenv("WEFT_SIM_LAZY");
  int lazy = e && atoi(e) != 0;
  if (nseeds == 0 || ops <= 0) {
    fprintf(stderr, "WEFT_TEST_SEEDS / WEFT_TEST_OPS do not parse\n");
    return 2;
  }
  weft_driver_info_t di;
  if (weft_driver_info(&di) != WEFT_OK) {
    fprintf(stderr, "no driver: %s\n", weft_last_error());
    return 2;
  }
  printf("scale: driver %s%s, %zu seeds, %ld ops each, rings", di.path,
         di.is_simulator ? (lazy ? " (lazy simulator)" : " (simulator)") : "", nseeds, ops);
  for (size_t k = 0; k < nrings; k++) printf(" %" PRIu64, rings[k]);
  printf("\n");
  long failed = 0, total_ops = 0, run = 0;
  double total_s = 0;
  uint64_t total_races = 0;
  long total_bad = 0;
  for (size_t k = 0; k < nseeds; k++) {
    scale_cfg_t c = {.seed = seeds[k], .ops = ops, .ring = (unsigned)rings[seeds[k] % nrings], .stop = stop,
                     .trace_from = trace_from, .no_waits = no_waits};
    if (forced && *forced) c.policy = (unsigned)atoi(forced);
    else if (strcmp(policy, "auto") == 0) c.policy = WEFT_OUTPUT_AUTO_FREE;
    else if (strcmp(policy, "error") == 0) c.policy = WEFT_OUTPUT_ERROR;
    else c.policy = seeds[k] % 3 == 0 ? WEFT_OUTPUT_AUTO_FREE : WEFT_OUTPUT_ERROR;
    scale_result_t r;
    int rc = run_isolated(&c, &r, di.is_simulator != 0);
    run++;
    printf("seed %" PRIu64 " ring %u policy %s lazy %d: %s %ld ops in %.2f s (%.0f ops/s), races %" PRIu64
           " (first after op %ld), wrong words %ld (first at op %ld), unexpected statuses %ld; "
           "%ld captures, %ld launches, %ld host reads, %ld syncs, %ld allocs, %ld frees, %ld uses, "
           "%" PRIu64 " waits, %" PRIu64 " ring evictions\n",
           c.seed, c.ring, c.policy == WEFT_OUTPUT_AUTO_FREE ? "auto" : "error", lazy, rc ? "FAILED" : "ok",
           r.ops_done, r.seconds, r.seconds > 0 ? (double)r.ops_done / r.seconds : 0.0, r.races, r.first_race_op,
           r.mismatches, r.first_bad_op, r.errors, r.captures, r.launches, r.host_reads, r.syncs, r.allocs, r.frees,
           r.uses, r.waits_issued, r.ring_evictions);
    if (rc && !no_waits) {
      long first = r.first_race_op;
      if (first < 0 || (r.first_bad_op >= 0 && r.first_bad_op < first)) first = r.first_bad_op;
      if (first < 0 || r.errors) first = r.ops_done - 1;
      printf("  reproduce: WEFT_TEST_SEEDS=%" PRIu64 " WEFT_TEST_RINGS=%u WEFT_TEST_POLICY=%s WEFT_TEST_OPS=%ld%s "
             "(+ WEFT_TEST_STOP=1 WEFT_TEST_TRACE=0 for a trace; tools/scale_shrink.py shrinks it)\n",
             c.seed, c.ring, c.policy == WEFT_OUTPUT_AUTO_FREE ? "auto" : "error", first + 1,
             lazy ? " WEFT_SIM_LAZY=1" : "");
    }
    fflush(stdout);
    total_ops += r.ops_done;
    total_s += r.seconds;
    total_races += r.races;
    total_bad += r.mismatches;
    if (no_waits) {
      /* Positive control: every seed must be caught, by the oracle or by the data. */
      if (r.races == 0 && r.mismatches == 0) {
        printf("positive control: seed %" PRIu64 " was not caught without waits\n", c.seed);
        failed++;
      }
      continue;
    }
    if (rc) {
      failed++;
      if (!keep_going) break;
    }
  }
  printf("scale: %ld seeds run of %zu, %ld failed; %ld ops in %.1f s (%.0f ops/s); races %" PRIu64
         ", wrong words %ld\n",
         run, nseeds, failed, total_ops, total_s, total_s > 0 ? (double)total_ops / total_s : 0.0, total_races,
         total_bad);
  return failed ? 1 : 0;
}
