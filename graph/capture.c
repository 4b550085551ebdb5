/* Capture: the public capture API. Beginning a capture hands weft_alloc its allocation context
 * (graph memory nodes, or a graph pool); ending it turns the capture's record of blocks into the
 * graph's access summary and outputs. The clocks of the capture live in streams/capture.c. */
#include <stdio.h>
#include <string.h>

#include "graph/graph.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/core/nvtx.h"
#include "lib/core/trace.h"

weft_capture_options_t weft_capture_options_default(void) {
  return (weft_capture_options_t){WEFT_CAPTURE_GLOBAL, WEFT_GRAPH_MEMORY_NODES, NULL};
}

static CUstreamCaptureMode cu_mode(weft_capture_mode_t m) {
  return m == WEFT_CAPTURE_THREAD_LOCAL ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
         : m == WEFT_CAPTURE_RELAXED    ? CU_STREAM_CAPTURE_MODE_RELAXED
                                        : CU_STREAM_CAPTURE_MODE_GLOBAL;
}

/* weft_capture_begin once its options are checked (and a pool they name is in use). */
static weft_status_t capture_begin_checked(weft_stream_t *s, weft_capture_options_t o) {
  weft_runtime_t *rt = s->runtime;
  weft_status_t st = weft__stream_prepare(s);
  if (st != WEFT_OK) return st;
  weft_graph_pool_t *pool = o.pool;
  if (o.memory == WEFT_GRAPH_MEMORY_PRIVATE_POOL && pool == NULL) {
    if ((st = weft__gpool_new(s->tr, rt, &pool)) != WEFT_OK) return st;
    pool->implicit = true;
  }
  weft_resource_t *alloc_to = pool != NULL && o.memory == WEFT_GRAPH_MEMORY_PRIVATE_POOL ? &pool->base : rt->graph_nodes;
  weft__capture_t *cap = NULL;
  st = weft__capture_begin(s, cu_mode(o.mode), false, 0, alloc_to, &cap, NULL);
  weft_graph_pool_t *drawn = weft__gpool_of(alloc_to);
  if (st == WEFT_OK && drawn != NULL && (st = weft__gpool_attach(drawn, cap)) != WEFT_OK) {
    CUgraph g;
    weft__capture_t *ended;
    const weft__driver_t *drv = s->tr->drv;
    /* A graph call: under the graph-memory lock, as weft_graph_destroy's (weft.h). */
    if (weft__capture_end(s, &ended, &g) == WEFT_OK && g != NULL)
      WEFT__GRAPH_MEMORY(s->tr->ctx, WEFT__RELAXED(drv, drv->cuGraphDestroy(g)));
    weft__capture_free(ended);
  }
  if (st != WEFT_OK && pool != NULL && pool->implicit) (void)weft_graph_pool_destroy(pool);
  if (st == WEFT_OK) weft__nvtx_mark("weft_capture_begin");
  return st;
}

