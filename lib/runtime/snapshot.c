/* weft_memory_snapshot: the runtime's device memory as JSON (weft.h), for people and for
 * tools/weft_view.html. Collected first (live blocks under the block table's lock, segments and
 * free ranges from each resource of the stack under its own lock), written afterwards. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/core/trace.h"
#include "lib/runtime/runtime.h"

typedef struct snap_block {
  CUdeviceptr ptr;
  uint64_t bytes, gen, alloc_ns;
  const char *tag;
  unsigned stream;
  bool cached; /* kept by its stream's cache (cache.c): freed, memory still held */
} snap_block_t;

typedef struct snap_seg {
  weft_segment_t s;
  const char *owner; /* the resource's name: "pool", "graph pool" */
} snap_seg_t;

typedef struct collect {
  weft__vec_t seg;   /* snap_seg_t */
  weft__vec_t fr;    /* weft_free_range_t */
  const char *owner; /* the resource being asked */
  bool oom;
} collect_t;

static void on_segment(void *ctx, const weft_segment_t *s) {
  collect_t *c = ctx;
  snap_seg_t *e = weft__vec_push(&c->seg);
  if (e != NULL) *e = (snap_seg_t){*s, c->owner};
  else c->oom = true;
}

static void on_free(void *ctx, const weft_free_range_t *r) {
  collect_t *c = ctx;
  weft_free_range_t *e = weft__vec_push(&c->fr);
  if (e != NULL) *e = *r;
  else c->oom = true;
}

static int by_block(const void *a, const void *b) {
  CUdeviceptr x = ((const snap_block_t *)a)->ptr, y = ((const snap_block_t *)b)->ptr;
  return x < y ? -1 : x > y;
}
static int by_segment(const void *a, const void *b) {
  CUdeviceptr x = ((const snap_seg_t *)a)->s.base, y = ((const snap_seg_t *)b)->s.base;
  return x < y ? -1 : x > y;
}
static int by_range(const void *a, const void *b) {
  CUdeviceptr x = ((const weft_free_range_t *)a)->ptr, y = ((const weft_free_range_t *)b)->ptr;
  return x < y ? -1 : x > y;
}

/* A JSON string (weft__json_escape, a piece at a time). */
static void put_string(FILE *out, const char *s) {
  fputc('"', out);
  for (size_t done = 0, len = strlen(s ? s : ""); done < len;) {
    char buf[256];
    size_t at = 0, used = weft__json_escape(buf, &at, sizeof buf, s + done);
    fputs(buf, out);
    done += used;
  }
  fputc('"', out);
}

static void put_block(FILE *out, const snap_block_t *b, bool first) {
  fprintf(out, "%s\n      {\"ptr\": \"0x%llx\", \"bytes\": %" PRIu64 ", \"tag\": ", first ? "" : ",",
          (unsigned long long)b->ptr, b->bytes);
  put_string(out, b->tag);
  fprintf(out, ", \"stream\": %u, \"state\": \"%s\", \"generation\": %" PRIu64 ", \"alloc_ns\": %" PRIu64 "}",
          b->stream, b->cached ? "cached" : "live", b->gen, b->alloc_ns);
}

/* Moves the cached blocks of blk[0..*nb) to the end, keeping both parts in order; returns how
 * many are cached (they stay out of the segments' block lists and the live totals). */
static size_t split_cached(snap_block_t *blk, size_t *nb) {
  size_t live = 0, n = *nb;
  snap_block_t *tmp = weft__meta_calloc(n + 1, sizeof *tmp);
  if (tmp == NULL) return 0; /* no host memory: cached blocks show among the live ones */
  size_t c = 0;
  for (size_t k = 0; k < n; k++)
    if (blk[k].cached) tmp[c++] = blk[k];
    else blk[live++] = blk[k];
  memcpy(blk + live, tmp, c * sizeof *tmp);
  weft__meta_free(tmp);
  *nb = live;
  return c;
}

