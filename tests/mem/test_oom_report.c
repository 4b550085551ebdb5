/* Out of memory (issue 16): weft_alloc's error names the request, what the runtime held, the
 * budget, the top tags by live bytes and the resource's own reason; the OOM handler sees the same
 * and may free and ask for one more try. A 48 MiB simulated device (WEFT_SIM_MEMORY, BUILD). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "tests/util/cmocka_env.h"

#define MB ((size_t)1 << 20)

typedef struct seen {
  int calls, retry;
  weft_oom_info_t last;
  char top0[64];
  weft_block_t victim; /* freed by the handler when retry is set */
} seen_t;

static int handler(weft_runtime_t *rt, const weft_oom_info_t *info, void *user) {
  seen_t *s = user;
  (void)rt;
  s->calls++;
  s->last = *info;
  snprintf(s->top0, sizeof s->top0, "%s", info->top_tags[0] ? info->top_tags[0] : "");
  if (!s->retry || s->victim.rec == NULL) return 0;
  weft_stream_t *st;
  if (weft_stream_get(rt, 0, &st) != WEFT_OK || weft_free(s->victim, st) != WEFT_OK) return 0;
  if (weft_stream_synchronize(st) != WEFT_OK) return 0;
  s->victim.rec = NULL;
  return 1;
}

/* Fills the device with 8 MiB blocks tagged "big" (and one 1 MiB "small"); returns how many. */
static size_t fill(tu_env_t *env, weft_block_t *b, size_t max) {
  size_t n = 0;
  weft_stream_t *s = tu_stream(env, 0);
  weft_block_t small;
  assert_int_equal(weft_alloc(env->rt, MB, s, "small", &small), WEFT_OK);
  while (n < max && weft_alloc(env->rt, 8 * MB, s, "big", &b[n]) == WEFT_OK) n++;
  return n;
}

static void test_message_names_sizes_and_tags(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  weft_block_t b[16];
  size_t n = fill(&env, b, 16);
  assert_true(n >= 2 && n < 16);
  weft_block_t x;
  weft_status_t st = weft_alloc(env.rt, 8 * MB, tu_stream(&env, 1), "more", &x);
  assert_int_equal(st, WEFT_ERR_OUT_OF_MEMORY);
  const char *m = weft_last_error();
  char want[128];
  snprintf(want, sizeof want, "requested %zu bytes (tag 'more', stream 1)", 8 * MB);
  assert_non_null(strstr(m, want));
  snprintf(want, sizeof want, "top tags by live bytes: 'big' %zu, 'small' %zu", n * 8 * MB, MB);
  if (strstr(m, want) == NULL) fail_msg("no \"%s\" in: %s", want, m);
  assert_non_null(strstr(m, "live "));
  assert_non_null(strstr(m, "reserved "));
  assert_non_null(strstr(m, "budget 0 bytes"));
  assert_non_null(strstr(m, "largest free range")); /* the pool's reason follows */
  tu_fini(&env);
}

static void test_handler_frees_and_the_retry_succeeds(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  weft_block_t b[16];
  size_t n = fill(&env, b, 16);
  seen_t seen = {0};
  assert_int_equal(weft_set_oom_handler(env.rt, handler, &seen), WEFT_OK);
  weft_block_t x;
  /* The handler declines: one call, the allocation fails. */
  assert_int_equal(weft_alloc(env.rt, 8 * MB, tu_stream(&env, 1), "more", &x), WEFT_ERR_OUT_OF_MEMORY);
  assert_int_equal(seen.calls, 1);
  assert_int_equal(seen.last.requested, 8 * MB);
  assert_int_equal(seen.last.status, WEFT_ERR_OUT_OF_MEMORY);
  assert_int_equal(seen.last.stream, 1);
  assert_string_equal(seen.top0, "big");
  assert_true(seen.last.live_bytes >= n * 8 * MB + MB);
  assert_true(seen.last.reserved_bytes >= seen.last.live_bytes);
  /* The handler frees a block and asks again: the allocation succeeds, one more call. */
  seen.retry = 1;
  seen.victim = b[n - 1];
  assert_int_equal(weft_alloc(env.rt, 8 * MB, tu_stream(&env, 1), "more", &x), WEFT_OK);
  assert_int_equal(seen.calls, 2);
  assert_null(seen.victim.rec);
  /* No handler: no call. */
  assert_int_equal(weft_set_oom_handler(env.rt, NULL, NULL), WEFT_OK);
  weft_block_t y;
  assert_int_equal(weft_alloc(env.rt, 8 * MB, tu_stream(&env, 1), "more", &y), WEFT_ERR_OUT_OF_MEMORY);
  assert_int_equal(seen.calls, 2);
  tu_fini(&env);
}

