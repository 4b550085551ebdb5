/* Graphs: construction (explicit nodes, dependencies, queries) and graph allocations.
 *
 * A node owns its action (what it does when an exec of the graph runs it) and knows its edges
 * both ways. A graph is reference counted: the user's handle, a capture building it, and every
 * exec instantiated from it (for the one-exec rule of graphs with memory nodes).
 *
 * Graph allocations (memory nodes) get their address when the node is created and keep it for
 * their whole life, so every launch of an exec reuses the same address. They are mapped lazily
 * (counted in graph reserved memory from the first launch or upload until cuDeviceGraphMemTrim)
 * and stay in the address map while any node names them or they are live; destroying a graph or
 * an exec frees no live allocation.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sim/internal.h"

/* ---- graph allocations ---- */

static sim__alloc_t **g_gallocs;
static size_t g_ngallocs, g_capgallocs;

sim__alloc_t *sim__galloc_new(size_t bytes, const CUmemPoolProps *props) {
  size_t size = sim__round(bytes);
  sim__region_t *r = sim__region_new(size);
  if (r == NULL) return NULL;
  sim__alloc_t *a = sim__xcalloc(1, sizeof *a);
  a->kind = SIM_ALLOC_GRAPH;
  a->ptr = (CUdeviceptr)r->base;
  a->bytes = bytes;
  a->size = size;
  a->region = r;
  a->refs = 1;
  if (props) a->props = *props;
  a->dev = props && props->location.id >= 0 && props->location.id < sim.ndev ? props->location.id : 0;
  sim__addr_insert(a);
  sim__grow(&g_gallocs, &g_capgallocs, g_ngallocs + 1, sizeof *g_gallocs);
  a->list_index = g_ngallocs;
  g_gallocs[g_ngallocs++] = a;
  return a;
}

void sim__galloc_ref(sim__alloc_t *a) { a->refs++; }

static void galloc_unmap(sim__alloc_t *a) {
  if (!a->mapped) return;
  a->mapped = 0;
  sim__unreserve(a->dev, a->size);
  sim__device_graph_reserved(-(int64_t)a->size);
}

void sim__galloc_unref(sim__alloc_t *a) {
  if (--a->refs > 0 || a->live || a->host_live) return;
  galloc_unmap(a);
  sim__addr_remove(a);
  size_t i = a->list_index;
  g_gallocs[i] = g_gallocs[--g_ngallocs];
  g_gallocs[i]->list_index = i;
  sim__region_free(a->region);
  free(a);
}

sim__alloc_t *sim__galloc_find(CUdeviceptr p) {
  sim__alloc_t *a = sim__addr_exact(p);
  return a && a->kind == SIM_ALLOC_GRAPH ? a : NULL;
}

void sim__galloc_exec_alloc(sim__alloc_t *a, const sim__actx_t *ctx) {
  if (!a->live) sim__device_graph_used((int64_t)a->size);
  a->live = 1;
  a->region->allocated = 1;
  sim__oracle_access(a->ptr, a->size, 1, ctx);
}

void sim__galloc_exec_free(sim__alloc_t *a, const sim__actx_t *ctx) {
  sim__oracle_access(a->ptr, a->size, 1, ctx);
  if (!a->live) return;
  a->live = 0;
  a->region->allocated = 0;
  a->region->last_free = ctx->who;
  a->region->has_last_free = 1;
  sim__device_graph_used(-(int64_t)a->size);
}

/* Releases the memory of graph allocations no launch needs now; their addresses stay reserved. */
void sim__galloc_trim(void) {
  for (size_t i = 0; i < g_ngallocs; i++) {
    sim__alloc_t *a = g_gallocs[i];
    if (a->live || a->host_live || a->inflight > 0 || !a->mapped) continue;
    madvise((void *)a->region->base, a->region->size, MADV_DONTNEED);
    galloc_unmap(a);
  }
}

/* ---- graphs and nodes ---- */

sim__graph_t *sim__graph_new(void) {
  sim__graph_t *g = sim__xcalloc(1, sizeof *g);
  g->magic = SIM_MAGIC_GRAPH;
  g->refs = 1;
  sim__handle_add(g);
  return g;
}

void sim__graph_unref(sim__graph_t *g) {
  if (--g->refs > 0) return;
  sim__handle_remove(g);
  for (size_t i = 0; i < g->n; i++) {
    sim__node_t *n = g->nodes[i];
    sim__handle_remove(n);
    sim__action_release(&n->act);
    free(n->in);
    free(n->out);
    free(n);
  }
  free(g->nodes);
  free(g);
}

