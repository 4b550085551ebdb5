/* Uses: the public face of the tracker (weft_use_begin/end, weft_launch), the tracked stream
 * operations, and imports of work weft does not see. Each operation is one tracker use whose
 * enqueue step is a small function run between the waits and the record. */
#include <stddef.h>
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/core/nvtx.h"
#include "lib/core/trace.h"
#include "lib/runtime/runtime.h"

static struct weft__block *resolve_slow(weft_stream_t *s, const weft_access_t *a, size_t i, const char *fn, bool *far,
                                        weft_status_t *st);

/* Resolves acc[from..n) into uses[] while each is the common case: a live block of runtime rt
 * with a valid kind, one inline check (the record's address is never taken, so that the loop
 * keeps it in a register); adds each one's weft__tracker_print_one to *sum. Returns the index of
 * the first access that is not (n when all are), recording nothing. */
static inline size_t resolve_plain(const weft_runtime_t *rt, const weft_access_t *acc, size_t from, size_t n,
                                   weft__use_t *uses, uint64_t *sum) {
  uint64_t add = *sum; /* in a register, not through sum */
  for (size_t i = from; i < n; i++) {
    unsigned kind = (unsigned)acc[i].kind;
    struct weft__block *rec = weft__block_live(acc[i].block, rt);
    if (__builtin_expect(rec == NULL || kind - 1u > 2u, 0)) { /* kind: WEFT_READ, _WRITE or _READ_WRITE */
      *sum = add;
      return i;
    }
    uses[i] = (weft__use_t){&rec->acc, kind, acc[i].block.gen};
    add += weft__tracker_print_one(&rec->acc, kind);
  }
  *sum = add;
  return n;
}

/* Checks every access (kind, handle) and resolves it into uses[i]; s is checked already
 * (weft__stream_check: its runtime is alive). Blocks of other runtimes than s's are refused
 * (WRONG_DEVICE) unless `far` is given, which then says whether there was one. With `print`,
 * *print gets weft__tracker_fingerprint(uses, n), summed in the same pass. The common case is
 * resolve_plain's; resolve_slow takes each other access. */
static weft_status_t resolve(weft_stream_t *s, const weft_access_t *acc, size_t n, weft__use_t *uses, const char *fn,
                             bool *far, uint64_t *print) {
  if (n > 0 && acc == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: accesses is NULL with n = %zu", fn, n);
  const weft_runtime_t *rt = s->runtime;
  uint64_t sum = n;
  for (size_t i = resolve_plain(rt, acc, 0, n, uses, &sum); i < n; i = resolve_plain(rt, acc, i + 1, n, uses, &sum)) {
    weft_status_t st;
    struct weft__block *rec = resolve_slow(s, &acc[i], i, fn, far, &st);
    if (rec == NULL) return st;
    uses[i] = (weft__use_t){&rec->acc, (unsigned)acc[i].kind, acc[i].block.gen};
    sum += weft__tracker_print_one(&rec->acc, (unsigned)acc[i].kind);
  }
  if (print != NULL) *print = sum;
  return WEFT_OK;
}

/* resolve's other cases: an error (NULL, *st says which), or a block of another runtime. */
static __attribute__((noinline)) struct weft__block *resolve_slow(weft_stream_t *s, const weft_access_t *a, size_t i,
                                                                  const char *fn, bool *far, weft_status_t *st) {
  struct weft__block *rec = NULL;
  if (a->kind != WEFT_READ && a->kind != WEFT_WRITE && a->kind != WEFT_READ_WRITE) {
    *st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: accesses[%zu].kind = %d is not a weft_access_kind_t", fn, i,
                      (int)a->kind);
    return NULL;
  }
  if ((*st = weft__block_check(a->block, fn, &rec)) != WEFT_OK) return NULL;
  if (rec->rt != s->runtime && far == NULL) {
    *st = weft__error(WEFT_ERR_WRONG_DEVICE, "%s: accesses[%zu] is a block of another runtime", fn, i);
    return NULL;
  }
  if (rec->rt != s->runtime) *far = true;
  return rec;
}

weft_status_t weft__uses_from_accesses(weft_stream_t *s, const weft_access_t *acc, size_t n, weft__use_t *uses,
                                       const char *fn) {
  return resolve(s, acc, n, uses, fn, NULL, NULL);
}

static weft_runtime_t *rt_of(weft_block_t b) { return ((struct weft__block *)b.rec)->rt; }

/* Checks s and resolves accesses into `small` (room for SMALL) or metadata memory (release with
 * weft__small_free). Blocks of other runtimes are welcome ("blocks of other devices" below);
 * with `peer`, s's device is first given access to their memory. */
#define SMALL 32

/* Checks s and resolves accesses into uses[0..n) (with `print`, their fingerprint too); with
 * `peer`, s's device is first given access to the memory of blocks of other runtimes ("blocks of
 * other devices" below). */
