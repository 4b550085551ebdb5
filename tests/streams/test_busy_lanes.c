/* Busy lanes (streams/tracker.h): a use enqueues its work without weft's lock, so a thread that
 * enqueues slowly (a long driver call, an NCCL collective) holds back only what must follow that
 * work. Each case stops a use inside its enqueue (a use whose work function waits for the test's
 * word, then enqueues a memset), and checks what other threads may do meanwhile:
 *   - uses of other streams and other blocks go on (before, one process-wide lock held them);
 *   - a use that conflicts with the stopped work, a use of the same stream, and a host wait on
 *     that stream wait (counters.busy_waits) and then are ordered after the work;
 *   - a use whose work fails leaves the histories as they were, also for a reader that waited;
 *   - a joint use of several streams (weft__use_joint, as an NCCL group is) waits for a busy lane
 *     it needs, and records nothing when its work fails;
 *   - a stream's published point (weft_stream_t.point, what the pool stamps frees with, read
 *     without the lock) is the locked one whenever the lane is idle, and none while it is busy.
 * The cases run with lazy records and with eager ones. Then, with lazy records only, the fast use
 * that leaves its tick deferred, which finishes its bookkeeping before its work and, once the
 * work is in, clears its busy lane without the lock (streams/tracker.c, weft__tracker_enter /
 * weft__tracker_exit; tracker.h, "Busy lanes"):
 *   - a failed work puts everything back: the blocks' histories, the lane, the stream's published
 *     point, the use counters and the stream's place in the least-recently-used order; also a
 *     failed weft_launch, which calls the driver between weft__tracker_enter and _exit;
 *   - a thread that waits for the lane is always woken: the lane is cleared by a thread that does
 *     not hold the lock, so the waiter counts itself first and looks again before it sleeps
 *     (weft__cond_wait_unless). Two threads in lockstep, many rounds, random delays on both sides:
 *     a waiter that misses the clear sleeps for good, and the test's alarm fails it (without the
 *     second look it hung in every run); and four such pairs at once (eight threads), whose
 *     waiters share one condition;
 *   - the same for a joint use (an NCCL group) whose streams all defer: its failed work puts
 *     every stream back (two streams; and eight, past the joint use's stack room), and two groups of two streams in lockstep with two readers always wake
 *     them.
 * Data and the simulator's oracle check every result; the tests run on a GPU too. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "lib/runtime/runtime.h"
#include "streams/clock.h"
#include "tests/util/testutil.h"

#define N 4096
static tu_env_t env;
static const weft__driver_t *drv;

static int setup_with(unsigned lazy) {
  weft_options_t o = weft_options_default();
  o.stream_count = 8;
  o.high_priority_streams = 0;
  o.lazy_records = lazy;
  if (weft__driver_get(&drv) != WEFT_OK) return -1;
  return tu_init(&env, &o);
}
static int setup_lazy(void **state) {
  (void)state;
  return setup_with(1);
}
static int setup_eager(void **state) {
  (void)state;
  return setup_with(0);
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}

/* Each case runs under an alarm of its own: a use held back by another's enqueue would hang, and
 * fails instead. A lockstep case takes about a minute under tsan on a 2-CPU machine beside another
 * test (it was one alarm of 120 s for a whole group, which three lockstep cases under tsan came
 * within 8 s of, and overran under load: a failure that said nothing of a hang). */
#if defined(__SANITIZE_THREAD__)
#define CASE_ALARM 600
#else
#define CASE_ALARM 120
#endif
static int arm(void **state) {
  (void)state;
  alarm(CASE_ALARM);
  return 0;
}
static int disarm(void **state) {
  (void)state;
  alarm(0);
  return 0;
}
#define CASE(f) cmocka_unit_test_setup_teardown(f, arm, disarm)

static weft_counters_t counters(void) {
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env.rt, &c), WEFT_OK);
  return c;
}

static weft_stream_t *stream(unsigned i) {
  weft_stream_t *s;
  assert_int_equal(weft_stream_get(env.rt, i, &s), WEFT_OK);
  return s;
}

static weft_block_t alloc(weft_stream_t *s) {
  weft_block_t b;
  assert_int_equal(weft_alloc(env.rt, N * 4, s, "busy", &b), WEFT_OK);
  return b;
}

static void expect_all(weft_stream_t *s, weft_block_t b, unsigned value) {
  static unsigned host[N];
  assert_int_equal(tu_read(s, b, host, sizeof host), WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (host[i] != value) fail_msg("element %u: %u, want %u", i, host[i], value);
}

/* ---- a use stopped inside its enqueue ---- */

typedef struct stopped {
  pthread_mutex_t m;
  pthread_cond_t c;
  int inside, released, fail, read; /* read: the use reads the block (else it writes it) */
  weft_stream_t *s;
  weft_block_t b;
  unsigned value;
  weft_status_t st;
  pthread_t th;
} stopped_t;

/* The use's work: says it is inside, waits for the word, then writes `value` over the block (or
 * fails without enqueuing anything). */
static weft_status_t stopped_work(weft_stream_t *s, void *arg) {
  stopped_t *w = arg;
  pthread_mutex_lock(&w->m);
  w->inside = 1;
  pthread_cond_broadcast(&w->c);
  while (!w->released) pthread_cond_wait(&w->c, &w->m);
  pthread_mutex_unlock(&w->m);
  if (w->fail) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: the work was refused");
  CUdeviceptr p;
  weft_status_t st = weft_block_ptr(w->b, &p);
  if (st != WEFT_OK) return st;
  CUresult r = drv->cuMemsetD32Async(p, w->value, N, s->raw);
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "cuMemsetD32Async");
}

static void *stopped_thread(void *arg) {
  stopped_t *w = arg;
  weft_access_t a = {w->b, w->read ? WEFT_READ : WEFT_WRITE};
  w->st = weft__use_run(w->s, &a, 1, "stopped", stopped_work, w);
  return NULL;
}

/* Starts a use writing `value` over b on s (or, with `read`, reading b) and returns once it is
 * inside its enqueue; with `fail` its work then fails. */
static void stop_use(stopped_t *w, weft_stream_t *s, weft_block_t b, unsigned value, int fail, int read) {
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->m, NULL);
  pthread_cond_init(&w->c, NULL);
  w->s = s;
  w->b = b;
  w->value = value;
  w->fail = fail;
  w->read = read;
  assert_int_equal(pthread_create(&w->th, NULL, stopped_thread, w), 0);
  pthread_mutex_lock(&w->m);
  while (!w->inside) pthread_cond_wait(&w->c, &w->m);
  pthread_mutex_unlock(&w->m);
}

