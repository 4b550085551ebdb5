/* Long random multi-device programs of collectives (simulator: WEFT_SIM_DEVICES=2 to 8,
 * WEFT_NCCL=sim, see BUILD; skipped with one device), checked against a host model after every
 * host read and at the end, and against the simulator's race oracle after every step.
 *
 * Each step is, at random: an all-reduce / broadcast / all-gather / reduce-scatter of every rank
 * (per-rank streams: a pool stream, NULL for the comm stream, or the calling thread's per-thread
 * stream), a grouped send+recv ring shift, a memset or copy on a pool stream, a peer copy between
 * devices, a free + alloc of a block on arbitrary streams (the free on a stream other than the
 * block's last user, the new block first written on a third stream), an all-reduce followed at once by the free of its send or receive block, a host read
 * that checks values, a stream query, weft_runtime_trim, weft_runtime_synchronize, and a weft
 * capture of every rank holding a collective (temporaries allocated and freed inside), then
 * instantiated and replayed several times with new inputs written eagerly before each replay and
 * the outputs checked after each. Programs run from one thread (one weft group per collective)
 * and from a thread per rank.
 *
 * Environment:
 *   WEFT_TEST_SEEDS  seeds: "7", "1-5", "1,3,10-12" (default "1-2")
 *   WEFT_TEST_OPS    steps per program (default 300)
 *   WEFT_TEST_RINGS  event ring sizes, each a runtime life of its own: "4", "2,4,8" (default: the
 *                    WEFT_EVENT_RING of the environment, else 4); a size the options refuse is
 *                    reported and skipped
 *   WEFT_TEST_NO_WAITS=1  positive control: weft issues no waits; every program must then be
 *                    reported racy by the oracle (values are not checked)
 *
 * The minimised regressions of bugs found by the random programs are the test_min_* cases. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/runtime/runtime.h"
#include "sim/weft_sim.h"
#include "weft/weft.h"

#define MAXR 8
#define M 64 /* elements (uint32) of every slot (with 3 ranks, all-gather and reduce-scatter cover 63) */
#define K 6  /* slots per rank */
#define S_POOL 4
#define MAX_SEEDS 256
#define MAX_RINGS 8

static const weft__driver_t *drv;
static const weft_sim_api_t *sim;
static int NR;
static weft_runtime_t *rt[MAXR];
static weft_comm_t *comm[MAXR];
static uint64_t base_bytes;
static unsigned cur_ring;

static uint64_t seeds[MAX_SEEDS];
static int nseeds;
static long n_ops = 300;
static unsigned rings[MAX_RINGS];
static int nrings;
static bool no_waits_control;
static bool verbose;

#define OK(call)                                                                                   \
  do {                                                                                             \
    weft_status_t st_ = (call);                                                                    \
    if (st_ != WEFT_OK) fail_msg("%s: %s: %s", #call, weft_status_name(st_), weft_last_error());  \
  } while (0)

static weft_stream_t *stream(int r, unsigned i) {
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(rt[r], i, &s), WEFT_OK);
  return s;
}

static uint64_t races(void) {
  if (sim == NULL) return 0;
  weft_sim_stats_t st;
  sim->stats(&st);
  return sim->race_count() + st.destroyed_handle_uses;
}

/* ---- environment ---- */

static bool parse_seeds(const char *e) {
  nseeds = 0;
  while (*e) {
    char *end;
    unsigned long long a = strtoull(e, &end, 10), b = a;
    if (end == e) return false;
    e = end;
    if (*e == '-') {
      b = strtoull(e + 1, &end, 10);
      if (end == e + 1 || b < a) return false;
      e = end;
    }
    for (unsigned long long x = a; x <= b && nseeds < MAX_SEEDS; x++) seeds[nseeds++] = x;
    if (*e == ',') e++;
    else if (*e) return false;
  }
  return nseeds > 0;
}

static bool parse_env(void) {
  const char *e = getenv("WEFT_TEST_SEEDS");
  if (!parse_seeds(e && *e ? e : "1-2")) return false;
  e = getenv("WEFT_TEST_OPS");
  if (e && *e) {
    n_ops = atol(e);
    if (n_ops <= 0) return false;
  }
  e = getenv("WEFT_TEST_RINGS");
  if (!(e && *e)) e = getenv("WEFT_EVENT_RING");
  if (!(e && *e)) e = "4";
  nrings = 0;
  while (*e && nrings < MAX_RINGS) {
    char *end;
    unsigned long v = strtoul(e, &end, 10);
    if (end == e) return false;
    rings[nrings++] = (unsigned)v;
    e = end;
    if (*e == ',') e++;
  }
  e = getenv("WEFT_TEST_NO_WAITS");
  no_waits_control = e && *e == '1';
  e = getenv("WEFT_TEST_VERBOSE");
  verbose = e && *e == '1';
  return nrings > 0;
}

/* ---- runtimes: one life per ring size ---- */

/* Gets every runtime with an event ring of `ring` and the communicators. Returns WEFT_OK, or the
 * status of the refused options (the message printed). */
static weft_status_t bring_up(unsigned ring) {
  weft_options_t o = weft_options_default();
  if (weft_options_from_env(&o) != WEFT_OK) fail_msg("weft_options_from_env: %s", weft_last_error());
  o.stream_count = S_POOL;
  o.high_priority_streams = 1;
  o.event_ring = ring;
  weft_status_t st = weft_options_validate(&o);
  if (st != WEFT_OK) {
    print_message("event ring %u refused by the options: %s\n", ring, weft_last_error());
    return st;
  }
  for (int r = 0; r < NR; r++)
    if ((st = weft_runtime_get(r, &o, &rt[r])) != WEFT_OK) fail_msg("weft_runtime_get(%d): %s", r, weft_last_error());
  for (int r = 0; r < NR; r++) {
    weft_options_t got;
    OK(weft_runtime_options(rt[r], &got));
    if (got.event_ring != ring) fail_msg("runtime %d has ring %u, want %u (a runtime left from before)", r, got.event_ring, ring);
  }
  st = weft_comm_init_all(rt, NR, comm);
  if (st != WEFT_OK) fail_msg("weft_comm_init_all: %s", weft_last_error());
  cur_ring = ring;
  /* Send and receive connect at a communicator's first: made eagerly here (weft.h), so that the
   * programs' captures (GLOBAL too) may hold them. */
  weft_block_t w[MAXR];
  for (int r = 0; r < NR; r++) {
    OK(weft_alloc(rt[r], 2 * M * 4, weft_comm_stream(comm[r]), "warm-up", &w[r]));
    OK(weft_memset32(weft_comm_stream(comm[r]), w[r], 0, 0, 2 * M * 4));
  }
  OK(weft_comm_group_begin());
  for (int r = 0; r < NR; r++) {
    OK(weft_send(comm[r], w[r], 0, M, WEFT_UINT32, (r + 1) % NR, NULL));
    OK(weft_recv(comm[r], w[r], M * 4, M, WEFT_UINT32, (r + NR - 1) % NR, NULL));
  }
  OK(weft_comm_group_end());
  for (int r = 0; r < NR; r++) OK(weft_free(w[r], weft_comm_stream(comm[r])));
  if (sim != NULL) {
    for (int r = 0; r < NR; r++) OK(weft_runtime_synchronize(rt[r]));
    weft_sim_stats_t s;
    sim->stats(&s);
    base_bytes = s.bytes_in_use;
    sim->reset_races();
  }
  return WEFT_OK;
}

static void bring_down(void) {
  for (int r = 0; r < NR; r++) {
    OK(weft_comm_destroy(comm[r]));
    comm[r] = NULL;
  }
  for (int r = 0; r < NR; r++) {
    OK(weft_runtime_release(rt[r]));
    rt[r] = NULL;
  }
}

