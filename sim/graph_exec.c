/* Executable graphs: instantiation, upload, launch and the execution of a launch's nodes.
 *
 * Instantiation copies the graph's nodes in a topological order (a cycle is an error), so the
 * graph may change or die afterwards, and splits them into chains (a node continues the chain of
 * a predecessor that is that chain's tail): nodes of one chain are totally ordered, so each chain
 * needs only one vector-clock lane, and a linear captured graph costs one lane.
 *
 * A launch is one op on its stream. When it reaches the head, its start point ticks the stream's
 * lane; each node's clock is the start clock joined with its predecessors' clocks, ticked on its
 * chain's lane; ready nodes run interleaved at random with other streams' work. When the last
 * node ran, the stream's clock joins every node's clock and the stream moves on. Launches of one
 * exec are serialised and start in the order of their launch calls, whatever their streams, as
 * the driver orders them, so one set of per-launch state lives in the exec.
 *
 * Graph-allocation rules (CUDA_SEMANTICS.md): one live exec per graph with memory nodes; an
 * allocation the graph does not free stays live after a launch, and relaunching while it is live
 * is CUDA_ERROR_INVALID_VALUE unless the exec has AUTO_FREE_ON_LAUNCH.
 */
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

static sim__exec_t *exec_get(CUgraphExec h) { return sim__handle_get(h, SIM_MAGIC_EXEC); }

void sim__exec_unref(sim__exec_t *x) {
  if (x == NULL || --x->refs > 0) return;
  for (size_t i = 0; i < x->n; i++) {
    sim__action_release(&x->nodes[i].act);
    free(x->nodes[i].succ);
  }
  free(x->nodes);
  free(x->lanes);
  free(x->ticks);
  free(x->outputs);
  free(x->pending);
  free(x->ready);
  if (x->nvc)
    for (size_t i = 0; i < x->n; i++) sim__vc_free(&x->nvc[i]);
  free(x->nvc);
  sim__vc_free(&x->start_vc);
  sim__vc_free(&x->done_vc);
  sim__graph_unref(x->graph);
  free(x);
}

/* Kahn's algorithm; order[k] = index in g->nodes of the k-th node. -1 on a cycle. */
static int topo_order(const sim__graph_t *g, size_t *order) {
  size_t *indeg = sim__xcalloc(g->n + 1, sizeof *indeg);
  size_t head = 0, tail = 0;
  for (size_t i = 0; i < g->n; i++)
    if ((indeg[i] = g->nodes[i]->nin) == 0) order[tail++] = i;
  while (head < tail) {
    const sim__node_t *n = g->nodes[order[head++]];
    for (size_t j = 0; j < n->nout; j++)
      if (--indeg[n->out[j]->index] == 0) order[tail++] = n->out[j]->index;
  }
  free(indeg);
  return tail == g->n ? 0 : -1;
}

/* Whether g frees allocation a in one of its nodes. */
static int graph_frees(const sim__graph_t *g, const sim__alloc_t *a) {
  for (size_t i = 0; i < g->n; i++)
    if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_FREE && g->nodes[i]->act.u.mem.a == a) return 1;
  return 0;
}

