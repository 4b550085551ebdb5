/* The guard adaptor (debugging): canaries around every block, checked when it is freed, poison
 * on free, a quarantine that delays reuse, and strict handle checks (a pointer freed twice is
 * DOUBLE_FREE while it is still in quarantine; an unknown pointer or a wrong size is
 * INVALID_ARGUMENT).
 *
 * Layout of each upstream allocation: [canary][user bytes][canary], canaries filled with 0xCA by
 * cuMemsetD8Async on the allocating stream. canary_bytes is a multiple of 256, so user pointers
 * keep the 256-byte alignment the driver gives. A free synchronises the freeing stream (the caller
 * made it wait for every use), copies both canaries back (cuMemcpyDtoH) and compares; a damaged
 * canary gives CORRUPTED naming the tag, the pointer and the offset of the first bad byte
 * relative to the user pointer, and the block is released anyway. Then the user bytes are
 * poisoned with 0xDB on the stream and the block enters the quarantine FIFO with its stream;
 * the oldest blocks leave for upstream (freed on the stream they were freed on, so the poison
 * fill is ordered before any reuse) while the quarantine holds more than quarantine_count blocks
 * or quarantine_bytes bytes. Slow by design: one synchronisation and two copies per free.
 *
 * The guard lock is held through a whole free (checks, driver calls, upstream calls): it also
 * makes concurrent frees of one pointer resolve to one success and one DOUBLE_FREE.
 */
#include <string.h>

#include "lib/mem/mem.h"

#define CANARY 0xCA
#define POISON 0xDB
#define GUARD_MAX_CANARY (1u << 20)
#define GUARD_MAX_QUARANTINE (1u << 20)

typedef struct quarantined {
  CUdeviceptr p;            /* user pointer */
  uint64_t bytes;           /* user bytes */
  weft_stream_t *s;         /* the stream it was freed on */
  const char *tag;
} quarantined_t;

typedef struct guard {
  weft_resource_t base;     /* first */
  pthread_mutex_t lock;     /* rank 20; guards everything below; held across driver and upstream
                               calls of a free */
  weft__tracker_t *tr;
  weft_guard_options_t opt;
  weft__map_t live;         /* user pointer -> user bytes of every live block */
  quarantined_t *q;         /* ring [opt.quarantine_count] */
  size_t q_head, q_count;
  uint64_t q_bytes;         /* upstream bytes held in quarantine */
  uint64_t reserved, reserved_peak; /* upstream bytes: blocks with canaries, and the quarantine */
} guard_t;

weft_guard_options_t weft_guard_options_default(void) {
  weft_guard_options_t o;
  o.canary_bytes = 256;
  o.poison_on_free = 1;
  o.quarantine_count = 64;
  o.quarantine_bytes = 256ull << 20;
  return o;
}

static inline uint64_t total_of(const guard_t *g, uint64_t bytes) { return bytes + 2 * (uint64_t)g->opt.canary_bytes; }

/* ---- quarantine ------------------------------------------------------------------------------- */

static bool in_quarantine(const guard_t *g, CUdeviceptr p) {
  for (size_t k = 0; k < g->q_count; k++)
    if (g->q[(g->q_head + k) % g->opt.quarantine_count].p == p) return true;
  return false;
}

/* Sends the oldest quarantined block upstream. Locked. On failure it stays. */
static weft_status_t evict_one(guard_t *g) {
  quarantined_t *e = &g->q[g->q_head];
  uint64_t total = total_of(g, e->bytes);
  weft_status_t st = weft__resource_deallocate(g->base.upstream, e->p - g->opt.canary_bytes, total, e->s, e->tag);
  if (st != WEFT_OK) return st;
  g->q_head = (g->q_head + 1) % g->opt.quarantine_count;
  g->q_count--;
  g->q_bytes -= total;
  g->reserved -= total;
  return WEFT_OK;
}

/* ---- operations -------------------------------------------------------------------------------- */

