/* libweft_torch.so called from many threads at once, the way PyTorch's threads call a
 * CUDAPluggableAllocator, with no PyTorch and no GPU (the simulator and its race oracle):
 *   - the autograd engine frees on its own thread what forward threads allocated (and the
 *     forward threads keep allocating on the same streams meanwhile);
 *   - several Python threads on the legacy default stream at once;
 *   - tensor.record_stream on one thread, the tensor's free on another;
 *   - torch.cuda.empty_cache() from one thread while others allocate;
 *   - one thread capturing (torch.cuda.graph with a THREAD_LOCAL or RELAXED capture) while
 *     others allocate eagerly on their own streams;
 *   - with 2 devices (test_torch_threads_2): threads on each, frees across devices, and a
 *     stream of one device recorded for a tensor of the other.
 * The empty_cache and capture cases found two bugs of weft's core, not at every run (fixed with
 * tests/streams:test_adopt's deterministic cases): a free on an adopted stream took a point from
 * before PyTorch's kernels there (lib/runtime/block.c, streams/tracker.c), and another thread
 * recorded an adopted stream's pending point into a capture outside code had begun on it
 * (streams/clock.c); the capture was invalidated.
 * Checks: values written and read back, 0 races and no use of a destroyed handle (simulator),
 * the adapter's counters, live bytes back to where they were. Streams are never destroyed (the
 * adapter adopts every stream it sees for its runtime's life, as PyTorch's pooled streams are). */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <cmocka.h>

#include "tests/torch/harness.h"

#define NT 8         /* threads */
#define MAX_DEV 2
static int n_dev = 1;
static CUcontext ctx_of[MAX_DEV];
static CUstream streams[MAX_DEV][NT]; /* one per thread and device, made once */
static CUstream comm[MAX_DEV][NT];    /* a second per thread (record_stream's) */

/* Makes device dev's primary context current on the calling thread (PyTorch's device guard). */
static void on_device(int dev) {
  if (d_set_cur(ctx_of[dev]) != CUDA_SUCCESS) fail_msg("cuCtxSetCurrent(device %d)", dev);
}