static void stop(stopped_t *w, weft_stream_t *s, weft_block_t b, unsigned value, int fail) {
  stop_use(w, s, b, value, fail, 0);
}

/* Lets it enqueue and waits for its use to end. */
static void release(stopped_t *w) {
  pthread_mutex_lock(&w->m);
  w->released = 1;
  pthread_cond_broadcast(&w->c);
  pthread_mutex_unlock(&w->m);
  pthread_join(w->th, NULL);
  pthread_mutex_destroy(&w->m);
  pthread_cond_destroy(&w->c);
}

/* Waits until some call waits for a busy lane (counters.busy_waits passes `was`). */
static void await_busy_wait(uint64_t was) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (counters().busy_waits <= was) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 60) fail_msg("no call waited for the busy lane within 60 s");
    sched_yield();
  }
}

/* ---- other threads' calls, each on its own thread ---- */

typedef enum { READ_BLOCK, FILL_BLOCK, SYNC_STREAM } call_kind_t;

typedef struct call {
  call_kind_t kind;
  weft_stream_t *s;
  weft_block_t b;
  unsigned value;
  unsigned host[N];
  weft_status_t st;
  _Atomic int done;
  pthread_t th;
} call_t;

static void *call_thread(void *arg) {
  call_t *c = arg;
  switch (c->kind) {
    case READ_BLOCK: c->st = tu_read(c->s, c->b, c->host, sizeof c->host); break;
    case FILL_BLOCK: c->st = tu_fill(&env, c->s, c->b, N, c->value); break;
    case SYNC_STREAM: c->st = weft_stream_synchronize(c->s); break;
  }
  atomic_store(&c->done, 1);
  return NULL;
}

static call_t *call_start(call_kind_t kind, weft_stream_t *s, weft_block_t b, unsigned value) {
  call_t *c = test_calloc(1, sizeof *c);
  *c = (call_t){.kind = kind, .s = s, .b = b, .value = value};
  assert_int_equal(pthread_create(&c->th, NULL, call_thread, c), 0);
  return c;
}

static weft_status_t call_join(call_t *c) {
  pthread_join(c->th, NULL);
  return c->st;
}

/* ---- the cases ---- */

static void test_other_streams_go_on_while_a_use_enqueues(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(0)), y = alloc(stream(1));
  assert_int_equal(weft_stream_synchronize(stream(0)), WEFT_OK);
  weft_counters_t c0 = counters();
  stopped_t w;
  stop(&w, stream(0), x, 5, 0);
  /* On this thread, while the use on stream 0 is inside its enqueue: another block on another
   * stream, written, read back and synchronised. With one lock held across the enqueue this
   * would wait for ever. */
  assert_int_equal(tu_fill(&env, stream(1), y, N, 7), WEFT_OK);
  expect_all(stream(1), y, 7);
  assert_int_equal(counters().busy_waits, c0.busy_waits);
  release(&w);
  assert_int_equal(w.st, WEFT_OK);
  expect_all(stream(2), x, 5); /* a reader elsewhere waits for the write's event */
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, stream(2)), WEFT_OK);
  assert_int_equal(weft_free(y, stream(1)), WEFT_OK);
}

static void test_a_conflicting_use_waits_for_the_enqueue(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(0));
  assert_int_equal(tu_fill(&env, stream(0), x, N, 1), WEFT_OK);
  weft_counters_t c0 = counters();
  stopped_t w;
  stop(&w, stream(0), x, 5, 0);
  call_t *reader = call_start(READ_BLOCK, stream(1), x, 0);
  await_busy_wait(c0.busy_waits); /* the reader waits for the lane... */
  release(&w);                    /* ...until the write is enqueued */
  assert_int_equal(call_join(reader), WEFT_OK);
  assert_int_equal(w.st, WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (reader->host[i] != 5) fail_msg("element %u: %u, want 5 (the reader ran before the write)", i, reader->host[i]);
  weft_counters_t c1 = counters();
  assert_true(c1.waits_issued > c0.waits_issued); /* stream 1 waited for stream 0's write */
  assert_int_equal(tu_races(&env), 0);
  test_free(reader);
  assert_int_equal(weft_free(x, stream(1)), WEFT_OK);
}

/* A use that needs an older tick of a busy lane, one whose event is recorded, waits on that event
 * and goes on: only the busy use's own pending tick waits for the lane. (It waited for the lane:
 * with a thread per rank, one rank's thread stopped in the driver inside a busy use, its stream's
 * queue full of collectives waiting for the other rank's calls, while the other rank's thread
 * waited for that lane for an older tick before it could post them: test_comm_long's
 * thread-per-rank programs hung, WEFT_SIM_QUEUE_DEPTH=8, seed 30.) */
static void test_an_older_tick_of_a_busy_lane_needs_no_wait_for_the_lane(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(0)), y = alloc(stream(0)), z = alloc(stream(2));
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_fill(&env, stream(0), x, N, 1), WEFT_OK);
  /* Stream 2 reads x: it waits for the fill, whose tick is then recorded (the host knows nothing
   * of it: its completion would spare the reader below its wait). */
  assert_int_equal(tu_combine(&env, stream(2), z, (weft_block_t){0}, x, (weft_block_t){0}, (weft_block_t){0}, N, 1),
                   WEFT_OK);
  weft_counters_t c0 = counters();
  stopped_t w;
  stop(&w, stream(0), y, 5, 0); /* stream 0 busy, writing y */
  call_t *reader = call_start(READ_BLOCK, stream(1), x, 0); /* needs the fill's tick of stream 0 */
  while (!atomic_load(&reader->done) && counters().busy_waits == c0.busy_waits) sched_yield();
  bool waited = counters().busy_waits != c0.busy_waits, done_first = atomic_load(&reader->done) != 0;
  release(&w);
  assert_int_equal(call_join(reader), WEFT_OK);
  if (waited || !done_first) fail_msg("the reader of x waited for stream 0's busy use of y");
  if (counters().waits_issued == c0.waits_issued) fail_msg("the reader of x did not wait for stream 0: nothing checked");
  assert_int_equal(w.st, WEFT_OK);
  for (unsigned i = 0; i < N; i++)
    if (reader->host[i] != 1) fail_msg("element %u: %u, want 1", i, reader->host[i]);
  expect_all(stream(1), y, 5);
  assert_int_equal(tu_races(&env), 0);
  test_free(reader);
  assert_int_equal(weft_free(x, stream(1)), WEFT_OK);
  assert_int_equal(weft_free(y, stream(1)), WEFT_OK);
  assert_int_equal(weft_free(z, stream(1)), WEFT_OK);
}

