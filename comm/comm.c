/* Communicators (weft.h, "Collectives"): NCCL communicators bound to runtimes, whose collectives
 * run as tracked uses (weft__use_run): the send range READ, the receive range WRITE (one
 * READ_WRITE access when they share a block). NCCL is reached through lib/core/nccl.h, and each
 * NCCL call that enqueues runs in the graph gate's shared side, as the driver's enqueueing calls
 * do (gate.h: graph calls must not overlap another thread's enqueue).
 *
 * Groups: between weft_comm_group_begin and _end this thread's calls are only checked and
 * recorded. At the end, per stream, the union of the recorded accesses is one use, and the uses
 * of all the group's streams are one joint use (weft__use_joint_uses) around the NCCL group: each
 * stream waits for what its accesses need, NCCL enqueues the whole group, and the collectives
 * are recorded as the blocks' newest uses. When NCCL refuses the group, nothing is recorded.
 * A group enters each of its communicators at its first call on it and stays inside until its
 * end (weft__handle_keep, up to COMM_HELD of them; others are entered at each call and held,
 * weft__handle_hold, during the end): each is entered and checked once per group, and a destroy
 * on another thread waits for the group's end (BUSY while an end holds it), while one on the
 * group's own thread is refused (BUSY), also from a capture handler that the end itself runs
 * (g_ending) or that any call on the communicator runs (the handle set's INSIDE). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/container.h"
#include "lib/core/error.h"
#include "lib/core/gate.h"
#include "lib/core/handle.h"
#include "lib/core/meta.h"
#include "lib/core/nccl.h"
#include "lib/runtime/runtime.h"

struct weft_comm {
  /* This communicator among every one the process made (from 1): a call keeps it, so that one
   * made later at the same address is not taken for the call's. */
  uint64_t serial;
  weft_runtime_t *rt;
  ncclComm_t nc;
  int rank, nranks;
  bool adopted; /* the program's communicator: never destroyed by weft */
  weft_stream_t *stream;
  /* A small block every operation of c writes (READ_WRITE, beside its buffers), in a graph too:
   * NCCL matches a communicator's operations across ranks in the order each rank's device runs
   * them, so on each rank they run in posting order whatever streams they were posted on (two
   * streams no wait ordered deadlocked on 2 x H200: tests/comm test_comm). */
  weft_block_t order;
  struct weft__block *order_rec; /* its record (live while c is) */
  /* Captures its collectives were captured into (stream, driver capture id): while one is still
   * active, or a weft graph it made holds them (weft__capture_held: NCCL's destroy would wait for
   * that graph), weft_comm_destroy says BUSY (the graph's collective nodes name the NCCL
   * communicator). Other entries of ended captures are dropped when the list is looked at. */
  pthread_mutex_t caps_lock;
  struct comm_cap { weft_stream_t *s; uint64_t id; } *caps;
  size_t ncaps, capcaps;
};

typedef enum { C_ALLREDUCE, C_BROADCAST, C_REDUCESCATTER, C_ALLGATHER, C_SEND, C_RECV } coll_kind_t;

/* One collective call, checked and resolved. */
typedef struct call {
  coll_kind_t kind;
  weft_comm_t *c;
  uint64_t serial; /* c's, at the call */
  bool holds;      /* the group's end holds c (weft__handle_hold): its first call on c, not kept */
  weft_stream_t *s;
  weft_block_t send, recv; /* {0} where the call has none */
  CUdeviceptr send_ptr, recv_ptr;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root_or_peer;
  /* The call's accesses as the tracker takes them (call_uses), and their blocks' records (a
   * group's end looks at them again). */
  unsigned nuses;
  struct weft__block *rec[3];
  weft__use_t use[3];
} call_t;

static const char *const kind_name[] = {"weft_all_reduce", "weft_broadcast", "weft_reduce_scatter",
                                        "weft_all_gather", "weft_send",       "weft_recv"};

/* ---- a group on this thread ---- */

static _Thread_local int g_depth;
/* This thread is inside weft_comm_group_end's work (its calls in g_calls[0..g_ncalls)), where a
 * capture handler may call weft: it must not begin a group there, nor destroy the group's
 * communicators. */
static _Thread_local bool g_ending;
/* The calls of this thread's open group: a buffer of the thread's own, kept between groups and
 * freed when the thread ends (g_calls_key's destructor). */
static _Thread_local call_t *g_calls;
static _Thread_local size_t g_ncalls, g_capcalls;
static _Thread_local weft_status_t g_group_error; /* the first refused call of the group */
/* The communicators the open group stays inside (kept from their first call, left at its end). */
#define COMM_HELD 8
static _Thread_local weft_comm_t *g_held[COMM_HELD];
static _Thread_local uint64_t g_held_serial[COMM_HELD]; /* their serials */
static _Thread_local unsigned g_nheld;
/* What the open group's calls add up to, kept as they come (call_note): whether a stream has
 * several calls (their accesses are merged at the end), how many runtimes the streams span, and
 * the devices whose gates the NCCL group enters. */
static _Thread_local bool g_shared_stream;
static _Thread_local size_t g_runtimes;
static _Thread_local weft__gate_devices_t g_gate;
static _Thread_local char g_group_message[512];

static pthread_key_t g_calls_key;
static pthread_once_t g_calls_once = PTHREAD_ONCE_INIT;
static bool g_calls_keyed; /* the key exists (set once, under g_calls_once) */

/* The thread's end: its buffer goes, and with it any group still open (a later thread-exit
 * destructor that ends it finds no group; the kept entries ended with the handle set's). */
static void group_leave(void);
static void calls_release(void *p) {
  weft__meta_free(p);
  g_calls = NULL;
  g_ncalls = g_capcalls = 0;
  g_depth = 0;
  group_leave(); /* (nothing left to leave when the handle set's destructor ran first) */
  g_ending = false;
}

static void calls_key_create(void) { g_calls_keyed = pthread_key_create(&g_calls_key, calls_release) == 0; }

