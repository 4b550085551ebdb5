/* The stats adaptor: current, peak and totals, overall (weft_resource_stats) and per tag
 * (weft_stats_by_tag). Tags are interned by the runtime, so the table is keyed by the tag
 * pointer (open addressing, linear probing); each entry keeps its own copy of the text for
 * reporting, so a caller's non-interned tag may go away. Entries are created before upstream is
 * asked, so a full host heap fails the call cleanly instead of losing a count. */
#include <string.h>

#include "lib/mem/mem.h"

typedef struct tag_entry {
  const char *key;          /* the tag pointer as passed; NULL = empty slot */
  char *name;               /* owned copy of the text */
  uint64_t live_bytes, live_peak, allocs, frees;
} tag_entry_t;

typedef struct stats {
  weft_resource_t base;     /* first */
  pthread_mutex_t lock;     /* rank 20; guards everything below; not held across upstream */
  weft_resource_stats_t st; /* live == reserved: a pass-through */
  tag_entry_t *tab;         /* [cap] */
  size_t cap, count;        /* cap a power of two, count <= cap / 2 */
} stats_t;

static size_t slot_of(const stats_t *s, const char *key) {
  return (size_t)((((uintptr_t)key >> 3) * 0x9E3779B97F4A7C15ull) >> 32) & (s->cap - 1);
}

static tag_entry_t *lookup(const stats_t *s, const char *key) {
  if (s->cap == 0) return NULL;
  for (size_t i = slot_of(s, key);; i = (i + 1) & (s->cap - 1)) {
    if (s->tab[i].key == key) return &s->tab[i];
    if (s->tab[i].key == NULL) return NULL;
  }
}

/* The entry of `key`, created if new; NULL when host memory is short. Locked. */
static tag_entry_t *entry(stats_t *s, const char *key) {
  tag_entry_t *e = lookup(s, key);
  if (e != NULL) return e;
  if ((s->count + 1) * 2 > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 32;
    tag_entry_t *tab = weft__meta_calloc(cap, sizeof *tab);
    if (tab == NULL) return NULL;
    tag_entry_t *old = s->tab;
    size_t old_cap = s->cap;
    s->tab = tab;
    s->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
      if (old[i].key == NULL) continue;
      size_t j = slot_of(s, old[i].key);
      while (tab[j].key != NULL) j = (j + 1) & (cap - 1);
      tab[j] = old[i];
    }
    weft__meta_free(old);
  }
  char *name = weft__meta_strdup(key);
  if (name == NULL) return NULL;
  size_t j = slot_of(s, key);
  while (s->tab[j].key != NULL) j = (j + 1) & (s->cap - 1);
  e = &s->tab[j];
  memset(e, 0, sizeof *e);
  e->key = key;
  e->name = name;
  s->count++;
  return e;
}

static weft_status_t stats_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *str, const char *tag,
                                    CUdeviceptr *out) {
  stats_t *s = (stats_t *)self;
  pthread_mutex_lock(&s->lock);
  tag_entry_t *e = entry(s, tag);
  if (e == NULL) s->st.failures++;
  pthread_mutex_unlock(&s->lock);
  if (e == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "stats: no host memory for tag '%s'", tag);
  CUdeviceptr p = 0;
  weft_status_t st = s->base.upstream->ops->allocate(s->base.upstream, bytes, str, tag, &p);
  pthread_mutex_lock(&s->lock);
  if (st == WEFT_OK) {
    e = lookup(s, tag); /* the table may have grown meanwhile */
    e->live_bytes += bytes;
    if (e->live_bytes > e->live_peak) e->live_peak = e->live_bytes;
    e->allocs++;
    weft__rstats_live(&s->st, bytes);
    weft__rstats_reserve(&s->st, bytes);
  } else {
    s->st.failures++;
  }
  pthread_mutex_unlock(&s->lock);
  if (st == WEFT_OK) *out = p;
  return st;
}

static weft_status_t stats_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *str,
                                      const char *tag) {
  stats_t *s = (stats_t *)self;
  weft_status_t st = s->base.upstream->ops->deallocate(s->base.upstream, p, bytes, str, tag);
  pthread_mutex_lock(&s->lock);
  if (st == WEFT_OK) {
    tag_entry_t *e = lookup(s, tag);
    if (e != NULL) {
      e->live_bytes -= e->live_bytes < bytes ? e->live_bytes : bytes;
      e->frees++;
    }
    weft__rstats_unlive(&s->st, bytes);
    weft__rstats_unreserve(&s->st, bytes);
  } else {
    s->st.failures++;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

static void stats_stats(const weft_resource_t *self, weft_resource_stats_t *out) {
  stats_t *s = (stats_t *)self;
  pthread_mutex_lock(&s->lock);
  *out = s->st;
  pthread_mutex_unlock(&s->lock);
}

static weft_status_t stats_trim(weft_resource_t *self, size_t keep) {
  weft_resource_t *up = self->upstream;
  return up->ops->trim ? up->ops->trim(up, keep) : WEFT_OK;
}

static void stats_destroy(weft_resource_t *self) {
  stats_t *s = (stats_t *)self;
  for (size_t i = 0; i < s->cap; i++) weft__meta_free(s->tab[i].name);
  weft__meta_free(s->tab);
  pthread_mutex_destroy(&s->lock);
  weft__meta_free(s);
}

const weft_resource_ops_t weft__stats_ops = {
    .name = "stats",
    .allocate = stats_allocate,
    .deallocate = stats_deallocate,
    .stats = stats_stats,
    .trim = stats_trim,
    .destroy = stats_destroy,
};

weft_status_t weft_stats_create(weft_runtime_t *rt, weft_resource_t *upstream, weft_resource_t **out) {
  static const char who[] = "weft_stats_create";
  weft_status_t st;
  weft__tracker_t *tr = weft__mem_tracker(who, rt, &st);
  if (tr == NULL) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
  if ((st = weft__mem_check_upstream(who, rt, upstream)) != WEFT_OK) return st;
  stats_t *s = weft__meta_calloc(1, sizeof *s);
  if (s == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  if ((st = weft__mem_lock_init(&s->lock, who)) != WEFT_OK) {
    weft__meta_free(s);
    return st;
  }
  s->base.ops = &weft__stats_ops;
  s->base.upstream = upstream;
  s->base.rt = rt;
  *out = &s->base;
  return WEFT_OK;
}

size_t weft_stats_by_tag(const weft_resource_t *r, weft_tag_stats_t *out, size_t max) {
  if (r == NULL || r->ops != &weft__stats_ops) return 0;
  stats_t *s = (stats_t *)r;
  size_t n = 0;
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->cap; i++) {
    const tag_entry_t *e = &s->tab[i];
    if (e->key == NULL || e->allocs == 0) continue;
    if (out != NULL && n < max) {
      out[n].tag = e->name;
      out[n].live_bytes = e->live_bytes;
      out[n].live_peak = e->live_peak;
      out[n].allocs = e->allocs;
      out[n].frees = e->frees;
    }
    n++;
  }
  pthread_mutex_unlock(&s->lock);
  return n;
}
