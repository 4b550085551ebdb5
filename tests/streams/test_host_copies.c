/* Host copies (weft_copy_to_block, weft_copy_from_block): pageable memory goes through the
 * runtime's page-locked stages, a chunk of up to 1 MiB at a time, and the call never waits for
 * the device inside weft's gate or a busy use (lib/runtime/runtime.h, "staging"; the deadlock it
 * prevents is tests/comm/test_comm_long.c test_min_captured_sendrecv_thread_per_rank). Page-locked
 * memory is copied directly; inside a capture the copy is a node of the caller's memory. Checked:
 * every size and offset round trip, a source reusable at once, stages reused under many copies in
 * flight and under eight threads, captures, and a fault at each driver call a copy makes. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "tests/util/cmocka_env.h"

#define MIB ((size_t)1 << 20)
#define STAGES_KEPT 16u /* WEFT__STAGE_MAX */
static tu_env_t env;
static const weft__driver_t *drv;

static int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  if (tu_init(&env, &o) != 0) return -1;
  return weft__driver_get(&drv) == WEFT_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}

#define OKW(call)                                                                                  \
  do {                                                                                             \
    weft_status_t st_ = (call);                                                                    \
    if (st_ != WEFT_OK) fail_msg("%s: %s: %s", #call, weft_status_name(st_), weft_last_error());  \
  } while (0)

static weft_counters_t counters(void) {
  weft_counters_t c;
  OKW(weft_runtime_counters(env.rt, &c));
  return c;
}

static void pattern(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7u + seed * 13u + (i >> 11));
}

static void test_pageable_copies_of_every_size_round_trip(void **state) {
  (void)state;
  tu_reset_races(&env);
  static const size_t sizes[] = {1, 4095, MIB, MIB + 1, 3 * MIB + 17};
  static const size_t offsets[] = {0, 3};
  const size_t room = 4 * MIB + 64;
  weft_block_t b = tu_alloc(&env, room, 0, "copies");
  unsigned char *src = malloc(room), *dst = malloc(room);
  assert_non_null(src);
  assert_non_null(dst);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    for (size_t j = 0; j < sizeof offsets / sizeof offsets[0]; j++) {
      size_t n = sizes[i], off = offsets[j];
      pattern(src, n, (unsigned)(i * 2 + j));
      memset(dst, 0xcd, room);
      weft_counters_t c0 = counters();
      OKW(weft_copy_to_block(tu_stream(&env, 1), b, off, src, n));
      OKW(weft_copy_from_block(tu_stream(&env, 2), dst, b, off, n));
      weft_counters_t c1 = counters();
      /* Pageable: each direction a chunk of up to 1 MiB at a time, and the data is there when the
       * call returns. */
      assert_int_equal(c1.staged_copies - c0.staged_copies, 2 * ((n + MIB - 1) / MIB));
      if (memcmp(dst, src, n) != 0) fail_msg("%zu bytes at offset %zu differ", n, off);
      assert_int_equal(dst[n], 0xcd);
    }
  assert_true(counters().stage_buffers >= 1);
  assert_int_equal(tu_races(&env), 0);
  /* Bad ranges are refused before anything is copied. */
  assert_int_equal(weft_copy_to_block(tu_stream(&env, 1), b, room - 2, src, 4), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_copy_from_block(tu_stream(&env, 1), dst, b, room, 1), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_copy_to_block(tu_stream(&env, 1), b, 0, src, 0), WEFT_ERR_INVALID_ARGUMENT);
  OKW(weft_free(b, tu_stream(&env, 2)));
  free(src);
  free(dst);
}

static void test_a_pageable_source_may_be_reused_at_once(void **state) {
  (void)state;
  const size_t n = 3 * MIB + 5;
  weft_block_t b = tu_alloc(&env, n, 0, "reuse");
  unsigned char *src = malloc(n), *want = malloc(n), *dst = malloc(n);
  pattern(src, n, 9);
  memcpy(want, src, n);
  OKW(weft_copy_to_block(tu_stream(&env, 1), b, 0, src, n));
  memset(src, 0xee, n); /* before the stream ran the copy */
  OKW(weft_copy_from_block(tu_stream(&env, 3), dst, b, 0, n));
  assert_memory_equal(dst, want, n);
  OKW(weft_free(b, tu_stream(&env, 3)));
  free(src);
  free(want);
  free(dst);
}

