/* The live-handle set (handle.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "lib/core/container.h"
#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/handle.h"
#include "lib/core/meta.h"

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static weft__map_t g_live; /* address -> its value (below) */

/* A handle's value: its kind, DEAD once destroyed, and above HOLDER_SHIFT how many objects hold
 * it (weft__handle_hold). */
#define DEAD 0x100u
#define STATE 0x1ffu /* kind | DEAD */
#define HOLDER_SHIFT 16

/* weft__handle_live's fast path: each thread remembers its last few positive answers, with the
 * number of removals the set had seen when they were taken. While no handle was removed
 * since, the object is still live (adds and restores never make a live object dead), so a hot
 * call (a collective's communicator, a replayed exec) reads one shared counter, which nobody
 * writes in steady state, instead of taking the set's lock (an atomic read-modify-write on one
 * line for every thread of the process). */
static atomic_uint_least64_t g_removals;

typedef struct seen {
  const void *p;
  unsigned kind;
} seen_t;

/* The answers are kept all alike (any SEEN objects, wherever they lie: a direct-mapped memory
 * indexed by address bits kept one of a group's two communicators, whose addresses differed by a
 * size class's multiple of 4 KiB, and each call took the lock), the oldest replaced first; all
 * were taken at tls_seen_removals removals, and a different count makes them all stale. */
#define SEEN 8
static _Thread_local seen_t tls_seen[SEEN];
static _Thread_local uint64_t tls_seen_removals;
static _Thread_local unsigned tls_seen_next; /* the slot the next answer takes */

/* Whether this thread remembers p live as of `removals` (then it still is). */
static inline bool seen_live(const void *p, weft__handle_kind_t kind, uint64_t removals) {
  if (tls_seen_removals != removals) return false;
  for (unsigned i = 0; i < SEEN; i++)
    if (tls_seen[i].p == p && tls_seen[i].kind == (unsigned)kind) return true;
  return false;
}

/* Remembers p live as of `removals` (read before the lookup that found it). */
static void seen_note(const void *p, weft__handle_kind_t kind, uint64_t removals) {
  if (tls_seen_removals != removals) {
    memset(tls_seen, 0, sizeof tls_seen);
    tls_seen_removals = removals;
    tls_seen_next = 0;
  }
  tls_seen[tls_seen_next] = (seen_t){p, (unsigned)kind};
  tls_seen_next = (tls_seen_next + 1) % SEEN;
}

/* The calling thread holds the set's lock as a reader (weft__handle_enter with no record: no host
 * memory for one): taking it as a writer would wait for ever, so such a thread makes and destroys
 * no object until it leaves. */
static _Thread_local unsigned tls_locked;  /* entries made under the set's lock (no record) */

bool weft__handle_add(const void *p, weft__handle_kind_t kind) {
  if (tls_locked > 0) return false;
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_insert(&g_live, (uint64_t)(uintptr_t)p, NULL);
  if (v != NULL) *v = kind;
  pthread_rwlock_unlock(&g_lock);
  return v != NULL;
}

static _Thread_local unsigned long tls_lookups; /* (weft__handle_lookups) */

unsigned long weft__handle_lookups(void) { return tls_lookups; }

/* weft__handle_live's slow path: the set, under its lock; a positive answer is remembered with
 * `removals`, read before the lookup (a removal after that load makes the answer stale). */
static bool live_locked(const void *p, weft__handle_kind_t kind, uint64_t removals) {
  tls_lookups++;
  pthread_rwlock_rdlock(&g_lock);
  const uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  bool live = v != NULL && (*v & STATE) == kind;
  pthread_rwlock_unlock(&g_lock);
  if (live) seen_note(p, kind, removals);
  return live;
}

bool weft__handle_live(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return false;
  uint64_t removals = atomic_load_explicit(&g_removals, memory_order_acquire);
  return seen_live(p, kind, removals) || live_locked(p, kind, removals);
}

static void wait_outside(const void *p);

weft__handle_removal_t weft__handle_remove_unheld(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return WEFT__HANDLE_NOT_LIVE;
  /* This thread's own entries, before the lock (an entry with no record holds it as a reader): p
   * is live, or dead with a removal waiting for this thread. */
  if (weft__handle_inside(p) || tls_locked > 0) return WEFT__HANDLE_INSIDE;
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  weft__handle_removal_t r = v == NULL || (*v & STATE) != kind ? WEFT__HANDLE_NOT_LIVE
                             : (*v >> HOLDER_SHIFT) != 0      ? WEFT__HANDLE_HELD
                                                              : WEFT__HANDLE_REMOVED;
  if (r == WEFT__HANDLE_REMOVED) {
    *v = kind | DEAD;
    atomic_fetch_add_explicit(&g_removals, 1, memory_order_seq_cst); /* every thread's answers go stale */
  }
  pthread_rwlock_unlock(&g_lock);
  if (r == WEFT__HANDLE_REMOVED) wait_outside(p); /* (entries under the lock are gone already) */
  return r;
}