static sim__graph_t *graph_get(CUgraph h) {
  sim__graph_t *g = sim__handle_get(h, SIM_MAGIC_GRAPH);
  return g && !g->destroyed ? g : NULL;
}

sim__node_t *sim__node_get(CUgraphNode h) { return sim__handle_get(h, SIM_MAGIC_NODE); }

static int has_edge(const sim__node_t *from, const sim__node_t *to) {
  for (size_t i = 0; i < from->nout; i++)
    if (from->out[i] == to) return 1;
  return 0;
}

static void add_edge(sim__node_t *from, sim__node_t *to) {
  if (has_edge(from, to)) return;
  sim__grow(&from->out, &from->capout, from->nout + 1, sizeof *from->out);
  from->out[from->nout++] = to;
  sim__grow(&to->in, &to->capin, to->nin + 1, sizeof *to->in);
  to->in[to->nin++] = from;
}

CUresult sim__graph_add(sim__graph_t *g, CUgraphNodeType type, sim__action_t *act, sim__node_t *const *deps,
                        size_t ndeps, sim__node_t **out) {
  for (size_t i = 0; i < ndeps; i++) {
    sim__node_t *d = deps ? sim__node_get((CUgraphNode)deps[i]) : NULL;
    if (d == NULL || d->g != g) {
      sim__action_release(act);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  sim__node_t *n = sim__xcalloc(1, sizeof *n);
  n->magic = SIM_MAGIC_NODE;
  n->g = g;
  n->type = type;
  n->act = *act;
  n->index = g->n;
  sim__grow(&g->nodes, &g->cap, g->n + 1, sizeof *g->nodes);
  g->nodes[g->n++] = n;
  for (size_t i = 0; i < ndeps; i++) add_edge(deps[i], n);
  if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || type == CU_GRAPH_NODE_TYPE_MEM_FREE) g->mem_nodes++;
  sim__handle_add(n);
  if (out) *out = n;
  return CUDA_SUCCESS;
}

/* Common prologue of the cuGraphAdd*Node calls. */
static CUresult add_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t ndeps, CUgraphNodeType type,
                         sim__action_t *act) {
  sim__graph_t *g = graph_get(hg);
  if (out == NULL || (ndeps > 0 && deps == NULL)) {
    sim__action_release(act);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (g == NULL) {
    sim__action_release(act);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  sim__node_t *n;
  CUresult r = sim__graph_add(g, type, act, (sim__node_t *const *)deps, ndeps, &n);
  if (r == CUDA_SUCCESS) *out = (CUgraphNode)n;
  return r;
}

static CUresult graph_create(CUgraph *out, unsigned flags) {
  if (out == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *out = (CUgraph)sim__graph_new();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags) { SIM_CALL(cuGraphCreate, graph_create(phGraph, flags)); }

static CUresult graph_destroy(CUgraph hg) {
  sim__graph_t *g = graph_get(hg);
  if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
  g->destroyed = 1;
  sim__graph_unref(g);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) { SIM_CALL(cuGraphDestroy, graph_destroy(hGraph)); }

static CUresult add_kernel(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                           const CUDA_KERNEL_NODE_PARAMS *p) {
  if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (p->func == NULL) return p->kern ? sim__unimplemented() : CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ}, block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  sim__action_t act;
  CUresult r = sim__kernel_action(&act, p->func, grid, block, p->sharedMemBytes, p->kernelParams, p->extra);
  if (r != CUDA_SUCCESS) return r;
  return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_KERNEL, &act);
}

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                      size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams) {
  SIM_CALL(cuGraphAddKernelNode, add_kernel(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

/* Resolves one side of a 1D copy to a device address (*dev) or host pointer (*host). */
static int copy_side(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x, size_t n, CUdeviceptr *out_dev,
                     const void **out_host) {
  if (type == CU_MEMORYTYPE_UNIFIED) type = sim__addr_contains(dev + x, n) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  if (type == CU_MEMORYTYPE_DEVICE) {
    if (!sim__addr_contains(dev + x, n)) return -1;
    *out_dev = dev + x;
    return 1;
  }
  if (type == CU_MEMORYTYPE_HOST) {
    const void *p = host ? (const char *)host + x : (const void *)(uintptr_t)(dev + x);
    if (p == NULL) return -1;
    *out_host = p;
    return 0;
  }
  return -2;
}

static CUresult add_memcpy(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, const CUDA_MEMCPY3D *p) {
  if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (p->Height > 1 || p->Depth > 1 || p->srcY || p->srcZ || p->dstY || p->dstZ) return sim__unimplemented();
  size_t bytes = p->WidthInBytes;
  CUdeviceptr sd = 0, dd = 0;
  const void *sh = NULL, *dh = NULL;
  int s = copy_side(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, bytes, &sd, &sh);
  int d = copy_side(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, bytes, &dd, &dh);
  if (s == -2 || d == -2) return sim__unimplemented();
  if (s < 0 || d < 0) return CUDA_ERROR_INVALID_VALUE;
  sim__action_t act = {.kind = SIM_ACT_MEMCPY};
  act.u.copy.dir = s ? (d ? SIM_DTOD : SIM_DTOH) : (d ? SIM_HTOD : SIM_HTOH);
  act.u.copy.src_dev = sd;
  act.u.copy.dst_dev = dd;
  act.u.copy.src_host = sh;
  act.u.copy.dst_host = (void *)(uintptr_t)dh;
  act.u.copy.bytes = bytes;
  return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMCPY, &act);
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                      size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx) {
  (void)ctx;
  SIM_CALL(cuGraphAddMemcpyNode, add_memcpy(phGraphNode, hGraph, dependencies, numDependencies, copyParams));
}

static CUresult add_memset(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, const CUDA_MEMSET_NODE_PARAMS *p) {
  if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
  unsigned e = p->elementSize;
  if ((e != 1 && e != 2 && e != 4) || p->width == 0 || p->height == 0 || (p->dst & (e - 1)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  size_t row = p->width * e;
  if (p->height > 1 && p->pitch < row) return CUDA_ERROR_INVALID_VALUE;
  size_t span = (p->height - 1) * (p->height > 1 ? p->pitch : 0) + row;
  if (!sim__addr_contains(p->dst, span)) return CUDA_ERROR_INVALID_VALUE;
  sim__action_t act = {.kind = SIM_ACT_MEMSET};
  act.u.set.dst = p->dst;
  act.u.set.value = p->value;
  act.u.set.elem = e;
  act.u.set.width = p->width;
  act.u.set.height = p->height;
  act.u.set.pitch = p->height > 1 ? p->pitch : row;
  return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMSET, &act);
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                      size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx) {
  (void)ctx;
  SIM_CALL(cuGraphAddMemsetNode, add_memset(phGraphNode, hGraph, dependencies, numDependencies, memsetParams));
}

static CUresult add_host(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, const CUDA_HOST_NODE_PARAMS *p) {
  if (p == NULL || p->fn == NULL) return CUDA_ERROR_INVALID_VALUE;
  sim__action_t act = {.kind = SIM_ACT_HOST};
  act.u.host.fn = p->fn;
  act.u.host.data = p->userData;
  return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_HOST, &act);
}

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                    size_t numDependencies, const CUDA_HOST_NODE_PARAMS *nodeParams) {
  SIM_CALL(cuGraphAddHostNode, add_host(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

static CUresult add_empty(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n) {
  sim__action_t act = {.kind = SIM_ACT_EMPTY};
  return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_EMPTY, &act);
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                     size_t numDependencies) {
  SIM_CALL(cuGraphAddEmptyNode, add_empty(phGraphNode, hGraph, dependencies, numDependencies));
}

static CUresult add_event(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUevent he, int wait) {
  sim__event_t *e = sim__handle_get(he, SIM_MAGIC_EVENT);
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__action_t act = {.kind = wait ? SIM_ACT_EVENT_WAIT : SIM_ACT_EVENT_RECORD};
  act.u.event.ev = e;
  sim__event_ref(e);
  return add_node(out, g, deps, n, wait ? CU_GRAPH_NODE_TYPE_WAIT_EVENT : CU_GRAPH_NODE_TYPE_EVENT_RECORD, &act);
}

CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                           size_t numDependencies, CUevent event) {
  SIM_CALL(cuGraphAddEventRecordNode, add_event(phGraphNode, hGraph, dependencies, numDependencies, event, 0));
}

CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                         size_t numDependencies, CUevent event) {
  SIM_CALL(cuGraphAddEventWaitNode, add_event(phGraphNode, hGraph, dependencies, numDependencies, event, 1));
}

static CUresult add_mem_alloc(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  if (p == NULL || p->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      p->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  if (p->poolProps.location.id != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (graph_get(g) == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__alloc_t *a = sim__galloc_new(p->bytesize, &p->poolProps);
  if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  sim__action_t act = {.kind = SIM_ACT_MEM_ALLOC};
  act.u.mem.a = a;
  CUdeviceptr ptr = a->ptr;
  CUresult r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEM_ALLOC, &act);
  if (r == CUDA_SUCCESS) p->dptr = ptr;
  return r;
}

CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                        size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
  SIM_CALL(cuGraphAddMemAllocNode, add_mem_alloc(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

static CUresult add_mem_free(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUdeviceptr dptr) {
  sim__alloc_t *a = sim__galloc_find(dptr);
  if (a == NULL) return CUDA_ERROR_INVALID_VALUE;
  sim__action_t act = {.kind = SIM_ACT_MEM_FREE};
  act.u.mem.a = a;
  sim__galloc_ref(a);
  return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEM_FREE, &act);
}

CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                       size_t numDependencies, CUdeviceptr dptr) {
  SIM_CALL(cuGraphAddMemFreeNode, add_mem_free(phGraphNode, hGraph, dependencies, numDependencies, dptr));
}

static CUresult mem_alloc_params(CUgraphNode hn, CUDA_MEM_ALLOC_NODE_PARAMS *out) {
  sim__node_t *n = sim__node_get(hn);
  if (n == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
  memset(out, 0, sizeof *out);
  out->poolProps = n->act.u.mem.a->props;
  out->bytesize = n->act.u.mem.a->bytes;
  out->dptr = n->act.u.mem.a->ptr;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out) {
  SIM_CALL(cuGraphMemAllocNodeGetParams, mem_alloc_params(hNode, params_out));
}

static CUresult add_deps(CUgraph hg, const CUgraphNode *from, const CUgraphNode *to, const CUgraphEdgeData *edges, size_t n) {
  sim__graph_t *g = graph_get(hg);
  if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (n > 0 && (from == NULL || to == NULL)) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; i++) {
    sim__node_t *a = sim__node_get(from[i]), *b = sim__node_get(to[i]);
    if (a == NULL || b == NULL || a->g != g || b->g != g || a == b || has_edge(a, b)) return CUDA_ERROR_INVALID_VALUE;
    if (edges != NULL) {
      static const CUgraphEdgeData zero;
      if (memcmp(&edges[i], &zero, sizeof zero) != 0) return sim__unimplemented();
    }
  }
  for (size_t i = 0; i < n; i++) add_edge(sim__node_get(from[i]), sim__node_get(to[i]));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to,
                                        const CUgraphEdgeData *edgeData, size_t numDependencies) {
  SIM_CALL(cuGraphAddDependencies, add_deps(hGraph, from, to, edgeData, numDependencies));
}

static CUresult get_nodes(CUgraph hg, CUgraphNode *nodes, size_t *num) {
  sim__graph_t *g = graph_get(hg);
  if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (num == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (nodes == NULL) {
    *num = g->n;
    return CUDA_SUCCESS;
  }
  /* An array with room for no node: CUDA_ERROR_INVALID_VALUE, even for an empty graph (H200). */
  if (*num == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t k = *num < g->n ? *num : g->n;
  for (size_t i = 0; i < *num; i++) nodes[i] = i < k ? (CUgraphNode)g->nodes[i] : NULL;
  *num = k;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes) {
  SIM_CALL(cuGraphGetNodes, get_nodes(hGraph, nodes, numNodes));
}

static CUresult get_edges(CUgraph hg, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *edges, size_t *num) {
  sim__graph_t *g = graph_get(hg);
  if (g == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (num == NULL || (from == NULL) != (to == NULL)) return CUDA_ERROR_INVALID_VALUE;
  size_t total = 0;
  for (size_t i = 0; i < g->n; i++) total += g->nodes[i]->nout;
  if (from == NULL) {
    *num = total;
    return CUDA_SUCCESS;
  }
  size_t k = 0;
  for (size_t i = 0; i < g->n && k < *num; i++) {
    sim__node_t *a = g->nodes[i];
    for (size_t j = 0; j < a->nout && k < *num; j++, k++) {
      from[k] = (CUgraphNode)a;
      to[k] = (CUgraphNode)a->out[j];
      if (edges) memset(&edges[k], 0, sizeof edges[k]);
    }
  }
  for (size_t i = k; i < *num; i++) {
    from[i] = to[i] = NULL;
    if (edges) memset(&edges[i], 0, sizeof edges[i]);
  }
  *num = k;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphGetEdges(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *edgeData,
                                 size_t *numEdges) {
  SIM_CALL(cuGraphGetEdges, get_edges(hGraph, from, to, edgeData, numEdges));
}

static CUresult node_type(CUgraphNode hn, CUgraphNodeType *out) {
  sim__node_t *n = sim__node_get(hn);
  if (n == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  *out = n->type;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type) { SIM_CALL(cuGraphNodeGetType, node_type(hNode, type)); }
