/* The async resource: a cuMemPool of the runtime's device, with cuMemAllocFromPoolAsync /
 * cuMemFreeAsync on the caller's stream. The driver orders reuse itself (a free on s is reusable
 * by later work on s at once, by other streams after event dependencies); weft's tracker already
 * made s wait for every use before the free. Pool attributes and trims are housekeeping that a
 * stream capture must not see: they refuse while a pool stream captures. */
#include <string.h>

#include "lib/mem/mem.h"

/* Reserved bytes are the live ones: the pool's cached memory is in its RESERVED_MEM_* attributes,
 * which are housekeeping a capture must not see, so stats never ask for them. */
typedef struct async {
  weft_resource_t base;     /* first */
  weft__tracker_t *tr;
  CUmemoryPool pool;        /* owned */
  weft_async_options_t opt;
} async_t;

weft_async_options_t weft_async_options_default(void) {
  weft_async_options_t o;
  memset(&o, 0, sizeof o);
  o.initial_reserve = 0;
  o.max_size = 0;
  o.release_threshold = UINT64_MAX;
  o.reuse_follow_event_dependencies = 1;
  o.reuse_allow_opportunistic = 1;
  o.reuse_allow_internal_dependencies = 1;
  o.handle_type = CU_MEM_HANDLE_TYPE_NONE;
  return o;
}

static weft_status_t async_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                    CUdeviceptr *out) {
  async_t *a = (async_t *)self;
  weft_status_t st = weft__tracker_bind(a->tr);
  if (st != WEFT_OK) return st;
  CUresult r;
  WEFT__RELAXED(a->tr->drv, r = a->tr->drv->cuMemAllocFromPoolAsync(out, bytes, a->pool, s->raw));
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemAllocFromPoolAsync");
  weft__tracker_touch(s); /* the allocation is work on s: later points of s must cover it */
  return WEFT_OK;
}

static weft_status_t async_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                      const char *tag) {
  async_t *a = (async_t *)self;
  weft_status_t st = weft__tracker_bind(a->tr);
  if (st != WEFT_OK) return st;
  CUresult r;
  WEFT__RELAXED(a->tr->drv, r = a->tr->drv->cuMemFreeAsync(p, s->raw));
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemFreeAsync");
  weft__tracker_touch(s);
  return WEFT_OK;
}

static weft_status_t async_trim(weft_resource_t *self, size_t keep) {
  async_t *a = (async_t *)self;
  weft_status_t st = weft__tracker_bind(a->tr);
  if (st != WEFT_OK) return st;
  CUresult r;
  WEFT__RELAXED(a->tr->drv, r = a->tr->drv->cuMemPoolTrimTo(a->pool, keep));
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "cuMemPoolTrimTo");
}

static weft_status_t async_destroy(weft_resource_t *self) {
  async_t *a = (async_t *)self;
  /* With allocations still outstanding the driver releases the pool once they are freed. */
  weft_status_t st = weft__tracker_bind(a->tr);
  CUresult r = CUDA_SUCCESS;
  if (st == WEFT_OK) WEFT__RELAXED(a->tr->drv, r = a->tr->drv->cuMemPoolDestroy(a->pool));
  if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemPoolDestroy");
  weft__meta_free(a);
  return st;
}

const weft_resource_ops_t weft__async_ops = {
    .name = "async",
    .allocate = async_allocate,
    .deallocate = async_deallocate,
    .trim = async_trim,
    .destroy = async_destroy,
};

static weft_status_t set_int(const weft__driver_t *drv, CUmemoryPool pool, CUmemPool_attribute attr, int v,
                             const char *what) {
  CUresult r = drv->cuMemPoolSetAttribute(pool, attr, &v);
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, what);
}

/* Warms the pool: one allocation of `bytes` freed at once on stream 0 (the release threshold
 * keeps the memory reserved). If the free fails, the unwinding of weft_async_create tries it once
 * more before destroying the pool: a pool destroyed with an outstanding allocation keeps its
 * memory until that allocation is freed, i.e. forever. */
