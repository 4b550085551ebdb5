/* The stats adaptor: current, peak and totals per tag (weft_stats_by_tag), on top of the counts
 * weft keeps for every resource (weft_resource_stats). Tags are interned by the runtime, so the
 * table is keyed by the tag pointer; each entry keeps its own copy of the text for reporting, so
 * a caller's non-interned tag may go away. Entries are created before upstream is asked, so a
 * full host heap fails the call cleanly instead of losing a count. */
#include <string.h>

#include "lib/core/container.h"
#include "lib/mem/mem.h"

typedef struct tag_entry {
  char *name;               /* owned copy of the text */
  uint64_t live_bytes, live_peak, allocs, frees;
} tag_entry_t;

typedef struct stats {
  weft_resource_t base;     /* first */
  pthread_mutex_t lock;     /* rank 20; guards the table; not held across upstream */
  weft__map_t by_tag;       /* tag pointer -> entries index + 1 */
  weft__vec_t entries;      /* tag_entry_t */
} stats_t;

static tag_entry_t *lookup(const stats_t *s, const char *tag) {
  const uint64_t *i = weft__map_find(&s->by_tag, (uint64_t)(uintptr_t)tag);
  return i != NULL ? &WEFT__VEC_AT(&s->entries, tag_entry_t, *i - 1) : NULL;
}

/* The entry of `tag`, created if new; NULL when host memory is short (nothing changed). Locked. */
static tag_entry_t *entry(stats_t *s, const char *tag) {
  tag_entry_t *e = lookup(s, tag);
  if (e != NULL) return e;
  char *name = weft__meta_strdup(tag);
  if (name == NULL || !weft__map_reserve(&s->by_tag, 1) || !weft__vec_reserve(&s->entries, 1)) {
    weft__meta_free(name);
    return NULL;
  }
  e = weft__vec_push(&s->entries);
  e->name = name;
  *weft__map_insert(&s->by_tag, (uint64_t)(uintptr_t)tag, NULL) = s->entries.len;
  return e;
}

static weft_status_t stats_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *str, const char *tag,
                                    CUdeviceptr *out) {
  stats_t *s = (stats_t *)self;
  pthread_mutex_lock(&s->lock);
  tag_entry_t *e = entry(s, tag);
  pthread_mutex_unlock(&s->lock);
  if (e == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "stats: no host memory for tag '%s'", tag);
  weft_status_t st = weft__resource_allocate(s->base.upstream, bytes, str, tag, out);
  if (st != WEFT_OK) return st;
  pthread_mutex_lock(&s->lock);
  e = lookup(s, tag); /* the table may have grown meanwhile */
  e->live_bytes += bytes;
  if (e->live_bytes > e->live_peak) e->live_peak = e->live_bytes;
  e->allocs++;
  pthread_mutex_unlock(&s->lock);
  return WEFT_OK;
}

static weft_status_t stats_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *str,
                                      const char *tag) {
  stats_t *s = (stats_t *)self;
  weft_status_t st = weft__resource_deallocate(s->base.upstream, p, bytes, str, tag);
  if (st != WEFT_OK) return st;
  pthread_mutex_lock(&s->lock);
  tag_entry_t *e = lookup(s, tag);
  if (e != NULL) {
    e->live_bytes -= e->live_bytes < bytes ? e->live_bytes : bytes;
    e->frees++;
  }
  pthread_mutex_unlock(&s->lock);
  return WEFT_OK;
}

static weft_status_t stats_destroy(weft_resource_t *self) {
  stats_t *s = (stats_t *)self;
  for (size_t i = 0; i < s->entries.len; i++) weft__meta_free(WEFT__VEC_AT(&s->entries, tag_entry_t, i).name);
  weft__vec_free(&s->entries);
  weft__map_free(&s->by_tag);
  pthread_mutex_destroy(&s->lock);
  weft__meta_free(s);
  return WEFT_OK;
}

const weft_resource_ops_t weft__stats_ops = {
    .name = "stats",
    .allocate = stats_allocate,
    .deallocate = stats_deallocate,
    .destroy = stats_destroy,
};

weft_status_t weft__stats_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream,
                                 weft_resource_t **out) {
  static const char who[] = "weft_stats_create";
  weft_status_t st;
  (void)tr;
  if ((st = weft__mem_check_upstream(who, rt, upstream)) != WEFT_OK) return st;
  stats_t *s = weft__meta_calloc(1, sizeof *s);
  if (s == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  if ((st = weft__mem_lock_init(&s->lock, who)) != WEFT_OK) {
    weft__meta_free(s);
    return st;
  }
  s->entries = WEFT__VEC_INIT(tag_entry_t);
  weft__resource_init(&s->base, &weft__stats_ops, upstream, rt);
  *out = &s->base;
  return WEFT_OK;
}

size_t weft_stats_by_tag(const weft_resource_t *r, weft_tag_stats_t *out, size_t max) {
  if (r == NULL || r->ops != &weft__stats_ops) return 0;
  stats_t *s = (stats_t *)r;
  size_t n = 0;
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->entries.len; i++) {
    const tag_entry_t *e = &WEFT__VEC_AT(&s->entries, tag_entry_t, i);
    if (e->allocs == 0) continue;
    if (out != NULL && n < max)
      out[n] = (weft_tag_stats_t){e->name, e->live_bytes, e->live_peak, e->allocs, e->frees};
    n++;
  }
  pthread_mutex_unlock(&s->lock);
  return n;
}
