/* Streams: FIFO queues of ops, their flags, priorities, ids, queries and synchronisation, and the
 * stream-ordered host function and memory operations (write/wait value).
 *
 * The legacy stream (handle 0, CU_STREAM_LEGACY) is an ordinary queue here: the simulator does
 * not model its implicit synchronisation with blocking streams, except that work on handle 0 or
 * CU_STREAM_LEGACY while a blocking stream captures fails with STREAM_CAPTURE_IMPLICIT and
 * invalidates that capture (sim__legacy_implicit). It can never be captured. CU_STREAM_PER_THREAD
 * is each thread's own blocking stream of each device (sim__stream_default), which can be
 * captured, as on the GPU (conformance: "per-thread stream"). A destroyed stream's queued work
 * still runs; the object is freed once idle.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

static sim__stream_t *stream_new(int dev, unsigned flags, int priority);

sim__stream_t *sim__stream_default(CUstream h, int dev) {
  if (h == NULL || h == CU_STREAM_LEGACY) return sim__null_stream(dev);
  if (h != CU_STREAM_PER_THREAD) return NULL;
  sim__thread_t *t = sim__self();
  if (t->per_thread[dev] == NULL || t->per_thread_gen[dev] != sim.ctx_gen[dev]) {
    t->per_thread[dev] = stream_new(dev, 0, 0);
    t->per_thread_gen[dev] = sim.ctx_gen[dev];
  }
  return t->per_thread[dev];
}

/* A default handle names the current context's stream: none without one (say, a thread's driver
 * state ended): INVALID_CONTEXT (measured on an H200 for memsets, cuEventRecord,
 * cuMemAllocAsync and cuStreamSynchronize on the per-thread and legacy handles). */
static int default_without_ctx(CUstream h) {
  return (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) && sim__need_ctx() != CUDA_SUCCESS;
}

sim__stream_t *sim__stream_get(CUstream h) {
  if (default_without_ctx(h)) {
    sim__self()->stream_without_ctx = 1; /* SIM_CALL answers INVALID_CONTEXT, as the GPU does */
    return NULL;
  }
  sim__stream_t *s = sim__stream_default(h, sim__cur_dev());
  return s != NULL ? s : sim__handle_get(h, SIM_MAGIC_STREAM);
}

void sim__stream_maybe_free(sim__stream_t *s) {
  if (!s->destroyed || s->busy_index >= 0 || s->head != NULL) return;
  if (sim.oracle) sim__vc_join(&sim.retired_vc, &s->vc);
  size_t i = s->all_index;
  sim.streams[i] = sim.streams[--sim.nstreams];
  sim.streams[i]->all_index = i;
  sim__vc_free(&s->vc);
  sim__snap_unref(s->last_snap);
  sim__links_free(&s->links);
  if (s->pooled) sim__links_forget(s->id); /* (an allocation made on it then counts as made elsewhere) */
  free(s->deps);
  free(s->edge_buf);
  free(s);
}

CUresult sim__submit(sim__stream_t *s, sim__action_t *act, CUgraphNodeType type) {
  if (s->cap != NULL) return sim__capture_add(s, act, type, NULL);
  sim__enqueue(s, act);
  return CUDA_SUCCESS;
}

/* ---- creation and properties ---- */