static int setup(void **state) {
  (void)state;
  if (!parse_env()) {
    fprintf(stderr, "WEFT_TEST_SEEDS / WEFT_TEST_OPS / WEFT_TEST_RINGS do not parse\n");
    return -1;
  }
  if (weft__driver_get(&drv) != WEFT_OK) return -1;
  sim = weft_sim_api(weft_driver_symbol);
  int n = 0;
  if (drv->cuDeviceGetCount(&n) != CUDA_SUCCESS) return -1;
  if (n < 2) return 0;
  NR = n < MAXR ? n : MAXR;
  return 0;
}

static int case_setup(void **state) {
  (void)state;
  if (sim != NULL) sim->reset_races();
  return 0;
}

/* Every runtime synchronised and trimmed: weft holds no more device memory than after bring_up. */
static void nothing_left(const char *where) {
  for (int r = 0; r < NR; r++) {
    weft_status_t st = weft_runtime_synchronize(rt[r]);
    if (st != WEFT_OK) fail_msg("%s: weft_runtime_synchronize(%d): %s", where, r, weft_last_error());
    st = weft_runtime_trim(rt[r]);
    if (st != WEFT_OK) fail_msg("%s: weft_runtime_trim(%d): %s", where, r, weft_last_error());
  }
  if (sim == NULL) return;
  weft_sim_stats_t s;
  sim->stats(&s);
  /* Not in the positive control: with weft's waits turned off, 256 bytes of a capture holding a
   * send+recv stay in use since communicators order their operations through a block (comm.c,
   * weft_comm_t.order; seed 1, step 33), which the programs with waits never show. */
  if (s.bytes_in_use > base_bytes && !no_waits_control)
    fail_msg("%s: %llu device bytes left", where, (unsigned long long)(s.bytes_in_use - base_bytes));
  if (!no_waits_control && races() != 0) {
    sim->print_report();
    fail_msg("%s: %llu races or destroyed-handle uses", where, (unsigned long long)races());
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Programs and the host model                                                                 */
/* ------------------------------------------------------------------------------------------ */

enum {
  OP_MEMSET, OP_COPY, OP_PEER, OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_REDSCATTER, OP_SENDRECV,
  OP_REALLOC, OP_COLL_FREE, OP_CHECK, OP_QUERY, OP_TRIM, OP_RSYNC, OP_CAPTURE, OP_KINDS
};
static const char *const op_names[OP_KINDS] = {"memset", "copy", "peer copy", "all-reduce", "broadcast", "all-gather",
                                                "reduce-scatter", "send+recv", "realloc", "all-reduce+free", "check",
                                                "query", "trim", "runtime sync", "capture"};
static const unsigned op_weight[OP_KINDS] = {8, 6, 5, 6, 4, 4, 4, 5, 8, 5, 8, 3, 1, 1, 2};

#define MAX_REPS 3

typedef struct step {
  int kind, r, r2, k, k2;
  int s[MAXR];  /* stream per rank: 0..S_POOL-1, or -1 (NULL: the comm stream) */
  int s2[MAXR]; /* a second stream per rank (receives, frees) */
  int fs[MAXR], as[MAXR], ms[MAXR]; /* free, alloc, first-write streams */
  int ck;       /* capture: the collective kind; coll-free: what is freed (0 send, 1 recv, 2 both) */
  int mode;     /* capture mode; check: the way of reading */
  int reps;     /* capture: replays */
  int on_comm;  /* capture: the collective on the joined comm stream instead of the capture stream */
  size_t bytes; /* realloc: the new block's size */
  uint32_t v;
  uint32_t *want; /* check: M values; capture: [rep][r][M] inputs then [rep][r][M] outputs */
} step_t;

static uint64_t rng_next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

static int pick_kind(uint64_t *x) {
  unsigned total = 0;
  for (int i = 0; i < OP_KINDS; i++) total += op_weight[i];
  unsigned w = (unsigned)(rng_next(x) % total);
  for (int i = 0; i < OP_KINDS; i++) {
    if (w < op_weight[i]) return i;
    w -= op_weight[i];
  }
  return OP_MEMSET;
}

/* The collective `kind` (OP_ALLREDUCE..OP_SENDRECV) of every rank's `in` into `out` (the model of
 * every rank's receive range; reduce-scatter writes C elements only). v: op (all-reduce), root
 * (broadcast), shift (send+recv). */
static void model_collective(int kind, uint32_t v, uint32_t in[MAXR][M], uint32_t out[MAXR][M]) {
  static uint32_t tmp[MAXR][M];
  const size_t C = M / (size_t)NR;
  memcpy(tmp, out, sizeof tmp);
  for (int q = 0; q < NR; q++) {
    switch (kind) {
      case OP_ALLREDUCE:
        for (size_t e = 0; e < M; e++) {
          uint32_t acc = v == WEFT_SUM ? 0 : in[0][e];
          for (int o = 0; o < NR; o++) acc = v == WEFT_SUM ? acc + in[o][e] : (in[o][e] > acc ? in[o][e] : acc);
          tmp[q][e] = acc;
        }
        break;
      case OP_BROADCAST: memcpy(tmp[q], in[v], M * 4); break;
      case OP_ALLGATHER: /* NR * C elements: all of M where NR divides it (3 ranks leave one) */
        for (size_t e = 0; e < C * (size_t)NR; e++) tmp[q][e] = in[e / C][e % C];
        break;
      case OP_REDSCATTER:
        for (size_t e = 0; e < C; e++) {
          uint32_t acc = 0;
          for (int o = 0; o < NR; o++) acc += in[o][(size_t)q * C + e];
          tmp[q][e] = acc;
        }
        break;
      case OP_SENDRECV: memcpy(tmp[q], in[(q - (int)v + NR) % NR], M * 4); break;
      default: break;
    }
  }
  memcpy(out, tmp, sizeof tmp);
}

static int other_slot(int k, uint64_t *x) { return (k + 1 + (int)(rng_next(x) % (K - 1))) % K; }

static uint32_t rep_input(uint32_t v, int rep, int r, size_t e) { return (v * 7 + (uint32_t)rep * 131 + (uint32_t)r * 17 + (uint32_t)e) & 0xffff; }

/* The program of `seed` and the host model's expectations at its checks and at its end. */
static step_t *make_program(uint64_t seed, long steps, uint32_t final[MAXR][K][M]) {
  static uint32_t model[MAXR][K][M], in[MAXR][M], out[MAXR][M];
  memset(model, 0, sizeof model);
  step_t *p = calloc((size_t)steps, sizeof *p);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 12345;
  for (long i = 0; i < steps; i++) {
    step_t *t = &p[i];
    t->kind = pick_kind(&x);
    t->r = (int)(rng_next(&x) % (uint64_t)NR);
    t->r2 = (t->r + 1 + (int)(rng_next(&x) % (uint64_t)(NR - 1))) % NR;
    t->k = (int)(rng_next(&x) % K);
    t->k2 = (int)(rng_next(&x) % K);
    for (int r = 0; r < NR; r++) {
      int s = (int)(rng_next(&x) % (S_POOL + 2));
      t->s[r] = s == S_POOL ? -1 : s == S_POOL + 1 ? -2 : s; /* the communicator's, the per-thread stream */
      t->s2[r] = (int)(rng_next(&x) % S_POOL);
      t->fs[r] = (int)(rng_next(&x) % S_POOL);
      t->as[r] = (int)(rng_next(&x) % S_POOL);
      t->ms[r] = (int)(rng_next(&x) % S_POOL);
    }
    t->mode = (int)(rng_next(&x) % 3);
    t->ck = (int)(rng_next(&x) % 5);
    t->reps = 2 + (int)(rng_next(&x) % (MAX_REPS - 1));
    t->on_comm = (int)(rng_next(&x) % 2);
    static const size_t sizes[3] = {M * 4, M * 8, M * 4 + 128};
    t->bytes = sizes[rng_next(&x) % 3];
    t->v = (uint32_t)(rng_next(&x) % 1000);
    int r = t->r, k = t->k;
    switch (t->kind) {
      case OP_MEMSET:
        for (size_t e = 0; e < M; e++) model[r][k][e] = t->v;
        break;
      case OP_REALLOC:
        for (size_t e = 0; e < M; e++) model[r][k][e] = t->v;
        break;
      case OP_COPY:
        if (t->k2 == k) t->k2 = other_slot(k, &x);
        memcpy(model[r][t->k2], model[r][k], M * 4);
        break;
      case OP_PEER:
        memcpy(model[t->r2][t->k2], model[r][k], M * 4);
        break;
      case OP_ALLREDUCE:
      case OP_BROADCAST:
      case OP_ALLGATHER:
      case OP_REDSCATTER:
      case OP_SENDRECV:
      case OP_COLL_FREE: {
        int kind = t->kind == OP_COLL_FREE ? OP_ALLREDUCE : t->kind;
        if (kind == OP_ALLREDUCE) t->v = t->kind == OP_COLL_FREE ? WEFT_SUM : (t->v % 2 ? WEFT_MAX : WEFT_SUM);
        if (kind == OP_BROADCAST) t->v %= (uint32_t)NR;
        if (kind == OP_SENDRECV) t->v = 1 + t->v % (uint32_t)(NR - 1);
        if ((kind != OP_ALLREDUCE && kind != OP_BROADCAST) || t->kind == OP_COLL_FREE)
          if (t->k2 == k) t->k2 = other_slot(k, &x);
        for (int q = 0; q < NR; q++) memcpy(in[q], model[q][k], M * 4), memcpy(out[q], model[q][t->k2], M * 4);
        model_collective(kind, t->v, in, out);
        for (int q = 0; q < NR; q++) memcpy(model[q][t->k2], out[q], M * 4);
        if (t->kind == OP_COLL_FREE) {
          t->ck %= 3;
          for (int q = 0; q < NR; q++)
            for (size_t e = 0; e < M; e++) {
              uint32_t nv = 5000 + (uint32_t)q * 10 + (uint32_t)(i % 97);
              if (t->ck != 1) model[q][k][e] = nv;
              if (t->ck != 0) model[q][t->k2][e] = nv + 1;
            }
        }
        break;
      }
      case OP_CHECK:
        t->want = malloc(M * 4);
        memcpy(t->want, model[r][k], M * 4);
        break;
      case OP_CAPTURE: {
        /* inputs of each replay go into slot k, the collective's result into slot k2 */
        t->ck = OP_ALLREDUCE + t->ck; /* OP_ALLREDUCE..OP_SENDRECV */
        if (t->ck == OP_ALLREDUCE) t->v = t->v % 2 ? WEFT_MAX : WEFT_SUM;
        if (t->ck == OP_BROADCAST) t->v %= (uint32_t)NR;
        if (t->ck == OP_SENDRECV) t->v = 1 + t->v % (uint32_t)(NR - 1);
        if (t->k2 == k) t->k2 = other_slot(k, &x);
        t->want = malloc((size_t)t->reps * 2 * MAXR * M * 4);
        for (int rep = 0; rep < t->reps; rep++) {
          uint32_t *ins = t->want + (size_t)rep * MAXR * M, *outs = t->want + (size_t)(t->reps + rep) * MAXR * M;
          for (int q = 0; q < NR; q++)
            for (size_t e = 0; e < M; e++) in[q][e] = ins[(size_t)q * M + e] = rep_input(t->v, rep, q, e);
          memset(out, 0, sizeof out); /* the captured temporary is zeroed first */
          model_collective(t->ck, t->v, in, out);
          for (int q = 0; q < NR; q++) memcpy(outs + (size_t)q * M, out[q], M * 4);
          for (int q = 0; q < NR; q++) memcpy(model[q][k], in[q], M * 4), memcpy(model[q][t->k2], out[q], M * 4);
        }
        break;
      }
      default:
        break;
    }
  }
  memcpy(final, model, sizeof model);
  return p;
}

static void free_program(step_t *p, long steps) {
  for (long i = 0; i < steps; i++) free(p[i].want);
  free(p);
}

/* ------------------------------------------------------------------------------------------ */
/* Running a program                                                                            */
/* ------------------------------------------------------------------------------------------ */

typedef struct run {
  const step_t *p;
  long steps;
  weft_block_t (*b)[K]; /* the slots of every rank: each rank's written only by its thread */
  int only;            /* -1: one thread drives every rank; else this thread's rank */
  pthread_barrier_t *bar;
  char *why;           /* this thread's failure (first one) */
  size_t why_n;
  _Atomic int *stop;   /* some thread failed: the others stop at their next step */
} run_t;

/* The calling thread's per-thread stream of each rank's runtime (adopt_per_thread), where it has
 * one: the one-thread programs' thread has every rank's, a rank's thread its own rank's. */
static _Thread_local weft_stream_t *tl_pt[MAXR];

/* Adopts the calling thread's CU_STREAM_PER_THREAD in the runtime of rank r (r < 0: every rank);
 * false, with why, where weft refuses. */
static bool adopt_per_thread(int only, char *why, size_t why_n) {
  for (int r = 0; r < NR; r++) {
    tl_pt[r] = NULL;
    if (only >= 0 && r != only) continue;
    weft_status_t st = weft_stream_adopt(rt[r], CU_STREAM_PER_THREAD, &tl_pt[r]);
    if (st != WEFT_OK) {
      snprintf(why, why_n, "weft_stream_adopt(CU_STREAM_PER_THREAD), rank %d: %s", r, weft_last_error());
      return false;
    }
  }
  return true;
}

/* A step's stream s of rank r: a pool stream (s >= 0), the communicator's (-1: NULL to a
 * collective), or the calling thread's per-thread stream of r (-2; the communicator's where the
 * thread has none). */
static weft_stream_t *pick(int r, int s) {
  if (s == -2 && tl_pt[r] != NULL) return tl_pt[r];
  return s < 0 ? NULL : stream(r, (unsigned)s);
}
static weft_stream_t *pick_nn(int r, int s) {
  weft_stream_t *x = pick(r, s);
  return x != NULL ? x : weft_comm_stream(comm[r]);
}

#define FAILR(...)                                                                                 \
  do {                                                                                             \
    snprintf(ru->why, ru->why_n, __VA_ARGS__);                                                     \
    return false;                                                                                  \
  } while (0)
#define STEP_OK(call)                                                                              \
  do {                                                                                             \
    weft_status_t st_ = (call);                                                                    \
    if (st_ != WEFT_OK)                                                                            \
      FAILR("step %ld (%s) rank %d: %s: %s: %s", i, op_names[t->kind], r, #call, weft_status_name(st_), \
            weft_last_error());                                                                    \
  } while (0)

/* Rank r's call of collective `kind` from slot-like block a to block o. */
static weft_status_t collective_call(int kind, uint32_t v, int r, weft_block_t a, weft_block_t o, weft_stream_t *s,
                                     weft_stream_t *s_recv) {
  const size_t C = M / (size_t)NR;
  switch (kind) {
    case OP_ALLREDUCE: return weft_all_reduce(comm[r], a, 0, o, 0, M, WEFT_UINT32, (weft_redop_t)v, s);
    case OP_BROADCAST: return weft_broadcast(comm[r], a, 0, o, 0, M, WEFT_UINT32, (int)v, s);
    case OP_ALLGATHER: return weft_all_gather(comm[r], a, 0, o, 0, C, WEFT_UINT32, s);
    case OP_REDSCATTER: return weft_reduce_scatter(comm[r], a, 0, o, 0, C, WEFT_UINT32, WEFT_SUM, s);
    default: {
      weft_status_t st = weft_send(comm[r], a, 0, M, WEFT_UINT32, (r + (int)v) % NR, s);
      if (st == WEFT_OK) st = weft_recv(comm[r], o, 0, M, WEFT_UINT32, (r - (int)v + NR) % NR, s_recv);
      return st;
    }
  }
}

static bool ranks_of(const run_t *ru, int r) { return ru->only < 0 || ru->only == r; }

/* Every rank of this run (one, or all) makes its call of a collective; grouped from one thread
 * (always), from a rank's thread for send+recv (needed) or when v is odd. */
static bool do_collective(run_t *ru, long i, const step_t *t, int kind, weft_block_t (*send)[K], int ks,
                          weft_block_t (*recv)[K], int kr) {
  bool group = ru->only < 0 || kind == OP_SENDRECV || (t->v & 1);
  int r = ru->only < 0 ? 0 : ru->only;
  if (group) STEP_OK(weft_comm_group_begin());
  for (r = 0; r < NR; r++) {
    if (!ranks_of(ru, r)) continue;
    weft_status_t st = collective_call(kind, t->v, r, send[r][ks], recv[r][kr], pick(r, t->s[r]),
                                       kind == OP_SENDRECV && (t->v & 2) ? stream(r, (unsigned)t->s2[r]) : pick(r, t->s[r]));
    if (st != WEFT_OK) {
      if (group && weft_comm_group_end() != WEFT_OK) { /* ends the group after the refused call */
      }
      FAILR("step %ld (%s) rank %d: the call: %s: %s", i, op_names[t->kind], r, weft_status_name(st), weft_last_error());
    }
  }
  r = ru->only < 0 ? 0 : ru->only;
  if (group) STEP_OK(weft_comm_group_end());
  return true;
}

static bool realloc_slot(run_t *ru, long i, const step_t *t, int r, int k, size_t bytes, uint32_t value) {
  STEP_OK(weft_free(ru->b[r][k], stream(r, (unsigned)t->fs[r])));
  STEP_OK(weft_alloc(rt[r], bytes, stream(r, (unsigned)t->as[r]), "long", &ru->b[r][k]));
  STEP_OK(weft_memset32(stream(r, (unsigned)t->ms[r]), ru->b[r][k], 0, value, M * 4));
  return true;
}

static bool read_check(run_t *ru, long i, const step_t *t, int r, weft_block_t b, weft_stream_t *s, const uint32_t *want,
                       int way, const char *what) {
  uint32_t got[M];
  if (way == 1) STEP_OK(weft_block_synchronize(b));
  if (way == 2) STEP_OK(weft_runtime_synchronize(rt[r]));
  STEP_OK(weft_copy_from_block(s, got, b, 0, sizeof got));
  STEP_OK(weft_stream_synchronize(s));
  if (no_waits_control) return true;
  for (size_t e = 0; e < M; e++)
    if (got[e] != want[e])
      FAILR("step %ld (%s) rank %d %s element %zu: %u, want %u", i, op_names[t->kind], r, what, e, got[e], want[e]);
  return true;
}

static void barrier(run_t *ru) {
  if (ru->only >= 0) pthread_barrier_wait(ru->bar);
}

/* A capture of every rank of this run (one thread: all; else this thread's rank). */
static bool do_capture(run_t *ru, long i, const step_t *t) {
  static const weft_capture_mode_t modes[3] = {WEFT_CAPTURE_GLOBAL, WEFT_CAPTURE_THREAD_LOCAL, WEFT_CAPTURE_RELAXED};
  int mode = t->mode;
  if (ru->only >= 0 && mode == 0) mode = 2; /* GLOBAL from a thread per rank would refuse the others' calls */
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = modes[mode];
  weft_block_t t1[MAXR], t2[MAXR], tb1[MAXR][K], tb2[MAXR][K];
  weft_graph_t *g[MAXR] = {0};
  weft_exec_t *e[MAXR] = {0};
  const unsigned cs = (unsigned)t->s2[0];
  int r;
  for (r = 0; r < NR; r++) {
    if (!ranks_of(ru, r)) continue;
    weft_stream_t *c = stream(r, cs);
    STEP_OK(weft_capture_begin(c, &o));
    if (t->on_comm && weft_comm_stream(comm[r]) != c) STEP_OK(weft_capture_join(c, weft_comm_stream(comm[r])));
    STEP_OK(weft_alloc(rt[r], M * 4, c, "captured send", &t1[r]));
    STEP_OK(weft_alloc(rt[r], M * 4, c, "captured recv", &t2[r]));
    STEP_OK(weft_copy_block(c, t1[r], 0, ru->b[r][t->k], 0, M * 4));
    STEP_OK(weft_memset32(c, t2[r], 0, 0, M * 4));
    tb1[r][0] = t1[r];
    tb2[r][0] = t2[r];
  }
  /* The collective: on the capture stream, or on the comm stream joined into the capture. */
  step_t tc = *t;
  for (r = 0; r < NR; r++) {
    tc.s[r] = t->on_comm ? -1 : (int)cs;
    tc.s2[r] = (int)cs;
  }
  if (verbose) fprintf(stderr, "[thread %d] step %ld: capture begun\n", ru->only, i);
  if (!do_collective(ru, i, &tc, t->ck, tb1, 0, tb2, 0)) return false;
  if (verbose) fprintf(stderr, "[thread %d] step %ld: collective captured\n", ru->only, i);
  for (r = 0; r < NR; r++) {
    if (!ranks_of(ru, r)) continue;
    weft_stream_t *c = stream(r, cs);
    STEP_OK(weft_copy_block(c, ru->b[r][t->k2], 0, t2[r], 0, M * 4));
    STEP_OK(weft_free(t1[r], t->on_comm ? weft_comm_stream(comm[r]) : c));
    STEP_OK(weft_free(t2[r], c));
    STEP_OK(weft_capture_end(c, &g[r]));
  }
  if (verbose) fprintf(stderr, "[thread %d] step %ld: captured\n", ru->only, i);
  for (r = 0; r < NR; r++) {
    if (!ranks_of(ru, r)) continue;
    STEP_OK(weft_graph_instantiate(g[r], stream(r, (unsigned)t->fs[r]), &e[r]));
  }
  if (verbose) fprintf(stderr, "[thread %d] step %ld: instantiated\n", ru->only, i);
  for (int rep = 0; rep < t->reps; rep++) {
    const uint32_t *ins = t->want + (size_t)rep * MAXR * M, *outs = t->want + (size_t)(t->reps + rep) * MAXR * M;
    for (r = 0; r < NR; r++) {
      if (!ranks_of(ru, r)) continue;
      unsigned ws = (unsigned)(t->ms[r] + rep) % S_POOL;
      STEP_OK(weft_copy_to_block(stream(r, ws), ru->b[r][t->k], 0, ins + (size_t)r * M, M * 4));
      /* the output slot overwritten eagerly on another stream between replays */
      if (rep > 0) STEP_OK(weft_memset32(stream(r, (unsigned)(t->as[r] + rep) % S_POOL), ru->b[r][t->k2], 0, 0xdead, M * 4));
    }
    if (verbose) fprintf(stderr, "[thread %d] step %ld replay %d: inputs posted\n", ru->only, i, rep);
    for (r = 0; r < NR; r++) {
      if (!ranks_of(ru, r)) continue;
      STEP_OK(weft_exec_launch(e[r], stream(r, (unsigned)(t->fs[r] + rep) % S_POOL)));
    }
    if (verbose) fprintf(stderr, "[thread %d] step %ld replay %d: launched\n", ru->only, i, rep);
    for (r = 0; r < NR; r++) {
      if (!ranks_of(ru, r)) continue;
      char what[48];
      snprintf(what, sizeof what, "replay %d of slot %d", rep, t->k2);
      if (!read_check(ru, i, t, r, ru->b[r][t->k2], stream(r, (unsigned)(t->s2[r] + rep + 1) % S_POOL), outs + (size_t)r * M,
                      rep % 3, what))
        return false;
    }
  }
  for (r = 0; r < NR; r++) {
    if (!ranks_of(ru, r)) continue;
    STEP_OK(weft_exec_destroy(e[r]));
    STEP_OK(weft_graph_destroy(g[r]));
  }
  return true;
}

static bool run_step(run_t *ru, long i) {
  const step_t *t = &ru->p[i];
  int r = t->r;
  if (verbose)
    fprintf(stderr, "[thread %d] step %ld %s r%d r2 %d k%d k2 %d s[%d %d] s2[%d %d] fs[%d %d] as[%d %d] ms[%d %d] ck %d mode %d reps %d on_comm %d v %u bytes %zu\n",
            ru->only, i, op_names[t->kind], t->r, t->r2, t->k, t->k2, t->s[0], t->s[1], t->s2[0], t->s2[1], t->fs[0], t->fs[1],
            t->as[0], t->as[1], t->ms[0], t->ms[1], t->ck, t->mode, t->reps, t->on_comm, t->v, t->bytes);
  switch (t->kind) {
    case OP_MEMSET:
      if (ranks_of(ru, r)) STEP_OK(weft_memset32(pick_nn(r, t->s[r]), ru->b[r][t->k], 0, t->v, M * 4));
      return true;
    case OP_COPY:
      if (ranks_of(ru, r)) STEP_OK(weft_copy_block(pick_nn(r, t->s[r]), ru->b[r][t->k2], 0, ru->b[r][t->k], 0, M * 4));
      return true;
    case OP_PEER: {
      /* from a thread per rank, both ranks' threads meet before and after (host order of the calls) */
      barrier(ru);
      bool ok = true;
      if (ranks_of(ru, r)) {
        int sr = t->v % 2 ? t->r2 : r; /* the copy's stream: of the source's or of the destination's runtime */
        weft_status_t st = weft_copy_block(pick_nn(sr, t->s[sr]), ru->b[t->r2][t->k2], 0, ru->b[r][t->k], 0, M * 4);
        if (st != WEFT_OK) {
          snprintf(ru->why, ru->why_n, "step %ld (peer copy %d->%d on a stream of %d): %s: %s", i, r, t->r2, sr,
                   weft_status_name(st), weft_last_error());
          ok = false;
        }
      }
      barrier(ru);
      return ok;
    }
    case OP_ALLREDUCE:
    case OP_BROADCAST:
    case OP_ALLGATHER:
    case OP_REDSCATTER:
    case OP_SENDRECV:
      return do_collective(ru, i, t, t->kind, ru->b, t->k, ru->b, t->k2);
    case OP_COLL_FREE: {
      if (!do_collective(ru, i, t, OP_ALLREDUCE, ru->b, t->k, ru->b, t->k2)) return false;
      for (int q = 0; q < NR; q++) {
        if (!ranks_of(ru, q)) continue;
        uint32_t nv = 5000 + (uint32_t)q * 10 + (uint32_t)(i % 97);
        if (t->ck != 1 && !realloc_slot(ru, i, t, q, t->k, M * 4, nv)) return false;
        if (t->ck != 0 && !realloc_slot(ru, i, t, q, t->k2, M * 4, nv + 1)) return false;
      }
      return true;
    }
    case OP_REALLOC:
      if (ranks_of(ru, r) && !realloc_slot(ru, i, t, r, t->k, t->bytes, t->v)) return false;
      return true;
    case OP_CHECK:
      if (ranks_of(ru, r)) {
        char what[32];
        snprintf(what, sizeof what, "slot %d", t->k);
        return read_check(ru, i, t, r, ru->b[r][t->k], pick_nn(r, t->s[r]), t->want, t->mode, what);
      }
      return true;
    case OP_QUERY:
      if (ranks_of(ru, r)) {
        weft_status_t q = weft_stream_query(pick_nn(r, t->s[r]));
        if (q != WEFT_OK && q != WEFT_ERR_NOT_READY) STEP_OK(q);
      }
      return true;
    case OP_TRIM:
      if (ranks_of(ru, r)) STEP_OK(weft_runtime_trim(rt[r]));
      return true;
    case OP_RSYNC:
      if (ranks_of(ru, r)) STEP_OK(weft_runtime_synchronize(rt[r]));
      return true;
    case OP_CAPTURE:
      return do_capture(ru, i, t);
    default:
      return true;
  }
}

static void blocks_new(weft_block_t b[MAXR][K]) {
  for (int r = 0; r < NR; r++)
    for (int k = 0; k < K; k++) {
      if (weft_alloc(rt[r], M * 4, stream(r, (unsigned)k % S_POOL), "long", &b[r][k]) != WEFT_OK)
        fail_msg("weft_alloc: %s", weft_last_error());
      OK(weft_memset32(stream(r, (unsigned)k % S_POOL), b[r][k], 0, 0, M * 4));
    }
}

static void blocks_check_and_free(weft_block_t b[MAXR][K], uint32_t final[MAXR][K][M], const char *what) {
  for (int r = 0; r < NR; r++)
    for (int k = 0; k < K; k++) {
      uint32_t got[M];
      weft_stream_t *s = stream(r, (unsigned)(k + 1) % S_POOL);
      OK(weft_copy_from_block(s, got, b[r][k], 0, sizeof got));
      OK(weft_stream_synchronize(s));
      if (!no_waits_control)
        for (size_t e = 0; e < M; e++)
          if (got[e] != final[r][k][e])
            fail_msg("%s: at the end rank %d slot %d element %zu: %u, want %u", what, r, k, e, got[e], final[r][k][e]);
      OK(weft_free(b[r][k], stream(r, (unsigned)(k + r) % S_POOL)));
    }
}

typedef struct rank_arg {
  run_t ru;
  char why[384];
} rank_arg_t;

static void *rank_thread(void *arg) {
  rank_arg_t *a = arg;
  run_t *ru = &a->ru;
  if (!adopt_per_thread(ru->only, ru->why, ru->why_n)) atomic_store(ru->stop, 1);
  for (long i = 0; i < ru->steps; i++) {
    if (atomic_load(ru->stop)) {
      /* keep meeting the others at peer copies so that none waits forever */
      if (ru->p[i].kind == OP_PEER) barrier(ru), barrier(ru);
      continue;
    }
    if (!run_step(ru, i)) atomic_store(ru->stop, 1);
  }
  return NULL;
}

static uint64_t ring_evictions(void) {
  uint64_t n = 0;
  for (int r = 0; r < NR; r++) {
    weft_counters_t c;
    OK(weft_runtime_counters(rt[r], &c));
    n += c.ring_evictions;
  }
  return n;
}

/* One program of `seed`; threads: a thread per rank. Returns the races the oracle saw. */
static uint64_t run_program(uint64_t seed, long steps, bool threads) {
  static uint32_t final[MAXR][K][M];
  char what[96];
  snprintf(what, sizeof what, "%s, ring %u, seed %llu, %ld steps", threads ? "thread per rank" : "one thread", cur_ring,
           (unsigned long long)seed, steps);
  if (sim != NULL) sim->seed(seed);
  step_t *p = make_program(seed, steps, final);
  static run_t ru;
  static weft_block_t slots[MAXR][K];
  memset(&ru, 0, sizeof ru);
  ru.p = p;
  ru.steps = steps;
  ru.b = slots;
  blocks_new(slots);
  if (no_waits_control) {
    for (int r = 0; r < NR; r++) OK(weft_runtime_synchronize(rt[r]));
    for (int r = 0; r < NR; r++) rt[r]->tracker.no_waits = true;
  }
  uint64_t ev0 = ring_evictions();
  uint64_t seen = 0;
  if (!threads) {
    char why[384] = "";
    ru.only = -1;
    ru.why = why;
    ru.why_n = sizeof why;
    if (!adopt_per_thread(-1, why, sizeof why)) fail_msg("%s: %s", what, why);
    for (long i = 0; i < steps; i++) {
      if (!run_step(&ru, i)) {
        if (races() != 0) sim->print_report();
        fail_msg("%s: %s", what, why);
      }
      if (!no_waits_control && races() != 0) {
        sim->print_report();
        fail_msg("%s: races after step %ld (%s)", what, i, op_names[p[i].kind]);
      }
    }
  } else {
    static rank_arg_t a[MAXR];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)NR);
    _Atomic int stop = 0;
    pthread_t th[MAXR];
    for (int r = 0; r < NR; r++) {
      memset(&a[r], 0, sizeof a[r]);
      a[r].ru.p = p;
      a[r].ru.steps = steps;
      a[r].ru.only = r;
      a[r].ru.bar = &bar;
      a[r].ru.why = a[r].why;
      a[r].ru.why_n = sizeof a[r].why;
      a[r].ru.stop = &stop;
      a[r].ru.b = slots; /* peer copies read another rank's handle between two barriers */
    }
    for (int r = 0; r < NR; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_thread, &a[r]), 0);
    for (int r = 0; r < NR; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    pthread_barrier_destroy(&bar);
    for (int r = 0; r < NR; r++)
      if (a[r].why[0] != '\0') print_message("thread of rank %d: %s\n", r, a[r].why);
    for (int r = 0; r < NR; r++)
      if (a[r].why[0] != '\0') {
        if (races() != 0) sim->print_report();
        fail_msg("%s: %s", what, a[r].why);
      }
    if (!no_waits_control && races() != 0) {
      sim->print_report();
      fail_msg("%s: races", what);
    }
  }
  if (no_waits_control) {
    for (int r = 0; r < NR; r++) OK(weft_runtime_synchronize(rt[r]));
    for (int r = 0; r < NR; r++) rt[r]->tracker.no_waits = false;
    seen = sim != NULL ? sim->race_count() : 0;
  }
  blocks_check_and_free(ru.b, final, what);
  free_program(p, steps);
  if (no_waits_control && sim != NULL) sim->reset_races();
  nothing_left(what);
  print_message("%s: %llu ring evictions%s\n", what, (unsigned long long)(ring_evictions() - ev0),
                no_waits_control ? "" : ", no race");
  return seen;
}