static weft_status_t check_accesses(weft_stream_t *s, const weft_access_t *acc, size_t n, weft__use_t *uses,
                                    const char *fn, bool peer, uint64_t *print) {
  weft_status_t st = weft__stream_check(s, fn);
  if (st != WEFT_OK) return st;
  bool far = false;
  st = resolve(s, acc, n, uses, fn, &far, print);
  for (size_t i = 0; far && peer && i < n && st == WEFT_OK; i++)
    if (rt_of(acc[i].block) != s->runtime) st = weft__runtime_peer_ready(s->runtime, rt_of(acc[i].block), fn);
  return st;
}

static weft_status_t prepare(weft_stream_t *s, const weft_access_t *acc, size_t n, weft__use_t *small,
                             weft__use_t **uses, const char *fn, bool peer, uint64_t *print) {
  *uses = weft__small_alloc(small, SMALL, n, sizeof **uses);
  if (*uses == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory for %zu accesses", fn, n);
  weft_status_t st = check_accesses(s, acc, n, *uses, fn, peer, print);
  /* A capture begun by code outside weft changes which clocks this use belongs to. */
  if (st == WEFT_OK) st = weft__stream_prepare(s);
  if (st != WEFT_OK) weft__small_free(small, *uses);
  return st;
}

/* prepare's common case in few instructions (streams/tracker.c, "the live fast path", says why):
 * a plain stream (weft__stream_plain), at most SMALL accesses, each of a live block of s's
 * runtime with a valid kind, no trace and no NVTX tool. Resolves the accesses into uses[] with
 * their fingerprint, then readies an exposed stream (weft__stream_quiet asks the driver; a
 * capture that code outside weft began on it is met by weft__stream_prepare first), into *st:
 * prepare's checks, in its order. The context is bound only with `bind` (the use's work needs
 * the thread's current context) or where s is a default stream (weft__stream_names_context; and
 * for the legacy stream's question): the tracker binds it itself where the use's waits and
 * record need it (weft__tracker_bind_for). Returns false, nothing done and no error recorded,
 * where prepare must look. */
static inline __attribute__((always_inline)) bool prepare_fast(weft_stream_t *s, const weft_access_t *acc, size_t n,
                                                               bool bind, weft__use_t *uses, uint64_t *print,
                                                               weft_status_t *st) {
  if (s == NULL || n > SMALL || acc == NULL || !weft__stream_plain(s) || weft__trace_on() || weft__nvtx_on())
    return false;
  uint64_t sum = n;
  if (resolve_plain(s->runtime, acc, 0, n, uses, &sum) != n) return false;
  *print = sum;
  /* An exposed stream's capture question binds the context only where it needs it; a capture
   * met is the general prepare's. */
  weft_status_t q = WEFT_OK;
  if (atomic_load_explicit(&s->exposed, memory_order_relaxed) && !weft__stream_quiet(s, &q))
    *st = weft__stream_prepare(s);
  else
    *st = q != WEFT_OK ? q : bind ? weft__tracker_bind(s->tr) : weft__tracker_bind_for(s->tr, s);
  return true;
}

/* The trace's slice of a use of s: its accesses' tags and kinds, from acc[0..n) or, where acc is
 * NULL, from resolved uses[0..n) (each the history of a block record). */
static void trace_accesses(weft_stream_t *s, const char *name, const weft_access_t *acc, const weft__use_t *uses,
                           size_t n, uint64_t t0) {
  static const char *const kinds[] = {"", "R", "W", "RW"};
  char args[1536];
  size_t at = (size_t)snprintf(args, sizeof args, "{\"accesses\": [");
  for (size_t i = 0; i < n && at + 64 < sizeof args; i++) {
    const struct weft__block *rec =
        acc != NULL ? acc[i].block.rec
                    : (const struct weft__block *)(const void *)((const char *)uses[i].state -
                                                                 offsetof(struct weft__block, acc));
    unsigned kind = acc != NULL ? (unsigned)acc[i].kind : uses[i].kind;
    at += (size_t)snprintf(args + at, sizeof args - at, "%s{\"tag\": \"", i ? ", " : "");
    (void)weft__json_escape(args, &at, sizeof args - 40, rec && rec->tag ? rec->tag : "");
    at += (size_t)snprintf(args + at, sizeof args - at, "\", \"kind\": \"%s\"}", kinds[kind & 3]);
  }
  snprintf(args + at, sizeof args - at, "]}");
  weft__trace_slice(s->tr->ordinal, weft__tracker_trace_tid(s), name, t0, weft__trace_now_us() - t0, args);
}

void weft__trace_use(weft_stream_t *s, const char *name, const weft_access_t *acc, size_t n, uint64_t t0) {
  trace_accesses(s, name, acc, NULL, n, t0);
}

/* ---- blocks of other devices ----------------------------------------------------------------
 * A use on s (runtime A) may touch blocks of other runtimes (devices B, ...): "far" blocks. Every
 * runtime's streams are lanes of the process's one live clock domain (streams/tracker.h), so a
 * far block's history is ordered like a near one's: s waits on exactly the events of B's streams
 * it needs (events wait across devices), and B's later work waits on s's event. Kernels and
 * memsets on s need access to B's memory (weft_runtime_enable_peer_access, done here at first
 * need); a peer copy does not. Inside a capture a far block gets a capture-local history like
 * any block (streams/capture.c) and joins the graph's access summary, so each launch of the graph
 * is ordered against B's work as a use across devices. */

/* The split form: open (waits) or close (record) the use of s, checked against each other.
 * split_general takes every use prepare_fast does not (out of line: the common case runs no
 * more code than its own). */
static __attribute__((noinline)) weft_status_t split_general(weft_stream_t *s, const weft_access_t *acc, size_t n,
                                                             bool open) {
  weft__use_t small[SMALL], *uses;
  const char *fn = open ? "weft_use_begin" : "weft_use_end";
  uint64_t print;
  weft_status_t st = prepare(s, acc, n, small, &uses, fn, open, &print);
  if (st != WEFT_OK) return st;
  uint64_t t0 = weft__trace_on() ? weft__trace_now_us() : 0;
  st = open ? weft__tracker_open(s, uses, n, print) : weft__tracker_close(s, uses, n, print);
  if (st == WEFT_OK && weft__trace_on()) weft__trace_use(s, fn, acc, n, t0);
  if (st == WEFT_OK) weft__nvtx_mark(fn);
  weft__small_free(small, uses);
  return st;
}

static weft_status_t split(weft_stream_t *s, const weft_access_t *acc, size_t n, bool open) {
  weft__use_t small[SMALL];
  uint64_t print;
  weft_status_t st;
  if (!prepare_fast(s, acc, n, false, small, &print, &st)) return split_general(s, acc, n, open);
  return st == WEFT_OK ? weft__tracker_bracket(s, small, n, print, open) : st;
}

weft_status_t weft_use_begin(weft_stream_t *s, const weft_access_t *accesses, size_t n) {
  return split(s, accesses, n, true);
}

weft_status_t weft_use_end(weft_stream_t *s, const weft_access_t *accesses, size_t n) {
  return split(s, accesses, n, false);
}

/* use_run's general case: every use prepare_fast does not take (out of line: the common case
 * runs no more code than its own). */
static __attribute__((noinline)) weft_status_t use_run_general(weft_stream_t *s, const weft_access_t *acc, size_t n,
                                                               const char *name, bool peer,
                                                               weft_status_t (*fn)(weft_stream_t *, void *),
                                                               void *arg) {
  weft__use_t small[SMALL], *uses;
  weft_status_t st = prepare(s, acc, n, small, &uses, name, peer, NULL);
  if (st != WEFT_OK) return st;
  uint64_t t0 = weft__trace_on() ? weft__trace_now_us() : 0;
  weft__nvtx_push(name);
  st = weft__tracker_use(s, uses, n, fn, arg);
  weft__nvtx_pop();
  if (st == WEFT_OK && weft__trace_on()) weft__trace_use(s, name, acc, n, t0);
  weft__small_free(small, uses);
  return st;
}

/* A use of s around fn; `peer`: far blocks need s's device to access their memory; `context`: fn
 * needs s's runtime's context current on the thread (not a launch: the stream names it). */
static weft_status_t use_run(weft_stream_t *s, const weft_access_t *acc, size_t n, const char *name, bool peer,
                             bool context, weft_status_t (*fn)(weft_stream_t *, void *), void *arg) {
  weft__use_t small[SMALL];
  uint64_t print;
  weft_status_t st;
  if (prepare_fast(s, acc, n, context, small, &print, &st))
    return st == WEFT_OK ? weft__tracker_use(s, small, n, fn, arg) : st;
  return use_run_general(s, acc, n, name, peer, fn, arg);
}

weft_status_t weft__use_run(weft_stream_t *s, const weft_access_t *acc, size_t n, const char *name,
                           weft_status_t (*fn)(weft_stream_t *, void *), void *arg) {
  return use_run(s, acc, n, name, true, true, fn, arg);
}

/* A joint use where a stream takes part in a capture: every use opens (its waits), fn runs, and
 * every opened use closes, last opened first (after a failure, with no work: conservative). */
static weft_status_t joint_split(weft_stream_t *const *s, weft__use_t *const *uses, const size_t *n, size_t k,
                                 weft_status_t (*fn)(weft_stream_t *, void *), void *arg) {
  weft_status_t st = WEFT_OK;
  size_t opened = 0;
  while (st == WEFT_OK && opened < k) {
    st = weft__stream_prepare(s[opened]);
    if (st == WEFT_OK)
      st = weft__tracker_open(s[opened], uses[opened], n[opened], weft__tracker_fingerprint(uses[opened], n[opened]));
    if (st == WEFT_OK) opened++;
  }
  if (st == WEFT_OK) st = fn(s[0], arg);
  char why[512] = "";
  if (st != WEFT_OK) snprintf(why, sizeof why, "%s", weft_last_error());
  for (size_t j = opened; j-- > 0;) {
    uint64_t print = weft__tracker_fingerprint(uses[j], n[j]);
    weft_status_t closed = weft__stream_prepare(s[j]);
    if (closed == WEFT_OK) closed = weft__tracker_close(s[j], uses[j], n[j], print);
    if (st == WEFT_OK) st = closed;
  }
  return st == WEFT_OK || why[0] == 0 ? st : weft__error(st, "%s", why);
}

weft_status_t weft__use_joint_uses(weft_stream_t *const *s, weft__use_t *const *uses, const size_t *n, size_t k,
                                   const char *name, weft_status_t (*fn)(weft_stream_t *, void *), void *arg) {
  /* Live streams enqueue through one joint tracker use; a capture, the calling thread's
   * per-thread stream (weft__stream_check lets its owner through) or device timestamps (a span
   * per stream) take the split form. */
  bool joint = !weft__trace_device_on() && k <= 64;
  weft_status_t st = WEFT_OK;
  for (size_t i = 0; st == WEFT_OK && i < k; i++) {
    st = weft__stream_check(s[i], name);
    if (st == WEFT_OK) st = weft__stream_sync_capture(s[i]);
    if (st == WEFT_OK && (atomic_load_explicit(&s[i]->capture, memory_order_acquire) != NULL || s[i]->per_thread))
      joint = false;
  }
  if (st != WEFT_OK) return st;
  uint64_t t0 = weft__trace_on() ? weft__trace_now_us() : 0;
  weft__nvtx_push(name);
  st = joint ? weft__tracker_use_joint(s, uses, n, k, fn, arg) : joint_split(s, uses, n, k, fn, arg);
  weft__nvtx_pop();
  for (size_t i = 0; st == WEFT_OK && weft__trace_on() && i < k; i++) trace_accesses(s[i], name, NULL, uses[i], n[i], t0);
  return st;
}

weft_status_t weft__use_joint(weft_stream_t *const *s, const weft_access_t *const *acc, const size_t *n, size_t k,
                              const char *name, weft_status_t (*fn)(weft_stream_t *, void *), void *arg) {
  size_t total = 0;
  for (size_t i = 0; i < k; i++) total += n[i];
  weft__use_t small[SMALL], *all = weft__small_alloc(small, SMALL, total, sizeof *all);
  weft__use_t *small_per[8], **per = weft__small_alloc(small_per, 8, k, sizeof *per);
  weft_status_t st = all != NULL && per != NULL ? WEFT_OK
                                                : weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", name);
  for (size_t i = 0, off = 0; st == WEFT_OK && i < k; off += n[i], i++) {
    per[i] = all + off;
    st = check_accesses(s[i], acc[i], n[i], per[i], name, true, NULL);
  }
  if (st == WEFT_OK) st = weft__use_joint_uses(s, per, n, k, name, fn, arg);
  if (all != NULL) weft__small_free(small, all);
  if (per != NULL) weft__small_free(small_per, per);
  return st;
}

static unsigned dim(unsigned d) { return d == 0 ? 1 : d; }

static weft_status_t do_launch(weft_stream_t *s, void *arg) {
  const weft_launch_t *l = arg;
  WEFT__CU_TRY(s->tr->drv->cuLaunchKernel(l->func, dim(l->grid[0]), dim(l->grid[1]), dim(l->grid[2]), dim(l->block[0]),
                                          dim(l->block[1]), dim(l->block[2]), l->shared_bytes, s->raw, l->params, NULL));
  return WEFT_OK;
}

/* The launch needs no current context on a stream that names its own (tests/conformance). Its
 * common case, a plain use that leaves its tick deferred (lazy records), calls the driver from
 * this frame between weft__tracker_enter and _exit, so that nothing of weft's runs after the
 * driver's call but the exit (bench/data/h200-driver-share-115f37d: what weft runs around a
 * launch costs more than the same run before it). */
weft_status_t weft_launch(weft_stream_t *s, const weft_launch_t *launch, const weft_access_t *accesses, size_t n) {
  if (launch == NULL || launch->func == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_launch: launch or its function is NULL");
  weft__use_t small[SMALL];
  uint64_t print;
  weft_status_t st;
  if (!prepare_fast(s, accesses, n, false, small, &print, &st))
    return use_run_general(s, accesses, n, "weft_launch", true, do_launch, (void *)launch);
  if (st != WEFT_OK) return st;
  weft__use_ticket_t t;
  if (weft__tracker_enter(s, small, n, &t, &st)) /* (it refuses more than WEFT__LIVE_USES accesses) */
    return st == WEFT_OK ? weft__tracker_exit(&t, do_launch(s, (void *)launch)) : st;
  return weft__tracker_use(s, small, n, do_launch, (void *)launch);
}

/* ---- tracked stream operations -------------------------------------------------------------- */

typedef struct op {
  int what;
  CUdeviceptr dptr, dptr2;
  CUcontext dctx, sctx; /* OP_PEER: the contexts of dptr and dptr2 */
  void *host;
  const void *chost;
  size_t bytes;
  uint64_t value;
  unsigned flags;
  CUhostFn fn;
} op_t;

enum { OP_HTOD, OP_DTOH, OP_DTOD, OP_PEER, OP_SET8, OP_SET32, OP_HOST, OP_WRITE32, OP_WRITE64, OP_WAIT32, OP_WAIT64 };

/* weft checks range and alignment first, so INVALID_VALUE from a stream memory operation means
 * the memory's kind: the driver refuses memory from stream-ordered pools (measured on an H200,
 * driver 580; tests/conformance checks it). */
static weft_status_t value_result(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return WEFT_OK;
  if (r != CUDA_ERROR_INVALID_VALUE) return weft__driver_fail(r, what);
  weft__error_set_driver(r);
  return weft__error(WEFT_ERR_NOT_SUPPORTED,
                     "%s: the driver refuses this block's memory (stream memory operations need cuMemAlloc "
                     "memory: allocate the flag from a direct resource, weft_direct_create, and wrap it with "
                     "weft_block_wrap; memory from stream-ordered pools is refused)",
                     what);
}

static weft_status_t do_op(weft_stream_t *s, void *arg) {
  const op_t *o = arg;
  const weft__driver_t *d = s->tr->drv;
  switch (o->what) {
    case OP_HTOD: WEFT__CU_TRY(d->cuMemcpyHtoDAsync(o->dptr, o->chost, o->bytes, s->raw)); break;
    case OP_DTOH: WEFT__CU_TRY(d->cuMemcpyDtoHAsync(o->host, o->dptr, o->bytes, s->raw)); break;
    case OP_DTOD: WEFT__CU_TRY(d->cuMemcpyDtoDAsync(o->dptr, o->dptr2, o->bytes, s->raw)); break;
    case OP_PEER: WEFT__CU_TRY(d->cuMemcpyPeerAsync(o->dptr, o->dctx, o->dptr2, o->sctx, o->bytes, s->raw)); break;
    case OP_SET8: WEFT__CU_TRY(d->cuMemsetD8Async(o->dptr, (unsigned char)o->value, o->bytes, s->raw)); break;
    case OP_SET32: WEFT__CU_TRY(d->cuMemsetD32Async(o->dptr, (unsigned)o->value, o->bytes / 4, s->raw)); break;
    case OP_HOST: WEFT__CU_TRY(d->cuLaunchHostFunc(s->raw, o->fn, o->host)); break;
    case OP_WRITE32: return value_result(d->cuStreamWriteValue32(s->raw, o->dptr, (cuuint32_t)o->value, 0), "cuStreamWriteValue32");
    case OP_WRITE64: return value_result(d->cuStreamWriteValue64(s->raw, o->dptr, o->value, 0), "cuStreamWriteValue64");
    case OP_WAIT32:
      return value_result(d->cuStreamWaitValue32(s->raw, o->dptr, (cuuint32_t)o->value, o->flags), "cuStreamWaitValue32");
    case OP_WAIT64: return value_result(d->cuStreamWaitValue64(s->raw, o->dptr, o->value, o->flags), "cuStreamWaitValue64");
  }
  return WEFT_OK;
}

/* The device address of [offset, offset+bytes) inside b, checked; align is a power of two. */
static weft_status_t range_of(weft_block_t b, size_t offset, size_t bytes, size_t align, const char *fn, CUdeviceptr *out) {
  struct weft__block *rec;
  weft_status_t st = weft__block_check(b, fn, &rec);
  if (st != WEFT_OK) return st;
  if (bytes == 0 || offset > rec->bytes || bytes > rec->bytes - offset)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: range [%zu, +%zu) is empty or outside the block of %zu bytes", fn,
                       offset, bytes, rec->bytes);
  WEFT_ASSERT((align & (align - 1)) == 0); /* 1, 4 or 8: a mask, not a division */
  if (((offset | bytes | (rec->ptr + offset)) & (align - 1)) != 0)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: offset %zu and size %zu must be multiples of %zu", fn, offset,
                       bytes, align);
  *out = rec->ptr + offset;
  return WEFT_OK;
}

