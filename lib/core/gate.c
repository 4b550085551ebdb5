/* The graph gate (gate.h): per-thread slots on a list that only grows. */
#include "lib/core/gate.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "lib/core/debug.h"

typedef struct slot {
  _Atomic weft__gate_devices_t inside; /* the devices whose shared side the owner is in */
  _Atomic bool owned;      /* a live thread owns the slot */
  struct slot *next;       /* immutable once published */
} slot_t;

static _Atomic(slot_t *) g_slots;
/* Read by every shared entry: one line. */
static struct {
  _Atomic weft__gate_devices_t closed; /* devices whose exclusive holder is in, or getting in */
  int scope;                            /* WEFT__GATE_PER_DEVICE, _PROCESS or _OFF; set before the first call */
} g_gate __attribute__((aligned(64)));
/* The devices with an exclusive holder in (one holder a device): taken all at once, when all are
 * free, so holders of several devices never wait in a circle (and no thread holds a mutex per
 * device: tsan's deadlock detector keeps at most 64 held at once). */
static pthread_mutex_t g_held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_held_cond = PTHREAD_COND_INITIALIZER;
static weft__gate_devices_t g_held; /* g_held_lock */
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static _Thread_local slot_t *tls_slot;
static _Thread_local weft__gate_devices_t tls_exclusive; /* the devices this thread holds exclusive */

void weft__gate_set_scope(int scope) { g_gate.scope = scope; }

int weft__gate_scope(void) { return g_gate.scope; }

/* Waits until none of `devices` has an exclusive holder; returns with g_held_lock held. */
static void wait_free(weft__gate_devices_t devices) {
  pthread_mutex_lock(&g_held_lock);
  while ((g_held & devices) != 0) pthread_cond_wait(&g_held_cond, &g_held_lock);
}

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

void weft__gate_enter(weft__gate_devices_t devices) {
  if (tls_exclusive != 0 || g_gate.scope == WEFT__GATE_OFF) return; /* the exclusive holder's own calls */
  if (g_gate.scope == WEFT__GATE_PROCESS) devices = 1;
  slot_t *s = slot_get();
  WEFT_ASSERT_INTERNAL(atomic_load_explicit(&s->inside, memory_order_relaxed) == 0);
  for (;;) {
    atomic_store_explicit(&s->inside, devices, memory_order_seq_cst);
    weft__gate_devices_t closed = atomic_load_explicit(&g_gate.closed, memory_order_seq_cst) & devices;
    if (closed == 0) return;
    /* An exclusive holder of one of them is in or getting in: step out, and wait for it to go. */
    atomic_store_explicit(&s->inside, 0, memory_order_seq_cst);
    wait_free(closed);
    pthread_mutex_unlock(&g_held_lock);
  }
}

void weft__gate_leave(void) {
  if (tls_exclusive == 0 && tls_slot != NULL) atomic_store_explicit(&tls_slot->inside, 0, memory_order_release);
}

void weft__gate_lock(weft__gate_devices_t devices) {
  WEFT_ASSERT(tls_slot == NULL || atomic_load_explicit(&tls_slot->inside, memory_order_relaxed) == 0);
  WEFT_ASSERT(tls_exclusive == 0 && devices != 0); /* not nested */
  if (g_gate.scope == WEFT__GATE_OFF) return;
  if (g_gate.scope == WEFT__GATE_PROCESS) devices = 1;
  wait_free(devices);
  g_held |= devices;
  pthread_mutex_unlock(&g_held_lock);
  tls_exclusive = devices;
  atomic_fetch_or_explicit(&g_gate.closed, devices, memory_order_seq_cst);
  for (slot_t *s = atomic_load_explicit(&g_slots, memory_order_acquire); s != NULL; s = s->next)
    while ((atomic_load_explicit(&s->inside, memory_order_seq_cst) & devices) != 0) sched_yield();
}

void weft__gate_unlock(void) {
  weft__gate_devices_t devices = tls_exclusive;
  tls_exclusive = 0;
  atomic_fetch_and_explicit(&g_gate.closed, ~devices, memory_order_seq_cst);
  pthread_mutex_lock(&g_held_lock);
  g_held &= ~devices;
  pthread_cond_broadcast(&g_held_cond);
  pthread_mutex_unlock(&g_held_lock);
}