weft_status_t weft_memory_snapshot(weft_runtime_t *rt, FILE *out) {
  if (weft__runtime_check(rt, "weft_memory_snapshot") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_memory_snapshot: out is NULL");
  /* Live blocks. */
  pthread_mutex_lock(&rt->blocks_lock);
  size_t nb = 0, cap = rt->live_count;
  snap_block_t *blk = weft__meta_calloc(cap + 1, sizeof *blk);
  for (const struct weft__block *b = rt->live; blk != NULL && b != NULL && nb < cap; b = b->next) {
    uint64_t life = weft__block_life(b);
    blk[nb++] = (snap_block_t){b->ptr, b->bytes, weft__life_gen(life), __atomic_load_n(&b->alloc_ns, __ATOMIC_RELAXED),
                               weft__block_tag(b), __atomic_load_n(&b->alloc_stream, __ATOMIC_RELAXED),
                               weft__life_state(life) == WEFT__BLOCK_CACHED};
  }
  pthread_mutex_unlock(&rt->blocks_lock);
  if (blk == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_memory_snapshot: no host memory");
  /* Segments and free ranges of every resource of the stack that has them. */
  collect_t c = {WEFT__VEC_INIT(snap_seg_t), WEFT__VEC_INIT(weft_free_range_t), NULL, false};
  weft_resource_t *top = weft_runtime_resource(rt);
  for (weft_resource_t *r = top; r != NULL; r = r->upstream)
    if (r->ops->segments != NULL) {
      c.owner = r->ops->name;
      r->ops->segments(r, on_segment, on_free, &c);
    }
  /* And the memory outside the stack (graph pools), listed while they live. */
  pthread_mutex_lock(&rt->blocks_lock);
  for (size_t i = 0; i < rt->side.len; i++) {
    weft_resource_t *r = WEFT__VEC_AT(&rt->side, weft_resource_t *, i);
    c.owner = r->ops->name;
    r->ops->segments(r, on_segment, on_free, &c);
  }
  pthread_mutex_unlock(&rt->blocks_lock);
  if (c.oom) {
    weft__meta_free(blk);
    weft__vec_free(&c.seg);
    weft__vec_free(&c.fr);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_memory_snapshot: no host memory");
  }
  const snap_seg_t *seg = c.seg.data;
  const weft_free_range_t *fr = c.fr.data;
  size_t n_seg = c.seg.len, n_fr = c.fr.len;
  qsort(blk, nb, sizeof *blk, by_block);
  size_t n_cached = split_cached(blk, &nb);
  const snap_block_t *cached = blk + nb;
  if (n_seg) qsort(c.seg.data, n_seg, sizeof *seg, by_segment);
  if (n_fr) qsort(c.fr.data, n_fr, sizeof *fr, by_range);
  weft_resource_stats_t rs;
  weft_resource_stats(top, &rs);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  uint64_t now_ns = (uint64_t)now.tv_sec * UINT64_C(1000000000) + (uint64_t)now.tv_nsec;
  fprintf(out, "{\n  \"weft_snapshot\": 1,\n  \"device\": %d,\n  \"time_ns\": %" PRIu64 ",\n", rt->ordinal, now_ns);
  fprintf(out, "  \"resource\": {\"name\": ");
  put_string(out, top->ops->name);
  fprintf(out, ", \"live_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64 "},\n  \"segments\": [", rs.live_bytes,
          rs.reserved_bytes);
  /* Each segment with the blocks and free ranges inside it (all three lists are sorted). */
  size_t bi = 0, fi = 0;
  bool *placed = calloc(nb + 1, sizeof *placed);
  uint64_t seg_bytes = 0, free_bytes = 0, largest = 0;
  for (size_t s = 0; s < n_seg; s++) {
    const weft_segment_t *g = &seg[s].s;
    seg_bytes += g->bytes;
    fprintf(out, "%s\n    {\"base\": \"0x%llx\", \"bytes\": %" PRIu64 ", \"owner\": ", s ? "," : "",
            (unsigned long long)g->base, g->bytes);
    put_string(out, seg[s].owner);
    fprintf(out, ", \"dedicated\": %s, \"blocks\": [", g->dedicated ? "true" : "false");
    while (bi < nb && blk[bi].ptr < g->base) bi++;
    bool first = true;
    for (size_t k = bi; k < nb && blk[k].ptr - g->base < g->bytes; k++) {
      put_block(out, &blk[k], first);
      first = false;
      if (placed) placed[k] = true;
    }
    fprintf(out, "],\n     \"free\": [");
    while (fi < n_fr && fr[fi].ptr < g->base) fi++;
    first = true;
    for (size_t k = fi; k < n_fr && fr[k].ptr - g->base < g->bytes; k++) {
      fprintf(out, "%s{\"ptr\": \"0x%llx\", \"bytes\": %" PRIu64 ", \"lane\": %u}", first ? "" : ", ",
              (unsigned long long)fr[k].ptr, fr[k].bytes, fr[k].lane);
      first = false;
    }
    fprintf(out, "]}");
  }
  for (size_t k = 0; k < n_fr; k++) {
    free_bytes += fr[k].bytes;
    if (fr[k].bytes > largest) largest = fr[k].bytes;
  }
  fprintf(out, "\n  ],\n  \"blocks_outside_segments\": [");
  bool first = true;
  for (size_t k = 0; k < nb; k++)
    if (placed == NULL || !placed[k]) {
      put_block(out, &blk[k], first);
      first = false;
    }
  free(placed);
  /* Blocks the streams cached (cache.c): freed, their memory still held for reuse. */
  fprintf(out, "\n  ],\n  \"cached\": [");
  uint64_t cached_bytes = 0;
  for (size_t k = 0; k < n_cached; k++) {
    put_block(out, &cached[k], k == 0);
    cached_bytes += cached[k].bytes;
  }
  /* Totals. */
  weft__tally_t *tags = calloc(1, sizeof *tags), *streams = calloc(1, sizeof *streams);
  uint64_t live = 0;
  for (size_t k = 0; k < nb; k++) {
    live += blk[k].bytes;
    if (tags) weft__tally_add(tags, blk[k].tag, blk[k].bytes);
    if (streams) weft__tally_add(streams, (const void *)(uintptr_t)(blk[k].stream + 1), blk[k].bytes);
  }
  fprintf(out, "\n  ],\n  \"totals\": {\"blocks\": %zu, \"live_bytes\": %" PRIu64 ", \"cached_blocks\": %zu"
               ", \"cached_bytes\": %" PRIu64 ", \"segment_bytes\": %" PRIu64 ", \"free_bytes\": %" PRIu64
               ", \"largest_free\": %" PRIu64 ", \"fragmentation\": %.6f},\n  \"by_owner\": [",
          nb, live, n_cached, cached_bytes, seg_bytes, free_bytes, largest,
          free_bytes ? 1.0 - (double)largest / (double)free_bytes : 0.0);
  /* Segment bytes by owner (the stack's pool, graph pools). */
  weft__tally_t *owners = calloc(1, sizeof *owners);
  for (size_t k = 0; owners != NULL && k < n_seg; k++) weft__tally_add(owners, seg[k].owner, seg[k].s.bytes);
  for (size_t i = 0; owners != NULL && i < owners->n; i++) {
    fprintf(out, "%s{\"owner\": ", i ? ", " : "");
    put_string(out, owners->key[i]);
    fprintf(out, ", \"bytes\": %" PRIu64 ", \"segments\": %" PRIu64 "}", owners->bytes[i], owners->count[i]);
  }
  free(owners);
  fprintf(out, "],\n  \"by_tag\": [");
  for (size_t i = 0; tags != NULL && i < tags->n; i++) {
    fprintf(out, "%s{\"tag\": ", i ? ", " : "");
    put_string(out, tags->key[i]);
    fprintf(out, ", \"bytes\": %" PRIu64 ", \"blocks\": %" PRIu64 "}", tags->bytes[i], tags->count[i]);
  }
  fprintf(out, "],\n  \"by_stream\": [");
  for (size_t i = 0; streams != NULL && i < streams->n; i++)
    fprintf(out, "%s{\"stream\": %u, \"bytes\": %" PRIu64 ", \"blocks\": %" PRIu64 "}", i ? ", " : "",
            (unsigned)((uintptr_t)streams->key[i] - 1), streams->bytes[i], streams->count[i]);
  fprintf(out, "]\n}\n");
  free(tags);
  free(streams);
  weft__meta_free(blk);
  weft__vec_free(&c.seg);
  weft__vec_free(&c.fr);
  return ferror(out) ? weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_memory_snapshot: writing failed") : WEFT_OK;
}