/* Maps (counts as reserved graph memory) every allocation the exec makes; OOM over the limit. */
static CUresult map_allocations(sim__exec_t *x) {
  for (size_t i = 0; i < x->n; i++) {
    if (x->nodes[i].type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) continue;
    sim__alloc_t *a = x->nodes[i].act.u.mem.a;
    if (a->mapped) continue;
    if (sim__reserve(a->dev, a->size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    a->mapped = 1;
    sim__device_graph_reserved((int64_t)a->size);
  }
  return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec *out, CUgraph hg, unsigned long long flags) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  sim__graph_t *g = sim__handle_get(hg, SIM_MAGIC_GRAPH);
  if (g == NULL || g->destroyed) return CUDA_ERROR_INVALID_HANDLE;
  unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                             CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if ((flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) &&
      ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) || g->mem_nodes > 0))
    return CUDA_ERROR_INVALID_VALUE;
  if (g->mem_nodes > 0 && g->live_execs > 0) return CUDA_ERROR_NOT_SUPPORTED;
  size_t *order = sim__xcalloc(g->n + 1, sizeof *order);
  if (topo_order(g, order) != 0) {
    free(order);
    return CUDA_ERROR_INVALID_VALUE;
  }
  sim__exec_t *x = sim__xcalloc(1, sizeof *x);
  x->magic = SIM_MAGIC_EXEC;
  x->refs = 1;
  x->flags = flags;
  x->graph = g;
  g->refs++;
  g->live_execs++;
  x->n = g->n;
  x->nodes = sim__xcalloc(g->n + 1, sizeof *x->nodes);
  size_t *pos = sim__xcalloc(g->n + 1, sizeof *pos); /* graph index -> exec index */
  for (size_t k = 0; k < g->n; k++) pos[order[k]] = k;
  /* Chains: tail[c] is the exec index of chain c's last node. */
  size_t *tail = sim__xcalloc(g->n + 1, sizeof *tail);
  for (size_t k = 0; k < g->n; k++) {
    const sim__node_t *n = g->nodes[order[k]];
    sim__xnode_t *xn = &x->nodes[k];
    sim__action_clone(&xn->act, &n->act);
    xn->type = n->type;
    xn->npred = n->nin;
    xn->nsucc = n->nout;
    xn->succ = sim__xmalloc((n->nout + 1) * sizeof *xn->succ);
    for (size_t j = 0; j < n->nout; j++) xn->succ[j] = pos[n->out[j]->index];
    xn->chain = UINT32_MAX;
    for (size_t j = 0; j < n->nin && xn->chain == UINT32_MAX; j++) {
      const sim__xnode_t *p = &x->nodes[pos[n->in[j]->index]];
      if (tail[p->chain] == pos[n->in[j]->index]) xn->chain = p->chain;
    }
    if (xn->chain == UINT32_MAX) xn->chain = x->nchains++;
    tail[xn->chain] = k;
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && !graph_frees(g, n->act.u.mem.a)) {
      x->outputs = sim__xrealloc(x->outputs, (x->noutputs + 1) * sizeof *x->outputs);
      x->outputs[x->noutputs++] = n->act.u.mem.a;
    }
  }
  free(tail);
  free(pos);
  free(order);
  x->lanes = sim__xcalloc(x->nchains + 1, sizeof *x->lanes);
  x->ticks = sim__xcalloc(x->nchains + 1, sizeof *x->ticks);
  for (uint32_t c = 0; c < x->nchains; c++) x->lanes[c] = sim.next_lane++;
  x->pending = sim__xcalloc(x->n + 1, sizeof *x->pending);
  x->ready = sim__xcalloc(x->n + 1, sizeof *x->ready);
  x->nvc = sim__xcalloc(x->n + 1, sizeof *x->nvc);
  sim__handle_add(x);
  if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) && map_allocations(x) != CUDA_SUCCESS) {
    sim__handle_remove(x);
    g->live_execs--;
    sim__exec_unref(x);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = (CUgraphExec)x;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
  SIM_CALL(cuGraphInstantiateWithFlags, instantiate(phGraphExec, hGraph, flags));
}

static CUresult upload(CUgraphExec hx, CUstream hs) {
  sim__exec_t *x = exec_get(hx);
  sim__stream_t *s = sim__stream_get(hs);
  if (x == NULL || s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__graph_call_check(s->dev, "cuGraphUpload");
  return map_allocations(x);
}

CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) { SIM_CALL(cuGraphUpload, upload(hGraphExec, hStream)); }