static void load(void) {
  harness_resolve();
  CUresult (*count)(int *);
  DRV(count, "cuDeviceGetCount");
  if (count(&n_dev) != CUDA_SUCCESS || n_dev < 1) fail_msg("no device");
  if (n_dev > MAX_DEV) n_dev = MAX_DEV;
  for (int d = 0; d < n_dev; d++) ctx_of[d] = harness_primary(d);
  for (int d = 0; d < n_dev; d++) {
    on_device(d);
    for (int t = 0; t < NT; t++) {
      if (d_stream_create(&streams[d][t], CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
          d_stream_create(&comm[d][t], CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS)
        fail_msg("stream create");
    }
    void *p = t_alloc(256, d, NULL); /* the first allocation makes the device's runtime */
    if (p == NULL) fail_msg("first alloc on device %d: %s", d, t_error());
    t_free(p, 256, d, NULL);
  }
  on_device(0);
}

/* Every device's work done (cuCtxSynchronize on each), device 0 current again. */
static void sync_devices(void) {
  for (int d = 0; d < n_dev; d++) {
    on_device(d);
    assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  }
  on_device(0);
}

static uint64_t stat_on(int dev, const char *key) { return harness_stat(dev, key); }

/* A counter summed over the devices. */
static uint64_t stat_all(const char *key) {
  uint64_t v = 0;
  for (int d = 0; d < n_dev; d++) v += stat_on(d, key);
  return v;
}

static int setup(void **state) {
  (void)state;
  if (t_alloc == NULL) load();
  on_device(0);
  if (sim) sim->reset_races();
  return 0;
}

/* expect_filled (harness.h), read with the tensor's device current, as PyTorch's device guard makes it for a copy
 * to the host: memory of a device's stream-ordered pool cannot be read from another device's
 * context on a GPU (2 x H100: every such cuMemcpyDtoH failed), then `back` is made current. */
static void expect_filled_on(int dev, int back, CUdeviceptr p, size_t n, unsigned v, const char *what) {
  on_device(dev);
  expect_filled(p, n, v, what);
  on_device(back);
}

/* The calling thread's current context is still `want` (the adapter leaves it as it found it). */
static void expect_context(CUcontext want, const char *what) {
  CUcontext cur = NULL;
  CHECK(d_get_cur(&cur) == CUDA_SUCCESS && cur == want, "%s: the current context changed", what);
}


/* ---- forward threads allocate, the autograd thread frees ---------------------------------------
 * Each of NT threads allocates a batch of tensors on its own stream (of device t % devices) and
 * fills them; the next round, its neighbour verifies and frees that batch (PyTorch passes the
 * allocating stream) while it allocates its own: the neighbour's frees on stream s run while s's
 * owner allocates on s, from another thread, often on another device. Live tensors must never
 * share memory (each keeps its value), and every byte comes back. */
#define BATCH 48
#define ROUNDS 12

typedef struct batch {
  CUdeviceptr p[BATCH];
  size_t n[BATCH];
  unsigned v[BATCH];
  int dev;
  CUstream s;
} batch_t;

static batch_t batches[2][NT];
static pthread_barrier_t round_barrier;

typedef struct worker {
  int t;
  int dev;
} worker_t;

static void *forward_and_backward(void *arg) {
  worker_t *w = arg;
  on_device(w->dev);
  CUstream s = streams[w->dev][w->t];
  for (unsigned r = 0; r < ROUNDS; r++) {
    batch_t *mine = &batches[r % 2][w->t];
    batch_t *theirs = &batches[(r + 1) % 2][(w->t + 1) % NT]; /* made by the neighbour last round */
    mine->dev = w->dev;
    mine->s = s;
    for (unsigned i = 0; i < BATCH; i++) {
      size_t n = (size_t)(1 + (i * 7 + r + (unsigned)w->t) % 29) * 1024;
      unsigned v = (r << 20) | ((unsigned)w->t << 12) | i;
      CUdeviceptr p = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, w->dev, s);
      CHECK(p != 0, "thread %d: alloc %zu: %s", w->t, n, t_error());
      mine->p[i] = p;
      mine->n[i] = n;
      mine->v[i] = v;
      if (p != 0) CHECK(d_memset(p, v, n / 4, s) == CUDA_SUCCESS, "memset");
      if (r > 0 && theirs->p[i] != 0) {
        /* The autograd thread: the neighbour's tensor, its stream synchronised before the barrier. */
        expect_filled_on(theirs->dev, w->dev, theirs->p[i], theirs->n[i], theirs->v[i], "a tensor freed on another thread");
        CUcontext was = ctx_of[w->dev];
        t_free((void *)(uintptr_t)theirs->p[i], (ssize_t)theirs->n[i], theirs->dev, theirs->s);
        expect_context(was, "free from another thread");
        theirs->p[i] = 0;
      }
    }
    CHECK(d_sync(s) == CUDA_SUCCESS, "sync");
    pthread_barrier_wait(&round_barrier);
  }
  return NULL;
}

static void test_tensors_freed_by_the_autograd_thread(void **state) {
  (void)state;
  reset_errors();
  uint64_t live0 = stat_all("live_bytes"), allocs0 = stat_all("adapter_allocs"), frees0 = stat_all("adapter_frees");
  uint64_t fails0 = stat_all("free_failures");
  memset(batches, 0, sizeof batches);
  assert_int_equal(pthread_barrier_init(&round_barrier, NULL, NT), 0);
  worker_t w[NT];
  for (int t = 0; t < NT; t++) w[t] = (worker_t){t, t % n_dev};
  run_threads(NT, forward_and_backward, w, sizeof w[0]);
  pthread_barrier_destroy(&round_barrier);
  check_errors();
  /* The last round's batches: verified and freed here. */
  for (int t = 0; t < NT; t++) {
    batch_t *b = &batches[(ROUNDS - 1) % 2][t];
    for (unsigned i = 0; i < BATCH; i++) {
      expect_filled_on(b->dev, 0, b->p[i], b->n[i], b->v[i], "the last round's tensor");
      t_free((void *)(uintptr_t)b->p[i], (ssize_t)b->n[i], b->dev, b->s);
    }
  }
  check_errors();
  sync_devices();
  assert_int_equal(stat_all("adapter_allocs") - allocs0, (uint64_t)NT * BATCH * ROUNDS);
  assert_int_equal(stat_all("adapter_frees") - frees0, (uint64_t)NT * BATCH * ROUNDS);
  assert_int_equal(stat_all("free_failures"), fails0);
  assert_int_equal(stat_all("live_bytes"), live0);
  check_races();
}

/* ---- Python threads on the legacy default stream ----------------------------------------------
 * Without torch.cuda.stream(...), every thread's current stream is the legacy default stream:
 * NT threads allocate, fill, copy and free there at once. */
static void *legacy_steps(void *arg) {
  worker_t *w = arg;
  on_device(w->dev);
  for (unsigned step = 0; step < 60; step++) {
    size_t n = (size_t)(1 + (step + (unsigned)w->t) % 13) * 4096;
    unsigned v = ((unsigned)w->t << 16) | step;
    CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, w->dev, NULL);
    CUdeviceptr y = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, w->dev, NULL);
    CHECK(x != 0 && y != 0, "thread %d: alloc: %s", w->t, t_error());
    if (x == 0 || y == 0) return NULL;
    CHECK(d_memset(x, v, n / 4, NULL) == CUDA_SUCCESS, "memset");
    CHECK(d_copy(y, x, n, NULL) == CUDA_SUCCESS, "copy");
    t_free((void *)(uintptr_t)x, (ssize_t)n, w->dev, NULL); /* reusable at once on the legacy stream */
    CUdeviceptr z = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, w->dev, NULL);
    CHECK(z != 0, "alloc z");
    if (z != 0) CHECK(d_memset(z, ~v, n / 4, NULL) == CUDA_SUCCESS, "memset z");
    CHECK(d_sync(NULL) == CUDA_SUCCESS, "sync");
    expect_filled(y, n, v, "legacy stream copy");
    if (z != 0) expect_filled(z, n, ~v, "legacy stream reuse");
    t_free((void *)(uintptr_t)y, (ssize_t)n, w->dev, NULL);
    if (z != 0) t_free((void *)(uintptr_t)z, (ssize_t)n, w->dev, NULL);
  }
  return NULL;
}