/* Runs fn for every ring size (a runtime life each) and every seed. */
static void for_rings_and_seeds(bool threads) {
  if (NR == 0) skip();
  if (no_waits_control && sim == NULL) skip();
  /* Without waits a thread per rank may also hang, not only race: a rank's eager collective and
   * its replayed graph's, on two streams no wait orders, reach NCCL in either order on each rank
   * (seen as CUDA_ERROR_LAUNCH_TIMEOUT). The one-thread form is the control. */
  if (no_waits_control && threads) skip();
  int ran = 0;
  for (int q = 0; q < nrings; q++) {
    if (bring_up(rings[q]) != WEFT_OK) continue;
    for (int s = 0; s < nseeds; s++) {
      uint64_t seen = run_program(seeds[s], n_ops, threads);
      if (no_waits_control) {
        print_message("without waits, seed %llu: %llu races\n", (unsigned long long)seeds[s], (unsigned long long)seen);
        if (seen == 0) fail_msg("positive control: seed %llu ran with no waits and the oracle saw no race", (unsigned long long)seeds[s]);
      }
    }
    bring_down();
    ran++;
  }
  if (ran == 0) skip();
}

static void test_random_programs_one_thread(void **state) {
  (void)state;
  for_rings_and_seeds(false);
}

static void test_random_programs_thread_per_rank(void **state) {
  (void)state;
  for_rings_and_seeds(true);
}

