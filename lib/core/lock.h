/* A mutex of one word for short critical sections on hot paths (the tracker's lock, the pool's):
 * Drepper's mutex ("Futexes Are Tricky", 2011, mutex 3) with a short spin before sleeping. An uncontended
 * lock and unlock are one locked instruction each, inline, where pthread_mutex_lock/unlock are
 * calls that also dispatch on the mutex's type and keep its owner and user count (53 of the
 * `pool` pair's 338 instructions per lock and unlock, tools/host_instr.sh). A thread that finds
 * it held spins briefly (the holder's section is short), then sleeps in the kernel (a futex)
 * until the holder's unlock wakes it. Not recursive; no owner checks (WEFT_DEBUG builds assert
 * an unlock of a held lock). Its conditions are weft__cond_t. Neither can fail to initialise:
 * zeroed memory (WEFT__LOCK_INIT, WEFT__COND_INIT) is an unlocked lock, a condition. */
#ifndef WEFT_CORE_LOCK_H
#define WEFT_CORE_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>

#include "lib/core/debug.h"

typedef struct weft__lock {
  atomic_uint v; /* 0 free, 1 held, 2 held and a thread may sleep on it */
} weft__lock_t;

#define WEFT__LOCK_INIT {0}

/** The contended sides (lock.c). */
void weft__lock_wait(weft__lock_t *l);
void weft__lock_wake(weft__lock_t *l);

/** Takes l, waiting while another thread holds it. */
static inline void weft__lock(weft__lock_t *l) {
  unsigned free_ = 0;
  if (__builtin_expect(atomic_compare_exchange_strong_explicit(&l->v, &free_, 1, memory_order_acquire,
                                                               memory_order_relaxed),
                       1))
    return;
  weft__lock_wait(l);
}

/** Gives l back (the calling thread holds it); wakes a sleeping thread if one may be waiting. */
static inline void weft__unlock(weft__lock_t *l) {
  unsigned was = atomic_fetch_sub_explicit(&l->v, 1, memory_order_release);
  WEFT_ASSERT_INTERNAL(was != 0);
  if (__builtin_expect(was != 1, 0)) weft__lock_wake(l);
}

/** A condition to wait for under a weft__lock_t: a count that each broadcast advances (a futex
 * on it). Zeroed memory (WEFT__COND_INIT) is a condition. Wakes may be spurious: wait in a loop
 * on the predicate, as with pthread_cond_wait. */
typedef struct weft__cond {
  atomic_uint seq;
  /* Threads in weft__cond_wait or weft__cond_wait_unless (counted under the lock): a broadcast
   * without any is free. */
  atomic_uint waiters;
} weft__cond_t;

#define WEFT__COND_INIT {0, 0}

/** Waits on c, l held (released while asleep), for a predicate that a thread not holding l may
 * end (and then calls weft__cond_broadcast_unlocked): counts itself a waiter first, then asks
 * done(arg) again (both sequentially consistent; NULL: no question), and sleeps only if it says
 * no, so that either this thread sees the change or the changing thread sees it waiting. Wakes
 * at a broadcast made after the count (or spuriously). */
void weft__cond_wait_unless(weft__cond_t *c, weft__lock_t *l, bool (*done)(const void *arg), const void *arg);
/** Wakes every thread waiting on c, from a thread that need not hold the lock: call it after the
 * predicate's change, made sequentially consistent (weft__cond_wait_unless). No system call when
 * none waits. */
void weft__cond_broadcast_unlocked(weft__cond_t *c);
/** weft__cond_wait_unless with no question: for a predicate changed only under l. */
void weft__cond_wait(weft__cond_t *c, weft__lock_t *l);
/** weft__cond_broadcast_unlocked, called with the lock held after changing the predicate. */
void weft__cond_broadcast(weft__cond_t *c);

#endif /* WEFT_CORE_LOCK_H */