static void test_threads_share_the_legacy_stream(void **state) {
  (void)state;
  reset_errors();
  uint64_t live0 = stat_all("live_bytes"), fails0 = stat_all("free_failures"), afails0 = stat_all("alloc_failures");
  worker_t w[NT];
  for (int t = 0; t < NT; t++) w[t] = (worker_t){t, t % n_dev};
  run_threads(NT, legacy_steps, w, sizeof w[0]);
  check_errors();
  assert_int_equal(stat_all("free_failures"), fails0);
  assert_int_equal(stat_all("alloc_failures"), afails0);
  assert_int_equal(stat_all("live_bytes"), live0);
  check_races();
}

/* ---- record_stream on one thread, the free on another -----------------------------------------
 * Pairs of threads, as a communication thread and a compute thread: the compute thread allocates
 * p on its stream and fills it; the communication thread orders its stream after that (an event),
 * copies p out there (work weft does not see, as NCCL's) and calls record_stream(p, its stream);
 * then the compute thread frees p and at once allocates the same size on its stream (the same
 * memory, from the stream's cache) and overwrites it. The overwrite must wait for the copy. */
#define REC_ITERS 40

typedef struct pair {
  int t; /* the pair's index */
  int dev;
  pthread_barrier_t b;
  CUdeviceptr p;
  size_t n;
  unsigned v;
  CUevent filled;
  CUdeviceptr out[REC_ITERS];
} pair_t;

static pair_t pairs[NT / 2];

typedef struct pair_arg {
  pair_t *pr;
  int comm_side;
} pair_arg_t;

static void *record_pair(void *arg) {
  pair_arg_t *a = arg;
  pair_t *pr = a->pr;
  on_device(pr->dev);
  CUstream compute = streams[pr->dev][pr->t], cs = comm[pr->dev][pr->t];
  for (unsigned it = 0; it < REC_ITERS; it++) {
    if (!a->comm_side) {
      pr->n = (size_t)(1 + (it % 5)) * 16 * 1024;
      pr->v = ((unsigned)pr->t << 24) | (it + 1);
      pr->p = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)pr->n, pr->dev, compute);
      CHECK(pr->p != 0, "alloc p: %s", t_error());
      if (pr->p != 0) CHECK(d_memset(pr->p, pr->v, pr->n / 4, compute) == CUDA_SUCCESS, "memset p");
      CHECK(d_event_record(pr->filled, compute) == CUDA_SUCCESS, "event record");
    }
    pthread_barrier_wait(&pr->b); /* p is made */
    if (a->comm_side && pr->p != 0) {
      CUdeviceptr o = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)pr->n, pr->dev, cs);
      CHECK(o != 0, "alloc out: %s", t_error());
      pr->out[it] = o;
      CHECK(d_wait_event(cs, pr->filled, 0) == CUDA_SUCCESS, "wait event");
      if (o != 0) CHECK(d_copy(o, pr->p, pr->n, cs) == CUDA_SUCCESS, "copy out");
      t_record((void *)(uintptr_t)pr->p, cs);
    }
    pthread_barrier_wait(&pr->b); /* recorded */
    if (!a->comm_side && pr->p != 0) {
      t_free((void *)(uintptr_t)pr->p, (ssize_t)pr->n, pr->dev, compute);
      CUdeviceptr q = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)pr->n, pr->dev, compute);
      CHECK(q != 0, "alloc q: %s", t_error());
      if (q != 0) {
        CHECK(d_memset(q, 0xABCD0000u | it, pr->n / 4, compute) == CUDA_SUCCESS, "memset q");
        t_free((void *)(uintptr_t)q, (ssize_t)pr->n, pr->dev, compute);
      }
    }
    if (a->comm_side && pr->out[it] != 0) {
      CHECK(d_sync(cs) == CUDA_SUCCESS, "sync comm");
      expect_filled(pr->out[it], pr->n, pr->v, "what the recorded stream copied");
    }
    size_t out_n = pr->n; /* the next iteration changes p, n and v */
    pthread_barrier_wait(&pr->b);
    if (a->comm_side && pr->out[it] != 0) {
      t_free((void *)(uintptr_t)pr->out[it], (ssize_t)out_n, pr->dev, cs);
      pr->out[it] = 0;
    }
  }
  return NULL;
}