/* Reproduction of the hang found by the thread-per-rank programs (report: "a wait on an evicted
 * or late tick of another rank's stream deadlocks collectives"): seed 3, 35 steps, ring 4, a
 * thread per rank; rank 1's check at step 34 times out (CUDA_ERROR_LAUNCH_TIMEOUT) in about two
 * runs of three (it depends on how far rank 0's thread ran ahead), never with a ring of 4096.
 * The cause: a later event stood in for rank 0's point (evicted, or joined by later uses) and
 * covered rank 0's all-reduces, which waited for rank 1's, posted behind that wait. Fixed by
 * exact waits (streams/tracker.h weft__tracker_exact); tests/comm/test_comm_exact_waits.c is the
 * deterministic form. */
static void test_repro_thread_per_rank_ring4_seed3_hang(void **state) {
  (void)state;
  if (NR != 2 || no_waits_control) skip();
  if (bring_up(4) != WEFT_OK) skip();
  for (int i = 0; i < 5; i++) (void)run_program(3, 35, true);
  bring_down();
}

/* Reproduction found by a longer class hunt (seeds 9500-9620, 600 steps, ring 4): seed 9500, one
 * thread driving both ranks, step 69 begins rank 1's capture while rank 0's GLOBAL capture (this
 * thread's) is open. Rank 1's comm stream keeps exact waits, and before its record weft asked
 * whether a ring slot's event had completed (cuEventQuery) without relaxing the thread's capture
 * mode: the driver refuses that in a GLOBAL capture (STREAM_CAPTURE_UNSUPPORTED; on a GPU it also
 * invalidates the capture, CUDA_SEMANTICS.md) and weft_capture_begin failed with CAPTURE. */