/* One-block operations: resolve the range, then run the op as a use of that block. */
static weft_status_t block_op(weft_stream_t *s, weft_block_t b, weft_access_kind_t kind, size_t offset, size_t bytes,
                              size_t align, op_t *o, const char *fn) {
  weft_status_t st = range_of(b, offset, bytes, align, fn, &o->dptr);
  if (st != WEFT_OK) return st;
  weft_access_t a = {b, kind};
  return weft__use_run(s, &a, 1, fn, do_op, o);
}

/* ---- host copies (pageable memory through the runtime's stages: runtime.h, "staging") ---- */

typedef struct staged {
  op_t op;             /* one chunk, to or from the stage */
  void *dst;           /* the caller's memory of the chunk (the one that is not NULL) */
  const void *src;
  weft__stage_t *stage;
  bool direct;         /* the stream captures: the copy went in as asked (a graph node) */
  bool lost;           /* the stage's copy may belong to a capture begun outside weft */
  CUresult record;     /* the record of the stage's event after the copy */
} staged_t;

static weft_status_t do_staged(weft_stream_t *s, void *arg) {
  staged_t *x = arg;
  /* In a capture the copy is a node that runs at each launch: from the caller's memory. */
  if (atomic_load_explicit(&s->capture, memory_order_acquire) != NULL) {
    x->direct = true;
    op_t o = x->op;
    o.host = x->dst;
    o.chost = x->src;
    return do_op(s, &o);
  }
  WEFT__TEST_POINT("staged copy: enqueuing", s);
  weft_status_t st = do_op(s, &x->op);
  if (st != WEFT_OK) return st;
  /* The copy is queued: from here the use stands (its access is the copy's), whatever follows. */
  x->record = s->tr->drv->cuEventRecord(weft__stage_event(x->stage), s->raw);
  x->lost = x->record != CUDA_SUCCESS; /* nothing tells when the copy is done */
  /* Code outside weft may have begun capturing an exposed stream since weft asked the driver
   * (weft__stream_prepare): then the copy and the record are that capture's. */
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (atomic_load_explicit(&s->exposed, memory_order_relaxed) &&
      (weft__capture_status(s, &cs, NULL) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE)) {
    x->lost = true;
    return weft__error(WEFT_ERR_CAPTURE, "stream %u began capturing (code outside weft) during the copy: the copy is "
                       "that capture's", s->index);
  }
  return WEFT_OK;
}