static void run_record_pairs(bool across_devices) {
  reset_errors();
  uint64_t live0 = stat_all("live_bytes"), fails0 = stat_all("free_failures"), rec0 = stat_on(0, "streams_recorded");
  pair_arg_t args[NT];
  for (int k = 0; k < NT / 2; k++) {
    pair_t *pr = &pairs[k];
    memset(pr, 0, sizeof *pr);
    pr->t = k;
    pr->dev = across_devices ? 0 : k % n_dev;
    on_device(pr->dev);
    assert_int_equal(d_event_create(&pr->filled, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(pthread_barrier_init(&pr->b, NULL, 2), 0);
    args[2 * k] = (pair_arg_t){pr, 0};
    args[2 * k + 1] = (pair_arg_t){pr, 1};
  }
  on_device(0);
  run_threads(NT, record_pair, args, sizeof args[0]);
  for (int k = 0; k < NT / 2; k++) pthread_barrier_destroy(&pairs[k].b);
  check_errors();
  sync_devices();
  assert_int_equal(stat_on(0, "streams_recorded") - rec0, (uint64_t)(NT / 2) * REC_ITERS);
  assert_int_equal(stat_all("free_failures"), fails0);
  assert_int_equal(stat_all("frees_pending"), 0);
  assert_int_equal(stat_all("live_bytes"), live0);
  check_races();
}

static void test_record_stream_on_one_thread_free_on_another(void **state) {
  (void)state;
  run_record_pairs(false);
}

/* ---- empty_cache while others allocate --------------------------------------------------------
 * torch.cuda.empty_cache() on one thread while NT - 1 others allocate (sizes that need new
 * chunks), fill, copy and free on their own streams: the trim gives back only what no live
 * tensor holds, and the cache the others use stays sound. */
static atomic_int workers_left;

static void *alloc_steps(void *arg) {
  worker_t *w = arg;
  on_device(w->dev);
  CUstream s = streams[w->dev][w->t];
  for (unsigned step = 0; step < 40; step++) {
    size_t n = (size_t)(1 + (step * 3 + (unsigned)w->t) % 11) * 512 * 1024; /* up to 5.5 MiB */
    unsigned v = ((unsigned)w->t << 16) | step;
    CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, w->dev, s);
    CUdeviceptr y = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, w->dev, s);
    CHECK(x != 0 && y != 0, "thread %d: alloc: %s", w->t, t_error());
    if (x == 0 || y == 0) break;
    CHECK(d_memset(x, v, n / 4, s) == CUDA_SUCCESS, "memset");
    CHECK(d_copy(y, x, n, s) == CUDA_SUCCESS, "copy");
    t_free((void *)(uintptr_t)x, (ssize_t)n, w->dev, s);
    CHECK(d_sync(s) == CUDA_SUCCESS, "sync");
    expect_filled(y, n, v, "a tensor while empty_cache runs");
    t_free((void *)(uintptr_t)y, (ssize_t)n, w->dev, s);
  }
  atomic_fetch_sub(&workers_left, 1);
  return NULL;
}

static void *empty_cache_loop(void *arg) {
  worker_t *w = arg;
  on_device(w->dev);
  unsigned calls = 0;
  while (atomic_load(&workers_left) > 0 || calls == 0) {
    t_empty();
    calls++;
    expect_context(ctx_of[w->dev], "empty_cache");
  }
  return NULL;
}

/* One thread, no timing: a big tensor x on stream A, then a declared use on A that another
 * stream B waits for (weft records A's event then), then an undeclared fill of x on A (PyTorch's
 * kernels), x freed on A, and the same size allocated on B and filled there. */
