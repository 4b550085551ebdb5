/* Stream-ordered memory pools: cuMemPool*, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync.
 *
 * Each pool allocation is one region (mapping). A free (cuMemFreeAsync) puts the region on the
 * pool's free list at the call, marked with the freeing stream's lane; when the free op runs it
 * gets its tick. A later allocation reuses a freed region only when the free is ordered before
 * it, following cuMemPool's reuse rules in their simplest form:
 *   - same stream: at once (stream order puts the free first, even before it ran);
 *   - another stream: once the free ran and its tick is known to the host (a synchronisation) or,
 *     with REUSE_FOLLOW_EVENT_DEPENDENCIES, to the allocating stream (an event wait);
 *   - otherwise fresh memory is mapped, so no reuse can ever be a race of the pool's making.
 * At every synchronisation each pool keeps at most its release threshold (default 0) of freed
 * memory and unmaps the rest. Captured allocations become graph allocations (graph.c).
 * A pool's reserved memory stays within CUmemPoolProps.maxSize (0: no limit), else the allocation
 * is CUDA_ERROR_OUT_OF_MEMORY. Allocation and free on a stream that is not capturing are unsafe
 * calls (sim__capture_unsafe), as on an H200.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim/internal.h"

static sim__pool_t **g_pools;
static size_t g_npools, g_cappools;

sim__pool_t *sim__pool_new(const CUmemPoolProps *props) {
  sim__pool_t *p = sim__xcalloc(1, sizeof *p);
  p->magic = SIM_MAGIC_POOL;
  p->props = *props;
  p->access = 1u << props->location.id;
  p->reuse_follow = p->reuse_opportunistic = p->reuse_internal = 1;
  sim__handle_add(p);
  sim__grow(&g_pools, &g_cappools, g_npools + 1, sizeof *g_pools);
  g_pools[g_npools++] = p;
  return p;
}

static void pool_forget(sim__pool_t *p) {
  for (size_t i = 0; i < g_npools; i++) {
    if (g_pools[i] != p) continue;
    g_pools[i] = g_pools[--g_npools];
    break;
  }
  free(p);
}

/* Unmaps freed regions whose free ran, until the pool holds at most `keep` bytes. */
static void pool_trim(sim__pool_t *p, uint64_t keep) {
  sim__chunk_t **link = &p->free;
  while (*link != NULL && p->reserved > keep) {
    sim__chunk_t *c = *link;
    if (!c->executed) {
      link = &c->next;
      continue;
    }
    *link = c->next;
    p->reserved -= c->size;
    sim__unreserve(p->props.location.id, c->size);
    sim__region_free(c->region);
    free(c);
  }
}

void sim__pools_release(void) {
  for (size_t i = 0; i < g_npools; i++) pool_trim(g_pools[i], g_pools[i]->threshold);
}

static sim__pool_t *pool_get(CUmemoryPool h) { return sim__handle_get(h, SIM_MAGIC_POOL); }