/* One chunk of a staged copy: `bytes` (<= WEFT__STAGE_BYTES) at dptr inside block b (checked by
 * the caller; the use checks b again). */
static weft_status_t staged_chunk(weft_stream_t *s, weft_block_t b, CUdeviceptr dptr, size_t bytes, void *dst,
                                  const void *src, const char *fn) {
  const bool to_device = src != NULL;
  weft_runtime_t *rt = s->runtime;
  staged_t x = {.op = {.what = to_device ? OP_HTOD : OP_DTOH, .dptr = dptr, .bytes = bytes}, .dst = dst, .src = src};
  weft_status_t st = weft__stage_take(rt, &x.stage);
  if (st != WEFT_OK) return st;
  void *host = weft__stage_host(x.stage);
  x.op.host = host;
  x.op.chost = host;
  if (to_device) memcpy(host, src, bytes);
  weft_access_t a = {b, to_device ? WEFT_WRITE : WEFT_READ};
  st = weft__use_run(s, &a, 1, fn, do_staged, &x);
  if (st == WEFT_OK && x.record != CUDA_SUCCESS && !to_device) {
    /* The copy to the stage is queued and tracked, but its end cannot be known: dst untouched. */
    st = weft__driver_fail(x.record, "cuEventRecord (after a staged copy)");
  } else if (st == WEFT_OK && !x.direct && !to_device) {
    /* The copy's end, waited for holding nothing (the reason for the stage). A capture begun and
     * ended outside weft within the call leaves an event the driver refuses: not our copy. */
    CUresult r;
    WEFT__RELAXED(s->tr->drv, r = s->tr->drv->cuEventSynchronize(weft__stage_event(x.stage)));
    if (r == CUDA_SUCCESS) memcpy(dst, host, bytes);
    else if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_CAPTURED_EVENT) {
      x.lost = true;
      st = weft__error(WEFT_ERR_CAPTURE, "%s: stream %u was captured (code outside weft) during the copy: the copy is "
                       "that capture's", fn, s->index);
    } else {
      st = weft__driver_fail(r, "cuEventSynchronize (a staged copy)");
    }
  }
  if (st == WEFT_OK && !x.direct) atomic_fetch_add_explicit(&rt->staged_copies, 1, memory_order_relaxed);
  if (x.lost) weft__stage_lose(rt, x.stage);
  else weft__stage_give(rt, x.stage, st == WEFT_OK && to_device && !x.direct);
  return st;
}

