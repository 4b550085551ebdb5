/* The timeline trace (issue 16): a known multi-stream program gives exactly one flow arrow per
 * wait weft counted, each on the right stream pair; uses are slices with their accesses, frees and
 * allocations appear; the file is valid JSON (checked with python3 where there is one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/core/meta.h"
#include "lib/core/trace.h"
#include "tests/util/cmocka_env.h"

#define N 256

static uint64_t waits(const tu_env_t *env) {
  weft_counters_t c;
  assert_int_equal(weft_runtime_counters(env->rt, &c), WEFT_OK);
  return c.waits_issued;
}

/* The value after `key` in a one-event line, or -1. */
static long long field(const char *line, const char *key) {
  const char *at = strstr(line, key);
  return at ? strtoll(at + strlen(key), NULL, 10) : -1;
}

static void trace_path(char *path, size_t n, const char *name) {
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(path, n, "%s/%s", dir ? dir : "/tmp", name);
}

static void check_json(const char *path) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "command -v python3 >/dev/null || exit 77; python3 -c \"import json; json.load(open('%s'))\"",
           path);
  int rc = system(cmd);
  if (!(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 77)) assert_int_equal(rc, 0);
}

static void test_one_arrow_per_wait_on_the_right_pair(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  char path[512];
  trace_path(path, sizeof path, "trace.json");
  assert_int_equal(weft_trace_start(path), WEFT_OK);
  assert_int_equal(weft_trace_start(path), WEFT_ERR_BUSY);
  weft_stream_t *s[4];
  for (unsigned i = 0; i < 4; i++) s[i] = tu_stream(&env, i);
  uint64_t w0 = waits(&env);
  weft_block_t x = tu_alloc(&env, N * 4, 0, "x"), y = tu_alloc(&env, N * 4, 1, "y"), z = tu_alloc(&env, N * 4, 2, "z"),
               w = tu_alloc(&env, N * 4, 3, "w");
  weft_block_t none = {0};
  assert_int_equal(tu_fill(&env, s[0], x, N, 3), WEFT_OK);
  assert_int_equal(tu_combine(&env, s[1], y, none, x, none, none, N, 1), WEFT_OK);  /* waits for s0 */
  assert_int_equal(tu_combine(&env, s[2], z, none, x, none, none, N, 2), WEFT_OK);  /* waits for s0 */
  assert_int_equal(tu_combine(&env, s[3], w, none, y, z, none, N, 3), WEFT_OK);     /* waits for s1, s2 */
  assert_int_equal(weft_free(x, s[3]), WEFT_OK);                                     /* implied: no wait */
  uint64_t issued = waits(&env) - w0;
  assert_int_equal(issued, 4);
  assert_int_equal(weft_trace_stop(), WEFT_OK);
  assert_int_equal(weft_trace_stop(), WEFT_OK); /* nothing to do */
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  long long from[64], to[64], sid[64], fid[64];
  int ns = 0, nf = 0, slices = 0, allocs = 0, frees = 0, combine_with_tags = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, "\"ph\": \"s\"") && ns < 64) {
      sid[ns] = field(line, "\"id\": ");
      from[ns++] = field(line, "\"tid\": ");
    } else if (strstr(line, "\"ph\": \"f\"") && nf < 64) {
      fid[nf] = field(line, "\"id\": ");
      to[nf++] = field(line, "\"tid\": ");
    } else if (strstr(line, "\"ph\": \"X\"")) {
      slices++;
      frees += strstr(line, "\"name\": \"weft_free\"") != NULL;
      combine_with_tags += strstr(line, "{\"tag\": \"y\", \"kind\": \"R\"}") != NULL;
    } else if (strstr(line, "\"name\": \"weft_alloc\"")) {
      allocs++;
    }
  }
  fclose(f);
  assert_int_equal(nf, (int)issued); /* exactly one arrow per wait */
  assert_int_equal(ns, nf);
  int pairs[4][4] = {{0}};
  for (int i = 0; i < nf; i++) {
    int j = 0;
    while (j < ns && sid[j] != fid[i]) j++;
    assert_true(j < ns);
    assert_true(from[j] >= 0 && from[j] < 4 && to[i] >= 0 && to[i] < 4);
    pairs[from[j]][to[i]]++;
  }
  assert_int_equal(pairs[0][1], 1);
  assert_int_equal(pairs[0][2], 1);
  assert_int_equal(pairs[1][3], 1);
  assert_int_equal(pairs[2][3], 1);
  assert_true(slices >= 5); /* four uses and the free */
  assert_int_equal(frees, 1);
  assert_int_equal(allocs, 4);
  assert_int_equal(combine_with_tags, 1); /* the use on s3 read y */
  check_json(path);
  assert_int_equal(weft_free(y, s[3]), WEFT_OK);
  assert_int_equal(weft_free(z, s[3]), WEFT_OK);
  assert_int_equal(weft_free(w, s[3]), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
  tu_fini(&env);
}

