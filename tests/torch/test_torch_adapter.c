/* libweft_torch.so called exactly as PyTorch calls a CUDAPluggableAllocator (issue 13), with no
 * PyTorch and no GPU: the program dlopens the library (as torch.cuda.memory does), reaches the
 * driver weft loaded through weft_driver_symbol (the simulator in CI, with its race oracle; a GPU
 * when staged there), and plays PyTorch's part with driver calls:
 *   - eager steps on the legacy NULL stream: alloc, kernels (memset / copy), free, 0-byte allocs;
 *   - a side stream that prefetches: its tensors declared with weft_torch_use_*, freed on the
 *     stream they were allocated on, with no record_stream;
 *   - frees from other threads;
 *   - a GLOBAL capture begun on a raw stream (torch.cuda.graph), allocs and frees inside, the
 *     capture must end valid, the graph replays, its static output keeps its address and values,
 *     and its memory is kept until the graph is gone.
 * Checks: values read back, 0 races (simulator), no leak (live bytes back to 0, every alloc
 * freed), the adapter's stats. */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <cmocka.h>

#include "tests/torch/harness.h"

static CUcontext ctx_dev0; /* device 0's primary context */

/* The adapter and the driver (harness.h). PyTorch's CUDA runtime makes device 0's primary context
 * current on this thread before its first allocation; the adapter leaves the current context as
 * it found it. */
static void load(void) {
  harness_resolve();
  ctx_dev0 = harness_primary(0);
  if (d_set_cur(ctx_dev0) != CUDA_SUCCESS) fail_msg("cannot make device 0's primary context current");
  void *p = t_alloc(256, 0, NULL); /* the first allocation makes the runtime */
  if (p == NULL) fail_msg("first alloc: %s", t_error());
  t_free(p, 256, 0, NULL);
}

static uint64_t stat_of(const char *key) { return harness_stat(0, key); }

static unsigned word(CUdeviceptr p) {
  unsigned v = 0;
  assert_int_equal(d_dtoh(&v, p, 4), CUDA_SUCCESS);
  return v;
}

/* A new stream. Never destroyed: the adapter adopts every stream it sees for the life of its
 * runtime (weft_stream_adopt: keep the stream alive while weft may use it), as PyTorch's pooled
 * streams are; weft_torch_empty_cache gives back what every adopted stream caches. */
static CUstream new_stream(void) {
  CUstream s;
  assert_int_equal(d_stream_create(&s, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  return s;
}

static int setup(void **state) {
  (void)state;
  if (t_alloc == NULL) load();
  if (sim) sim->reset_races();
  return 0;
}

#define MB (1u << 20)

/* Eager steps on the legacy stream, as a training loop without streams does. */
static void test_eager_steps_on_the_legacy_stream(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  for (unsigned step = 0; step < 50; step++) {
    size_t n = (size_t)(1 + step % 7) * 4096;
    CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
    CUdeviceptr y = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
    assert_true(x != 0 && y != 0);
    assert_null(t_alloc(0, 0, NULL)); /* PyTorch asks for 0 bytes: NULL, not a failure */
    assert_int_equal(d_memset(x, step, n / 4, NULL), CUDA_SUCCESS);
    assert_int_equal(d_copy(y, x, n, NULL), CUDA_SUCCESS);
    t_free((void *)(uintptr_t)x, (ssize_t)n, 0, NULL); /* reused at once by the next step */
    assert_int_equal(d_sync(NULL), CUDA_SUCCESS);
    assert_int_equal(word(y), step);
    t_free((void *)(uintptr_t)y, (ssize_t)n, 0, NULL);
  }
  assert_int_equal(stat_of("live_bytes"), live0);
  assert_int_equal(stat_of("free_failures"), 0);
  assert_int_equal(stat_of("alloc_failures"), 0);
  assert_true(stat_of("zero_byte_allocs") >= 50);
  check_races();
}

/* A side stream prefetches the next batch (allocated there); the main (legacy) stream consumes
 * it under weft_torch_use_begin/end, and the batch is freed on the side stream it came from: the
 * free waits for the declared read, so the next prefetch may reuse the memory: no record_stream. */
static void test_side_stream_prefetch_without_record_stream(void **state) {
  (void)state;
  CUstream side = new_stream();
  uint64_t live0 = stat_of("live_bytes"), waits0 = stat_of("waits_issued");
  const size_t n = MB;
  CUdeviceptr acc = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  for (unsigned step = 0; step < 30; step++) {
    CUdeviceptr batch = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, side);
    assert_true(batch != 0);
    uint64_t b = batch, a = acc;
    assert_int_equal(t_use_begin(0, side, NULL, 0, &b, 1), 0);
    assert_int_equal(d_memset(batch, 1000 + step, n / 4, side), CUDA_SUCCESS);
    assert_int_equal(t_use_end(0, side, NULL, 0, &b, 1), 0);
    assert_int_equal(t_use_begin(0, NULL, &b, 1, &a, 1), 0); /* the main stream waits for the prefetch */
    assert_int_equal(d_copy(acc, batch, n, NULL), CUDA_SUCCESS);
    assert_int_equal(t_use_end(0, NULL, &b, 1, &a, 1), 0);
    t_free((void *)(uintptr_t)batch, (ssize_t)n, 0, side); /* on its own stream, after the main stream's read */
  }
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(word(acc), 1029);
  assert_true(stat_of("waits_issued") > waits0);
  t_free((void *)(uintptr_t)acc, (ssize_t)n, 0, NULL);
  assert_int_equal(stat_of("live_bytes"), live0);
  assert_int_equal(stat_of("free_failures"), 0);
  check_races();
}

typedef struct batch_of_frees {
  CUdeviceptr p[32];
  CUstream s;
} batch_of_frees_t;

static void *free_all(void *arg) {
  batch_of_frees_t *b = arg;
  for (int i = 0; i < 32; i++) t_free((void *)(uintptr_t)b->p[i], 0, 0, b->s);
  return NULL;
}

/* Tensors die on whatever thread drops the last reference. */
static void test_frees_from_other_threads(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  CUstream raw = new_stream();
  batch_of_frees_t b[4];
  for (int t = 0; t < 4; t++) {
    b[t].s = t % 2 ? raw : NULL;
    for (int i = 0; i < 32; i++) {
      size_t n = 512u * (unsigned)(i + 1);
      b[t].p[i] = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, b[t].s);
      assert_true(b[t].p[i] != 0);
      assert_int_equal(d_memset(b[t].p[i], (unsigned)i, n / 4, b[t].s), CUDA_SUCCESS);
    }
  }
  pthread_t th[4];
  for (int t = 0; t < 4; t++) assert_int_equal(pthread_create(&th[t], NULL, free_all, &b[t]), 0);
  for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  assert_int_equal(stat_of("free_failures"), 0);
  check_races();
}

