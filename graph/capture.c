/* Capture: the public capture API, and what weft_alloc / weft_free do inside a capture (graph
 * memory nodes or graph-pool ranges), installed as lib's hooks when graph/ is loaded. */
#include <stddef.h>
#include <string.h>

#include "graph/graph.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"

#define REC_OF(state) ((struct weft__block *)((char *)(state) - offsetof(struct weft__block, acc)))

weft_capture_options_t weft_capture_options_default(void) {
  return (weft_capture_options_t){WEFT_CAPTURE_GLOBAL, WEFT_GRAPH_MEMORY_NODES, NULL};
}

static CUstreamCaptureMode cu_mode(weft_capture_mode_t m) {
  return m == WEFT_CAPTURE_THREAD_LOCAL ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
         : m == WEFT_CAPTURE_RELAXED    ? CU_STREAM_CAPTURE_MODE_RELAXED
                                        : CU_STREAM_CAPTURE_MODE_GLOBAL;
}

static weft__gsession_t *session_new(weft__capture_t *cap, const weft_capture_options_t *o, weft_status_t *st) {
  weft__gsession_t *gs = weft__meta_calloc(1, sizeof *gs);
  if (gs == NULL) {
    *st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_capture_begin: no host memory");
    return NULL;
  }
  gs->cap = cap;
  gs->opts = *o;
  if (o->memory == WEFT_GRAPH_MEMORY_PRIVATE_POOL) {
    if (o->pool != NULL) {
      gs->pool = o->pool;
    } else if ((*st = weft__gpool_new(cap->origin->runtime, &gs->pool)) != WEFT_OK) {
      weft__meta_free(gs);
      return NULL;
    } else {
      gs->own_pool = true;
    }
    gs->pool->users++;
  }
  cap->owner = gs;
  *st = WEFT_OK;
  return gs;
}

/* Foreign captures get a session with the default options (graph memory nodes). */
static void on_foreign(weft__capture_t *c, bool adopted) {
  if (adopted) {
    weft_capture_options_t o = weft_capture_options_default();
    weft_status_t st;
    (void)session_new(c, &o, &st);
    return;
  }
  /* The owner ended it: blocks weft allocated inside belong to the owner's graph now. */
  weft__gsession_t *gs = c->owner;
  if (gs != NULL) {
    for (size_t i = 0; i < gs->n_allocs; i++)
      if (gs->allocs[i] != NULL) weft__block_forget(gs->allocs[i]);
    weft__meta_free(gs->allocs);
    weft__meta_free(gs);
  }
  weft__capture_free(c);
}