/* A host copy of [offset, offset+bytes) of b: directly for page-locked host memory, else through
 * stages a chunk at a time (each chunk its own use of b). */
static weft_status_t host_copy(weft_stream_t *s, weft_block_t b, size_t offset, size_t bytes, void *dst, const void *src,
                               const char *fn) {
  const bool to_device = src != NULL;
  CUdeviceptr p;
  weft_status_t st = weft__stream_check(s, fn);
  if (st == WEFT_OK) st = range_of(b, offset, bytes, 1, fn, &p);
  if (st != WEFT_OK) return st;
  if (weft__host_pinned(s->tr->drv, to_device ? src : dst, bytes)) {
    op_t o = {.what = to_device ? OP_HTOD : OP_DTOH, .host = dst, .chost = src, .bytes = bytes};
    return block_op(s, b, to_device ? WEFT_WRITE : WEFT_READ, offset, bytes, 1, &o, fn);
  }
  for (size_t done = 0; st == WEFT_OK && done < bytes; done += WEFT__STAGE_BYTES) {
    size_t n = bytes - done < WEFT__STAGE_BYTES ? bytes - done : WEFT__STAGE_BYTES;
    st = staged_chunk(s, b, p + done, n, to_device ? NULL : (char *)dst + done, to_device ? (const char *)src + done : NULL,
                      fn);
  }
  return st;
}