bool weft__handle_remove(const void *p, weft__handle_kind_t kind) {
  return weft__handle_remove_unheld(p, kind) == WEFT__HANDLE_REMOVED;
}

weft_status_t weft__handle_unlist(const void *p, weft__handle_kind_t kind, const char *fn, const char *what,
                                  const char *held) {
  switch (weft__handle_remove_unheld(p, kind)) {
    case WEFT__HANDLE_REMOVED: return WEFT_OK;
    case WEFT__HANDLE_NOT_LIVE: return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the %s was destroyed already", fn, what);
    case WEFT__HANDLE_HELD: return weft__error(WEFT_ERR_BUSY, "%s: the %s: %s", fn, what, held);
    default:
      return weft__error(WEFT_ERR_BUSY,
                         "%s: a call of this thread is inside the %s (its open group, or a capture handler that a "
                         "call on it runs): end that first",
                         fn, what);
  }
}

/* ---- calls inside an object (weft__handle_enter) -------------------------------------------------
 * Hazard pointers: each thread that enters an object takes a record for good (given back when it
 * ends) and publishes the object in it. A removal marks the object dead and counts a removal,
 * then (after a full fence; the entering thread's publication and its second read of the count
 * are seq_cst, an xchg and a load on x86) looks through the records: either the entering thread
 * sees the removal and fails, or the removal sees the publication and waits for it to go.
 * Records: WEFT__HANDLE_THREADS static ones, then chunks of MORE made on demand (never freed: a
 * removal may be reading one) for more threads inside at once. A thread nested past
 * WEFT__HANDLE_DEPTH takes one more record per WEFT__HANDLE_DEPTH entries (LEVELS at most). Only a
 * thread that can get no record (no host memory for a chunk, or no thread-exit destructor to give
 * it back) holds the set's lock as a reader instead, until it leaves. */
typedef struct inside {
  _Atomic(const void *) p[WEFT__HANDLE_DEPTH];   /* nested entries of one level, innermost last */
  _Atomic(const void *) kept[WEFT__HANDLE_KEPT]; /* kept entries (level 0 only), any slot (NULL: free) */
  atomic_bool taken;
} inside_t;

#define MORE 256 /* records per chunk past the static ones */
#define LEVELS WEFT__HANDLE_LEVELS
_Static_assert(LEVELS * WEFT__HANDLE_DEPTH <= 32, "tls_locked_at has a bit per nested entry");

typedef struct chunk {
  struct chunk *next;
  inside_t rec[MORE];
} chunk_t;

static inside_t g_inside[WEFT__HANDLE_THREADS];
static atomic_uint g_inside_top;      /* static records ever taken: a scan stops there */
static _Atomic(chunk_t *) g_chunks;   /* chunks, newest first (pushed, never removed) */
static pthread_key_t g_inside_key;
static pthread_once_t g_inside_once = PTHREAD_ONCE_INIT;
static _Thread_local inside_t *tls_rec[LEVELS]; /* [k]: entries k * DEPTH .. (k + 1) * DEPTH - 1 */
static _Thread_local unsigned tls_depth;   /* nested entries published in tls_rec */
static _Thread_local unsigned tls_kept;    /* kept entries published in tls_rec[0] */
static _Thread_local uint32_t tls_locked_at; /* bit d: entry d holds the lock */
static _Thread_local const void *tls_locked_p[32]; /* [d]: what entry d (holding the lock) entered */

/* Gives a record back (its slots emptied). Release: a removal that sees a slot empty sees every
 * read the thread made inside. */
static void record_free(inside_t *h) {
  for (unsigned d = 0; d < WEFT__HANDLE_DEPTH; d++) atomic_store_explicit(&h->p[d], NULL, memory_order_release);
  for (unsigned d = 0; d < WEFT__HANDLE_KEPT; d++) atomic_store_explicit(&h->kept[d], NULL, memory_order_release);
  atomic_store_explicit(&h->taken, false, memory_order_release);
}

/* The ending thread's records, given back: entries it still published (a group it never ended)
 * end with it, so that no removal waits for them. */
static bool mine(const inside_t *h);

static void inside_release(void *rec) {
  if (!mine(rec)) return; /* (given back already: it may be another thread's now) */
  for (unsigned k = 0; k < LEVELS; k++)
    if (tls_rec[k] != NULL) record_free(tls_rec[k]);
  for (unsigned k = 0; k < LEVELS; k++) tls_rec[k] = NULL;
  tls_depth = 0;
  tls_kept = 0;
}
static void inside_key(void) { (void)pthread_key_create(&g_inside_key, inside_release); }