static CUresult launch(CUgraphExec hx, CUstream hs) {
  sim__exec_t *x = exec_get(hx);
  sim__stream_t *s = sim__stream_get(hs);
  if (x == NULL || s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__graph_call_check(s->dev, "cuGraphLaunch");
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  /* (No current context needed: the stream names it. H200, tests/conformance.) */
  CUresult r;
  if (s->cap != NULL) {
    /* A graph with memory nodes cannot become a child graph: UNSUPPORTED, and the capture is
     * invalidated (measured, H200). Other graphs would become child-graph nodes, which the
     * simulator does not model. */
    if (x->graph->mem_nodes == 0) return sim__unimplemented();
    sim__capture_invalidate(s->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (!(x->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
    for (size_t i = 0; i < x->noutputs; i++)
      if (x->outputs[i]->host_live) return CUDA_ERROR_INVALID_VALUE;
  if ((r = map_allocations(x)) != CUDA_SUCCESS) return r;
  sim__einst_t **inst = sim__xcalloc(x->n + 1, sizeof *inst);
  for (size_t i = 0; i < x->n; i++) {
    sim__xnode_t *xn = &x->nodes[i];
    if (xn->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      xn->act.u.mem.a->host_live = 1;
      xn->act.u.mem.a->inflight++;
    } else if (xn->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
      xn->act.u.mem.a->host_live = 0;
    } else if (xn->act.kind == SIM_ACT_EVENT_RECORD) {
      /* Waits issued after this call wait for this record, as for cuEventRecord. */
      sim__event_t *e = xn->act.u.event.ev;
      inst[i] = sim__einst_new();
      sim__einst_unref(e->latest);
      e->latest = inst[i];
      inst[i]->refs++;
    } else if (xn->act.kind == SIM_ACT_EVENT_WAIT) {
      inst[i] = xn->act.u.event.ev->latest;
      if (inst[i]) inst[i]->refs++;
    }
  }
  sim__action_t act = {.kind = SIM_ACT_GRAPH};
  act.u.graph.exec = x;
  act.u.graph.inst = inst;
  act.u.graph.seq = ++x->launched;
  x->refs++;
  sim__enqueue(s, &act);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) { SIM_CALL(cuGraphLaunch, launch(hGraphExec, hStream)); }

static CUresult exec_destroy(CUgraphExec hx) {
  sim__exec_t *x = exec_get(hx);
  if (x == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__handle_remove(x);
  x->destroyed = 1;
  x->graph->live_execs--;
  sim__exec_unref(x);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) { SIM_CALL(cuGraphExecDestroy, exec_destroy(hGraphExec)); }

/* ---- running a launch (called by the scheduler) ---- */

static void release_inst(sim__einst_t **inst, size_t n) {
  if (inst == NULL) return;
  for (size_t i = 0; i < n; i++) sim__einst_unref(inst[i]);
  free(inst);
}

static void complete(sim__exec_t *x) {
  sim__stream_t *s = x->run_stream;
  if (sim.oracle) {
    for (size_t i = 0; i < x->n; i++) sim__vc_join(&s->vc, &x->nvc[i]);
    sim__vc_copy(&x->done_vc, &s->vc);
  }
  for (size_t i = 0; i < x->n; i++)
    if (x->nodes[i].type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) x->nodes[i].act.u.mem.a->inflight--;
  release_inst(x->inst, x->n);
  x->inst = NULL;
  x->running = 0;
  x->run_stream = NULL;
}

void sim__exec_start(sim__stream_t *s, sim__op_t *op) {
  sim__exec_t *x = op->act.u.graph.exec;
  x->started = op->act.u.graph.seq;
  x->running = 1;
  x->run_stream = s;
  x->run_id = sim.next_op_id;
  sim.next_op_id += x->n;
  x->inst = op->act.u.graph.inst;
  op->act.u.graph.inst = NULL;
  if (sim.oracle) {
    sim__vc_join(&s->vc, &x->done_vc);
    sim__vc_set(&s->vc, s->lane, sim__vc_get(&s->vc, s->lane) + 1);
    sim__vc_copy(&x->start_vc, &s->vc);
    for (size_t i = 0; i < x->n; i++) sim__vc_copy(&x->nvc[i], &x->start_vc);
  }
  x->nready = x->ndone = 0;
  for (size_t i = 0; i < x->n; i++) {
    x->pending[i] = x->nodes[i].npred;
    if (x->pending[i] == 0) x->ready[x->nready++] = i;
  }
  sim__nccl_exec_start(x);
  if (x->n == 0) complete(x);
}

int sim__exec_node_ready(const sim__exec_t *x, size_t node) {
  if (x->nodes[node].act.kind == SIM_ACT_NCCL) return sim__nccl_node_ready(x, node);
  return sim__action_ready(&x->nodes[node].act, x->inst ? x->inst[node] : NULL);
}

void sim__exec_finish_node(sim__exec_t *x, size_t node) {
  size_t r = 0;
  while (r < x->nready && x->ready[r] != node) r++;
  if (r < x->nready) {
    memmove(x->ready + r, x->ready + r + 1, (x->nready - r - 1) * sizeof *x->ready);
    x->nready--;
  }
  sim__xnode_t *xn = &x->nodes[node];
  for (size_t j = 0; j < xn->nsucc; j++) {
    size_t k = xn->succ[j];
    if (sim.oracle) sim__vc_join(&x->nvc[k], &x->nvc[node]);
    if (--x->pending[k] == 0) x->ready[x->nready++] = k;
  }
  if (++x->ndone < x->n) return;
  sim__stream_t *s = x->run_stream;
  complete(x);
  sim__pop_head(s);
}

int sim__exec_step(sim__exec_t *x, size_t r) {
  size_t i = x->ready[r];
  memmove(x->ready + r, x->ready + r + 1, (x->nready - r - 1) * sizeof *x->ready);
  x->nready--;
  sim__xnode_t *xn = &x->nodes[i];
  sim__einst_t *bound = x->inst ? x->inst[i] : NULL;
  uint32_t lane = x->lanes[xn->chain], tick = ++x->ticks[xn->chain];
  if (sim.oracle) {
    const sim__vc_t *in = sim__action_incoming(&xn->act, bound);
    if (in) sim__vc_join(&x->nvc[i], in);
    sim__vc_set(&x->nvc[i], lane, tick);
  }
  sim__actx_t ctx = {.vc = &x->nvc[i], .dev = x->run_stream != NULL ? x->run_stream->dev : 0};
  ctx.who = (sim__who_t){.op = x->run_id + i, .lane = lane, .tick = tick, .stream = -2,
                         .what = sim__action_what(&xn->act),
                         .name = xn->act.kind == SIM_ACT_KERNEL ? xn->act.u.kernel.k->name : NULL};
  sim__oracle_begin();
  sim__action_run(&xn->act, &ctx, bound);
  for (size_t j = 0; j < xn->nsucc; j++) {
    size_t k = xn->succ[j];
    if (sim.oracle) sim__vc_join(&x->nvc[k], &x->nvc[i]);
    if (--x->pending[k] == 0) x->ready[x->nready++] = k;
  }
  if (++x->ndone < x->n) return 0;
  complete(x);
  return 1;
}