static CUresult stream_create(CUstream *out, unsigned flags, int priority) {
  if (out == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  /* Priorities outside [greatest, least] = [-5, 0] are clamped, as the driver does. */
  if (priority > 0) priority = 0;
  if (priority < -5) priority = -5;
  *out = (CUstream)stream_new(sim__cur_dev(), flags, priority);
  return CUDA_SUCCESS;
}

/* A new stream of device dev, in sim.streams and the handle table (a per-thread stream too, whose
 * handle nobody is given: sim__streams_destroy_all finds it there). */
static sim__stream_t *stream_new(int dev, unsigned flags, int priority) {
  sim__stream_t *s = sim__xcalloc(1, sizeof *s);
  s->magic = SIM_MAGIC_STREAM;
  s->id = sim.next_stream_id++;
  s->dev = dev;
  s->flags = flags;
  s->priority = priority;
  s->lane = sim.next_lane++;
  s->busy_index = -1;
  sim__grow(&sim.streams, &sim.capstreams, sim.nstreams + 1, sizeof *sim.streams);
  s->all_index = sim.nstreams;
  sim.streams[sim.nstreams++] = s;
  sim__handle_add(s);
  return s;
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
  SIM_CALL(cuStreamCreateWithPriority, stream_create(phStream, flags, priority));
}

static CUresult stream_destroy(CUstream h) {
  sim__stream_t *s = h ? sim__handle_get(h, SIM_MAGIC_STREAM) : NULL;
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (s->cap != NULL) {
    sim__capture_invalidate(s->cap);
    sim__capture_stream_leave(s);
  }
  sim__handle_remove(s);
  s->destroyed = 1;
  sim__stream_maybe_free(s);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream) { SIM_CALL(cuStreamDestroy, stream_destroy(hStream)); }

/* ---- a thread's end ----
 * The driver ends a thread's state when the thread ends: after the thread-exit handlers of
 * __cxa_thread_atexit_impl, before the destructors of pthread keys made after cuInit (a driver
 * call there finds no current context: INVALID_CONTEXT). Its per-thread streams go then. Where one
 * still has queued work that touches memory of a stream-ordered pool (cuMemAllocAsync,
 * cuMemAllocFromPoolAsync) allocated in its stream order (in_pool), that teardown spins for ever
 * on the GPU: the thread never ends
 * (measured on H200s, driver 580.159.04; a synchronisation of the stream before, e.g. in such an
 * exit handler, avoids it). The simulator reports that as a hazard, for the race count, and goes
 * on. Conformance: "per-thread stream at a thread's end". */
static pthread_key_t g_end_key;
static int g_end_keyed;

static const sim__stream_t *g_ending; /* the per-thread stream thread_end looks at (lock held) */

/* Whether p is memory of a pool allocation that g_ending's work follows in stream order: made on
 * it, or on a stream it waited for (by events) after the allocation. (Measured on the GPU: work on
 * pool memory allocated elsewhere and synchronised by the host, with no event between, does not
 * hang the thread's end; allocated on the stream itself, or on another it waits for by an event,
 * it does, host synchronisation or not.) */
/* The pool allocation holding p, live or with its free still queued (cuMemFreeAsync took it out
 * of the address map already), or NULL. */
static const sim__alloc_t *pool_alloc_at(CUdeviceptr p) {
  const sim__alloc_t *a = sim__addr_owner(p, 1);
  if (a != NULL) return a->kind == SIM_ALLOC_POOL ? a : NULL;
  for (size_t i = 0; i < sim.nstreams; i++)
    for (const sim__op_t *op = sim.streams[i]->head; op != NULL; op = op->next) {
      const sim__alloc_t *f = op->act.kind == SIM_ACT_MEM_FREE ? op->act.u.mem.a : NULL;
      if (f != NULL && f->kind == SIM_ALLOC_POOL && p >= f->ptr && p < f->ptr + f->size) return f;
    }
  return NULL;
}

static int in_pool(CUdeviceptr p) {
  const sim__alloc_t *a = pool_alloc_at(p);
  return a != NULL &&
         (a->alloc_stream == g_ending->id || sim__links_get(&g_ending->links, a->alloc_stream) >= a->alloc_seq);
}

/* Whether queued action act touches memory of a stream-ordered pool. */
static int touches_pool(const sim__action_t *act) {
  switch (act->kind) {
    case SIM_ACT_MEMSET: return in_pool(act->u.set.dst);
    case SIM_ACT_MEMCPY:
      return ((act->u.copy.dir == SIM_DTOD || act->u.copy.dir == SIM_DTOH) && in_pool(act->u.copy.src_dev)) ||
             ((act->u.copy.dir == SIM_DTOD || act->u.copy.dir == SIM_HTOD) && in_pool(act->u.copy.dst_dev));
    case SIM_ACT_KERNEL: {
      const sim__kernel_t *k = act->u.kernel.k;
      if (k->ranges == NULL || !act->u.kernel.owned) return 0; /* (passed-through arguments may be gone) */
      weft_sim_range_t local[16], *r = local;
      size_t n = k->ranges(&act->u.kernel.cfg, act->u.kernel.params, local, 16);
      if (n > 16) {
        r = sim__xmalloc(n * sizeof *r);
        n = k->ranges(&act->u.kernel.cfg, act->u.kernel.params, r, n);
      }
      int hit = 0;
      for (size_t i = 0; i < n && !hit; i++) hit = r[i].bytes != 0 && in_pool(r[i].ptr);
      if (r != local) free(r);
      return hit;
    }
    case SIM_ACT_NCCL: return sim__nccl_names(act, in_pool);
    default: return 0;
  }
}

static void thread_end(void *arg) {
  (void)arg;
  pthread_mutex_lock(&sim.lock);
  sim__thread_t *t = sim__self();
  for (int dev = 0; dev < sim.ndev; dev++) {
    sim__stream_t *s = t->per_thread[dev];
    if (s == NULL || t->per_thread_gen[dev] != sim.ctx_gen[dev]) continue;
    g_ending = s;
    for (const sim__op_t *op = s->head; op != NULL; op = op->next) {
      if (!touches_pool(&op->act)) continue;
      char first[96], second[96];
      snprintf(first, sizeof first, "a thread's per-thread stream %d of device %d, with queued %s on pool memory", s->id,
               dev, sim__action_what(&op->act));
      snprintf(second, sizeof second, "the thread's end (on a GPU its exit never returns)");
      sim__hazard_report(first, second);
      fprintf(stderr, "weft-sim: %s: %s\n", first, second);
      break;
    }
    (void)stream_destroy((CUstream)s);
    t->per_thread[dev] = NULL;
  }
  t->ctx = NULL;
  t->registered = 2;
  pthread_mutex_unlock(&sim.lock);
}

void sim__thread_end_key(void) { g_end_keyed = pthread_key_create(&g_end_key, thread_end) == 0; }

void sim__thread_watch(void) {
  sim__self()->registered = 1;
  if (g_end_keyed) (void)pthread_setspecific(g_end_key, &g_end_key);
}

void sim__streams_destroy_all(int dev) {
  /* stream_destroy may free a stream and shrink the list: collect the live ones first. */
  size_t n = 0;
  sim__stream_t **live = sim__xcalloc(sim.nstreams + 1, sizeof *live);
  for (size_t i = 0; i < sim.nstreams; i++)
    if (!sim.streams[i]->is_null && sim.streams[i]->dev == dev && !sim.streams[i]->destroyed) live[n++] = sim.streams[i];
  for (size_t i = 0; i < n; i++) (void)stream_destroy((CUstream)live[i]);
  free(live);
}

static CUresult stream_get_priority(CUstream h, int *out) {
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  *out = s->priority;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int *priority) {
  SIM_CALL(cuStreamGetPriority, stream_get_priority(hStream, priority));
}

static CUresult stream_get_flags(CUstream h, unsigned *out) {
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  *out = s->flags;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int *flags) {
  SIM_CALL(cuStreamGetFlags, stream_get_flags(hStream, flags));
}

static CUresult stream_get_id(CUstream h, unsigned long long *out) {
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  *out = (unsigned long long)s->id;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long *streamId) {
  SIM_CALL(cuStreamGetId, stream_get_id(hStream, streamId));
}

static CUresult stream_set_attribute(CUstream h, CUstreamAttrID attr, const CUstreamAttrValue *value) {
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
  switch (attr) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
      if (value->accessPolicyWindow.hitRatio < 0.0f || value->accessPolicyWindow.hitRatio > 1.0f)
        return CUDA_ERROR_INVALID_VALUE;
      s->apw = value->accessPolicyWindow;
      s->has_apw = 1;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      s->priority = value->priority > 0 ? 0 : value->priority < -5 ? -5 : value->priority;
      return CUDA_SUCCESS;
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY: return CUDA_SUCCESS;
    default: return sim__unimplemented();
  }
}