static bool take(inside_t *h) {
  bool free_ = false;
  return atomic_compare_exchange_strong(&h->taken, &free_, true);
}

/* A free record, taken: a static one, then one of a chunk, then one of a new chunk; NULL when
 * every record is taken and no chunk can be made. */
static inside_t *record_take(void) {
  for (unsigned i = 0; i < WEFT__HANDLE_THREADS; i++) {
    if (!take(&g_inside[i])) continue;
    unsigned top = atomic_load(&g_inside_top);
    while (top < i + 1 && !atomic_compare_exchange_weak(&g_inside_top, &top, i + 1)) {
    }
    return &g_inside[i];
  }
  for (chunk_t *c = atomic_load_explicit(&g_chunks, memory_order_seq_cst); c != NULL; c = c->next)
    for (unsigned i = 0; i < MORE; i++)
      if (take(&c->rec[i])) return &c->rec[i];
  chunk_t *c = weft__meta_calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  atomic_store_explicit(&c->rec[0].taken, true, memory_order_relaxed); /* the caller's */
  chunk_t *head = atomic_load_explicit(&g_chunks, memory_order_relaxed);
  do c->next = head;
  /* seq_cst (cold): a removal's scan after its fence sees the chunk of a record published in it */
  while (!atomic_compare_exchange_weak_explicit(&g_chunks, &head, c, memory_order_seq_cst, memory_order_relaxed));
  return &c->rec[0];
}

/* The calling thread's record of nesting level k (taken at its first entry that deep); NULL when
 * none can be had. Level 0's is given back by the thread-exit destructor, with the others. */
static inside_t *my_record(unsigned k) {
  if (tls_rec[k] != NULL) return tls_rec[k];
  pthread_once(&g_inside_once, inside_key);
  if (k > 0 && tls_rec[0] == NULL) return NULL; /* (levels are taken in order) */
  inside_t *h = record_take();
  if (h == NULL) return NULL;
  if (k == 0 && pthread_setspecific(g_inside_key, h) != 0) { /* could not be given back: not taken */
    atomic_store(&h->taken, false);
    return NULL;
  }
  return tls_rec[k] = h;
}

/* Whether record h is one of the calling thread's. */
static bool mine(const inside_t *h) {
  for (unsigned k = 0; k < LEVELS; k++)
    if (tls_rec[k] == h) return true;
  return false;
}

/* Entry d's slot in the calling thread's records (d < tls_depth). */
static _Atomic(const void *) *slot_at(unsigned d) {
  return &tls_rec[d / WEFT__HANDLE_DEPTH]->p[d % WEFT__HANDLE_DEPTH];
}

/* Publishes p, live, in this thread's slot *slot (free): true; or false, the slot left free.
 * A dead object is refused before it is published: a removal waits until it sees each record
 * without p once, which threads that keep trying a dead object would otherwise put off. */
static bool publish(_Atomic(const void *) *slot, const void *p, weft__handle_kind_t kind) {
  uint64_t removals = atomic_load_explicit(&g_removals, memory_order_acquire);
  if (!seen_live(p, kind, removals) && !live_locked(p, kind, removals)) return false;
  /* The publication comes before the count is read again (both seq_cst; a removal counts, fences
   * and reads the records): one of the two sees the other. Live when the count was read above;
   * still live if nothing was removed since (else look). */
  atomic_store_explicit(slot, p, memory_order_seq_cst);
  if (atomic_load_explicit(&g_removals, memory_order_seq_cst) != removals && !weft__handle_live(p, kind)) {
    atomic_store_explicit(slot, NULL, memory_order_relaxed);
    return false;
  }
  return true;
}

bool weft__handle_enter(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return false;
  unsigned depth = tls_depth + tls_locked;
  /* Once one entry holds the lock, the deeper ones do too (they leave first). */
  inside_t *h = tls_locked == 0 && depth < LEVELS * WEFT__HANDLE_DEPTH ? my_record(depth / WEFT__HANDLE_DEPTH) : NULL;
  if (h == NULL) { /* no record: the set's lock, as a reader, until the call leaves */
    WEFT_ASSERT(depth < 32); /* tls_locked_at's bits (weft's calls nest a few levels at most) */
    pthread_rwlock_rdlock(&g_lock);
    const uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
    if (v == NULL || (*v & STATE) != kind) {
      pthread_rwlock_unlock(&g_lock);
      return false;
    }
    tls_locked_at |= 1u << depth;
    tls_locked_p[depth] = p;
    tls_locked++;
    return true;
  }
  if (!publish(&h->p[depth % WEFT__HANDLE_DEPTH], p, kind)) return false;
  tls_depth++;
  return true;
}