static void test_page_locked_memory_is_copied_directly(void **state) {
  (void)state;
  if (drv->cuMemHostAlloc == NULL) skip();
  CUcontext ctx;
  assert_int_equal(drv->cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  assert_int_equal(drv->cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  const size_t n = 2 * MIB + 9;
  unsigned char *pin = NULL;
  assert_int_equal(drv->cuMemHostAlloc((void **)&pin, 2 * n, 0), CUDA_SUCCESS);
  weft_block_t b = tu_alloc(&env, n, 0, "pinned");
  pattern(pin, n, 4);
  weft_counters_t c0 = counters();
  OKW(weft_copy_to_block(tu_stream(&env, 1), b, 0, pin, n));
  OKW(weft_copy_from_block(tu_stream(&env, 2), pin + n, b, 0, n));
  OKW(weft_stream_synchronize(tu_stream(&env, 2)));
  assert_int_equal(counters().staged_copies, c0.staged_copies);
  assert_memory_equal(pin + n, pin, n);
  /* Memory only partly page-locked is staged. */
  unsigned char *tail = malloc(16);
  OKW(weft_copy_from_block(tu_stream(&env, 2), tail, b, n - 16, 16));
  assert_int_equal(counters().staged_copies, c0.staged_copies + 1);
  assert_memory_equal(tail, pin + n - 16, 16);
  free(tail);
  OKW(weft_free(b, tu_stream(&env, 2)));
  assert_int_equal(drv->cuMemFreeHost(pin), CUDA_SUCCESS);
  assert_int_equal(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

static void test_many_copies_in_flight_reuse_the_stages(void **state) {
  (void)state;
  tu_reset_races(&env);
  enum { K = 40 };
  weft_block_t b[K];
  unsigned char *src = malloc(MIB), *dst = malloc(MIB);
  for (int k = 0; k < K; k++) {
    b[k] = tu_alloc(&env, MIB, (unsigned)k % 4, "in flight");
    pattern(src, MIB, (unsigned)k);
    OKW(weft_copy_to_block(tu_stream(&env, (unsigned)k % 4), b[k], 0, src, MIB));
  }
  /* More copies than the runtime keeps stages: later ones waited for earlier ones' stages. */
  assert_true(counters().stage_buffers <= STAGES_KEPT + 1);
  for (int k = 0; k < K; k++) {
    pattern(src, MIB, (unsigned)k);
    OKW(weft_copy_from_block(tu_stream(&env, (unsigned)(k + 1) % 4), dst, b[k], 0, MIB));
    if (memcmp(dst, src, MIB) != 0) fail_msg("block %d differs", k);
    OKW(weft_free(b[k], tu_stream(&env, 0)));
  }
  assert_int_equal(tu_races(&env), 0);
  free(src);
  free(dst);
}

typedef struct worker {
  unsigned id;
  char why[256];
} worker_t;

static void *copy_worker(void *arg) {
  worker_t *w = arg;
  const size_t n = MIB + 7;
  unsigned char *src = malloc(n), *dst = malloc(n);
  weft_stream_t *s1, *s2;
  weft_block_t b;
  if (weft_stream_get(env.rt, w->id % 4, &s1) != WEFT_OK || weft_stream_get(env.rt, (w->id + 1) % 4, &s2) != WEFT_OK ||
      weft_alloc(env.rt, n, s1, "worker", &b) != WEFT_OK) {
    snprintf(w->why, sizeof w->why, "setup: %s", weft_last_error());
    return NULL;
  }
  for (unsigned it = 0; it < 30 && w->why[0] == '\0'; it++) {
    pattern(src, n, w->id * 100 + it);
    weft_status_t st = weft_copy_to_block(it % 2 ? s1 : s2, b, 0, src, n);
    if (st == WEFT_OK) st = weft_copy_from_block(it % 2 ? s2 : s1, dst, b, 0, n);
    if (st != WEFT_OK) snprintf(w->why, sizeof w->why, "iteration %u: %s", it, weft_last_error());
    else if (memcmp(dst, src, n) != 0) snprintf(w->why, sizeof w->why, "iteration %u: data differ", it);
  }
  if (weft_free(b, s1) != WEFT_OK && w->why[0] == '\0') snprintf(w->why, sizeof w->why, "free: %s", weft_last_error());
  free(src);
  free(dst);
  return NULL;
}

static void test_eight_threads_copy_through_one_runtime(void **state) {
  (void)state;
  tu_reset_races(&env);
  enum { T = 8 };
  pthread_t th[T];
  static worker_t w[T];
  for (unsigned i = 0; i < T; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].id = i;
    assert_int_equal(pthread_create(&th[i], NULL, copy_worker, &w[i]), 0);
  }
  for (unsigned i = 0; i < T; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  for (unsigned i = 0; i < T; i++)
    if (w[i].why[0] != '\0') fail_msg("thread %u: %s", i, w[i].why);
  /* At most the kept stages, and one more per thread taking one while all are busy. */
  assert_true(counters().stage_buffers <= STAGES_KEPT + T);
  assert_int_equal(tu_races(&env), 0);
}

static void test_copies_inside_a_capture_use_the_callers_memory(void **state) {
  (void)state;
  tu_reset_races(&env);
  enum { N = 4096 };
  static unsigned char src[N], dst[N];
  weft_block_t b = tu_alloc(&env, N, 0, "captured");
  weft_stream_t *c = tu_stream(&env, 1);
  weft_counters_t c0 = counters();
  OKW(weft_capture_begin(c, NULL));
  OKW(weft_copy_to_block(c, b, 0, src, N));
  OKW(weft_copy_from_block(c, dst, b, 0, N));
  weft_graph_t *g;
  weft_exec_t *e;
  OKW(weft_capture_end(c, &g));
  assert_int_equal(counters().staged_copies, c0.staged_copies);
  OKW(weft_graph_instantiate(g, c, &e));
  for (unsigned rep = 0; rep < 3; rep++) {
    pattern(src, N, rep); /* read by each launch, not at the capture */
    memset(dst, 0, N);
    OKW(weft_exec_launch(e, tu_stream(&env, 2)));
    OKW(weft_stream_synchronize(tu_stream(&env, 2)));
    assert_memory_equal(dst, src, N);
  }
  OKW(weft_exec_destroy(e));
  OKW(weft_graph_destroy(g));
  OKW(weft_free(b, c));
  assert_int_equal(tu_races(&env), 0);
}

/* A fault at the k-th call of each driver function a staged copy makes, in a fresh runtime life
 * (its first copy makes a stage): the call returns OK with the data moved, or an error with the
 * block (or the host buffer) as it was; later copies work; nothing races. */
static void test_a_fault_at_each_call_of_a_staged_copy(void **state) {
  (void)state;
  if (env.sim == NULL) skip();
  static const char *const fns[] = {"cuPointerGetAttribute", "cuMemHostAlloc", "cuEventCreate",
                                    "cuMemcpyHtoDAsync",     "cuMemcpyDtoHAsync", "cuEventRecord",
                                    "cuEventSynchronize",    "cuEventQuery"};
  const size_t n = MIB + 3;
  unsigned char *old = malloc(n), *neu = malloc(n), *dst = malloc(n);
  memset(old, 0x5a, n);
  pattern(neu, n, 2);
  int failed = 0, cells = 0;
  for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++)
    for (int k = 1; k <= 3; k++) {
      weft_options_t o = weft_options_default();
      o.high_priority_streams = 0;
      tu_fini(&env); /* a fresh life: no stage yet */
      if (tu_init(&env, &o) != 0) fail_msg("tu_init: %s", weft_last_error());
      weft_block_t b = tu_alloc(&env, n, 0, "faulted");
      OKW(weft_memset8(tu_stream(&env, 0), b, 0, 0x5a, n));
      tu_reset_races(&env);
      char spec[64];
      snprintf(spec, sizeof spec, "%s:%d:999", fns[f], k);
      assert_int_equal((env.sim->fail)(spec), 0);
      weft_status_t put = weft_copy_to_block(tu_stream(&env, 1), b, 0, neu, n);
      memset(dst, 0xab, n);
      weft_status_t got = weft_copy_from_block(tu_stream(&env, 2), dst, b, 0, n);
      (env.sim->fail)(NULL);
      cells++;
      failed += put != WEFT_OK || got != WEFT_OK;
      /* The block: the new bytes after an OK; after a failure each chunk (1 MiB) the old or the
       * new bytes (the chunks before the failed one were copied, each a tracked use). */
      unsigned char *now = malloc(n);
      OKW(weft_copy_from_block(tu_stream(&env, 3), now, b, 0, n));
      for (size_t at = 0; at < n; at += MIB) {
        size_t m = n - at < MIB ? n - at : MIB;
        bool is_new = memcmp(now + at, neu + at, m) == 0, is_old = memcmp(now + at, old + at, m) == 0;
        if (put == WEFT_OK ? !is_new : !(is_new || is_old))
          fail_msg("%s: weft_copy_to_block said %s and the chunk at %zu holds neither", spec, weft_status_name(put), at);
        /* The copy back: the block's bytes after an OK; after a failure each chunk the block's or
         * untouched. */
        bool back = memcmp(dst + at, now + at, m) == 0, untouched = true;
        for (size_t i = 0; i < m && untouched; i++) untouched = dst[at + i] == 0xab;
        if (got == WEFT_OK ? !back : !(back || untouched))
          fail_msg("%s: weft_copy_from_block said %s and its chunk at %zu is wrong", spec, weft_status_name(got), at);
      }
      free(now);
      if (tu_races(&env) != 0) {
        tu_print_races(&env);
        fail_msg("%s: races", spec);
      }
      OKW(weft_free(b, tu_stream(&env, 3)));
    }
  print_message("fault cells: %d, of them %d with a copy refused\n", cells, failed);
  assert_true(failed > 0);
  free(old);
  free(neu);
  free(dst);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pageable_copies_of_every_size_round_trip),
      cmocka_unit_test(test_a_pageable_source_may_be_reused_at_once),
      cmocka_unit_test(test_page_locked_memory_is_copied_directly),
      cmocka_unit_test(test_many_copies_in_flight_reuse_the_stages),
      cmocka_unit_test(test_eight_threads_copy_through_one_runtime),
      cmocka_unit_test(test_copies_inside_a_capture_use_the_callers_memory),
      cmocka_unit_test(test_a_fault_at_each_call_of_a_staged_copy),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