static void test_reuse_on_another_stream_after_an_undeclared_fill(void **state) {
  (void)state;
  int (*use_begin)(int, CUstream, const uint64_t *, size_t, const uint64_t *, size_t);
  int (*use_end)(int, CUstream, const uint64_t *, size_t, const uint64_t *, size_t);
  void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  assert_non_null(lib);
  SYM(use_begin, lib, "weft_torch_use_begin");
  SYM(use_end, lib, "weft_torch_use_end");
  uint64_t live0 = stat_on(0, "live_bytes");
  CUstream a = comm[0][NT - 1], b = comm[0][NT - 2];
  const size_t n = (size_t)5 << 20;
  for (unsigned k = 0; k < 3; k++) {
    CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, a);
    CUdeviceptr y = (CUdeviceptr)(uintptr_t)t_alloc(4096, 0, a);
    assert_true(x != 0 && y != 0);
    uint64_t yy = y;
    assert_int_equal(use_begin(0, a, NULL, 0, &yy, 1), 0);
    assert_int_equal(d_memset(y, 1, 1024, a), CUDA_SUCCESS);
    assert_int_equal(use_end(0, a, NULL, 0, &yy, 1), 0);
    assert_int_equal(use_begin(0, b, &yy, 1, NULL, 0), 0); /* b waits for a's use */
    assert_int_equal(use_end(0, b, &yy, 1, NULL, 0), 0);
    assert_int_equal(d_memset(x, 7, n / 4, a), CUDA_SUCCESS); /* undeclared, as PyTorch's kernels */
    t_free((void *)(uintptr_t)x, (ssize_t)n, 0, a);
    CUdeviceptr x2 = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, b);
    assert_true(x2 != 0);
    assert_int_equal(d_memset(x2, 9, n / 4, b), CUDA_SUCCESS);
    t_free((void *)(uintptr_t)x2, (ssize_t)n, 0, b);
    t_free((void *)(uintptr_t)y, 4096, 0, a);
  }
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_on(0, "live_bytes"), live0);
  check_races();
}

static void *alloc_or_empty(void *arg) {
  worker_t *w = arg;
  return w->t == NT - 1 ? empty_cache_loop(arg) : alloc_steps(arg);
}

static void test_empty_cache_while_others_allocate(void **state) {
  (void)state;
  reset_errors();
  uint64_t live0 = stat_all("live_bytes"), fails0 = stat_all("free_failures"), afails0 = stat_all("alloc_failures");
  atomic_store(&workers_left, NT - 1);
  worker_t w[NT];
  for (int t = 0; t < NT; t++) w[t] = (worker_t){t, t % n_dev};
  run_threads(NT, alloc_or_empty, w, sizeof w[0]);
  check_errors();
  sync_devices();
  t_empty();
  assert_int_equal(stat_all("cached_bytes"), 0);
  assert_int_equal(stat_all("free_failures"), fails0);
  assert_int_equal(stat_all("alloc_failures"), afails0);
  assert_int_equal(stat_all("live_bytes"), live0);
  check_races();
}

/* ---- a capture on one thread, eager work on others --------------------------------------------
 * torch.cuda.graph on one thread (a THREAD_LOCAL or RELAXED capture, begun outside weft, on a
 * non-blocking side stream of device 0) while the other threads allocate, fill, copy, free and
 * synchronise eagerly on their own streams, and one of them calls empty_cache. The eager work
 * must run (values read back), nothing may fail, the capture must end valid and its graph
 * replay right; its memory is kept until the graph is gone. */
static pthread_barrier_t cap_barrier;
static CUstreamCaptureMode cap_mode;
static CUstream cap_stream;
static bool cap_empty_cache; /* one of the eager threads calls empty_cache meanwhile */

typedef struct capture_result {
  CUresult end;
  CUgraph g;
  CUdeviceptr in, out;
  size_t n;
} capture_result_t;

static capture_result_t cap_res;

static void *capture_or_eager(void *arg) {
  worker_t *w = arg;
  if (w->t == 0) {
    on_device(0);
    capture_result_t *c = &cap_res;
    CUstream cs = cap_stream;
    CHECK(d_begin(cs, cap_mode) == CUDA_SUCCESS, "begin capture");
    CUdeviceptr tmp = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)c->n, 0, cs);
    CHECK(tmp != 0, "alloc inside the capture: %s", t_error());
    CUresult r;
    if (tmp != 0) CHECK((r = d_copy(tmp, c->in, c->n, cs)) == CUDA_SUCCESS, "captured copy before the others: %d", (int)r);
    c->out = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)c->n, 0, cs);
    CHECK(c->out != 0, "alloc inside the capture: %s", t_error());
    /* A model's worth of captured steps: some before the others start, some while they work. */
    bool started = false;
    for (unsigned k = 0; k < 100 && tmp != 0 && c->out != 0; k++) {
      if (k == 60) { /* the others work while the capture is open */
        pthread_barrier_wait(&cap_barrier);
        started = true;
      }
      CUdeviceptr t2 = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)c->n, 0, cs);
      CHECK(t2 != 0, "alloc inside the capture: %s", t_error());
      if (t2 == 0) break;
      CHECK((r = d_copy(t2, tmp, c->n, cs)) == CUDA_SUCCESS, "captured copy %u: %d", k, (int)r);
      t_free((void *)(uintptr_t)tmp, (ssize_t)c->n, 0, cs);
      tmp = t2;
    }
    if (tmp != 0 && c->out != 0) CHECK((r = d_copy(c->out, tmp, c->n, cs)) == CUDA_SUCCESS, "captured copy out: %d", (int)r);
    if (tmp != 0) t_free((void *)(uintptr_t)tmp, (ssize_t)c->n, 0, cs);
    if (!started) pthread_barrier_wait(&cap_barrier); /* the loop ended early */
    pthread_barrier_wait(&cap_barrier); /* the others are done */
    c->end = d_end(cs, &c->g);
    return NULL;
  }
  pthread_barrier_wait(&cap_barrier);
  if (w->t == NT - 1 && cap_empty_cache) {
    on_device(w->dev);
    for (int k = 0; k < 20; k++) t_empty();
  } else {
    atomic_store(&workers_left, 1);
    alloc_steps(arg);
  }
  pthread_barrier_wait(&cap_barrier);
  return NULL;
}

