/* Capture: a 3-stream training-step-like capture with internal hazards, temporaries and an
 * output, replayed 1,000 times among eager work that rewrites its input and reads its output;
 * the output policies; frees inside the capture; capture_run; housekeeping during a capture;
 * fault injection in capture and instantiation. Values are checked against a host model; on the
 * simulator the oracle must report no race. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/debug.h"
#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "tests/util/cmocka_env.h"

#define N 256
static tu_env_t env;
static const weft_block_t none = {0};

static int start(unsigned policy) {
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  o.output_policy = policy;
  return tu_init(&env, &o);
}
static int setup(void **state) {
  (void)state;
  return start(WEFT_OUTPUT_ERROR);
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}
static void read_all(weft_block_t b, unsigned *host) {
  assert_int_equal(tu_read(tu_stream(&env, 7), b, host, N * 4), WEFT_OK);
}

/* The step: tmp1 = 1 + 7x + 13w (s0); tmp2 = 2 + 7 tmp1 (s1); out = 3 + 7 tmp1 + 13 tmp2 (s2);
 * w = 4 + 7w + 13 tmp2 (s0); tmp1, tmp2 freed inside. */
typedef struct step {
  weft_block_t x, w;
} step_t;

static weft_status_t capture_step(weft_stream_t *s0, void *arg) {
  step_t *st = arg;
  weft_stream_t *s1 = tu_stream(&env, 1), *s2 = tu_stream(&env, 2);
  weft_status_t r;
  if ((r = weft_capture_join(s0, s1)) != WEFT_OK || (r = weft_capture_join(s0, s2)) != WEFT_OK) return r;
  weft_block_t tmp1, tmp2, out;
  if ((r = weft_alloc(env.rt, N * 4, s0, "tmp1", &tmp1)) != WEFT_OK) return r;
  if ((r = tu_combine(&env, s0, tmp1, none, st->x, st->w, none, N, 1)) != WEFT_OK) return r;
  if ((r = weft_alloc(env.rt, N * 4, s1, "tmp2", &tmp2)) != WEFT_OK) return r;
  if ((r = tu_combine(&env, s1, tmp2, none, tmp1, none, none, N, 2)) != WEFT_OK) return r;
  if ((r = weft_alloc(env.rt, N * 4, s2, "out", &out)) != WEFT_OK) return r;
  if ((r = tu_combine(&env, s2, out, none, tmp1, tmp2, none, N, 3)) != WEFT_OK) return r;
  if ((r = tu_combine(&env, s0, st->w, none, st->w, tmp2, none, N, 4)) != WEFT_OK) return r;
  if ((r = weft_free(tmp1, s0)) != WEFT_OK) return r;
  return weft_free(tmp2, s1);
}

static void model_step(unsigned x, unsigned *w, unsigned *out) {
  for (unsigned i = 0; i < N; i++) {
    unsigned t1 = 1 + 7u * x + 13u * w[i], t2 = 2 + 7u * t1;
    out[i] = 3 + 7u * t1 + 13u * t2;
    w[i] = 4 + 7u * w[i] + 13u * t2;
  }
}

static void test_three_stream_step_replays_a_thousand_times(void **state) {
  (void)state;
  tu_reset_races(&env);
  step_t st = {tu_alloc(&env, N * 4, 0, "x"), tu_alloc(&env, N * 4, 0, "w")};
  assert_int_equal(tu_fill(&env, tu_stream(&env, 3), st.w, N, 5), WEFT_OK);
  weft_graph_t *g;
  weft_status_t r = weft_capture_run(tu_stream(&env, 0), NULL, capture_step, &st, &g);
  if (r != WEFT_OK) fail_msg("capture: %s: %s", weft_status_name(r), weft_last_error());
  assert_int_equal(weft_graph_output_count(g), 1);
  weft_access_t sum[4];
  assert_int_equal(weft_graph_summary(g, sum, 4), 2);
  for (int i = 0; i < 2; i++) {
    if (sum[i].block.rec == st.x.rec) assert_int_equal(sum[i].kind, WEFT_READ);
    else assert_int_equal(sum[i].kind, WEFT_READ_WRITE);
  }
  weft_exec_t *e;
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
  unsigned w[N], out[N], got[N];
  for (unsigned i = 0; i < N; i++) w[i] = 5;
  CUdeviceptr first = 0;
  for (unsigned it = 0; it < 1000; it++) {
    /* Eager work around each launch: rewrite the input on one stream, launch on another, read
     * the output on a third, free it on a fourth. */
    assert_int_equal(tu_fill(&env, tu_stream(&env, 3 + it % 2), st.x, N, it), WEFT_OK);
    r = weft_exec_launch(e, tu_stream(&env, it % 3 == 0 ? 0 : 5));
    if (r != WEFT_OK) fail_msg("launch %u: %s: %s", it, weft_status_name(r), weft_last_error());
    model_step(it, w, out);
    weft_block_t o;
    assert_int_equal(weft_exec_output(e, 0, &o), WEFT_OK);
    CUdeviceptr p;
    assert_int_equal(weft_block_ptr(o, &p), WEFT_OK);
    if (it == 0) first = p;
    assert_true(p == first); /* graph memory: the same address every launch */
    if (it % 50 == 0 || it == 999) {
      read_all(o, got);
      for (unsigned i = 0; i < N; i++)
        if (got[i] != out[i]) fail_msg("launch %u element %u: %u != %u", it, i, got[i], out[i]);
    } else {
      weft_block_t sink = tu_alloc(&env, N * 4, 6, "sink");
      assert_int_equal(tu_combine(&env, tu_stream(&env, 6), sink, none, o, none, none, N, 0), WEFT_OK);
      assert_int_equal(weft_free(sink, tu_stream(&env, 6)), WEFT_OK);
    }
    assert_int_equal(weft_free(o, tu_stream(&env, 2 + it % 5)), WEFT_OK);
    assert_int_equal(weft_block_ptr(o, &p), WEFT_ERR_STALE_HANDLE);
  }
  read_all(st.w, got);
  for (unsigned i = 0; i < N; i++) assert_int_equal(got[i], w[i]);
  if (tu_races(&env) != 0) tu_print_races(&env);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_graph_destroy(g), WEFT_ERR_BUSY); /* the exec still exists */
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(st.x, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_free(st.w, tu_stream(&env, 0)), WEFT_OK);
}