/* The initial reserve: one allocation and its free on a held live stream (never one a capture
 * would record them into). A free that fails leaves the block in *held, to free on *on. */
static weft_status_t reserve(async_t *a, uint64_t bytes, weft_stream_t *on, CUdeviceptr *held) {
  CUdeviceptr p = 0;
  CUresult r = a->tr->drv->cuMemAllocFromPoolAsync(&p, (size_t)bytes, a->pool, on->raw);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemAllocFromPoolAsync (initial reserve)");
  r = a->tr->drv->cuMemFreeAsync(p, on->raw);
  if (r != CUDA_SUCCESS) {
    *held = p;
    return weft__driver_fail(r, "cuMemFreeAsync (initial reserve)");
  }
  return WEFT_OK;
}

weft_status_t weft__async_create(weft__tracker_t *tr, weft_runtime_t *rt, const weft_async_options_t *opts,
                                 weft_resource_t **out) {
  static const char who[] = "weft_async_create";
  weft_status_t st;
  weft_async_options_t o = opts ? *opts : weft_async_options_default();
  if (o.initial_reserve > WEFT__MEM_MAX_BYTES || o.max_size > WEFT__MEM_MAX_BYTES)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: initial_reserve / max_size above 2^48", who);
  if (o.max_size != 0 && o.initial_reserve > o.max_size)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: initial_reserve %llu above max_size %llu", who,
                       (unsigned long long)o.initial_reserve, (unsigned long long)o.max_size);
  const weft__driver_t *drv = tr->drv;
  if (!drv->cuMemPoolCreate || !drv->cuMemPoolDestroy || !drv->cuMemPoolSetAttribute || !drv->cuMemPoolGetAttribute ||
      !drv->cuMemAllocFromPoolAsync || !drv->cuMemFreeAsync || !drv->cuMemPoolTrimTo)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "%s: the driver has no stream-ordered memory pools", who);
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) return st;
  async_t *a = weft__meta_calloc(1, sizeof *a);
  if (a == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  a->tr = tr;
  a->opt = o;
  /* Pool creation and attributes are unsafe under capture: RELAXED until the end. */
  weft__relaxed_t rx = weft__relax(drv);
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = o.handle_type;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = tr->ordinal;
  props.maxSize = (size_t)o.max_size;
  CUresult r = drv->cuMemPoolCreate(&a->pool, &props);
  if (r != CUDA_SUCCESS) {
    st = weft__driver_fail(r, "cuMemPoolCreate");
    goto fail_pool;
  }
  cuuint64_t threshold = o.release_threshold;
  r = drv->cuMemPoolSetAttribute(a->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
  if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemPoolSetAttribute(RELEASE_THRESHOLD)");
  if (st == WEFT_OK)
    st = set_int(drv, a->pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, o.reuse_follow_event_dependencies != 0,
                 "cuMemPoolSetAttribute(REUSE_FOLLOW_EVENT_DEPENDENCIES)");
  if (st == WEFT_OK)
    st = set_int(drv, a->pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, o.reuse_allow_opportunistic != 0,
                 "cuMemPoolSetAttribute(REUSE_ALLOW_OPPORTUNISTIC)");
  if (st == WEFT_OK)
    st = set_int(drv, a->pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                 o.reuse_allow_internal_dependencies != 0, "cuMemPoolSetAttribute(REUSE_ALLOW_INTERNAL_DEPENDENCIES)");
  CUdeviceptr held = 0;
  weft_stream_t *on = NULL;
  if (st == WEFT_OK && o.initial_reserve != 0) {
    on = weft__tracker_hold_live(tr, who);
    st = on != NULL ? reserve(a, o.initial_reserve, on, &held) : WEFT_ERR_CAPTURE;
  }
  if (st != WEFT_OK) goto fail_setup;
  if (on != NULL) weft__tracker_unhold(on);
  weft__unrelax(drv, rx);
  weft__resource_init(&a->base, &weft__async_ops, NULL, rt);
  *out = &a->base;
  return WEFT_OK;
fail_setup:
  if (held != 0) (void)drv->cuMemFreeAsync(held, on->raw);
  if (on != NULL) weft__tracker_unhold(on);
  (void)drv->cuMemPoolDestroy(a->pool);
fail_pool:
  weft__unrelax(drv, rx);
  weft__meta_free(a);
  return st;
}

static async_t *as_async(const weft_resource_t *r) {
  return (r != NULL && r->ops == &weft__async_ops) ? (async_t *)r : NULL;
}

CUmemoryPool weft_async_pool(const weft_resource_t *r) {
  async_t *a = as_async(r);
  return a ? a->pool : NULL;
}

static bool attr_is_int(CUmemPool_attribute attr) {
  return attr == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES || attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
         attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

static bool attr_known(CUmemPool_attribute attr) {
  return attr_is_int(attr) || attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD || attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ||
         attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT ||
         attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}

static weft_status_t attr_prepare(const char *who, weft_resource_t *r, CUmemPool_attribute attr, async_t **out) {
  async_t *a = as_async(r);
  if (a == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: not an async resource", who);
  if (!attr_known(attr)) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: unknown pool attribute %d", who, (int)attr);
  *out = a;
  return weft__tracker_bind(a->tr);
}

/* Pool attributes are housekeeping the driver deems unsafe under capture: RELAXED. */
static weft_status_t attr_call(async_t *a, bool set, CUmemPool_attribute attr, void *v, const char *what) {
  CUresult r;
  WEFT__RELAXED(a->tr->drv, r = set ? a->tr->drv->cuMemPoolSetAttribute(a->pool, attr, v)
                                    : a->tr->drv->cuMemPoolGetAttribute(a->pool, attr, v));
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, what);
}

weft_status_t weft_async_get_attribute(weft_resource_t *r, CUmemPool_attribute attr, uint64_t *value) {
  async_t *a;
  if (value == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_async_get_attribute: value is NULL");
  weft_status_t st = attr_prepare("weft_async_get_attribute", r, attr, &a);
  if (st != WEFT_OK) return st;
  int i = 0;
  cuuint64_t u = 0;
  st = attr_call(a, false, attr, attr_is_int(attr) ? (void *)&i : (void *)&u, "cuMemPoolGetAttribute");
  if (st == WEFT_OK) *value = attr_is_int(attr) ? (uint64_t)i : u;
  return st;
}

weft_status_t weft_async_set_attribute(weft_resource_t *r, CUmemPool_attribute attr, uint64_t value) {
  async_t *a;
  weft_status_t st = attr_prepare("weft_async_set_attribute", r, attr, &a);
  if (st != WEFT_OK) return st;
  if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_async_set_attribute: the *_CURRENT counters are read-only");
  if ((attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) && value != 0)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_async_set_attribute: a *_HIGH counter can only be reset (0)");
  int i = value != 0;
  cuuint64_t u = value;
  return attr_call(a, true, attr, attr_is_int(attr) ? (void *)&i : (void *)&u, "cuMemPoolSetAttribute");
}

weft_status_t weft_async_export(weft_resource_t *r, void *handle) {
  async_t *a = as_async(r);
  if (a == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_async_export: not an async resource");
  if (handle == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_async_export: handle is NULL");
  if (a->opt.handle_type == CU_MEM_HANDLE_TYPE_NONE)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_async_export: the pool was created without a shareable handle type "
                                               "(weft_async_options_t.handle_type)");
  if (a->tr->drv->cuMemPoolExportToShareableHandle == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_async_export: the driver has no cuMemPoolExportToShareableHandle");
  weft_status_t st = weft__tracker_bind(a->tr);
  if (st != WEFT_OK) return st;
  /* Unsafe under anyone's capture (CUDA_SEMANTICS.md): RELAXED, as it belongs to no stream. */
  CUresult cr;
  WEFT__RELAXED(a->tr->drv, cr = a->tr->drv->cuMemPoolExportToShareableHandle(handle, a->pool, a->opt.handle_type, 0));
  return cr == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(cr, "cuMemPoolExportToShareableHandle");
}
