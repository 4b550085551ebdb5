/* The live-handle set (handle.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "lib/core/container.h"
#include "lib/core/debug.h"
#include "lib/core/handle.h"

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static weft__map_t g_live; /* address -> its value (below) */

/* A handle's value: its kind, DEAD once destroyed, and above HOLDER_SHIFT how many objects hold
 * it (weft__handle_hold). */
#define DEAD 0x100u
#define STATE 0x1ffu /* kind | DEAD */
#define HOLDER_SHIFT 16

/* weft__handle_live's fast path: each thread remembers its last few positive answers, each with
 * the number of removals the set had seen when the answer was taken. While no handle was removed
 * since, the object is still live (adds and restores never make a live object dead), so a hot
 * call (a collective's communicator, a replayed exec) reads one shared counter, which nobody
 * writes in steady state, instead of taking the set's lock (an atomic read-modify-write on one
 * line for every thread of the process). */
static atomic_uint_least64_t g_removals;

typedef struct seen {
  const void *p;
  unsigned kind;
  uint64_t removals;
} seen_t;

#define SEEN 4
static _Thread_local seen_t tls_seen[SEEN];

static seen_t *seen_slot(const void *p) {
  uintptr_t a = (uintptr_t)p;
  return &tls_seen[((a >> 4) ^ (a >> 9)) & (SEEN - 1)];
}

bool weft__handle_add(const void *p, weft__handle_kind_t kind) {
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_insert(&g_live, (uint64_t)(uintptr_t)p, NULL);
  if (v != NULL) *v = kind;
  pthread_rwlock_unlock(&g_lock);
  return v != NULL;
}

bool weft__handle_live(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return false;
  /* Read before the lookup: a removal after this load makes the remembered answer stale. */
  uint64_t removals = atomic_load_explicit(&g_removals, memory_order_acquire);
  seen_t *e = seen_slot(p);
  if (e->p == p && e->kind == (unsigned)kind && e->removals == removals) return true;
  pthread_rwlock_rdlock(&g_lock);
  const uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  bool live = v != NULL && (*v & STATE) == kind;
  pthread_rwlock_unlock(&g_lock);
  if (live) *e = (seen_t){p, (unsigned)kind, removals};
  return live;
}

weft__handle_removal_t weft__handle_remove_unheld(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return WEFT__HANDLE_NOT_LIVE;
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  weft__handle_removal_t r = v == NULL || (*v & STATE) != kind ? WEFT__HANDLE_NOT_LIVE
                             : (*v >> HOLDER_SHIFT) != 0      ? WEFT__HANDLE_HELD
                                                              : WEFT__HANDLE_REMOVED;
  if (r == WEFT__HANDLE_REMOVED) {
    *v = kind | DEAD;
    atomic_fetch_add_explicit(&g_removals, 1, memory_order_release); /* every thread's answers go stale */
  }
  pthread_rwlock_unlock(&g_lock);
  return r;
}

bool weft__handle_remove(const void *p, weft__handle_kind_t kind) {
  return weft__handle_remove_unheld(p, kind) == WEFT__HANDLE_REMOVED;
}

void weft__handle_hold(const void *p, weft__handle_kind_t kind, int delta) {
  if (p == NULL) return;
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  if (v != NULL && (*v & STATE) == kind) {
    uint64_t holders = *v >> HOLDER_SHIFT;
    WEFT_ASSERT_INTERNAL(delta > 0 || holders > 0);
    if (delta > 0 || holders > 0) *v = (*v & STATE) | ((holders + (uint64_t)(int64_t)delta) << HOLDER_SHIFT);
  }
  pthread_rwlock_unlock(&g_lock);
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