static void run_capture_beside_eager_threads(CUstreamCaptureMode mode, bool empty_cache) {
  reset_errors();
  cap_empty_cache = empty_cache;
  uint64_t live0 = stat_all("live_bytes"), fails0 = stat_all("free_failures"), afails0 = stat_all("alloc_failures");
  uint64_t pools0 = stat_on(0, "graph_pools");
  cap_mode = mode;
  if (cap_stream == NULL) assert_int_equal(d_stream_create(&cap_stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  memset(&cap_res, 0, sizeof cap_res);
  cap_res.n = 64 * 1024;
  cap_res.in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)cap_res.n, 0, cap_stream);
  assert_true(cap_res.in != 0);
  assert_int_equal(d_memset(cap_res.in, 5, cap_res.n / 4, cap_stream), CUDA_SUCCESS);
  assert_int_equal(d_sync(cap_stream), CUDA_SUCCESS);
  /* Warm-up work on the capture's stream just before the capture (as torch.cuda.graph's warm-up
   * iterations): tensors freed there, their reuse not yet known complete to the host. */
  for (unsigned i = 0; i < 8; i++) {
    size_t n = (size_t)(1 + i) * 512 * 1024;
    CUdeviceptr pre = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cap_stream);
    assert_true(pre != 0);
    assert_int_equal(d_memset(pre, i, n / 4, cap_stream), CUDA_SUCCESS);
    t_free((void *)(uintptr_t)pre, (ssize_t)n, 0, cap_stream);
  }
  assert_int_equal(pthread_barrier_init(&cap_barrier, NULL, NT), 0);
  worker_t w[NT];
  for (int t = 0; t < NT; t++) w[t] = (worker_t){t, t % n_dev};
  run_threads(NT, capture_or_eager, w, sizeof w[0]);
  pthread_barrier_destroy(&cap_barrier);
  check_errors();
  on_device(0);
  if (cap_res.end != CUDA_SUCCESS) fail_msg("the capture ended with CUresult %d", (int)cap_res.end);
  assert_int_equal(stat_on(0, "graph_pools"), pools0 + 1);
  CUgraphExec x;
  assert_int_equal(d_inst(&x, cap_res.g, 0), CUDA_SUCCESS);
  for (unsigned r = 0; r < 3; r++) {
    assert_int_equal(d_memset(cap_res.in, 100 + r, cap_res.n / 4, cap_stream), CUDA_SUCCESS);
    assert_int_equal(d_launch(x, cap_stream), CUDA_SUCCESS);
    assert_int_equal(d_sync(cap_stream), CUDA_SUCCESS);
    expect_filled(cap_res.out, cap_res.n, 100 + r, "the graph's output");
  }
  check_errors();
  t_free((void *)(uintptr_t)cap_res.out, (ssize_t)cap_res.n, 0, cap_stream); /* the graph's */
  assert_int_equal(d_exec_destroy(x), CUDA_SUCCESS);
  assert_int_equal(d_graph_destroy(cap_res.g), CUDA_SUCCESS);
  assert_int_equal(t_release(0), 1);
  t_free((void *)(uintptr_t)cap_res.in, (ssize_t)cap_res.n, 0, cap_stream);
  sync_devices();
  assert_int_equal(stat_all("free_failures"), fails0);
  assert_int_equal(stat_all("alloc_failures"), afails0);
  assert_int_equal(stat_all("frees_pending"), 0);
  assert_int_equal(stat_all("live_bytes"), live0);
  check_races();
}

static void test_thread_local_capture_beside_eager_threads(void **state) {
  (void)state;
  run_capture_beside_eager_threads(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, false);
}

/* The same, and one of the eager threads calls torch.cuda.empty_cache() while the capture is
 * open (its trim must leave the capture alone: PyTorch's empty_cache may come from any thread). */
static void test_empty_cache_beside_a_thread_local_capture(void **state) {
  (void)state;
  run_capture_beside_eager_threads(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, true);
}

static void test_relaxed_capture_beside_eager_threads(void **state) {
  (void)state;
  run_capture_beside_eager_threads(CU_STREAM_CAPTURE_MODE_RELAXED, false);
}