static weft_status_t guard_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                    CUdeviceptr *out) {
  guard_t *g = (guard_t *)self;
  uint64_t total = total_of(g, bytes), c = g->opt.canary_bytes;
  weft_status_t st;
  pthread_mutex_lock(&g->lock);
  if (!weft__map_reserve(&g->live, 1)) {
    pthread_mutex_unlock(&g->lock);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "guard: no host memory for the live-block table");
  }
  CUdeviceptr base = 0;
  st = weft__resource_allocate(g->base.upstream, total, s, tag, &base);
  if (st == WEFT_OK && c != 0) {
    const weft__driver_t *drv = g->tr->drv;
    CUresult r = CUDA_SUCCESS;
    st = weft__tracker_bind(g->tr);
    if (st == WEFT_OK && (r = drv->cuMemsetD8Async(base, CANARY, c, s->raw)) == CUDA_SUCCESS)
      r = drv->cuMemsetD8Async(base + c + bytes, CANARY, c, s->raw);
    if (st == WEFT_OK && r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemsetD8Async (guard canary)");
    /* The canary fills are work on s: the block's first users elsewhere must follow them. */
    weft__tracker_touch(s);
    if (st != WEFT_OK) (void)weft__resource_deallocate(g->base.upstream, base, total, s, tag);
  }
  if (st != WEFT_OK) {
    pthread_mutex_unlock(&g->lock);
    return st;
  }
  *weft__map_insert(&g->live, base + c, NULL) = bytes;
  weft__mem_reserve(&g->reserved, &g->reserved_peak, total);
  pthread_mutex_unlock(&g->lock);
  *out = base + c;
  return WEFT_OK;
}

/* Copies both canaries back and finds the first bad byte; *bad_offset is relative to p. */
static weft_status_t check_canaries(guard_t *g, CUdeviceptr p, uint64_t bytes, bool *bad, long long *bad_offset) {
  uint64_t c = g->opt.canary_bytes;
  *bad = false;
  if (c == 0) return WEFT_OK;
  unsigned char *buf = weft__meta_alloc(2 * c);
  if (buf == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "guard: no host memory to read canaries");
  const weft__driver_t *drv = g->tr->drv;
  CUresult r;
  WEFT__RELAXED(drv, if ((r = drv->cuMemcpyDtoH(buf, p - c, c)) == CUDA_SUCCESS) r = drv->cuMemcpyDtoH(buf + c, p + bytes, c));
  if (r != CUDA_SUCCESS) {
    weft__meta_free(buf);
    return weft__driver_fail(r, "cuMemcpyDtoH (guard canary)");
  }
  for (uint64_t i = 0; i < 2 * c && !*bad; i++) {
    if (buf[i] == CANARY) continue;
    *bad = true;
    *bad_offset = i < c ? -(long long)(c - i) : (long long)(bytes + (i - c));
  }
  weft__meta_free(buf);
  return WEFT_OK;
}

static weft_status_t guard_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                      const char *tag) {
  guard_t *g = (guard_t *)self;
  uint64_t total = total_of(g, bytes);
  const weft__driver_t *drv = g->tr->drv;
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&g->lock);
  uint64_t *e = weft__map_find(&g->live, p);
  bool bad = false;
  long long bad_offset = 0;
  if (e == NULL) {
    st = in_quarantine(g, p)
             ? weft__error(WEFT_ERR_DOUBLE_FREE, "guard: 0x%llx (tag '%s') was already freed (it is in quarantine)",
                           (unsigned long long)p, tag)
             : weft__error(WEFT_ERR_INVALID_ARGUMENT, "guard: 0x%llx (tag '%s') is not a live block of this resource",
                           (unsigned long long)p, tag);
  } else if (*e != bytes) {
    st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "guard: 0x%llx (tag '%s') has %llu bytes, freed as %zu",
                     (unsigned long long)p, tag, (unsigned long long)*e, bytes);
  }
  if (st == WEFT_OK) st = weft__tracker_bind(g->tr);
  if (st == WEFT_OK) {
    CUresult r = CUDA_SUCCESS;
    if ((st = weft__tracker_hold(s, "guard deallocate")) == WEFT_OK) {
      WEFT__RELAXED(drv, r = drv->cuStreamSynchronize(s->raw));
      weft__tracker_unhold(s);
    }
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuStreamSynchronize (guard check)");
  }
  if (st == WEFT_OK) st = check_canaries(g, p, bytes, &bad, &bad_offset);
  /* Make room in the quarantine before touching the block: a failure leaves it intact. */
  bool keep = g->opt.quarantine_count > 0 && total <= g->opt.quarantine_bytes;
  while (st == WEFT_OK && keep && g->q_count > 0 &&
         (g->q_count == g->opt.quarantine_count || g->q_bytes + total > g->opt.quarantine_bytes))
    st = evict_one(g);
  if (st == WEFT_OK && g->opt.poison_on_free) {
    CUresult r = drv->cuMemsetD8Async(p, POISON, bytes, s->raw);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemsetD8Async (guard poison)");
    weft__tracker_touch(s); /* the memory's next user must follow the poison fill */
  }
  if (st == WEFT_OK && !keep) {
    st = weft__resource_deallocate(g->base.upstream, p - g->opt.canary_bytes, total, s, tag);
    if (st == WEFT_OK) g->reserved -= total;
  }
  if (st == WEFT_OK && keep) {
    quarantined_t *q = &g->q[(g->q_head + g->q_count) % g->opt.quarantine_count];
    q->p = p;
    q->bytes = bytes;
    q->s = s;
    q->tag = tag;
    g->q_count++;
    g->q_bytes += total;
  }
  if (st == WEFT_OK) weft__map_remove(&g->live, p);
  pthread_mutex_unlock(&g->lock);
  if (st == WEFT_OK && bad)
    return weft__error(WEFT_ERR_CORRUPTED,
                       "guard: block 0x%llx of %zu bytes (tag '%s'): canary overwritten, first bad byte at offset %+lld "
                       "(the block was freed)",
                       (unsigned long long)p, bytes, tag, bad_offset);
  return st;
}