/* One step of another thread: free p, or allocate n bytes (*p gets the pointer), on stream s. */
typedef struct other_step {
  CUdeviceptr *p;
  size_t n;
  CUstream s;
  int alloc;
} other_step_t;

static void *other_step(void *arg) {
  other_step_t *o = arg;
  if (o->alloc) *o->p = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)o->n, 0, o->s);
  else t_free((void *)(uintptr_t)*o->p, (ssize_t)o->n, 0, o->s);
  return NULL;
}

static void on_other_thread(CUdeviceptr *p, size_t n, CUstream s, int alloc) {
  other_step_t o = {p, n, s, alloc};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, other_step, &o), 0);
  pthread_join(th, NULL);
}

/* A thread remembers the blocks it allocated, to free them without the address lookup; the
 * memory may meanwhile have been freed and handed out again elsewhere. This thread allocates p;
 * another frees it and allocates the same size on the same stream (the stream cache gives p back
 * as a new block); this thread's free of p then frees that new block (PyTorch frees by pointer).
 * Both on the legacy stream and on a side stream. */
static void test_a_pointer_reallocated_elsewhere_frees_the_new_block(void **state) {
  (void)state;
  CUstream side = new_stream();
  for (int k = 0; k < 2; k++) {
    CUstream s = k ? side : NULL;
    const size_t n = 3 * 4096;
    uint64_t live0 = stat_of("live_bytes"), frees0 = stat_of("adapter_frees"), fail0 = stat_of("free_failures");
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, s);
    assert_true(p != 0);
    CUdeviceptr q = p;
    on_other_thread(&q, n, s, 0); /* freed there */
    q = 0;
    on_other_thread(&q, n, s, 1); /* allocated there: the same memory again */
    if (q != p) skip();          /* the cache did not hand p back: nothing of this to check */
    assert_int_equal(d_memset(q, 77, n / 4, s), CUDA_SUCCESS);
    assert_int_equal(stat_of("live_bytes"), live0 + n);
    t_free((void *)(uintptr_t)p, (ssize_t)n, 0, s); /* this thread's old entry names a freed block */
    assert_int_equal(stat_of("live_bytes"), live0);
    assert_int_equal(stat_of("adapter_frees"), frees0 + 2);
    assert_int_equal(stat_of("free_failures"), fail0);
  }
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  check_races();
}

/* PyTorch hands out streams from a pool (32 per priority and device) and programs use several:
 * the adapter adopts each one it sees. Twelve side streams beside the legacy stream, each
 * allocating and freeing, must all work (the adapter leaves weft's own pool streams few and
 * gives the device's lanes to adoptions; first in the list, so no earlier case took slots). */
static void test_a_program_with_many_streams(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  CUstream ss[12];
  CUdeviceptr p[12];
  for (unsigned i = 0; i < 12; i++) {
    ss[i] = new_stream();
    p[i] = (CUdeviceptr)(uintptr_t)t_alloc(4096, 0, ss[i]);
    if (p[i] == 0) fail_msg("stream %u: %s", i, t_error());
    assert_int_equal(d_memset(p[i], i, 1024, ss[i]), CUDA_SUCCESS);
  }
  for (unsigned i = 0; i < 12; i++) {
    assert_int_equal(d_sync(ss[i]), CUDA_SUCCESS);
    assert_int_equal(word(p[i]), i);
    t_free((void *)(uintptr_t)p[i], 4096, 0, ss[i]);
  }
  assert_int_equal(stat_of("free_failures"), 0);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* PyTorch frees a tensor wherever its last reference dies, whatever device is current there (the
 * deleter gets the tensor's device as an argument), and keeps its own idea of the current device:
 * the adapter must leave the thread's current context as it found it, or PyTorch's next kernel
 * runs on another device than it thinks. A tensor of device 1 is allocated with device 1 current
 * (PyTorch's guard), then freed, and another allocated, with device 0 current. Needs 2 devices
 * (the simulator's: test_torch_adapter_2). */
static void test_calls_for_another_device_leave_the_current_context(void **state) {
  (void)state;
  int count = 0;
  CUresult (*dev_count)(int *);
  CUresult (*dev_get)(CUdevice *, int);
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*release)(CUdevice);
  CUresult (*get_cur)(CUcontext *);
  CUresult (*set_cur)(CUcontext);
  DRV(dev_count, "cuDeviceGetCount");
  DRV(dev_get, "cuDeviceGet");
  DRV(retain, "cuDevicePrimaryCtxRetain");
  DRV(release, "cuDevicePrimaryCtxRelease_v2");
  DRV(get_cur, "cuCtxGetCurrent");
  DRV(set_cur, "cuCtxSetCurrent");
  assert_int_equal(dev_count(&count), CUDA_SUCCESS);
  if (count < 2) skip();
  CUdevice d0, d1;
  CUcontext c0, c1, was, cur = NULL;
  assert_int_equal(get_cur(&was), CUDA_SUCCESS);
  assert_int_equal(dev_get(&d0, 0), CUDA_SUCCESS);
  assert_int_equal(dev_get(&d1, 1), CUDA_SUCCESS);
  assert_int_equal(retain(&c0, d0), CUDA_SUCCESS);
  assert_int_equal(retain(&c1, d1), CUDA_SUCCESS);
  assert_int_equal(set_cur(c1), CUDA_SUCCESS);
  void *p = t_alloc(4096, 1, NULL);
  if (p == NULL) fail_msg("alloc on device 1: %s", t_error());
  assert_int_equal(get_cur(&cur), CUDA_SUCCESS);
  assert_ptr_equal(cur, c1);
  assert_int_equal(set_cur(c0), CUDA_SUCCESS);
  t_free(p, 4096, 1, NULL); /* the last reference dies where device 0 is current */
  assert_int_equal(get_cur(&cur), CUDA_SUCCESS);
  assert_ptr_equal(cur, c0);
  void *q = t_alloc(4096, 1, NULL);
  assert_non_null(q);
  assert_int_equal(get_cur(&cur), CUDA_SUCCESS);
  assert_ptr_equal(cur, c0);
  t_free(q, 4096, 1, NULL);
  assert_int_equal(get_cur(&cur), CUDA_SUCCESS);
  assert_ptr_equal(cur, c0);
  assert_int_equal(set_cur(was), CUDA_SUCCESS);
  assert_int_equal(release(d0), CUDA_SUCCESS);
  assert_int_equal(release(d1), CUDA_SUCCESS);
}

/* tensor.record_stream(s) (PyTorch's ProcessGroupNCCL does it for every collective's tensors):
 * work on s that weft does not see uses the memory, enqueued before or after the call, until the
 * free. The free must not let the memory be reused before that work is done: here a raw copy on
 * `comm` reads the block (as NCCL's kernel would), the block is freed on its own stream and the
 * same size allocated there again at once (the same memory, from the stream's cache) and
 * overwritten. The race oracle must see no race and the copy must read the old values. */
static void test_record_stream_orders_the_reuse(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  const size_t n = 256 * 1024;
  CUstream side = new_stream(), comm = new_stream();
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, side);
  CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, comm);
  assert_true(p != 0 && x != 0);
  assert_int_equal(d_memset(p, 11, n / 4, side), CUDA_SUCCESS);
  assert_int_equal(d_sync(side), CUDA_SUCCESS);
  t_record((void *)(uintptr_t)p, comm);                  /* before the work, as ProcessGroupNCCL */
  assert_int_equal(d_copy(x, p, n, comm), CUDA_SUCCESS); /* work weft does not see reads p */
  t_free((void *)(uintptr_t)p, (ssize_t)n, 0, side);
  CUdeviceptr q = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, side);
  assert_int_equal(q, p); /* premise: the same memory again, on the same stream */
  assert_int_equal(d_memset(q, 99, n / 4, side), CUDA_SUCCESS);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  check_races();
  assert_int_equal(word(x), 11u);
  assert_int_equal(stat_of("free_failures"), 0);
  t_free((void *)(uintptr_t)q, (ssize_t)n, 0, side);
  t_free((void *)(uintptr_t)x, (ssize_t)n, 0, comm);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
}

