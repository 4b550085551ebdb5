/* The live-handle set (handle.h). */
#include <pthread.h>
#include <stdint.h>

#include "lib/core/container.h"
#include "lib/core/handle.h"

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static weft__map_t g_live; /* address -> kind, | DEAD once destroyed */

#define DEAD 0x100u

bool weft__handle_add(const void *p, weft__handle_kind_t kind) {
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_insert(&g_live, (uint64_t)(uintptr_t)p, NULL);
  if (v != NULL) *v = kind;
  pthread_rwlock_unlock(&g_lock);
  return v != NULL;
}

bool weft__handle_live(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return false;
  pthread_rwlock_rdlock(&g_lock);
  const uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  bool live = v != NULL && *v == kind;
  pthread_rwlock_unlock(&g_lock);
  return live;
}

bool weft__handle_remove(const void *p, weft__handle_kind_t kind) {
  if (p == NULL) return false;
  pthread_rwlock_wrlock(&g_lock);
  uint64_t *v = weft__map_find(&g_live, (uint64_t)(uintptr_t)p);
  bool live = v != NULL && *v == kind;
  if (live) *v = kind | DEAD;
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
  bool dead = v != NULL && *v == (kind | DEAD);
  pthread_rwlock_unlock(&g_lock);
  return dead;
}
