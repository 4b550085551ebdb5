/* Allocation: host time of one alloc+free pair, hot, through every path weft offers, against the
 * driver's own stream-ordered pool (cuMemAllocFromPoolAsync + cuMemFreeAsync on a cuMemPool that
 * keeps everything: release threshold UINT64_MAX) and against cuMemAlloc + cuMemFree.
 *
 * Two loops per path: the same 1 MiB block allocated and freed on one stream, and a mixed loop
 * that keeps 8 blocks of 16 sizes (256 B .. 4 MiB) live and replaces the oldest each step, so the
 * pool has to split, coalesce and pick size classes. No kernels run: this is the host's cost. */
#include <string.h>

#include "bench/bench.h"

#define WINDOW 8
#define SAME_BYTES (1u << 20)

static const size_t mixed_sizes[16] = {256,   1000,   4096,    20000,   65536, 300000, 1u << 20, 3u << 20,
                                       512,   8192,   131072,  2u << 20, 777,  50000,  4u << 20, 16384};

typedef union slot {
  weft_block_t block;
  CUdeviceptr ptr;
} slot_t;

/* One allocation path. The timed loops call through these pointers for every path alike, so the
 * indirection costs the baselines what it costs weft. */
typedef struct path {
  const char *name;
  const struct path *baseline; /* the raw path it is compared with; NULL for a raw path */
  void (*alloc)(void *ctx, size_t bytes, slot_t *out);
  void (*free)(void *ctx, size_t bytes, slot_t *slot);
} path_t;

typedef struct ctx {
  const bench_t *b;
  weft_runtime_t *rt;
  weft_stream_t *s;
  weft_resource_t *res;
  CUstream raw;
  CUmemoryPool pool;
} ctx_t;

static void weft_alloc_path(void *c, size_t bytes, slot_t *out) {
  ctx_t *x = c;
  BENCH_WEFT(weft_alloc(x->rt, bytes, x->s, "bench", &out->block));
}
static void weft_free_path(void *c, size_t bytes, slot_t *slot) {
  (void)bytes;
  BENCH_WEFT(weft_free(slot->block, ((ctx_t *)c)->s));
}
static void resource_alloc(void *c, size_t bytes, slot_t *out) {
  ctx_t *x = c;
  BENCH_WEFT(weft_resource_allocate(x->res, bytes, x->s, "", &out->ptr));
}
static void resource_free(void *c, size_t bytes, slot_t *slot) {
  ctx_t *x = c;
  BENCH_WEFT(weft_resource_deallocate(x->res, slot->ptr, bytes, x->s, ""));
}
static void raw_pool_alloc(void *c, size_t bytes, slot_t *out) {
  ctx_t *x = c;
  BENCH_CU(x->b->drv->cuMemAllocFromPoolAsync(&out->ptr, bytes, x->pool, x->raw));
}
static void raw_pool_free(void *c, size_t bytes, slot_t *slot) {
  (void)bytes;
  ctx_t *x = c;
  BENCH_CU(x->b->drv->cuMemFreeAsync(slot->ptr, x->raw));
}
static void raw_direct_alloc(void *c, size_t bytes, slot_t *out) {
  BENCH_CU(((ctx_t *)c)->b->drv->cuMemAlloc(&out->ptr, bytes));
}
static void raw_direct_free(void *c, size_t bytes, slot_t *slot) {
  (void)bytes;
  BENCH_CU(((ctx_t *)c)->b->drv->cuMemFree(slot->ptr));
}

static const path_t raw_pool_path = {"raw cuMemAllocFromPoolAsync + cuMemFreeAsync", NULL, raw_pool_alloc,
                                     raw_pool_free};
static const path_t raw_direct_path = {"raw cuMemAlloc + cuMemFree", NULL, raw_direct_alloc, raw_direct_free};
static const path_t weft_paths[] = {
    {"weft_alloc + weft_free, memory = POOL", &raw_pool_path, weft_alloc_path, weft_free_path},
    {"`pool` resource alone (weft_resource_allocate + deallocate)", &raw_pool_path, resource_alloc, resource_free},
    {"weft_alloc + weft_free, memory = ASYNC", &raw_pool_path, weft_alloc_path, weft_free_path},
    {"weft_alloc + weft_free, memory = DIRECT", &raw_direct_path, weft_alloc_path, weft_free_path},
};
/* The runtime each weft path runs on (the `pool` resource is the top of a POOL runtime). */
static const weft_memory_kind_t weft_memory[] = {WEFT_MEMORY_POOL, WEFT_MEMORY_POOL, WEFT_MEMORY_ASYNC,
                                                 WEFT_MEMORY_DIRECT};

/* One series: a path's loop (same size or mixed) on its context and stream. */
typedef struct loop {
  const path_t *p;
  ctx_t *c;
  CUstream stream;
  int mixed;
  unsigned n;
} loop_t;