/* The same, the busy use's work failing: the reader's wait on the older tick stands, the failed
 * use leaves y and the lane as they were, and a later reader of y on another stream waits for
 * y's own write, not for anything of the failed use. */
static void test_an_older_ticks_reader_goes_on_when_the_busy_use_fails(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(0)), y = alloc(stream(0)), z = alloc(stream(2));
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(tu_fill(&env, stream(0), x, N, 1), WEFT_OK);
  assert_int_equal(tu_fill(&env, stream(0), y, N, 2), WEFT_OK);
  assert_int_equal(tu_combine(&env, stream(2), z, (weft_block_t){0}, x, (weft_block_t){0}, (weft_block_t){0}, N, 1),
                   WEFT_OK);
  weft_counters_t c0 = counters();
  stopped_t w;
  stop(&w, stream(0), y, 5, 1); /* busy, and its work will fail */
  call_t *reader = call_start(READ_BLOCK, stream(1), x, 0);
  while (!atomic_load(&reader->done) && counters().busy_waits == c0.busy_waits) sched_yield();
  bool waited = counters().busy_waits != c0.busy_waits;
  release(&w);
  assert_int_equal(call_join(reader), WEFT_OK);
  if (waited) fail_msg("the reader of x waited for stream 0's busy use of y");
  assert_int_equal(w.st, WEFT_ERR_INVALID_ARGUMENT); /* the work's refusal */
  for (unsigned i = 0; i < N; i++)
    if (reader->host[i] != 1) fail_msg("element %u: %u, want 1", i, reader->host[i]);
  expect_all(stream(3), y, 2); /* y as the earlier fill left it */
  assert_int_equal(tu_fill(&env, stream(0), y, N, 6), WEFT_OK); /* the lane goes on */
  expect_all(stream(1), y, 6);
  assert_int_equal(tu_races(&env), 0);
  test_free(reader);
  assert_int_equal(weft_free(x, stream(1)), WEFT_OK);
  assert_int_equal(weft_free(y, stream(1)), WEFT_OK);
  assert_int_equal(weft_free(z, stream(1)), WEFT_OK);
}

static void test_the_same_stream_waits_for_its_use(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(0)), y = alloc(stream(0));
  assert_int_equal(weft_stream_synchronize(stream(0)), WEFT_OK);
  weft_counters_t c0 = counters();
  stopped_t w;
  stop(&w, stream(0), x, 5, 0);
  call_t *filler = call_start(FILL_BLOCK, stream(0), y, 9);
  await_busy_wait(c0.busy_waits);
  release(&w);
  assert_int_equal(call_join(filler), WEFT_OK);
  assert_int_equal(w.st, WEFT_OK);
  expect_all(stream(0), x, 5);
  expect_all(stream(0), y, 9);
  assert_int_equal(counters().waits_issued, c0.waits_issued); /* one stream: stream order is enough */
  assert_int_equal(tu_races(&env), 0);
  test_free(filler);
  assert_int_equal(weft_free(x, stream(0)), WEFT_OK);
  assert_int_equal(weft_free(y, stream(0)), WEFT_OK);
}

static void test_a_host_wait_waits_for_the_enqueue(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(0));
  assert_int_equal(weft_stream_synchronize(stream(0)), WEFT_OK);
  weft_counters_t c0 = counters();
  stopped_t w;
  stop(&w, stream(0), x, 5, 0);
  call_t *sync = call_start(SYNC_STREAM, stream(0), x, 0);
  await_busy_wait(c0.busy_waits);
  release(&w);
  assert_int_equal(call_join(sync), WEFT_OK);
  assert_int_equal(w.st, WEFT_OK);
  expect_all(stream(0), x, 5);
  assert_int_equal(tu_races(&env), 0);
  test_free(sync);
  assert_int_equal(weft_free(x, stream(0)), WEFT_OK);
}

static void test_a_failed_enqueue_leaves_the_histories_as_they_were(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(1));
  assert_int_equal(tu_fill(&env, stream(1), x, N, 3), WEFT_OK);
  weft_counters_t c0 = counters();
  /* A reader on stream 2 waits meanwhile; the write on stream 0 then fails. */
  stopped_t w;
  stop(&w, stream(0), x, 5, 1);
  call_t *reader = call_start(READ_BLOCK, stream(2), x, 0);
  await_busy_wait(c0.busy_waits);
  release(&w);
  assert_int_equal(call_join(reader), WEFT_OK);
  assert_int_equal(w.st, WEFT_ERR_INVALID_ARGUMENT);
  for (unsigned i = 0; i < N; i++)
    if (reader->host[i] != 3) fail_msg("element %u: %u, want 3", i, reader->host[i]);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses + 1); /* the reader's copy and... */
  /* ...nothing of the failed write: a reader on stream 1, the last writer's stream, needs no
   * wait (it would wait for stream 0 if the failed write were in the history). */
  expect_all(stream(1), x, 3);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.waits_issued, c1.waits_issued);
  /* Stream 0 goes on as if the failed use had never begun its work. */
  assert_int_equal(tu_fill(&env, stream(0), x, N, 8), WEFT_OK);
  expect_all(stream(3), x, 8);
  assert_int_equal(tu_races(&env), 0);
  test_free(reader);
  assert_int_equal(weft_free(x, stream(3)), WEFT_OK);
}

/* A failed busy *read*: another stream's read of the same block, made meanwhile (a read waits for
 * no read), stays in the history, so a later writer still waits for it. */
static void test_a_failed_busy_read_keeps_another_streams_read(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(3)), out = alloc(stream(1));
  assert_int_equal(tu_fill(&env, stream(3), x, N, 3), WEFT_OK);
  stopped_t w;
  stop_use(&w, stream(0), x, 0, 1, 1); /* stream 0 reads x, inside its enqueue; its work will fail */
  /* Stream 1 reads x while stream 0's read is inside its enqueue: no conflict, no wait for it. */
  assert_int_equal(tu_combine(&env, stream(1), out, (weft_block_t){0}, x, (weft_block_t){0}, (weft_block_t){0}, N, 1),
                   WEFT_OK);
  release(&w);
  assert_int_equal(w.st, WEFT_ERR_INVALID_ARGUMENT);
  /* A writer on stream 2 must follow stream 1's read (the oracle reports the race otherwise). */
  weft_counters_t c0 = counters();
  assert_int_equal(tu_fill(&env, stream(2), x, N, 9), WEFT_OK);
  assert_true(counters().waits_issued > c0.waits_issued);
  expect_all(stream(1), out, 3u * 7u + 1u);
  expect_all(stream(2), x, 9);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, stream(3)), WEFT_OK);
  assert_int_equal(weft_free(out, stream(3)), WEFT_OK);
}