/* A handler belongs to one life of the runtime: after the last release it is gone. */
static void test_handler_ends_with_the_runtime(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  seen_t seen = {0};
  assert_int_equal(weft_set_oom_handler(env.rt, handler, &seen), WEFT_OK);
  tu_fini(&env);
  tu_init(&env, NULL);
  weft_block_t b[16];
  (void)fill(&env, b, 16);
  assert_int_equal(seen.calls, 0);
  tu_fini(&env);
}

static void test_over_budget_says_the_budget(void **state) {
  (void)state;
  tu_env_t env;
  weft_options_t o = weft_options_default();
  o.budget_bytes = 20 * MB;
  tu_init(&env, &o);
  seen_t seen = {0};
  assert_int_equal(weft_set_oom_handler(env.rt, handler, &seen), WEFT_OK);
  weft_block_t a, b;
  assert_int_equal(weft_alloc(env.rt, 16 * MB, tu_stream(&env, 0), "first", &a), WEFT_OK);
  weft_status_t st = weft_alloc(env.rt, 16 * MB, tu_stream(&env, 0), "second", &b);
  assert_true(st == WEFT_ERR_OVER_BUDGET || st == WEFT_ERR_OUT_OF_MEMORY);
  char want[64];
  snprintf(want, sizeof want, "budget %zu bytes", 20 * MB);
  if (strstr(weft_last_error(), want) == NULL) fail_msg("no \"%s\" in: %s", want, weft_last_error());
  assert_int_equal(seen.calls, 1);
  assert_int_equal(seen.last.budget_bytes, 20 * MB);
  assert_string_equal(seen.top0, "first");
  assert_int_equal(weft_set_oom_handler(NULL, handler, NULL), WEFT_ERR_INVALID_ARGUMENT);
  tu_fini(&env);
}

/* options.log_path with log_format 1: the runtime's log is in RMM's columns, failures included. */
static void test_runtime_log_in_rmm_columns(void **state) {
  (void)state;
  char path[512];
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/rmm_log.csv", dir ? dir : "/tmp");
  weft_options_t o = weft_options_default();
  o.log_path = path;
  o.log_format = 1;
  tu_env_t env;
  tu_init(&env, &o);
  weft_block_t a, b;
  assert_int_equal(weft_alloc(env.rt, MB, tu_stream(&env, 0), "a", &a), WEFT_OK);
  assert_int_equal(weft_alloc(env.rt, 64 * MB, tu_stream(&env, 0), "b", &b), WEFT_ERR_OUT_OF_MEMORY);
  assert_int_equal(weft_free(a, tu_stream(&env, 1)), WEFT_OK);
  tu_fini(&env);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[512];
  int allocs = 0, failures = 0, frees = 0;
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "Thread,Time,Action,Pointer,Size,Stream\n");
  while (fgets(line, sizeof line, f) != NULL) {
    allocs += strstr(line, ",allocate,") != NULL;
    failures += strstr(line, ",allocate failure,") != NULL;
    frees += strstr(line, ",deallocate,") != NULL;
  }
  fclose(f);
  assert_true(allocs >= 1 && failures >= 1 && frees >= 1);
}

static uint64_t number_after(const char *json, const char *key) {
  const char *at = strstr(json, key);
  if (at == NULL) fail_msg("no %s in the snapshot", key);
  return strtoull(at + strlen(key), NULL, 10);
}

/* Runs a shell command that exits 77 when there is no python3 (the C checks then stand alone). */
static void run_python(const char *cmd) {
  int rc = system(cmd);
  if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 77) return;
  assert_int_equal(rc, 0);
}

