/* Interposed pthread initialisers (fail_init.h). Each finds the C library's own with
 * dlsym(RTLD_NEXT) (under TSan: the sanitizer's interceptor, which calls the C library). */
#include "tests/util/fail_init.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic unsigned countdown[FAIL_INIT_FNS]; /* 0: disarmed; 1: the next call fails */
static _Atomic unsigned calls[FAIL_INIT_FNS];
static _Atomic int errs[FAIL_INIT_FNS];

void fail_init_arm(fail_init_fn_t fn, unsigned n, int err) {
  atomic_store(&errs[fn], err);
  atomic_store(&calls[fn], 0);
  atomic_store(&countdown[fn], n);
}

void fail_init_clear(void) {
  for (int i = 0; i < FAIL_INIT_FNS; i++) atomic_store(&countdown[i], 0);
}

unsigned fail_init_calls(fail_init_fn_t fn) { return atomic_load(&calls[fn]); }

/* The simulator's own locks are not what the tests are about: its calls are never failed. */
static int from_simulator(const void *caller) {
  Dl_info info;
  return dladdr(caller, &info) != 0 && info.dli_fname != NULL && strstr(info.dli_fname, "libweft_sim") != NULL;
}

/* Returns the error the call must fail with, or 0 to call through. */
static int should_fail(fail_init_fn_t fn, const void *caller) {
  if (from_simulator(caller)) return 0;
  atomic_fetch_add(&calls[fn], 1);
  unsigned n = atomic_load(&countdown[fn]);
  while (n != 0 && !atomic_compare_exchange_weak(&countdown[fn], &n, n - 1)) {
  }
  return n == 1 ? atomic_load(&errs[fn]) : 0;
}

static void *real(const char *name) {
  void *p = dlsym(RTLD_NEXT, name);
  if (p == NULL) abort();
  return p;
}

#define CALLER __builtin_return_address(0)

int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a) {
  int e = should_fail(FAIL_MUTEX_INIT, CALLER);
  if (e) return e;
  return ((int (*)(pthread_mutex_t *, const pthread_mutexattr_t *))real("pthread_mutex_init"))(m, a);
}

int pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a) {
  int e = should_fail(FAIL_COND_INIT, CALLER);
  if (e) return e;
  return ((int (*)(pthread_cond_t *, const pthread_condattr_t *))real("pthread_cond_init"))(c, a);
}

int pthread_rwlock_init(pthread_rwlock_t *l, const pthread_rwlockattr_t *a) {
  int e = should_fail(FAIL_RWLOCK_INIT, CALLER);
  if (e) return e;
  return ((int (*)(pthread_rwlock_t *, const pthread_rwlockattr_t *))real("pthread_rwlock_init"))(l, a);
}

int pthread_mutexattr_init(pthread_mutexattr_t *a) {
  int e = should_fail(FAIL_MUTEXATTR_INIT, CALLER);
  if (e) return e;
  return ((int (*)(pthread_mutexattr_t *))real("pthread_mutexattr_init"))(a);
}

int pthread_mutexattr_setpshared(pthread_mutexattr_t *a, int v) {
  int e = should_fail(FAIL_MUTEXATTR_SETPSHARED, CALLER);
  if (e) return e;
  return ((int (*)(pthread_mutexattr_t *, int))real("pthread_mutexattr_setpshared"))(a, v);
}

int pthread_mutexattr_setrobust(pthread_mutexattr_t *a, int v) {
  int e = should_fail(FAIL_MUTEXATTR_SETROBUST, CALLER);
  if (e) return e;
  return ((int (*)(pthread_mutexattr_t *, int))real("pthread_mutexattr_setrobust"))(a, v);
}