static void test_repro_one_thread_ring4_seed9500_global_capture(void **state) {
  (void)state;
  if (NR != 2 || no_waits_control) skip();
  if (bring_up(4) != WEFT_OK) skip();
  (void)run_program(9500, 80, false);
  bring_down();
}

/* ---- minimal cases: a thread per rank, each running one function ---- */

typedef struct min_arg {
  int r;
  pthread_barrier_t *bar;
  char why[256];
} min_arg_t;

/* In a min_* thread (a min_arg_t *a in scope): on failure, says where in a->why and returns. */
#define MIN_OK(call)                                                                               \
  do {                                                                                             \
    weft_status_t st_ = (call);                                                                    \
    if (st_ != WEFT_OK) {                                                                          \
      snprintf(a->why, sizeof a->why, "rank %d, line %d: %s: %s: %s", a->r, __LINE__, #call,        \
               weft_status_name(st_), weft_last_error());                                          \
      return NULL;                                                                                 \
    }                                                                                              \
  } while (0)

/* Runs fn on a thread per rank of fresh communicators (ring 4) and fails with the first rank's
 * failure; nothing may be left. */
static void run_min_threads(void *(*fn)(void *), const char *what) {
  if (NR == 0 || no_waits_control) skip();
  if (bring_up(4) != WEFT_OK) skip();
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)NR);
  static min_arg_t a[MAXR];
  pthread_t th[MAXR];
  for (int r = 0; r < NR; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].r = r;
    a[r].bar = &bar;
    assert_int_equal(pthread_create(&th[r], NULL, fn, &a[r]), 0);
  }
  for (int r = 0; r < NR; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
  pthread_barrier_destroy(&bar);
  for (int r = 0; r < NR; r++)
    if (a[r].why[0] != '\0') fail_msg("%s: %s", what, a[r].why);
  nothing_left(what);
  bring_down();
}

