/* The graph gate (gate.h): per-thread slots on a list that only grows. */
#include "lib/core/gate.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "lib/core/debug.h"

typedef struct slot {
  _Atomic unsigned inside; /* the owner is in the shared side */
  _Atomic bool owned;      /* a live thread owns the slot */
  struct slot *next;       /* immutable once published */
} slot_t;

static _Atomic(slot_t *) g_slots;
static _Atomic unsigned g_closed; /* an exclusive holder is in, or getting in */
static pthread_mutex_t g_exclusive = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static _Thread_local slot_t *tls_slot;
static _Thread_local bool tls_exclusive; /* this thread holds the exclusive side */

/* At thread exit: the slot is free for the next thread that needs one. */
static void slot_release(void *p) {
  slot_t *s = p;
  atomic_store_explicit(&s->inside, 0, memory_order_release);
  atomic_store_explicit(&s->owned, false, memory_order_release);
}

static void key_create(void) {
  if (pthread_key_create(&g_key, slot_release) != 0) abort();
}

static slot_t *slot_get(void) {
  if (tls_slot != NULL) return tls_slot;
  pthread_once(&g_key_once, key_create);
  slot_t *s;
  for (s = atomic_load_explicit(&g_slots, memory_order_acquire); s != NULL; s = s->next) {
    bool no = false;
    if (atomic_compare_exchange_strong(&s->owned, &no, true)) break;
  }
  if (s == NULL) {
    /* Slots live as long as the process (reused, never freed), so they are not a runtime's
     * metadata: the first ones are static, the rest from the C library. */
    static slot_t first[256];
    static _Atomic unsigned used;
    unsigned k = atomic_fetch_add_explicit(&used, 1, memory_order_relaxed);
    s = k < sizeof first / sizeof first[0] ? &first[k] : calloc(1, sizeof *s);
    if (s == NULL) abort(); /* a few bytes once per thread; weft cannot order work without it */
    atomic_init(&s->owned, true);
    s->next = atomic_load_explicit(&g_slots, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&g_slots, &s->next, s, memory_order_release, memory_order_relaxed)) {
    }
  }
  (void)pthread_setspecific(g_key, s);
  return tls_slot = s;
}

void weft__gate_enter(void) {
  if (tls_exclusive) return; /* the exclusive holder's own calls */
  slot_t *s = slot_get();
  WEFT_ASSERT_INTERNAL(atomic_load_explicit(&s->inside, memory_order_relaxed) == 0);
  for (;;) {
    atomic_store_explicit(&s->inside, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&g_closed, memory_order_seq_cst) == 0) return;
    /* An exclusive holder is in or waiting: step out, and wait for it to finish. */
    atomic_store_explicit(&s->inside, 0, memory_order_seq_cst);
    pthread_mutex_lock(&g_exclusive);
    pthread_mutex_unlock(&g_exclusive);
  }
}

void weft__gate_leave(void) {
  if (!tls_exclusive) atomic_store_explicit(&tls_slot->inside, 0, memory_order_release);
}

void weft__gate_lock(void) {
  WEFT_ASSERT(tls_slot == NULL || atomic_load_explicit(&tls_slot->inside, memory_order_relaxed) == 0);
  WEFT_ASSERT(!tls_exclusive); /* not nested */
  pthread_mutex_lock(&g_exclusive);
  tls_exclusive = true;
  atomic_store_explicit(&g_closed, 1, memory_order_seq_cst);
  for (slot_t *s = atomic_load_explicit(&g_slots, memory_order_acquire); s != NULL; s = s->next)
    while (atomic_load_explicit(&s->inside, memory_order_seq_cst) != 0) sched_yield();
}

void weft__gate_unlock(void) {
  tls_exclusive = false;
  atomic_store_explicit(&g_closed, 0, memory_order_seq_cst);
  pthread_mutex_unlock(&g_exclusive);
}
