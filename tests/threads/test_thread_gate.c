/* The thread gate (issue 11): eight host threads on ONE runtime allocate, use, free, capture and
 * replay, each for a few thousand iterations with its own seed. The gate: no tsan report (run
 * under --config=tsan), no race reported by the simulator's oracle, and every block equal to its
 * host model (checked now and then during the run and for every block at the end).
 *
 * Four tests:
 *   - gate, default ring (64 events) and small ring (4: ring evictions under contention): each
 *     thread works on its own blocks and on read-only shared blocks (written once before the
 *     threads start), on random pool streams (index, weft_stream_next, weft_stream_auto), frees
 *     mostly on another stream than the allocation, synchronises, reads counters, prints, and
 *     captures on pool stream <thread> (weft_capture_begin/end or weft_capture_run, sometimes
 *     joining one more stream), instantiates, launches the graph several times on random streams,
 *     checks, uses, frees or hands the outputs to the next thread (which checks and frees them),
 *     destroys exec and graph, reads graph memory statistics and trims graph memory;
 *   - shared writable blocks: threads read and write shared blocks, each use under that block's
 *     host mutex (the host orders the uses; weft must add the cross-stream waits);
 *   - captures contend for streams: threads begin captures on, and join, streams 0-5 at random
 *     (weft must arbitrate: WEFT_ERR_CAPTURE for the loser); eager work only on streams 6-7.
 *
 * A capture records every use enqueued on its streams, so eager work must stay off a capturing
 * stream: in the gate tests, eager work holds the read side of a per-stream rwlock and a capture
 * holds the write side of its streams for its whole span (readers do not order each other, so
 * eager users of one stream stay unordered for tsan). Synchronisations that weft refuses with
 * WEFT_ERR_CAPTURE (a GLOBAL capture of another thread is active: documented) are retried.
 *
 * The gates also order a capture against the eager work of its streams for tsan, so races that
 * need eager work and a capture on the same stream at once cannot show there; the contention test
 * has no gates (its captures and its eager work use disjoint streams). Graphs captured into the
 * thread's graph pool replay on one stream: graph pools require replay in capture order.
 *
 * Every failing weft call and data mismatch is counted (a table of distinct messages is printed
 * at the end of each test), with how many elements differ; a failed check of an own block prints
 * that block's last operations (trace). SIGABRT (weft assertions) and SIGSEGV in a worker print a
 * stack.
 *
 * Knobs (environment): THREAD_GATE_DEVICES=2 (the gate tests on two devices: thread t works on
 * device t % 2, with a runtime, shared blocks and hand-overs of each; weft's gate is per device, so
 * graph calls on one device overlap enqueues on the other), THREAD_GATE_ITERS (iterations per thread), THREAD_GATE_SEED,
 * THREAD_GATE_ONLY=<part of a test name>, and to isolate a failure: THREAD_GATE_HANDOFF=0 (graph
 * outputs never go to another thread), THREAD_GATE_OWN_POOL=0 (no capture with a graph pool of its
 * own), THREAD_GATE_GLOBAL=0 (no GLOBAL-mode capture). The simulator's scheduler takes
 * WEFT_SIM_SEED. */
#include <pthread.h>
#include <sched.h>
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
#include <cmocka.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include "lib/runtime/runtime.h"
#include "tests/util/testutil.h"

#define THREADS 8
#define NB 6     /* own blocks per thread */
#define NSH 3    /* read-only shared blocks */
#define NSW 4    /* writable shared blocks (mutex test) */
#define ELEMS 64
#define BYTES (ELEMS * 4u)
#define MBOX 8
/* How long a thread keeps retrying while another thread still holds what it needs (a handed-over
 * output, a synchronisation refused under another's capture): wall time, not a count, so that slow
 * configurations (tsan, a trace with device timestamps) do not run out first. */
#define SPIN_SECONDS 120.0
#define TRACE 16 /* operations remembered per own block */

enum { MODE_GATE, MODE_SHARED, MODE_CONTEND };

/* THREAD_GATE_DEVICES=2 (gate tests only): thread t works on device t % 2, with a runtime, shared
 * blocks, stream gates and hand-overs of each device; the gate of lib/core/gate.h is per device, so
 * graph calls on one device overlap enqueues on the other. */
#define MAXDEV 2
static unsigned ndev = 1;
static _Thread_local unsigned tls_dev; /* the device of this thread's work */
static tu_env_t envs[MAXDEV];
#define env (envs[tls_dev])
static int mode;
static unsigned n_streams, eager_lo, eager_n; /* eager work: streams [eager_lo, eager_lo + eager_n) */
static unsigned iters;
static uint64_t base_seed;
static unsigned allow_handoff, allow_own_pool, allow_global; /* THREAD_GATE_HANDOFF / _OWN_POOL / _GLOBAL */
static FILE *devnull;
static const weft_block_t none = {0};
static pthread_rwlock_t gates[MAXDEV][WEFT__MAX_STREAMS];
#define gate (gates[tls_dev])
static atomic_uint loops_done;
static pthread_barrier_t barrier;

/* Read-only shared blocks: written once before the threads start. */
static weft_block_t ros[MAXDEV][NSH];
#define ro (ros[tls_dev])
static unsigned ro_model[NSH][ELEMS];
static bool ro_known = true;

/* Writable shared blocks (MODE_SHARED), each guarded by its mutex: handle, model, use. */
static pthread_mutex_t sw_lock[NSW];
static weft_block_t sw[NSW];
static unsigned sw_model[NSW][ELEMS];
static bool sw_known[NSW];

typedef struct job {
  unsigned id;
  uint64_t rng;
  weft_block_t own[NB];
  unsigned model[NB][ELEMS];
  bool known[NB];
  unsigned *host; /* DtoH destination (heap: a failed sync must not leave it on a dead stack) */
  weft_graph_pool_t *gpool;
  int fatal;
  unsigned long uses, checks, syncs, refused, captures, capture_runs, joins, launches, sent, received, busy_spins,
      contended, auto_null, replaced;
  unsigned long errors, mismatches;
  /* The last TRACE operations on each own block, printed when a check of it fails. */
  struct {
    unsigned it;      /* iteration */
    char op;          /* f fill, c combine, x replaced, t temporary, g graph launch, o graph output read, k check */
    unsigned char s;  /* stream index (255: none) */
    unsigned short x; /* what op says (inputs, the other stream, graph kind, launch) */
    unsigned m0;      /* element 0 of the model after it */
  } trace[NB][TRACE];
  unsigned traced[NB], it;
} job_t;
static job_t jobs[THREADS];

