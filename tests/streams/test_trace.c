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
#include <sys/wait.h>
#include <cmocka.h>

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

static void test_one_arrow_per_wait_on_the_right_pair(void **state) {
  (void)state;
  tu_env_t env;
  tu_init(&env, NULL);
  char path[512];
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/trace.json", dir ? dir : "/tmp");
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
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "command -v python3 >/dev/null || exit 77; python3 -c \"import json; json.load(open('%s'))\"",
           path);
  int rc = system(cmd);
  if (!(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 77)) assert_int_equal(rc, 0);
  assert_int_equal(weft_free(y, s[3]), WEFT_OK);
  assert_int_equal(weft_free(z, s[3]), WEFT_OK);
  assert_int_equal(weft_free(w, s[3]), WEFT_OK);
  assert_int_equal(tu_races(&env), 0);
  tu_fini(&env);
}

static void test_start_refuses_bad_paths(void **state) {
  (void)state;
  assert_int_equal(weft_trace_start(NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_trace_start("/nonexistent/dir/trace.json"), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "/nonexistent/dir/trace.json"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_arrow_per_wait_on_the_right_pair),
      cmocka_unit_test(test_start_refuses_bad_paths),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