/* torch.cuda.graph: a GLOBAL capture on a side stream, allocations and frees inside, replays. */
static void test_outside_capture_then_replays(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  CUstream cs = new_stream();
  const size_t n = 64 * 1024;
  CUdeviceptr in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  assert_int_equal(d_memset(in, 5, n / 4, NULL), CUDA_SUCCESS);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(d_begin(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr tmp = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_true(tmp != 0);
  assert_int_equal(d_copy(tmp, in, n, cs), CUDA_SUCCESS);
  CUdeviceptr out = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_true(out != 0);
  assert_int_equal(d_copy(out, tmp, n, cs), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)tmp, (ssize_t)n, 0, cs);
  CUdeviceptr tmp2 = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_int_equal(tmp2, tmp); /* private-pool semantics: reused inside the capture */
  assert_int_equal(d_memset(tmp2, 9, n / 4, cs), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)tmp2, (ssize_t)n, 0, cs);
  assert_null(t_alloc(0, 0, cs));
  CUgraph g = NULL;
  assert_int_equal(d_end(cs, &g), CUDA_SUCCESS); /* the capture ends valid */
  assert_non_null(g);
  assert_int_equal(stat_of("graph_pools"), 1);
  CUgraphExec x;
  assert_int_equal(d_inst(&x, g, 0), CUDA_SUCCESS);
  for (unsigned r = 0; r < 20; r++) {
    assert_int_equal(d_memset(in, 100 + r, n / 4, cs), CUDA_SUCCESS);
    assert_int_equal(d_launch(x, cs), CUDA_SUCCESS);
    assert_int_equal(d_sync(cs), CUDA_SUCCESS);
    assert_int_equal(word(out), 100 + r); /* the static output, refilled by each replay */
  }
  /* Eager work meanwhile never lands in the graph's memory. */
  CUdeviceptr e = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  assert_true(e != 0 && (e + n <= out || out + n <= e));
  t_free((void *)(uintptr_t)e, (ssize_t)n, 0, NULL);
  /* PyTorch frees the static output when the graph's tensors die: the graph's memory is kept. */
  t_free((void *)(uintptr_t)out, (ssize_t)n, 0, cs);
  assert_int_equal(stat_of("graph_frees_ignored"), 1);
  assert_int_equal(stat_of("free_failures"), 0);
  assert_int_equal(d_exec_destroy(x), CUDA_SUCCESS);
  assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
  assert_int_equal(t_release(0), 1);
  assert_int_equal(stat_of("graph_pools"), 0);
  t_free((void *)(uintptr_t)in, (ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* torch.cuda.graph captures on a blocking stream; PyTorch's eager tensors live on the legacy
 * stream and die during the capture. Work on the legacy stream would invalidate the capture
 * (STREAM_CAPTURE_IMPLICIT, H100), so their frees are deferred: the capture ends valid, nothing
 * fails, and the memory comes back at the first call after the capture ended. */
static void test_legacy_frees_during_a_blocking_capture(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes"), fails0 = stat_of("free_failures");
  const size_t n = 64 * 1024;
  CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  CUdeviceptr y = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  assert_true(x != 0 && y != 0);
  assert_int_equal(d_memset(x, 3, n / 4, NULL), CUDA_SUCCESS);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  CUstream cs;
  assert_int_equal(d_stream_create(&cs, 0, 0), CUDA_SUCCESS); /* blocking, as PyTorch's side streams */
  assert_int_equal(d_begin(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr t = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_true(t != 0);
  assert_int_equal(d_copy(t, x, n, cs), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)y, (ssize_t)n, 0, NULL); /* an eager tensor dies inside the capture */
  t_free((void *)(uintptr_t)t, (ssize_t)n, 0, cs);
  CUgraph g = NULL;
  assert_int_equal(d_end(cs, &g), CUDA_SUCCESS); /* the capture ends valid */
  assert_int_equal(stat_of("free_failures"), fails0);
  assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
  assert_int_equal(t_release(0), 1);
  t_free((void *)(uintptr_t)x, (ssize_t)n, 0, NULL); /* the deferred free happens no later than here */
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* torch.cuda.graph with a second stream inside the capture (s2.wait_stream(cur) ... cur.wait_stream(s2),
 * as multi-stream models do): the side stream joins the capture through an event, allocates and
 * frees there, the main stream waits for it and uses its result. Both streams' allocations come
 * from the capture's one graph pool; the capture ends valid, replays give the right values, and
 * after release nothing is left live. */
static void test_a_capture_forked_onto_a_second_stream(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes"), fails0 = stat_of("free_failures"), pools0 = stat_of("graph_pools");
  const size_t n = 64 * 1024;
  CUstream cs, s2;
  assert_int_equal(d_stream_create(&cs, 0, 0), CUDA_SUCCESS);
  assert_int_equal(d_stream_create(&s2, 0, 0), CUDA_SUCCESS);
  CUevent fork, join;
  assert_int_equal(d_event_create(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  assert_int_equal(d_event_create(&join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUdeviceptr in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_true(in != 0);
  assert_int_equal(d_memset(in, 4, n / 4, cs), CUDA_SUCCESS);
  assert_int_equal(d_sync(cs), CUDA_SUCCESS);
  assert_int_equal(d_begin(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(d_event_record(fork, cs), CUDA_SUCCESS);
  assert_int_equal(d_wait_event(s2, fork, 0), CUDA_SUCCESS); /* s2 joins the capture */
  CUdeviceptr t = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, s2);
  assert_true(t != 0);
  assert_int_equal(d_copy(t, in, n, s2), CUDA_SUCCESS);
  CUdeviceptr u = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, s2);
  assert_true(u != 0);
  assert_int_equal(d_copy(u, t, n, s2), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)t, (ssize_t)n, 0, s2); /* dies on the side stream, inside */
  assert_int_equal(d_event_record(join, s2), CUDA_SUCCESS);
  assert_int_equal(d_wait_event(cs, join, 0), CUDA_SUCCESS); /* the main stream waits for s2 */
  CUdeviceptr out = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  if (out == 0) fail_msg("alloc on the main stream after the join: %s", t_error());
  assert_int_equal(d_copy(out, u, n, cs), CUDA_SUCCESS);
  CUgraph g = NULL;
  assert_int_equal(d_end(cs, &g), CUDA_SUCCESS); /* the capture ends valid */
  assert_non_null(g);
  assert_int_equal(stat_of("free_failures"), fails0);
  assert_int_equal(stat_of("graph_pools"), pools0 + 1); /* one capture, one pool, both streams */
  CUgraphExec x;
  assert_int_equal(d_inst(&x, g, 0), CUDA_SUCCESS);
  for (unsigned r = 0; r < 5; r++) {
    assert_int_equal(d_memset(in, 40 + r, n / 4, cs), CUDA_SUCCESS);
    assert_int_equal(d_launch(x, cs), CUDA_SUCCESS);
    assert_int_equal(d_sync(cs), CUDA_SUCCESS);
    assert_int_equal(word(out), 40 + r);
  }
  t_free((void *)(uintptr_t)u, (ssize_t)n, 0, s2); /* the graph's: kept with its pool */
  t_free((void *)(uintptr_t)out, (ssize_t)n, 0, cs);
  assert_int_equal(stat_of("free_failures"), fails0);
  assert_int_equal(d_exec_destroy(x), CUDA_SUCCESS);
  assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
  assert_int_equal(t_release(0), 1);
  t_free((void *)(uintptr_t)in, (ssize_t)n, 0, cs);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  assert_int_equal(stat_of("frees_pending"), 0);
  check_races();
  assert_int_equal(d_event_destroy(fork), CUDA_SUCCESS);
  assert_int_equal(d_event_destroy(join), CUDA_SUCCESS);
}

/* torch.cuda.graph where a tensor made before the capture dies inside it, on the capturing
 * stream (`x = f(x)` with x from the warm-up): PyTorch frees it there. weft cannot free it inside
 * the capture (the free would run at every replay), so the adapter keeps the free until the
 * capture has ended: nothing fails, the capture ends valid, the graph still reads what x held
 * when it replays, and the memory comes back at the first call after the capture ended. */
static void test_a_tensor_from_before_the_capture_dies_inside_it(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes"), fails0 = stat_of("free_failures");
  const size_t n = 64 * 1024;
  CUstream cs;
  assert_int_equal(d_stream_create(&cs, 0, 0), CUDA_SUCCESS); /* blocking, as PyTorch's side streams */
  CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs); /* the warm-up's tensor */
  assert_true(x != 0);
  assert_int_equal(d_memset(x, 7, n / 4, cs), CUDA_SUCCESS);
  /* x is also read by work weft does not see on another stream, recorded (record_stream): its
   * free must also wait for that, once the capture has ended. */
  CUstream rd = new_stream();
  CUdeviceptr copy = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, rd);
  assert_true(copy != 0);
  assert_int_equal(d_sync(cs), CUDA_SUCCESS);
  assert_int_equal(d_copy(copy, x, n, rd), CUDA_SUCCESS);
  t_record((void *)(uintptr_t)x, rd);
  assert_int_equal(d_begin(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr y = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_true(y != 0);
  assert_int_equal(d_copy(y, x, n, cs), CUDA_SUCCESS); /* y = f(x) */
  t_free((void *)(uintptr_t)x, (ssize_t)n, 0, cs);     /* x dies inside the capture */
  assert_int_equal(stat_of("frees_pending"), 1);        /* kept until the capture ends */
  /* Later calls inside the capture try the kept free again: refused again, kept, no failure, and
   * the capture stays valid. */
  CUdeviceptr w = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_true(w != 0);
  assert_int_equal(d_copy(w, y, n, cs), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)w, (ssize_t)n, 0, cs);
  assert_int_equal(stat_of("frees_pending"), 1);
  CUgraph g = NULL;
  assert_int_equal(d_end(cs, &g), CUDA_SUCCESS); /* the capture ends valid */
  assert_int_equal(stat_of("free_failures"), fails0);
  CUgraphExec e;
  assert_int_equal(d_inst(&e, g, 0), CUDA_SUCCESS);
  assert_int_equal(d_launch(e, cs), CUDA_SUCCESS);
  assert_int_equal(d_sync(cs), CUDA_SUCCESS);
  assert_int_equal(word(y), 7u);
  assert_int_equal(d_exec_destroy(e), CUDA_SUCCESS);
  assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)y, (ssize_t)n, 0, cs); /* the graph's own: kept with its pool */
  assert_int_equal(t_release(0), 1);
  void *z = t_alloc(256, 0, cs); /* the kept free happens no later than this call */
  assert_non_null(z);
  t_free(z, 256, 0, cs);
  assert_int_equal(stat_of("frees_pending"), 0);
  /* x's memory again, on its stream, overwritten: ordered after rd's read (the oracle checks). */
  CUdeviceptr again = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_int_equal(again, x); /* premise: the same memory, from the stream's cache */
  assert_int_equal(d_memset(again, 1, n / 4, cs), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)again, (ssize_t)n, 0, cs);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(word(copy), 7u);
  t_free((void *)(uintptr_t)copy, (ssize_t)n, 0, rd);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  assert_int_equal(stat_of("free_failures"), fails0);
  check_races();
}

/* What failed under a fault: frees the adapter keeps to make again itself (weft_torch.h), and
 * use_ends (weft.h: a failed call changed nothing, so the caller may call it again). */
typedef struct redo {
  unsigned frees;
  unsigned ends; /* use_ends that failed (each called again at once) */
} redo_t;

/* PyTorch's calls, as the cases above make them: eager steps on the legacy stream that read a
 * batch a side stream prefetched (declared with weft_torch_use_*), frees on either stream. Every
 * adapter call is checked: an allocation gives memory or NULL; a use returns 0 or an error; a free
 * that failed is counted (free_failures), kept by the adapter and noted in `redo`; a use_end that failed left its use
 * open and is called again at once. `check`: every call must succeed and the data be right. */
static void pytorch_steps(CUstream side, redo_t *redo, bool check) {
  const size_t n = 16 * 1024;
  for (unsigned step = 0; step < 4; step++) {
    CUdeviceptr x = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
    CUdeviceptr b = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, side);
    if (check && (x == 0 || b == 0)) fail_msg("alloc: %s", t_error());
    bool filled = false;
    if (b != 0) {
      uint64_t w = b;
      if (t_use_begin(0, side, NULL, 0, &w, 1) == 0) {
        assert_int_equal(d_memset(b, 500 + step, n / 4, side), CUDA_SUCCESS);
        /* A failed end changed nothing: the use is still open and the end may be called again
         * (a fault fails one call only). */
        if (t_use_end(0, side, NULL, 0, &w, 1) != 0) {
          redo->ends++;
          if (t_use_end(0, side, NULL, 0, &w, 1) != 0) fail_msg("use_end called again: %s", t_error());
        }
        filled = true;
      } else if (check) {
        fail_msg("use_begin: %s", t_error());
      }
    }
    if (x != 0 && filled) {
      uint64_t r = b, w = x;
      if (t_use_begin(0, NULL, &r, 1, &w, 1) == 0) {
        assert_int_equal(d_copy(x, b, n, NULL), CUDA_SUCCESS);
        t_record((void *)(uintptr_t)b, NULL); /* as ProcessGroupNCCL would: b's free declares a use on it */
        if (t_use_end(0, NULL, &r, 1, &w, 1) != 0) {
          redo->ends++;
          if (t_use_end(0, NULL, &r, 1, &w, 1) != 0) fail_msg("use_end called again: %s", t_error());
        }
        if (check) {
          assert_int_equal(d_sync(NULL), CUDA_SUCCESS);
          assert_int_equal(word(x), 500 + step);
        }
      } else if (check) {
        fail_msg("use_begin: %s", t_error());
      }
    }
    CUdeviceptr p[2] = {b, x};
    CUstream on[2] = {side, NULL};
    for (int k = 0; k < 2; k++) {
      if (p[k] == 0) continue;
      uint64_t failed0 = stat_of("free_failures");
      t_free((void *)(uintptr_t)p[k], (ssize_t)n, 0, on[k]);
      if (stat_of("free_failures") != failed0) {
        if (check) fail_msg("free: %s", t_error());
        redo->frees++;
      }
    }
  }
}

/* Faults at every call: each driver function the adapter's calls reach fails at its Nth call, for
 * N = 1, 2, ... until not reached. No crash and no race; what failed changed nothing: a use_end
 * called again succeeds, and the adapter makes every failed free again itself at its next call
 * once the fault is cleared (PyTorch never calls free twice); then no byte is left live and the
 * same steps without faults give the right data. Simulator only (fault injection). */
static void test_faults_at_every_call_leave_nothing_half_done(void **state) {
  (void)state;
  if (sim == NULL) skip(); /* fault injection */
  static const char *const fns[] = {"cuEventRecord", "cuStreamWaitEvent", "cuStreamIsCapturing",
                                    "cuCtxGetCurrent"};
  CUstream side = new_stream();
  redo_t none = {0};
  pytorch_steps(side, &none, true);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  uint64_t live0 = stat_of("live_bytes");
  unsigned cells = 0, failed_frees = 0, failed_ends = 0;
  for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
    unsigned fired = 0;
    for (unsigned nth = 1; nth <= 24; nth++) {
      weft_sim_stats_t s0, s1;
      sim->stats(&s0);
      char spec[80];
      snprintf(spec, sizeof spec, "%s:%u:CUDA_ERROR_UNKNOWN", fns[f], nth);
      assert_int_equal((sim->fail)(spec), 0);
      redo_t redo = {0};
      uint64_t kept0 = stat_of("frees_kept");
      pytorch_steps(side, &redo, false);
      assert_int_equal((sim->fail)(""), 0);
      sim->stats(&s1);
      if (s1.faults_injected == s0.faults_injected) break; /* not reached */
      fired++;
      cells++;
      failed_frees += redo.frees;
      failed_ends += redo.ends;
      uint64_t failed0 = stat_of("free_failures");
      if (stat_of("frees_kept") - kept0 != redo.frees) /* some made again already, by the steps' later calls */
        fail_msg("%s: %llu frees kept, %u failed", spec, (unsigned long long)(stat_of("frees_kept") - kept0), redo.frees);
      void *nudge = t_alloc(256, 0, NULL); /* the adapter's next call makes the kept frees again */
      assert_non_null(nudge);
      t_free(nudge, 256, 0, NULL);
      if (stat_of("free_failures") != failed0 || stat_of("frees_pending") != 0)
        fail_msg("%s: a kept free made again failed (%llu still kept): %s", spec,
                 (unsigned long long)stat_of("frees_pending"), t_error());
      assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
      if (stat_of("live_bytes") != live0)
        fail_msg("%s: %llu bytes live, %llu before", spec, (unsigned long long)stat_of("live_bytes"),
                 (unsigned long long)live0);
      check_races();
      redo_t clean = {0};
      pytorch_steps(side, &clean, true);
    }
    if (fired == 0) fail_msg("%s: the fault fired nowhere", fns[f]);
  }
  printf("fault cells: %u; frees failed, kept and made again by the adapter: %u; use_ends failed and called again: %u\n", cells,
         failed_frees, failed_ends);
  assert_true(failed_frees > 0 && failed_ends > 0); /* premise: the faults hit frees and use ends */
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* torch.cuda.empty_cache() (PyTorch's reset hook, weft_torch_empty_cache): what the device's
 * runtime holds beyond live tensors goes back to the driver, the streams' caches and the pool's
 * idle chunks; live tensors keep their memory and values. */
static void test_empty_cache_gives_back_what_is_not_live(void **state) {
  (void)state;
  const size_t big = (size_t)6 << 20, small = 4096; /* shared 16 MiB chunks (the adapter's pool_chunk_bytes) */
  CUstream side = new_stream();
  CUdeviceptr keep = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)small, 0, side);
  assert_true(keep != 0);
  assert_int_equal(d_memset(keep, 42, small / 4, side), CUDA_SUCCESS);
  CUdeviceptr p[4];
  for (int i = 0; i < 4; i++) {
    p[i] = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)big, 0, i % 2 ? side : NULL);
    assert_true(p[i] != 0);
  }
  for (int i = 0; i < 4; i++) t_free((void *)(uintptr_t)p[i], (ssize_t)big, 0, i % 2 ? side : NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  uint64_t held = stat_of("reserved_bytes");
  printf("reserved: %llu bytes before empty_cache\n", (unsigned long long)held);
  assert_true(held >= (uint64_t)32 << 20); /* premise: the freed memory is still held (cached or idle chunks) */
  t_empty();
  uint64_t after = stat_of("reserved_bytes");
  printf("reserved: %llu bytes after\n", (unsigned long long)after);
  if (after + ((uint64_t)16 << 20) > held) /* at least the chunks that hold no live tensor */
    fail_msg("reserved %llu bytes after empty_cache, %llu before", (unsigned long long)after, (unsigned long long)held);
  assert_int_equal(stat_of("cached_bytes"), 0); /* no stream caches anything now */
  assert_int_equal(word(keep), 42u); /* a live tensor keeps its memory */
  t_free((void *)(uintptr_t)keep, (ssize_t)small, 0, side);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  check_races();
}

/* The adapter's runtime keeps nothing cached in the driver's pool and takes 16 MiB chunks (what
 * held device memory within 1.1x of PyTorch's allocator on the example, H100) and gives the
 * device's lanes to adopted streams, unless the environment says otherwise. */
/* torch.cuda.graph's capture of one step as PyTorch makes it (CUDAGraph::capture_begin/end):
 * beginAllocateToPool(device, pool id, filter), the capture on cs, a temporary freed inside, an
 * output kept; then endAllocateToPool. With `hooks` false, PyTorch without the pool hooks (a
 * C caller, or hooks not set). The graph replays once with input value v; *out_ptr: the output. */
static void capture_step(CUstream cs, CUdeviceptr in, size_t n, bool hooks, mempool_id_t id, unsigned v,
                         CUgraphExec *x, CUgraph *g, CUdeviceptr *out_ptr) {
  char filter[32] = {0}; /* stands for the std::function PyTorch passes; weft never calls it */
  if (hooks && (t_pool_begin == NULL || t_pool_end == NULL || t_pool_release == NULL))
    fail_msg("%s has no graph-pool hooks (weft_torch_begin_allocate_to_pool, ...)", lib_path);
  if (hooks) t_pool_begin(0, id, filter);
  assert_int_equal(d_begin(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr tmp = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  if (tmp == 0) fail_msg("alloc inside capture: %s", t_error());
  assert_int_equal(d_copy(tmp, in, n, cs), CUDA_SUCCESS);
  CUdeviceptr out = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  if (out == 0) fail_msg("alloc inside capture: %s", t_error());
  assert_int_equal(d_copy(out, tmp, n, cs), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)tmp, (ssize_t)n, 0, cs);
  assert_int_equal(d_end(cs, g), CUDA_SUCCESS);
  if (hooks) t_pool_end(0, id);
  assert_int_equal(d_inst(x, *g, 0), CUDA_SUCCESS);
  assert_int_equal(d_memset(in, v, n / 4, cs), CUDA_SUCCESS);
  assert_int_equal(d_launch(*x, cs), CUDA_SUCCESS);
  assert_int_equal(d_sync(cs), CUDA_SUCCESS);
  assert_int_equal(word(out), v);
  *out_ptr = out;
}

/* torch.compile's CUDA graphs and programs that capture per shape make hundreds of graphs in a
 * run. Without PyTorch's pool hooks each capture keeps a graph pool until
 * weft_torch_release_graph_pools: any number of them (a fixed table of 64 made the 65th
 * capture's allocations fail). */
static void test_many_captures_without_the_pool_hooks(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  CUstream cs = new_stream();
  const size_t n = 4096;
  CUdeviceptr in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  enum { GRAPHS = 100 };
  for (unsigned i = 0; i < GRAPHS; i++) {
    CUgraphExec x;
    CUgraph g;
    CUdeviceptr out;
    capture_step(cs, in, n, false, (mempool_id_t){0, 0}, 7 + i, &x, &g, &out);
    t_free((void *)(uintptr_t)out, (ssize_t)n, 0, cs);
    assert_int_equal(d_exec_destroy(x), CUDA_SUCCESS);
    assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
  }
  assert_int_equal(stat_of("graph_pools"), GRAPHS);
  assert_int_equal(stat_of("alloc_failures"), 0);
  assert_int_equal(t_release(0), GRAPHS);
  assert_int_equal(stat_of("graph_pools"), 0);
  t_free((void *)(uintptr_t)in, (ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* With PyTorch's hooks (weft_torch.py sets them): a graph's pool is given back when PyTorch
 * releases it (CUDAGraph::reset, the graph deleted) and no tensor from it is still live, with no
 * call from the user; 100 graphs made and deleted one after another hold one graph's memory. */
static void test_pytorch_releases_each_graphs_pool(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes"), fails0 = stat_of("free_failures");
  CUstream cs = new_stream();
  const size_t n = 64 * 1024;
  CUdeviceptr in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  for (unsigned i = 0; i < 100; i++) {
    mempool_id_t id = {1000 + i, 0}; /* a new pool per graph: PyTorch's default */
    CUgraphExec x;
    CUgraph g;
    CUdeviceptr out;
    capture_step(cs, in, n, true, id, 3 + i, &x, &g, &out);
    assert_int_equal(stat_of("graph_pools"), 1);
    assert_true(stat_of("graph_pool_reserved") > 0);
    /* The graph is deleted: its exec, then reset() releases the pool; the static output dies last. */
    assert_int_equal(d_exec_destroy(x), CUDA_SUCCESS);
    assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
    t_pool_release(0, id);
    assert_int_equal(stat_of("graph_pools"), 1); /* the output still lives in its memory */
    assert_int_equal(word(out), 3 + i);
    t_free((void *)(uintptr_t)out, (ssize_t)n, 0, cs);
    assert_int_equal(stat_of("graph_pools"), 0);
    assert_int_equal(stat_of("graph_pool_reserved"), 0);
  }
  assert_int_equal(stat_of("free_failures"), fails0);
  assert_int_equal(stat_of("alloc_failures"), 0);
  t_free((void *)(uintptr_t)in, (ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* torch.cuda.graph(pool=g1.pool()): graphs captured into one PyTorch pool share one graph pool
 * (a later capture reuses what an earlier one freed inside it), and the pool lives until its last
 * graph is released; both graphs replay right in between. */
static void test_graphs_sharing_a_pytorch_pool(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  CUstream cs = new_stream();
  const size_t n = 64 * 1024;
  CUdeviceptr in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  mempool_id_t id = {0, 77}; /* torch.cuda.graph_pool_handle() */
  CUgraphExec x1, x2;
  CUgraph g1, g2;
  CUdeviceptr o1, o2;
  capture_step(cs, in, n, true, id, 11, &x1, &g1, &o1);
  uint64_t one = stat_of("graph_pool_reserved");
  capture_step(cs, in, n, true, id, 12, &x2, &g2, &o2);
  assert_int_equal(stat_of("graph_pools"), 1);
  assert_int_equal(stat_of("graph_pool_reserved"), one); /* g2 fit in what g1 left free */
  for (unsigned r = 0; r < 4; r++) { /* in capture order, as PyTorch requires of a shared pool */
    assert_int_equal(d_memset(in, 20 + r, n / 4, cs), CUDA_SUCCESS);
    assert_int_equal(d_launch(x1, cs), CUDA_SUCCESS);
    assert_int_equal(d_launch(x2, cs), CUDA_SUCCESS);
    assert_int_equal(d_sync(cs), CUDA_SUCCESS);
    assert_int_equal(word(o1), 20 + r);
    assert_int_equal(word(o2), 20 + r);
  }
  t_free((void *)(uintptr_t)o1, (ssize_t)n, 0, cs);
  assert_int_equal(d_exec_destroy(x1), CUDA_SUCCESS);
  assert_int_equal(d_graph_destroy(g1), CUDA_SUCCESS);
  t_pool_release(0, id);
  assert_int_equal(stat_of("graph_pools"), 1); /* g2 still uses it */
  assert_int_equal(d_memset(in, 99, n / 4, cs), CUDA_SUCCESS);
  assert_int_equal(d_launch(x2, cs), CUDA_SUCCESS);
  assert_int_equal(d_sync(cs), CUDA_SUCCESS);
  assert_int_equal(word(o2), 99);
  t_free((void *)(uintptr_t)o2, (ssize_t)n, 0, cs);
  assert_int_equal(d_exec_destroy(x2), CUDA_SUCCESS);
  assert_int_equal(d_graph_destroy(g2), CUDA_SUCCESS);
  t_pool_release(0, id);
  assert_int_equal(stat_of("graph_pools"), 0);
  assert_int_equal(stat_of("free_failures"), 0);
  t_free((void *)(uintptr_t)in, (ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* Two threads capture at once (THREAD_LOCAL mode, as concurrent torch.cuda.graph captures do),
 * each into a PyTorch pool of its own: each capture draws from its own thread's pool (the begin
 * waiting on that thread), the pools never share memory, and each is released on its own. */
typedef struct pool_thread {
  unsigned k;
  CUstream cs;
  CUdeviceptr in, out;
  CUgraphExec x;
  CUgraph g;
  pthread_barrier_t *inside; /* both captures under way at once */
  pthread_mutex_t *graph_calls; /* the threads' own driver graph calls, one thread at a time */
  int failed;
} pool_thread_t;

static void *capture_in_thread(void *arg) {
  pool_thread_t *t = arg;
  const size_t n = 64 * 1024;
  char filter[32] = {0};
  mempool_id_t id = {500 + t->k, 0};
  if (d_set_cur(ctx_dev0) != CUDA_SUCCESS) t->failed = 6; /* PyTorch's threads have their device's */
  t_pool_begin(0, id, filter);
  if (d_begin(t->cs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS) t->failed = 1;
  pthread_barrier_wait(t->inside); /* both begins wait for their captures */
  CUdeviceptr tmp = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, t->cs);
  t->out = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, t->cs);
  if (tmp == 0 || t->out == 0) t->failed = 2;
  CUresult r1 = CUDA_SUCCESS, r2 = CUDA_SUCCESS;
  if (!t->failed && ((r1 = d_copy(tmp, t->in, n, t->cs)) != CUDA_SUCCESS || (r2 = d_copy(t->out, tmp, n, t->cs)) != CUDA_SUCCESS)) {
    fprintf(stderr, "thread %u: copies: %d %d\n", t->k, (int)r1, (int)r2);
    t->failed = 3;
  }
  if (tmp != 0) t_free((void *)(uintptr_t)tmp, (ssize_t)n, 0, t->cs);
  pthread_barrier_wait(t->inside);
  /* The driver calls this thread makes itself (PyTorch's part) end the capture and instantiate:
   * graph calls that overlapped another thread's driver call were followed by wrong results on
   * GPUs (tests/conformance/README.md, "graph calls"), and the simulator reports an overlap, so
   * the threads take turns here, as weft's gate makes weft's own graph calls do. */
  pthread_mutex_lock(t->graph_calls);
  if (d_end(t->cs, &t->g) != CUDA_SUCCESS) t->failed = 4;
  t_pool_end(0, id);
  if (!t->failed && d_inst(&t->x, t->g, 0) != CUDA_SUCCESS) t->failed = 5;
  pthread_mutex_unlock(t->graph_calls);
  return NULL;
}

static void test_two_threads_capture_into_their_own_pools(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  if (t_pool_begin == NULL) fail_msg("%s has no graph-pool hooks", lib_path);
  const size_t n = 64 * 1024;
  pthread_barrier_t inside;
  pthread_barrier_init(&inside, NULL, 2);
  pthread_mutex_t graph_calls = PTHREAD_MUTEX_INITIALIZER;
  pool_thread_t t[2];
  pthread_t th[2];
  for (unsigned k = 0; k < 2; k++) {
    t[k] = (pool_thread_t){.k = k, .cs = new_stream(), .inside = &inside, .graph_calls = &graph_calls};
    t[k].in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
    assert_true(t[k].in != 0);
  }
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  for (unsigned k = 0; k < 2; k++) assert_int_equal(pthread_create(&th[k], NULL, capture_in_thread, &t[k]), 0);
  for (unsigned k = 0; k < 2; k++) assert_int_equal(pthread_join(th[k], NULL), 0);
  pthread_barrier_destroy(&inside);
  for (unsigned k = 0; k < 2; k++) {
    if (t[k].failed) fail_msg("thread %u failed at step %d: %s", k, t[k].failed, t_error());
  }
  assert_int_equal(stat_of("graph_pools"), 2);
  assert_int_equal(stat_of("alloc_failures"), 0);
  for (unsigned r = 0; r < 3; r++)
    for (unsigned k = 0; k < 2; k++) {
      assert_int_equal(d_memset(t[k].in, 40 + 2 * r + k, n / 4, t[k].cs), CUDA_SUCCESS);
      assert_int_equal(d_launch(t[k].x, t[k].cs), CUDA_SUCCESS);
    }
  for (unsigned k = 0; k < 2; k++) {
    assert_int_equal(d_sync(t[k].cs), CUDA_SUCCESS);
    assert_int_equal(word(t[k].out), 40 + 4 + k); /* each graph wrote its own output only */
  }
  for (unsigned k = 0; k < 2; k++) {
    assert_int_equal(d_exec_destroy(t[k].x), CUDA_SUCCESS);
    assert_int_equal(d_graph_destroy(t[k].g), CUDA_SUCCESS);
    t_pool_release(0, (mempool_id_t){500 + k, 0});
    t_free((void *)(uintptr_t)t[k].out, (ssize_t)n, 0, t[k].cs);
    assert_int_equal(stat_of("graph_pools"), 1 - k);
    t_free((void *)(uintptr_t)t[k].in, (ssize_t)n, 0, NULL);
  }
  assert_int_equal(stat_of("free_failures"), 0);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

/* weft_torch_release_graph_pools while a new capture runs on the stream of an ended one, before
 * any weft call on it: asking weft about that stream meets the new capture and calls the
 * adapter's capture handler (a deadlock while the release held the adapter's lock). The old pool
 * goes, the new capture keeps its own and draws from it. */
static void test_release_graph_pools_during_a_new_capture_on_the_stream(void **state) {
  (void)state;
  uint64_t live0 = stat_of("live_bytes");
  CUstream cs = new_stream();
  const size_t n = 4096;
  CUdeviceptr in = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  CUgraphExec x;
  CUgraph g;
  CUdeviceptr out;
  capture_step(cs, in, n, false, (mempool_id_t){0, 0}, 5, &x, &g, &out);
  t_free((void *)(uintptr_t)out, (ssize_t)n, 0, cs);
  assert_int_equal(d_exec_destroy(x), CUDA_SUCCESS);
  assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
  assert_int_equal(d_begin(cs, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(t_release(0), 1); /* the ended capture's pool; the new one is met and kept */
  CUdeviceptr tmp = (CUdeviceptr)(uintptr_t)t_alloc((ssize_t)n, 0, cs);
  assert_true(tmp != 0);
  assert_int_equal(d_copy(tmp, in, n, cs), CUDA_SUCCESS);
  t_free((void *)(uintptr_t)tmp, (ssize_t)n, 0, cs);
  assert_int_equal(d_end(cs, &g), CUDA_SUCCESS); /* valid */
  assert_int_equal(d_graph_destroy(g), CUDA_SUCCESS);
  assert_int_equal(stat_of("graph_pools"), 1);
  assert_int_equal(t_release(0), 1);
  assert_int_equal(stat_of("graph_pools"), 0);
  t_free((void *)(uintptr_t)in, (ssize_t)n, 0, NULL);
  assert_int_equal(d_ctx_sync(), CUDA_SUCCESS);
  assert_int_equal(stat_of("live_bytes"), live0);
  check_races();
}

static void test_adapter_defaults(void **state) {
  (void)state;
  void *p = t_alloc(4096, 0, NULL); /* the runtime exists */
  assert_non_null(p);
  t_free(p, 4096, 0, NULL);
  const char *env = getenv("WEFT_RELEASE_THRESHOLD");
  if (env == NULL) assert_int_equal(stat_of("release_threshold"), 0);
  if (getenv("WEFT_POOL_CHUNK_BYTES") == NULL) assert_int_equal(stat_of("pool_chunk_bytes"), 16u << 20);
  /* The process's 128 lanes shared among the devices, at most 64 a runtime, 2 of them weft's. */
  int devices = 0;
  CUresult (*count)(int *);
  DRV(count, "cuDeviceGetCount");
  assert_int_equal(count(&devices), CUDA_SUCCESS);
  unsigned lanes = 128u / (unsigned)devices;
  if (getenv("WEFT_ADOPT_STREAMS") == NULL) assert_int_equal(stat_of("adopt_streams"), (lanes > 64 ? 64 : lanes) - 2);
}

int main(int argc, char **argv) {
  harness_args(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_a_program_with_many_streams, setup),
      cmocka_unit_test_setup(test_eager_steps_on_the_legacy_stream, setup),
      cmocka_unit_test_setup(test_side_stream_prefetch_without_record_stream, setup),
      cmocka_unit_test_setup(test_frees_from_other_threads, setup),
      cmocka_unit_test_setup(test_a_pointer_reallocated_elsewhere_frees_the_new_block, setup),
      cmocka_unit_test_setup(test_record_stream_orders_the_reuse, setup),
      cmocka_unit_test_setup(test_outside_capture_then_replays, setup),
      cmocka_unit_test_setup(test_many_captures_without_the_pool_hooks, setup),
      cmocka_unit_test_setup(test_pytorch_releases_each_graphs_pool, setup),
      cmocka_unit_test_setup(test_graphs_sharing_a_pytorch_pool, setup),
      cmocka_unit_test_setup(test_two_threads_capture_into_their_own_pools, setup),
      cmocka_unit_test_setup(test_release_graph_pools_during_a_new_capture_on_the_stream, setup),
      cmocka_unit_test_setup(test_legacy_frees_during_a_blocking_capture, setup),
      cmocka_unit_test_setup(test_a_tensor_from_before_the_capture_dies_inside_it, setup),
      cmocka_unit_test_setup(test_a_capture_forked_onto_a_second_stream, setup),
      cmocka_unit_test_setup(test_faults_at_every_call_leave_nothing_half_done, setup),
      cmocka_unit_test_setup(test_empty_cache_gives_back_what_is_not_live, setup),
      cmocka_unit_test_setup(test_calls_for_another_device_leave_the_current_context, setup),
      cmocka_unit_test_setup(test_adapter_defaults, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
