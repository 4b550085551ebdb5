/* Device memory: mapped regions, the host's address map, cuMemAlloc/cuMemFree, copies and sets.
 *
 * Device memory is host memory mapped with MAP_NORESERVE (reserving is cheap; pages are real only
 * once touched). A *region* is one mapping and carries the oracle's access history; it outlives
 * an allocation when a pool reuses it. The *address map* holds the allocations API calls may name
 * now (host view): an allocation leaves it at its free call, even though queued work may still
 * use it. Every byte reserved counts against WEFT_SIM_MEMORY; over it -> CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Allocation and free are accesses: each writes its whole range, so work not ordered before a
 * free (or after an allocation) is reported as a race.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim/internal.h"

#define JUNK_BYTES (1u << 20) /* new memory is filled with 0xcd up to this many bytes */

size_t sim__round(size_t n) { return (n + SIM_ALIGN - 1) & ~(size_t)(SIM_ALIGN - 1); }

int sim__reserve(int dev, uint64_t size) {
  uint64_t *used = &sim.dev_reserved[dev];
  if (size > sim.memory_limit || *used > sim.memory_limit - size) return -1;
  *used += size;
  sim.reserved += size;
  return 0;
}

void sim__unreserve(int dev, uint64_t size) {
  sim.dev_reserved[dev] -= size;
  sim.reserved -= size;
}

/* ---- regions, sorted by base ---- */

static sim__region_t **g_regions;
static size_t g_nregions, g_capregions;

static size_t region_lower(uintptr_t p) {
  size_t a = 0, b = g_nregions;
  while (a < b) {
    size_t m = (a + b) / 2;
    if (g_regions[m]->base < p) a = m + 1;
    else b = m;
  }
  return a;
}

sim__region_t *sim__region_find(uintptr_t p) {
  size_t i = region_lower(p + 1);
  if (i == 0) return NULL;
  sim__region_t *r = g_regions[i - 1];
  return p < r->base + r->size ? r : NULL;
}

sim__region_t *sim__region_new(size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t mapped = (size + page - 1) & ~(page - 1);
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  memset(p, 0xcd, mapped < JUNK_BYTES ? mapped : JUNK_BYTES);
  sim__region_t *r = sim__xcalloc(1, sizeof *r);
  r->base = (uintptr_t)p;
  r->size = mapped;
  size_t i = region_lower(r->base);
  sim__grow(&g_regions, &g_capregions, g_nregions + 1, sizeof *g_regions);
  memmove(g_regions + i + 1, g_regions + i, (g_nregions - i) * sizeof *g_regions);
  g_regions[i] = r;
  g_nregions++;
  return r;
}

void sim__region_free(sim__region_t *r) {
  size_t i = region_lower(r->base);
  memmove(g_regions + i, g_regions + i + 1, (g_nregions - i - 1) * sizeof *g_regions);
  g_nregions--;
  munmap((void *)r->base, r->size);
  sim__hist_free(&r->hist);
  free(r);
}

/* ---- the address map (host-valid allocations), sorted by ptr ---- */

static sim__alloc_t **g_addr;
static size_t g_naddr, g_capaddr;

static size_t addr_lower(CUdeviceptr p) {
  size_t a = 0, b = g_naddr;
  while (a < b) {
    size_t m = (a + b) / 2;
    if (g_addr[m]->ptr < p) a = m + 1;
    else b = m;
  }
  return a;
}

void sim__addr_insert(sim__alloc_t *a) {
  size_t i = addr_lower(a->ptr);
  sim__grow(&g_addr, &g_capaddr, g_naddr + 1, sizeof *g_addr);
  memmove(g_addr + i + 1, g_addr + i, (g_naddr - i) * sizeof *g_addr);
  g_addr[i] = a;
  g_naddr++;
  a->host_valid = 1;
}