weft_status_t weft_copy_to_block(weft_stream_t *s, weft_block_t dst, size_t offset, const void *src, size_t bytes) {
  if (src == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_copy_to_block: src is NULL");
  return host_copy(s, dst, offset, bytes, NULL, src, "weft_copy_to_block");
}

weft_status_t weft_copy_from_block(weft_stream_t *s, void *dst, weft_block_t src, size_t offset, size_t bytes) {
  if (dst == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_copy_from_block: dst is NULL");
  return host_copy(s, src, offset, bytes, dst, NULL, "weft_copy_from_block");
}

weft_status_t weft_copy_block(weft_stream_t *s, weft_block_t dst, size_t dst_offset, weft_block_t src, size_t src_offset,
                              size_t bytes) {
  op_t o = {.what = OP_DTOD, .bytes = bytes};
  weft_status_t st = range_of(dst, dst_offset, bytes, 1, "weft_copy_block", &o.dptr);
  if (st == WEFT_OK) st = range_of(src, src_offset, bytes, 1, "weft_copy_block", &o.dptr2);
  if (st != WEFT_OK) return st;
  weft_access_t a[2] = {{dst, WEFT_WRITE}, {src, WEFT_READ}};
  /* Between devices: one block of s's runtime, the other a far block (use_run's path). */
  weft_runtime_t *dr = ((struct weft__block *)dst.rec)->rt, *sr = ((struct weft__block *)src.rec)->rt;
  if (dr != sr) {
    if ((st = weft__stream_check(s, "weft_copy_block")) != WEFT_OK) return st;
    if (s->runtime != dr && s->runtime != sr)
      return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_copy_block: the stream belongs to neither block's runtime");
    /* A peer copy: it needs no peer or pool access (2 x H100; cuMemcpyDtoDAsync of another
     * device's pool memory does, tests/conformance/README.md "two devices"). */
    if (s->tr->drv->cuMemcpyPeerAsync == NULL)
      return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_copy_block: the driver has no cuMemcpyPeerAsync");
    /* CUDA cannot capture a peer copy (it would invalidate the capture: tests/conformance). */
    if ((st = weft__stream_prepare(s)) != WEFT_OK) return st;
    if (weft__tracker_capture_of(s, NULL) != NULL)
      return weft__error(WEFT_ERR_CAPTURE, "weft_copy_block: a copy between devices cannot be captured (CUDA "
                         "refuses cuMemcpyPeerAsync in a capture); copy before or after the capture, or read the "
                         "other device's block from a kernel");
    o.what = OP_PEER;
    o.dctx = dr->tracker.ctx;
    o.sctx = sr->tracker.ctx;
    return use_run(s, a, 2, "weft_copy_block", false, true, do_op, &o);
  }
  /* A copy within one block reads and writes it. */
  if (dst.rec == src.rec) a[0].kind = WEFT_READ_WRITE;
  return weft__use_run(s, a, dst.rec == src.rec ? 1 : 2, "weft_copy_block", do_op, &o);
}

weft_status_t weft_memset8(weft_stream_t *s, weft_block_t dst, size_t offset, unsigned char value, size_t bytes) {
  op_t o = {.what = OP_SET8, .value = value, .bytes = bytes};
  return block_op(s, dst, WEFT_WRITE, offset, bytes, 1, &o, "weft_memset8");
}

weft_status_t weft_memset32(weft_stream_t *s, weft_block_t dst, size_t offset, unsigned value, size_t bytes) {
  op_t o = {.what = OP_SET32, .value = value, .bytes = bytes};
  return block_op(s, dst, WEFT_WRITE, offset, bytes, 4, &o, "weft_memset32");
}

weft_status_t weft_host_func(weft_stream_t *s, CUhostFn fn, void *user, const weft_access_t *accesses, size_t n) {
  if (fn == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_host_func: fn is NULL");
  op_t o = {.what = OP_HOST, .fn = fn, .host = user};
  return weft__use_run(s, accesses, n, "weft_host_func", do_op, &o);
}

static weft_status_t value_op(weft_stream_t *s, weft_block_t b, size_t offset, uint64_t value, unsigned flags, int what,
                              const char *fn) {
  weft_status_t st = weft__stream_check(s, fn);
  if (st != WEFT_OK) return st;
  const weft__driver_t *d = s->tr->drv;
  void *entry = what == OP_WRITE32 ? (void *)d->cuStreamWriteValue32
                : what == OP_WRITE64 ? (void *)d->cuStreamWriteValue64
                : what == OP_WAIT32  ? (void *)d->cuStreamWaitValue32
                                     : (void *)d->cuStreamWaitValue64;
  if (entry == NULL) return weft__error(WEFT_ERR_NOT_SUPPORTED, "%s: the driver has no stream memory operations", fn);
  bool wide = what == OP_WRITE64 || what == OP_WAIT64;
  if (wide && !s->tr->mem_ops64)
    return weft__error(WEFT_ERR_NOT_SUPPORTED,
                       "%s: the device does not support 64-bit stream memory operations "
                       "(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0)", fn);
  op_t o = {.what = what, .value = value, .flags = flags};
  bool writes = what == OP_WRITE32 || what == OP_WRITE64;
  /* A value wait waits for what others enqueue later: no wait for s's points may cover it. */
  if (!writes && (st = weft__tracker_exact(s)) != WEFT_OK) return st;
  return block_op(s, b, writes ? WEFT_WRITE : WEFT_READ, offset, wide ? 8 : 4, wide ? 8 : 4, &o, fn);
}

weft_status_t weft_write_value32(weft_stream_t *s, weft_block_t dst, size_t offset, uint32_t value) {
  return value_op(s, dst, offset, value, 0, OP_WRITE32, "weft_write_value32");
}
weft_status_t weft_write_value64(weft_stream_t *s, weft_block_t dst, size_t offset, uint64_t value) {
  return value_op(s, dst, offset, value, 0, OP_WRITE64, "weft_write_value64");
}
weft_status_t weft_wait_value32(weft_stream_t *s, weft_block_t src, size_t offset, uint32_t value, unsigned flags) {
  return value_op(s, src, offset, value, flags, OP_WAIT32, "weft_wait_value32");
}
weft_status_t weft_wait_value64(weft_stream_t *s, weft_block_t src, size_t offset, uint64_t value, unsigned flags) {
  return value_op(s, src, offset, value, flags, OP_WAIT64, "weft_wait_value64");
}

weft_status_t weft_stream_set_hot_block(weft_stream_t *s, weft_block_t b, float hit_ratio) {
  weft_status_t st = weft__stream_check(s, "weft_stream_set_hot_block");
  if (st != WEFT_OK) return st;
  if (s->tr->drv->cuStreamSetAttribute == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_stream_set_hot_block: the driver has no cuStreamSetAttribute");
  if (!(hit_ratio >= 0.0f && hit_ratio <= 1.0f))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_set_hot_block: hit_ratio %g is outside [0, 1]",
                       (double)hit_ratio);
  CUstreamAttrValue v;
  memset(&v, 0, sizeof v);
  if (b.rec != NULL) {
    struct weft__block *rec;
    if ((st = weft__block_check(b, "weft_stream_set_hot_block", &rec)) != WEFT_OK) return st;
    v.accessPolicyWindow.base_ptr = (void *)(uintptr_t)rec->ptr;
    v.accessPolicyWindow.num_bytes = rec->bytes;
    v.accessPolicyWindow.hitRatio = hit_ratio;
    v.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
    v.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
  } else {
    v.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_NORMAL;
    v.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_NORMAL;
  }
  WEFT__CU_TRY(s->tr->drv->cuStreamSetAttribute(s->raw, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v));
  return WEFT_OK;
}

/* ---- work weft does not see ------------------------------------------------------------------ */

weft_status_t weft_stream_import_event(weft_stream_t *s, CUevent event) {
  weft_status_t st = weft__stream_check(s, "weft_stream_import_event");
  if (st != WEFT_OK) return st;
  if (event == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_import_event: event is NULL");
  /* An event recorded in someone's capture pulls s into it: watch s from now on. */
  atomic_store_explicit(&s->exposed, true, memory_order_relaxed);
  if ((st = weft__stream_prepare(s)) != WEFT_OK) return st;
  return weft__tracker_import_event(s, event);
}

weft_status_t weft_stream_import_stream(weft_stream_t *s, CUstream other) {
  weft_status_t st = weft__stream_check(s, "weft_stream_import_stream");
  if (st != WEFT_OK) return st;
  if (other == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_import_stream: the legacy NULL stream is not supported");
  const weft__driver_t *d = s->tr->drv;
  atomic_store_explicit(&s->exposed, true, memory_order_relaxed);
  if ((st = weft__stream_prepare(s)) != WEFT_OK) return st;
  CUevent ev;
  WEFT__CU_TRY(d->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CUresult r = d->cuEventRecord(ev, other);
  if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuEventRecord");
  else st = weft__tracker_import_event(s, ev);
  /* Destroying a recorded event that a stream waits on is allowed: the wait stays. */
  d->cuEventDestroy(ev);
  return st;
}