weft_status_t weft_capture_begin(weft_stream_t *s, const weft_capture_options_t *opts) {
  weft_status_t st = weft__stream_check(s, "weft_capture_begin");
  if (st != WEFT_OK) return st;
  weft_capture_options_t o = opts ? *opts : weft_capture_options_default();
  if (o.mode > WEFT_CAPTURE_RELAXED || o.memory > WEFT_GRAPH_MEMORY_PRIVATE_POOL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_capture_begin: bad mode or memory policy");
  if (o.pool != NULL && o.pool->rt != s->runtime)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_capture_begin: the graph pool belongs to another runtime");
  if ((st = weft__tracker_bind(s->tr)) != WEFT_OK || (st = weft__capture_sync_state(s)) != WEFT_OK) return st;
  if (s->capture != NULL)
    return weft__error(WEFT_ERR_CAPTURE, "weft_capture_begin: stream %u already takes part in a capture", s->index);
  weft__capture_t *cap;
  if ((st = weft__capture_begin(s, cu_mode(o.mode), false, 0, &cap)) != WEFT_OK) return st;
  if (session_new(cap, &o, &st) == NULL) {
    CUgraph g;
    if (weft__capture_end(cap, &g) == WEFT_OK && g != NULL) s->tr->drv->cuGraphDestroy(g);
    weft__capture_free(cap);
    return st;
  }
  return WEFT_OK;
}

weft_status_t weft_capture_join(weft_stream_t *origin, weft_stream_t *t) {
  weft_status_t st = weft__stream_check(origin, "weft_capture_join");
  if (st == WEFT_OK) st = weft__stream_check(t, "weft_capture_join");
  if (st != WEFT_OK) return st;
  if (origin->capture == NULL || origin->capture->origin != origin)
    return weft__error(WEFT_ERR_CAPTURE, "weft_capture_join: stream %u is not the origin of a capture", origin->index);
  if ((st = weft__tracker_bind(t->tr)) != WEFT_OK) return st;
  return weft__capture_join(origin->capture, t);
}

/* Drops what a session holds after its capture ended (or failed): blocks allocated inside
 * become stale; graph-pool ranges of failed captures go back to the pool. */
static void session_free(weft__gsession_t *gs, bool graph_made) {
  for (size_t i = 0; i < gs->n_allocs; i++) {
    struct weft__block *rec = gs->allocs[i];
    if (rec == NULL) continue;
    if (!graph_made && gs->pool != NULL)
      (void)weft__gpool_free(gs->pool, rec->ptr, rec->bytes, NULL, (weft__point_t){0, 0});
    weft__block_forget(rec);
  }
  if (gs->pool != NULL) {
    weft__gpool_settle(gs->pool, gs->cap);
    if (!graph_made) {
      gs->pool->users--;
      if (gs->own_pool) (void)weft_graph_pool_destroy(gs->pool);
    }
  }
  weft__meta_free(gs->allocs);
  weft__meta_free(gs);
}

weft_status_t weft_capture_end(weft_stream_t *s, weft_graph_t **out) {
  weft_status_t st = weft__stream_check(s, "weft_capture_end");
  if (st != WEFT_OK) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_capture_end: out is NULL");
  weft__capture_t *cap = s->capture;
  if (cap == NULL || cap->origin != s || cap->foreign)
    return weft__error(WEFT_ERR_CAPTURE, "weft_capture_end: stream %u is not the origin of a weft capture", s->index);
  weft__gsession_t *gs = cap->owner;
  weft_runtime_t *rt = s->runtime;
  if ((st = weft__tracker_bind(s->tr)) != WEFT_OK) return st;
  CUgraph g = NULL;
  st = weft__capture_end(cap, &g);
  /* The summary: blocks from outside the capture, as handles of their current generation. */
  weft__gsummary_t *summary = NULL;
  weft__goutput_t *outputs = NULL;
  size_t ns = 0, no = 0;
  if (st == WEFT_OK) {
    summary = weft__meta_calloc(cap->count + 1, sizeof *summary);
    outputs = weft__meta_calloc(gs->n_allocs + 1, sizeof *outputs);
    if (summary == NULL || outputs == NULL) st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_capture_end: no host memory");
  }
  if (st == WEFT_OK) {
    for (size_t i = 0; i < cap->count; i++) {
      const weft__capture_block_t *b = &cap->blocks[i];
      if (b->internal) continue;
      struct weft__block *rec = REC_OF(b->live);
      summary[ns++] = (weft__gsummary_t){{rec, atomic_load(&rec->gen)}, b->kind};
    }
    for (size_t i = 0; i < gs->n_allocs; i++) {
      struct weft__block *rec = gs->allocs[i];
      if (rec != NULL) outputs[no++] = (weft__goutput_t){rec->ptr, rec->bytes, rec->tag};
    }
  }
  weft_graph_t *graph = NULL;
  if (st == WEFT_OK)
    st = weft__graph_make(rt, g, gs->opts.memory, gs->pool, gs->own_pool, summary, ns, outputs, no, &graph);
  if (st != WEFT_OK) {
    weft__meta_free(summary);
    weft__meta_free(outputs);
    if (g != NULL) s->tr->drv->cuGraphDestroy(g);
  }
  session_free(gs, st == WEFT_OK);
  weft__capture_free(cap);
  if (st == WEFT_OK) *out = graph;
  return st;
}

weft_status_t weft_capture_run(weft_stream_t *s, const weft_capture_options_t *opts,
                               weft_status_t (*fn)(weft_stream_t *s, void *user), void *user, weft_graph_t **out) {
  if (fn == NULL || out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_capture_run: fn or out is NULL");
  weft_status_t st = weft_capture_begin(s, opts);
  if (st != WEFT_OK) return st;
  weft_status_t body = fn(s, user);
  char why[256];
  if (body != WEFT_OK) snprintf(why, sizeof why, "%s", weft_last_error());
  weft_graph_t *g = NULL;
  st = weft_capture_end(s, &g);
  if (body != WEFT_OK) {
    if (g != NULL) (void)weft_graph_destroy(g);
    return weft__error(body, "%s", why);
  }
  if (st == WEFT_OK) *out = g;
  return st;
}

/* ---- weft_alloc / weft_free inside a capture ------------------------------------------------- */

static bool remember_alloc(weft__gsession_t *gs, struct weft__block *rec) {
  if (gs->n_allocs == gs->cap_allocs) {
    size_t cap = gs->cap_allocs ? gs->cap_allocs * 2 : 16;
    struct weft__block **a = weft__meta_realloc(gs->allocs, cap * sizeof *a);
    if (a == NULL) return false;
    gs->allocs = a;
    gs->cap_allocs = cap;
  }
  gs->allocs[gs->n_allocs++] = rec;
  return true;
}

static weft_status_t alloc_hook(weft_stream_t *s, size_t bytes, const char *tag, weft_block_t *out, bool *handled) {
  weft_status_t st = weft__tracker_bind(s->tr);
  if (st == WEFT_OK) st = weft__capture_sync_state(s);
  if (st != WEFT_OK || s->capture == NULL) {
    *handled = st != WEFT_OK;
    return st;
  }
  *handled = true;
  weft__capture_t *cap = s->capture;
  weft__gsession_t *gs = cap->owner;
  weft_runtime_t *rt = s->runtime;
  struct weft__block *rec = weft__block_take(rt);
  if (rec == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_alloc: no host memory for a block record");
  CUdeviceptr p = 0;
  weft__point_t first = {0, 0};
  if (gs->pool != NULL) {
    st = weft__gpool_alloc(gs->pool, bytes, cap, &p, &first);
  } else {
    CUresult r = s->tr->drv->cuMemAllocAsync(&p, bytes, s->raw);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemAllocAsync (in capture)");
    else {
      weft__tracker_touch(s); /* the allocation node is work on s */
      first = weft__tracker_point(s);
    }
  }
  if (st == WEFT_OK && !remember_alloc(gs, rec)) {
    st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_alloc: no host memory");
    if (gs->pool != NULL) (void)weft__gpool_free(gs->pool, p, bytes, cap, first);
    /* A graph allocation node cannot be removed: the capture keeps it, unused. */
  }
  if (st != WEFT_OK) {
    weft__block_retire(rt, rec);
    return st;
  }
  rec->kind = WEFT__BLOCK_GRAPH;
  rec->owner = gs;
  rec->ptr = p;
  rec->bytes = bytes;
  rec->tag = tag;
  weft__access_init(&rec->acc, rec->acc.reads, (weft__point_t){0, 0});
  pthread_mutex_lock(&s->tr->lock);
  weft__capture_block_t *cb = weft__capture_block(cap, &rec->acc, true);
  if (cb != NULL) cb->local.write = first;
  pthread_mutex_unlock(&s->tr->lock);
  if (cb == NULL) {
    gs->n_allocs--;
    weft__block_retire(rt, rec);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_alloc: no host memory for a capture record");
  }
  *out = weft__block_publish(rt, rec);
  atomic_fetch_add_explicit(&rt->allocs, 1, memory_order_relaxed);
  return WEFT_OK;
}

static weft_status_t free_hook(struct weft__block *rec, weft_stream_t *s, bool *handled) {
  weft_status_t st = weft__tracker_bind(s->tr);
  if (st == WEFT_OK) st = weft__capture_sync_state(s);
  if (st != WEFT_OK) {
    *handled = true;
    return st;
  }
  weft__capture_t *cap = s->capture;
  if (cap == NULL) {
    *handled = rec->kind == WEFT__BLOCK_GRAPH;
    return *handled ? weft__exec_free_output(rec, s) : WEFT_OK;
  }
  *handled = true;
  weft__gsession_t *gs = cap->owner;
  if (rec->kind != WEFT__BLOCK_GRAPH || rec->owner != gs)
    return weft__error(WEFT_ERR_CAPTURE,
                       "weft_free: block '%s' was allocated outside the capture running on stream %u; freeing it "
                       "inside would free it at every launch: free it after weft_capture_end",
                       rec->tag, s->index);
  weft__use_t use = {&rec->acc, WEFT_WRITE};
  if ((st = weft__tracker_begin(s, &use, 1)) != WEFT_OK) return st;
  if (gs->pool != NULL) {
    weft__tracker_touch(s);
    st = weft__gpool_free(gs->pool, rec->ptr, rec->bytes, cap, weft__tracker_point(s));
  } else {
    CUresult r = s->tr->drv->cuMemFreeAsync(rec->ptr, s->raw);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemFreeAsync (in capture)");
  }
  if (st != WEFT_OK) return st;
  for (size_t i = 0; i < gs->n_allocs; i++)
    if (gs->allocs[i] == rec) gs->allocs[i] = NULL;
  weft__block_forget(rec);
  atomic_fetch_add_explicit(&((weft_runtime_t *)s->runtime)->frees, 1, memory_order_relaxed);
  return WEFT_OK;
}

/* Captures keep a runtime from being released: their streams are not free. */
static weft_status_t release_hook(weft_runtime_t *rt) {
  if (rt->tracker.captures != 0)
    return weft__error(WEFT_ERR_BUSY, "weft_runtime_release: %u captures are active on the runtime's streams",
                       rt->tracker.captures);
  return WEFT_OK;
}

__attribute__((constructor)) static void install_hooks(void) {
  weft__graph_alloc_hook = alloc_hook;
  weft__graph_free_hook = free_hook;
  weft__graph_release_hook = release_hook;
  weft__capture_foreign_hook = on_foreign;
}
