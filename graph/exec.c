/* Graphs, executable graphs and replay: instantiate (and upload), launch ordered by the access
 * summary, outputs as fresh blocks per launch owned by the graph's output resource, graph memory
 * statistics. */
#include <string.h>

#include "graph/graph.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/core/nvtx.h"
#include "lib/core/trace.h"


/* ---- outputs: the graph's resource ------------------------------------------------------------ */

/* weft_free of an output of a launch, outside a capture. Memory-node outputs are freed with
 * cuMemFreeAsync (the next launch then gets the same address back); graph-pool outputs keep their
 * range. Either way the next launch writes the memory again, so it must follow this free, which
 * followed every use of the block. */
static weft_status_t outputs_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                        const char *tag) {
  weft_graph_t *g = ((weft__goutputs_t *)self)->graph;
  const weft__driver_t *drv = g->rt->drv;
  if (weft__tracker_capture_of(s, NULL) != NULL)
    return weft__error(WEFT_ERR_CAPTURE, "weft_free: output '%s' of a graph cannot be freed inside a capture", tag);
  if (g->memory == WEFT_GRAPH_MEMORY_NODES) {
    CUresult r;
    WEFT__GRAPH_MEMORY(s->tr->ctx, WEFT__RELAXED(drv, r = drv->cuMemFreeAsync(p, s->raw)));
    if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemFreeAsync (graph output)");
    weft__tracker_touch(s);
  }
  weft__point_t at = weft__tracker_point(s);
  pthread_mutex_lock(&g->lock);
  for (size_t i = 0; i < g->n_outputs; i++)
    if (g->outs[i].rec != NULL && g->outs[i].rec->ptr == p) {
      g->outs[i] = (weft_block_t){0};
      g->freed[i] = at;
    }
  g->live_outputs--;
  pthread_mutex_unlock(&g->lock);
  return WEFT_OK;
}

static const weft_resource_ops_t outputs_ops = {
    .name = "graph outputs",
    .deallocate = outputs_deallocate,
};

static const char *const kind_name[] = {"", "graph", "exec", "graph pool", "builder", "resource"};