/* ---- joint uses ---- */

typedef struct joint_work {
  weft_block_t copy_dst, copy_src, set; /* on s[0]: copy_dst = copy_src; on s[1]: set = 4 */
  weft_stream_t *s1;
  int fail;
} joint_work_t;

static weft_status_t joint_fn(weft_stream_t *s0, void *arg) {
  joint_work_t *j = arg;
  if (j->fail) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: the joint work was refused");
  CUdeviceptr dst, src, set;
  if (weft_block_ptr(j->copy_dst, &dst) != WEFT_OK || weft_block_ptr(j->copy_src, &src) != WEFT_OK ||
      weft_block_ptr(j->set, &set) != WEFT_OK)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: a block went");
  CUresult r = drv->cuMemcpyDtoDAsync(dst, src, N * 4, s0->raw);
  if (r == CUDA_SUCCESS) r = drv->cuMemsetD32Async(set, 4, N, j->s1->raw);
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "joint work");
}

typedef struct joint_call {
  joint_work_t work;
  weft_status_t st;
  pthread_t th;
} joint_call_t;

static weft_status_t joint_run(joint_work_t *w, weft_stream_t *s0, weft_stream_t *s1) {
  weft_stream_t *s[2] = {s0, s1};
  weft_access_t a0[2] = {{w->copy_dst, WEFT_WRITE}, {w->copy_src, WEFT_READ}}, a1[1] = {{w->set, WEFT_WRITE}};
  const weft_access_t *acc[2] = {a0, a1};
  size_t n[2] = {2, 1};
  w->s1 = s1;
  return weft__use_joint(s, acc, n, 2, "joint", joint_fn, w);
}

static void *joint_thread(void *arg) {
  joint_call_t *c = arg;
  c->st = joint_run(&c->work, stream(1), stream(2));
  return NULL;
}

static void test_a_joint_use_waits_for_a_busy_lane_it_needs(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(0)), y = alloc(stream(1)), z = alloc(stream(2));
  assert_int_equal(tu_fill(&env, stream(0), x, N, 1), WEFT_OK);
  weft_counters_t c0 = counters();
  stopped_t w;
  stop(&w, stream(0), x, 5, 0);
  joint_call_t *j = test_calloc(1, sizeof *j);
  j->work = (joint_work_t){.copy_dst = y, .copy_src = x, .set = z};
  assert_int_equal(pthread_create(&j->th, NULL, joint_thread, j), 0);
  await_busy_wait(c0.busy_waits); /* the joint use needs x, written by the busy use */
  release(&w);
  pthread_join(j->th, NULL);
  assert_int_equal(w.st, WEFT_OK);
  assert_int_equal(j->st, WEFT_OK);
  expect_all(stream(3), y, 5);
  expect_all(stream(3), z, 4);
  assert_int_equal(tu_races(&env), 0);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses + 1 + 2 + 2); /* the busy use, the joint use's two, two reads */
  test_free(j);
  assert_int_equal(weft_free(x, stream(3)), WEFT_OK);
  assert_int_equal(weft_free(y, stream(3)), WEFT_OK);
  assert_int_equal(weft_free(z, stream(3)), WEFT_OK);
}

static void test_a_failed_joint_use_records_nothing(void **state) {
  (void)state;
  weft_block_t x = alloc(stream(3)), y = alloc(stream(3)), z = alloc(stream(3));
  assert_int_equal(tu_fill(&env, stream(3), x, N, 2), WEFT_OK);
  assert_int_equal(tu_fill(&env, stream(3), y, N, 3), WEFT_OK);
  assert_int_equal(tu_fill(&env, stream(3), z, N, 6), WEFT_OK);
  weft_counters_t c0 = counters();
  joint_work_t w = {.copy_dst = y, .copy_src = x, .set = z, .fail = 1};
  assert_int_equal(joint_run(&w, stream(1), stream(2)), WEFT_ERR_INVALID_ARGUMENT);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses);
  /* Readers on stream 3, which wrote all three last, need no wait: the failed writes on streams
   * 1 and 2 are in no history. */
  expect_all(stream(3), y, 3);
  expect_all(stream(3), z, 6);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.waits_issued, c1.waits_issued);
  /* The same joint use, not refused, runs. */
  w.fail = 0;
  assert_int_equal(joint_run(&w, stream(1), stream(2)), WEFT_OK);
  expect_all(stream(0), y, 2);
  expect_all(stream(0), z, 4);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, stream(0)), WEFT_OK);
  assert_int_equal(weft_free(y, stream(0)), WEFT_OK);
  assert_int_equal(weft_free(z, stream(0)), WEFT_OK);
}

/* A failed joint use whose two streams touch one block (stream 1 writes it, stream 2 reads it):
 * the block's history is put back as it was before the group, not as the first stream left it. */
static weft_status_t refuse(weft_stream_t *s, void *arg) {
  (void)s;
  (void)arg;
  return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: the joint work was refused");
}

static void test_a_failed_joint_use_on_one_block_puts_it_back(void **state) {
  (void)state;
  weft_block_t y = alloc(stream(3));
  assert_int_equal(tu_fill(&env, stream(3), y, N, 5), WEFT_OK);
  weft_stream_t *s[2] = {stream(1), stream(2)};
  weft_access_t a0[1] = {{y, WEFT_WRITE}}, a1[1] = {{y, WEFT_READ}};
  const weft_access_t *acc[2] = {a0, a1};
  size_t n[2] = {1, 1};
  assert_int_equal(weft__use_joint(s, acc, n, 2, "joint", refuse, NULL), WEFT_ERR_INVALID_ARGUMENT);
  /* Stream 3 wrote y last: its reader needs no wait (stream 1's write is in no history). */
  weft_counters_t c0 = counters();
  expect_all(stream(3), y, 5);
  assert_int_equal(counters().waits_issued, c0.waits_issued);
  /* A reader on stream 0 waits for stream 3's write (or knows it complete), and reads it. */
  expect_all(stream(0), y, 5);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(y, stream(3)), WEFT_OK);
}

/* The work of a joint use of two streams: block x set to 7 on the first, y to 9 on the second. */
typedef struct set_two {
  weft_block_t x, y;
  weft_stream_t *s1;
} set_two_t;

static weft_status_t set_two(weft_stream_t *s0, void *arg) {
  const set_two_t *t = arg;
  CUdeviceptr x, y;
  if (weft_block_ptr(t->x, &x) != WEFT_OK || weft_block_ptr(t->y, &y) != WEFT_OK)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: a block went");
  CUresult r = drv->cuMemsetD32Async(x, 7, N, s0->raw);
  if (r == CUDA_SUCCESS) r = drv->cuMemsetD32Async(y, 9, N, t->s1->raw);
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "joint work");
}

