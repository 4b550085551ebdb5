/* The explicit graph builder: nodes with declared accesses, edges from the tracker's conflict
 * rule (streams/tracker.h, weft__rule_*).
 *
 * Each node depends on the maximal conflicting earlier nodes: per block, the last writer (for
 * any access) and, for a write, the readers since. A predecessor already reachable from another
 * predecessor is dropped (ancestor bitsets), so no edge is redundant. When a node must follow
 * two or more readers of a block, it follows one empty join node placed after them instead;
 * join nodes are kept by reader set and shared by every later node that must follow the same
 * readers (of any block), so k readers of m blocks and m writers cost k + m edges, not k * m. */
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "lib/core/container.h"
#include "lib/core/error.h"
#include "lib/core/intern.h"
#include "lib/core/meta.h"

typedef struct bstate {
  struct weft__block *rec;
  uint64_t gen;         /* the generation of the block this state is about (records are reused) */
  int last_write;       /* node index, -1: none */
  int *readers;         /* node indices since the last write */
  size_t n_readers, cap_readers;
  int join;             /* join node over the current readers, -1: none yet */
  unsigned kind;        /* union of kinds (summary) */
  bool internal;        /* allocated in this builder */
  bool freed;
} bstate_t;

typedef struct join {
  int *set;   /* sorted node indices */
  size_t n;
  int node;
} join_t;

struct weft_builder {
  weft_resource_t res;  /* first: the resource of blocks allocated here (weft_builder_free frees them) */
  weft_runtime_t *rt;
  join_t *joins;
  size_t n_joins, cap_joins;
  CUgraph g;
  CUgraphNode *nodes;
  uint64_t **anc;       /* anc[i]: bitset of i's ancestors (words of earlier nodes) */
  size_t n_nodes, cap_nodes;
  bstate_t *blocks;
  size_t n_blocks, cap_blocks;
  weft__map_t index;    /* block record -> blocks index + 1 of its newest block's state */
  pthread_mutex_t lock; /* one call at a time adds to the builder (and to its CUgraph) */
};

/* Blocks allocated in a builder belong to it until it finishes: weft_free refuses them. */
static const weft_resource_ops_t builder_ops = {.name = "graph builder (free with weft_builder_free)"};

