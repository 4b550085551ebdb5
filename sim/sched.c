/* The scheduler: executes ready work in a seeded random order.
 *
 * Candidates are the head op of every busy stream whose wait is satisfied, and every ready node of
 * a graph launch that sits at a stream's head. One is picked with the PRNG and executed; a few run
 * at every driver call (sim__progress) and as many as needed at synchronisations
 * (sim__run_until). The same seed and the same sequence of calls give the same interleaving.
 * In lazy mode (WEFT_SIM_LAZY=1, a GPU far behind the host) ordinary calls run nothing: work
 * runs at synchronisations, which is where frees, event records and waits then complete.
 *
 * An executed op's clock: its stream's clock, joined with the host clock at issue and whatever it
 * waited for (an event record, the write-value that released a wait-value), then ticked on the
 * stream's lane. Actions do the work (kernel twins, copies, sets, callbacks) after the oracle saw
 * their accesses; an access to memory that is not allocated is reported and the action skipped.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <stdio.h>

#include "sim/internal.h"

/* ---- PRNG: splitmix64 ---- */

void sim__seed(uint64_t seed) { sim.rng = seed; }

uint64_t sim__rand(void) {
  uint64_t z = (sim.rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* ---- busy streams ---- */

void sim__busy_add(sim__stream_t *s) {
  if (s->busy_index >= 0) return;
  sim__grow(&sim.busy, &sim.capbusy, sim.nbusy + 1, sizeof *sim.busy);
  s->busy_index = (int)sim.nbusy;
  sim.busy[sim.nbusy++] = s;
}

/* Keeps the order of the others (the candidate order, hence the schedule, depends on it). */
void sim__busy_remove(sim__stream_t *s) {
  if (s->busy_index < 0) return;
  size_t i = (size_t)s->busy_index;
  memmove(sim.busy + i, sim.busy + i + 1, (sim.nbusy - i - 1) * sizeof *sim.busy);
  sim.nbusy--;
  for (size_t j = i; j < sim.nbusy; j++) sim.busy[j]->busy_index = (int)j;
  s->busy_index = -1;
}

/* Signalled at every enqueue: a synchronisation that waits for an NCCL partner another thread has
 * not posted yet sleeps on it (sim__run_until). */
static pthread_cond_t g_enqueued = PTHREAD_COND_INITIALIZER;

/* Whether an op takes room in its stream's launch queue: on an H100 (driver 580.159.04,
 * tools/probes/probe_queue_depth) 200,000 event records, or waits on a completed or a pending
 * event, went in behind a held stream without waiting, where memsets waited after 1,021 (also with
 * an event record after each). Other work is taken to be like memsets. */
static int takes_room(const sim__action_t *act) {
  return act->kind != SIM_ACT_EVENT_RECORD && act->kind != SIM_ACT_EVENT_WAIT;
}

void sim__enqueue(sim__stream_t *s, sim__action_t *act) {
  pthread_cond_broadcast(&g_enqueued);
  if (takes_room(act)) {
    s->room_taken++;
    sim__self()->enqueued = s;
  }
  sim__op_t *op = sim__xcalloc(1, sizeof *op);
  op->id = sim.next_op_id++;
  op->seq = ++s->issued;
  op->act = *act;
  if (sim.oracle) op->snap = sim__snap_host();
  if (s->tail) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  sim__busy_add(s);
}

/* ---- write-value clocks: a wait-value released by a write-value is ordered after it ---- */

typedef struct flag_vc {
  CUdeviceptr addr;
  sim__vc_t vc;
} flag_vc_t;
static flag_vc_t *g_flags;
static size_t g_nflags, g_capflags;

static flag_vc_t *flag_find(CUdeviceptr addr) {
  for (size_t i = 0; i < g_nflags; i++)
    if (g_flags[i].addr == addr) return &g_flags[i];
  return NULL;
}

static void flag_record(CUdeviceptr addr, const sim__vc_t *vc) {
  flag_vc_t *f = flag_find(addr);
  if (f == NULL) {
    sim__grow(&g_flags, &g_capflags, g_nflags + 1, sizeof *g_flags);
    f = &g_flags[g_nflags++];
    memset(f, 0, sizeof *f);
    f->addr = addr;
  }
  sim__vc_copy(&f->vc, vc);
}

/* ---- actions ---- */

const char *sim__action_what(const sim__action_t *act) {
  switch (act->kind) {
    case SIM_ACT_KERNEL: return "kernel";
    case SIM_ACT_MEMCPY:
      switch (act->u.copy.dir) {
        case SIM_HTOD: return "memcpy HtoD";
        case SIM_DTOH: return "memcpy DtoH";
        case SIM_DTOD: return "memcpy DtoD";
        default: return "memcpy HtoH";
      }
    case SIM_ACT_MEMSET: return "memset";
    case SIM_ACT_HOST: return "host function";
    case SIM_ACT_EMPTY: return "empty node";
    case SIM_ACT_EVENT_RECORD: return "event record";
    case SIM_ACT_EVENT_WAIT: return "event wait";
    case SIM_ACT_WRITE_VALUE: return "write value";
    case SIM_ACT_WAIT_VALUE: return "wait value";
    case SIM_ACT_MEM_ALLOC: return "alloc";
    case SIM_ACT_MEM_FREE: return "free";
    case SIM_ACT_GRAPH: return "graph launch";
    case SIM_ACT_NCCL: return "nccl";
  }
  return "op";
}

static sim__einst_t *event_inst(const sim__action_t *act, const sim__einst_t *bound) {
  return bound ? (sim__einst_t *)bound : act->u.event.inst;
}

static int value_satisfied(const sim__action_t *act) {
  size_t n = act->u.value.is64 ? 8 : 4;
  sim__region_t *r = sim__region_find((uintptr_t)act->u.value.addr);
  if (r == NULL || !r->allocated || (uintptr_t)act->u.value.addr + n > r->base + r->size) return 0;
  uint64_t v = 0, want = act->u.value.value;
  if (act->u.value.is64) {
    memcpy(&v, (const void *)(uintptr_t)act->u.value.addr, 8);
  } else {
    uint32_t v32;
    memcpy(&v32, (const void *)(uintptr_t)act->u.value.addr, 4);
    v = v32;
    want = (uint32_t)want;
  }
  switch (act->u.value.flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return act->u.value.is64 ? (int64_t)(v - want) >= 0 : (int32_t)(uint32_t)(v - want) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == want;
    case CU_STREAM_WAIT_VALUE_AND: return (v & want) != 0;
    case CU_STREAM_WAIT_VALUE_NOR:
      return act->u.value.is64 ? ~(v | want) != 0 : (uint32_t)~(v | want) != 0;
    default: return 0;
  }
}

int sim__action_ready(const sim__action_t *act, const sim__einst_t *bound) {
  if (act->kind == SIM_ACT_EVENT_WAIT) {
    const sim__einst_t *i = event_inst(act, bound);
    return i == NULL || i->done;
  }
  if (act->kind == SIM_ACT_WAIT_VALUE) return value_satisfied(act);
  if (act->kind == SIM_ACT_NCCL) return sim__nccl_ready(act);
  return 1;
}

const sim__vc_t *sim__action_incoming(const sim__action_t *act, const sim__einst_t *bound) {
  if (act->kind == SIM_ACT_EVENT_WAIT) {
    const sim__einst_t *i = event_inst(act, bound);
    return i ? &i->vc : NULL;
  }
  if (act->kind == SIM_ACT_WAIT_VALUE) {
    flag_vc_t *f = flag_find(act->u.value.addr);
    return f ? &f->vc : NULL;
  }
  return NULL;
}

static void callback(CUhostFn fn, void *data) {
  sim.in_callback++;
  fn(data);
  sim.in_callback--;
}

static void run_kernel(sim__action_t *act, const sim__actx_t *ctx) {
  sim__kernel_t *k = act->u.kernel.k;
  weft_sim_range_t local[16], *ranges = local;
  size_t n = 0;
  if (k->ranges) {
    n = k->ranges(&act->u.kernel.cfg, act->u.kernel.params, local, 16);
    if (n > 16) {
      ranges = sim__xmalloc(n * sizeof *ranges);
      size_t m = k->ranges(&act->u.kernel.cfg, act->u.kernel.params, ranges, n);
      if (m < n) n = m;
    }
  }
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    if (ranges[i].bytes == 0) continue;
    /* Another device's memory needs peer access (cuCtxEnablePeerAccess for cuMemAlloc memory,
     * cuMemPoolSetAccess for a pool's): without it a GPU faults; the simulator reports it. */
    const sim__alloc_t *owner = ctx->dev >= 0 ? sim__addr_owner(ranges[i].ptr, ranges[i].bytes) : NULL;
    if (owner != NULL && !sim__dev_can_touch(ctx->dev, owner)) {
      char first[160], second[160];
      snprintf(first, sizeof first, "kernel '%s' on device %d (stream %d)", k->name, ctx->dev, ctx->who.stream);
      snprintf(second, sizeof second, "%zu bytes at 0x%llx of device %d, with no peer access to it", ranges[i].bytes,
               (unsigned long long)ranges[i].ptr, owner->dev);
      sim__hazard_report(first, second);
      ok = 0;
      continue;
    }
    /* A read-write range is checked as a write (it conflicts with everything a write does). */
    if (sim__oracle_access(ranges[i].ptr, ranges[i].bytes, (ranges[i].access & WEFT_SIM_WRITE) != 0, ctx) != 0) ok = 0;
  }
  if (ranges != local) free(ranges);
  if (ok) {
    sim.in_callback++;
    k->fn(&act->u.kernel.cfg, act->u.kernel.params);
    sim.in_callback--;
  }
}

static void run_copy(sim__action_t *act, const sim__actx_t *ctx) {
  size_t n = act->u.copy.bytes;
  void *dst = act->u.copy.dst_host;
  const void *src = act->u.copy.staged ? act->u.copy.staged : act->u.copy.src_host;
  int ok = 1;
  if (act->u.copy.dir == SIM_DTOH || act->u.copy.dir == SIM_DTOD) {
    ok &= sim__oracle_access(act->u.copy.src_dev, n, 0, ctx) == 0;
    src = (const void *)(uintptr_t)act->u.copy.src_dev;
  }
  if (act->u.copy.dir == SIM_HTOD || act->u.copy.dir == SIM_DTOD) {
    ok &= sim__oracle_access(act->u.copy.dst_dev, n, 1, ctx) == 0;
    dst = (void *)(uintptr_t)act->u.copy.dst_dev;
  }
  if (ok && n) memmove(dst, src, n);
}

static void run_set(sim__action_t *act, const sim__actx_t *ctx) {
  size_t rowbytes = act->u.set.width * act->u.set.elem;
  size_t pitch = act->u.set.height > 1 ? act->u.set.pitch : rowbytes;
  for (size_t y = 0; y < act->u.set.height; y++) {
    CUdeviceptr row = act->u.set.dst + y * pitch;
    if (sim__oracle_access(row, rowbytes, 1, ctx) != 0) continue;
    unsigned char *p = (unsigned char *)(uintptr_t)row;
    if (act->u.set.elem == 1) {
      memset(p, (int)(act->u.set.value & 0xff), rowbytes);
    } else if (act->u.set.elem == 2) {
      uint16_t v = (uint16_t)act->u.set.value;
      for (size_t i = 0; i < act->u.set.width; i++) memcpy(p + 2 * i, &v, 2);
    } else {
      uint32_t v = act->u.set.value;
      for (size_t i = 0; i < act->u.set.width; i++) memcpy(p + 4 * i, &v, 4);
    }
  }
}

static void run_write_value(sim__action_t *act, const sim__actx_t *ctx) {
  size_t n = act->u.value.is64 ? 8 : 4;
  if (sim__oracle_access(act->u.value.addr, n, 1, ctx) != 0) return;
  if (act->u.value.is64) {
    memcpy((void *)(uintptr_t)act->u.value.addr, &act->u.value.value, 8);
  } else {
    uint32_t v = (uint32_t)act->u.value.value;
    memcpy((void *)(uintptr_t)act->u.value.addr, &v, 4);
  }
  if (sim.oracle) flag_record(act->u.value.addr, ctx->vc);
}

void sim__action_run(sim__action_t *act, const sim__actx_t *ctx, sim__einst_t *bound) {
  sim.stats.ops_executed++;
  switch (act->kind) {
    case SIM_ACT_KERNEL: run_kernel(act, ctx); break;
    case SIM_ACT_MEMCPY: run_copy(act, ctx); break;
    case SIM_ACT_MEMSET: run_set(act, ctx); break;
    case SIM_ACT_HOST: callback(act->u.host.fn, act->u.host.data); break;
    case SIM_ACT_EVENT_RECORD: {
      sim__einst_t *i = event_inst(act, bound);
      if (i) sim__einst_complete(i, ctx->vc);
      break;
    }
    case SIM_ACT_WRITE_VALUE: run_write_value(act, ctx); break;
    case SIM_ACT_MEM_ALLOC: {
      sim__alloc_t *a = act->u.mem.a; /* NULL for a pool allocation */
      if (a != NULL) {
        sim__galloc_exec_alloc(a, ctx);
      } else {
        /* A pool allocation: found by address, since a racing free may already have run. */
        sim__region_t *r = sim__region_find((uintptr_t)act->u.mem.ptr);
        if (r != NULL) r->allocated = 1;
        sim__oracle_access(act->u.mem.ptr, act->u.mem.size, 1, ctx);
      }
      break;
    }
    case SIM_ACT_MEM_FREE: {
      sim__alloc_t *a = act->u.mem.a;
      if (a->kind == SIM_ALLOC_GRAPH) {
        sim__galloc_exec_free(a, ctx);
      } else if (a->kind == SIM_ALLOC_PLAIN) {
        sim__plain_free_executed(a, ctx);
        act->u.mem.a = NULL; /* freed */
      } else {
        sim__oracle_access(a->ptr, a->size, 1, ctx);
        sim__pool_free_executed(a, &ctx->who);
        act->u.mem.a = NULL; /* freed */
      }
      break;
    }
    case SIM_ACT_EMPTY:
    case SIM_ACT_EVENT_WAIT:
    case SIM_ACT_WAIT_VALUE:
    case SIM_ACT_GRAPH: break;
    case SIM_ACT_NCCL: break; /* run by sim__nccl_run, with its partners */
  }
}

void sim__action_release(sim__action_t *act) {
  switch (act->kind) {
    case SIM_ACT_KERNEL:
      if (act->u.kernel.owned) {
        free(act->u.kernel.params);
        free(act->u.kernel.blob);
      }
      break;
    case SIM_ACT_MEMCPY: free(act->u.copy.staged); break;
    case SIM_ACT_EVENT_RECORD:
    case SIM_ACT_EVENT_WAIT:
      sim__einst_unref(act->u.event.inst);
      if (act->u.event.ev) sim__event_unref(act->u.event.ev);
      break;
    case SIM_ACT_MEM_ALLOC:
    case SIM_ACT_MEM_FREE:
      if (act->u.mem.a && act->u.mem.a->kind == SIM_ALLOC_GRAPH) sim__galloc_unref(act->u.mem.a);
      break;
    case SIM_ACT_GRAPH:
      if (act->u.graph.inst != NULL) {
        for (size_t i = 0; i < act->u.graph.exec->n; i++) sim__einst_unref(act->u.graph.inst[i]);
        free(act->u.graph.inst);
      }
      sim__exec_unref(act->u.graph.exec);
      break;
    case SIM_ACT_NCCL: sim__nccl_release(act); break;
    default: break;
  }
  memset(act, 0, sizeof *act);
}

void sim__action_clone(sim__action_t *dst, const sim__action_t *src) {
  *dst = *src;
  switch (src->kind) {
    case SIM_ACT_KERNEL:
      if (src->u.kernel.owned) {
        size_t total = src->u.kernel.blob_bytes;
        dst->u.kernel.blob = sim__xmalloc(total);
        memcpy(dst->u.kernel.blob, src->u.kernel.blob, total);
        dst->u.kernel.params = sim__xmalloc((src->u.kernel.nparams + 1) * sizeof(void *));
        for (unsigned i = 0; i < src->u.kernel.nparams; i++)
          dst->u.kernel.params[i] = (char *)dst->u.kernel.blob +
                                    ((char *)src->u.kernel.params[i] - (char *)src->u.kernel.blob);
      }
      break;
    case SIM_ACT_MEMCPY:
      dst->u.copy.staged = NULL; /* nodes never stage: a replay reads the host memory again */
      break;
    case SIM_ACT_EVENT_RECORD:
    case SIM_ACT_EVENT_WAIT:
      dst->u.event.inst = NULL;
      if (dst->u.event.ev) sim__event_ref(dst->u.event.ev);
      break;
    case SIM_ACT_MEM_ALLOC:
    case SIM_ACT_MEM_FREE:
      if (dst->u.mem.a && dst->u.mem.a->kind == SIM_ALLOC_GRAPH) sim__galloc_ref(dst->u.mem.a);
      break;
    case SIM_ACT_NCCL: sim__nccl_clone(dst, src); break;
    default: break;
  }
}

/* ---- executing stream ops ---- */

/* Pops s's head op once it finished (a plain op, or a graph launch that completed). */
void sim__pop_head(sim__stream_t *s) {
  sim__op_t *op = s->head;
  if (takes_room(&op->act)) s->room_taken--;
  s->head = op->next;
  if (s->head == NULL) s->tail = NULL;
  s->done = op->seq;
  sim__action_release(&op->act);
  sim__snap_unref(op->snap);
  free(op);
  if (s->head == NULL) {
    sim__busy_remove(s);
    sim__stream_maybe_free(s);
  }
}

static void join_issue_clock(sim__stream_t *s, sim__op_t *op) {
  if (!sim.oracle || op->snap == NULL || op->snap == s->last_snap) return;
  sim__vc_join(&s->vc, &op->snap->vc);
  sim__snap_unref(s->last_snap);
  s->last_snap = op->snap;
  s->last_snap->refs++;
}

static void run_head(sim__stream_t *s) {
  sim__op_t *op = s->head;
  if (op->act.kind == SIM_ACT_GRAPH) {
    join_issue_clock(s, op);
    sim__exec_start(s, op);
    if (!op->act.u.graph.exec->running) sim__pop_head(s);
    return;
  }
  if (op->act.kind == SIM_ACT_NCCL) { /* with its partners on other streams */
    sim__nccl_run(s);
    return;
  }
  /* Pop before running: a host callback may queue more work on this stream. */
  if (takes_room(&op->act)) s->room_taken--;
  s->head = op->next;
  if (s->head == NULL) s->tail = NULL;
  op->next = NULL;
  sim__actx_t ctx = {.vc = &s->vc, .dev = s->dev};
  uint32_t tick = 0;
  if (sim.oracle) {
    join_issue_clock(s, op);
    const sim__vc_t *in = sim__action_incoming(&op->act, NULL);
    if (in) sim__vc_join(&s->vc, in);
    tick = sim__vc_get(&s->vc, s->lane) + 1;
    sim__vc_set(&s->vc, s->lane, tick);
  }
  ctx.who = (sim__who_t){.op = op->id, .lane = s->lane, .tick = tick, .stream = s->id,
                         .what = sim__action_what(&op->act),
                         .name = op->act.kind == SIM_ACT_KERNEL ? op->act.u.kernel.k->name : NULL};
  sim__oracle_begin();
  sim__action_run(&op->act, &ctx, NULL);
  s->done = op->seq;
  sim__action_release(&op->act);
  sim__snap_unref(op->snap);
  free(op);
  if (s->head == NULL) {
    sim__busy_remove(s);
    sim__stream_maybe_free(s);
  }
}

/* ---- candidates and steps ---- */

typedef struct cand {
  sim__stream_t *s;
  size_t ready_index; /* SIZE_MAX: the stream's head op */
} cand_t;
static cand_t *g_cand;
static size_t g_capcand;

static size_t collect(void) {
  size_t n = 0;
  for (size_t i = 0; i < sim.nbusy; i++) {
    sim__stream_t *s = sim.busy[i];
    sim__op_t *op = s->head;
    if (op->act.kind == SIM_ACT_GRAPH) {
      sim__exec_t *x = op->act.u.graph.exec;
      if (x->running && x->run_stream == s) {
        for (size_t r = 0; r < x->nready; r++) {
          if (!sim__exec_node_ready(x, x->ready[r])) continue;
          sim__grow(&g_cand, &g_capcand, n + 1, sizeof *g_cand);
          g_cand[n++] = (cand_t){s, r};
        }
        continue;
      }
      if (x->running) continue; /* an earlier launch of this exec runs on another stream */
      if (op->act.u.graph.seq != x->started + 1) continue; /* an earlier launch has not started yet */
    } else if (!sim__action_ready(&op->act, NULL)) {
      continue;
    }
    sim__grow(&g_cand, &g_capcand, n + 1, sizeof *g_cand);
    g_cand[n++] = (cand_t){s, SIZE_MAX};
  }
  return n;
}

/* Executes one ready op or node; 0 when nothing is ready. */
static int step(void) {
  size_t n = collect();
  if (n == 0) return 0;
  cand_t c = g_cand[sim__rand() % n];
  if (c.ready_index == SIZE_MAX) {
    run_head(c.s);
  } else {
    sim__exec_t *x = c.s->head->act.u.graph.exec;
    size_t node = x->ready[c.ready_index];
    if (x->nodes[node].act.kind == SIM_ACT_NCCL) sim__nccl_run_node(x, node); /* with its partners */
    else if (sim__exec_step(x, c.ready_index)) sim__pop_head(c.s);
  }
  return 1;
}

/* Lazy mode stands for a device far behind the host: nothing runs at ordinary calls, and a
 * query runs one op a quarter of the time (so it mostly says NOT_READY, yet a loop polling
 * for completion still gets there). */
void sim__progress(sim__fn_t fn) {
  if (sim.in_callback || sim.nbusy == 0) return;
  if (sim.lazy) {
    if ((fn == SIM_FN_cuStreamQuery || fn == SIM_FN_cuEventQuery) && sim__rand() % 4 == 0) (void)step();
    return;
  }
  unsigned k = (unsigned)(sim__rand() % 4);
  for (unsigned i = 0; i < k; i++)
    if (!step()) break;
}

/* Nothing can run, but an NCCL operation waits for partners: another thread may still post them
 * (one thread per rank), as on a GPU, where the synchronisation would block. Sleeps until the
 * next enqueue, or for a millisecond where a partner may be in another process (its posts are
 * seen by looking at the board); 0 once WEFT_SIM_NCCL_WAIT_MS (default 10000) passed since
 * *since (set at the first wait) with nothing run: then the partner never comes (a hang on a
 * GPU). */
struct timespec sim__after_ms(struct timespec t, long ms) {
  t.tv_sec += ms / 1000;
  t.tv_nsec += (ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
  return t;
}

static int wait_for_partner(struct timespec *since) {
  if (!sim__nccl_pending()) return 0;
  long ms = sim__nccl_wait_ms();
  struct timespec now, until;
  clock_gettime(CLOCK_REALTIME, &now);
  if (since->tv_sec == 0 && since->tv_nsec == 0) *since = now;
  until = sim__after_ms(*since, ms);
  if (now.tv_sec > until.tv_sec || (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec)) return 0;
  if (sim__nccl_remote_pending()) {
    struct timespec poll = sim__after_ms(now, 1);
    (void)pthread_cond_timedwait(&g_enqueued, &sim.lock, &poll);
    return 1;
  }
  return pthread_cond_timedwait(&g_enqueued, &sim.lock, &until) == 0;
}

CUresult sim__run_until(int (*done)(void *), void *arg) {
  struct timespec since = {0, 0};
  while (!done(arg)) {
    if (sim.in_callback) return CUDA_ERROR_NOT_PERMITTED;
    if (step()) {
      since = (struct timespec){0, 0};
      continue;
    }
    if (!wait_for_partner(&since)) return CUDA_ERROR_LAUNCH_TIMEOUT;
  }
  return CUDA_SUCCESS;
}

/* A stream's launch queue is bounded: on 2 x H200 and an H100 an enqueue waited for room inside the
 * driver once a held stream had 1,021 memsets queued (tools/probes/probe_queue_depth; streams
 * beyond the device's 8 connections share room, which the simulator does not model); event records
 * and waits take none (takes_room). */
static int has_room(void *arg) {
  const sim__stream_t *s = arg;
  return s->room_taken <= sim.queue_depth;
}

CUresult sim__queue_room(void) {
  sim__stream_t *s = sim__self()->enqueued;
  sim__self()->enqueued = NULL;
  if (s == NULL || sim.queue_depth == 0 || sim.in_callback || has_room(s)) return CUDA_SUCCESS;
  return sim__run_until(has_room, s);
}

static int all_idle(void *arg) {
  (void)arg;
  return sim.nbusy == 0;
}

CUresult sim__drain(void) { return sim__run_until(all_idle, NULL); }