/* A joint use with the calling thread's per-thread stream (adopted CU_STREAM_PER_THREAD, which
 * the tracker's joint use does not take) takes the split form, as a capture does: it runs, and
 * readers on another stream wait for both writes. (It was refused as "began capturing meanwhile"
 * after the joint use's checks moved into weft__use_joint_uses and lost the per-thread case.) */
static void test_a_joint_use_with_a_per_thread_stream_runs_split(void **state) {
  (void)state;
  weft_stream_t *pt;
  assert_int_equal(weft_stream_adopt(env.rt, CU_STREAM_PER_THREAD, &pt), WEFT_OK);
  set_two_t t = {alloc(stream(3)), alloc(stream(3)), stream(1)};
  assert_int_equal(tu_fill(&env, stream(3), t.x, N, 5), WEFT_OK);
  assert_int_equal(tu_fill(&env, stream(3), t.y, N, 5), WEFT_OK);
  weft_stream_t *s[2] = {pt, stream(1)};
  weft_access_t a0[1] = {{t.x, WEFT_WRITE}}, a1[1] = {{t.y, WEFT_WRITE}};
  const weft_access_t *acc[2] = {a0, a1};
  size_t n[2] = {1, 1};
  weft_counters_t c0 = counters();
  weft_status_t st = weft__use_joint(s, acc, n, 2, "joint", set_two, &t);
  if (st != WEFT_OK) fail_msg("the joint use: %s: %s", weft_status_name(st), weft_last_error());
  assert_int_equal(counters().uses, c0.uses + 2);
  expect_all(stream(0), t.x, 7);
  expect_all(stream(0), t.y, 9);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(t.x, stream(0)), WEFT_OK);
  assert_int_equal(weft_free(t.y, stream(0)), WEFT_OK);
}

/* What weft__tracker_point would give under the lock, published: 1 + tick while the lane is
 * not dirty, else 0 (take the lock). */
static void expect_published(weft_stream_t *s) {
  weft__tracker_t *tr = s->tr;
  weft__lock(tr->lock);
  const weft__lane_t *l = &tr->live->lane[s->lane];
  uint64_t want = l->dirty ? 0 : l->tick + 1, got = atomic_load(&s->point);
  weft__unlock(tr->lock);
  if (got != want) fail_msg("stream %u: published %llu, the lane says %llu", s->index, (unsigned long long)got,
                            (unsigned long long)want);
}

/* Every way a lane changes leaves the published point equal to the locked one; a busy use
 * withdraws it (a reader takes the lock and waits), and a failed one puts the old one back. A
 * free's stamp through the pool then names the same point either way. */
static void test_the_published_point_is_the_locked_one(void **state) {
  (void)state;
  weft_stream_t *s0 = stream(0), *s1 = stream(1);
  weft_block_t b = alloc(s0), c = alloc(s1);
  expect_published(s0);
  expect_published(s1);
  assert_int_equal(tu_fill(&env, s0, b, N, 3), WEFT_OK); /* a use */
  expect_published(s0);
  assert_int_equal(tu_fill(&env, s1, b, N, 4), WEFT_OK); /* s1 waits for s0 */
  expect_published(s0);
  expect_published(s1);
  assert_int_not_equal(atomic_load(&s1->point), 0);
  /* An outside event waited on: the lane is dirty until its next tick. */
  CUevent ev;
  assert_int_equal(drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  assert_int_equal(drv->cuEventRecord(ev, weft_stream_raw(s1)), CUDA_SUCCESS);
  assert_int_equal(weft_stream_import_event(s0, ev), WEFT_OK);
  expect_published(s0);
  assert_int_equal(atomic_load(&s0->point), 0);
  weft__point_t p = weft__tracker_point(s0); /* the locked path: a pending tick */
  expect_published(s0);
  assert_int_equal(atomic_load(&s0->point), p.tick + 1);
  assert_int_equal(weft__tracker_point(s0).tick, p.tick); /* the published one, the same */
  /* Busy: withdrawn; a failed use puts the point back as it was. */
  uint64_t before = atomic_load(&s1->point);
  stopped_t w;
  stop(&w, s1, c, 9, 1);
  assert_int_equal(atomic_load(&s1->point), 0);
  release(&w);
  assert_int_equal(w.st, WEFT_ERR_INVALID_ARGUMENT);
  expect_published(s1);
  assert_int_equal(atomic_load(&s1->point), before);
  stop(&w, s1, c, 9, 0);
  assert_int_equal(atomic_load(&s1->point), 0);
  release(&w);
  assert_int_equal(w.st, WEFT_OK);
  expect_published(s1);
  assert_int_not_equal(atomic_load(&s1->point), before);
  expect_all(s1, c, 9);
  assert_int_equal(drv->cuEventDestroy(ev), CUDA_SUCCESS);
  assert_int_equal(weft_free(b, s1), WEFT_OK);
  assert_int_equal(weft_free(c, s1), WEFT_OK);
}

/* ---- lazy records only: the deferred fast use ---- */

/* Whether a plain use of s now leaves its tick deferred and takes the fast path (the tracker's
 * own conditions, read under its lock): lazy records, a lane that is not eager, a stream not
 * exposed. */
static bool defers(weft_stream_t *s) {
  weft__tracker_t *tr = s->tr;
  weft__lock(tr->lock);
  bool d = tr->lazy && !tr->no_fast_path && !tr->live->lane[s->lane].eager &&
           !atomic_load(&s->exposed) && s->capture == NULL && !s->per_thread;
  weft__unlock(tr->lock);
  return d;
}

static weft_status_t refused_work(weft_stream_t *s, void *arg) {
  (void)s;
  (void)arg;
  return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: the work was refused");
}

/* A use of s0 writing x whose work fails: weft__use_run with a work function that refuses, or
 * weft_launch (tu_fill) whose cuLaunchKernel the simulator fails. Returns its status. */
typedef weft_status_t (*failing_use_t)(weft_stream_t *s0, weft_block_t x, weft_block_t y);

static weft_status_t refused_use(weft_stream_t *s0, weft_block_t x, weft_block_t y) {
  weft_access_t w[2] = {{x, WEFT_WRITE}, {y, WEFT_READ}};
  return weft__use_run(s0, w, 2, "refused", refused_work, NULL);
}

static weft_status_t failed_launch(weft_stream_t *s0, weft_block_t x, weft_block_t y) {
  (void)y;
  assert_int_equal((env.sim->fail)("cuLaunchKernel:1:CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"), 0);
  weft_status_t st = tu_fill(&env, s0, x, N, 5);
  assert_int_equal((env.sim->fail)(NULL), 0);
  return st;
}

static void failed_deferred_use(failing_use_t use, weft_status_t want) {
  weft_stream_t *s0 = stream(0), *s1 = stream(1), *s2 = stream(2);
  weft_block_t x = alloc(s1), y = alloc(s0);
  assert_int_equal(tu_fill(&env, s1, x, N, 3), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, y, N, 4), WEFT_OK);
  /* Everything complete and known so: the failed use below needs no wait (a wait it issued would
   * stay, and change s0's lane, harmlessly), so s0's lane must come back exactly as it was. */
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  if (!defers(s0)) skip(); /* (the precondition: the use below takes the deferred fast path) */
  weft_counters_t c0 = counters();
  uint64_t point = atomic_load(&s0->point), last_used = s0->last_used;
  if (point == 0) fail_msg("s0's point is not published before the use");
  assert_int_equal(use(s0, x, y), want);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses);
  assert_int_equal(c1.accesses, c0.accesses);
  assert_int_equal(c1.waits_issued, c0.waits_issued);
  if (atomic_load(&s0->point) != point)
    fail_msg("s0's point %llu after the failure, %llu before", (unsigned long long)atomic_load(&s0->point),
             (unsigned long long)point);
  assert_int_equal(s0->last_used, last_used);
  /* Nothing of the failed write is in x's history: a reader on s1, the last writer's stream,
   * needs no wait (it would wait for s0's tick otherwise). */
  expect_all(s1, x, 3);
  weft_counters_t c2 = counters();
  assert_int_equal(c2.waits_issued, c1.waits_issued);
  /* s0 goes on: its next write is ordered after s1's read, and s2 reads it. */
  assert_int_equal(tu_fill(&env, s0, x, N, 8), WEFT_OK);
  expect_all(s2, x, 8);
  expect_all(s2, y, 4);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, s2), WEFT_OK);
  assert_int_equal(weft_free(y, s2), WEFT_OK);
}

