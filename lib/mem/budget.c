/* The budget adaptor: a hard limit on the live bytes drawn through it. An allocation that would
 * go over fails with OVER_BUDGET before upstream is asked (distinct from the driver's
 * OUT_OF_MEMORY); a failed upstream allocation gives its charge back.
 *
 * Shared mode: every process naming the same key on the same device charges one table in POSIX
 * shared memory "/weft-<key>-<device>": a slot per participating budget (pid, bytes charged) and
 * their total, under a robust process-shared mutex. A process that dies while holding the mutex
 * leaves it EOWNERDEAD: the next locker recomputes the total from the slots (a slot is updated
 * before the total) and marks it consistent. A process that dies with bytes charged keeps its
 * slot until another process finds the pid gone (kill(pid, 0) fails with ESRCH, i.e. the process
 * was reaped) at budget creation or when an allocation would go over; its bytes are then
 * reclaimed. Each process enforces its own `limit` against the shared total, so all processes
 * passing the same limit share exactly that limit. The segment is never unlinked (a later process
 * may still be opening it); it is a few kilobytes in /dev/shm.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/mem/mem.h"

#define SHM_MAGIC 0x77656674u /* "weft" */
#define SHM_VERSION 1u
#define SHM_SLOTS 128
#define SHM_KEY_MAX WEFT_BUDGET_KEY_MAX

enum { SHM_NEW = 0, SHM_INITIALISING = 1, SHM_READY = 2 };

typedef struct shm_slot {
  int32_t pid;       /* owner process, 0 when the slot is free */
  uint32_t pad;
  uint64_t charged;  /* bytes the owner holds now */
} shm_slot_t;

typedef struct shm_table {
  _Atomic uint32_t state;  /* SHM_NEW → SHM_INITIALISING → SHM_READY */
  uint32_t magic, version, slots;
  pthread_mutex_t lock;    /* robust, process-shared; guards total and slot[] */
  uint64_t total;          /* == sum of slot[].charged */
  shm_slot_t slot[SHM_SLOTS];
} shm_table_t;

typedef struct budget {
  weft_resource_t base;     /* first */
  pthread_mutex_t lock;     /* rank 20; guards used (local mode); never held across upstream */
  weft__tracker_t *tr;
  uint64_t limit;           /* bytes */
  uint64_t used;            /* local mode: bytes charged */
  shm_table_t *shm;         /* shared mode: the mapped table, else NULL */
  int slot;                 /* shared mode: our slot index */
} budget_t;

/* ---- the shared table ------------------------------------------------------------------ */

static void shm_recount(shm_table_t *t) {
  uint64_t sum = 0;
  for (unsigned i = 0; i < SHM_SLOTS; i++)
    if (t->slot[i].pid != 0) sum += t->slot[i].charged;
  t->total = sum;
}

static int shm_lock(shm_table_t *t) {
  int e = pthread_mutex_lock(&t->lock);
  if (e == EOWNERDEAD) {
    shm_recount(t);
    e = pthread_mutex_consistent(&t->lock);
  }
  return e;
}

/* Frees the slots of processes that no longer exist; returns the bytes reclaimed. Locked. */
static uint64_t shm_reclaim(shm_table_t *t) {
  uint64_t got = 0;
  pid_t me = getpid();
  for (unsigned i = 0; i < SHM_SLOTS; i++) {
    shm_slot_t *s = &t->slot[i];
    if (s->pid == 0 || s->pid == me) continue;
    if (kill(s->pid, 0) == -1 && errno == ESRCH) {
      got += s->charged;
      s->charged = 0;
      s->pid = 0;
    }
  }
  t->total -= got;
  return got;
}