typedef struct one_out {
  weft_block_t in;
} one_out_t;

static weft_status_t capture_one_output(weft_stream_t *s, void *arg) {
  one_out_t *o = arg;
  weft_block_t out;
  weft_status_t r = weft_alloc(env.rt, N * 4, s, "out", &out);
  if (r == WEFT_OK) r = tu_combine(&env, s, out, none, o->in, none, none, N, 9);
  return r;
}

static void test_relaunch_with_live_output_is_busy_until_freed(void **state) {
  (void)state;
  one_out_t o = {tu_alloc(&env, N * 4, 0, "in")};
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), o.in, N, 1), WEFT_OK);
  weft_graph_t *g;
  weft_exec_t *e;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, capture_one_output, &o, &g), WEFT_OK);
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_ERR_BUSY);
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 1)), WEFT_OK);
  weft_block_t a, b;
  assert_int_equal(weft_exec_output(e, 0, &a), WEFT_OK);
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 1)), WEFT_ERR_BUSY);
  assert_non_null(strstr(weft_last_error(), "out"));
  CUdeviceptr pa, pb;
  assert_int_equal(weft_block_ptr(a, &pa), WEFT_OK);
  assert_int_equal(weft_free(a, tu_stream(&env, 2)), WEFT_OK);
  assert_int_equal(weft_free(a, tu_stream(&env, 2)), WEFT_ERR_DOUBLE_FREE);
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 1)), WEFT_OK);
  assert_int_equal(weft_exec_output(e, 0, &b), WEFT_OK);
  assert_int_equal(weft_block_ptr(b, &pb), WEFT_OK);
  assert_true(pa == pb);             /* same address after the free */
  assert_true(a.gen != b.gen || a.rec != b.rec); /* but a new block */
  assert_int_equal(weft_block_ptr(a, &pa), WEFT_ERR_STALE_HANDLE);
  unsigned got[N];
  read_all(b, got);
  for (unsigned i = 0; i < N; i++) assert_int_equal(got[i], 16);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(o.in, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

static void test_auto_free_policy_frees_outputs_at_relaunch(void **state) {
  (void)state;
  tu_fini(&env);
  assert_int_equal(start(WEFT_OUTPUT_AUTO_FREE), 0);
  one_out_t o = {tu_alloc(&env, N * 4, 0, "in")};
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), o.in, N, 2), WEFT_OK);
  weft_graph_t *g;
  weft_exec_t *e;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, capture_one_output, &o, &g), WEFT_OK);
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
  weft_block_t prev = {0};
  for (unsigned it = 0; it < 20; it++) {
    assert_int_equal(weft_exec_launch(e, tu_stream(&env, it % 4)), WEFT_OK);
    weft_block_t cur;
    assert_int_equal(weft_exec_output(e, 0, &cur), WEFT_OK);
    if (prev.rec != NULL) {
      CUdeviceptr p;
      assert_int_equal(weft_block_ptr(prev, &p), WEFT_ERR_STALE_HANDLE); /* freed by the launch */
    }
    /* A reader of the output on another stream: the next launch must wait for it. */
    weft_block_t sink = tu_alloc(&env, N * 4, 5, "sink");
    assert_int_equal(tu_combine(&env, tu_stream(&env, 5), sink, none, cur, none, none, N, 0), WEFT_OK);
    assert_int_equal(weft_free(sink, tu_stream(&env, 5)), WEFT_OK);
    prev = cur;
  }
  unsigned got[N];
  read_all(prev, got);
  for (unsigned i = 0; i < N; i++) assert_int_equal(got[i], 9 + 14);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_ERR_BUSY); /* its output is live */
  assert_int_equal(weft_free(prev, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(o.in, tu_stream(&env, 0)), WEFT_OK);
  tu_fini(&env);
  assert_int_equal(start(WEFT_OUTPUT_ERROR), 0);
}

static weft_status_t free_outside_block(weft_stream_t *s, void *arg) {
  weft_block_t *b = arg;
  weft_status_t r = weft_free(*b, s);
  if (r != WEFT_ERR_CAPTURE) return WEFT_ERR_INVALID_ARGUMENT;
  /* The capture goes on: the block is still live and usable inside. */
  return tu_combine(&env, s, *b, none, *b, none, none, N, 1);
}

static void test_free_of_a_block_from_before_the_capture_is_refused(void **state) {
  (void)state;
  weft_block_t b = tu_alloc(&env, N * 4, 0, "outside");
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), b, N, 0), WEFT_OK);
  weft_graph_t *g;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, free_outside_block, &b, &g), WEFT_OK);
  assert_int_equal(weft_graph_output_count(g), 0);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
}

static weft_status_t failing_body(weft_stream_t *s, void *arg) {
  (void)arg;
  weft_block_t t;
  weft_status_t r = weft_alloc(env.rt, 64, s, "leaked?", &t);
  if (r != WEFT_OK) return r;
  return weft__error(WEFT_ERR_INVALID_ARGUMENT, "the body failed on purpose");
}