bool weft__handle_keep(const void *p, weft__handle_kind_t kind) {
  if (p == NULL || tls_kept == WEFT__HANDLE_KEPT) return false;
  inside_t *h = my_record(0);
  if (h == NULL) return false;
  unsigned d = 0;
  while (atomic_load_explicit(&h->kept[d], memory_order_relaxed) != NULL) d++; /* (one is free) */
  if (!publish(&h->kept[d], p, kind)) return false;
  tls_kept++;
  return true;
}

void weft__handle_unkeep(const void *p) {
  if (tls_kept == 0) return;
  for (unsigned d = 0; d < WEFT__HANDLE_KEPT; d++)
    if (atomic_load_explicit(&tls_rec[0]->kept[d], memory_order_relaxed) == p) {
      atomic_store_explicit(&tls_rec[0]->kept[d], NULL, memory_order_release);
      tls_kept--;
      return;
    }
}

unsigned weft__handle_entries(void) { return tls_depth + tls_locked + tls_kept; }

unsigned weft__handle_kept(void) { return tls_kept; }

bool weft__handle_inside(const void *p) {
  if (p == NULL) return false;
  for (unsigned d = 0; d < tls_depth; d++)
    if (atomic_load_explicit(slot_at(d), memory_order_relaxed) == p) return true;
  for (uint32_t m = tls_locked_at; m != 0; m &= m - 1)
    if (tls_locked_p[__builtin_ctz(m)] == p) return true;
  for (unsigned d = 0; tls_kept != 0 && d < WEFT__HANDLE_KEPT; d++)
    if (atomic_load_explicit(&tls_rec[0]->kept[d], memory_order_relaxed) == p) return true;
  return false;
}

void weft__handle_leave(void) {
  WEFT_ASSERT_INTERNAL(tls_depth + tls_locked > 0);
  unsigned depth = tls_depth + tls_locked - 1;
  if ((tls_locked_at >> depth) & 1u) {
    tls_locked_at &= ~(1u << depth);
    tls_locked--;
    pthread_rwlock_unlock(&g_lock);
    return;
  }
  tls_depth--;
  atomic_store_explicit(slot_at(tls_depth), NULL, memory_order_release);
}

/* Waits until record h (not the calling thread's) no longer publishes p. */
static void wait_record(const inside_t *h, const void *p) {
  if (mine(h)) return; /* (the calling thread's own entries are not waited for) */
  for (unsigned d = 0; d < WEFT__HANDLE_DEPTH; d++)
    while (atomic_load_explicit(&h->p[d], memory_order_acquire) == p) sched_yield();
  for (unsigned d = 0; d < WEFT__HANDLE_KEPT; d++)
    while (atomic_load_explicit(&h->kept[d], memory_order_acquire) == p) sched_yield();
}

/* After p was marked dead: waits until no other thread is inside p (the entering threads leave
 * soon: a call, not a wait for this thread). A record seen once without p is done: an entry
 * published after this fence sees p dead and fails. The calling thread's own entries are not
 * waited for. */
static void wait_outside(const void *p) {
  atomic_thread_fence(memory_order_seq_cst);
  unsigned top = atomic_load(&g_inside_top);
  for (unsigned i = 0; i < top; i++) wait_record(&g_inside[i], p);
  for (chunk_t *c = atomic_load_explicit(&g_chunks, memory_order_seq_cst); c != NULL; c = c->next)
    for (unsigned i = 0; i < MORE; i++) wait_record(&c->rec[i], p);
}

bool weft__handle_hold(const void *p, weft__handle_kind_t kind, int delta) {
  if (p == NULL || (tls_locked > 0 && delta > 0)) return false;
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  bool live = v != NULL && (*v & STATE) == kind;
  if (live) {
    uint64_t holders = *v >> HOLDER_SHIFT;
    WEFT_ASSERT_INTERNAL(delta > 0 || holders > 0);
    if (delta > 0 || holders > 0) *v = (*v & STATE) | ((holders + (uint64_t)(int64_t)delta) << HOLDER_SHIFT);
  }
  pthread_rwlock_unlock(&g_lock);
  return live;
}

void weft__handle_restore(const void *p, weft__handle_kind_t kind) {
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  if (v != NULL && *v == (kind | DEAD)) *v = kind;
  pthread_rwlock_unlock(&g_lock);
}

bool weft__handle_dead(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return false;
  pthread_rwlock_rdlock(&g_lock);
  const uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  bool dead = v != NULL && (*v & STATE) == (kind | DEAD);
  pthread_rwlock_unlock(&g_lock);
  return dead;
}