static weft_status_t shm_setup(budget_t *b, const char *key, int device) {
  static const char who[] = "weft_budget_create";
  char name[SHM_KEY_MAX + 32];
  snprintf(name, sizeof name, "/weft-%s-%d", key, device);
  int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
  if (fd < 0) return weft__error(WEFT_ERR_DRIVER, "%s: shm_open(%s) failed: %s", who, name, strerror(errno));
  struct stat sb;
  weft_status_t st = WEFT_OK;
  if (fstat(fd, &sb) != 0) {
    st = weft__error(WEFT_ERR_DRIVER, "%s: fstat(%s) failed: %s", who, name, strerror(errno));
  } else if (sb.st_size != 0 && (size_t)sb.st_size != sizeof(shm_table_t)) {
    st = weft__error(WEFT_ERR_DRIVER, "%s: %s has %lld bytes, not the %zu of this weft version", who, name,
                     (long long)sb.st_size, sizeof(shm_table_t));
  } else if (sb.st_size == 0 && ftruncate(fd, sizeof(shm_table_t)) != 0) {
    st = weft__error(WEFT_ERR_DRIVER, "%s: ftruncate(%s) failed: %s", who, name, strerror(errno));
  }
  void *m = MAP_FAILED;
  if (st == WEFT_OK) {
    m = mmap(NULL, sizeof(shm_table_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) st = weft__error(WEFT_ERR_DRIVER, "%s: mmap(%s) failed: %s", who, name, strerror(errno));
  }
  close(fd);
  if (st != WEFT_OK) return st;
  shm_table_t *t = m;
  uint32_t expect = SHM_NEW;
  if (atomic_compare_exchange_strong_explicit(&t->state, &expect, SHM_INITIALISING, memory_order_acq_rel,
                                              memory_order_acquire)) {
    /* Process-shared so that every process mapping the table locks the same mutex; robust so
     * that one dying with it held does not wedge the others (shm_lock repairs it). A platform
     * refusing either cannot share a budget: NOT_SUPPORTED. On any failure the table goes back
     * to SHM_NEW, for the next process to initialise. */
    pthread_mutexattr_t a;
    weft_status_t fail = WEFT_OK;
    const char *what = NULL;
    int e = pthread_mutexattr_init(&a);
    if (e != 0) {
      fail = WEFT_ERR_HOST_OUT_OF_MEMORY, what = "pthread_mutexattr_init";
    } else {
      if ((e = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED)) != 0)
        fail = WEFT_ERR_NOT_SUPPORTED, what = "pthread_mutexattr_setpshared";
      else if ((e = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST)) != 0)
        fail = WEFT_ERR_NOT_SUPPORTED, what = "pthread_mutexattr_setrobust";
      else if ((e = pthread_mutex_init(&t->lock, &a)) != 0)
        fail = WEFT_ERR_HOST_OUT_OF_MEMORY, what = "pthread_mutex_init";
      pthread_mutexattr_destroy(&a);
    }
    if (fail != WEFT_OK) {
      atomic_store_explicit(&t->state, SHM_NEW, memory_order_release);
      munmap(m, sizeof *t);
      return weft__error(fail, "%s: process-shared mutex in %s: %s failed: %s", who, name, what, strerror(e));
    }
    t->magic = SHM_MAGIC;
    t->version = SHM_VERSION;
    t->slots = SHM_SLOTS;
    atomic_store_explicit(&t->state, SHM_READY, memory_order_release);
  } else {
    /* Another process initialises it: wait up to 5 s. */
    for (int i = 0; i < 5000 && atomic_load_explicit(&t->state, memory_order_acquire) != SHM_READY; i++) {
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
  }
  if (atomic_load_explicit(&t->state, memory_order_acquire) != SHM_READY || t->magic != SHM_MAGIC ||
      t->version != SHM_VERSION || t->slots != SHM_SLOTS) {
    munmap(m, sizeof *t);
    return weft__error(WEFT_ERR_DRIVER, "%s: %s is not a weft budget table of this version", who, name);
  }
  int e = shm_lock(t);
  if (e != 0) {
    munmap(m, sizeof *t);
    return weft__error(WEFT_ERR_DRIVER, "%s: locking %s: %s", who, name, strerror(e));
  }
  shm_reclaim(t);
  int slot = -1;
  for (int i = 0; i < SHM_SLOTS && slot < 0; i++)
    if (t->slot[i].pid == 0) slot = i;
  if (slot >= 0) {
    t->slot[slot].pid = getpid();
    t->slot[slot].charged = 0;
  }
  pthread_mutex_unlock(&t->lock);
  if (slot < 0) {
    munmap(m, sizeof *t);
    return weft__error(WEFT_ERR_DRIVER, "%s: %s already has %d live participants", who, name, SHM_SLOTS);
  }
  b->shm = t;
  b->slot = slot;
  return WEFT_OK;
}

/* ---- charging ---------------------------------------------------------------------------- */

static weft_status_t charge(budget_t *b, uint64_t bytes) {
  if (b->shm == NULL) {
    pthread_mutex_lock(&b->lock);
    bool ok = b->used + bytes <= b->limit;
    if (ok) b->used += bytes;
    uint64_t used = b->used;
    pthread_mutex_unlock(&b->lock);
    if (ok) return WEFT_OK;
    return weft__error(WEFT_ERR_OVER_BUDGET, "budget: %llu more bytes would exceed the limit of %llu (%llu in use)",
                       (unsigned long long)bytes, (unsigned long long)b->limit, (unsigned long long)used);
  }
  shm_table_t *t = b->shm;
  int e = shm_lock(t);
  if (e != 0) return weft__error(WEFT_ERR_DRIVER, "budget: locking the shared table: %s", strerror(e));
  if (t->total + bytes > b->limit) shm_reclaim(t);
  bool ok = t->total + bytes <= b->limit;
  if (ok) {
    t->slot[b->slot].charged += bytes;
    t->total += bytes;
  }
  uint64_t used = t->total;
  pthread_mutex_unlock(&t->lock);
  if (ok) return WEFT_OK;
  return weft__error(WEFT_ERR_OVER_BUDGET,
                     "budget: %llu more bytes would exceed the shared limit of %llu (%llu in use by all processes)",
                     (unsigned long long)bytes, (unsigned long long)b->limit, (unsigned long long)used);
}