/* One sample: host ns per pair over n pairs. The stream is synchronised afterwards, untimed. */
static double ns_per_pair(void *arg) {
  const loop_t *l = arg;
  const path_t *p = l->p;
  ctx_t *c = l->c;
  unsigned n = l->n;
  slot_t live[WINDOW];
  uint64_t t0 = bench_now_ns();
  if (!l->mixed) {
    for (unsigned i = 0; i < n; i++) {
      slot_t s;
      p->alloc(c, SAME_BYTES, &s);
      p->free(c, SAME_BYTES, &s);
    }
  } else {
    for (unsigned i = 0; i < n; i++) {
      unsigned w = i % WINDOW;
      if (i >= WINDOW) p->free(c, mixed_sizes[(i - WINDOW) % 16], &live[w]);
      p->alloc(c, mixed_sizes[i % 16], &live[w]);
    }
  }
  uint64_t t1 = bench_now_ns();
  if (l->mixed)
    for (unsigned i = n > WINDOW ? n - WINDOW : 0; i < n; i++) p->free(c, mixed_sizes[i % 16], &live[i % WINDOW]);
  BENCH_CU(c->b->drv->cuStreamSynchronize(l->stream));
  return (double)(t1 - t0) / n;
}

/* A raw path's context: its own stream, and for the pool path a pool made as weft's async
 * resource makes its pool (lib/mem/async.c), keeping every byte cached. */
static void raw_open(const bench_t *b, const path_t *p, ctx_t *c) {
  const weft__driver_t *d = b->drv;
  *c = (ctx_t){.b = b};
  BENCH_CU(d->cuStreamCreateWithPriority(&c->raw, CU_STREAM_NON_BLOCKING, 0));
  if (p == &raw_pool_path) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    BENCH_CU(d->cuMemPoolCreate(&c->pool, &props));
    cuuint64_t keep = UINT64_MAX;
    BENCH_CU(d->cuMemPoolSetAttribute(c->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  }
}

static void raw_close(ctx_t *c) {
  const weft__driver_t *d = c->b->drv;
  BENCH_CU(d->cuStreamSynchronize(c->raw));
  if (c->pool != NULL) BENCH_CU(d->cuMemPoolDestroy(c->pool));
  BENCH_CU(d->cuStreamDestroy(c->raw));
}

static const char *const memory_name[] = {"POOL", "ASYNC", "DIRECT"};

void bench_alloc(bench_t *b) {
  bench_section(b, "Allocation: alloc + free pair, hot",
                "Host ns per pair (median of the repetitions; each weft path's repetitions interleaved with its "
                "raw baseline's, measured beside it). *same*: 1 MiB allocated and freed on one stream; *mixed*: 8 "
                "live blocks of 16 sizes (256 B to 4 MiB), the oldest replaced each step. Ratios are to the raw row "
                "named in the path's baseline (the driver's pool, or cuMemAlloc for `direct`). Goal (issue 5): "
                "`pool` at most 60 ns.");
  unsigned fast = bench_count(b, 50000, 16), slow = bench_count(b, 300, 16);
  ctx_t raw_pool, raw_direct;
  raw_open(b, &raw_pool_path, &raw_pool);
  raw_open(b, &raw_direct_path, &raw_direct);
  static const char *const cols[] = {"path", "memory", "same size, ns", "vs raw", "mixed sizes, ns", "vs raw"};
  bench_table(cols, 6);
  static const char *const metric[] = {"ns per pair, same 1 MiB", "ns per pair, mixed sizes"};
  double base[2][4] = {{0}}; /* [mixed][path]: the baseline's median beside path i */
  for (int i = 0; i < 4; i++) {
    const path_t *p = &weft_paths[i];
    const char *mem = memory_name[weft_memory[i]];
    weft_options_t o = weft_options_default();
    o.memory = weft_memory[i];
    ctx_t c = {.b = b, .rt = bench_runtime(&o)};
    BENCH_WEFT(weft_stream_get(c.rt, 0, &c.s));
    c.res = weft_runtime_resource(c.rt);
    ctx_t *rc = p->baseline == &raw_pool_path ? &raw_pool : &raw_direct;
    unsigned n = weft_memory[i] == WEFT_MEMORY_DIRECT ? slow : fast;
    double med[2][2];
    for (int mixed = 0; mixed < 2; mixed++) {
      loop_t lw = {p, &c, weft_stream_raw(c.s), mixed, n}, lr = {p->baseline, rc, rc->raw, mixed, n};
      bench_series_t series[2] = {{p->name, p->baseline->name, mem, ns_per_pair, &lw},
                                  {p->baseline->name, NULL, mem, ns_per_pair, &lr}};
      bench_measure(b, "alloc", metric[mixed], "ns", series, 2, med[mixed]);
      base[mixed][i] = med[mixed][1];
    }
    printf("| %s | %s | %.0f | %.2fx | %.0f | %.2fx |\n", p->name, mem, med[0][0], med[0][0] / med[0][1], med[1][0],
           med[1][0] / med[1][1]);
    BENCH_WEFT(weft_runtime_release(c.rt));
  }
  /* The baselines, as measured beside the first path that uses each. */
  printf("| %s | beside POOL | %.0f | baseline | %.0f | baseline |\n", raw_pool_path.name, base[0][0], base[1][0]);
  printf("| %s | beside DIRECT | %.0f | baseline | %.0f | baseline |\n", raw_direct_path.name, base[0][3], base[1][3]);
  raw_close(&raw_pool);
  raw_close(&raw_direct);
  printf("\n%u pairs per sample (%u for the cuMemAlloc paths).\n\n", fast, slow);
}