/* Rank r's graph calls (the gate's exclusive side): an allocation inside a capture, instantiate,
 * launch, destroy. */
static weft_status_t graph_calls(int r) {
  weft_stream_t *c = stream(r, 0);
  weft_capture_options_t o = weft_capture_options_default();
  o.mode = WEFT_CAPTURE_THREAD_LOCAL;
  weft_block_t tmp;
  weft_graph_t *g;
  weft_exec_t *e;
  weft_status_t st = weft_capture_begin(c, &o);
  if (st != WEFT_OK) return st;
  if ((st = weft_alloc(rt[r], M * 4, c, "tmp", &tmp)) == WEFT_OK) {
    st = weft_memset32(c, tmp, 0, 5, M * 4);
    weft_status_t f = weft_free(tmp, c);
    if (st == WEFT_OK) st = f;
  }
  weft_status_t end = weft_capture_end(c, &g);
  if (st != WEFT_OK) {
    if (end == WEFT_OK && weft_graph_destroy(g) != WEFT_OK) { /* (the first failure is reported) */
    }
    return st;
  }
  if ((st = end) != WEFT_OK) return st;
  if ((st = weft_graph_instantiate(g, c, &e)) == WEFT_OK) {
    st = weft_exec_launch(e, c);
    weft_status_t x = weft_exec_destroy(e);
    if (st == WEFT_OK) st = x;
  }
  weft_status_t y = weft_graph_destroy(g);
  return st == WEFT_OK ? y : st;
}