/* ---- 2 devices: a stream of device 1 recorded for a tensor of device 0 -----------------------
 * tensor.record_stream with a stream of another device (a peer copy on device 1's stream reads a
 * device-0 tensor; PyTorch's allocator records its event on that stream under a device guard):
 * the free must order the reuse after that copy, and nothing may fail or leak. Pairs of threads
 * as above, the communication thread on device 1. */
static void *record_pair_across(void *arg) {
  pair_arg_t *a = arg;
  pair_t *pr = a->pr;
  int dev = a->comm_side ? 1 : 0;
  on_device(dev);
  CUstream compute = streams[0][pr->t], cs = comm[1][pr->t];
  for (unsigned it = 0; it < REC_ITERS; it++) {
    if (!a->comm_side) {
      pr->n = (size_t)(1 + (it % 5)) * 16 * 1024;
      pr->v = ((unsigned)pr->t << 24) | (it + 1);
      pr->p = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)pr->n, 0, compute);
      CHECK(pr->p != 0, "alloc p: %s", t_error());
      if (pr->p != 0) CHECK(d_memset(pr->p, pr->v, pr->n / 4, compute) == CUDA_SUCCESS, "memset p");
      CHECK(d_event_record(pr->filled, compute) == CUDA_SUCCESS, "event record");
    }
    pthread_barrier_wait(&pr->b);
    if (a->comm_side && pr->p != 0) {
      CUdeviceptr o = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)pr->n, 1, cs);
      CHECK(o != 0, "alloc out on device 1: %s", t_error());
      pr->out[it] = o;
      CHECK(d_wait_event(cs, pr->filled, 0) == CUDA_SUCCESS, "wait event");
      CUresult r;
      if (o != 0) CHECK((r = d_copy_peer(o, ctx_of[1], pr->p, ctx_of[0], pr->n, cs)) == CUDA_SUCCESS, "peer copy: %d", (int)r);
      t_record((void *)(uintptr_t)pr->p, cs);
    }
    pthread_barrier_wait(&pr->b);
    if (!a->comm_side && pr->p != 0) {
      uint64_t f0 = stat_on(0, "free_failures");
      t_free((void *)(uintptr_t)pr->p, (ssize_t)pr->n, 0, compute);
      CHECK(stat_on(0, "free_failures") == f0, "free of a tensor recorded on device 1's stream: %s", t_error());
      CUdeviceptr q = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)pr->n, 0, compute);
      CHECK(q != 0, "alloc q: %s", t_error());
      if (q != 0) {
        CHECK(d_memset(q, 0xABCD0000u | it, pr->n / 4, compute) == CUDA_SUCCESS, "memset q");
        t_free((void *)(uintptr_t)q, (ssize_t)pr->n, 0, compute);
      }
    }
    if (a->comm_side && pr->out[it] != 0) {
      CHECK(d_sync(cs) == CUDA_SUCCESS, "sync comm");
      expect_filled(pr->out[it], pr->n, pr->v, "what device 1's recorded stream copied");
    }
    size_t out_n = pr->n; /* the next iteration changes p, n and v */
    pthread_barrier_wait(&pr->b);
    if (a->comm_side && pr->out[it] != 0) {
      t_free((void *)(uintptr_t)pr->out[it], (ssize_t)out_n, 1, cs);
      pr->out[it] = 0;
    }
  }
  return NULL;
}