/* Graph outputs handed to the next thread, which checks and frees them. */
typedef struct msg {
  weft_block_t b;
  unsigned expect[ELEMS];
  bool known;
} msg_t;
typedef struct mbox {
  pthread_mutex_t m;
  msg_t q[MBOX];
  unsigned head, n;
} mbox_t;
static mbox_t boxes[THREADS];

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t rnd(job_t *j) {
  uint64_t z = (j->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static unsigned rn(job_t *j, unsigned n) { return (unsigned)(rnd(j) % n); }

/* Distinct failures (numbers blanked out) and how often each happened, over all threads. */
#define KINDS 64
static pthread_mutex_t kinds_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char key[200];
  unsigned long count;
} kinds[KINDS];
static unsigned n_kinds;

static void count_kind(const char *msg) {
  char key[200];
  size_t k = 0;
  for (const char *p = msg; *p != '\0' && k + 1 < sizeof key; p++) {
    const char *close = *p == '(' ? strstr(p, ") failed:") : NULL;
    if (close != NULL && close - p > 24 && k + 6 < sizeof key) { /* a long driver call expression */
      memcpy(key + k, "(...)", 5);
      k += 5;
      p = close;
      continue;
    }
    if (*p >= '0' && *p <= '9') {
      if (k == 0 || key[k - 1] != '#') key[k++] = '#';
      while (p[1] >= '0' && p[1] <= '9') p++;
      continue;
    }
    key[k++] = *p;
  }
  key[k] = '\0';
  pthread_mutex_lock(&kinds_lock);
  unsigned i = 0;
  while (i < n_kinds && strcmp(kinds[i].key, key) != 0) i++;
  if (i == n_kinds && n_kinds < KINDS) snprintf(kinds[n_kinds++].key, sizeof kinds[0].key, "%s", key);
  if (i < KINDS) kinds[i].count++;
  pthread_mutex_unlock(&kinds_lock);
}

static void bad(job_t *j, bool mismatch, const char *fmt, ...) {
  char buf[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  count_kind(buf);
  unsigned long n = j->errors + j->mismatches;
  if (mismatch) j->mismatches++;
  else j->errors++;
  if (n < 5) fprintf(stderr, "thread %u: %s\n", j->id, buf);
}

static bool call_ok(job_t *j, weft_status_t st, const char *what) {
  if (st == WEFT_OK) return true;
  bad(j, false, "%s: %s: %s", what, weft_status_name(st), weft_last_error());
  return false;
}
#define CALL(j, expr) call_ok((j), (expr), #expr)

static weft_stream_t *stream(unsigned i) {
  weft_stream_t *s = NULL;
  if (weft_stream_get(env.rt, i, &s) != WEFT_OK) return NULL;
  return s;
}
static weft_stream_t *eager_stream(job_t *j) { return stream(eager_lo + rn(j, eager_n)); }

/* Eager work on s holds the read side of s's gate; a capture holds the write side. */
static bool gated(void) { return mode != MODE_SHARED; }
static void enter(weft_stream_t *s) {
  if (gated()) pthread_rwlock_rdlock(&gate[weft_stream_index(s)]);
}
static void leave(weft_stream_t *s) {
  if (gated()) pthread_rwlock_unlock(&gate[weft_stream_index(s)]);
}

/* A stream for eager work with these accesses: by index, round-robin or weft_stream_auto. In
 * MODE_CONTEND the eager streams are exactly the high-priority ones. */
static weft_stream_t *pick(job_t *j, const weft_access_t *acc, size_t n) {
  bool all = eager_n == n_streams;
  weft_priority_t p = all && rn(j, 4) != 0 ? WEFT_PRIORITY_NORMAL : WEFT_PRIORITY_HIGH;
  weft_stream_t *s = NULL;
  unsigned r = rn(j, 10);
  if (r < 2) {
    if (CALL(j, weft_stream_next(env.rt, p, &s)) && s != NULL) return s;
  } else if (r < 4) {
    weft_status_t st = weft_stream_auto(env.rt, p, acc, n, &s);
    if (st == WEFT_OK && s != NULL) return s;
    if (st == WEFT_OK || (st == WEFT_ERR_CAPTURE && strstr(weft_last_error(), "takes part in a capture") != NULL))
      j->auto_null++; /* every stream of that priority is capturing (OK with no stream is a bug, counted) */
    else
      (void)call_ok(j, st, "weft_stream_auto");
    if (st == WEFT_OK) bad(j, false, "weft_stream_auto: WEFT_OK without a stream");
  }
  return eager_stream(j);
}

/* Block references: own 0..NB-1, read-only shared NB.., writable shared NB+NSH.., -1 none. */
#define RO(c) (NB + (int)(c))
#define SW(c) (NB + NSH + (int)(c))
static weft_block_t *bref(job_t *j, int r) {
  return r < NB ? &j->own[r] : r < NB + NSH ? &ro[r - NB] : &sw[r - NB - NSH];
}
static weft_block_t blk(job_t *j, int r) { return r < 0 ? none : *bref(j, r); }
static unsigned *mref(job_t *j, int r) {
  return r < 0 ? NULL : r < NB ? j->model[r] : r < NB + NSH ? ro_model[r - NB] : sw_model[r - NB - NSH];
}
static bool *kref(job_t *j, int r) {
  return r < NB ? &j->known[r] : r < NB + NSH ? &ro_known : &sw_known[r - NB - NSH];
}
static bool kn(job_t *j, int r) { return r < 0 || *kref(j, r); }

/* out = salt + 7 in0 + 13 in1 + 17 in2 (weft_test_combine). */
static void model_combine(unsigned *out, const unsigned *in0, const unsigned *in1, const unsigned *in2,
                          unsigned salt) {
  unsigned t[ELEMS];
  for (unsigned i = 0; i < ELEMS; i++) {
    unsigned v = salt;
    if (in0) v += 7u * in0[i];
    if (in1) v += 13u * in1[i];
    if (in2) v += 17u * in2[i];
    t[i] = v;
  }
  memcpy(out, t, sizeof t);
}

/* Notes an operation on own block r (after its model changed). */
static void note(job_t *j, int r, char op, weft_stream_t *s, unsigned x) {
  if (r < 0 || r >= NB) return;
  unsigned k = j->traced[r]++ % TRACE;
  j->trace[r][k].it = j->it;
  j->trace[r][k].op = op;
  j->trace[r][k].s = s ? (unsigned char)s->index : 255;
  j->trace[r][k].x = (unsigned short)x;
  j->trace[r][k].m0 = j->model[r][0];
}

/* Prints own block r's trace; "<= read" marks a model state equal to what the check read (a lost
 * or reordered write), none marked means the last writes computed from wrong inputs. */
static void print_trace(job_t *j, int r, unsigned got0) {
  if (r < 0 || r >= NB) return;
  unsigned n = j->traced[r] < TRACE ? j->traced[r] : TRACE;
  for (unsigned i = 0; i < n; i++) {
    unsigned k = (j->traced[r] - n + i) % TRACE;
    fprintf(stderr, "  thread %u own block %d: iteration %u op %c stream %u x %u model[0] %u%s\n", j->id, r,
            j->trace[r][k].it, j->trace[r][k].op, j->trace[r][k].s, j->trace[r][k].x, j->trace[r][k].m0,
            j->trace[r][k].m0 == got0 ? "  <= read" : "");
  }
}

static bool same(job_t *j, const unsigned *got, const unsigned *want, const char *what, int idx) {
  for (unsigned i = 0; i < ELEMS; i++)
    if (got[i] != want[i]) {
      unsigned nw = 0;
      for (unsigned q = 0; q < ELEMS; q++) nw += got[q] != want[q];
      bad(j, true, "data: %s %d element %u: %u, model %u (%u of %u elements differ)", what, idx, i, got[i], want[i], nw,
          ELEMS);
      return false;
    }
  return true;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Whether a retry loop that began at `start` (now_s) has waited long enough. */
static bool spun_out(double start) { return now_s() - start > SPIN_SECONDS; }

/* weft's documented refusal (a capture that could see the call is active), as opposed to a
 * driver failure that weft also maps to WEFT_ERR_CAPTURE. */
static bool refused(weft_status_t st) {
  const char *m = weft_last_error();
  return st == WEFT_ERR_CAPTURE &&
         (strstr(m, "not allowed while a capture") != NULL || strstr(m, "a capture that could see") != NULL);
}

/* Synchronise, retrying while weft refuses because a GLOBAL capture is active elsewhere. A
 * driver failure is reported and retried too (the synchronisation did not happen). */
static weft_status_t sync_retry(job_t *j, weft_stream_t *s, weft_block_t b) {
  for (double start = now_s();;) {
    weft_status_t st = s != NULL ? weft_stream_synchronize(s) : weft_block_synchronize(b);
    if (st == WEFT_OK || spun_out(start)) return st;
    if (refused(st)) j->refused++;
    else if (!call_ok(j, st, s != NULL ? "weft_stream_synchronize" : "weft_block_synchronize")) {
      if (st != WEFT_ERR_CAPTURE) return st;
    }
    sched_yield();
  }
}

/* Copies block r to j->host and waits for it (stream or block synchronisation). */
static bool read_block(job_t *j, weft_block_t b) {
  weft_access_t a = {b, WEFT_READ};
  weft_stream_t *s = pick(j, &a, 1);
  enter(s);
  weft_status_t st = weft_copy_from_block(s, j->host, b, 0, BYTES);
  bool ok = call_ok(j, st, "weft_copy_from_block");
  if (ok) ok = call_ok(j, sync_retry(j, rn(j, 2) ? s : NULL, b), "synchronize after weft_copy_from_block");
  leave(s);
  j->checks++;
  return ok;
}

static void check_ref(job_t *j, int r) {
  if (!read_block(j, blk(j, r)) || !kn(j, r)) return;
  if (!same(j, j->host, mref(j, r), r < NB ? "own block" : "shared block", r)) {
    print_trace(j, r, j->host[0]);
    memcpy(mref(j, r), j->host, BYTES); /* resynchronise the model: report each divergence once */
  }
  note(j, r, 'k', NULL, 0);
}

/* ---- eager operations ---------------------------------------------------------------------- */

static void e_combine(job_t *j, int out, int in0, int in1, int in2, unsigned salt) {
  weft_access_t acc[4] = {{blk(j, out), WEFT_WRITE}};
  size_t n = 1;
  int ins[3] = {in0, in1, in2};
  for (int i = 0; i < 3; i++)
    if (ins[i] >= 0) acc[n++] = (weft_access_t){blk(j, ins[i]), ins[i] == out ? WEFT_READ_WRITE : WEFT_READ};
  weft_stream_t *s = pick(j, acc, n);
  enter(s);
  weft_status_t st = tu_combine(&env, s, blk(j, out), none, blk(j, in0), blk(j, in1), blk(j, in2), ELEMS, salt);
  leave(s);
  if (!call_ok(j, st, "tu_combine")) {
    *kref(j, out) = false;
    return;
  }
  j->uses++;
  model_combine(mref(j, out), mref(j, in0), mref(j, in1), mref(j, in2), salt);
  *kref(j, out) = kn(j, in0) && kn(j, in1) && kn(j, in2);
  note(j, out, 'c', s, (unsigned)((in0 + 1) * 100 + (in1 + 1) * 10 + (in2 + 1)));
}

static void e_fill(job_t *j, int r, unsigned value) {
  weft_access_t a = {blk(j, r), WEFT_WRITE};
  weft_stream_t *s = pick(j, &a, 1);
  enter(s);
  weft_status_t st = tu_fill(&env, s, blk(j, r), ELEMS, value);
  leave(s);
  if (!call_ok(j, st, "tu_fill")) {
    *kref(j, r) = false;
    return;
  }
  j->uses++;
  for (unsigned i = 0; i < ELEMS; i++) mref(j, r)[i] = value;
  *kref(j, r) = true;
  note(j, r, 'f', s, 0);
}

/* Frees block r on one stream, allocates it anew on another (sometimes the same), writes it. */
static void e_replace(job_t *j, int r, int src) {
  weft_block_t old = blk(j, r);
  weft_access_t a = {old, WEFT_WRITE};
  weft_stream_t *s = pick(j, &a, 1);
  enter(s);
  weft_status_t st = weft_free(old, s);
  leave(s);
  if (!call_ok(j, st, "weft_free")) return;
  CUdeviceptr p;
  if (weft_block_ptr(old, &p) != WEFT_ERR_STALE_HANDLE) bad(j, false, "a freed handle is not stale");
  weft_stream_t *s2 = rn(j, 4) == 0 ? s : eager_stream(j);
  enter(s2);
  st = weft_alloc(env.rt, BYTES, s2, r < NB ? "own" : "shared", bref(j, r));
  leave(s2);
  if (!call_ok(j, st, "weft_alloc")) {
    j->fatal = 1;
    return;
  }
  j->replaced++;
  *kref(j, r) = false;
  note(j, r, 'x', s, s2->index);
  if (src < 0) e_fill(j, r, (unsigned)rnd(j));
  else e_combine(j, r, src, RO(rn(j, NSH)), -1, (unsigned)rnd(j));
}

/* A temporary: allocated on one stream, written on another, read into own block b on a third,
 * freed on a fourth. */
static void e_temp(job_t *j) {
  int a = (int)rn(j, NB), b = (int)rn(j, NB), c = (int)rn(j, NSH);
  weft_block_t tmp;
  weft_stream_t *s = eager_stream(j);
  enter(s);
  weft_status_t st = weft_alloc(env.rt, BYTES, s, "tmp", &tmp);
  leave(s);
  if (!call_ok(j, st, "weft_alloc (tmp)")) return;
  unsigned salt1 = (unsigned)rnd(j), salt2 = (unsigned)rnd(j), tm[ELEMS];
  weft_access_t acc[3] = {{tmp, WEFT_WRITE}, {j->own[a], WEFT_READ}, {ro[c], WEFT_READ}};
  s = pick(j, acc, 3);
  enter(s);
  st = tu_combine(&env, s, tmp, none, j->own[a], ro[c], none, ELEMS, salt1);
  leave(s);
  bool ok = call_ok(j, st, "tu_combine (tmp)");
  if (ok) {
    model_combine(tm, j->model[a], ro_model[c], NULL, salt1);
    weft_access_t acc2[2] = {{j->own[b], WEFT_READ_WRITE}, {tmp, WEFT_READ}};
    s = pick(j, acc2, 2);
    enter(s);
    st = tu_combine(&env, s, j->own[b], none, j->own[b], tmp, none, ELEMS, salt2);
    leave(s);
    if (call_ok(j, st, "tu_combine (read tmp)")) {
      model_combine(j->model[b], j->model[b], tm, NULL, salt2);
      j->known[b] = j->known[a] && j->known[b];
      note(j, b, 't', s, (unsigned)a);
      j->uses += 2;
    } else {
      j->known[b] = false;
    }
  }
  s = eager_stream(j);
  enter(s);
  st = weft_free(tmp, s);
  leave(s);
  (void)call_ok(j, st, "weft_free (tmp)");
}

static void e_sync(job_t *j) {
  weft_stream_t *s = eager_stream(j);
  weft_status_t st;
  switch (rn(j, 3)) {
    case 0:
      enter(s);
      st = weft_stream_synchronize(s);
      leave(s);
      break;
    case 1: st = weft_block_synchronize(j->own[rn(j, NB)]); break;
    default:
      enter(s);
      st = weft_stream_query(s);
      leave(s);
      if (st == WEFT_ERR_NOT_READY) st = WEFT_OK;
      break;
  }
  j->syncs++;
  if (refused(st)) j->refused++;
  else (void)call_ok(j, st, "weft_stream_synchronize / weft_block_synchronize / weft_stream_query");
}

static void e_info(job_t *j) {
  weft_counters_t c;
  (void)CALL(j, weft_runtime_counters(env.rt, &c));
  weft_runtime_print(env.rt, devnull);
  weft_graph_memory_stats_t gm;
  if (CALL(j, weft_graph_memory_stats(env.rt, &gm)) && (gm.used > gm.used_high || gm.reserved > gm.reserved_high))
    bad(j, false, "graph memory stats: used %llu > high %llu or reserved %llu > high %llu",
        (unsigned long long)gm.used, (unsigned long long)gm.used_high, (unsigned long long)gm.reserved,
        (unsigned long long)gm.reserved_high);
  if (rn(j, 4) == 0) {
    weft_status_t st = weft_graph_memory_trim(env.rt);
    if (refused(st)) j->refused++;
    else (void)call_ok(j, st, "weft_graph_memory_trim");
  }
  weft_stream_t *s;
  (void)CALL(j, weft_stream_next(env.rt, WEFT_PRIORITY_NORMAL, &s));
  weft_access_t a = {j->own[rn(j, NB)], WEFT_READ};
  weft_status_t st = weft_stream_auto(env.rt, WEFT_PRIORITY_HIGH, &a, 1, &s);
  if (st != WEFT_ERR_CAPTURE) (void)call_ok(j, st, "weft_stream_auto");
}

/* ---- graph outputs handed to another thread ------------------------------------------------ */

static bool post(unsigned to, const msg_t *m) {
  mbox_t *b = &boxes[to];
  pthread_mutex_lock(&b->m);
  bool ok = b->n < MBOX;
  if (ok) b->q[(b->head + b->n++) % MBOX] = *m;
  pthread_mutex_unlock(&b->m);
  return ok;
}

/* Checks and frees the outputs other threads handed to this one. */
static void drain(job_t *j) {
  mbox_t *b = &boxes[j->id];
  for (;;) {
    msg_t m;
    pthread_mutex_lock(&b->m);
    if (b->n == 0) {
      pthread_mutex_unlock(&b->m);
      return;
    }
    m = b->q[b->head];
    b->head = (b->head + 1) % MBOX;
    b->n--;
    pthread_mutex_unlock(&b->m);
    if (read_block(j, m.b) && m.known) (void)same(j, j->host, m.expect, "handed-over graph output", -1);
    weft_access_t a = {m.b, WEFT_WRITE};
    weft_stream_t *s = pick(j, &a, 1);
    enter(s);
    weft_status_t st = weft_free(m.b, s);
    leave(s);
    (void)call_ok(j, st, "weft_free (handed-over graph output)");
    j->received++;
  }
}

/* ---- captures ------------------------------------------------------------------------------- */

/* tmp = s0 + 7 own[a] + 13 ro[c] (on s); tmp2 = s1 + 7 tmp (on t); out = s2 + 7 tmp + 13 tmp2;
 * own[b] = s3 + 7 own[b] + 13 tmp; tmp, tmp2 freed inside. */
typedef struct body {
  job_t *j;
  weft_stream_t *t; /* a second stream taking part, or NULL */
  bool join;        /* the body joins t itself */
  int a, b, c;      /* b < 0: no write of an own block */
  bool out_on_t, w_on_t, free_on_t;
  bool shared_pool; /* captured into the thread's graph pool */
  int mem, mode;    /* 0 memory nodes, 1 own graph pool, 2 the thread's pool; weft_capture_mode_t */
  unsigned salt[4];
} body_t;

static weft_status_t capture_body(weft_stream_t *s, void *arg) {
  body_t *B = arg;
  job_t *j = B->j;
  weft_status_t r;
  weft_stream_t *t = B->t ? B->t : s;
  if (B->t && B->join && (r = weft_capture_join(s, B->t)) != WEFT_OK) return r;
  weft_block_t tmp, tmp2 = none, out;
  if ((r = weft_alloc(env.rt, BYTES, s, "tmp", &tmp)) != WEFT_OK) return r;
  if ((r = tu_combine(&env, s, tmp, none, j->own[B->a], ro[B->c], none, ELEMS, B->salt[0])) != WEFT_OK) return r;
  if (B->t) {
    if ((r = weft_alloc(env.rt, BYTES, t, "tmp2", &tmp2)) != WEFT_OK) return r;
    if ((r = tu_combine(&env, t, tmp2, none, tmp, none, none, ELEMS, B->salt[1])) != WEFT_OK) return r;
  }
  if ((r = weft_alloc(env.rt, BYTES, B->out_on_t ? t : s, "out", &out)) != WEFT_OK) return r;
  if ((r = tu_combine(&env, s, out, none, tmp, tmp2, none, ELEMS, B->salt[2])) != WEFT_OK) return r;
  if (B->b >= 0 &&
      (r = tu_combine(&env, B->w_on_t ? t : s, j->own[B->b], none, j->own[B->b], tmp, none, ELEMS, B->salt[3])) !=
          WEFT_OK)
    return r;
  if ((r = weft_free(tmp, B->free_on_t ? t : s)) != WEFT_OK) return r;
  if (B->t && (r = weft_free(tmp2, B->free_on_t ? s : t)) != WEFT_OK) return r;
  return WEFT_OK;
}

/* What one launch does to the models; the output's expected contents go to out. */
static void model_launch(job_t *j, const body_t *B, unsigned *out, bool *out_known) {
  unsigned tmp[ELEMS], tmp2[ELEMS];
  model_combine(tmp, j->model[B->a], ro_model[B->c], NULL, B->salt[0]);
  if (B->t) model_combine(tmp2, tmp, NULL, NULL, B->salt[1]);
  model_combine(out, tmp, B->t ? tmp2 : NULL, NULL, B->salt[2]);
  *out_known = j->known[B->a];
  if (B->b >= 0) {
    model_combine(j->model[B->b], j->model[B->b], tmp, NULL, B->salt[3]);
    j->known[B->b] = j->known[B->a] && j->known[B->b];
  }
}

static void random_body(job_t *j, body_t *B, weft_stream_t *t) {
  memset(B, 0, sizeof *B);
  B->j = j;
  B->t = t;
  B->a = (int)rn(j, NB);
  B->b = rn(j, 3) == 0 ? -1 : (B->a + 1 + (int)rn(j, NB - 1)) % NB;
  B->c = (int)rn(j, NSH);
  B->out_on_t = rn(j, 2);
  B->w_on_t = rn(j, 2);
  B->free_on_t = rn(j, 2);
  for (int i = 0; i < 4; i++) B->salt[i] = (unsigned)rnd(j);
}

static weft_capture_options_t random_options(job_t *j) {
  weft_capture_options_t o = weft_capture_options_default();
  unsigned m = rn(j, 4);
  o.mode = m == 0 && allow_global ? WEFT_CAPTURE_GLOBAL : m == 3 ? WEFT_CAPTURE_RELAXED : WEFT_CAPTURE_THREAD_LOCAL;
  unsigned mem = rn(j, 4);
  if (mem >= 2) {
    o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
    o.pool = mem == 3 || !allow_own_pool ? j->gpool : NULL; /* the thread's pool, or the graph's own */
  }
  return o;
}

/* Instantiates g, launches it 1-4 times on eager streams and deals with each output: checked
 * and freed, read into an own block and freed, or handed to the next thread. Destroys both. */
static void replay(job_t *j, weft_graph_t *g, body_t *B) {
  if (weft_graph_output_count(g) != 1) bad(j, false, "graph has %zu outputs, not 1", weft_graph_output_count(g));
  weft_access_t sum[4];
  size_t ns = weft_graph_summary(g, sum, 4);
  if (ns != (B->b >= 0 ? 3u : 2u)) bad(j, false, "graph summary has %zu blocks", ns);
  weft_stream_t *s = eager_stream(j);
  weft_exec_t *e = NULL;
  enter(s);
  weft_status_t st = weft_graph_instantiate(g, s, &e);
  leave(s);
  bool handed = false; /* an output went to another thread: BUSY may only mean "not freed yet" */
  if (call_ok(j, st, "weft_graph_instantiate")) {
    unsigned launches = 1 + rn(j, 4);
    for (unsigned l = 0; l < launches; l++) {
      double start = now_s();
      for (;;) {
        /* Graphs sharing the thread's graph pool must replay in capture order: one stream. */
        s = B->shared_pool ? stream(eager_lo + j->id % eager_n) : pick(j, sum, ns < 4 ? ns : 4);
        enter(s);
        st = weft_exec_launch(e, s);
        leave(s);
        if (st != WEFT_ERR_BUSY || !handed || spun_out(start)) break;
        j->busy_spins++; /* the previous output is with another thread still */
        drain(j);
        sched_yield();
      }
      if (!call_ok(j, st, "weft_exec_launch")) break;
      j->launches++;
      msg_t m;
      model_launch(j, B, m.expect, &m.known);
      note(j, B->b, 'g', s, (unsigned)(B->a * 1000 + B->mem * 100 + B->mode * 10 + (B->t != NULL)));
      if (!CALL(j, weft_exec_output(e, 0, &m.b)) || m.b.rec == NULL) {
        bad(j, false, "no output after a launch");
        break;
      }
      unsigned what = rn(j, 3);
      if (what == 2 && allow_handoff && post((j->id + ndev) % THREADS, &m)) {
        j->sent++;
        handed = true;
        continue;
      }
      if (what == 0) {
        char what[128];
        snprintf(what, sizeof what, "graph output (memory %d, mode %d, second stream %d, %u launches): launch",
                 B->mem, B->mode, B->t != NULL, launches);
        if (read_block(j, m.b) && m.known) (void)same(j, j->host, m.expect, what, (int)l);
      } else {
        int x = (int)rn(j, NB);
        unsigned salt = (unsigned)rnd(j);
        weft_access_t acc[2] = {{j->own[x], WEFT_READ_WRITE}, {m.b, WEFT_READ}};
        s = pick(j, acc, 2);
        enter(s);
        st = tu_combine(&env, s, j->own[x], none, m.b, j->own[x], none, ELEMS, salt);
        leave(s);
        if (call_ok(j, st, "tu_combine (read graph output)")) {
          model_combine(j->model[x], m.expect, j->model[x], NULL, salt);
          j->known[x] = j->known[x] && m.known;
          note(j, x, 'o', s, l);
        } else {
          j->known[x] = false;
        }
      }
      weft_access_t a = {m.b, WEFT_WRITE};
      s = pick(j, &a, 1);
      enter(s);
      st = weft_free(m.b, s);
      leave(s);
      (void)call_ok(j, st, "weft_free (graph output)");
    }
    (void)CALL(j, weft_exec_destroy(e));
  }
  for (double start = now_s();;) {
    st = weft_graph_destroy(g);
    if (st != WEFT_ERR_BUSY || !handed || spun_out(start)) break;
    drain(j); /* an output is with another thread still */
    sched_yield();
  }
  (void)call_ok(j, st, "weft_graph_destroy");
}

static const char *mode_name(weft_capture_mode_t m) {
  return m == WEFT_CAPTURE_GLOBAL ? "GLOBAL" : m == WEFT_CAPTURE_THREAD_LOCAL ? "THREAD_LOCAL" : "RELAXED";
}

/* Captures B with weft_capture_run or begin / body / end; reports what failed. */
static weft_status_t capture(job_t *j, weft_stream_t *s, const weft_capture_options_t *o, body_t *B,
                             weft_graph_t **g) {
  char what[64];
  if (rn(j, 2)) {
    j->capture_runs++;
    weft_status_t st = weft_capture_run(s, o, capture_body, B, g);
    snprintf(what, sizeof what, "weft_capture_run [%s]", mode_name(o->mode));
    (void)call_ok(j, st, what);
    return st;
  }
  weft_status_t st = weft_capture_begin(s, o);
  snprintf(what, sizeof what, "weft_capture_begin [%s]", mode_name(o->mode));
  if (!call_ok(j, st, what)) return st;
  weft_status_t body = capture_body(s, B);
  snprintf(what, sizeof what, "capture body [%s]", mode_name(o->mode));
  (void)call_ok(j, body, what);
  st = weft_capture_end(s, g);
  snprintf(what, sizeof what, "weft_capture_end [%s]", mode_name(o->mode));
  (void)call_ok(j, st, what);
  if (body == WEFT_OK) return st;
  if (st == WEFT_OK) (void)weft_graph_destroy(*g);
  return body;
}

/* Thread i captures on stream i (holding its gate), sometimes with one more stream it takes. */
static void e_capture(job_t *j) {
  unsigned i = j->id % n_streams, k = 0;
  weft_stream_t *s = stream(i), *t = NULL;
  pthread_rwlock_wrlock(&gate[i]);
  if (rn(j, 2)) {
    k = (i + 1 + rn(j, n_streams - 1)) % n_streams;
    if (pthread_rwlock_trywrlock(&gate[k]) == 0) t = stream(k);
  }
  body_t B;
  random_body(j, &B, t);
  B.join = true;
  weft_capture_options_t o = random_options(j);
  B.shared_pool = o.pool != NULL;
  B.mem = o.memory == WEFT_GRAPH_MEMORY_PRIVATE_POOL ? (o.pool ? 2 : 1) : 0;
  B.mode = (int)o.mode;
  weft_graph_t *g = NULL;
  weft_status_t st = capture(j, s, &o, &B, &g);
  if (t) pthread_rwlock_unlock(&gate[k]);
  pthread_rwlock_unlock(&gate[i]);
  if (st != WEFT_OK) return; /* reported */
  j->captures++;
  if (t) j->joins++;
  replay(j, g, &B);
}

/* MODE_CONTEND: begin on a random stream of 0..eager_lo-1, maybe join another; weft arbitrates. */
static void c_capture(job_t *j) {
  weft_stream_t *s = stream(rn(j, eager_lo)), *t = NULL;
  weft_capture_options_t o = random_options(j);
  char what[64];
  weft_status_t st = weft_capture_begin(s, &o);
  if (st == WEFT_ERR_CAPTURE) {
    j->contended++;
    return;
  }
  snprintf(what, sizeof what, "weft_capture_begin [%s]", mode_name(o.mode));
  if (!call_ok(j, st, what)) return;
  if (rn(j, 2)) {
    weft_stream_t *c = stream(rn(j, eager_lo));
    if (c != s) {
      st = weft_capture_join(s, c);
      if (st == WEFT_OK) t = c;
      else if (st == WEFT_ERR_CAPTURE) j->contended++;
      else (void)call_ok(j, st, "weft_capture_join");
    }
  }
  body_t B;
  random_body(j, &B, t);
  B.shared_pool = o.pool != NULL;
  B.mem = o.memory == WEFT_GRAPH_MEMORY_PRIVATE_POOL ? (o.pool ? 2 : 1) : 0;
  B.mode = (int)o.mode;
  weft_status_t body = capture_body(s, &B);
  snprintf(what, sizeof what, "capture body [%s]", mode_name(o.mode));
  (void)call_ok(j, body, what);
  weft_graph_t *g = NULL;
  st = weft_capture_end(s, &g);
  snprintf(what, sizeof what, "weft_capture_end [%s]", mode_name(o.mode));
  if (!call_ok(j, st, what)) return;
  if (body != WEFT_OK) {
    (void)weft_graph_destroy(g);
    return;
  }
  j->captures++;
  if (t) j->joins++;
  replay(j, g, &B);
}

/* ---- the threads ------------------------------------------------------------------------------ */

static void step_gate(job_t *j) {
  unsigned r = rn(j, 100);
  int a = (int)rn(j, NB), b = (int)rn(j, NB);
  if (r < 34) e_combine(j, a, b, rn(j, 2) ? RO(rn(j, NSH)) : -1, rn(j, 3) == 0 ? (int)rn(j, NB) : -1, (unsigned)rnd(j));
  else if (r < 40) e_combine(j, a, RO(rn(j, NSH)), RO(rn(j, NSH)), -1, (unsigned)rnd(j));
  else if (r < 46) e_fill(j, a, (unsigned)rnd(j));
  else if (r < 56) e_replace(j, a, rn(j, 2) && a != b ? b : -1);
  else if (r < 62) e_temp(j);
  else if (r < 70) e_sync(j);
  else if (r < 74) e_info(j);
  else if (r < 80) check_ref(j, a);
  else if (r < 90) {
    if (mode == MODE_CONTEND) c_capture(j);
    else e_capture(j);
  } else e_combine(j, a, a, RO(rn(j, NSH)), -1, (unsigned)rnd(j));
}

/* MODE_SHARED: every use of a writable shared block happens under its mutex. */
static void step_shared(job_t *j) {
  unsigned r = rn(j, 100);
  int a = (int)rn(j, NSW), b = (int)rn(j, NSW), x = (int)rn(j, NB);
  if (r < 30) {
    pthread_mutex_lock(&sw_lock[a]);
    e_combine(j, SW(a), SW(a), RO(rn(j, NSH)), rn(j, 2) ? x : -1, (unsigned)rnd(j));
    pthread_mutex_unlock(&sw_lock[a]);
  } else if (r < 45 && a != b) {
    int lo = a < b ? a : b, hi = a < b ? b : a;
    pthread_mutex_lock(&sw_lock[lo]);
    pthread_mutex_lock(&sw_lock[hi]);
    e_combine(j, SW(a), SW(b), SW(a), -1, (unsigned)rnd(j));
    pthread_mutex_unlock(&sw_lock[hi]);
    pthread_mutex_unlock(&sw_lock[lo]);
  } else if (r < 58) {
    pthread_mutex_lock(&sw_lock[a]);
    e_combine(j, x, SW(a), x, -1, (unsigned)rnd(j));
    pthread_mutex_unlock(&sw_lock[a]);
  } else if (r < 64) {
    pthread_mutex_lock(&sw_lock[a]);
    e_replace(j, SW(a), rn(j, 2) ? RO(rn(j, NSH)) : -1);
    pthread_mutex_unlock(&sw_lock[a]);
  } else if (r < 70) {
    pthread_mutex_lock(&sw_lock[a]);
    check_ref(j, SW(a));
    pthread_mutex_unlock(&sw_lock[a]);
  } else if (r < 78) e_combine(j, x, (int)rn(j, NB), RO(rn(j, NSH)), -1, (unsigned)rnd(j));
  else if (r < 84) e_temp(j);
  else if (r < 90) e_sync(j);
  else if (r < 93) e_info(j);
  else if (r < 97) check_ref(j, x);
  else e_replace(j, x, -1);
}

static void *worker(void *arg) {
  job_t *j = arg;
  tls_dev = j->id % ndev;
  j->rng = base_seed * 0x2545f4914f6cdd1dull + j->id * 1000003ull + 17;
  j->host = malloc(BYTES);
  if (j->host == NULL) j->fatal = 1;
  for (int b = 0; b < NB && !j->fatal; b++) {
    weft_stream_t *s = eager_stream(j);
    enter(s);
    weft_status_t st = weft_alloc(env.rt, BYTES, s, "own", &j->own[b]);
    leave(s);
    if (!call_ok(j, st, "weft_alloc (own)")) j->fatal = 1;
    else e_fill(j, b, j->id * 100 + (unsigned)b);
  }
  if (!j->fatal && mode != MODE_SHARED && !CALL(j, weft_graph_pool_create(env.rt, &j->gpool))) j->fatal = 1;
  for (unsigned v = 0; v < iters && !j->fatal; v++) {
    j->it = v;
    drain(j);
    if (mode == MODE_SHARED) step_shared(j);
    else step_gate(j);
  }
  /* Keep taking handed-over outputs until every thread is done producing them. */
  atomic_fetch_add(&loops_done, 1);
  while (atomic_load(&loops_done) < THREADS) {
    drain(j);
    sched_yield();
  }
  pthread_barrier_wait(&barrier);
  drain(j);
  /* No capture is active now: every block against its model, then freed. */
  for (int b = 0; b < NB && j->host != NULL; b++) {
    if (j->own[b].rec == NULL) continue;
    check_ref(j, b);
    weft_access_t a = {j->own[b], WEFT_WRITE};
    weft_stream_t *s = pick(j, &a, 1);
    enter(s);
    weft_status_t st = weft_free(j->own[b], s);
    leave(s);
    (void)call_ok(j, st, "weft_free (own, at the end)");
  }
  if (j->gpool != NULL) (void)CALL(j, weft_graph_pool_destroy(j->gpool));
  free(j->host);
  return NULL;
}

static unsigned env_unsigned(const char *name, unsigned def) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0' ? (unsigned)strtoul(v, NULL, 10) : def;
}

static void catch_fatal_signals(void);

static void run(const char *name, int m, unsigned ring, unsigned default_iters) {
  catch_fatal_signals();
  mode = m;
  iters = env_unsigned("THREAD_GATE_ITERS", default_iters);
  base_seed = env_unsigned("THREAD_GATE_SEED", 1);
  allow_handoff = env_unsigned("THREAD_GATE_HANDOFF", 1);
  allow_own_pool = env_unsigned("THREAD_GATE_OWN_POOL", 1);
  allow_global = env_unsigned("THREAD_GATE_GLOBAL", 1);
  ndev = m == MODE_GATE ? env_unsigned("THREAD_GATE_DEVICES", 1) : 1;
  if (ndev < 1 || ndev > MAXDEV) fail_msg("THREAD_GATE_DEVICES must be 1 or %d", MAXDEV);
  weft_options_t o = weft_options_default();
  o.event_ring = ring;
  for (tls_dev = 0; tls_dev < ndev; tls_dev++)
    if (tu_init_device(&env, (int)tls_dev, &o) != 0) {
      if (tls_dev == 0) fail_msg("tu_init_device 0");
      print_message("premise: device %u is not there\n", tls_dev);
      skip();
    }
  tls_dev = 0;
  n_streams = o.stream_count;
  assert_true(n_streams == THREADS);
  eager_lo = m == MODE_CONTEND ? n_streams - o.high_priority_streams : 0;
  eager_n = n_streams - eager_lo;
  devnull = fopen("/dev/null", "w");
  assert_non_null(devnull);
  pthread_rwlockattr_t ga;
  pthread_rwlockattr_init(&ga);
  pthread_rwlockattr_setkind_np(&ga, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  for (unsigned d = 0; d < ndev; d++)
    for (unsigned i = 0; i < n_streams; i++) pthread_rwlock_init(&gates[d][i], &ga);
  pthread_rwlockattr_destroy(&ga);
  for (unsigned t = 0; t < THREADS; t++) {
    pthread_mutex_init(&boxes[t].m, NULL);
    boxes[t].head = boxes[t].n = 0;
  }
  /* Shared blocks, written once on the main thread (no synchronisation: the threads' first
   * uses wait for these writes). */
  for (tls_dev = 0; tls_dev < ndev; tls_dev++)
    for (int c = 0; c < NSH; c++) {
      weft_stream_t *s = stream((unsigned)c % n_streams);
      assert_int_equal(weft_alloc(env.rt, BYTES, s, "ro", &ro[c]), WEFT_OK);
      assert_int_equal(tu_fill(&env, s, ro[c], ELEMS, 1000u + (unsigned)c), WEFT_OK);
      for (unsigned i = 0; i < ELEMS; i++) ro_model[c][i] = 1000u + (unsigned)c;
    }
  tls_dev = 0;
  weft_stream_t *s0 = stream(0);
  if (m == MODE_SHARED)
    for (int c = 0; c < NSW; c++) {
      pthread_mutex_init(&sw_lock[c], NULL);
      weft_stream_t *s = stream(3 + (unsigned)c);
      assert_int_equal(weft_alloc(env.rt, BYTES, s, "sw", &sw[c]), WEFT_OK);
      assert_int_equal(tu_fill(&env, s, sw[c], ELEMS, 2000u + (unsigned)c), WEFT_OK);
      for (unsigned i = 0; i < ELEMS; i++) sw_model[c][i] = 2000u + (unsigned)c;
      sw_known[c] = true;
    }
  tu_reset_races(&env);
  memset(jobs, 0, sizeof jobs);
  n_kinds = 0;
  atomic_store(&loops_done, 0);
  pthread_barrier_init(&barrier, NULL, THREADS);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_t th[THREADS];
  for (unsigned i = 0; i < THREADS; i++) {
    jobs[i].id = i;
    assert_int_equal(pthread_create(&th[i], NULL, worker, &jobs[i]), 0);
  }
  for (unsigned i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  pthread_barrier_destroy(&barrier);

  unsigned long errors = 0, mismatches = 0, fatal = 0;
  job_t tot = {0};
  for (unsigned i = 0; i < THREADS; i++) {
    job_t *j = &jobs[i];
    errors += j->errors;
    mismatches += j->mismatches;
    fatal += (unsigned long)j->fatal;
    tot.uses += j->uses, tot.checks += j->checks, tot.syncs += j->syncs, tot.refused += j->refused;
    tot.captures += j->captures, tot.capture_runs += j->capture_runs, tot.joins += j->joins;
    tot.launches += j->launches, tot.sent += j->sent, tot.received += j->received;
    tot.busy_spins += j->busy_spins, tot.contended += j->contended, tot.auto_null += j->auto_null;
    tot.replaced += j->replaced;
  }
  for (unsigned k = 0; k < n_kinds; k++) printf("  %6lu x %s\n", kinds[k].count, kinds[k].key);
  /* The shared blocks against their models, then freed. */
  unsigned got[ELEMS];
  for (tls_dev = 0; tls_dev < ndev; tls_dev++)
    for (int c = 0; c < NSH; c++) {
      weft_stream_t *sd = stream(0);
      assert_int_equal(tu_read(sd, ro[c], got, BYTES), WEFT_OK);
      for (unsigned i = 0; i < ELEMS; i++)
        if (got[i] != ro_model[c][i]) {
          printf("  read-only shared block %d of device %u element %u: %u, model %u\n", c, tls_dev, i, got[i],
                 ro_model[c][i]);
          mismatches++;
          break;
        }
      assert_int_equal(weft_free(ro[c], sd), WEFT_OK);
    }
  tls_dev = 0;
  if (m == MODE_SHARED)
    for (int c = 0; c < NSW; c++) {
      assert_int_equal(tu_read(s0, sw[c], got, BYTES), WEFT_OK);
      for (unsigned i = 0; i < ELEMS && sw_known[c]; i++)
        if (got[i] != sw_model[c][i]) {
          printf("  shared block %d element %u: %u, model %u\n", c, i, got[i], sw_model[c][i]);
          mismatches++;
          break;
        }
      assert_int_equal(weft_free(sw[c], s0), WEFT_OK);
      pthread_mutex_destroy(&sw_lock[c]);
    }
  bool valid = true;
  for (tls_dev = 0; tls_dev < ndev; tls_dev++) {
    assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
    valid = valid && weft__tracker_is_valid(&env.rt->tracker);
  }
  tls_dev = 0;
  uint64_t races = tu_races(&env);
  fflush(stdout);
  if (races != 0) tu_print_races(&env);
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  printf("%s: %u threads on %u device(s) x %u iterations in %.2f s: %lu uses, %lu checks, %lu syncs (%lu refused under capture), "
         "%lu captures (%lu capture_run, %lu with a joined stream, %lu contended), %lu launches, %lu outputs handed "
         "over (%lu received), %lu busy relaunches, %lu blocks replaced, %lu null weft_stream_auto\n",
         name, THREADS, ndev, iters, secs, tot.uses, tot.checks, tot.syncs, tot.refused, tot.captures, tot.capture_runs,
         tot.joins, tot.contended, tot.launches, tot.sent, tot.received, tot.busy_spins, tot.replaced, tot.auto_null);
  printf("%s: runtime of device 0: %llu uses, %llu waits issued, %llu skipped, %llu ring evictions, %llu events, allocs %llu, "
         "frees %llu\n",
         name, (unsigned long long)c.uses, (unsigned long long)c.waits_issued, (unsigned long long)c.waits_skipped,
         (unsigned long long)c.ring_evictions, (unsigned long long)c.events_recorded, (unsigned long long)c.allocs,
         (unsigned long long)c.frees);
  printf("%s: %lu errors, %lu data mismatches, %lu threads stopped early, %llu oracle races, tracker %s\n", name,
         errors, mismatches, fatal, (unsigned long long)races, valid ? "valid" : "INVALID");
  fflush(stdout);
  /* Blocks the streams cached are on the live list until given back. */
  size_t live = 0;
  for (tls_dev = 0; tls_dev < ndev; tls_dev++) {
    if (weft_runtime_trim(env.rt) != WEFT_OK) printf("%s: weft_runtime_trim: %s\n", name, weft_last_error());
    pthread_mutex_lock(&env.rt->blocks_lock);
    size_t n = env.rt->live_count;
    pthread_mutex_unlock(&env.rt->blocks_lock);
    if (n != 0) printf("%s: %zu blocks of device %u still live at the end\n", name, n, tls_dev);
    live += n;
    for (unsigned i = 0; i < n_streams; i++) pthread_rwlock_destroy(&gate[i]);
  }
  for (unsigned t = 0; t < THREADS; t++) pthread_mutex_destroy(&boxes[t].m);
  fclose(devnull);
  for (tls_dev = ndev; tls_dev-- > 0;) tu_fini(&env);
  tls_dev = 0;
  assert_int_equal(errors, 0);
  assert_int_equal(mismatches, 0);
  assert_int_equal(fatal, 0);
  assert_int_equal(races, 0);
  assert_true(valid);
  assert_int_equal(live, 0); /* every block freed: none leaked */
}

static void test_gate_default_ring(void **state) {
  (void)state;
  run("gate, ring 64", MODE_GATE, 64, 2000);
}

static void test_gate_small_ring(void **state) {
  (void)state;
  run("gate, ring 4", MODE_GATE, 4, 2000);
}

static void test_shared_writable_blocks_under_mutexes(void **state) {
  (void)state;
  run("shared writable, ring 4", MODE_SHARED, 4, 2000);
}

static void test_captures_contend_for_streams(void **state) {
  (void)state;
  run("contended captures, ring 4", MODE_CONTEND, 4, 1000);
}

/* A weft assertion (SIGABRT) or a crash in a worker thread: print the signal and the stack
 * (library+offset, for addr2line) and die with the signal. Installed by run() over cmocka's
 * handlers, whose longjmp from a worker thread would not survive. */
static void on_fatal(int sig) {
  void *pc[64];
  int n = backtrace(pc, 64);
  char msg[96];
  int len = snprintf(msg, sizeof msg, "test_thread_gate: fatal signal %d (%s), stack:\n", sig,
                     sig == SIGABRT ? "SIGABRT" : sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : "other");
  ssize_t ignored = write(2, msg, (size_t)len);
  (void)ignored;
  backtrace_symbols_fd(pc, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

static void catch_fatal_signals(void) {
  void *pc[1];
  (void)backtrace(pc, 1); /* loads libgcc now, not inside the handler */
  signal(SIGABRT, on_fatal);
  signal(SIGSEGV, on_fatal);
  signal(SIGBUS, on_fatal);
  signal(SIGILL, on_fatal);
  signal(SIGFPE, on_fatal);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gate_default_ring),
      cmocka_unit_test(test_gate_small_ring),
      cmocka_unit_test(test_shared_writable_blocks_under_mutexes),
      cmocka_unit_test(test_captures_contend_for_streams),
  };
  /* THREAD_GATE_ONLY=<part of a test's name> runs only the matching tests. */
  const char *only = getenv("THREAD_GATE_ONLY");
  struct CMUnitTest chosen[sizeof tests / sizeof tests[0]];
  size_t n = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    if (only == NULL || *only == '\0' || strstr(tests[i].name, only) != NULL) chosen[n++] = tests[i];
  return _cmocka_run_group_tests("test_thread_gate", chosen, n, NULL, NULL);
}