/* Each rank captures its grouped send+recv (to itself, v 0, and to the next rank, v 1; on the
 * capture stream and on the communicator's stream joined into the capture) and replays it three
 * times, the output checked after each: the step the GPU hung at (seed 1, ring 4, step 68),
 * alone. The copy back is to pageable memory, which waited for the graph inside weft's gate. */
static void *min_sendrecv_thread(void *arg) {
  min_arg_t *a = arg;
  const int r = a->r;
  for (unsigned v = 0; v < 2; v++)
    for (int on_comm = 0; on_comm < 2; on_comm++) {
      pthread_barrier_wait(a->bar);
      weft_stream_t *c = stream(r, 0), *cs = weft_comm_stream(comm[r]);
      weft_capture_options_t o = weft_capture_options_default();
      o.mode = WEFT_CAPTURE_THREAD_LOCAL;
      weft_block_t t1, t2, out;
      MIN_OK(weft_alloc(rt[r], M * 4, stream(r, 1), "out", &out));
      MIN_OK(weft_memset32(stream(r, 1), out, 0, 0, M * 4));
      weft_graph_t *g;
      weft_exec_t *e;
      MIN_OK(weft_capture_begin(c, &o));
      if (on_comm) MIN_OK(weft_capture_join(c, cs));
      MIN_OK(weft_alloc(rt[r], M * 4, c, "send", &t1));
      MIN_OK(weft_alloc(rt[r], M * 4, c, "recv", &t2));
      MIN_OK(weft_memset32(c, t1, 0, 100u * (unsigned)r + v, M * 4));
      MIN_OK(weft_comm_group_begin());
      MIN_OK(weft_send(comm[r], t1, 0, M, WEFT_UINT32, (r + (int)v) % NR, on_comm ? NULL : c));
      MIN_OK(weft_recv(comm[r], t2, 0, M, WEFT_UINT32, (r - (int)v + NR) % NR, on_comm ? NULL : c));
      MIN_OK(weft_comm_group_end());
      MIN_OK(weft_copy_block(c, out, 0, t2, 0, M * 4));
      MIN_OK(weft_free(t1, on_comm ? cs : c));
      MIN_OK(weft_free(t2, c));
      MIN_OK(weft_capture_end(c, &g));
      MIN_OK(weft_graph_instantiate(g, stream(r, 2), &e));
      for (int rep = 0; rep < 3; rep++) {
        MIN_OK(weft_memset32(stream(r, 3), out, 0, 0xdead, M * 4));
        MIN_OK(weft_exec_launch(e, stream(r, (unsigned)(2 + rep) % S_POOL)));
        uint32_t got[M];
        MIN_OK(weft_copy_from_block(stream(r, 1), got, out, 0, sizeof got));
        MIN_OK(weft_stream_synchronize(stream(r, 1)));
        const uint32_t want = 100u * (unsigned)((r - (int)v + NR) % NR) + v;
        if (got[0] != want || got[M - 1] != want) {
          snprintf(a->why, sizeof a->why, "rank %d v %u on_comm %d replay %d: %u, want %u", r, v, on_comm, rep, got[0], want);
          return NULL;
        }
      }
      MIN_OK(weft_exec_destroy(e));
      MIN_OK(weft_graph_destroy(g));
      MIN_OK(weft_free(out, stream(r, 1)));
      if (verbose) fprintf(stderr, "[rank %d] v %u on_comm %d: 3 replays checked\n", r, v, on_comm);
    }
  return NULL;
}

static void test_min_captured_sendrecv_thread_per_rank(void **state) {
  (void)state;
  run_min_threads(min_sendrecv_thread, "captured send+recv, a thread per rank");
}

/* Ranks 1.. make graph calls 300 ms after the barrier and then post their all-reduce; rank 0
 * posts its all-reduce at once. The premise, checked: rank 0 had begun its all-reduce when a rank began its graph calls (else
 * `beside_missed` is set and the case reports a skip). */
static atomic_int rank0_began, beside_missed;

/* Rank r's blocks x (r + 1 in every element: an all-reduce's input and output) and y, on its
 * communicator's stream, written before the call returns. */
static weft_status_t xy_ready(int r, weft_block_t *x, weft_block_t *y) {
  weft_stream_t *cs = weft_comm_stream(comm[r]);
  weft_status_t st = weft_alloc(rt[r], M * 4, cs, "x", x);
  if (st != WEFT_OK) return st;
  if ((st = weft_alloc(rt[r], M * 4, cs, "y", y)) != WEFT_OK) return st;
  if ((st = weft_memset32(cs, *x, 0, (unsigned)r + 1, M * 4)) != WEFT_OK) return st;
  return weft_stream_synchronize(cs);
}

/* Checks rank a->r's x (the sum over the ranks) and, where y_want >= 0, its y (y_want in every
 * element), saying what differs in a->why; frees both. */
static weft_status_t xy_check(min_arg_t *a, weft_block_t x, weft_block_t y, long y_want) {
  const int r = a->r;
  uint32_t got[M];
  weft_status_t st = weft_copy_from_block(stream(r, 2), got, x, 0, sizeof got);
  if (st != WEFT_OK) return st;
  const uint32_t want = (uint32_t)(NR * (NR + 1) / 2);
  if (got[0] != want || got[M - 1] != want) snprintf(a->why, sizeof a->why, "rank %d: %u, want %u", r, got[0], want);
  if (y_want >= 0) {
    if ((st = weft_copy_from_block(stream(r, 2), got, y, 0, sizeof got)) != WEFT_OK) return st;
    if (got[0] != (uint32_t)y_want || got[M - 1] != (uint32_t)y_want)
      snprintf(a->why, sizeof a->why, "rank %d: y %u, want %ld", r, got[M - 1], y_want);
  }
  if ((st = weft_free(x, stream(r, 2))) != WEFT_OK) return st;
  if ((st = weft_free(y, stream(r, 2))) != WEFT_OK) return st;
  if (verbose) fprintf(stderr, "[rank %d] all-reduce checked\n", r);
  return WEFT_OK;
}

static void *all_reduce_beside_graph_calls(min_arg_t *a) {
  const int r = a->r;
  weft_block_t x, y;
  weft_stream_t *cs = weft_comm_stream(comm[r]);
  MIN_OK(xy_ready(r, &x, &y));
  pthread_barrier_wait(a->bar);
  if (r != 0) {
    struct timespec t = {0, 300 * 1000000L}; /* rank 0 is in its all-reduce (or its queue) by then */
    nanosleep(&t, NULL);
    if (!atomic_load(&rank0_began)) atomic_store(&beside_missed, 1);
    MIN_OK(graph_calls(r));
    if (verbose) fprintf(stderr, "[rank %d] graph calls done\n", r);
  }
  if (r == 0) atomic_store(&rank0_began, 1);
  MIN_OK(weft_all_reduce(comm[r], x, 0, x, 0, M, WEFT_UINT32, WEFT_SUM, cs));
  MIN_OK(xy_check(a, x, y, -1));
  return NULL;
}

/* Fresh communicators: rank 0's first all-reduce (NCCL connects the ranks inside its group end,
 * which waits for the other ranks to connect too) meets the other ranks' graph calls. */
static void *min_first_thread(void *arg) { return all_reduce_beside_graph_calls(arg); }

/* run_min_threads(fn) over all_reduce_beside_graph_calls, its premise checked. */
static void run_beside_graph_calls(void *(*fn)(void *), const char *what) {
  atomic_store(&rank0_began, 0);
  atomic_store(&beside_missed, 0);
  run_min_threads(fn, what);
  if (atomic_load(&beside_missed)) {
    print_message("premise: rank 0 had not begun its all-reduce when the graph calls began\n");
    skip();
  }
}

static void test_min_first_collective_meets_graph_calls(void **state) {
  (void)state;
  run_beside_graph_calls(min_first_thread, "first all-reduce beside graph calls, a thread per rank");
}