static void test_record_stream_of_another_device(void **state) {
  (void)state;
  if (n_dev < 2) skip();
  reset_errors();
  uint64_t live0 = stat_all("live_bytes"), fails0 = stat_all("free_failures");
  pair_arg_t args[NT];
  for (int k = 0; k < NT / 2; k++) {
    pair_t *pr = &pairs[k];
    memset(pr, 0, sizeof *pr);
    pr->t = k;
    pr->dev = 0;
    on_device(0);
    assert_int_equal(d_event_create(&pr->filled, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(pthread_barrier_init(&pr->b, NULL, 2), 0);
    args[2 * k] = (pair_arg_t){pr, 0};
    args[2 * k + 1] = (pair_arg_t){pr, 1};
  }
  run_threads(NT, record_pair_across, args, sizeof args[0]);
  for (int k = 0; k < NT / 2; k++) pthread_barrier_destroy(&pairs[k].b);
  check_errors();
  sync_devices();
  void *nudge = t_alloc(256, 0, NULL); /* makes any kept free again */
  assert_non_null(nudge);
  t_free(nudge, 256, 0, NULL);
  assert_int_equal(stat_all("free_failures"), fails0);
  assert_int_equal(stat_all("frees_pending"), 0);
  assert_int_equal(stat_all("live_bytes"), live0);
  check_races();
}

/* ---- the pair's counts, thread by thread ------------------------------------------------------
 * adapter_allocs and adapter_frees are kept per thread (weft_torch.c, "the pair's counts"): NT
 * threads make pairs and leave one by one (each its own number of pairs) while this thread reads
 * the counts, which never go back; each thread also leaves one tensor to a thread-exit destructor
 * of a key made after the adapter's, which frees it once the adapter's own exit has run for the
 * thread (PyTorch frees tensors held in thread-locals so). Every count is there after the joins:
 * none lost with the records of threads that left, none with a count made after a record was
 * given back. Under tsan: the reads race with no count. */
#define COUNT_PAIRS 300
static pthread_key_t late_key;
static _Atomic int counters_running;

static void late_free(void *p) {
  on_device(0);
  t_free(p, 4096, 0, NULL);
}

static void *count_pairs(void *arg) {
  int t = *(const int *)arg;
  on_device(0);
  for (int i = 0; i < COUNT_PAIRS * (t + 1); i++) {
    void *p = t_alloc(256 + 256 * (i % 4), 0, NULL);
    CHECK(p != NULL, "thread %d: alloc %d failed: %s", t, i, t_error());
    if (p != NULL) t_free(p, 256 + 256 * (i % 4), 0, NULL);
  }
  void *kept = t_alloc(4096, 0, NULL);
  CHECK(kept != NULL, "thread %d: the kept tensor's alloc failed: %s", t, t_error());
  if (kept != NULL) CHECK(pthread_setspecific(late_key, kept) == 0, "pthread_setspecific");
  atomic_fetch_sub(&counters_running, 1);
  return NULL;
}

static void test_counts_of_threads_that_left(void **state) {
  (void)state;
  reset_errors();
  void *first = t_alloc(256, 0, NULL); /* the adapter's key exists before late_key */
  assert_non_null(first);
  t_free(first, 256, 0, NULL);
  assert_int_equal(pthread_key_create(&late_key, late_free), 0);
  uint64_t allocs0 = stat_on(0, "adapter_allocs"), frees0 = stat_on(0, "adapter_frees");
  uint64_t live0 = stat_on(0, "live_bytes"), fails0 = stat_on(0, "free_failures");
  int ids[NT];
  pthread_t th[NT];
  atomic_store(&counters_running, NT);
  for (int t = 0; t < NT; t++) {
    ids[t] = t;
    assert_int_equal(pthread_create(&th[t], NULL, count_pairs, &ids[t]), 0);
  }
  uint64_t last_allocs = allocs0, last_frees = frees0, reads = 0;
  while (atomic_load(&counters_running) > 0) {
    uint64_t a = stat_on(0, "adapter_allocs"), f = stat_on(0, "adapter_frees");
    if (a < last_allocs || f < last_frees)
      fail_msg("the counts went back: allocs %llu after %llu, frees %llu after %llu", (unsigned long long)a,
               (unsigned long long)last_allocs, (unsigned long long)f, (unsigned long long)last_frees);
    last_allocs = a;
    last_frees = f;
    reads++;
  }
  for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
  check_errors();
  assert_int_equal(pthread_key_delete(late_key), 0);
  uint64_t pairs = 0;
  for (int t = 0; t < NT; t++) pairs += (uint64_t)COUNT_PAIRS * (uint64_t)(t + 1);
  assert_true(reads > 0);
  assert_int_equal(stat_on(0, "adapter_allocs") - allocs0, pairs + NT);
  assert_int_equal(stat_on(0, "adapter_frees") - frees0, pairs + NT); /* the kept tensors: freed at the exits */
  sync_devices();
  assert_int_equal(stat_on(0, "free_failures"), fails0);
  assert_int_equal(stat_on(0, "live_bytes"), live0);
  check_races();
}

int main(int argc, char **argv) {
  harness_args(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_tensors_freed_by_the_autograd_thread, setup),
      cmocka_unit_test_setup(test_threads_share_the_legacy_stream, setup),
      cmocka_unit_test_setup(test_record_stream_on_one_thread_free_on_another, setup),
      cmocka_unit_test_setup(test_record_stream_of_another_device, setup),
      cmocka_unit_test_setup(test_reuse_on_another_stream_after_an_undeclared_fill, setup),
      /* After the cases above: the pool's state they leave made the bugs these found (a free's
       * point before work outside weft; an adopted stream's pending point recorded into an
       * outside capture) show more often. */
      cmocka_unit_test_setup(test_empty_cache_while_others_allocate, setup),
      cmocka_unit_test_setup(test_thread_local_capture_beside_eager_threads, setup),
      cmocka_unit_test_setup(test_relaxed_capture_beside_eager_threads, setup),
      cmocka_unit_test_setup(test_empty_cache_beside_a_thread_local_capture, setup),
      cmocka_unit_test_setup(test_counts_of_threads_that_left, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