static CUresult pool_create(CUmemoryPool *out, const CUmemPoolProps *props) {
  if (out == NULL || props == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return sim__unimplemented();
  if (props->location.id < 0 || props->location.id >= sim.ndev) return CUDA_ERROR_INVALID_DEVICE;
  unsigned known = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;
  if ((props->handleTypes & ~known) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = sim__capture_unsafe(); /* measured on an H200 */
  if (r != CUDA_SUCCESS) return r;
  *out = (CUmemoryPool)sim__pool_new(props);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
  SIM_CALL(cuMemPoolCreate, pool_create(pool, poolProps));
}

/* A destroyed pool lives on until its last allocation is freed and the free ran. */
static void pool_maybe_free(sim__pool_t *p) {
  if (!p->destroyed) return;
  pool_trim(p, 0);
  if (p->live == 0 && p->free == NULL) pool_forget(p);
}

static CUresult pool_destroy(CUmemoryPool h) {
  sim__pool_t *p = pool_get(h);
  if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (p->is_default) return CUDA_ERROR_INVALID_VALUE;
  sim__handle_remove(p);
  p->destroyed = 1;
  pool_maybe_free(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) { SIM_CALL(cuMemPoolDestroy, pool_destroy(pool)); }

static CUresult pool_set(CUmemoryPool h, CUmemPool_attribute attr, void *value) {
  sim__pool_t *p = pool_get(h);
  if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__capture_unsafe();
  if (r != CUDA_SUCCESS) return r;
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = *(cuuint64_t *)value; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p->reuse_follow = *(int *)value != 0; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p->reuse_opportunistic = *(int *)value != 0; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p->reuse_internal = *(int *)value != 0; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (*(cuuint64_t *)value != 0) return CUDA_ERROR_INVALID_VALUE;
      p->reserved_high = p->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (*(cuuint64_t *)value != 0) return CUDA_ERROR_INVALID_VALUE;
      p->used_high = p->used;
      return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  SIM_CALL(cuMemPoolSetAttribute, pool_set(pool, attr, value));
}

static CUresult pool_get_attr(CUmemoryPool h, CUmemPool_attribute attr, void *value) {
  sim__pool_t *p = pool_get(h);
  if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__capture_unsafe();
  if (r != CUDA_SUCCESS) return r;
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *(int *)value = p->reuse_follow; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *(int *)value = p->reuse_opportunistic; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = p->reuse_internal; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
  SIM_CALL(cuMemPoolGetAttribute, pool_get_attr(pool, attr, value));
}

static CUresult pool_trim_to(CUmemoryPool h, size_t keep) {
  sim__pool_t *p = pool_get(h);
  if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = sim__capture_unsafe();
  if (r != CUDA_SUCCESS) return r;
  pool_trim(p, keep);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  SIM_CALL(cuMemPoolTrimTo, pool_trim_to(pool, minBytesToKeep));
}

static CUresult pool_export(void *out, CUmemoryPool h, CUmemAllocationHandleType type, unsigned long long flags) {
  sim__pool_t *p = pool_get(h);
  if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  /* A pool created without handle types cannot export: CUDA_ERROR_INVALID_VALUE (measured, H200). */
  if ((p->props.handleTypes & type) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return sim__unimplemented();
  CUresult r = sim__capture_unsafe(); /* measured on an H200 (the capture matrix) */
  if (r != CUDA_SUCCESS) return r;
  /* A real descriptor (of /dev/null) so the caller can close it like the driver's. */
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  *(int *)out = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                  CUmemAllocationHandleType handleType, unsigned long long flags) {
  SIM_CALL(cuMemPoolExportToShareableHandle, pool_export(handle_out, pool, handleType, flags));
}

/* ---- allocation and free ---- */

static int reusable(const sim__pool_t *p, const sim__chunk_t *c, const sim__stream_t *s) {
  if (c->free_lane == s->lane) return 1;
  if (!c->executed) return 0;
  if (!sim.oracle) return 1;
  if (sim__vc_get(&sim.host_vc, c->free_lane) >= c->free_tick) return 1;
  return p->reuse_follow && sim__vc_get(&s->vc, c->free_lane) >= c->free_tick;
}

/* A freed region of this pool that may hold `size` bytes for stream s, unlinked; or NULL. */
static sim__region_t *take_free(sim__pool_t *p, size_t size, const sim__stream_t *s) {
  for (sim__chunk_t **link = &p->free; *link != NULL; link = &(*link)->next) {
    sim__chunk_t *c = *link;
    if (c->size < size || c->size > 2 * size + 4096 || !reusable(p, c, s)) continue;
    *link = c->next;
    sim__region_t *r = c->region;
    if (c->pending) c->pending->chunk = NULL; /* its free will find no chunk to mark */
    free(c);
    return r;
  }
  return NULL;
}

/* Whether mapping `size` more bytes keeps the pool within CUmemPoolProps.maxSize (0: no limit).
 * The driver's pool is capped at maxSize and an allocation that would take it beyond fails with
 * CUDA_ERROR_OUT_OF_MEMORY [doc: cuMemPoolCreate; tests/conformance]. Freed memory of this pool
 * whose free ran is given back first, as the device-wide limit does below. */
static int within_max_size(sim__pool_t *p, size_t size) {
  uint64_t max = p->props.maxSize;
  if (max == 0) return 1;
  if (size > max) return 0;
  if (p->reserved + size > max) pool_trim(p, max - size);
  return p->reserved + size <= max;
}

static sim__region_t *map_new(sim__pool_t *p, size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (!within_max_size(p, (size + page - 1) & ~(page - 1))) return NULL;
  sim__region_t *r = sim__region_new(size);
  if (r == NULL) return NULL;
  if (sim__reserve(p->props.location.id, r->size) != 0) {
    /* Over the device's memory: give back what every pool holds beyond what it must, then retry. */
    for (size_t i = 0; i < g_npools; i++) pool_trim(g_pools[i], 0);
    if (sim__reserve(p->props.location.id, r->size) != 0) {
      sim__region_free(r);
      return NULL;
    }
  }
  p->reserved += r->size;
  if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
  return r;
}

static CUresult alloc_async(CUdeviceptr *out, size_t bytes, sim__pool_t *p, CUstream hs) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL || p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r; /* (no current context needed: the stream names it. H200, tests/conformance) */
  /* On a stream that is not capturing, stream-ordered allocation is unsafe under capture: while
   * another stream is in a GLOBAL capture (begun by this or another thread), or this thread's own
   * capture is not RELAXED, it fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates
   * that capture, unless this thread's mode is RELAXED (cuThreadExchangeStreamCaptureMode)
   * [H200, shared/CUDA_SEMANTICS.md "What may run while another stream is in a GLOBAL capture";
   * tests/conformance]. Checked before the 0-byte case, which was not measured under capture. */
  if (s->cap == NULL && (r = sim__capture_unsafe()) != CUDA_SUCCESS) return r;
  if (bytes == 0) { /* succeeds with no memory (measured, H200) */
    *out = 0;
    return CUDA_SUCCESS;
  }
  if (s->cap != NULL) {
    sim__graph_call_check(s->dev, "a graph memory allocation node (stream-ordered allocation under capture)");
    if (s->cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    sim__alloc_t *g = sim__galloc_new(bytes, &p->props);
    if (g == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    sim__action_t act = {.kind = SIM_ACT_MEM_ALLOC};
    act.u.mem.a = g;
    r = sim__capture_add(s, &act, CU_GRAPH_NODE_TYPE_MEM_ALLOC, NULL);
    if (r == CUDA_SUCCESS) *out = g->ptr;
    return r;
  }
  size_t size = sim__round(bytes);
  sim__region_t *reg = take_free(p, size, s);
  if (reg == NULL && (reg = map_new(p, size)) == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  sim__alloc_t *a = sim__xcalloc(1, sizeof *a);
  a->kind = SIM_ALLOC_POOL;
  a->dev = p->props.location.id;
  a->ptr = (CUdeviceptr)reg->base;
  a->bytes = bytes;
  a->size = size;
  a->region = reg;
  a->pool = p;
  p->live++;
  p->used += size;
  if (p->used > p->used_high) p->used_high = p->used;
  sim.stats.bytes_in_use += size;
  sim__addr_insert(a);
  sim__action_t act = {.kind = SIM_ACT_MEM_ALLOC};
  act.u.mem.ptr = a->ptr;
  act.u.mem.size = a->size;
  sim__enqueue(s, &act);
  a->alloc_stream = s->id;
  a->alloc_seq = s->issued;
  s->pooled = 1;
  *out = a->ptr;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  SIM_CALL(cuMemAllocFromPoolAsync, alloc_async(dptr, bytesize, pool_get(pool), hStream));
}

/* cuMemAllocAsync: the default pool of the stream's device. */
static CUresult alloc_default(CUdeviceptr *out, size_t bytes, CUstream hs) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  return alloc_async(out, bytes, sim.default_pools[s->dev], hs);
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  SIM_CALL(cuMemAllocAsync, alloc_default(dptr, bytesize, hStream));
}

/* ---- access from other devices (2 x H100, driver 580.159.04; tests/conformance/README.md) ----
 * A pool's own device always has READWRITE access: setting it (to anything) is INVALID_DEVICE, as
 * is a device that does not exist. Other devices start with none; READ and READWRITE grant it
 * (the simulator does not tell them apart), NONE takes it back. Allocation from a pool on another
 * device's stream succeeds with or without access; access matters to the work that touches it. */

static CUresult pool_set_access(sim__pool_t *p, const CUmemAccessDesc *map, size_t count) {
  if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (map == NULL && count != 0) return CUDA_ERROR_INVALID_VALUE;
  uint32_t access = p->access;
  for (size_t i = 0; i < count; i++) {
    int d = map[i].location.id;
    if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= sim.ndev || d == p->props.location.id) return CUDA_ERROR_INVALID_DEVICE;
    if (map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) access &= ~(1u << d);
    else if (map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ || map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      access |= 1u << d;
    else return CUDA_ERROR_INVALID_VALUE;
  }
  p->access = access;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
  SIM_CALL(cuMemPoolSetAccess, pool_set_access(pool_get(pool), map, count));
}

static CUresult pool_get_access(CUmemAccess_flags *out, sim__pool_t *p, const CUmemLocation *loc) {
  if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL || loc == NULL || loc->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (loc->id < 0 || loc->id >= sim.ndev) return CUDA_ERROR_INVALID_DEVICE;
  *out = (p->access >> loc->id) & 1u ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location) {
  SIM_CALL(cuMemPoolGetAccess, pool_get_access(flags, pool_get(memPool), location));
}

void sim__pool_free_executed(sim__alloc_t *a, const sim__who_t *who) {
  sim__region_t *r = a->region;
  r->allocated = 0;
  r->last_free = *who;
  r->has_last_free = 1;
  if (a->chunk != NULL) {
    a->chunk->executed = 1;
    a->chunk->free_tick = who->tick;
    a->chunk->pending = NULL;
  }
  sim__pool_t *p = a->pool;
  p->live--;
  free(a);
  pool_maybe_free(p);
}

static CUresult free_async(CUdeviceptr ptr, CUstream hs) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  sim__alloc_t *a = sim__addr_exact(ptr);
  if (a == NULL) return CUDA_ERROR_INVALID_VALUE;
  /* A free on a stream that is not capturing is unsafe under capture, as allocation is above
   * [H200, shared/CUDA_SEMANTICS.md; tests/conformance]. */
  if (s->cap == NULL) {
    CUresult r = sim__capture_unsafe();
    if (r != CUDA_SUCCESS) return r;
  }
  if (a->kind == SIM_ALLOC_GRAPH) {
    sim__graph_call_check(s->dev, "cuMemFreeAsync of graph memory");
    if (s->cap != NULL) {
      sim__action_t act = {.kind = SIM_ACT_MEM_FREE};
      act.u.mem.a = a;
      sim__galloc_ref(a);
      return sim__capture_add(s, &act, CU_GRAPH_NODE_TYPE_MEM_FREE, NULL);
    }
    if (!a->host_live) return CUDA_ERROR_INVALID_VALUE;
    a->host_live = 0;
    sim__action_t act = {.kind = SIM_ACT_MEM_FREE};
    act.u.mem.a = a;
    sim__galloc_ref(a);
    sim__enqueue(s, &act);
    return CUDA_SUCCESS;
  }
  /* Memory freed inside a capture would have to be graph memory. */
  if (s->cap != NULL) return CUDA_ERROR_INVALID_VALUE;
  sim__addr_remove(a);
  if (a->kind == SIM_ALLOC_PLAIN) { /* cuMemAlloc memory, freed in stream order (measured, H200) */
    sim.stats.bytes_in_use -= a->size;
    sim__action_t act = {.kind = SIM_ACT_MEM_FREE};
    act.u.mem.a = a;
    sim__enqueue(s, &act);
    return CUDA_SUCCESS;
  }
  sim__chunk_t *c = sim__xcalloc(1, sizeof *c);
  c->region = a->region;
  c->size = a->region->size;
  c->free_lane = s->lane;
  c->pending = a;
  c->next = a->pool->free;
  a->pool->free = c;
  a->chunk = c;
  a->pool->used -= a->size;
  sim.stats.bytes_in_use -= a->size;
  sim__action_t act = {.kind = SIM_ACT_MEM_FREE};
  act.u.mem.a = a;
  sim__enqueue(s, &act);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { SIM_CALL(cuMemFreeAsync, free_async(dptr, hStream)); }