static void uncharge(budget_t *b, uint64_t bytes) {
  if (b->shm == NULL) {
    pthread_mutex_lock(&b->lock);
    WEFT_ASSERT_INTERNAL(b->used >= bytes);
    b->used -= bytes;
    pthread_mutex_unlock(&b->lock);
    return;
  }
  shm_table_t *t = b->shm;
  /* A lock failure here (only EOWNERDEAD's repair failing) leaves the charge: conservative. */
  if (shm_lock(t) != 0) return;
  shm_slot_t *s = &t->slot[b->slot];
  uint64_t n = s->charged < bytes ? s->charged : bytes;
  s->charged -= n;
  t->total -= n;
  pthread_mutex_unlock(&t->lock);
}

static weft_status_t budget_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                     CUdeviceptr *out) {
  budget_t *b = (budget_t *)self;
  weft_status_t st = charge(b, bytes);
  if (st != WEFT_OK) return st;
  st = weft__resource_allocate(b->base.upstream, bytes, s, tag, out);
  if (st != WEFT_OK) uncharge(b, bytes);
  return st;
}

static weft_status_t budget_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                       const char *tag) {
  budget_t *b = (budget_t *)self;
  weft_status_t st = weft__resource_deallocate(b->base.upstream, p, bytes, s, tag);
  if (st == WEFT_OK) uncharge(b, bytes);
  return st;
}

static weft_status_t budget_destroy(weft_resource_t *self) {
  budget_t *b = (budget_t *)self;
  if (b->shm != NULL) {
    shm_table_t *t = b->shm;
    if (shm_lock(t) == 0) {
      t->total -= t->slot[b->slot].charged;
      t->slot[b->slot].charged = 0;
      t->slot[b->slot].pid = 0;
      pthread_mutex_unlock(&t->lock);
    }
    munmap(t, sizeof *t);
  }
  pthread_mutex_destroy(&b->lock);
  weft__meta_free(b);
  return WEFT_OK;
}

const weft_resource_ops_t weft__budget_ops = {
    .name = "budget",
    .allocate = budget_allocate,
    .deallocate = budget_deallocate,
    .destroy = budget_destroy,
};

static bool key_ok(const char *k) {
  size_t n = strlen(k);
  if (n == 0 || n > SHM_KEY_MAX) return false;
  for (size_t i = 0; i < n; i++) {
    char c = k[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  }
  return true;
}

weft_status_t weft__budget_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream, uint64_t limit,
                                  const char *shared_key, weft_resource_t **out) {
  static const char who[] = "weft_budget_create";
  weft_status_t st;
  if ((st = weft__mem_check_upstream(who, rt, upstream)) != WEFT_OK) return st;
  if (limit == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: limit is 0", who);
  bool shared = shared_key != NULL && shared_key[0] != '\0';
  if (shared && !key_ok(shared_key))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: shared key '%s' must be 1..%d characters of [A-Za-z0-9_.-]", who,
                       shared_key, SHM_KEY_MAX);
  budget_t *b = weft__meta_calloc(1, sizeof *b);
  if (b == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  if ((st = weft__mem_lock_init(&b->lock, who)) != WEFT_OK) {
    weft__meta_free(b);
    return st;
  }
  if (shared && (st = shm_setup(b, shared_key, tr->ordinal)) != WEFT_OK) {
    pthread_mutex_destroy(&b->lock);
    weft__meta_free(b);
    return st;
  }
  weft__resource_init(&b->base, &weft__budget_ops, upstream, rt);
  b->tr = tr;
  b->limit = limit;
  *out = &b->base;
  return WEFT_OK;
}

uint64_t weft_budget_used(const weft_resource_t *r) {
  if (r == NULL || r->ops != &weft__budget_ops) return 0;
  budget_t *b = (budget_t *)r;
  if (b->shm == NULL) {
    pthread_mutex_lock(&b->lock);
    uint64_t u = b->used;
    pthread_mutex_unlock(&b->lock);
    return u;
  }
  if (shm_lock(b->shm) != 0) return 0;
  uint64_t u = b->shm->total;
  pthread_mutex_unlock(&b->shm->lock);
  return u;
}