/* Checks the JSON with Python when there is one: valid, and its lists add up to its totals. */
static void python_checks(const char *path) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "command -v python3 >/dev/null || exit 77; python3 -c \"import json,sys; s=json.load(open('%s')); "
           "t=s['totals']; b=[x for g in s['segments'] for x in g['blocks']]+s['blocks_outside_segments']; "
           "f=[x for g in s['segments'] for x in g['free']]; "
           "assert len(b)==t['blocks'], 'blocks'; assert sum(x['bytes'] for x in b)==t['live_bytes'], 'live'; "
           "assert sum(x['bytes'] for x in f)==t['free_bytes'], 'free'; "
           "assert len(s['cached'])==t['cached_blocks'] and sum(x['bytes'] for x in s['cached'])==t['cached_bytes'], 'cached'; "
           "assert sum(g['bytes'] for g in s['segments'])==t['segment_bytes'], 'segments'; "
           "assert sum(x['bytes'] for x in s['by_tag'])==t['live_bytes'], 'tags'; "
           "assert sum(x['bytes'] for x in s['by_stream'])==t['live_bytes'], 'streams'; "
           "assert all(g['base'] <= x['ptr'] for g in s['segments'] for x in g['blocks']), 'placement'\"",
           path);
  run_python(cmd);
}

/* Writes the runtime's snapshot to <TEST_TMPDIR>/<name> (its path into `path`) and reads it back
 * into json (NUL-terminated). */
static void snapshot_to(weft_runtime_t *rt, const char *name, char *path, size_t path_size, char *json,
                        size_t json_size) {
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(path, path_size, "%s/%s", dir ? dir : "/tmp", name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(weft_memory_snapshot(rt, f), WEFT_OK);
  fclose(f);
  f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(json, 1, json_size - 1, f);
  fclose(f);
  json[n] = '\0';
}

/* weft_memory_snapshot: totals equal the resource's statistics; the lists add up (python3). */
static void test_snapshot_totals_match_the_stats(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  weft_block_t b[6];
  const char *tags[3] = {"weights", "acts", "tmp"};
  for (int i = 0; i < 6; i++)
    assert_int_equal(weft_alloc(env.rt, (size_t)(i + 1) * 100000, tu_stream(&env, (unsigned)i % 3), tags[i % 3], &b[i]),
                     WEFT_OK);
  assert_int_equal(weft_free(b[2], tu_stream(&env, 0)), WEFT_OK); /* a free range */
  char path[512];
  static char json[1 << 16];
  snapshot_to(env.rt, "snapshot.json", path, sizeof path, json, sizeof json);
  weft_resource_stats_t rs;
  weft_resource_stats(weft_runtime_resource(env.rt), &rs);
  assert_int_equal(number_after(json, "\"live_bytes\": "), rs.live_bytes); /* the resource's line */
  /* The resource counts the block stream 0 cached (weft_free) as live; the snapshot tells it apart. */
  assert_int_equal(number_after(strstr(json, "\"totals\""), "\"live_bytes\": ") +
                       number_after(strstr(json, "\"totals\""), "\"cached_bytes\": "),
                   rs.live_bytes);
  assert_int_equal(number_after(strstr(json, "\"totals\""), "\"cached_blocks\": "), 1);
  assert_int_equal(number_after(json, "\"segment_bytes\": "), rs.reserved_bytes);
  assert_int_equal(number_after(strstr(json, "\"totals\""), "\"blocks\": "), 5);
  assert_true(number_after(json, "\"free_bytes\": ") > 0);
  assert_non_null(strstr(json, "\"tag\": \"weights\""));
  python_checks(path);
  assert_int_equal(weft_memory_snapshot(env.rt, NULL), WEFT_ERR_INVALID_ARGUMENT);
  tu_fini(&env);
}

/* A graph pool's chunks are segments of their own ("owner": "graph pool") with the graph's output
 * inside, adding up to the pool's reserved bytes; the stack's segments still equal its stats. */
static void test_snapshot_shows_graph_pools(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  weft_stream_t *s0 = tu_stream(&env, 0);
  weft_graph_pool_t *p;
  assert_int_equal(weft_graph_pool_create(env.rt, &p), WEFT_OK);
  weft_capture_options_t o = weft_capture_options_default();
  o.memory = WEFT_GRAPH_MEMORY_PRIVATE_POOL;
  o.pool = p;
  assert_int_equal(weft_capture_begin(s0, &o), WEFT_OK);
  weft_block_t inside;
  assert_int_equal(weft_alloc(env.rt, 3 << 20, s0, "graph_out", &inside), WEFT_OK);
  assert_int_equal(tu_fill(&env, s0, inside, 1024, 7), WEFT_OK);
  weft_graph_t *g;
  assert_int_equal(weft_capture_end(s0, &g), WEFT_OK);
  weft_exec_t *e;
  assert_int_equal(weft_graph_instantiate(g, s0, &e), WEFT_OK);
  assert_int_equal(weft_exec_launch(e, s0), WEFT_OK);
  char path[512];
  static char json[1 << 16];
  snapshot_to(env.rt, "snapshot_gpool.json", path, sizeof path, json, sizeof json);
  uint64_t reserved = weft_graph_pool_reserved(p);
  assert_true(reserved >= (3u << 20));
  const char *owner = strstr(json, "{\"owner\": \"graph pool\", \"bytes\": ");
  assert_non_null(owner);
  assert_int_equal(number_after(owner, "\"bytes\": "), reserved);
  weft_resource_stats_t rs;
  weft_resource_stats(weft_runtime_resource(env.rt), &rs);
  const char *stack = strstr(json, "{\"owner\": \"pool\", \"bytes\": ");
  if (rs.reserved_bytes > 0) {
    assert_non_null(stack);
    assert_int_equal(number_after(stack, "\"bytes\": "), rs.reserved_bytes);
  }
  assert_int_equal(number_after(json, "\"segment_bytes\": "), rs.reserved_bytes + reserved);
  /* The graph's output is a block inside a graph-pool segment (python: placement). */
  assert_non_null(strstr(json, "\"tag\": \"graph_out\""));
  python_checks(path);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "command -v python3 >/dev/null || exit 77; python3 -c \"import json; s=json.load(open('%s')); "
           "g=[x for x in s['segments'] if x['owner']=='graph pool']; "
           "assert any(b['tag']=='graph_out' for x in g for b in x['blocks']), 'output not in a graph pool segment'\"",
           path);
  run_python(cmd);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  weft_block_t out;
  for (size_t i = 0; weft_exec_output(e, i, &out) == WEFT_OK; i++) assert_int_equal(weft_free(out, s0), WEFT_OK);
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_graph_pool_destroy(p), WEFT_OK);
  /* Destroyed: gone from the next snapshot. */
  snapshot_to(env.rt, "snapshot_gpool.json", path, sizeof path, json, sizeof json);
  assert_null(strstr(json, "\"graph pool\""));
  tu_fini(&env);
}