weft_status_t weft__graph_handle(const void *p, weft__handle_kind_t kind, const char *fn) {
  if (p == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: the %s is NULL", fn, kind_name[kind]);
  if (!weft__handle_live(p, kind))
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the %s was destroyed (or is not one)", fn, kind_name[kind]);
  return WEFT_OK;
}

weft_status_t weft__graph_enter(const void *p, weft__handle_kind_t kind, const char *fn) {
  if (weft__handle_enter(p, kind)) return WEFT_OK;
  weft_status_t st = weft__graph_handle(p, kind, fn);
  /* (Live again by now: a destroy that failed restored it. It was not when we looked.) */
  return st != WEFT_OK ? st : weft__error(WEFT_ERR_STALE_HANDLE, "%s: the %s was being destroyed", fn, kind_name[kind]);
}

weft_status_t weft__graph_unlist(void *p, weft__handle_kind_t kind, const char *fn) {
  return weft__handle_unlist(p, kind, fn, kind_name[kind], "held (graph objects never are)");
}

weft_status_t weft__graph_remove(void *p, weft__handle_kind_t kind, const char *fn, weft_status_t (*busy)(void *p)) {
  /* Inside p while it is read (a concurrent destroy of p may free it once we leave). */
  weft_status_t st = weft__graph_enter(p, kind, fn);
  if (st != WEFT_OK) return st;
  st = busy(p);
  weft__handle_leave();
  if (st != WEFT_OK) return st;
  if ((st = weft__graph_unlist(p, kind, fn)) != WEFT_OK) return st;
  /* No call is inside p now, and none enters. One that was inside when we looked may have taken a
   * claim since (an exec of a graph, a capture's use of a pool): then p stays, as it was. */
  if ((st = busy(p)) != WEFT_OK) weft__handle_restore(p, kind);
  return st;
}

weft_status_t weft__graph_make(weft_runtime_t *rt, CUgraph g, weft_graph_memory_t memory, weft_graph_pool_t *pool,
                               weft__gsummary_t *summary, size_t n_summary, weft__goutput_t *outputs,
                               size_t n_outputs, weft_graph_t **out) {
  weft_graph_t *gr = weft__meta_calloc(1, sizeof *gr);
  if (gr == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a graph");
  gr->outs = weft__meta_calloc(n_outputs + 1, sizeof *gr->outs);
  gr->freed = weft__meta_calloc(n_outputs + 1, sizeof *gr->freed);
  weft_status_t st = gr->outs && gr->freed ? weft__mem_lock_init(&gr->lock, "weft: graph")
                                           : weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a graph");
  if (st != WEFT_OK) goto fail_parts;
  gr->rt = rt;
  gr->g = g;
  gr->memory = memory;
  gr->pool = pool;
  gr->summary = summary;
  gr->n_summary = n_summary;
  gr->outputs = outputs;
  gr->n_outputs = n_outputs;
  weft__resource_init(&gr->out_res.base, &outputs_ops, NULL, rt);
  gr->out_res.graph = gr;
  if (!weft__handle_add(gr, WEFT__HANDLE_GRAPH)) {
    st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a graph handle");
    pthread_mutex_destroy(&gr->lock);
    goto fail_parts;
  }
  weft__runtime_depend(rt, +1);
  *out = gr;
  return WEFT_OK;
fail_parts:
  weft__meta_free(gr->outs);
  weft__meta_free(gr->freed);
  weft__meta_free(gr);
  return st;
}

/* BUSY while graph g has an exec or live outputs. */
static weft_status_t graph_busy(void *p) {
  weft_graph_t *g = p;
  pthread_mutex_lock(&g->lock);
  bool has_exec = g->exec != NULL;
  size_t live = g->live_outputs;
  pthread_mutex_unlock(&g->lock);
  if (has_exec) return weft__error(WEFT_ERR_BUSY, "weft_graph_destroy: the graph still has an exec");
  if (live != 0)
    return weft__error(WEFT_ERR_BUSY, "weft_graph_destroy: %zu outputs of its launches are still live", live);
  return WEFT_OK;
}

weft_status_t weft_graph_destroy(weft_graph_t *g) {
  weft_status_t st = weft__graph_remove(g, WEFT__HANDLE_GRAPH, "weft_graph_destroy", graph_busy);
  if (st != WEFT_OK) return st;
  CUresult r = CUDA_SUCCESS;
  if (atomic_load(&g->rt->alive)) WEFT__GRAPH_MEMORY(g->rt->tracker.ctx, WEFT__RELAXED(g->rt->drv, r = g->rt->drv->cuGraphDestroy(g->g)));
  if (r != CUDA_SUCCESS) {
    weft__handle_restore(g, WEFT__HANDLE_GRAPH);
    return weft__driver_fail(r, "cuGraphDestroy");
  }
  weft__runtime_depend(g->rt, -1);
  weft__capture_hold_unlink(&g->hold);
  /* The graph is gone whatever its private pool's destroy says (the pool then stays, reported). */
  if (g->pool != NULL) st = weft__gpool_unuse(g->pool);
  pthread_mutex_destroy(&g->lock);
  weft__meta_free(g->summary);
  weft__meta_free(g->outputs);
  weft__meta_free(g->outs);
  weft__meta_free(g->freed);
  weft__meta_free(g);
  return st;
}

/* The queries read g inside it (weft__graph_enter): a concurrent weft_graph_destroy waits. */
CUgraph weft_graph_raw(const weft_graph_t *g) {
  if (weft__graph_enter(g, WEFT__HANDLE_GRAPH, "weft_graph_raw") != WEFT_OK) return NULL;
  CUgraph raw = g->g;
  weft__handle_leave();
  return raw;
}
size_t weft_graph_output_count(const weft_graph_t *g) {
  if (weft__graph_enter(g, WEFT__HANDLE_GRAPH, "weft_graph_output_count") != WEFT_OK) return 0;
  size_t n = g->n_outputs;
  weft__handle_leave();
  return n;
}

size_t weft_graph_summary(const weft_graph_t *g, weft_access_t *out, size_t max) {
  if (weft__graph_enter(g, WEFT__HANDLE_GRAPH, "weft_graph_summary") != WEFT_OK) return 0;
  for (size_t i = 0; i < g->n_summary && i < max; i++)
    out[i] = (weft_access_t){g->summary[i].block, (weft_access_kind_t)g->summary[i].kind};
  size_t n = g->n_summary;
  weft__handle_leave();
  return n;
}

/* weft_graph_instantiate's checks and its claim of g (g->exec = *out), inside g. */
static weft_status_t instantiate_claim(weft_graph_t *g, weft_stream_t *upload, weft_exec_t **out) {
  weft_status_t st = weft__stream_check(upload, "weft_graph_instantiate");
  if (st != WEFT_OK) return st;
  if (upload->runtime != g->rt)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_graph_instantiate: the stream belongs to another runtime");
  if ((st = weft__tracker_bind(upload->tr)) != WEFT_OK) return st;
  weft_exec_t *e = weft__meta_calloc(1, sizeof *e);
  if (e == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_graph_instantiate: no host memory");
  e->graph = g;
  e->auto_free = g->rt->opts.output_policy == WEFT_OUTPUT_AUTO_FREE;
  pthread_mutex_lock(&g->lock);
  if (g->exec != NULL) st = weft__error(WEFT_ERR_BUSY, "weft_graph_instantiate: the graph already has an exec (one per graph)");
  else g->exec = e; /* claimed: a concurrent instantiate gets BUSY */
  pthread_mutex_unlock(&g->lock);
  if (st != WEFT_OK) {
    weft__meta_free(e);
    return st;
  }
  *out = e;
  return WEFT_OK;
}

weft_status_t weft_graph_instantiate(weft_graph_t *g, weft_stream_t *upload, weft_exec_t **out) {
  /* Inside g until it is claimed; from then on the claim keeps it (weft_graph_destroy says BUSY
   * while g has an exec, also after its removal: a claim made while it waited for us counts). */
  weft_status_t st = weft__graph_enter(g, WEFT__HANDLE_GRAPH, "weft_graph_instantiate");
  if (st != WEFT_OK) return st;
  weft_exec_t *e = NULL;
  st = out == NULL ? weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_graph_instantiate: out is NULL")
                   : instantiate_claim(g, upload, &e);
  weft__handle_leave();
  if (st != WEFT_OK) return st;
  /* Graph memory nodes: let the driver free the previous launch's outputs itself. */
  unsigned long long flags =
      e->auto_free && g->memory == WEFT_GRAPH_MEMORY_NODES ? CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH : 0;
  const weft__driver_t *d = g->rt->drv;
  CUresult r;
  weft__nvtx_push("weft_graph_instantiate");
  WEFT__GRAPH_MEMORY(g->rt->tracker.ctx, WEFT__RELAXED(d, if ((r = d->cuGraphInstantiateWithFlags(&e->x, g->g, flags)) == CUDA_SUCCESS)
                                    r = d->cuGraphUpload(e->x, upload->raw)));
  weft__nvtx_pop();
  if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuGraphInstantiateWithFlags / cuGraphUpload");
  else if (!weft__handle_add(e, WEFT__HANDLE_EXEC))
    st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_graph_instantiate: no host memory for an exec handle");
  if (st != WEFT_OK) {
    /* Unclaimed: the graph is as it was. */
    if (e->x != NULL) WEFT__GRAPH_MEMORY(g->rt->tracker.ctx, WEFT__RELAXED(d, d->cuGraphExecDestroy(e->x)));
    pthread_mutex_lock(&g->lock);
    g->exec = NULL;
    pthread_mutex_unlock(&g->lock);
    weft__meta_free(e);
    return st;
  }
  *out = e;
  return WEFT_OK;
}

typedef struct launch_arg {
  CUgraphExec x;
} launch_arg_t;

static weft_status_t do_launch(weft_stream_t *s, void *arg) {
  const launch_arg_t *a = arg;
  CUresult r;
  WEFT__GRAPH_MEMORY(s->tr->ctx, r = s->tr->drv->cuGraphLaunch(a->x, s->raw));
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "cuGraphLaunch");
}

/* The uses of one launch: the summary's blocks, the previous outputs it frees (AUTO_FREE), and
 * the fresh records of this launch's outputs (written by it). */
static weft_status_t launch_uses(weft_exec_t *e, weft__use_t *uses, size_t *k, struct weft__block **fresh,
                                 size_t *made) {
  weft_graph_t *g = e->graph;
  for (size_t i = 0; i < g->n_summary; i++) {
    struct weft__block *rec;
    if (weft__block_check(g->summary[i].block, "weft_exec_launch", &rec) != WEFT_OK)
      return weft__error(WEFT_ERR_STALE_HANDLE,
                         "weft_exec_launch: the graph uses block '%s' from before its capture, which was freed since",
                         g->summary[i].block.rec->tag);
    uses[(*k)++] = (weft__use_t){&rec->acc, g->summary[i].kind, g->summary[i].block.gen};
  }
  for (size_t i = 0; i < g->n_outputs; i++)
    if (g->outs[i].rec != NULL) uses[(*k)++] = (weft__use_t){&g->outs[i].rec->acc, WEFT_WRITE, 0};
  /* Graphs sharing a pool share memory: their launches are ordered. */
  if (g->pool != NULL) uses[(*k)++] = (weft__use_t){&g->pool->acc, WEFT_WRITE, 0};
  for (; *made < g->n_outputs; (*made)++) {
    const weft__goutput_t *o = &g->outputs[*made];
    struct weft__block *rec = weft__block_make(g->rt, o->bytes, o->tag, &g->out_res.base);
    if (rec == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_exec_launch: no host memory for output records");
    rec->ptr = o->ptr;
    fresh[*made] = rec;
    uses[(*k)++] = (weft__use_t){&rec->acc, WEFT_WRITE, 0};
  }
  return WEFT_OK;
}

/* The previous launch's outputs that are still live. Under AUTO_FREE the launch frees them: they
 * are claimed now (a concurrent weft_free then gets DOUBLE_FREE) and given back if the launch
 * fails. An output whose free is in progress makes the launch BUSY either way. Graph lock held. */
static weft_status_t claim_outputs(weft_exec_t *e, bool *claimed) {
  weft_graph_t *g = e->graph;
  size_t live = 0, freeing = 0;
  for (size_t i = 0; i < g->n_outputs; i++) {
    struct weft__block *rec = g->outs[i].rec;
    if (rec == NULL) continue;
    if (weft__block_state(rec) != WEFT__BLOCK_LIVE) freeing++;
    else live++;
  }
  if (freeing != 0)
    return weft__error(WEFT_ERR_BUSY, "weft_exec_launch: %zu outputs of the previous launch are being freed", freeing);
  if (live != 0 && e->auto_free && g->outs_from != e)
    return weft__error(WEFT_ERR_BUSY, "weft_exec_launch: %zu outputs of another exec of the graph are live (tag '%s'); "
                       "free them first", live, g->outputs[0].tag);
  if (live != 0 && !e->auto_free)
    return weft__error(WEFT_ERR_BUSY,
                       "weft_exec_launch: %zu outputs of the previous launch are live (tag '%s'); free them or use "
                       "WEFT_OUTPUT_AUTO_FREE",
                       live, g->outputs[0].tag);
  for (size_t i = 0; i < g->n_outputs; i++) {
    claimed[i] = g->outs[i].rec != NULL && weft__block_claim(g->outs[i].rec, g->outs[i].gen);
    if (g->outs[i].rec != NULL && !claimed[i]) {
      for (size_t j = 0; j < i; j++)
        if (claimed[j]) weft__block_unclaim(g->outs[j].rec);
      return weft__error(WEFT_ERR_BUSY, "weft_exec_launch: an output of the previous launch is being freed");
    }
  }
  return WEFT_OK;
}

/* One launch under the graph lock (launches of one graph and frees of its outputs are serial). */
static weft_status_t launch_locked(weft_exec_t *e, weft_stream_t *s) {
  weft_graph_t *g = e->graph;
  size_t n = g->n_summary + 2 * g->n_outputs + 1, k = 0, made = 0;
  weft__use_t *uses = weft__meta_calloc(n + 1, sizeof *uses);
  struct weft__block **fresh = weft__meta_calloc(g->n_outputs + 1, sizeof *fresh);
  bool *claimed = weft__meta_calloc(g->n_outputs + 1, sizeof *claimed);
  weft_status_t st = uses && fresh && claimed ? WEFT_OK : weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_exec_launch: no host memory");
  if (st == WEFT_OK) st = claim_outputs(e, claimed);
  /* Outputs freed outside the graph: the launch reallocates their addresses after the frees. */
  for (size_t i = 0; i < g->n_outputs && st == WEFT_OK; i++)
    if (g->freed[i].tick != 0) st = weft__tracker_order(s, g->freed[i]);
  if (st == WEFT_OK) st = launch_uses(e, uses, &k, fresh, &made);
  launch_arg_t arg = {e->x};
  if (st == WEFT_OK) st = weft__tracker_use(s, uses, k, do_launch, &arg);
  if (st != WEFT_OK) {
    for (size_t i = 0; i < made; i++) weft__block_retire(fresh[i]);
    for (size_t i = 0; claimed != NULL && i < g->n_outputs; i++)
      if (claimed[i]) weft__block_unclaim(g->outs[i].rec);
  } else {
    for (size_t i = 0; i < g->n_outputs; i++) {
      g->freed[i] = (weft__point_t){0, 0};
      if (claimed[i]) {
        /* AUTO_FREE: the driver (memory nodes) or the launch (graph pool) reused its memory. */
        weft__resource_disown(&g->out_res.base, g->outs[i].rec->bytes);
        weft__block_end(g->outs[i].rec);
        g->live_outputs--;
      }
      g->outs[i] = weft__block_publish(fresh[i]);
      g->outs_from = e;
      weft__resource_adopt(&g->out_res.base, fresh[i]->bytes);
      g->live_outputs++;
    }
  }
  weft__meta_free(uses);
  weft__meta_free(fresh);
  weft__meta_free(claimed);
  return st;
}

/* weft_exec_launch inside e (weft__handle_enter: a concurrent weft_exec_destroy waits for it). */
static weft_status_t launch_inside(weft_exec_t *e, weft_stream_t *s) {
  weft_graph_t *g = e->graph;
  weft_status_t st = weft__stream_check(s, "weft_exec_launch");
  if (st != WEFT_OK) return st;
  if (s->runtime != g->rt) return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_exec_launch: stream of another runtime");
  if ((st = weft__stream_prepare(s)) != WEFT_OK) return st;
  if (weft__tracker_capture_of(s, NULL) != NULL)
    return weft__error(WEFT_ERR_CAPTURE, "weft_exec_launch: stream %u is capturing (graphs with memory nodes cannot "
                       "be launched into a capture)", s->index);
  if (g->collectives && weft__tracker_runtimes() > 1 && (st = weft__tracker_exact(s)) != WEFT_OK) return st;
  uint64_t t0 = weft__trace_on() ? weft__trace_now_us() : 0;
  weft__nvtx_push("weft_exec_launch");
  pthread_mutex_lock(&g->lock);
  st = launch_locked(e, s);
  pthread_mutex_unlock(&g->lock);
  weft__nvtx_pop();
  if (st == WEFT_OK && weft__trace_on()) {
    weft_access_t acc[16];
    size_t n = 0;
    for (size_t i = 0; i < g->n_summary && n < 16; i++) acc[n++] = (weft_access_t){g->summary[i].block, g->summary[i].kind};
    weft__trace_use(s, "weft_exec_launch", acc, n, t0);
  }
  return st;
}

weft_status_t weft_exec_launch(weft_exec_t *e, weft_stream_t *s) {
  weft_status_t st = weft__graph_enter(e, WEFT__HANDLE_EXEC, "weft_exec_launch");
  if (st != WEFT_OK) return st;
  st = launch_inside(e, s);
  weft__handle_leave();
  return st;
}

weft_status_t weft_exec_output(const weft_exec_t *e, size_t i, weft_block_t *out) {
  /* Inside e (a concurrent weft_exec_destroy waits); e keeps its graph. */
  weft_status_t st = weft__graph_enter(e, WEFT__HANDLE_EXEC, "weft_exec_output");
  if (st != WEFT_OK) return st;
  weft_graph_t *g = e->graph;
  if (out == NULL || i >= g->n_outputs) {
    st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_exec_output: NULL out or index %zu out of range", i);
  } else {
    pthread_mutex_lock(&g->lock);
    *out = g->outs[i];
    pthread_mutex_unlock(&g->lock);
  }
  weft__handle_leave();
  return st;
}

weft_status_t weft_exec_destroy(weft_exec_t *e) {
  weft_status_t st = weft__graph_handle(e, WEFT__HANDLE_EXEC, "weft_exec_destroy");
  if (st != WEFT_OK) return st;
  if ((st = weft__graph_unlist(e, WEFT__HANDLE_EXEC, "weft_exec_destroy")) != WEFT_OK) return st;
  weft_graph_t *g = e->graph;
  CUresult r = CUDA_SUCCESS;
  if (atomic_load(&g->rt->alive)) WEFT__GRAPH_MEMORY(g->rt->tracker.ctx, WEFT__RELAXED(g->rt->drv, r = g->rt->drv->cuGraphExecDestroy(e->x)));
  if (r != CUDA_SUCCESS) {
    weft__handle_restore(e, WEFT__HANDLE_EXEC);
    return weft__driver_fail(r, "cuGraphExecDestroy");
  }
  pthread_mutex_lock(&g->lock);
  g->exec = NULL;
  if (g->outs_from == e) g->outs_from = NULL;
  pthread_mutex_unlock(&g->lock);
  weft__meta_free(e);
  return WEFT_OK;
}

weft_status_t weft_graph_memory_stats(weft_runtime_t *rt, weft_graph_memory_stats_t *out) {
  weft_status_t st;
  weft__tracker_t *tr = weft__runtime_tracker(rt, "weft_graph_memory_stats", &st);
  if (tr == NULL) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_graph_memory_stats: out is NULL");
  const weft__driver_t *d = tr->drv;
  if (d->cuDeviceGetGraphMemAttribute == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_graph_memory_stats: the driver has no graph memory attributes");
  cuuint64_t v[4];
  CUgraphMem_attribute a[4] = {CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
                               CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH};
  CUresult r = CUDA_SUCCESS;
  WEFT__RELAXED(d, for (int i = 0; i < 4 && r == CUDA_SUCCESS; i++) r = d->cuDeviceGetGraphMemAttribute(tr->device, a[i], &v[i]));
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuDeviceGetGraphMemAttribute");
  *out = (weft_graph_memory_stats_t){v[0], v[1], v[2], v[3]};
  return WEFT_OK;
}

weft_status_t weft_graph_memory_trim(weft_runtime_t *rt) {
  weft_status_t st;
  weft__tracker_t *tr = weft__runtime_tracker(rt, "weft_graph_memory_trim", &st);
  if (tr == NULL) return st;
  if (tr->drv->cuDeviceGraphMemTrim == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_graph_memory_trim: the driver has no cuDeviceGraphMemTrim");
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) return st;
  return weft__graph_memory_trim(tr);
}
