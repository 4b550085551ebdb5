/* Failing pthread object initialisation on demand, to test that weft checks every
 * pthread_*_init it calls and unwinds. Linking fail_init.c into a test program interposes
 * pthread_mutex_init, pthread_cond_init, pthread_rwlock_init, pthread_mutexattr_init,
 * pthread_mutexattr_setpshared and pthread_mutexattr_setrobust on every caller except the
 * simulator library (its locks are not weft's); unarmed, they call the C library's. */
#ifndef WEFT_TESTS_FAIL_INIT_H
#define WEFT_TESTS_FAIL_INIT_H

typedef enum fail_init_fn {
  FAIL_MUTEX_INIT,
  FAIL_COND_INIT,
  FAIL_RWLOCK_INIT,
  FAIL_MUTEXATTR_INIT,
  FAIL_MUTEXATTR_SETPSHARED,
  FAIL_MUTEXATTR_SETROBUST,
  FAIL_INIT_FNS
} fail_init_fn_t;

/** The nth call of fn from now on (n >= 1) fails with `err` without touching its object; n == 0
 * disarms fn. */
void fail_init_arm(fail_init_fn_t fn, unsigned n, int err);
/** Disarms every function. */
void fail_init_clear(void);
/** Calls of fn counted since it was last armed (or since start). */
unsigned fail_init_calls(fail_init_fn_t fn);

#endif