static void test_capture_run_always_ends_the_capture(void **state) {
  (void)state;
  weft_graph_t *g = NULL;
  weft_counters_t c0;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, failing_body, NULL, &g), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "on purpose"));
  assert_null(g);
  /* The stream is free again: eager work and a new capture work. */
  weft_block_t b = tu_alloc(&env, N * 4, 0, "after");
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), b, N, 3), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_capture_begin(tu_stream(&env, 0), NULL), WEFT_OK);
  assert_int_equal(weft_capture_begin(tu_stream(&env, 0), NULL), WEFT_ERR_CAPTURE);
  assert_int_equal(weft_runtime_release(env.rt), WEFT_ERR_BUSY); /* not while capturing */
  assert_int_equal(weft_stream_synchronize(tu_stream(&env, 0)), WEFT_ERR_CAPTURE);
  assert_int_equal(weft_capture_end(tu_stream(&env, 0), &g), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_capture_end(tu_stream(&env, 0), &g), WEFT_ERR_CAPTURE);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
}

/* Eager allocations and frees on other streams during a GLOBAL capture must not run anything
 * that would invalidate it (event queries, pool attributes, trims). */
static weft_status_t eager_churn_during_capture(weft_stream_t *s, void *arg) {
  (void)arg;
  for (int i = 0; i < 50; i++) {
    weft_block_t b;
    weft_status_t r = weft_alloc(env.rt, 4096u << (i % 8), tu_stream(&env, 3 + i % 3), "eager", &b);
    if (r == WEFT_OK) r = tu_fill(&env, tu_stream(&env, 3 + i % 3), b, 16, (unsigned)i);
    if (r == WEFT_OK) r = weft_free(b, tu_stream(&env, 4));
    if (r != WEFT_OK) return r;
  }
  weft_block_t t;
  weft_status_t r = weft_alloc(env.rt, N * 4, s, "captured", &t);
  if (r == WEFT_OK) r = tu_fill(&env, s, t, N, 1);
  if (r == WEFT_OK) r = weft_free(t, s);
  return r;
}