static void test_a_failed_deferred_use_puts_everything_back(void **state) {
  (void)state;
  failed_deferred_use(refused_use, WEFT_ERR_INVALID_ARGUMENT);
}

/* The same through weft_launch, whose deferred case calls the driver between weft__tracker_enter
 * and weft__tracker_exit (the simulator fails the launch). */
static void test_a_failed_deferred_launch_puts_everything_back(void **state) {
  (void)state;
  if (env.sim == NULL || env.split) skip(); /* (fault injection is the simulator's) */
  failed_deferred_use(failed_launch, WEFT_ERR_DRIVER);
}

/* A joint use (an NCCL group) whose streams all defer takes the same path for every stream: its
 * bookkeeping is done before the work (the work function sees the uses counted) and the lanes are
 * cleared without the lock. Its failed work puts every stream back: s0 writes x and reads y, s3
 * writes z and reads y too (both streams' parts of y's history). */
static weft_status_t refuse_counting(weft_stream_t *s, void *arg) {
  (void)s;
  *(weft_counters_t *)arg = counters(); /* (the lock is not held while a use's work runs) */
  return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: the joint work was refused");
}

static void test_a_failed_deferred_joint_use_puts_everything_back(void **state) {
  (void)state;
  weft_stream_t *s0 = stream(0), *s1 = stream(1), *s2 = stream(2), *s3 = stream(3);
  weft_block_t x = alloc(s1), y = alloc(s0), z = alloc(s3);
  assert_int_equal(tu_fill(&env, s1, x, N, 3), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, y, N, 4), WEFT_OK);
  assert_int_equal(tu_fill(&env, s3, z, N, 6), WEFT_OK);
  /* Everything complete and known so: the group needs no wait, so its lanes must come back
   * exactly as they were. */
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  if (!defers(s0) || !defers(s3)) skip();
  weft_counters_t c0 = counters(), seen = {0};
  uint64_t point0 = atomic_load(&s0->point), point3 = atomic_load(&s3->point);
  uint64_t last0 = s0->last_used, last3 = s3->last_used;
  if (point0 == 0 || point3 == 0) fail_msg("the points are not published before the group");
  weft_stream_t *s[2] = {s0, s3};
  weft_access_t a0[2] = {{x, WEFT_WRITE}, {y, WEFT_READ}}, a3[2] = {{z, WEFT_WRITE}, {y, WEFT_READ}};
  const weft_access_t *acc[2] = {a0, a3};
  size_t n[2] = {2, 2};
  assert_int_equal(weft__use_joint(s, acc, n, 2, "joint", refuse_counting, &seen), WEFT_ERR_INVALID_ARGUMENT);
  /* The precondition: the group took the deferred path (its uses were counted before its work). */
  if (seen.uses != c0.uses + 2) skip();
  assert_int_equal(seen.accesses, c0.accesses + 4);
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses);
  assert_int_equal(c1.accesses, c0.accesses);
  assert_int_equal(c1.waits_issued, c0.waits_issued);
  if (atomic_load(&s0->point) != point0 || atomic_load(&s3->point) != point3)
    fail_msg("points %llu / %llu after the failure, %llu / %llu before", (unsigned long long)atomic_load(&s0->point),
             (unsigned long long)atomic_load(&s3->point), (unsigned long long)point0, (unsigned long long)point3);
  assert_int_equal(s0->last_used, last0);
  assert_int_equal(s3->last_used, last3);
  /* Nothing of the failed group is in a history: readers on each block's last writer's stream
   * need no wait. */
  expect_all(s1, x, 3);
  expect_all(s0, y, 4);
  expect_all(s3, z, 6);
  assert_int_equal(counters().waits_issued, c1.waits_issued);
  /* The same group, not refused, runs; its points are the locked ones, and s2 reads its writes. */
  set_two_t t = {x, z, s3};
  weft_access_t w0[1] = {{x, WEFT_WRITE}}, w3[1] = {{z, WEFT_WRITE}};
  const weft_access_t *wacc[2] = {w0, w3};
  size_t wn[2] = {1, 1};
  assert_int_equal(weft__use_joint(s, wacc, wn, 2, "joint", set_two, &t), WEFT_OK);
  expect_published(s0);
  expect_published(s3);
  expect_all(s2, x, 7);
  expect_all(s2, z, 9);
  expect_all(s2, y, 4);
  assert_int_equal(tu_races(&env), 0);
  assert_int_equal(weft_free(x, s2), WEFT_OK);
  assert_int_equal(weft_free(y, s2), WEFT_OK);
  assert_int_equal(weft_free(z, s2), WEFT_OK);
}