/* WEFT_SNAPSHOT_ON_OOM: a failed allocation leaves a snapshot behind. */
static void test_snapshot_on_oom(void **state) {
  (void)state;
  char path[512];
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/oom_snapshot.json", dir ? dir : "/tmp");
  remove(path);
  setenv("WEFT_SNAPSHOT_ON_OOM", path, 1);
  tu_env_t env;
  tu_init(&env, NULL);
  weft_block_t b[16];
  size_t n = fill(&env, b, 16);
  assert_true(n >= 2);
  unsetenv("WEFT_SNAPSHOT_ON_OOM");
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char head[64] = "";
  assert_non_null(fgets(head, sizeof head, f));
  assert_non_null(fgets(head, sizeof head, f));
  fclose(f);
  assert_non_null(strstr(head, "\"weft_snapshot\": 1"));
  python_checks(path);
  tu_fini(&env);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_message_names_sizes_and_tags),
      cmocka_unit_test(test_snapshot_shows_graph_pools),
      cmocka_unit_test(test_handler_frees_and_the_retry_succeeds),
      cmocka_unit_test(test_handler_ends_with_the_runtime),
      cmocka_unit_test(test_over_budget_says_the_budget),
      cmocka_unit_test(test_runtime_log_in_rmm_columns),
      cmocka_unit_test(test_snapshot_totals_match_the_stats),
      cmocka_unit_test(test_snapshot_on_oom),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