static void test_eager_memory_churn_does_not_break_a_global_capture(void **state) {
  (void)state;
  weft_graph_t *g;
  weft_status_t r = weft_capture_run(tu_stream(&env, 0), NULL, eager_churn_during_capture, NULL, &g);
  if (r != WEFT_OK) fail_msg("%s: %s", weft_status_name(r), weft_last_error());
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

/* Code that begins a capture with raw driver calls and calls weft inside it. */
static void test_foreign_capture_works(void **state) {
  (void)state;
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  weft_block_t y = tu_alloc(&env, N * 4, 1, "y"), x = tu_alloc(&env, N * 4, 1, "x");
  assert_int_equal(tu_fill(&env, tu_stream(&env, 1), x, N, 6), WEFT_OK); /* last touched on stream 1 */
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  CUstream raw = weft_stream_raw(tu_stream(&env, 0));
  assert_int_equal(d->cuStreamBeginCapture(raw, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  weft_block_t t;
  assert_int_equal(weft_alloc(env.rt, N * 4, tu_stream(&env, 0), "t", &t), WEFT_OK);   /* a memory node */
  /* no isolation error */
  assert_int_equal(tu_combine(&env, tu_stream(&env, 0), t, none, x, none, none, N, 1), WEFT_OK);
  assert_int_equal(tu_combine(&env, tu_stream(&env, 0), y, none, t, none, none, N, 2), WEFT_OK);
  assert_int_equal(weft_free(t, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_free(x, tu_stream(&env, 0)), WEFT_ERR_CAPTURE);
  CUgraph g;
  assert_int_equal(d->cuStreamEndCapture(raw, &g), CUDA_SUCCESS);
  CUgraphExec ge;
  assert_int_equal(d->cuGraphInstantiateWithFlags(&ge, g, 0), CUDA_SUCCESS);
  assert_int_equal(d->cuGraphLaunch(ge, raw), CUDA_SUCCESS);
  assert_int_equal(d->cuStreamSynchronize(raw), CUDA_SUCCESS);
  /* weft notices the end at its next call on the stream; t's handle is stale. */
  unsigned got[N];
  read_all(y, got);
  for (unsigned i = 0; i < N; i++) assert_int_equal(got[i], 2 + 7u * (1 + 7u * 6));
  CUdeviceptr p;
  assert_int_equal(weft_block_ptr(t, &p), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), y, N, 0), WEFT_OK);
  assert_int_equal(d->cuGraphExecDestroy(ge), CUDA_SUCCESS);
  assert_int_equal(d->cuGraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(weft_free(x, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_free(y, tu_stream(&env, 0)), WEFT_OK);
}

/* Code outside weft: begins a GLOBAL capture on raw0 and forks it onto raw1 (an event recorded on
 * raw0, waited for on raw1), with events of its own (*fork, *join; outside_rejoin ends them). */
static void outside_fork(const weft__driver_t *d, CUstream raw0, CUstream raw1, CUevent *fork, CUevent *join) {
  assert_int_equal(d->cuEventCreate(fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  assert_int_equal(d->cuEventCreate(join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  assert_int_equal(d->cuStreamBeginCapture(raw0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(d->cuEventRecord(*fork, raw0), CUDA_SUCCESS);
  assert_int_equal(d->cuStreamWaitEvent(raw1, *fork, 0), CUDA_SUCCESS); /* raw1 joins the capture */
}

/* The same code rejoins raw1 to raw0 and ends the capture (*g: its graph), then drops its events. */
static void outside_rejoin(const weft__driver_t *d, CUstream raw0, CUstream raw1, CUevent fork, CUevent join, CUgraph *g) {
  assert_int_equal(d->cuEventRecord(join, raw1), CUDA_SUCCESS);
  assert_int_equal(d->cuStreamWaitEvent(raw0, join, 0), CUDA_SUCCESS);
  assert_int_equal(d->cuStreamEndCapture(raw0, g), CUDA_SUCCESS);
  assert_int_equal(d->cuEventDestroy(fork), CUDA_SUCCESS);
  assert_int_equal(d->cuEventDestroy(join), CUDA_SUCCESS);
}

/* Code outside weft begins a capture on one stream and forks it onto a second (an event recorded
 * on the capturing stream, waited for on the other), as a framework's multi-stream capture does
 * (PyTorch: s1.wait_stream(s0) inside torch.cuda.graph). weft meets the capture first on the
 * second stream, then on the first: both take part in one weft capture, so a block allocated
 * inside on one stream is used and freed inside on the other, ordered by weft there, and the
 * capture ends, instantiates and replays right. */
static void test_a_foreign_capture_forked_onto_a_second_stream(void **state) {
  (void)state;
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  weft_stream_t *s0 = tu_stream(&env, 0), *s1 = tu_stream(&env, 1);
  weft_block_t y = tu_alloc(&env, N * 4, 0, "y"), x = tu_alloc(&env, N * 4, 0, "x");
  assert_int_equal(tu_fill(&env, s0, x, N, 6), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  CUstream raw0 = weft_stream_raw(s0), raw1 = weft_stream_raw(s1);
  CUevent fork, join;
  outside_fork(d, raw0, raw1, &fork, &join);
  weft_block_t t;
  assert_int_equal(weft_alloc(env.rt, N * 4, s1, "t", &t), WEFT_OK); /* weft meets the capture on s1 first */
  assert_int_equal(tu_combine(&env, s1, t, none, x, none, none, N, 1), WEFT_OK);
  int capturing = 0;
  assert_int_equal(weft_stream_is_capturing(s0, &capturing), WEFT_OK);
  assert_int_equal(capturing, 1);
  /* On s0: t, allocated inside on s1, is the capture's own block here too. */
  assert_int_equal(tu_combine(&env, s0, y, none, t, none, none, N, 2), WEFT_OK);
  assert_int_equal(weft_free(t, s0), WEFT_OK);
  CUgraph g;
  outside_rejoin(d, raw0, raw1, fork, join, &g);
  /* weft notices the end on s1, which joined the capture: both streams leave it. */
  assert_int_equal(weft_stream_is_capturing(s1, &capturing), WEFT_OK);
  assert_int_equal(capturing, 0);
  assert_int_equal(weft_stream_is_capturing(s0, &capturing), WEFT_OK);
  assert_int_equal(capturing, 0);
  CUgraphExec ge;
  assert_int_equal(d->cuGraphInstantiateWithFlags(&ge, g, 0), CUDA_SUCCESS);
  for (unsigned r = 0; r < 3; r++) {
    assert_int_equal(tu_fill(&env, s0, y, N, 0), WEFT_OK);
    assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
    assert_int_equal(d->cuGraphLaunch(ge, raw0), CUDA_SUCCESS);
    assert_int_equal(d->cuStreamSynchronize(raw0), CUDA_SUCCESS);
    unsigned got[N];
    read_all(y, got);
    for (unsigned i = 0; i < N; i++) assert_int_equal(got[i], 2 + 7u * (1 + 7u * 6));
  }
  assert_int_equal(tu_fill(&env, s1, x, N, 5), WEFT_OK); /* live work on s1 again */
  CUdeviceptr p;
  assert_int_equal(weft_block_ptr(t, &p), WEFT_ERR_STALE_HANDLE);
  assert_int_equal(d->cuGraphExecDestroy(ge), CUDA_SUCCESS);
  assert_int_equal(d->cuGraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(weft_free(x, s0), WEFT_OK);
  assert_int_equal(weft_free(y, s0), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

/* The same fork seen by several threads at once: code outside weft forks its capture onto four
 * pool streams, and four threads each allocate on their own stream at the same moment, so that
 * weft meets the one driver capture on four streams concurrently. It must become one weft
 * capture (the join happens in the same lock hold as the search, weft__capture_begin): every
 * block is then usable on the origin stream, the capture ends and replays right. 20 rounds (also
 * under asan and tsan, tools/test.sh). */
#define FORKED 4
typedef struct fork_arg {
  weft_stream_t *s;
  pthread_barrier_t *go;
  weft_block_t b;
  weft_status_t st;
} fork_arg_t;

static void *alloc_on_fork(void *p) {
  fork_arg_t *a = p;
  pthread_barrier_wait(a->go);
  a->st = weft_alloc(env.rt, N * 4, a->s, "forked", &a->b);
  return NULL;
}

static void test_threads_meet_one_forked_foreign_capture_at_once(void **state) {
  (void)state;
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  weft_stream_t *s0 = tu_stream(&env, 0);
  weft_block_t y = tu_alloc(&env, N * 4, 0, "y");
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  CUevent fork, join[FORKED];
  assert_int_equal(d->cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  for (int i = 0; i < FORKED; i++) assert_int_equal(d->cuEventCreate(&join[i], CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUstream raw0 = weft_stream_raw(s0);
  for (unsigned round = 0; round < 20; round++) {
    assert_int_equal(d->cuStreamBeginCapture(raw0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(d->cuEventRecord(fork, raw0), CUDA_SUCCESS);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, FORKED);
    fork_arg_t a[FORKED];
    pthread_t th[FORKED];
    for (int i = 0; i < FORKED; i++) {
      weft_stream_t *si = tu_stream(&env, (unsigned)(i + 1));
      assert_int_equal(d->cuStreamWaitEvent(weft_stream_raw(si), fork, 0), CUDA_SUCCESS);
      a[i] = (fork_arg_t){si, &go, {0}, WEFT_OK};
      assert_int_equal(pthread_create(&th[i], NULL, alloc_on_fork, &a[i]), 0);
    }
    for (int i = 0; i < FORKED; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < FORKED; i++) {
      if (a[i].st != WEFT_OK) fail_msg("round %u: weft_alloc on forked stream %d: %s", round, i + 1, weft_status_name(a[i].st));
      assert_int_equal(tu_fill(&env, a[i].s, a[i].b, N, (unsigned)(10 * round + i)), WEFT_OK);
    }
    /* On the origin: every forked stream's block is the capture's own block there too. */
    for (int i = 0; i < FORKED; i++) {
      assert_int_equal(tu_combine(&env, s0, y, none, a[i].b, none, none, N, (unsigned)i), WEFT_OK);
      assert_int_equal(weft_free(a[i].b, s0), WEFT_OK);
    }
    for (int i = 0; i < FORKED; i++) {
      CUstream ri = weft_stream_raw(tu_stream(&env, (unsigned)(i + 1)));
      assert_int_equal(d->cuEventRecord(join[i], ri), CUDA_SUCCESS);
      assert_int_equal(d->cuStreamWaitEvent(raw0, join[i], 0), CUDA_SUCCESS);
    }
    CUgraph g;
    assert_int_equal(d->cuStreamEndCapture(raw0, &g), CUDA_SUCCESS);
    CUgraphExec ge;
    assert_int_equal(d->cuGraphInstantiateWithFlags(&ge, g, 0), CUDA_SUCCESS);
    int capturing = 1;
    assert_int_equal(weft_stream_is_capturing(s0, &capturing), WEFT_OK); /* weft notices the end */
    assert_int_equal(capturing, 0);
    assert_int_equal(d->cuGraphLaunch(ge, raw0), CUDA_SUCCESS);
    assert_int_equal(d->cuStreamSynchronize(raw0), CUDA_SUCCESS);
    unsigned got[N];
    read_all(y, got);
    unsigned want = 3 + 7u * (10 * round + 3); /* the last combine: y = i + 7 t_i with i = 3 */
    for (unsigned k = 0; k < N; k++) assert_int_equal(got[k], want);
    assert_int_equal(d->cuGraphExecDestroy(ge), CUDA_SUCCESS);
    assert_int_equal(d->cuGraphDestroy(g), CUDA_SUCCESS);
  }
  for (int i = 0; i < FORKED; i++) assert_int_equal(d->cuEventDestroy(join[i]), CUDA_SUCCESS);
  assert_int_equal(d->cuEventDestroy(fork), CUDA_SUCCESS);
  assert_int_equal(weft_free(y, s0), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

/* The capture handler (weft_set_capture_handler) runs on every stream weft meets a capture from
 * outside on, the streams it was forked onto included, before anything is allocated there: so a
 * thread that allocates on a forked stream first, while another thread met the capture first on
 * another stream, still allocates from the pool the handler chooses. Both streams' blocks come
 * from the handler's graph pool. */
typedef struct handler_seen {
  weft_graph_pool_t *pool;
  unsigned calls;
  uint64_t ids[4];
} handler_seen_t;

static weft_status_t to_pool(weft_stream_t *s, uint64_t id, void *user) {
  handler_seen_t *h = user;
  if (h->calls < 4) h->ids[h->calls] = id;
  h->calls++;
  return weft_capture_allocate_to(s, h->pool);
}

static void test_a_forked_foreign_capture_calls_the_handler_on_each_stream(void **state) {
  (void)state;
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  weft_stream_t *s0 = tu_stream(&env, 0), *s1 = tu_stream(&env, 1);
  handler_seen_t h = {0};
  assert_int_equal(weft_graph_pool_create(env.rt, &h.pool), WEFT_OK);
  assert_int_equal(weft_set_capture_handler(env.rt, to_pool, &h), WEFT_OK);
  CUstream raw0 = weft_stream_raw(s0), raw1 = weft_stream_raw(s1);
  CUevent fork, join;
  outside_fork(d, raw0, raw1, &fork, &join);
  weft_block_t a, b;
  assert_int_equal(weft_alloc(env.rt, N * 4, s0, "a", &a), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, N * 4, s1, "b", &b), WEFT_OK);
  assert_int_equal(h.calls, 2); /* s0, then s1, which joined s0's capture */
  assert_true(h.ids[0] == h.ids[1] && h.ids[0] != 0);
  CUdeviceptr pa, pb;
  assert_int_equal(weft_block_ptr(a, &pa), WEFT_OK);
  assert_int_equal(weft_block_ptr(b, &pb), WEFT_OK);
  assert_true(weft_graph_pool_owns(h.pool, pa) && weft_graph_pool_owns(h.pool, pb));
  assert_int_equal(tu_fill(&env, s1, b, N, 3), WEFT_OK);
  assert_int_equal(tu_combine(&env, s0, a, none, b, none, none, N, 1), WEFT_OK); /* b from s1, on s0 */
  assert_int_equal(weft_free(b, s0), WEFT_OK);
  assert_int_equal(weft_free(a, s0), WEFT_OK);
  CUgraph g;
  outside_rejoin(d, raw0, raw1, fork, join, &g);
  int capturing = 1;
  assert_int_equal(weft_stream_is_capturing(s1, &capturing), WEFT_OK); /* weft notices the end */
  assert_int_equal(capturing, 0);
  assert_int_equal(d->cuGraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(weft_set_capture_handler(env.rt, NULL, NULL), WEFT_OK);
  assert_int_equal(weft_graph_pool_destroy(h.pool), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

/* Two threads meet one capture begun outside weft: the thread that adopts it runs the capture
 * handler, which chooses where weft_alloc inside it allocates (weft_capture_allocate_to). The
 * other thread's weft_alloc must wait for the handler: before, it went on once the capture was
 * adopted and, when it came first, allocated from a graph memory node (which the owner's graph
 * keeps: PyTorch's frees of it were lost; tests/torch test_torch_pools' eight threads). A test
 * point holds the adopting thread between the adoption and its handler. */
#if WEFT__TEST_POINTS
static weft_stream_t *race_s;
static atomic_int race_go, race_waiting, race_done;
static weft_graph_pool_t *race_pool;
static atomic_int race_handled;

static void race_hook(const char *point, void *arg) {
  if (arg != race_s) return;
  if (strcmp(point, "sync_capture: adopted") == 0) {
    atomic_store(&race_go, 1); /* the other thread allocates now; this one waits until it waits (or is done) */
    while (!atomic_load(&race_waiting) && !atomic_load(&race_done)) sched_yield();
  } else if (strcmp(point, "sync_capture: waiting for the capture handler") == 0) {
    atomic_store(&race_waiting, 1);
  }
}

static weft_status_t race_handler(weft_stream_t *s, uint64_t id, void *user) {
  (void)id;
  (void)user;
  atomic_fetch_add(&race_handled, 1);
  return weft_capture_allocate_to(s, race_pool);
}

typedef struct race_alloc {
  bool wait_go;
  weft_block_t b;
  weft_status_t st;
} race_alloc_t;

static void *race_alloc(void *arg) {
  race_alloc_t *a = arg;
  if (a->wait_go)
    while (!atomic_load(&race_go)) sched_yield();
  a->st = weft_alloc(env.rt, N * 4, race_s, "race", &a->b);
  if (a->wait_go) atomic_store(&race_done, 1);
  return NULL;
}
#endif

static void test_a_second_thread_waits_for_the_capture_handler(void **state) {
  (void)state;
#if !WEFT__TEST_POINTS
  skip(); /* the test points are compiled only where WEFT_DEBUG >= 1 (the asan and tsan configs) */
#else
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  race_s = tu_stream(&env, 0);
  atomic_store(&race_go, 0);
  atomic_store(&race_waiting, 0);
  atomic_store(&race_done, 0);
  atomic_store(&race_handled, 0);
  assert_int_equal(weft_graph_pool_create(env.rt, &race_pool), WEFT_OK);
  assert_int_equal(weft_set_capture_handler(env.rt, race_handler, NULL), WEFT_OK);
  CUstream raw = weft_stream_raw(race_s);
  assert_int_equal(d->cuStreamBeginCapture(raw, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  atomic_store(&weft__test_hook, race_hook);
  race_alloc_t first = {false, {0}, WEFT_OK}, second = {true, {0}, WEFT_OK};
  pthread_t t[2];
  pthread_create(&t[1], NULL, race_alloc, &second);
  pthread_create(&t[0], NULL, race_alloc, &first);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  atomic_store(&weft__test_hook, NULL);
  assert_int_equal(atomic_load(&race_go), 1); /* premise: one thread adopted the capture here */
  assert_int_equal(atomic_load(&race_handled), 1);
  race_alloc_t *both[2] = {&first, &second};
  for (int i = 0; i < 2; i++) {
    if (both[i]->st != WEFT_OK) fail_msg("allocation %d: %s: %s", i, weft_status_name(both[i]->st), weft_last_error());
    CUdeviceptr p;
    assert_int_equal(weft_block_ptr(both[i]->b, &p), WEFT_OK);
    if (!weft_graph_pool_owns(race_pool, p)) fail_msg("allocation %d took no memory of the handler's pool", i);
  }
  assert_int_equal(atomic_load(&race_waiting), 1); /* the allocation that came second waited */
  for (int i = 0; i < 2; i++) assert_int_equal(weft_free(both[i]->b, race_s), WEFT_OK);
  CUgraph g;
  assert_int_equal(d->cuStreamEndCapture(raw, &g), CUDA_SUCCESS);
  assert_int_equal(d->cuGraphDestroy(g), CUDA_SUCCESS);
  int a = 1;
  assert_int_equal(weft_stream_is_capturing(race_s, &a), WEFT_OK); /* weft meets the end */
  assert_int_equal(a, 0);
  assert_int_equal(weft_set_capture_handler(env.rt, NULL, NULL), WEFT_OK);
  assert_int_equal(weft_graph_pool_destroy(race_pool), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
#endif
}

/* A thread asks the driver about a stream while code outside weft captures it, and the owner ends
 * the capture before that thread adopts it: weft must not adopt the ended capture nor run the
 * capture handler for it (the PyTorch adapter made such a capture a pool that nobody destroyed:
 * tests/torch test_torch_pools' eight threads, "1 graph pools left"). A test point holds the
 * thread between its probe and the adoption while the owner ends the capture. */
#if WEFT__TEST_POINTS
static atomic_int stale_probed, stale_ended, stale_handled;
static weft_stream_t *stale_s;

static void stale_hook(const char *point, void *arg) {
  if (arg != stale_s || strcmp(point, "sync_capture: probed") != 0 || atomic_load(&stale_probed)) return;
  atomic_store(&stale_probed, 1);
  while (!atomic_load(&stale_ended)) sched_yield(); /* the owner ends the capture meanwhile */
}

static weft_status_t stale_handler(weft_stream_t *s, uint64_t id, void *user) {
  (void)s;
  (void)id;
  (void)user;
  atomic_fetch_add(&stale_handled, 1);
  return WEFT_OK;
}

typedef struct stale_ask {
  int capturing;
  weft_status_t st;
} stale_ask_t;

static void *stale_ask(void *arg) {
  stale_ask_t *a = arg;
  a->st = weft_stream_is_capturing(stale_s, &a->capturing);
  return NULL;
}
#endif

static void test_a_capture_ended_before_its_adoption_is_not_adopted(void **state) {
  (void)state;
#if !WEFT__TEST_POINTS
  skip(); /* the test points are compiled only where WEFT_DEBUG >= 1 (the asan and tsan configs) */
#else
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  stale_s = tu_stream(&env, 1);
  atomic_store(&stale_probed, 0);
  atomic_store(&stale_ended, 0);
  atomic_store(&stale_handled, 0);
  assert_int_equal(weft_set_capture_handler(env.rt, stale_handler, NULL), WEFT_OK);
  CUstream raw = weft_stream_raw(stale_s);
  assert_int_equal(d->cuStreamBeginCapture(raw, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  atomic_store(&weft__test_hook, stale_hook);
  stale_ask_t a = {-1, WEFT_OK};
  pthread_t t;
  pthread_create(&t, NULL, stale_ask, &a);
  while (!atomic_load(&stale_probed)) sched_yield();
  CUgraph g;
  assert_int_equal(d->cuStreamEndCapture(raw, &g), CUDA_SUCCESS); /* ended before the other thread adopts it */
  atomic_store(&stale_ended, 1);
  pthread_join(t, NULL);
  atomic_store(&weft__test_hook, NULL);
  assert_int_equal(d->cuGraphDestroy(g), CUDA_SUCCESS);
  if (a.st != WEFT_OK) fail_msg("weft_stream_is_capturing: %s: %s", weft_status_name(a.st), weft_last_error());
  assert_int_equal(a.capturing, 0);
  assert_int_equal(atomic_load(&stale_handled), 0);
  /* The stream works live at once. */
  weft_block_t x = tu_alloc(&env, N * 4, 1, "x");
  assert_int_equal(tu_fill(&env, stale_s, x, N, 3), WEFT_OK);
  unsigned got[N];
  read_all(x, got);
  for (unsigned i = 0; i < N; i++) assert_int_equal(got[i], 3);
  assert_int_equal(weft_free(x, stale_s), WEFT_OK);
  assert_int_equal(weft_set_capture_handler(env.rt, NULL, NULL), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
#endif
}

/* A capture handler that a launch runs destroys the exec being launched: weft_exec_launch(e, s)
 * is inside e when it meets, on s, a capture begun outside weft, and runs the handler there. The
 * destroy must be BUSY and change nothing (weft.h's destroy rule); before, it freed e while the
 * launch still read it. The launch itself is refused (CAPTURE) after the handler ran; e launches
 * once the capture is over. */
typedef struct destroy_in_launch {
  weft_exec_t *e;
  unsigned calls;
  weft_status_t destroyed;
} destroy_in_launch_t;

static weft_status_t destroy_the_exec(weft_stream_t *s, uint64_t id, void *user) {
  (void)s;
  (void)id;
  destroy_in_launch_t *h = user;
  if (h->calls++ == 0) h->destroyed = weft_exec_destroy(h->e);
  return WEFT_OK;
}

static void test_a_capture_handler_inside_an_exec_launch_cannot_destroy_the_exec(void **state) {
  (void)state;
  const weft__driver_t *d;
  assert_int_equal(weft__driver_get(&d), WEFT_OK);
  weft_stream_t *s0 = tu_stream(&env, 0);
  weft_block_t x = tu_alloc(&env, N * 4, 0, "x");
  assert_int_equal(weft_capture_begin(s0, NULL), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, x, N, 4), WEFT_OK); /* the graph writes x */
  weft_graph_t *g;
  assert_int_equal(weft_capture_end(s0, &g), WEFT_OK);
  destroy_in_launch_t h = {NULL, 0, WEFT_OK};
  assert_int_equal(weft_graph_instantiate(g, s0, &h.e), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  assert_int_equal(weft_set_capture_handler(env.rt, destroy_the_exec, &h), WEFT_OK);
  CUstream raw = weft_stream_raw(s0);
  /* Outside weft: a capture on s0, which weft first meets inside the launch. Nothing below
   * asserts until it is ended, so no capture stays open for the tests after this one. */
  CUresult begun = d->cuStreamBeginCapture(raw, CU_STREAM_CAPTURE_MODE_RELAXED);
  weft_status_t launched = begun == CUDA_SUCCESS ? weft_exec_launch(h.e, s0) : WEFT_OK;
  char why[256];
  snprintf(why, sizeof why, "%s", launched != WEFT_OK ? weft_last_error() : "");
  CUgraph raw_g = NULL;
  CUresult ended = begun == CUDA_SUCCESS ? d->cuStreamEndCapture(raw, &raw_g) : CUDA_SUCCESS;
  if (raw_g != NULL) (void)d->cuGraphDestroy(raw_g);
  int capturing = 1;
  weft_status_t seen = weft_stream_is_capturing(s0, &capturing); /* weft meets the end */
  assert_int_equal(weft_set_capture_handler(env.rt, NULL, NULL), WEFT_OK);
  /* e is still usable: it launches outside the capture and is destroyed once (unless the
   * handler's destroy freed it: then it is not touched again). */
  bool alive = h.calls == 0 || h.destroyed != WEFT_OK;
  weft_status_t relaunched = alive ? weft_exec_launch(h.e, s0) : WEFT_ERR_STALE_HANDLE;
  char why_again[256];
  snprintf(why_again, sizeof why_again, "%s", relaunched != WEFT_OK ? weft_last_error() : "");
  unsigned got[N] = {0};
  if (relaunched == WEFT_OK) read_all(x, got);
  weft_status_t destroyed = alive ? weft_exec_destroy(h.e) : WEFT_ERR_STALE_HANDLE;
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  weft_status_t gone = weft_graph_destroy(g);
  assert_int_equal(weft_free(x, s0), WEFT_OK);

  assert_int_equal(begun, CUDA_SUCCESS);
  assert_int_equal(ended, CUDA_SUCCESS);
  assert_int_equal(seen, WEFT_OK);
  assert_int_equal(capturing, 0);
  if (h.calls == 0) /* the precondition: the launch met the capture and ran the handler */
    fail_msg("the capture handler never ran inside weft_exec_launch (it returned %s: %s)", weft_status_name(launched), why);
  assert_int_equal(h.calls, 1);
  if (h.destroyed != WEFT_ERR_BUSY)
    fail_msg("weft_exec_destroy inside the launch's capture handler returned %s, not BUSY", weft_status_name(h.destroyed));
  if (launched != WEFT_ERR_CAPTURE) fail_msg("the launch inside the capture returned %s: %s", weft_status_name(launched), why);
  if (relaunched != WEFT_OK) fail_msg("the launch after the capture: %s: %s", weft_status_name(relaunched), why_again);
  for (unsigned i = 0; i < N; i++) assert_int_equal(got[i], 4);
  assert_int_equal(destroyed, WEFT_OK);
  assert_int_equal(gone, WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
}

/* Faults injected inside the capture and at instantiation (simulator only): clear errors, the
 * capture is always ended, nothing leaks. */
static void test_faults_in_capture_and_instantiate(void **state) {
  (void)state;
  if (env.sim == NULL) skip(); /* fault injection needs the simulator */
  one_out_t o = {tu_alloc(&env, N * 4, 0, "in")};
  weft_graph_t *g = NULL;
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(env.rt, &c0), WEFT_OK);
  /* The graph allocation fails inside the capture. */
  assert_int_equal((env.sim->fail)("cuMemAllocAsync:1:2"), 0);
  weft_status_t r = weft_capture_run(tu_stream(&env, 0), NULL, capture_one_output, &o, &g);
  if (r != WEFT_ERR_OUT_OF_MEMORY) fail_msg("%s: %s", weft_status_name(r), weft_last_error());
  assert_null(g);
  /* The capture's end fails. */
  assert_int_equal((env.sim->fail)("cuStreamEndCapture:1:901"), 0);
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, capture_one_output, &o, &g), WEFT_ERR_CAPTURE);
  assert_null(g);
  assert_int_equal((env.sim->fail)(NULL), 0);
  /* Instantiation fails: the graph stays usable. */
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, capture_one_output, &o, &g), WEFT_OK);
  weft_exec_t *e;
  assert_int_equal((env.sim->fail)("cuGraphInstantiateWithFlags:1:1"), 0);
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_ERR_DRIVER);
  assert_int_equal(weft_last_driver_error(), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal((env.sim->fail)("cuGraphLaunch:1:1"), 0);
  assert_int_equal(weft_graph_instantiate(g, tu_stream(&env, 0), &e), WEFT_OK);
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 0)), WEFT_ERR_DRIVER);
  weft_block_t out;
  assert_int_equal(weft_exec_output(e, 0, &out), WEFT_OK);
  assert_null(out.rec); /* a failed launch publishes nothing */
  assert_int_equal((env.sim->fail)(NULL), 0);
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_exec_output(e, 0, &out), WEFT_OK);
  assert_int_equal(weft_free(out, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(o.in, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_runtime_counters(env.rt, &c1), WEFT_OK);
  assert_int_equal(c1.allocs - c0.allocs, c1.frees - c0.frees); /* every block accounted for */
}

/* A block used inside a capture, freed meanwhile on a live stream and its record handed out
 * again: the graph's summary names the block the capture saw, so a launch is refused
 * (STALE_HANDLE), not run on the new block's memory. */
static void test_a_block_freed_during_the_capture_makes_the_launch_stale(void **state) {
  (void)state;
  weft_stream_t *s0 = tu_stream(&env, 0), *s3 = tu_stream(&env, 3);
  weft_block_t x = tu_alloc(&env, N * 4, 3, "x");
  assert_int_equal(tu_fill(&env, s3, x, N, 1), WEFT_OK);
  assert_int_equal(weft_capture_begin(s0, NULL), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, x, N, 2), WEFT_OK); /* the graph writes x */
  assert_int_equal(weft_free(x, s3), WEFT_OK);           /* a live stream's free */
  weft_block_t y = tu_alloc(&env, N * 4, 3, "y");        /* x's record again */
  weft_graph_t *g;
  assert_int_equal(weft_capture_end(s0, &g), WEFT_OK);
  weft_exec_t *e;
  assert_int_equal(weft_graph_instantiate(g, s0, &e), WEFT_OK);
  weft_status_t st = y.rec == x.rec ? weft_exec_launch(e, s0) : WEFT_ERR_STALE_HANDLE;
  assert_int_equal(weft_stream_synchronize(s0), WEFT_OK);
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(y, s3), WEFT_OK);
  if (y.rec != x.rec) skip(); /* the precondition: the record was handed out again */
  assert_int_equal(st, WEFT_ERR_STALE_HANDLE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_three_stream_step_replays_a_thousand_times),
      cmocka_unit_test(test_relaunch_with_live_output_is_busy_until_freed),
      cmocka_unit_test(test_auto_free_policy_frees_outputs_at_relaunch),
      cmocka_unit_test(test_free_of_a_block_from_before_the_capture_is_refused),
      cmocka_unit_test(test_a_block_freed_during_the_capture_makes_the_launch_stale),
      cmocka_unit_test(test_capture_run_always_ends_the_capture),
      cmocka_unit_test(test_eager_memory_churn_does_not_break_a_global_capture),
      cmocka_unit_test(test_foreign_capture_works),
      cmocka_unit_test(test_a_foreign_capture_forked_onto_a_second_stream),
      cmocka_unit_test(test_threads_meet_one_forked_foreign_capture_at_once),
      cmocka_unit_test(test_a_forked_foreign_capture_calls_the_handler_on_each_stream),
      cmocka_unit_test(test_a_second_thread_waits_for_the_capture_handler),
      cmocka_unit_test(test_a_capture_ended_before_its_adoption_is_not_adopted),
      cmocka_unit_test(test_a_capture_handler_inside_an_exec_launch_cannot_destroy_the_exec),
      cmocka_unit_test(test_faults_in_capture_and_instantiate),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