/* A group of every pool stream (eight), each writing its own block and reading four shared ones:
 * more streams and accesses than the joint use keeps on its stack (its per-stream records and
 * undo records then come from the heap). Its failed work puts all eight back; then it runs, and
 * each block is read on another stream. */
typedef struct set_eight {
  weft_stream_t *s[8];
  weft_block_t x[8];
} set_eight_t;

static weft_status_t set_eight(weft_stream_t *s0, void *arg) {
  (void)s0;
  const set_eight_t *t = arg;
  for (unsigned i = 0; i < 8; i++) {
    CUdeviceptr p;
    if (weft_block_ptr(t->x[i], &p) != WEFT_OK) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "test: a block went");
    CUresult r = drv->cuMemsetD32Async(p, 20 + i, N, t->s[i]->raw);
    if (r != CUDA_SUCCESS) return weft__driver_fail(r, "joint work");
  }
  return WEFT_OK;
}

static void test_a_deferred_joint_use_of_eight_streams(void **state) {
  (void)state;
  set_eight_t t;
  weft_block_t shared[4];
  weft_access_t acc[8][5];
  const weft_access_t *per[8];
  size_t n[8];
  for (unsigned i = 0; i < 4; i++) {
    shared[i] = alloc(stream(i));
    assert_int_equal(tu_fill(&env, stream(i), shared[i], N, 40 + i), WEFT_OK);
  }
  for (unsigned i = 0; i < 8; i++) {
    t.s[i] = stream(i);
    t.x[i] = alloc(t.s[i]);
    assert_int_equal(tu_fill(&env, t.s[i], t.x[i], N, 1), WEFT_OK);
    acc[i][0] = (weft_access_t){t.x[i], WEFT_WRITE};
    for (unsigned j = 0; j < 4; j++) acc[i][1 + j] = (weft_access_t){shared[j], WEFT_READ};
    per[i] = acc[i];
    n[i] = 5;
  }
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  uint64_t point[8];
  for (unsigned i = 0; i < 8; i++) {
    if (!defers(t.s[i])) skip();
    point[i] = atomic_load(&t.s[i]->point);
  }
  weft_counters_t c0 = counters(), seen = {0};
  assert_int_equal(weft__use_joint(t.s, per, n, 8, "joint8", refuse_counting, &seen), WEFT_ERR_INVALID_ARGUMENT);
  if (seen.uses != c0.uses + 8) skip(); /* (the precondition: the deferred path) */
  weft_counters_t c1 = counters();
  assert_int_equal(c1.uses, c0.uses);
  assert_int_equal(c1.accesses, c0.accesses);
  for (unsigned i = 0; i < 8; i++)
    if (atomic_load(&t.s[i]->point) != point[i]) fail_msg("stream %u's point moved after the failure", i);
  assert_int_equal(weft__use_joint(t.s, per, n, 8, "joint8", set_eight, &t), WEFT_OK);
  assert_int_equal(counters().uses, c0.uses + 8);
  for (unsigned i = 0; i < 8; i++) expect_published(t.s[i]);
  /* A write of a shared block waits for all eight reads; each x[i] is read on the next stream. */
  assert_int_equal(tu_fill(&env, stream(0), shared[0], N, 50), WEFT_OK);
  for (unsigned i = 0; i < 8; i++) expect_all(stream((i + 1) % 8), t.x[i], 20 + i);
  expect_all(stream(5), shared[0], 50);
  assert_int_equal(tu_races(&env), 0);
  for (unsigned i = 0; i < 8; i++) assert_int_equal(weft_free(t.x[i], stream(0)), WEFT_OK);
  for (unsigned i = 0; i < 4; i++) assert_int_equal(weft_free(shared[i], stream(0)), WEFT_OK);
}

/* ---- lockstep rounds ---- */

#define ROUNDS 20000 /* lockstep rounds per pair */

typedef struct lockstep {
  weft_stream_t *sa, *sb, *sc; /* sc: the writer's second stream (a joint use), or NULL */
  weft_block_t x, y, w;        /* w: what sc writes */
  _Atomic unsigned started, read; /* the writer's round begun; the reader's round done */
  _Atomic int failed;
  weft_status_t st_a, st_b;
} lockstep_t;

static unsigned next_random(unsigned *r) {
  *r ^= *r << 13;
  *r ^= *r >> 17;
  *r ^= *r << 5;
  return *r;
}

/* A short random delay (0 to about a microsecond), so that the two threads meet at every point
 * of each other's calls. */
static void jitter(unsigned *r) {
  unsigned k = next_random(r) % 512;
  for (volatile unsigned i = 0; i < k; i++) {
  }
}

/* A writer's work: x on s set to the round's value, and for a joint use (sc set) w on sc too. */
typedef struct fill_arg {
  weft_block_t x, w;
  weft_stream_t *sc;
  unsigned value;
  unsigned *rng;
} fill_arg_t;

static weft_status_t fill_work(weft_stream_t *s, void *arg) {
  fill_arg_t *f = arg;
  jitter(f->rng);
  CUdeviceptr x, w = 0;
  weft_status_t st = weft_block_ptr(f->x, &x);
  if (st == WEFT_OK && f->sc != NULL) st = weft_block_ptr(f->w, &w);
  if (st != WEFT_OK) return st;
  CUresult r = drv->cuMemsetD32Async(x, f->value, N, s->raw);
  if (r == CUDA_SUCCESS && f->sc != NULL) r = drv->cuMemsetD32Async(w, f->value, N, f->sc->raw);
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "cuMemsetD32Async");
}

/* Waits until *word reaches `want` or the other thread failed; false then. */
static bool await_round(_Atomic unsigned *word, unsigned want, _Atomic int *failed) {
  while (atomic_load(word) < want)
    if (atomic_load(failed)) return false;
    else sched_yield();
  return true;
}

static void *writer(void *arg) {
  lockstep_t *l = arg;
  unsigned rng = 0x9e3779b9u;
  for (unsigned r = 1; r <= ROUNDS; r++) {
    atomic_store(&l->started, r);
    fill_arg_t f = {l->x, l->w, l->sc, r, &rng};
    weft_access_t wa[1] = {{l->x, WEFT_WRITE}}, wc[1] = {{l->w, WEFT_WRITE}};
    weft_status_t st;
    if (l->sc == NULL) {
      st = weft__use_run(l->sa, wa, 1, "lockstep.write", fill_work, &f);
    } else { /* a joint use of sa and sc, as an NCCL group is */
      weft_stream_t *s[2] = {l->sa, l->sc};
      const weft_access_t *acc[2] = {wa, wc};
      size_t n[2] = {1, 1};
      st = weft__use_joint(s, acc, n, 2, "lockstep.joint", fill_work, &f);
    }
    if (st != WEFT_OK) {
      l->st_a = st;
      atomic_store(&l->failed, 1);
      return NULL;
    }
    if (!await_round(&l->read, r, &l->failed)) return NULL;
  }
  return NULL;
}