/* Room for one more call in this thread's buffer; the thread's end frees it. */
static weft_status_t calls_room(const char *fn) {
  if (g_ncalls < g_capcalls) return WEFT_OK;
  if (g_capcalls == 0) {
    /* The thread's slot for the key is made now, before the buffer exists: afterwards setting it
     * cannot fail, so the destructor always sees the buffer's current address. */
    pthread_once(&g_calls_once, calls_key_create);
    if (!g_calls_keyed || pthread_setspecific(g_calls_key, NULL) != 0)
      return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no thread-specific slot for the group's calls", fn);
  }
  size_t cap = g_capcalls ? 2 * g_capcalls : 16;
  call_t *n = weft__meta_realloc(g_calls, cap * sizeof *n);
  if (n == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory to record the call", fn);
  (void)pthread_setspecific(g_calls_key, n);
  g_calls = n;
  g_capcalls = cap;
  return WEFT_OK;
}

/* ---- helpers ---- */

/* Whether live communicator c's runtime is alive (its error when not). */
static weft_status_t runtime_alive(const weft_comm_t *c, const char *fn) {
  return weft__runtime_check(c->rt, fn) == NULL ? weft__runtime_check_status(c->rt) : WEFT_OK;
}

static weft_status_t comm_check(const weft_comm_t *c, const char *fn) {
  if (c == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: the communicator is NULL", fn);
  if (!weft__handle_live(c, WEFT__HANDLE_COMM)) return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the communicator was destroyed", fn);
  return runtime_alive(c, fn);
}

/* Enters communicator c (weft__handle_enter: a concurrent weft_comm_destroy waits until
 * weft__handle_leave) and checks its runtime: OK, inside; else its error, not inside. */
static weft_status_t comm_enter(const weft_comm_t *c, const char *fn) {
  if (!weft__handle_enter(c, WEFT__HANDLE_COMM)) return comm_check(c, fn);
  weft_status_t st = runtime_alive(c, fn);
  if (st != WEFT_OK) weft__handle_leave();
  return st;
}

/* Drops this thread's group when the handle set's thread-exit destructor ended its kept entries
 * before calls_release ran (a program's destructor between them that calls weft): the group
 * stays inside nothing any more, so it is gone, as calls_release would make it. */
static void drop_orphaned_group(void) {
  if (__builtin_expect(g_nheld != 0 && g_nheld > weft__handle_kept(), 0)) { /* (no call outside groups) */
    g_nheld = 0;
    g_depth = 0;
    g_ncalls = 0;
    g_ending = false;
  }
}

/* The serial of the communicator the open group of this thread stays inside at c's address
 * (g_held); 0 when it stays inside none there. A kept communicator cannot be destroyed, so its
 * address names it alone while kept. */
static uint64_t held_serial(const weft_comm_t *c) {
  for (unsigned i = 0; i < g_nheld; i++)
    if (g_held[i] == c) return g_held_serial[i];
  return 0;
}

/* Enters c for a call of the open group: once per group where it can stay inside until the end
 * (*stay: true; nothing to leave now), else for this call only (*stay false: leave after it). */
static weft_status_t group_enter(weft_comm_t *c, const char *fn, bool *stay) {
  *stay = true;
  if (held_serial(c) != 0) return WEFT_OK;
  if (g_nheld < COMM_HELD && weft__handle_keep(c, WEFT__HANDLE_COMM)) {
    weft_status_t st = runtime_alive(c, fn);
    if (st == WEFT_OK) {
      g_held_serial[g_nheld] = c->serial;
      g_held[g_nheld++] = c;
    }
    else weft__handle_unkeep(c);
    return st;
  }
  *stay = false; /* (no room to keep it, or not live: comm_enter says which) */
  return comm_enter(c, fn);
}

/* Leaves the communicators the group stayed inside. */
static void group_leave(void) {
  while (g_nheld > 0) weft__handle_unkeep(g_held[--g_nheld]);
}

/* ---- captures holding a communicator's collectives ---- */

/* Whether capture `id` is still active on s (a failed query counts as active: destroy stays
 * refused, which changes nothing). */
static bool cap_active(weft_stream_t *s, uint64_t id) {
  bool active = true;
  uint64_t now = 0;
  /* Another thread's per-thread stream cannot be asked about from here: its capture counts as
   * active while that thread lives, over once it has ended. */
  if (!weft__tracker_owns(s)) return !weft__tracker_owner_ended(s);
  if (weft__capture_probe(s, &active, &now) != WEFT_OK) return true;
  return active && now == id;
}

/* Drops c's entries of ended captures whose collectives no weft graph holds (weft__capture_held:
 * NCCL's destroy would wait for that graph); the caller holds c->caps_lock. Returns how many of
 * those kept are held by a graph alone. */
static size_t caps_prune(weft_comm_t *c) {
  size_t k = 0, held = 0;
  for (size_t i = 0; i < c->ncaps; i++) {
    bool active = cap_active(c->caps[i].s, c->caps[i].id);
    bool graph = !active && weft__capture_held(c->caps[i].id);
    held += graph;
    if (active || graph) c->caps[k++] = c->caps[i];
  }
  c->ncaps = k;
  return held;
}

/* Before a collective of c on s is enqueued: when s captures, remembers the capture (its driver
 * id) as one holding c's collectives. Errors (nothing enqueued then): DRIVER, HOST_OUT_OF_MEMORY. */
static weft_status_t caps_note(weft_comm_t *c, weft_stream_t *s, const char *fn) {
  if (!weft__tracker_in_capture(s)) return WEFT_OK;
  bool active = false;
  uint64_t id = 0;
  weft_status_t st = weft__capture_probe(s, &active, &id);
  if (st != WEFT_OK || !active) return st;
  pthread_mutex_lock(&c->caps_lock);
  for (size_t i = 0; i < c->ncaps; i++)
    if (c->caps[i].s == s && c->caps[i].id == id) {
      pthread_mutex_unlock(&c->caps_lock);
      return WEFT_OK;
    }
  caps_prune(c);
  if (c->ncaps == c->capcaps) {
    size_t cap = c->capcaps ? 2 * c->capcaps : 4;
    struct comm_cap *n = weft__meta_realloc(c->caps, cap * sizeof *n);
    if (n == NULL) {
      pthread_mutex_unlock(&c->caps_lock);
      return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory to note the capture", fn);
    }
    c->caps = n;
    c->capcaps = cap;
  }
  c->caps[c->ncaps++] = (struct comm_cap){s, id};
  pthread_mutex_unlock(&c->caps_lock);
  return WEFT_OK;
}

static size_t dt_size(weft_dtype_t dt) {
  switch (dt) {
    case WEFT_INT8: case WEFT_UINT8: return 1;
    case WEFT_FLOAT16: case WEFT_BFLOAT16: return 2;
    case WEFT_INT32: case WEFT_UINT32: case WEFT_FLOAT32: return 4;
    case WEFT_INT64: case WEFT_UINT64: case WEFT_FLOAT64: return 8;
    default: return 0;
  }
}

static ncclDataType_t nccl_dt(weft_dtype_t dt) {
  switch (dt) {
    case WEFT_INT8: return ncclInt8;
    case WEFT_UINT8: return ncclUint8;
    case WEFT_INT32: return ncclInt32;
    case WEFT_UINT32: return ncclUint32;
    case WEFT_INT64: return ncclInt64;
    case WEFT_UINT64: return ncclUint64;
    case WEFT_FLOAT16: return ncclFloat16;
    case WEFT_FLOAT32: return ncclFloat32;
    case WEFT_FLOAT64: return ncclFloat64;
    default: return ncclBfloat16;
  }
}

/* The device address of [offset, offset + bytes) of block b, a live block of c's runtime. */
static weft_status_t range(const weft_comm_t *c, weft_block_t b, size_t offset, size_t bytes, const char *what,
                           const char *fn, CUdeviceptr *out, struct weft__block **out_rec) {
  struct weft__block *rec = weft__block_live(b, c->rt); /* the common case, inline */
  if (rec == NULL) {
    weft_status_t st = weft__block_check(b, fn, &rec);
    if (st != WEFT_OK) return st;
    if (rec->rt != c->rt) return weft__error(WEFT_ERR_WRONG_DEVICE, "%s: the %s block belongs to another runtime", fn, what);
  }
  if (offset > rec->bytes || bytes > rec->bytes - offset)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: %zu bytes at offset %zu of the %s block pass its end (%zu bytes)",
                       fn, bytes, offset, what, rec->bytes);
  *out = rec->ptr + offset;
  *out_rec = rec;
  return WEFT_OK;
}

/* k->use and k->rec: the accesses of call k, resolved (send_rec and recv_rec: the records of
 * its blocks, NULL where it has none): the communicator's order block READ_WRITE, send READ,
 * receive WRITE, one READ_WRITE when send and receive share a block. */
static void call_uses(call_t *k, struct weft__block *send_rec, struct weft__block *recv_rec) {
  unsigned n = 0;
  k->rec[n] = k->c->order_rec;
  k->use[n++] = (weft__use_t){&k->c->order_rec->acc, (unsigned)WEFT_READ_WRITE, k->c->order.gen};
  if (k->kind == C_RECV) send_rec = NULL;
  if (k->kind == C_SEND) recv_rec = NULL;
  if (send_rec != NULL) {
    k->rec[n] = send_rec;
    k->use[n++] = (weft__use_t){&send_rec->acc, (unsigned)WEFT_READ, k->send.gen};
  }
  if (recv_rec != NULL && recv_rec == send_rec) k->use[1].kind = (unsigned)WEFT_READ_WRITE;
  else if (recv_rec != NULL) {
    k->rec[n] = recv_rec;
    k->use[n++] = (weft__use_t){&recv_rec->acc, (unsigned)WEFT_WRITE, k->recv.gen};
  }
  k->nuses = n;
}

/* Checks a call and resolves its buffers, stream and accesses (call_uses); the caller is inside
 * c (comm_enter). */
static weft_status_t prepare(call_t *k, weft_comm_t *c, weft_stream_t *s, weft_block_t send, size_t send_off,
                             weft_block_t recv, size_t recv_off, size_t count, weft_dtype_t dt) {
  const char *fn = kind_name[k->kind];
  weft_status_t st;
  size_t e = dt_size(dt);
  if (e == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: %d is not a weft_dtype_t", fn, (int)dt);
  size_t all; /* count * e * nranks must fit (checked without a division: tens of cycles each) */
  if (count == 0 || __builtin_mul_overflow(count, e, &all) || __builtin_mul_overflow(all, (size_t)c->nranks, &all))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: count %zu is 0 or too large", fn, count);
  /* The communicator's own stream is a stream of its runtime, which comm_check found alive. */
  if (s != NULL && s != c->stream) {
    if ((st = weft__stream_check(s, fn)) != WEFT_OK) return st;
    if (s->runtime != c->rt) return weft__error(WEFT_ERR_WRONG_DEVICE, "%s: the stream belongs to another runtime", fn);
  }
  if (s == NULL) s = c->stream;
  size_t sb = count * e, rb = count * e;
  if (k->kind == C_REDUCESCATTER) sb *= (size_t)c->nranks;
  if (k->kind == C_ALLGATHER) rb *= (size_t)c->nranks;
  struct weft__block *send_rec = NULL, *recv_rec = NULL;
  if (k->kind != C_RECV && (st = range(c, send, send_off, sb, "send", fn, &k->send_ptr, &send_rec)) != WEFT_OK)
    return st;
  /* In place (the common all-reduce): the send check covered the same range. */
  if (k->kind != C_RECV && recv.rec == send.rec && recv.gen == send.gen && recv_off == send_off && rb == sb) {
    k->recv_ptr = k->send_ptr;
    recv_rec = send_rec;
  } else if (k->kind != C_SEND &&
             (st = range(c, recv, recv_off, rb, "receive", fn, &k->recv_ptr, &recv_rec)) != WEFT_OK)
    return st;
  if ((k->kind == C_ALLREDUCE || k->kind == C_REDUCESCATTER) && (unsigned)k->op > WEFT_AVG)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: %d is not a weft_redop_t", fn, (int)k->op);
  if ((k->kind == C_BROADCAST || k->kind == C_SEND || k->kind == C_RECV) &&
      (k->root_or_peer < 0 || k->root_or_peer >= c->nranks))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: %s %d is not a rank of %d", fn,
                       k->kind == C_BROADCAST ? "root" : "peer", k->root_or_peer, c->nranks);
  k->c = c;
  k->serial = c->serial;
  k->s = s;
  k->send = k->kind == C_RECV ? (weft_block_t){0} : send;
  k->recv = k->kind == C_SEND ? (weft_block_t){0} : recv;
  k->count = count;
  k->dt = nccl_dt(dt);
  call_uses(k, send_rec, recv_rec);
  return WEFT_OK;
}

/* Enqueues a call's NCCL operation on its stream; the caller is in the gate's shared side. */
static ncclResult_t enqueue_gated(const weft__nccl_t *nl, const call_t *k) {
  cudaStream_t cs = (cudaStream_t)k->s->raw;
  void *sp = (void *)(uintptr_t)k->send_ptr, *rp = (void *)(uintptr_t)k->recv_ptr;
  ncclResult_t r;
  switch (k->kind) {
    case C_ALLREDUCE: r = nl->ncclAllReduce(sp, rp, k->count, k->dt, k->op, k->c->nc, cs); break;
    case C_BROADCAST: r = nl->ncclBroadcast(sp, rp, k->count, k->dt, k->root_or_peer, k->c->nc, cs); break;
    case C_REDUCESCATTER: r = nl->ncclReduceScatter(sp, rp, k->count, k->dt, k->op, k->c->nc, cs); break;
    case C_ALLGATHER: r = nl->ncclAllGather(sp, rp, k->count, k->dt, k->c->nc, cs); break;
    case C_SEND: r = nl->ncclSend(sp, k->count, k->dt, k->root_or_peer, k->c->nc, cs); break;
    default: r = nl->ncclRecv(rp, k->count, k->dt, k->root_or_peer, k->c->nc, cs); break;
  }
  return r;
}

/* Enqueues a call's NCCL operation on its stream (in the gate's shared side). */
static ncclResult_t enqueue(const weft__nccl_t *nl, const call_t *k) {
  weft__gate_enter(weft__driver_gate_devices(k->s->tr->ctx)); /* the device it enqueues on */
  ncclResult_t r = enqueue_gated(nl, k);
  weft__gate_leave();
  return r;
}

static weft_status_t run_one(weft_stream_t *s, void *arg) {
  (void)s;
  const call_t *k = arg;
  const weft__nccl_t *nl;
  weft_status_t st = weft__nccl_get(&nl);
  if (st == WEFT_OK) st = caps_note(k->c, k->s, kind_name[k->kind]);
  if (st != WEFT_OK) return st;
  ncclResult_t r = enqueue(nl, k);
  return r == ncclSuccess ? WEFT_OK : weft__nccl_fail(nl, r, kind_name[k->kind]);
}

/* Before posting collectives on streams s: notes them in the captures those streams take part in
 * (their graphs' launches keep exact waits: graph/exec.c), and keeps live waits exact where needed.
 * Collectives wait for what the other ranks enqueue later. With several runtimes in the process,
 * another device's stream may wait for a point of these streams (a peer copy, a block read across
 * devices), and a later event standing in for that point could cover these collectives while the
 * waiter's rank, on a thread of its own, has not posted its part yet: a deadlock. So the streams'
 * waits stay exact (weft__tracker_exact) unless the posting spans every runtime of the process
 * (`devices` of them: a group over the process's ranks from one thread posts every local part
 * together, before any later wait). With one runtime no wait crosses devices, and over-waiting a
 * rank's own posted collectives cannot deadlock where NCCL's ordering rules hold. */
static weft_status_t note_posting(weft_stream_t *const *s, size_t n, size_t devices) {
  /* (A graph is launched per rank, never together: noted whatever the posting spanned.) */
  for (size_t i = 0; i < n; i++)
    if (weft__tracker_in_capture(s[i])) weft__capture_note_collective(s[i]);
  if (devices >= weft__tracker_runtimes()) return WEFT_OK;
  for (size_t i = 0; i < n; i++) {
    weft_status_t st = weft__tracker_exact(s[i]);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

/* A refused call inside a group: the group's end refuses the whole group with the first one. */
static weft_status_t group_refuse(weft_status_t st) {
  if (g_group_error == WEFT_OK) {
    g_group_error = st;
    snprintf(g_group_message, sizeof g_group_message, "%s", weft_last_error());
  }
  return st;
}

/* A checked call: run now as one use of its stream. */
static weft_status_t post_one(const call_t *k) {
  const weft__nccl_t *nl;
  weft_status_t st = weft__nccl_get(&nl);
  if (st == WEFT_OK) st = note_posting(&k->s, 1, 1);
  if (st != WEFT_OK) return st;
  weft_access_t acc[3];
  for (unsigned i = 0; i < k->nuses; i++) acc[i] = (weft_access_t){{k->rec[i], k->use[i].gen}, (weft_access_kind_t)k->use[i].kind};
  return weft__use_run(k->s, acc, k->nuses, kind_name[k->kind], run_one, (void *)k);
}

/* Takes checked call k, made in place at g_calls[g_ncalls], into the open group, and what the
 * calls add up to (g_shared_stream, g_runtimes, g_gate). */
static void call_note(const call_t *k) {
  bool new_stream = true, new_runtime = true;
  for (size_t i = 0; i < g_ncalls && new_stream; i++) {
    new_stream = g_calls[i].s != k->s;
    new_runtime &= g_calls[i].s->runtime != k->s->runtime;
  }
  g_shared_stream |= !new_stream;
  g_runtimes += new_stream && new_runtime;
  g_gate |= weft__driver_gate_devices(k->s->tr->ctx);
  g_ncalls++;
}

/* ---- collectives ---- */

/* A collective call inside c (weft__handle_enter): a concurrent weft_comm_destroy waits until the
 * call has enqueued its operation, or, in a group, until the group's end (group_enter). */
static weft_status_t collective(coll_kind_t kind, int op_or_root, weft_comm_t *c, weft_stream_t *s, weft_block_t send,
                                size_t send_offset, weft_block_t recv, size_t recv_offset, size_t count,
                                weft_dtype_t dt) {
  const char *fn = kind_name[kind];
  drop_orphaned_group();
  bool grouped = g_depth > 0, stay = false;
  call_t one, *k = &one; /* (not cleared: prepare fills what is read) */
  weft_status_t st;
  /* In a group: recorded in place for the group's end (call_note), inside c until then where
   * it can stay. */
  if (grouped && (st = calls_room(fn)) == WEFT_OK && (st = group_enter(c, fn, &stay)) == WEFT_OK) k = &g_calls[g_ncalls];
  else if (!grouped) st = comm_enter(c, fn);
  if (st != WEFT_OK) return grouped ? group_refuse(st) : st;
  k->kind = kind;
  k->op = (ncclRedOp_t)op_or_root;
  k->root_or_peer = op_or_root;
  st = prepare(k, c, s, send, send_offset, recv, recv_offset, count, dt);
  if (st == WEFT_OK && grouped) call_note(k);
  else if (st == WEFT_OK) st = post_one(k);
  if (!stay) weft__handle_leave();
  return st != WEFT_OK && grouped ? group_refuse(st) : st;
}

weft_status_t weft_all_reduce(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv,
                              size_t recv_offset, size_t count, weft_dtype_t dt, weft_redop_t op, weft_stream_t *s) {
  return collective(C_ALLREDUCE, (int)op, c, s, send, send_offset, recv, recv_offset, count, dt);
}

weft_status_t weft_broadcast(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv,
                             size_t recv_offset, size_t count, weft_dtype_t dt, int root, weft_stream_t *s) {
  return collective(C_BROADCAST, root, c, s, send, send_offset, recv, recv_offset, count, dt);
}

weft_status_t weft_reduce_scatter(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv,
                                  size_t recv_offset, size_t recv_count, weft_dtype_t dt, weft_redop_t op,
                                  weft_stream_t *s) {
  return collective(C_REDUCESCATTER, (int)op, c, s, send, send_offset, recv, recv_offset, recv_count, dt);
}

weft_status_t weft_all_gather(weft_comm_t *c, weft_block_t send, size_t send_offset, weft_block_t recv,
                              size_t recv_offset, size_t send_count, weft_dtype_t dt, weft_stream_t *s) {
  return collective(C_ALLGATHER, 0, c, s, send, send_offset, recv, recv_offset, send_count, dt);
}

weft_status_t weft_send(weft_comm_t *c, weft_block_t send, size_t send_offset, size_t count, weft_dtype_t dt, int peer,
                        weft_stream_t *s) {
  return collective(C_SEND, peer, c, s, send, send_offset, (weft_block_t){0}, 0, count, dt);
}

weft_status_t weft_recv(weft_comm_t *c, weft_block_t recv, size_t recv_offset, size_t count, weft_dtype_t dt, int peer,
                        weft_stream_t *s) {
  return collective(C_RECV, peer, c, s, (weft_block_t){0}, 0, recv, recv_offset, count, dt);
}

/* ---- groups ---- */

weft_status_t weft_comm_group_begin(void) {
  drop_orphaned_group();
  if (g_ending) /* (a capture handler that weft_comm_group_end runs) */
    return weft__error(WEFT_ERR_BUSY, "weft_comm_group_begin: inside this thread's weft_comm_group_end (a capture handler)");
  if (g_depth++ == 0) {
    g_ncalls = 0;
    g_group_error = WEFT_OK;
    g_shared_stream = false;
    g_runtimes = 0;
    g_gate = 0;
  }
  return WEFT_OK;
}

/* Groups of at most SMALL_GROUP calls, the common case, need no heap memory at their end (with
 * no thread cache in weft's arena, an allocation and free per group end cost microseconds). */
#define SMALL_GROUP 16

/* The joint use of a group's streams (weft__use_joint_uses' arguments): per stream, once in call
 * order, s[j] and its calls' accesses, one use per block with the kinds merged, in
 * per[j][0..n[j]) of `uses`. Room for one stream per call and three accesses per call: in `small`
 * for up to SMALL_GROUP calls, else in one block of metadata memory (`heap`). */
typedef struct group_uses {
  weft_stream_t **s;
  weft__use_t **per;
  size_t *n;
  weft__use_t *uses;
  size_t k; /* streams */
  void *heap;
  struct {
    weft_stream_t *s[SMALL_GROUP];
    weft__use_t *per[SMALL_GROUP];
    size_t n[SMALL_GROUP];
    weft__use_t uses[3 * SMALL_GROUP];
  } small;
} group_uses_t;

static weft_status_t group_room(group_uses_t *g, size_t ncalls) {
  g->k = 0;
  g->heap = NULL;
  if (ncalls <= SMALL_GROUP) {
    g->s = g->small.s;
    g->per = g->small.per;
    g->n = g->small.n;
    g->uses = g->small.uses;
    return WEFT_OK;
  }
  /* Carved from one block: uses, then s, per and n, each a whole number of pointer-aligned words. */
  _Static_assert(sizeof(weft__use_t) % _Alignof(void *) == 0 && sizeof(size_t) == sizeof(void *),
                 "group_room carves pointer-aligned arrays");
  size_t one = sizeof *g->s + sizeof *g->per + sizeof *g->n + 3 * sizeof *g->uses;
  char *p = ncalls <= SIZE_MAX / one ? weft__meta_alloc(ncalls * one) : NULL;
  if (p == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_comm_group_end: no host memory");
  g->heap = p;
  g->uses = (weft__use_t *)(void *)p;
  g->s = (weft_stream_t **)(void *)(p + 3 * ncalls * sizeof *g->uses);
  g->per = (weft__use_t **)(void *)(p + ncalls * (3 * sizeof *g->uses + sizeof *g->s));
  g->n = (size_t *)(void *)(p + ncalls * (3 * sizeof *g->uses + sizeof *g->s + sizeof *g->per));
  return WEFT_OK;
}

/* Whether every block the group's calls access is still the live block the call resolved (one
 * freed since its call makes the group fail: STALE_HANDLE, from weft__block_check). */
static weft_status_t group_blocks_live(const call_t *calls, size_t ncalls) {
  for (size_t i = 0; i < ncalls; i++)
    for (unsigned x = 0; x < calls[i].nuses; x++) {
      const weft__use_t *u = &calls[i].use[x];
      if (__builtin_expect(weft__block_life(calls[i].rec[x]) == WEFT__LIFE(u->gen, WEFT__BLOCK_LIVE), 1)) continue;
      struct weft__block *rec;
      weft_status_t st = weft__block_check((weft_block_t){calls[i].rec[x], u->gen}, "weft_comm_group_end", &rec);
      return st != WEFT_OK ? st : weft__error(WEFT_ERR_STALE_HANDLE, "weft_comm_group_end: call %zu's block was freed", i + 1);
    }
  return WEFT_OK;
}

/* Fills g (room for ncalls) with the group's streams and their calls' uses: where no stream has
 * two calls (g_shared_stream), each call's own; else per stream, one use per block with the
 * kinds merged. */
static void group_uses(group_uses_t *g, call_t *calls, size_t ncalls) {
  if (!g_shared_stream) {
    for (size_t i = 0; i < ncalls; i++) {
      g->s[i] = calls[i].s;
      g->per[i] = calls[i].use;
      g->n[i] = calls[i].nuses;
    }
    g->k = ncalls;
    return;
  }
  size_t m = 0;
  for (size_t i = 0; i < ncalls; i++) {
    weft_stream_t *s = calls[i].s;
    size_t j = 0;
    while (j < g->k && g->s[j] != s) j++;
    if (j < g->k) continue; /* taken with its stream's first call */
    size_t first = m;
    for (size_t c = i; c < ncalls; c++) {
      if (calls[c].s != s) continue;
      for (unsigned x = 0; x < calls[c].nuses; x++) {
        const weft__use_t *u = &calls[c].use[x];
        size_t t = first;
        while (t < m && g->uses[t].state != u->state) t++;
        if (t < m) g->uses[t].kind |= u->kind;
        else g->uses[m++] = *u;
      }
    }
    g->s[j] = s;
    g->per[j] = g->uses + first;
    g->n[j] = m - first;
    g->k++;
  }
}

/* The group's NCCL calls, one NCCL group (fn of the group's joint use). */
typedef struct group_run {
  const weft__nccl_t *nl;
  const call_t *calls;
  size_t n;
  weft__gate_devices_t devices; /* whose gates the group enters */
} group_run_t;

static weft_status_t run_group(weft_stream_t *s, void *arg) {
  (void)s;
  const group_run_t *g = arg;
  for (size_t i = 0; i < g->n; i++) {
    weft_status_t st = caps_note(g->calls[i].c, g->calls[i].s, "weft_comm_group_end");
    if (st != WEFT_OK) return st;
  }
  /* The whole group in the shared side of its devices' gates: NCCL enqueues at its end. */
  weft__gate_enter(g->devices);
  ncclResult_t r = g->nl->ncclGroupStart();
  for (size_t i = 0; r == ncclSuccess && i < g->n; i++) r = enqueue_gated(g->nl, &g->calls[i]);
  ncclResult_t e = g->nl->ncclGroupEnd();
  weft__gate_leave();
  if (r == ncclSuccess) r = e;
  return r == ncclSuccess ? WEFT_OK : weft__nccl_fail(g->nl, r, "weft_comm_group_end");
}

/* Lets go of the communicators the group's end holds (call_t.holds) among calls[0..n). */
static void unhold(call_t *calls, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (calls[i].holds) {
      calls[i].holds = false;
      weft__handle_hold(calls[i].c, WEFT__HANDLE_COMM, -1);
    }
}

/* The work of the outermost weft_comm_group_end: the open group's ncalls calls (g_calls) run as
 * one joint use, or nothing happens (the group's first refused call, a communicator or block gone
 * since). The caller leaves the kept communicators afterwards. */
static weft_status_t end_group(size_t ncalls) {
  if (g_group_error != WEFT_OK) return weft__error(g_group_error, "weft_comm_group_end: %s", g_group_message);
  /* The group is inside its communicators since their first calls (g_held), so none was
   * destroyed since. One it could not stay inside is held now for the end (weft__handle_hold: a
   * destroy meanwhile is BUSY; no entry, which past a thread's few would take the handle set's
   * lock across the end, and a capture handler's destroy or creation would wait on it for ever).
   * It may have been destroyed since its call, and another made at its address: then the group
   * enqueues nothing. The calls' blocks are looked at again (group_blocks_live), their streams
   * checked again by weft__use_joint_uses. */
  for (size_t i = 0; i < ncalls; i++) {
    call_t *k = &g_calls[i];
    k->holds = false;
    uint64_t kept = held_serial(k->c);
    if (kept != 0 && kept != k->serial) { /* kept since: a new communicator at the call's one's address */
      unhold(g_calls, i);
      return weft__error(WEFT_ERR_STALE_HANDLE, "weft_comm_group_end: call %zu of the group: %s: the communicator was "
                         "destroyed since the call", i + 1, kind_name[k->kind]);
    }
    if (kept != 0) continue;
    size_t j = 0;
    while (j < i && (g_calls[j].c != k->c || g_calls[j].serial != k->serial)) j++;
    if (j < i) continue; /* held already */
    const char *fn = kind_name[k->kind];
    bool got = weft__handle_hold(k->c, WEFT__HANDLE_COMM, +1);
    weft_status_t bad = !got || k->c->serial != k->serial /* (another communicator at its address) */
                            ? weft__error(WEFT_ERR_STALE_HANDLE, "%s: the communicator was destroyed since the call", fn)
                            : runtime_alive(k->c, fn);
    if (bad == WEFT_OK) k->holds = true;
    else {
      if (got) weft__handle_hold(k->c, WEFT__HANDLE_COMM, -1);
      char why[512];
      snprintf(why, sizeof why, "%s", weft_last_error());
      unhold(g_calls, i);
      return weft__error(bad, "weft_comm_group_end: call %zu of the group: %s", i + 1, why);
    }
  }
  if (ncalls == 0) return WEFT_OK;
  const weft__nccl_t *nl;
  weft_status_t st = weft__nccl_get(&nl);
  group_uses_t g; /* (not cleared: its small arrays are large; group_room sets what is read) */
  if (st == WEFT_OK) st = group_blocks_live(g_calls, ncalls);
  if (st == WEFT_OK) st = group_room(&g, ncalls);
  if (st == WEFT_OK) {
    /* One use per stream (the union of its calls' accesses), all around the one NCCL group. */
    group_uses(&g, g_calls, ncalls);
    st = note_posting(g.s, g.k, g_runtimes);
    group_run_t run = {nl, g_calls, ncalls, g_gate};
    if (st == WEFT_OK) st = weft__use_joint_uses(g.s, g.per, g.n, g.k, "weft_comm_group_end", run_group, &run);
    if (g.heap != NULL) weft__meta_free(g.heap);
  }
  unhold(g_calls, ncalls);
  return st;
}

weft_status_t weft_comm_group_end(void) {
  drop_orphaned_group();
  if (g_depth == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_comm_group_end: no weft_comm_group_begin");
  if (--g_depth > 0) return WEFT_OK;
  g_ending = true; /* (the calls stay in g_calls until the end returns) */
  weft_status_t st = end_group(g_ncalls);
  group_leave();
  g_ncalls = 0;
  g_ending = false;
  return st;
}

/* ---- communicators ---- */

/* The default stream of a runtime's collectives: its last high-priority pool stream, else its
 * last pool stream. */
static weft_stream_t *comm_stream(weft_runtime_t *rt) {
  weft_stream_t *s = NULL;
  unsigned n = rt->tracker.n_pool;
  if (weft_stream_get(rt, n - 1, &s) != WEFT_OK) return NULL;
  return s;
}

/* Frees communicator c's memory (no longer a handle). */
static void comm_free(weft_comm_t *c) {
  pthread_mutex_destroy(&c->caps_lock);
  weft__meta_free(c->caps);
  weft__meta_free(c);
}

static weft_status_t comm_new(weft_runtime_t *rt, ncclComm_t nc, bool adopted, const weft__nccl_t *nl,
                              weft_comm_t **out) {
  static atomic_uint_least64_t made;
  weft_comm_t *c = weft__meta_calloc(1, sizeof *c);
  if (c == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_comm: no host memory");
  c->serial = atomic_fetch_add_explicit(&made, 1, memory_order_relaxed) + 1;
  c->rt = rt;
  c->nc = nc;
  c->adopted = adopted;
  c->stream = comm_stream(rt);
  if (pthread_mutex_init(&c->caps_lock, NULL) != 0) {
    weft__meta_free(c);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_comm: no mutex");
  }
  ncclResult_t r = nl->ncclCommUserRank(nc, &c->rank);
  if (r == ncclSuccess) r = nl->ncclCommCount(nc, &c->nranks);
  if (r != ncclSuccess) {
    comm_free(c);
    return weft__nccl_fail(nl, r, "weft_comm: ncclCommUserRank / ncclCommCount");
  }
  weft_status_t st = weft_alloc(rt, 4, c->stream, "weft.comm.order", &c->order);
  if (st != WEFT_OK) {
    comm_free(c);
    return st;
  }
  c->order_rec = weft__block_live(c->order, rt);
  if (!weft__handle_add(c, WEFT__HANDLE_COMM)) {
    if (weft_free(c->order, c->stream) != WEFT_OK) { /* (the handle failure is the one to report) */
    }
    comm_free(c);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_comm: no host memory for a handle");
  }
  weft__runtime_depend(rt, 1);
  *out = c;
  return WEFT_OK;
}

/* Connects communicators c[0..n) (the ranks of this process): NCCL makes a communicator's
 * collective connections at its first collective, with CUDA calls a GLOBAL capture does not
 * permit (ncclInternalError, the capture invalidated: tests/conformance/conformance_nccl.c), so
 * weft makes one now, eagerly (an all-reduce of one element on each communicator's stream, in one
 * group), and a program's first collective may be captured in any mode, as after PyTorch's
 * warm-up iterations. (Send and receive connect apart, at a communicator's first; weft.h.) */
static weft_status_t connect_eagerly(weft_comm_t *const *c, int n) {
  weft_block_t *b = weft__meta_calloc((size_t)n, sizeof *b);
  if (b == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "connecting the communicators: no host memory");
  int made = 0;
  weft_status_t st = WEFT_OK;
  for (; made < n; made++) {
    if ((st = weft_alloc(c[made]->rt, 256, c[made]->stream, "weft.comm.connect", &b[made])) != WEFT_OK) break;
    if ((st = weft_memset32(c[made]->stream, b[made], 0, 0, 256)) != WEFT_OK) {
      made++;
      break;
    }
  }
  if (st == WEFT_OK && (st = weft_comm_group_begin()) == WEFT_OK) {
    for (int i = 0; i < n && st == WEFT_OK; i++)
      st = weft_all_reduce(c[i], b[i], 0, b[i], 0, 1, WEFT_FLOAT32, WEFT_SUM, NULL);
    weft_status_t end = weft_comm_group_end(); /* ends the group also after a refused call */
    if (st == WEFT_OK) st = end;
  }
  char why[512];
  if (st != WEFT_OK) snprintf(why, sizeof why, "%s", weft_last_error());
  for (int i = 0; i < made; i++)
    if (weft_free(b[i], c[i]->stream) != WEFT_OK) { /* (freed with its runtime then) */
    }
  weft__meta_free(b);
  return st == WEFT_OK ? st : weft__error(st, "connecting the communicators (an eager all-reduce): %s", why);
}

/* A communicator is made outside the calling thread's groups: its eager connection is a group of
 * its own (connect_eagerly), which an open group would swallow until its end, after the
 * connection's buffers are freed (and which a group being ended refuses: g_ending). */
static weft_status_t outside_groups(const char *fn) {
  return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: inside an open weft_comm_group_begin: end the group first", fn);
}

/* Makes rt's context current for NCCL (which works on the current device). */
static weft_status_t bind(weft_runtime_t *rt, const char *fn) {
  if (weft__runtime_check(rt, fn) == NULL) return weft__runtime_check_status(rt);
  return weft__tracker_bind(&rt->tracker);
}

weft_status_t weft_comm_unique_id(weft_comm_id_t *out) {
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_comm_unique_id: out is NULL");
  const weft__nccl_t *nl;
  weft_status_t st = weft__nccl_get(&nl);
  if (st != WEFT_OK) return st;
  _Static_assert(sizeof(ncclUniqueId) == sizeof(weft_comm_id_t), "weft_comm_id_t is ncclUniqueId");
  ncclUniqueId id;
  ncclResult_t r = nl->ncclGetUniqueId(&id);
  if (r != ncclSuccess) return weft__nccl_fail(nl, r, "weft_comm_unique_id");
  memcpy(out->bytes, id.internal, sizeof out->bytes);
  return WEFT_OK;
}

weft_status_t weft_comm_init_rank(weft_runtime_t *rt, int nranks, const weft_comm_id_t *id, int rank, weft_comm_t **out) {
  static const char fn[] = "weft_comm_init_rank";
  if (id == NULL || out == NULL || nranks <= 0 || rank < 0 || rank >= nranks)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: NULL id or out, or rank %d not in 0..%d", fn, rank, nranks - 1);
  if (g_depth > 0 || g_ending) return outside_groups(fn);
  const weft__nccl_t *nl;
  weft_status_t st = bind(rt, fn);
  if (st == WEFT_OK) st = weft__nccl_get(&nl);
  if (st != WEFT_OK) return st;
  ncclUniqueId nid;
  memcpy(nid.internal, id->bytes, sizeof nid.internal);
  ncclComm_t nc;
  ncclResult_t r = nl->ncclCommInitRank(&nc, nranks, nid, rank);
  if (r != ncclSuccess) return weft__nccl_fail(nl, r, fn);
  if ((st = comm_new(rt, nc, false, nl, out)) != WEFT_OK) {
    (void)nl->ncclCommDestroy(nc);
    return st;
  }
  if ((st = connect_eagerly(out, 1)) != WEFT_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", weft_last_error());
    (void)weft_comm_destroy(*out);
    *out = NULL;
    return weft__error(st, "%s: %s", fn, why);
  }
  return st;
}

weft_status_t weft_comm_init_all(weft_runtime_t *const *rts, int n, weft_comm_t **out) {
  static const char fn[] = "weft_comm_init_all";
  if (rts == NULL || out == NULL || n <= 0)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: NULL runtimes or out, or n <= 0", fn);
  if (g_depth > 0 || g_ending) return outside_groups(fn);
  const weft__nccl_t *nl;
  weft_status_t st = weft__nccl_get(&nl);
  int *devs = st == WEFT_OK ? weft__meta_calloc((size_t)n, sizeof *devs) : NULL;
  ncclComm_t *nc = st == WEFT_OK ? weft__meta_calloc((size_t)n, sizeof *nc) : NULL;
  if (st == WEFT_OK && (devs == NULL || nc == NULL)) st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", fn);
  for (int i = 0; st == WEFT_OK && i < n; i++) {
    if (weft__runtime_check(rts[i], fn) == NULL) {
      st = weft__runtime_check_status(rts[i]);
      break;
    }
    devs[i] = rts[i]->ordinal;
    for (int j = 0; j < i; j++)
      if (devs[j] == devs[i]) st = weft__error(WEFT_ERR_WRONG_DEVICE, "%s: runtimes %d and %d are of one device", fn, j, i);
  }
  if (st == WEFT_OK) st = bind(rts[0], fn);
  if (st == WEFT_OK) {
    ncclResult_t r = nl->ncclCommInitAll(nc, n, devs);
    if (r != ncclSuccess) st = weft__nccl_fail(nl, r, fn);
  }
  int made = 0; /* communicators made (out[0..made)) */
  while (st == WEFT_OK && made < n)
    if ((st = comm_new(rts[made], nc[made], false, nl, &out[made])) == WEFT_OK) made++;
  if (st == WEFT_OK && (st = connect_eagerly(out, n)) != WEFT_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", weft_last_error());
    st = weft__error(st, "%s: %s", fn, why);
  }
  if (st != WEFT_OK && nc != NULL && nc[0] != NULL) {
    for (int i = 0; i < made; i++) {
      weft__handle_remove(out[i], WEFT__HANDLE_COMM);
      weft__runtime_depend(rts[i], -1);
      comm_free(out[i]);
      out[i] = NULL;
    }
    for (int i = 0; i < n; i++) (void)nl->ncclCommDestroy(nc[i]);
  }
  weft__meta_free(devs);
  weft__meta_free(nc);
  return st;
}

weft_status_t weft_comm_adopt(weft_runtime_t *rt, void *nccl_comm, weft_comm_t **out) {
  static const char fn[] = "weft_comm_adopt";
  if (nccl_comm == NULL || out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: NULL communicator or out", fn);
  if (weft__runtime_check(rt, fn) == NULL) return weft__runtime_check_status(rt);
  const weft__nccl_t *nl;
  weft_status_t st = weft__nccl_get(&nl);
  if (st != WEFT_OK) return st;
  int dev = -1;
  ncclResult_t r = nl->ncclCommCuDevice((ncclComm_t)nccl_comm, &dev);
  if (r != ncclSuccess) return weft__nccl_fail(nl, r, fn);
  if (dev != rt->ordinal)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "%s: the communicator is on device %d, the runtime on %d", fn, dev, rt->ordinal);
  return comm_new(rt, (ncclComm_t)nccl_comm, true, nl, out);
}

weft_status_t weft_comm_destroy(weft_comm_t *c) {
  static const char fn[] = "weft_comm_destroy";
  if (c == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: the communicator is NULL", fn);
  drop_orphaned_group();
  /* This thread's open group, or the group it is ending (a capture handler that the end runs),
   * calls on c: its end needs c. (A communicator it stays inside is refused by the removal.) */
  bool in_group = false;
  size_t i = 0;
  while ((g_depth > 0 || g_ending) && i < g_ncalls && g_calls[i].c != c) i++;
  if ((g_depth > 0 || g_ending) && i < g_ncalls && weft__handle_enter(c, WEFT__HANDLE_COMM)) {
    /* A call's communicator, or one made since at its address (the call's destroyed meanwhile). */
    uint64_t serial = c->serial;
    weft__handle_leave();
    for (; i < g_ncalls && !in_group; i++) in_group = g_calls[i].c == c && g_calls[i].serial == serial;
  }
  if (in_group) return weft__error(WEFT_ERR_BUSY, "%s: this thread's open group calls on it: end the group first", fn);
  weft_status_t unlisted =
      weft__handle_unlist(c, WEFT__HANDLE_COMM, fn, "communicator", "another thread's group is ending with a call on it");
  if (unlisted != WEFT_OK) return unlisted;
  /* Not while a capture holding its collectives is open: its graph would name a destroyed NCCL
   * communicator (the capture's owner ends it first, then destroys). */
  pthread_mutex_lock(&c->caps_lock);
  size_t graphs = c->ncaps > 0 && weft__tracker_bind(&c->rt->tracker) == WEFT_OK ? caps_prune(c) : 0;
  size_t open = c->ncaps - graphs;
  unsigned on = c->ncaps > 0 ? c->caps[0].s->index : 0;
  pthread_mutex_unlock(&c->caps_lock);
  if (open > 0 || graphs > 0) {
    weft__handle_restore(c, WEFT__HANDLE_COMM);
    if (graphs == 0)
      return weft__error(WEFT_ERR_BUSY, "%s: %zu open capture(s) hold its collectives (one on stream %u): end them first",
                         fn, open, on);
    /* NCCL's ncclCommDestroy would wait until the graphs are destroyed: for ever on this thread. */
    return weft__error(WEFT_ERR_BUSY, "%s: %zu open capture(s) and %zu weft graph(s) hold its collectives: end the "
                       "captures and destroy the graphs (and their execs) first", fn, open, graphs);
  }
  if (!c->adopted) {
    const weft__nccl_t *nl;
    weft_status_t st = weft__nccl_get(&nl);
    ncclResult_t r = st == WEFT_OK ? nl->ncclCommDestroy(c->nc) : ncclSuccess;
    if (st != WEFT_OK || r != ncclSuccess) {
      weft__handle_restore(c, WEFT__HANDLE_COMM);
      return st != WEFT_OK ? st : weft__nccl_fail(nl, r, fn);
    }
  }
  if (weft_free(c->order, c->stream) != WEFT_OK) { /* (a block of the runtime: freed with it then) */
  }
  weft__runtime_depend(c->rt, -1);
  comm_free(c);
  return WEFT_OK;
}

/* The accessors read c inside it (a concurrent weft_comm_destroy waits). */
int weft_comm_rank(const weft_comm_t *c) {
  if (comm_enter(c, "weft_comm_rank") != WEFT_OK) return -1;
  int r = c->rank;
  weft__handle_leave();
  return r;
}
int weft_comm_size(const weft_comm_t *c) {
  if (comm_enter(c, "weft_comm_size") != WEFT_OK) return -1;
  int n = c->nranks;
  weft__handle_leave();
  return n;
}
weft_runtime_t *weft_comm_runtime(const weft_comm_t *c) {
  if (comm_enter(c, "weft_comm_runtime") != WEFT_OK) return NULL;
  weft_runtime_t *rt = c->rt;
  weft__handle_leave();
  return rt;
}
weft_stream_t *weft_comm_stream(const weft_comm_t *c) {
  if (comm_enter(c, "weft_comm_stream") != WEFT_OK) return NULL;
  weft_stream_t *s = c->stream;
  weft__handle_leave();
  return s;
}

static weft_status_t check_inside(weft_comm_t *c) {
  const weft__nccl_t *nl;
  weft_status_t st = weft__nccl_get(&nl);
  if (st != WEFT_OK) return st;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = nl->ncclCommGetAsyncError(c->nc, &async);
  if (r != ncclSuccess) return weft__nccl_fail(nl, r, "weft_comm_check");
  return async == ncclSuccess ? WEFT_OK : weft__nccl_fail(nl, async, "weft_comm_check (asynchronous error)");
}

weft_status_t weft_comm_check(weft_comm_t *c) {
  weft_status_t st = comm_enter(c, "weft_comm_check");
  if (st != WEFT_OK) return st;
  st = check_inside(c);
  weft__handle_leave();
  return st;
}