void sim__addr_remove(sim__alloc_t *a) {
  if (!a->host_valid) return;
  size_t i = addr_lower(a->ptr);
  while (i < g_naddr && g_addr[i] != a) i++;
  if (i == g_naddr) return;
  memmove(g_addr + i, g_addr + i + 1, (g_naddr - i - 1) * sizeof *g_addr);
  g_naddr--;
  a->host_valid = 0;
}

sim__alloc_t *sim__addr_exact(CUdeviceptr p) {
  size_t i = addr_lower(p);
  return i < g_naddr && g_addr[i]->ptr == p ? g_addr[i] : NULL;
}

int sim__addr_contains(CUdeviceptr p, size_t n) { return sim__addr_owner(p, n) != NULL; }

sim__alloc_t *sim__addr_owner(CUdeviceptr p, size_t n) {
  size_t i = addr_lower(p + 1);
  if (i == 0) return NULL;
  sim__alloc_t *a = g_addr[i - 1];
  return p >= a->ptr && p + n <= a->ptr + a->size && p + n >= p ? a : NULL;
}

/* ---- cuMemAlloc / cuMemFree ---- */

static CUresult mem_alloc(CUdeviceptr *out, size_t bytes) {
  if (out == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if ((r = sim__capture_unsafe()) != CUDA_SUCCESS) return r;
  size_t size = sim__round(bytes);
  int dev = sim__cur_dev();
  if (sim__reserve(dev, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  sim__region_t *reg = sim__region_new(size);
  if (reg == NULL) {
    sim__unreserve(dev, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  sim__alloc_t *a = sim__xcalloc(1, sizeof *a);
  a->kind = SIM_ALLOC_PLAIN;
  a->dev = dev;
  a->ptr = (CUdeviceptr)reg->base;
  a->bytes = bytes;
  a->size = size;
  a->region = reg;
  reg->allocated = 1;
  sim__addr_insert(a);
  sim.stats.bytes_in_use += size;
  sim__actx_t ctx;
  sim__host_access_ctx(&ctx, "cuMemAlloc");
  sim__oracle_begin();
  sim__oracle_access(a->ptr, size, 1, &ctx);
  *out = a->ptr;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) { SIM_CALL(cuMemAlloc, mem_alloc(dptr, bytesize)); }

static int null_stream_done(void *arg) {
  const sim__stream_t *s = arg;
  return s->done >= s->issued;
}

/* cuMemFree synchronises the device first (as cudaFree does), so queued work that still uses the
 * block runs before it goes away and is ordered before the free. */
static CUresult mem_free(CUdeviceptr p) {
  if (p == 0) return CUDA_SUCCESS; /* as the driver does */
  sim__alloc_t *a = sim__addr_exact(p);
  if (a == NULL || a->kind != SIM_ALLOC_PLAIN) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__capture_unsafe();
  if (r != CUDA_SUCCESS) return r;
  if ((r = sim__drain()) != CUDA_SUCCESS) return r;
  for (size_t i = 0; i < sim.nstreams; i++) sim__host_join(&sim.streams[i]->vc);
  sim__host_join(&sim.retired_vc);
  sim__actx_t ctx;
  sim__host_access_ctx(&ctx, "cuMemFree");
  sim__oracle_begin();
  sim__oracle_access(a->ptr, a->size, 1, &ctx);
  sim__addr_remove(a);
  sim.stats.bytes_in_use -= a->size;
  sim__unreserve(a->dev, a->size);
  sim__region_free(a->region);
  free(a);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) { SIM_CALL(cuMemFree, mem_free(dptr)); }

void sim__plain_free_executed(sim__alloc_t *a, const sim__actx_t *ctx) {
  sim__oracle_access(a->ptr, a->size, 1, ctx);
  sim__unreserve(a->dev, a->size);
  sim__region_free(a->region);
  free(a);
}

static CUresult mem_get_info(size_t *free_bytes, size_t *total) {
  if (free_bytes == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  *total = (size_t)sim.memory_limit;
  *free_bytes = (size_t)(sim.memory_limit - sim.dev_reserved[sim__cur_dev()]);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free, size_t *total) { SIM_CALL(cuMemGetInfo, mem_get_info(free, total)); }

/* ---- synchronous copies: run on the host's clock after the legacy stream's work ---- */

static int copy_can_touch(int dev, const sim__alloc_t *a);

/* The current context's device must have access to pool memory of another device (2 x H100: a
 * cuMemcpyDtoH of device 1's pool memory from device 0's context failed; conformance.c
 * test_two_devices_pool_access), as for a device-to-device copy on a stream (copy_can_touch). */
static CUresult copy_sync(CUdeviceptr dev, void *host_dst, const void *host_src, size_t n) {
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if ((host_dst == NULL && host_src == NULL) || (n > 0 && !sim__addr_contains(dev, n))) return CUDA_ERROR_INVALID_VALUE;
  if (n > 0 && !copy_can_touch(sim__cur_dev(), sim__addr_owner(dev, n))) return CUDA_ERROR_INVALID_VALUE;
  /* Not an unsafe call: measured on an H200, a synchronous copy under GLOBAL capture succeeds and
   * leaves the capture valid. */
  sim__stream_t *legacy = sim__null_stream(sim__cur_dev());
  if ((r = sim__run_until(null_stream_done, legacy)) != CUDA_SUCCESS) return r;
  sim__host_join(&legacy->vc);
  if (n == 0) return CUDA_SUCCESS;
  sim__actx_t ctx;
  sim__host_access_ctx(&ctx, host_src ? "cuMemcpyHtoD" : "cuMemcpyDtoH");
  sim__oracle_begin();
  if (sim__oracle_access(dev, n, host_src != NULL, &ctx) != 0) return CUDA_SUCCESS;
  if (host_src) memmove((void *)(uintptr_t)dev, host_src, n);
  else memmove(host_dst, (const void *)(uintptr_t)dev, n);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
  SIM_CALL(cuMemcpyHtoD, copy_sync(dstDevice, NULL, srcHost, ByteCount));
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  SIM_CALL(cuMemcpyDtoH, copy_sync(srcDevice, dstHost, NULL, ByteCount));
}

/* ---- stream-ordered copies and sets ---- */

/* Whether a device-to-device copy on a stream of device `dev` may touch allocation a: pool memory
 * of another device needs the pool's access for `dev` (2 x H100: INVALID_VALUE without it);
 * cuMemAlloc memory of any device may be copied (the driver stages it), as may anything with
 * cuMemcpyPeerAsync. */
static int copy_can_touch(int dev, const sim__alloc_t *a) {
  return a == NULL || a->pool == NULL || a->dev == dev || ((a->pool->access >> dev) & 1u);
}

static CUresult copy_async_as(sim__copy_dir_t dir, CUdeviceptr dst_dev, void *dst_host, CUdeviceptr src_dev,
                              const void *src_host, size_t n, CUstream hs, int peer);

static CUresult copy_async(sim__copy_dir_t dir, CUdeviceptr dst_dev, void *dst_host, CUdeviceptr src_dev,
                           const void *src_host, size_t n, CUstream hs) {
  return copy_async_as(dir, dst_dev, dst_host, src_dev, src_host, n, hs, 0);
}

static CUresult copy_async_as(sim__copy_dir_t dir, CUdeviceptr dst_dev, void *dst_host, CUdeviceptr src_dev,
                              const void *src_host, size_t n, CUstream hs, int peer) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  /* (No current context needed: the stream names it; the default streams, without one, were
   * refused above. H200, tests/conformance "no current context".) */
  if ((dir == SIM_HTOD && src_host == NULL) || (dir == SIM_DTOH && dst_host == NULL)) return CUDA_ERROR_INVALID_VALUE;
  if (n > 0 && (dir == SIM_HTOD || dir == SIM_DTOD) && !sim__addr_contains(dst_dev, n)) return CUDA_ERROR_INVALID_VALUE;
  if (n > 0 && (dir == SIM_DTOH || dir == SIM_DTOD) && !sim__addr_contains(src_dev, n)) return CUDA_ERROR_INVALID_VALUE;
  if (n > 0 && dir == SIM_DTOD && !peer &&
      (!copy_can_touch(s->dev, sim__addr_owner(dst_dev, n)) || !copy_can_touch(s->dev, sim__addr_owner(src_dev, n))))
    return CUDA_ERROR_INVALID_VALUE;
  sim__action_t act = {.kind = SIM_ACT_MEMCPY};
  act.u.copy.dir = dir;
  act.u.copy.dst_dev = dst_dev;
  act.u.copy.src_dev = src_dev;
  act.u.copy.dst_host = dst_host;
  act.u.copy.src_host = src_host;
  act.u.copy.bytes = n;
  /* A queued host-to-device copy reads its source now (the driver stages pageable memory); a
   * captured one reads it at every launch. */
  if (dir == SIM_HTOD && s->cap == NULL && n > 0) {
    act.u.copy.staged = sim__xmalloc(n);
    memcpy(act.u.copy.staged, src_host, n);
  }
  return sim__submit(s, &act, CU_GRAPH_NODE_TYPE_MEMCPY);
}

/* ---- page-locked host memory ----
 * cuMemHostAlloc memory is the only host memory the simulator knows as pinned: a stream-ordered
 * copy to any other (pageable) host memory returns only once the copy has run, as the driver's
 * does (conformance: test_a_pageable_device_to_host_copy_waits_for_its_stream). */

typedef struct pinned {
  uintptr_t p;
  size_t n;
  struct pinned *next;
} pinned_t;
static pinned_t *g_pinned;

/* The pinned range holding [p, p+n), or NULL. Lock held. */
static pinned_t *pinned_find(uintptr_t p, size_t n) {
  for (pinned_t *r = g_pinned; r != NULL; r = r->next)
    if (p >= r->p && p - r->p < r->n && n <= r->n - (p - r->p)) return r;
  return NULL;
}

static CUresult host_alloc(void **pp, size_t n, unsigned flags) {
  (void)flags;
  if (pp == NULL || n == 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if ((r = sim__capture_unsafe()) != CUDA_SUCCESS) return r;
  pinned_t *x = sim__xcalloc(1, sizeof *x);
  void *m = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  if (m == NULL) {
    free(x);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  x->p = (uintptr_t)m;
  x->n = n;
  x->next = g_pinned;
  g_pinned = x;
  *pp = m;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  SIM_CALL(cuMemHostAlloc, host_alloc(pp, bytesize, Flags));
}

/* cuMemFreeHost synchronises the device first (as cudaFreeHost does). */
static CUresult host_free(void *p) {
  pinned_t **at = &g_pinned;
  while (*at != NULL && (*at)->p != (uintptr_t)p) at = &(*at)->next;
  if (*at == NULL) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__capture_unsafe();
  if (r != CUDA_SUCCESS) return r;
  if ((r = sim__drain()) != CUDA_SUCCESS) return r;
  pinned_t *x = *at;
  *at = x->next;
  free((void *)x->p);
  free(x);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void *p) { SIM_CALL(cuMemFreeHost, host_free(p)); }

/* MEMORY_TYPE (host for cuMemHostAlloc memory, device for device memory) and the range of either;
 * pageable host memory is unknown to CUDA: INVALID_VALUE, as from the driver. */
static CUresult pointer_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
  if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
  pinned_t *h = pinned_find((uintptr_t)ptr, 1);
  sim__alloc_t *a = h == NULL && sim__addr_contains(ptr, 1) ? sim__addr_owner(ptr, 1) : NULL;
  if (h == NULL && a == NULL) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = h ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = h ? (CUdeviceptr)h->p : a->ptr; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = h ? h->n : a->size; return CUDA_SUCCESS;
    default: sim.stats.unimplemented++; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  SIM_CALL(cuPointerGetAttribute, pointer_attribute(data, attribute, ptr));
}

typedef struct op_done {
  const sim__stream_t *s;
  uint64_t seq;
} op_done_t;

static int op_done(void *arg) {
  const op_done_t *d = arg;
  return d->s->done >= d->seq;
}

/* A device-to-host copy to pageable memory: queued, then run to its end before the call returns
 * (and the host has seen everything before it on the stream). */
static CUresult copy_to_pageable(CUdeviceptr src, void *dst, size_t n, CUstream hs) {
  CUresult r = copy_async(SIM_DTOH, 0, dst, src, NULL, n, hs);
  sim__stream_t *s = sim__stream_get(hs);
  if (r != CUDA_SUCCESS || n == 0 || s->cap != NULL || pinned_find((uintptr_t)dst, n) != NULL) return r;
  op_done_t d = {s, s->issued};
  if ((r = sim__run_until(op_done, &d)) != CUDA_SUCCESS) return r;
  sim__host_join(&s->vc);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) {
  SIM_CALL(cuMemcpyHtoDAsync, copy_async(SIM_HTOD, dstDevice, NULL, 0, srcHost, ByteCount, hStream));
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  SIM_CALL(cuMemcpyDtoHAsync, copy_to_pageable(srcDevice, dstHost, ByteCount, hStream));
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  SIM_CALL(cuMemcpyDtoDAsync, copy_async(SIM_DTOD, dstDevice, NULL, srcDevice, NULL, ByteCount, hStream));
}

/* Unified addressing: a peer copy is a device-to-device copy; the contexts must be live ones.
 * It needs no peer or pool access (2 x H100: the driver stages it). */
static CUresult copy_peer(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t n, CUstream hs) {
  if (sim__handle_get(dc, SIM_MAGIC_CTX) == NULL || sim__handle_get(sc, SIM_MAGIC_CTX) == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  /* Not capturable: the capture is invalidated (tests/conformance, "peer copy"). */
  sim__stream_t *s = sim__stream_get(hs);
  if (s != NULL && s->cap != NULL) {
    sim__capture_invalidate(s->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return copy_async_as(SIM_DTOD, dst, NULL, src, NULL, n, hs, 1);
}

CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                   CUcontext srcContext, size_t ByteCount, CUstream hStream) {
  SIM_CALL(cuMemcpyPeerAsync, copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream));
}

static CUresult set_async(CUdeviceptr dst, unsigned value, unsigned elem, size_t count, CUstream hs) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  /* (No current context needed: the stream names it. H200, tests/conformance.) */
  if ((dst & (elem - 1)) != 0 || (count > 0 && !sim__addr_contains(dst, count * elem))) return CUDA_ERROR_INVALID_VALUE;
  /* Memory of another device: refused at enqueue unless the stream's device may touch it (2 x
   * H100: INVALID_VALUE without peer access). */
  if (count > 0 && !sim__dev_can_touch(s->dev, sim__addr_owner(dst, count * elem))) return CUDA_ERROR_INVALID_VALUE;
  sim__action_t act = {.kind = SIM_ACT_MEMSET};
  act.u.set.dst = dst;
  act.u.set.value = value;
  act.u.set.elem = elem;
  act.u.set.width = count;
  act.u.set.height = 1;
  act.u.set.pitch = count * elem;
  return sim__submit(s, &act, CU_GRAPH_NODE_TYPE_MEMSET);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  SIM_CALL(cuMemsetD8Async, set_async(dstDevice, uc, 1, N, hStream));
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  SIM_CALL(cuMemsetD32Async, set_async(dstDevice, ui, 4, N, hStream));
}