weft_status_t weft_capture_begin(weft_stream_t *s, const weft_capture_options_t *opts) {
  weft_status_t st = weft__stream_check(s, "weft_capture_begin");
  if (st != WEFT_OK) return st;
  weft_capture_options_t o = opts ? *opts : weft_capture_options_default();
  if (o.mode > WEFT_CAPTURE_RELAXED || o.memory > WEFT_GRAPH_MEMORY_PRIVATE_POOL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_capture_begin: bad mode or memory policy");
  /* A pool the options name is in use until the capture draws from it (its own use) or fails: a
   * concurrent weft_graph_pool_destroy says BUSY meanwhile instead of freeing it under us. */
  if (o.pool != NULL && (st = weft__gpool_use(o.pool, s->runtime, "weft_capture_begin")) != WEFT_OK) return st;
  st = capture_begin_checked(s, o);
  if (o.pool != NULL) (void)weft__gpool_unuse(o.pool); /* not implicit: never its last use */
  return st;
}

/* A foreign capture drawing from a graph pool was ended by its owner: the ranges it freed become
 * free for anyone, those it kept stay with the pool (the owner's graph uses them). */
static void pool_dropped(weft__capture_t *c) {
  weft_graph_pool_t *p = weft__gpool_of(c->alloc_to);
  weft__gpool_detach(p, c, true);
  (void)weft__gpool_unuse(p);
}

/* weft_capture_allocate_to while p is in use. */
static weft_status_t allocate_to_used(weft_stream_t *s, weft_graph_pool_t *p) {
  weft_status_t st = weft__stream_prepare(s);
  if (st != WEFT_OK) return st;
  weft__capture_t *c = weft__capture_foreign(s);
  if (c == NULL)
    return weft__error(WEFT_ERR_CAPTURE, "weft_capture_allocate_to: no capture begun outside weft is active on stream %u",
                       s->index);
  weft_resource_t *now = NULL;
  if (weft__tracker_capture_of(s, &now) == c && now == &p->base) return WEFT_OK; /* said before */
  if ((st = weft__gpool_attach(p, c)) != WEFT_OK) return st;
  if ((st = weft__capture_redirect(s, c, &p->base, pool_dropped)) != WEFT_OK) {
    weft__gpool_detach(p, c, false);
    (void)weft__gpool_unuse(p);
  }
  return st;
}

weft_status_t weft_capture_allocate_to(weft_stream_t *s, weft_graph_pool_t *p) {
  weft_status_t st = weft__stream_check(s, "weft_capture_allocate_to");
  if (st != WEFT_OK) return st;
  /* In use until the capture draws from it (its own use) or this fails: a concurrent
   * weft_graph_pool_destroy says BUSY meanwhile instead of freeing it under us. */
  if ((st = weft__gpool_use(p, s->runtime, "weft_capture_allocate_to")) != WEFT_OK) return st;
  st = allocate_to_used(s, p);
  (void)weft__gpool_unuse(p); /* not implicit: never its last use */
  return st;
}

weft_status_t weft_capture_join(weft_stream_t *origin, weft_stream_t *t) {
  weft_status_t st = weft__stream_check(origin, "weft_capture_join");
  if (st == WEFT_OK) st = weft__stream_check(t, "weft_capture_join");
  if (st != WEFT_OK) return st;
  if ((st = weft__stream_prepare(t)) != WEFT_OK) return st;
  return weft__capture_join(origin, t);
}

/* The graph's access summary (blocks from outside, as the handles the capture saw) and
 * outputs (blocks allocated inside and not freed there), from the capture's record of blocks. */
static weft_status_t collect(const weft__capture_t *cap, weft__gsummary_t **summary, size_t *ns,
                             weft__goutput_t **outputs, size_t *no) {
  *summary = weft__meta_calloc(cap->blocks.len + 1, sizeof **summary);
  *outputs = weft__meta_calloc(cap->blocks.len + 1, sizeof **outputs);
  *ns = *no = 0;
  if (*summary == NULL || *outputs == NULL) {
    weft__meta_free(*summary);
    weft__meta_free(*outputs);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_capture_end: no host memory");
  }
  for (size_t i = 0; i < cap->blocks.len; i++) {
    const weft__capture_block_t *b = &WEFT__VEC_AT(&cap->blocks, weft__capture_block_t, i);
    struct weft__block *rec = WEFT__BLOCK_OF(b->live);
    /* The block the capture saw: one freed meanwhile (its record handed out again) makes every
     * launch stale. (A first use that did not name its generation: the record's current one.) */
    uint64_t gen = b->gen != 0 ? b->gen : weft__block_gen(rec);
    if (!b->internal) (*summary)[(*ns)++] = (weft__gsummary_t){{rec, gen}, b->kind};
    else if (!b->freed) (*outputs)[(*no)++] = (weft__goutput_t){rec->ptr, rec->bytes, rec->tag};
  }
  return WEFT_OK;
}

weft_status_t weft_capture_end(weft_stream_t *s, weft_graph_t **out) {
  weft_status_t st = weft__stream_check(s, "weft_capture_end");
  if (st != WEFT_OK) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_capture_end: out is NULL");
  if ((st = weft__tracker_bind(s->tr)) != WEFT_OK) return st;
  weft_runtime_t *rt = s->runtime;
  CUgraph g = NULL;
  weft__capture_t *cap = NULL;
  st = weft__capture_end(s, &cap, &g);
  if (cap == NULL) return st;
  weft_graph_pool_t *pool = weft__gpool_of(cap->alloc_to);
  weft__gsummary_t *summary = NULL;
  weft__goutput_t *outputs = NULL;
  size_t ns = 0, no = 0;
  weft_graph_t *graph = NULL;
  if (st == WEFT_OK) st = collect(cap, &summary, &ns, &outputs, &no);
  if (st == WEFT_OK)
    st = weft__graph_make(rt, g, pool ? WEFT_GRAPH_MEMORY_PRIVATE_POOL : WEFT_GRAPH_MEMORY_NODES, pool, summary, ns,
                          outputs, no, &graph);
  if (st == WEFT_OK) graph->collectives = cap->collectives; /* (nobody else has the graph yet) */
  /* The graph takes over the capture's hold of its collectives (weft__capture_free drops that). */
  if (st == WEFT_OK && cap->collectives) weft__capture_hold_link(&graph->hold, cap->id);
  if (st != WEFT_OK && g != NULL) {
    weft__meta_free(summary);
    weft__meta_free(outputs);
    WEFT__GRAPH_MEMORY(s->tr->ctx, WEFT__RELAXED(s->tr->drv, s->tr->drv->cuGraphDestroy(g))); /* a graph call (gate.h) */
  }
  /* Handles of blocks allocated inside become stale: the exec's outputs replace them. */
  if (pool != NULL) weft__gpool_detach(pool, cap, st == WEFT_OK);
  weft__runtime_forget_capture_blocks(cap);
  /* The capture's use of the pool passes to its graph; without a graph it ends. */
  if (pool != NULL && st != WEFT_OK) (void)weft__gpool_unuse(pool); /* st says what went wrong first */
  if (weft__trace_on() && cap->trace_us != 0) {
    char args[128];
    snprintf(args, sizeof args, "{\"capture\": %llu, \"blocks\": %zu, \"ok\": %s}", (unsigned long long)cap->id,
             cap->blocks.len, st == WEFT_OK ? "true" : "false");
    weft__trace_slice(rt->ordinal, weft__trace_tid(s->index, cap->id), "weft_capture", cap->trace_us,
                      weft__trace_now_us() - cap->trace_us, args);
  }
  weft__capture_free(cap);
  if (st == WEFT_OK) *out = graph;
  if (st == WEFT_OK) weft__nvtx_mark("weft_capture_end");
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