/* A capture's uses, waits and its own slice are on tracks of the capture ("capture C, stream S");
 * live work stays on the streams' tracks. */
static void test_captures_have_tracks_of_their_own(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  char path[512];
  trace_path(path, sizeof path, "capture.json");
  weft_stream_t *s0 = tu_stream(&env, 0), *s1 = tu_stream(&env, 1), *s2 = tu_stream(&env, 2);
  weft_block_t x = tu_alloc(&env, N * 4, 0, "x"), y = tu_alloc(&env, N * 4, 0, "y"), none = {0};
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(weft_trace_start(path), WEFT_OK);
  weft_capture_options_t o = weft_capture_options_default();
  assert_int_equal(weft_capture_begin(s0, &o), WEFT_OK);
  assert_int_equal(weft_capture_join(s0, s1), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, x, N, 5), WEFT_OK);
  assert_int_equal(tu_combine(&env, s1, y, none, x, none, none, N, 1), WEFT_OK); /* waits for s0 inside */
  assert_int_equal(tu_combine(&env, s0, x, none, y, none, none, N, 2), WEFT_OK); /* joins s1 back */
  weft_graph_t *g;
  assert_int_equal(weft_capture_end(s0, &g), WEFT_OK);
  weft_exec_t *e;
  weft_status_t ist = weft_graph_instantiate(g, s2, &e);
  if (ist != WEFT_OK) fail_msg("instantiate: %s", weft_last_error());
  assert_int_equal(weft_exec_launch(e, s2), WEFT_OK);
  assert_int_equal(weft_trace_stop(), WEFT_OK);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  int capture_slices = 0, captured_launches = 0, live_launches = 0, named = 0, arrows_in_capture = 0, exec_on_s2 = 0;
  long long cap_tid = -1;
  while (fgets(line, sizeof line, f) != NULL) {
    long long tid = field(line, "\"tid\": ");
    if (strstr(line, "\"name\": \"weft_capture\"")) {
      capture_slices++;
      cap_tid = tid;
    }
    if (strstr(line, "\"name\": \"weft_launch\"")) {
      if (tid >= 100000) captured_launches++;
      else live_launches++;
    }
    if (strstr(line, "\"name\": \"weft_exec_launch\"") && tid == 2) exec_on_s2++;
    if (strstr(line, "thread_name") && strstr(line, "\"capture ") && strstr(line, ", stream ")) named++;
    if ((strstr(line, "\"ph\": \"s\"") || strstr(line, "\"ph\": \"f\"")) && tid >= 100000) arrows_in_capture++;
  }
  fclose(f);
  assert_int_equal(capture_slices, 1);
  assert_true(cap_tid >= 100000 && (cap_tid - 100000) % 64 == 0); /* on the origin's capture track */
  assert_int_equal(captured_launches, 3);
  assert_int_equal(live_launches, 0);
  assert_int_equal(exec_on_s2, 1);
  assert_int_equal(named, 2);                  /* capture C stream 0 and stream 1 */
  assert_true(arrows_in_capture >= 4 && arrows_in_capture % 2 == 0); /* the two waits inside, start and end each */
  check_json(path);
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(weft_free(x, s0), WEFT_OK);
  assert_int_equal(weft_free(y, s0), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
  tu_fini(&env);
}

typedef struct {
  long long tid;
  double ts, dur;
} dslice_t;

/* WEFT_TRACE_DEVICE=1: every tracked use on a live stream has a device slice on "stream S
 * (device)", and device time follows the waits: a use starts after the end of each use it waited
 * for. */
