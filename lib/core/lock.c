/* The contended sides of weft__lock_t, and weft__cond_t (lock.h). */
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lib/core/lock.h"

/* Tries to take a free lock this many times (reading it between tries) before sleeping: about a
 * microsecond, longer than the pool's sections that do not call the driver. */
#define SPINS 100

/* A spinning thread's hint to the core (x86 pause, Arm yield). */
static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

static void futex(atomic_uint *w, int op, unsigned val) { (void)syscall(SYS_futex, w, op, val, NULL, NULL, 0); }

void weft__lock_wait(weft__lock_t *l) {
  for (int i = 0; i < SPINS; i++) {
    unsigned c = atomic_load_explicit(&l->v, memory_order_relaxed);
    if (c == 0 && atomic_compare_exchange_weak_explicit(&l->v, &c, 1, memory_order_acquire, memory_order_relaxed))
      return;
    if (c == 2) break; /* others sleep already: join them */
    relax();
  }
  /* Held: mark it "a thread may sleep" (2) and sleep while it stays held. Taking it this way
   * leaves it at 2, so the unlock wakes the next sleeper (at worst a needless wake). */
  while (atomic_exchange_explicit(&l->v, 2, memory_order_acquire) != 0) futex(&l->v, FUTEX_WAIT_PRIVATE, 2);
}

void weft__lock_wake(weft__lock_t *l) {
  atomic_store_explicit(&l->v, 0, memory_order_release);
  futex(&l->v, FUTEX_WAKE_PRIVATE, 1);
}

void weft__cond_wait_unless(weft__cond_t *c, weft__lock_t *l, bool (*done)(const void *arg), const void *arg) {
  /* The count read before this thread counts itself: a broadcast that saw it counted advanced
   * it afterwards, and the sleep below then returns at once. */
  unsigned seq = atomic_load_explicit(&c->seq, memory_order_acquire);
  atomic_fetch_add_explicit(&c->waiters, 1, memory_order_seq_cst);
  if (done == NULL || !done(arg)) {
    weft__unlock(l);
    futex(&c->seq, FUTEX_WAIT_PRIVATE, seq);
    weft__lock(l);
  }
  atomic_fetch_sub_explicit(&c->waiters, 1, memory_order_relaxed);
}

void weft__cond_broadcast_unlocked(weft__cond_t *c) {
  if (atomic_load_explicit(&c->waiters, memory_order_seq_cst) == 0) return;
  atomic_fetch_add_explicit(&c->seq, 1, memory_order_release);
  futex(&c->seq, FUTEX_WAKE_PRIVATE, (unsigned)INT32_MAX);
}

void weft__cond_wait(weft__cond_t *c, weft__lock_t *l) { weft__cond_wait_unless(c, l, NULL, NULL); }

void weft__cond_broadcast(weft__cond_t *c) { weft__cond_broadcast_unlocked(c); }