static void guard_stats(const weft_resource_t *self, weft_resource_stats_t *out) {
  guard_t *g = (guard_t *)self;
  pthread_mutex_lock(&g->lock);
  out->reserved_bytes = g->reserved;
  out->reserved_peak = g->reserved_peak;
  pthread_mutex_unlock(&g->lock);
}

static weft_status_t guard_trim(weft_resource_t *self, size_t keep) {
  guard_t *g = (guard_t *)self;
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&g->lock);
  while (st == WEFT_OK && g->q_count > 0) st = evict_one(g);
  pthread_mutex_unlock(&g->lock);
  return st == WEFT_OK ? weft__resource_trim(self->upstream, keep) : st;
}

static weft_status_t guard_destroy(weft_resource_t *self) {
  guard_t *g = (guard_t *)self;
  /* Every quarantined block goes back; one that upstream refuses is reported and left behind. */
  weft_status_t first = WEFT_OK;
  while (g->q_count > 0) {
    weft_status_t st = evict_one(g);
    if (st == WEFT_OK) continue;
    if (first == WEFT_OK) first = st;
    g->q_head = (g->q_head + 1) % g->opt.quarantine_count;
    g->q_count--;
  }
  weft__meta_free(g->q);
  weft__map_free(&g->live);
  pthread_mutex_destroy(&g->lock);
  weft__meta_free(g);
  return first;
}

const weft_resource_ops_t weft__guard_ops = {
    .name = "guard",
    .allocate = guard_allocate,
    .deallocate = guard_deallocate,
    .stats = guard_stats,
    .trim = guard_trim,
    .destroy = guard_destroy,
};

weft_status_t weft__guard_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream,
                                 const weft_guard_options_t *opts, weft_resource_t **out) {
  static const char who[] = "weft_guard_create";
  weft_status_t st;
  if ((st = weft__mem_check_upstream(who, rt, upstream)) != WEFT_OK) return st;
  weft_guard_options_t o = opts ? *opts : weft_guard_options_default();
  if (o.canary_bytes % 256 != 0 || o.canary_bytes > GUARD_MAX_CANARY)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: canary_bytes %zu must be a multiple of 256 up to %u", who,
                       o.canary_bytes, GUARD_MAX_CANARY);
  if (o.quarantine_count > GUARD_MAX_QUARANTINE)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: quarantine_count %zu above %u", who, o.quarantine_count,
                       GUARD_MAX_QUARANTINE);
  guard_t *g = weft__meta_calloc(1, sizeof *g);
  if (g == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  if (o.quarantine_count > 0 && (g->q = weft__meta_calloc(o.quarantine_count, sizeof *g->q)) == NULL) {
    weft__meta_free(g);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory for the quarantine", who);
  }
  if ((st = weft__mem_lock_init(&g->lock, who)) != WEFT_OK) {
    weft__meta_free(g->q);
    weft__meta_free(g);
    return st;
  }
  weft__resource_init(&g->base, &weft__guard_ops, upstream, rt);
  g->tr = tr;
  g->opt = o;
  *out = &g->base;
  return WEFT_OK;
}