static weft_status_t oom(const char *fn) { return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", fn); }

weft_status_t weft_builder_create(weft_runtime_t *rt, weft_builder_t **out) {
  if (weft__runtime_check(rt, "weft_builder_create") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_builder_create: out is NULL");
  weft_builder_t *b = weft__meta_calloc(1, sizeof *b);
  if (b == NULL) return oom("weft_builder_create");
  weft_status_t ls = weft__mem_lock_init(&b->lock, "weft_builder_create");
  if (ls != WEFT_OK) {
    weft__meta_free(b);
    return ls;
  }
  weft__resource_init(&b->res, &builder_ops, NULL, rt);
  b->rt = rt;
  weft_status_t st = weft__tracker_bind(&rt->tracker);
  CUresult r = st == WEFT_OK ? rt->drv->cuGraphCreate(&b->g, 0) : CUDA_SUCCESS;
  if (st == WEFT_OK && r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuGraphCreate");
  if (st == WEFT_OK && !weft__handle_add(b, WEFT__HANDLE_BUILDER)) {
    rt->drv->cuGraphDestroy(b->g); /* no nodes yet: not a graph call */
    st = oom("weft_builder_create");
  }
  if (st != WEFT_OK) {
    pthread_mutex_destroy(&b->lock);
    weft__meta_free(b);
    return st;
  }
  weft__runtime_depend(rt, +1);
  *out = b;
  return WEFT_OK;
}

/* The state of block (rec, gen), made on its first use here. A record seen before under another
 * generation was another block, freed since and its record handed out again: that block's state
 * stays (the summary names it, so a launch of the graph is refused as stale) and this block gets
 * a state of its own. */
static bstate_t *state_of(weft_builder_t *b, struct weft__block *rec, uint64_t gen, bool internal) {
  uint64_t *at = weft__map_find(&b->index, (uint64_t)(uintptr_t)rec);
  if (at != NULL && b->blocks[*at - 1].gen == gen) return &b->blocks[*at - 1];
  if (at == NULL && !weft__map_reserve(&b->index, 1)) return NULL;
  if (b->n_blocks == b->cap_blocks) {
    size_t cap = b->cap_blocks ? b->cap_blocks * 2 : 16;
    bstate_t *nb = weft__meta_realloc(b->blocks, cap * sizeof *nb);
    if (nb == NULL) return NULL;
    b->blocks = nb;
    b->cap_blocks = cap;
  }
  bstate_t *s = &b->blocks[b->n_blocks++];
  memset(s, 0, sizeof *s);
  s->rec = rec;
  s->gen = gen;
  s->last_write = -1;
  s->join = -1;
  s->internal = internal;
  if (at != NULL) *at = b->n_blocks;
  else *weft__map_insert(&b->index, (uint64_t)(uintptr_t)rec, NULL) = b->n_blocks;
  return s;
}

static bool is_ancestor(const weft_builder_t *b, int a, int of) {
  return a < of && (b->anc[of][a / 64] >> (a % 64) & 1);
}

/* Adds a node whose predecessors are `pred` (any order, duplicates allowed), after dropping
 * the redundant ones; `add` creates the driver node with the kept dependencies. */
typedef CUresult (*add_fn)(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg);

static weft_status_t add_node(weft_builder_t *b, int *pred, size_t np, add_fn add, void *arg, int *index) {
  /* Deduplicate, then keep only predecessors no other one reaches. */
  size_t k = 0;
  for (size_t i = 0; i < np; i++) {
    bool dup = false;
    for (size_t j = 0; j < k && !dup; j++) dup = pred[j] == pred[i];
    if (!dup) pred[k++] = pred[i];
  }
  size_t kept = 0;
  for (size_t i = 0; i < k; i++) {
    bool redundant = false;
    for (size_t j = 0; j < k && !redundant; j++) redundant = j != i && is_ancestor(b, pred[i], pred[j]);
    if (!redundant) pred[kept++] = pred[i];
  }
  if (b->n_nodes == b->cap_nodes) {
    size_t cap = b->cap_nodes ? b->cap_nodes * 2 : 64;
    CUgraphNode *nn = weft__meta_realloc(b->nodes, cap * sizeof *nn);
    if (nn == NULL) return oom("weft_builder");
    b->nodes = nn;
    uint64_t **na = weft__meta_realloc(b->anc, cap * sizeof *na);
    if (na == NULL) return oom("weft_builder");
    b->anc = na;
    b->cap_nodes = cap;
  }
  size_t me = b->n_nodes, words = me / 64 + 1;
  uint64_t *anc = weft__meta_calloc(words, sizeof *anc);
  CUgraphNode *deps = weft__meta_alloc((kept + 1) * sizeof *deps);
  if (anc == NULL || deps == NULL) {
    weft__meta_free(anc);
    weft__meta_free(deps);
    return oom("weft_builder");
  }
  for (size_t i = 0; i < kept; i++) {
    int p = pred[i];
    deps[i] = b->nodes[p];
    for (size_t w = 0; w <= (size_t)p / 64; w++) anc[w] |= b->anc[p][w];
    anc[p / 64] |= 1ull << (p % 64);
  }
  CUgraphNode node = NULL;
  CUresult r = add(b, &node, deps, kept, arg);
  weft__meta_free(deps);
  if (r != CUDA_SUCCESS) {
    weft__meta_free(anc);
    return weft__driver_fail(r, "cuGraphAdd*Node");
  }
  b->nodes[me] = node;
  b->anc[me] = anc;
  b->n_nodes++;
  *index = (int)me;
  return WEFT_OK;
}

static CUresult add_empty(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg) {
  (void)arg;
  return b->rt->drv->cuGraphAddEmptyNode(node, b->g, deps, n);
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* The join node after exactly the nodes `readers` (n >= 2), made on first need. */
static weft_status_t join_for(weft_builder_t *b, const int *readers, size_t n, int *node) {
  int *set = weft__meta_alloc(n * sizeof *set);
  if (set == NULL) return oom("weft_builder");
  memcpy(set, readers, n * sizeof *set);
  qsort(set, n, sizeof *set, cmp_int);
  for (size_t i = 0; i < b->n_joins; i++)
    if (b->joins[i].n == n && memcmp(b->joins[i].set, set, n * sizeof *set) == 0) {
      weft__meta_free(set);
      *node = b->joins[i].node;
      return WEFT_OK;
    }
  if (b->n_joins == b->cap_joins) {
    size_t cap = b->cap_joins ? b->cap_joins * 2 : 8;
    join_t *j = weft__meta_realloc(b->joins, cap * sizeof *j);
    if (j == NULL) {
      weft__meta_free(set);
      return oom("weft_builder");
    }
    b->joins = j;
    b->cap_joins = cap;
  }
  int *pred = weft__meta_alloc(n * sizeof *pred);
  if (pred == NULL) {
    weft__meta_free(set);
    return oom("weft_builder");
  }
  memcpy(pred, set, n * sizeof *pred);
  weft_status_t st = add_node(b, pred, n, add_empty, NULL, node);
  weft__meta_free(pred);
  if (st != WEFT_OK) {
    weft__meta_free(set);
    return st;
  }
  b->joins[b->n_joins++] = (join_t){set, n, *node};
  return WEFT_OK;
}

/* The predecessors a new access of `kind` to s needs (appended to pred). */
static weft_status_t needs_of(weft_builder_t *b, bstate_t *s, unsigned kind, int *pred, size_t *np) {
  if (s->last_write >= 0) pred[(*np)++] = s->last_write;
  if (!weft__rule_follows_reads(kind) || s->n_readers == 0) return WEFT_OK;
  if (s->n_readers == 1) {
    pred[(*np)++] = s->readers[0];
    return WEFT_OK;
  }
  if (s->join < 0) {
    weft_status_t st = join_for(b, s->readers, s->n_readers, &s->join);
    if (st != WEFT_OK) return st;
  }
  pred[(*np)++] = s->join;
  return WEFT_OK;
}

static void record_access(bstate_t *s, unsigned kind, int node) {
  s->kind |= kind;
  if (weft__rule_starts_history(kind)) {
    s->last_write = node;
    s->n_readers = 0;
    s->join = -1;
    return;
  }
  for (size_t i = 0; i < s->n_readers; i++)
    if (s->readers[i] == node) return;
  if (s->n_readers == s->cap_readers) {
    size_t cap = s->cap_readers ? s->cap_readers * 2 : 4;
    int *r = weft__meta_realloc(s->readers, cap * sizeof *r);
    if (r == NULL) return; /* reserved below: see ensure_reader_room */
    s->readers = r;
    s->cap_readers = cap;
  }
  s->readers[s->n_readers++] = node;
  s->join = -1;
}

static bool ensure_reader_room(bstate_t *s) {
  if (s->n_readers < s->cap_readers) return true;
  size_t cap = s->cap_readers ? s->cap_readers * 2 : 4;
  int *r = weft__meta_realloc(s->readers, cap * sizeof *r);
  if (r == NULL) return false;
  s->readers = r;
  s->cap_readers = cap;
  return true;
}

/* Resolves accesses, computes predecessors, adds the node, records the accesses. Inside b. */
static weft_status_t tracked_inside(weft_builder_t *b, const weft_access_t *acc, size_t n, add_fn add, void *arg,
                                    CUgraphNode *out, const char *fn) {
  if (n > 0 && acc == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: accesses is NULL", fn);
  bstate_t **st = weft__meta_alloc((n + 1) * sizeof *st);
  size_t *at = weft__meta_alloc((n + 1) * sizeof *at);
  int *pred = weft__meta_alloc((2 * n + 1) * sizeof *pred);
  weft_status_t s = st && at && pred ? WEFT_OK : oom(fn);
  /* Each access's state by its index in b->blocks first: a later access's new state may move the
   * table (state_of grows it), so pointers are taken only once every state is made. */
  for (size_t i = 0; i < n && s == WEFT_OK; i++) {
    struct weft__block *rec;
    bstate_t *bs;
    if (acc[i].kind != WEFT_READ && acc[i].kind != WEFT_WRITE && acc[i].kind != WEFT_READ_WRITE)
      s = weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: accesses[%zu] has a bad kind", fn, i);
    else if ((s = weft__block_check(acc[i].block, fn, &rec)) == WEFT_OK) {
      if (rec->rt != b->rt) s = weft__error(WEFT_ERR_WRONG_DEVICE, "%s: accesses[%zu] is of another runtime", fn, i);
      else if ((bs = state_of(b, rec, acc[i].block.gen, false)) == NULL || !ensure_reader_room(bs)) s = oom(fn);
      else if (bs->freed) s = weft__error(WEFT_ERR_STALE_HANDLE, "%s: block '%s' was freed in this builder", fn, rec->tag);
      else at[i] = (size_t)(bs - b->blocks);
    }
  }
  for (size_t i = 0; i < n && s == WEFT_OK; i++) st[i] = &b->blocks[at[i]];
  size_t np = 0;
  for (size_t i = 0; i < n && s == WEFT_OK; i++) s = needs_of(b, st[i], (unsigned)acc[i].kind, pred, &np);
  int node = -1;
  if (s == WEFT_OK) s = add_node(b, pred, np, add, arg, &node);
  if (s == WEFT_OK) {
    for (size_t i = 0; i < n; i++) record_access(st[i], (unsigned)acc[i].kind, node);
    if (out != NULL) *out = b->nodes[node];
  }
  weft__meta_free(st);
  weft__meta_free(at);
  weft__meta_free(pred);
  return s;
}

/* The calls that add to b run inside it (weft__graph_enter): a concurrent weft_builder_destroy or
 * weft_builder_finish waits until they are done. */
static weft_status_t tracked_node(weft_builder_t *b, const weft_access_t *acc, size_t n, add_fn add, void *arg,
                                  CUgraphNode *out, const char *fn) {
  weft_status_t st = weft__graph_enter(b, WEFT__HANDLE_BUILDER, fn);
  if (st != WEFT_OK) return st;
  pthread_mutex_lock(&b->lock);
  st = tracked_inside(b, acc, n, add, arg, out, fn);
  pthread_mutex_unlock(&b->lock);
  weft__handle_leave();
  return st;
}

typedef struct kernel_arg {
  const weft_launch_t *l;
} kernel_arg_t;

static unsigned dim(unsigned d) { return d ? d : 1; }

static CUresult add_kernel(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg) {
  const weft_launch_t *l = ((kernel_arg_t *)arg)->l;
  CUDA_KERNEL_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.func = l->func;
  p.gridDimX = dim(l->grid[0]), p.gridDimY = dim(l->grid[1]), p.gridDimZ = dim(l->grid[2]);
  p.blockDimX = dim(l->block[0]), p.blockDimY = dim(l->block[1]), p.blockDimZ = dim(l->block[2]);
  p.sharedMemBytes = l->shared_bytes;
  p.kernelParams = l->params;
  return b->rt->drv->cuGraphAddKernelNode(node, b->g, deps, n, &p);
}

weft_status_t weft_builder_kernel(weft_builder_t *b, const weft_launch_t *l, const weft_access_t *acc, size_t n,
                                  CUgraphNode *node) {
  if (l == NULL || l->func == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_builder_kernel: no function");
  kernel_arg_t a = {l};
  return tracked_node(b, acc, n, add_kernel, &a, node, "weft_builder_kernel");
}

typedef struct copy_arg {
  CUdeviceptr dst, src;
  size_t bytes;
  unsigned value;
  CUhostFn fn;
  void *user;
} copy_arg_t;

static CUresult add_copy(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg) {
  const copy_arg_t *a = arg;
  CUDA_MEMCPY3D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = a->src;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = a->dst;
  c.WidthInBytes = a->bytes;
  c.Height = 1;
  c.Depth = 1;
  return b->rt->drv->cuGraphAddMemcpyNode(node, b->g, deps, n, &c, b->rt->tracker.ctx);
}

static weft_status_t range(weft_block_t blk, size_t off, size_t bytes, size_t align, const char *fn, CUdeviceptr *p) {
  struct weft__block *rec;
  weft_status_t st = weft__block_check(blk, fn, &rec);
  if (st != WEFT_OK) return st;
  if (bytes == 0 || off > rec->bytes || bytes > rec->bytes - off || off % align || bytes % align)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: bad range [%zu, +%zu) of a %zu-byte block", fn, off, bytes, rec->bytes);
  *p = rec->ptr + off;
  return WEFT_OK;
}

weft_status_t weft_builder_copy(weft_builder_t *b, weft_block_t dst, size_t dst_offset, weft_block_t src, size_t src_offset,
                                size_t bytes, CUgraphNode *node) {
  copy_arg_t a = {.bytes = bytes};
  weft_status_t st = range(dst, dst_offset, bytes, 1, "weft_builder_copy", &a.dst);
  if (st == WEFT_OK) st = range(src, src_offset, bytes, 1, "weft_builder_copy", &a.src);
  if (st != WEFT_OK) return st;
  weft_access_t acc[2] = {{dst, dst.rec == src.rec ? WEFT_READ_WRITE : WEFT_WRITE}, {src, WEFT_READ}};
  return tracked_node(b, acc, dst.rec == src.rec ? 1 : 2, add_copy, &a, node, "weft_builder_copy");
}

static CUresult add_memset(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg) {
  const copy_arg_t *a = arg;
  CUDA_MEMSET_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.dst = a->dst;
  p.value = a->value;
  p.elementSize = 4;
  p.width = a->bytes / 4;
  p.height = 1;
  return b->rt->drv->cuGraphAddMemsetNode(node, b->g, deps, n, &p, b->rt->tracker.ctx);
}

weft_status_t weft_builder_memset32(weft_builder_t *b, weft_block_t dst, size_t offset, unsigned value, size_t bytes,
                                    CUgraphNode *node) {
  copy_arg_t a = {.bytes = bytes, .value = value};
  weft_status_t st = range(dst, offset, bytes, 4, "weft_builder_memset32", &a.dst);
  if (st != WEFT_OK) return st;
  weft_access_t acc = {dst, WEFT_WRITE};
  return tracked_node(b, &acc, 1, add_memset, &a, node, "weft_builder_memset32");
}

static CUresult add_host(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg) {
  const copy_arg_t *a = arg;
  CUDA_HOST_NODE_PARAMS p = {a->fn, a->user};
  return b->rt->drv->cuGraphAddHostNode(node, b->g, deps, n, &p);
}

weft_status_t weft_builder_host(weft_builder_t *b, CUhostFn fn, void *user, const weft_access_t *acc, size_t n,
                                CUgraphNode *node) {
  if (fn == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_builder_host: fn is NULL");
  copy_arg_t a = {.fn = fn, .user = user};
  return tracked_node(b, acc, n, add_host, &a, node, "weft_builder_host");
}

weft_status_t weft_builder_empty(weft_builder_t *b, const weft_access_t *acc, size_t n, CUgraphNode *node) {
  return tracked_node(b, acc, n, add_empty, NULL, node, "weft_builder_empty");
}

typedef struct alloc_arg {
  size_t bytes;
  CUdeviceptr ptr;
} alloc_arg_t;

static CUresult add_alloc(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg) {
  alloc_arg_t *a = arg;
  CUDA_MEM_ALLOC_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.poolProps.location.id = b->rt->ordinal;
  p.bytesize = a->bytes;
  CUresult r = b->rt->drv->cuGraphAddMemAllocNode(node, b->g, deps, n, &p);
  a->ptr = p.dptr;
  return r;
}

static weft_status_t alloc_inside(weft_builder_t *b, size_t bytes, const char *tag, weft_block_t *out) {
  if (out == NULL || bytes == 0)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_builder_alloc: NULL out or zero size");
  if (b->rt->drv->cuGraphAddMemAllocNode == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_builder_alloc: the driver has no graph memory nodes");
  const char *itag = weft__intern(tag);
  struct weft__block *rec = itag ? weft__block_make(b->rt, bytes, itag, &b->res) : NULL;
  if (rec == NULL) return oom("weft_builder_alloc");
  alloc_arg_t a = {bytes, 0};
  int node;
  int none[1];
  weft_status_t st = add_node(b, none, 0, add_alloc, &a, &node);
  /* The generation weft__block_publish gives the new block (the record may have served others). */
  uint64_t gen = weft__block_gen(rec) + 1;
  bstate_t *s = st == WEFT_OK ? state_of(b, rec, gen, true) : NULL;
  if (st == WEFT_OK && s == NULL) st = oom("weft_builder_alloc");
  if (st != WEFT_OK) {
    weft__block_retire(rec);
    return st;
  }
  rec->ptr = a.ptr;
  rec->acc.graph = b; /* its memory exists only in the builder's graph */
  s->last_write = node; /* every use follows the allocation node */
  *out = weft__block_publish(rec);
  WEFT_ASSERT_INTERNAL(out->gen == gen);
  return WEFT_OK;
}

weft_status_t weft_builder_alloc(weft_builder_t *b, size_t bytes, const char *tag, weft_block_t *out) {
  weft_status_t st = weft__graph_enter(b, WEFT__HANDLE_BUILDER, "weft_builder_alloc");
  if (st != WEFT_OK) return st;
  pthread_mutex_lock(&b->lock);
  st = alloc_inside(b, bytes, tag, out);
  pthread_mutex_unlock(&b->lock);
  weft__handle_leave();
  return st;
}

typedef struct free_arg {
  CUdeviceptr ptr;
} free_arg_t;

static CUresult add_free(weft_builder_t *b, CUgraphNode *node, const CUgraphNode *deps, size_t n, void *arg) {
  return b->rt->drv->cuGraphAddMemFreeNode(node, b->g, deps, n, ((free_arg_t *)arg)->ptr);
}

static weft_status_t free_inside(weft_builder_t *b, weft_block_t blk) {
  struct weft__block *rec;
  weft_status_t st = weft__block_check(blk, "weft_builder_free", &rec);
  if (st != WEFT_OK) return st;
  if (rec->resource != &b->res)
    return weft__error(WEFT_ERR_CAPTURE, "weft_builder_free: block '%s' was not allocated in this builder", rec->tag);
  free_arg_t a = {rec->ptr};
  weft_access_t acc = {blk, WEFT_WRITE};
  if ((st = tracked_inside(b, &acc, 1, add_free, &a, NULL, "weft_builder_free")) != WEFT_OK) return st;
  bstate_t *s = state_of(b, rec, blk.gen, true); /* found: tracked_inside made it */
  s->freed = true;
  s->rec = NULL;
  weft__block_forget(rec, blk.gen);
  return WEFT_OK;
}

weft_status_t weft_builder_free(weft_builder_t *b, weft_block_t blk) {
  weft_status_t st = weft__graph_enter(b, WEFT__HANDLE_BUILDER, "weft_builder_free");
  if (st != WEFT_OK) return st;
  pthread_mutex_lock(&b->lock);
  st = free_inside(b, blk);
  pthread_mutex_unlock(&b->lock);
  weft__handle_leave();
  return st;
}

static void free_states(weft_builder_t *b, bool forget_internal) {
  for (size_t i = 0; i < b->n_blocks; i++) {
    if (forget_internal && b->blocks[i].internal && b->blocks[i].rec != NULL)
      weft__block_forget(b->blocks[i].rec, b->blocks[i].gen);
    weft__meta_free(b->blocks[i].readers);
  }
  for (size_t i = 0; i < b->n_nodes; i++) weft__meta_free(b->anc[i]);
  for (size_t i = 0; i < b->n_joins; i++) weft__meta_free(b->joins[i].set);
  weft__meta_free(b->joins);
  weft__meta_free(b->anc);
  weft__meta_free(b->nodes);
  weft__meta_free(b->blocks);
  weft__map_free(&b->index);
}

weft_status_t weft_builder_finish(weft_builder_t *b, weft_graph_t **out) {
  weft_status_t hs = weft__graph_handle(b, WEFT__HANDLE_BUILDER, "weft_builder_finish");
  if (hs != WEFT_OK) return hs;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_builder_finish: out is NULL");
  if ((hs = weft__graph_unlist(b, WEFT__HANDLE_BUILDER, "weft_builder_finish")) != WEFT_OK) return hs;
  weft__runtime_depend(b->rt, -1);
  weft__gsummary_t *summary = weft__meta_calloc(b->n_blocks + 1, sizeof *summary);
  weft__goutput_t *outputs = weft__meta_calloc(b->n_blocks + 1, sizeof *outputs);
  size_t ns = 0, no = 0;
  weft_status_t st = summary && outputs ? WEFT_OK : oom("weft_builder_finish");
  for (size_t i = 0; i < b->n_blocks && st == WEFT_OK; i++) {
    bstate_t *s = &b->blocks[i];
    if (s->internal) {
      if (s->rec != NULL) outputs[no++] = (weft__goutput_t){s->rec->ptr, s->rec->bytes, s->rec->tag};
    } else {
      summary[ns++] = (weft__gsummary_t){{s->rec, s->gen}, s->kind};
    }
  }
  weft_graph_t *g = NULL;
  if (st == WEFT_OK)
    st = weft__graph_make(b->rt, b->g, WEFT_GRAPH_MEMORY_NODES, NULL, summary, ns, outputs, no, &g);
  if (st != WEFT_OK) {
    weft__meta_free(summary);
    weft__meta_free(outputs);
    /* A graph with memory nodes: its destroy is a graph call (lib/core/gate.h). */
    WEFT__GRAPH_MEMORY(b->rt->tracker.ctx, WEFT__RELAXED(b->rt->drv, b->rt->drv->cuGraphDestroy(b->g)));
  }
  free_states(b, true);
  pthread_mutex_destroy(&b->lock); /* removed: no call is inside b */
  weft__meta_free(b);
  if (st == WEFT_OK) *out = g;
  return st;
}

weft_status_t weft_builder_destroy(weft_builder_t *b) {
  weft_status_t st = weft__graph_handle(b, WEFT__HANDLE_BUILDER, "weft_builder_destroy");
  if (st != WEFT_OK) return st;
  if ((st = weft__graph_unlist(b, WEFT__HANDLE_BUILDER, "weft_builder_destroy")) != WEFT_OK) return st;
  weft__runtime_depend(b->rt, -1);
  WEFT__GRAPH_MEMORY(b->rt->tracker.ctx, WEFT__RELAXED(b->rt->drv, b->rt->drv->cuGraphDestroy(b->g))); /* a graph call (gate.h) */
  free_states(b, true);
  pthread_mutex_destroy(&b->lock); /* removed: no call is inside b */
  weft__meta_free(b);
  return WEFT_OK;
}