CUresult CUDAAPI cuStreamSetAttribute(CUstream hStream, CUstreamAttrID attr, const CUstreamAttrValue *value) {
  SIM_CALL(cuStreamSetAttribute, stream_set_attribute(hStream, attr, value));
}

/* ---- query and synchronisation ---- */

typedef struct seq_target {
  sim__stream_t *s;
  uint64_t seq;
} seq_target_t;

static int stream_reached(void *arg) {
  seq_target_t *t = arg;
  return t->s->done >= t->seq;
}

static CUresult stream_query(CUstream h) {
  if (default_without_ctx(h)) return CUDA_ERROR_INVALID_CONTEXT;
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (s->cap != NULL) {
    sim__capture_invalidate(s->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  CUresult r = sim__capture_unsafe(); /* any stream, under GLOBAL capture (measured, H200) */
  if (r != CUDA_SUCCESS) return r;
  if (s->done < s->issued) return CUDA_ERROR_NOT_READY;
  sim__host_join(&s->vc); /* the host now knows the stream's work completed */
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) { SIM_CALL(cuStreamQuery, stream_query(hStream)); }

static CUresult stream_sync(CUstream h) {
  if (default_without_ctx(h)) return CUDA_ERROR_INVALID_CONTEXT;
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (s->cap != NULL) {
    sim__capture_invalidate(s->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  CUresult r = sim__capture_unsafe(); /* any stream, under GLOBAL capture (measured, H200) */
  if (r != CUDA_SUCCESS) return r;
  seq_target_t t = {s, s->issued};
  r = sim__run_until(stream_reached, &t);
  if (r != CUDA_SUCCESS) return r;
  sim__host_join(&s->vc);
  sim__pools_release();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) { SIM_CALL(cuStreamSynchronize, stream_sync(hStream)); }

/* ---- host functions and memory operations ---- */

static CUresult launch_host_func(CUstream h, CUhostFn fn, void *data) {
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(h, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  if (fn == NULL) return CUDA_ERROR_INVALID_VALUE;
  sim__action_t act = {.kind = SIM_ACT_HOST};
  act.u.host.fn = fn;
  act.u.host.data = data;
  return sim__submit(s, &act, CU_GRAPH_NODE_TYPE_HOST);
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData) {
  SIM_CALL(cuLaunchHostFunc, launch_host_func(hStream, fn, userData));
}

static CUresult mem_op(CUstream h, CUdeviceptr addr, uint64_t value, unsigned flags, int is64, int wait) {
  sim__stream_t *s = sim__stream_get(h);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(h, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  size_t n = is64 ? 8 : 4;
  const sim__alloc_t *owner = addr != 0 ? sim__addr_owner(addr, n) : NULL;
  if (owner == NULL || (addr & (n - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  /* Measured on an H200 (driver 580, CUDA 13.0): stream memory operations on memory from a
   * stream-ordered pool (cuMemAllocAsync / cuMemAllocFromPoolAsync) return INVALID_VALUE, while
   * cuMemAlloc memory works. */
  if (owner->kind == SIM_ALLOC_POOL) return CUDA_ERROR_INVALID_VALUE;
  if (wait && (flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) > CU_STREAM_WAIT_VALUE_NOR) return CUDA_ERROR_INVALID_VALUE;
  /* Measured on an H200 (driver 580): the v2 write refuses CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER. */
  if (!wait && flags != 0) return CUDA_ERROR_INVALID_VALUE;
  /* Captured memory operations would be batch-mem-op nodes, which the simulator does not model. */
  if (s->cap != NULL) return s->cap->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : sim__unimplemented();
  sim__action_t act = {.kind = wait ? SIM_ACT_WAIT_VALUE : SIM_ACT_WRITE_VALUE};
  act.u.value.addr = addr;
  act.u.value.value = value;
  act.u.value.flags = flags;
  act.u.value.is64 = is64;
  sim__enqueue(s, &act);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  SIM_CALL(cuStreamWriteValue32, mem_op(stream, addr, value, flags, 0, 0));
}
CUresult CUDAAPI cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  SIM_CALL(cuStreamWriteValue64, mem_op(stream, addr, value, flags, 1, 0));
}
CUresult CUDAAPI cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  SIM_CALL(cuStreamWaitValue32, mem_op(stream, addr, value, flags, 0, 1));
}
CUresult CUDAAPI cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  SIM_CALL(cuStreamWaitValue64, mem_op(stream, addr, value, flags, 1, 1));
}