/* Rank 0 posts its all-reduce, then WEFT_TEST_QUEUE_OPS memsets (default 2,000) behind it on the
 * communicator's stream. Its all-reduce cannot finish before the other ranks post theirs, so its
 * queue fills (a GPU's takes about 1,021 operations a stream, tools/probes/probe_queue_depth; the
 * simulator's WEFT_SIM_QUEUE_DEPTH, 1,024; a memset is two, with its event record) and its next
 * enqueue waits inside the driver. The other ranks wait until rank 0 has been inside one memset
 * call for 20 ms, make graph calls (the exclusive side of their
 * device's gate) and post their all-reduce; the results are checked. With a process-wide gate this
 * deadlocked on 2 x H200 (lib/core/gate.h). The premise, checked by rank 1: rank 0 was inside one
 * memset call from before rank 1's graph calls began until after they ended (its queue was full);
 * else the case reports a skip. */
static atomic_long q_started, q_returned; /* rank 0's memset calls */
static atomic_int q_rank0_done, q_premise;
/* Rank 0's all-reduce and memsets on its thread's per-thread stream rather than the
 * communicator's (test_min_full_per_thread_queue_behind_an_all_reduce). */
static bool q_per_thread;

static void *min_full_queue_thread(void *arg) {
  min_arg_t *a = arg;
  const int r = a->r;
  const char *e = getenv("WEFT_TEST_QUEUE_OPS");
  const long ops = e && *e ? atol(e) : 2000;
  weft_block_t x, y;
  weft_stream_t *cs = weft_comm_stream(comm[r]);
  MIN_OK(xy_ready(r, &x, &y));
  if (r == 0 && q_per_thread) {
    if (!adopt_per_thread(0, a->why, sizeof a->why)) return NULL;
    cs = tl_pt[0];
    if (verbose) fprintf(stderr, "[rank 0] adopted its per-thread stream (%d)\n", weft_stream_index(cs));
  }
  pthread_barrier_wait(a->bar);
  if (r == 0) {
    weft_status_t st = weft_all_reduce(comm[r], x, 0, x, 0, M, WEFT_UINT32, WEFT_SUM, cs);
    if (verbose) fprintf(stderr, "[rank 0] all-reduce posted: %s\n", weft_status_name(st));
    for (long i = 0; st == WEFT_OK && i < ops; i++) {
      if (verbose && i % 256 == 0) fprintf(stderr, "[rank 0] memset %ld\n", i);
      atomic_fetch_add(&q_started, 1);
      st = weft_memset32(cs, y, 0, (unsigned)i, M * 4);
      atomic_fetch_add(&q_returned, 1);
    }
    atomic_store(&q_rank0_done, 1);
    MIN_OK(st); /* the all-reduce, or the memset of memset number q_returned */
  } else {
    /* Until rank 0 has been inside one memset call for 20 ms (an enqueue with room takes
     * microseconds), or has ended. */
    long seen = -1;
    struct timespec since = {0, 0}, now;
    while (!atomic_load(&q_rank0_done)) {
      long st0 = atomic_load(&q_started), rt0 = atomic_load(&q_returned);
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (st0 != rt0 + 1 || st0 != seen) {
        seen = st0 == rt0 + 1 ? st0 : -1;
        since = now;
      } else if ((now.tv_sec - since.tv_sec) * 1000000000L + (now.tv_nsec - since.tv_nsec) >= 20000000L) {
        break;
      }
      sched_yield();
    }
    long s0 = atomic_load(&q_started), r0 = atomic_load(&q_returned);
    if (verbose) fprintf(stderr, "[rank %d] graph calls begin; rank 0 memsets %ld/%ld\n", r, r0, s0);
    MIN_OK(graph_calls(r));
    long s1 = atomic_load(&q_started), r1 = atomic_load(&q_returned);
    if (verbose) fprintf(stderr, "[rank %d] graph calls done; rank 0 memsets %ld/%ld -> %ld/%ld\n", r, r0, s0, r1, s1);
    if (r == 1 && s0 == r0 + 1 && s1 == s0 && r1 == r0) atomic_store(&q_premise, 1);
    MIN_OK(weft_all_reduce(comm[r], x, 0, x, 0, M, WEFT_UINT32, WEFT_SUM, cs));
  }
  MIN_OK(xy_check(a, x, y, r == 0 ? ops - 1 : -1));
  return NULL;
}

/* min_full_queue_thread's case, rank 0's work on its per-thread stream or the communicator's.
 * Returns its premise (rank 1 saw rank 0 held inside one enqueue); the caller skips without it. */
static bool run_full_queue(bool per_thread, const char *what) {
  q_per_thread = per_thread;
  atomic_store(&q_started, 0);
  atomic_store(&q_returned, 0);
  atomic_store(&q_rank0_done, 0);
  atomic_store(&q_premise, 0);
  /* A hang (a thread held inside an enqueue while others wait for it: the deadlock these cases
   * are about, or on 2 x H200 the per-thread case after the comm-stream one, not understood yet)
   * fails the binary at the alarm instead of holding the suite (a case takes under 2 s on a GPU,
   * 10 s on the simulator where its queue waits time out). */
  alarm(120);
  run_min_threads(min_full_queue_thread, what);
  alarm(0);
  q_per_thread = false;
  if (atomic_load(&q_premise)) return true;
  print_message("premise: rank 0 was not held inside one enqueue across rank 1's graph calls (its queue never filled)\n");
  return false;
}

static void test_min_full_queue_behind_an_all_reduce_meets_graph_calls(void **state) {
  (void)state;
  if (!run_full_queue(false, "a full queue behind an all-reduce beside graph calls, a thread per rank")) skip();
}

/* The same with rank 0's all-reduce and memsets on its thread's per-thread stream (found by the
 * random programs on 3 simulated devices, queues of 8, seed 624: a per-thread stream's use ran its
 * work under the process-wide tracker lock, so rank 0's memset, waiting for room behind its
 * all-reduce, held the lock the other ranks needed to post theirs: a deadlock the simulator broke
 * after 10 s with LAUNCH_TIMEOUT). */
static void test_min_full_per_thread_queue_behind_an_all_reduce(void **state) {
  (void)state;
  if (!run_full_queue(true, "a full per-thread queue behind an all-reduce, a thread per rank")) skip();
}

/* The same on the communicator's stream with device timestamps in the trace (WEFT_TRACE_DEVICE=1):
 * such a use ran its work under the tracker lock too (a span recorded around it), so the full
 * queue deadlocked the same way. */
static void test_min_full_queue_behind_an_all_reduce_traced(void **state) {
  (void)state;
  if (NR == 0 || no_waits_control) skip();
  char path[512];
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/full_queue_trace.json", dir != NULL ? dir : "/tmp");
  setenv("WEFT_TRACE_DEVICE", "1", 1);
  weft_status_t st = weft_trace_start(path);
  unsetenv("WEFT_TRACE_DEVICE");
  assert_int_equal(st, WEFT_OK);
  bool premise = run_full_queue(false, "a full queue behind an all-reduce, device timestamps traced");
  assert_int_equal(weft_trace_stop(), WEFT_OK);
  if (!premise) skip();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_min_captured_sendrecv_thread_per_rank, case_setup),
      cmocka_unit_test_setup(test_min_first_collective_meets_graph_calls, case_setup),
      cmocka_unit_test_setup(test_min_full_queue_behind_an_all_reduce_meets_graph_calls, case_setup),
      cmocka_unit_test_setup(test_min_full_per_thread_queue_behind_an_all_reduce, case_setup),
      cmocka_unit_test_setup(test_min_full_queue_behind_an_all_reduce_traced, case_setup),
      cmocka_unit_test_setup(test_random_programs_one_thread, case_setup),
      cmocka_unit_test_setup(test_random_programs_thread_per_rank, case_setup),
      cmocka_unit_test_setup(test_repro_thread_per_rank_ring4_seed3_hang, case_setup),
      cmocka_unit_test_setup(test_repro_one_thread_ring4_seed9500_global_capture, case_setup),
  };
  if (getenv("WEFT_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("WEFT_TEST_FILTER"));
  return cmocka_run_group_tests(tests, setup, NULL);
}
