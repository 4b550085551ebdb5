/* Graph memory nodes as a resource (mem.h): on a capturing stream cuMemAllocAsync becomes a
 * memory-allocation node of the graph being captured and cuMemFreeAsync a free node; on a live
 * stream cuMemFreeAsync gives a graph's output back (the graph's next launch then reallocates
 * the same address, CUDA_SEMANTICS.md). The driver owns the memory (graph memory counters,
 * cuDeviceGraphMemTrim): nothing is reserved here. Both calls are work on the stream, so later
 * points of the stream cover them. */
#include "lib/mem/mem.h"

weft_status_t weft__graph_memory_trim(weft__tracker_t *tr) {
  CUresult r;
  WEFT__GRAPH_MEMORY(tr->ctx, WEFT__RELAXED(tr->drv, r = tr->drv->cuDeviceGraphMemTrim(tr->device)));
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "cuDeviceGraphMemTrim");
}

typedef weft__plain_resource_t graph_nodes_t;

static weft_status_t nodes_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                    CUdeviceptr *out) {
  graph_nodes_t *g = (graph_nodes_t *)self;
  if (g->tr->drv->cuMemAllocAsync == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_alloc: the driver has no stream-ordered allocation (graph memory nodes)");
  CUresult r;
  WEFT__GRAPH_MEMORY(g->tr->ctx, WEFT__RELAXED(g->tr->drv, r = g->tr->drv->cuMemAllocAsync(out, bytes, s->raw)));
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemAllocAsync (graph memory)");
  weft__tracker_touch(s);
  return WEFT_OK;
}

static weft_status_t nodes_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                      const char *tag) {
  graph_nodes_t *g = (graph_nodes_t *)self;
  CUresult r;
  WEFT__GRAPH_MEMORY(g->tr->ctx, WEFT__RELAXED(g->tr->drv, r = g->tr->drv->cuMemFreeAsync(p, s->raw)));
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemFreeAsync (graph memory)");
  weft__tracker_touch(s);
  return WEFT_OK;
}

const weft_resource_ops_t weft__graph_nodes_ops = {
    .name = "graph",
    .allocate = nodes_allocate,
    .deallocate = nodes_deallocate,
    .destroy = weft__plain_resource_destroy,
};

weft_status_t weft__graph_nodes_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t **out) {
  return weft__plain_resource_create(tr, rt, &weft__graph_nodes_ops, out);
}