static void *reader(void *arg) {
  lockstep_t *l = arg;
  unsigned rng = 0x85ebca6bu;
  for (unsigned r = 1; r <= ROUNDS; r++) {
    if (!await_round(&l->started, r, &l->failed)) return NULL;
    jitter(&rng);
    /* y = f(x[, w]): a tracked kernel reading what the writer's round wrote (or is writing). */
    weft_status_t st = tu_combine(&env, l->sb, l->y, (weft_block_t){0}, l->x, l->w, (weft_block_t){0}, N, r);
    if (st != WEFT_OK) {
      l->st_b = st;
      atomic_store(&l->failed, 1);
      return NULL;
    }
    atomic_store(&l->read, r);
  }
  return NULL;
}

/* `pairs` writer/reader pairs, each on its own two streams and block, all at once: every lane's
 * waiters share one condition (weft__clock_idle), so each clear must wake the waiters of every
 * lane that became idle, whoever else counted itself a waiter meanwhile. With `joint`, each
 * writer is a joint use of two streams (at most two pairs: six streams), and its reader reads
 * both streams' blocks: the group clears both lanes without the lock. */
static void lockstep_pairs(unsigned pairs, bool joint) {
  lockstep_t l[4];
  pthread_t a[4], b[4];
  assert_true(pairs <= (joint ? 2u : 4u));
  for (unsigned p = 0; p < pairs; p++) {
    l[p] = (lockstep_t){.sa = stream(p), .sb = stream(4 + p), .sc = joint ? stream(2 + p) : NULL};
    l[p].x = alloc(l[p].sa);
    l[p].y = alloc(l[p].sb);
    if (joint) l[p].w = alloc(l[p].sc);
  }
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  for (unsigned p = 0; p < pairs; p++)
    if (!defers(l[p].sa) || (joint && !defers(l[p].sc))) skip();
  weft_counters_t c0 = counters();
  for (unsigned p = 0; p < pairs; p++) {
    assert_int_equal(pthread_create(&a[p], NULL, writer, &l[p]), 0);
    assert_int_equal(pthread_create(&b[p], NULL, reader, &l[p]), 0);
  }
  for (unsigned p = 0; p < pairs; p++) {
    pthread_join(a[p], NULL);
    pthread_join(b[p], NULL);
  }
  for (unsigned p = 0; p < pairs; p++) {
    assert_int_equal(l[p].st_a, WEFT_OK);
    assert_int_equal(l[p].st_b, WEFT_OK);
    assert_int_equal(atomic_load(&l[p].read), ROUNDS);
  }
  weft_counters_t c1 = counters();
  /* The precondition: readers met their writers' busy lanes (else nothing here was tested). */
  print_message("%u pairs: busy waits %llu over %u rounds each\n", pairs,
                (unsigned long long)(c1.busy_waits - c0.busy_waits), ROUNDS);
  if (c1.busy_waits == c0.busy_waits) skip();
  for (unsigned p = 0; p < pairs; p++) {
    assert_true(defers(l[p].sa)); /* the writers' uses took the deferred fast path throughout */
    expect_all(l[p].sb, l[p].x, ROUNDS);
    if (joint) {
      assert_true(defers(l[p].sc));
      expect_all(l[p].sb, l[p].w, ROUNDS);
    }
  }
  assert_int_equal(tu_races(&env), 0);
  for (unsigned p = 0; p < pairs; p++) {
    assert_int_equal(weft_free(l[p].x, l[p].sb), WEFT_OK);
    assert_int_equal(weft_free(l[p].y, l[p].sb), WEFT_OK);
    if (joint) assert_int_equal(weft_free(l[p].w, l[p].sb), WEFT_OK);
  }
}

static void test_a_waiter_is_always_woken_by_a_lane_cleared_without_the_lock(void **state) {
  (void)state;
  lockstep_pairs(1, false);
}

static void test_eight_threads_waiting_on_four_lanes_are_always_woken(void **state) {
  (void)state;
  lockstep_pairs(4, false);
}

/* The same with joint writers (an NCCL group's use): two groups of two streams, two readers. */
static void test_waiters_are_always_woken_by_joint_uses(void **state) {
  (void)state;
  lockstep_pairs(2, true);
}

int main(void) {
  const struct CMUnitTest lazy[] = {
      CASE(test_other_streams_go_on_while_a_use_enqueues),
      CASE(test_a_conflicting_use_waits_for_the_enqueue),
      CASE(test_an_older_tick_of_a_busy_lane_needs_no_wait_for_the_lane),
      CASE(test_an_older_ticks_reader_goes_on_when_the_busy_use_fails),
      CASE(test_the_same_stream_waits_for_its_use),
      CASE(test_a_host_wait_waits_for_the_enqueue),
      CASE(test_a_failed_enqueue_leaves_the_histories_as_they_were),
      CASE(test_a_joint_use_waits_for_a_busy_lane_it_needs),
      CASE(test_a_failed_joint_use_records_nothing),
      CASE(test_a_failed_busy_read_keeps_another_streams_read),
      CASE(test_a_failed_joint_use_on_one_block_puts_it_back),
      CASE(test_a_joint_use_with_a_per_thread_stream_runs_split),
      CASE(test_the_published_point_is_the_locked_one),
  };
  const struct CMUnitTest deferred[] = {
      CASE(test_a_failed_deferred_use_puts_everything_back),
      CASE(test_a_failed_deferred_launch_puts_everything_back),
      CASE(test_a_waiter_is_always_woken_by_a_lane_cleared_without_the_lock),
      CASE(test_eight_threads_waiting_on_four_lanes_are_always_woken),
      CASE(test_a_failed_deferred_joint_use_puts_everything_back),
      CASE(test_waiters_are_always_woken_by_joint_uses),
      /* Last: its late waits leave lanes eager (clock.c, weft__clock_needed), and the lockstep
       * cases need every lane lazy (they skip otherwise). */
      CASE(test_a_deferred_joint_use_of_eight_streams),
  };
  int failed = cmocka_run_group_tests_name("lazy records", lazy, setup_lazy, teardown);
  failed += cmocka_run_group_tests_name("eager records", lazy, setup_eager, teardown);
  failed += cmocka_run_group_tests_name("the deferred fast use (lazy records)", deferred, setup_lazy, teardown);
  return failed;
}