static void test_device_timestamps_follow_the_waits(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  char path[512];
  trace_path(path, sizeof path, "device.json");
  weft_stream_t *s[4];
  for (unsigned i = 0; i < 4; i++) s[i] = tu_stream(&env, i);
  weft_block_t x = tu_alloc(&env, N * 4, 0, "x"), y = tu_alloc(&env, N * 4, 1, "y"), z = tu_alloc(&env, N * 4, 2, "z"),
               w = tu_alloc(&env, N * 4, 3, "w"), none = {0};
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  setenv("WEFT_TRACE_DEVICE", "1", 1);
  assert_int_equal(weft_trace_start(path), WEFT_OK);
  unsetenv("WEFT_TRACE_DEVICE");
  assert_int_equal(tu_fill(&env, s[0], x, N, 3), WEFT_OK);
  assert_int_equal(tu_combine(&env, s[1], y, none, x, none, none, N, 1), WEFT_OK);
  assert_int_equal(tu_combine(&env, s[2], z, none, x, none, none, N, 2), WEFT_OK);
  assert_int_equal(tu_combine(&env, s[3], w, none, y, z, none, N, 3), WEFT_OK);
  assert_int_equal(weft_trace_stop(), WEFT_OK);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  dslice_t d[8];
  int nd = 0, device_tracks = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, "thread_name") && strstr(line, " (device)")) device_tracks++;
    if (!strstr(line, "\"cat\": \"device\"")) continue;
    assert_true(nd < 8);
    const char *ts = strstr(line, "\"ts\": "), *dur = strstr(line, "\"dur\": ");
    assert_non_null(ts);
    assert_non_null(dur);
    d[nd].tid = field(line, "\"tid\": ");
    d[nd].ts = strtod(ts + 6, NULL);
    d[nd].dur = strtod(dur + 7, NULL);
    assert_non_null(strstr(line, "\"name\": \"weft_launch\""));
    nd++;
  }
  fclose(f);
  assert_int_equal(nd, 4);
  assert_int_equal(device_tracks, 4);
  double start[4] = {0}, end[4] = {0};
  for (int i = 0; i < nd; i++) {
    assert_true(d[i].tid >= 1000 && d[i].tid < 1004);
    assert_true(d[i].dur > 0);
    start[d[i].tid - 1000] = d[i].ts;
    end[d[i].tid - 1000] = d[i].ts + d[i].dur;
  }
  /* ts is whole microseconds (truncated): allow one. */
  assert_true(start[1] + 1 >= end[0]);
  assert_true(start[2] + 1 >= end[0]);
  assert_true(start[3] + 1 >= end[1]);
  assert_true(start[3] + 1 >= end[2]);
  check_json(path);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  weft_block_t all[4] = {x, y, z, w};
  for (int i = 0; i < 4; i++) assert_int_equal(weft_free(all[i], s[3]), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
  tu_fini(&env);
}

static void test_start_refuses_bad_paths(void **state) {
  (void)state;
  assert_int_equal(weft_trace_start(NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_trace_start("/nonexistent/dir/trace.json"), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "/nonexistent/dir/trace.json"));
}

/* A device span ended on a thread that ends before it is labelled (a use whose work failed after
 * its close, or a trace stopped in between) goes back to the device's spans when the thread ends:
 * threads that come and go reuse one span instead of leaving theirs behind. */
static void *end_unlabelled(void *arg) {
  CUstream raw = arg;
  const weft__driver_t *drv;
  CUcontext ctx;
  if (weft__driver_get(&drv) != WEFT_OK || drv->cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      drv->cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return arg;
  weft__trace_span_t *sp = weft__trace_device_begin(drv, 0, 0, raw);
  if (sp == NULL) return arg;
  weft__trace_device_end(sp, raw);
  (void)drv->cuDevicePrimaryCtxRelease(0);
  return NULL; /* ends with the span unlabelled */
}

static void test_a_threads_unlabelled_span_goes_back_when_it_ends(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  const weft__driver_t *drv;
  assert_int_equal(weft__driver_get(&drv), WEFT_OK);
  CUstream raw;
  assert_int_equal(drv->cuStreamCreateWithPriority(&raw, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  char path[512];
  trace_path(path, sizeof path, "unlabelled.json");
  setenv("WEFT_TRACE_DEVICE", "1", 1);
  assert_int_equal(weft_trace_start(path), WEFT_OK);
  unsetenv("WEFT_TRACE_DEVICE");
  weft__meta_stats_t m0, m1;
  for (int i = 0; i < 9; i++) {
    if (i == 1) weft__meta_stats(&m0); /* after the first thread: its span exists */
    pthread_t t;
    void *failed;
    assert_int_equal(pthread_create(&t, NULL, end_unlabelled, raw), 0);
    assert_int_equal(pthread_join(t, &failed), 0);
    if (failed != NULL) fail_msg("thread %d: no device span (device timestamps unavailable)", i);
  }
  weft__meta_stats(&m1);
  assert_int_equal(weft_trace_stop(), WEFT_OK);
  assert_int_equal(drv->cuStreamSynchronize(raw), CUDA_SUCCESS);
  assert_int_equal(drv->cuStreamDestroy(raw), CUDA_SUCCESS);
  tu_fini(&env);
  if (m1.live != m0.live)
    fail_msg("8 threads that ended with an unlabelled span left %lld metadata allocations behind",
             (long long)(m1.live - m0.live));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_arrow_per_wait_on_the_right_pair),
      cmocka_unit_test(test_captures_have_tracks_of_their_own),
      cmocka_unit_test(test_device_timestamps_follow_the_waits),
      cmocka_unit_test(test_a_threads_unlabelled_span_goes_back_when_it_ends),
      cmocka_unit_test(test_start_refuses_bad_paths),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
