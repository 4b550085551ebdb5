/* The logging adaptor (CSV to a sink and to a file, failures logged) and the stats adaptor
 * (overall and by tag, consistent after failures), over a fake upstream. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/mem/fake_runtime.h"

static char lines[16][512];
static int nlines;

static void sink(void *user, const char *line) {
  assert_int_equal((intptr_t)user, 42);
  if (nlines < 16) snprintf(lines[nlines++], sizeof lines[0], "%s", line);
}

static void test_log_lines_to_a_sink(void **state) {
  (void)state;
  nlines = 0;
  weft_runtime_t *rt = fake_init(4);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *l = NULL;
  assert_int_equal(weft_logging_create(rt, &up->base, NULL, sink, (void *)(intptr_t)42, &l), WEFT_OK);
  assert_string_equal(lines[0], "thread,time_ns,action,ptr,bytes,stream,device,tag");
  static const char tag[] = "act,\"x\"";
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(l, 4096, fake_stream(3), tag, &p), WEFT_OK);
  up->fail_alloc = WEFT_ERR_OUT_OF_MEMORY;
  assert_int_equal(weft_resource_allocate(l, 77, fake_stream(1), tag, &p), WEFT_ERR_OUT_OF_MEMORY);
  up->fail_alloc = WEFT_OK;
  assert_int_equal(weft_resource_deallocate(l, p, 4096, fake_stream(2), tag), WEFT_OK);
  assert_int_equal(nlines, 4);
  long tid;
  unsigned long long t;
  char action[32], ptr[32], tagf[64];
  size_t bytes;
  unsigned stream;
  int device;
  assert_int_equal(sscanf(lines[1], "%ld,%llu,%31[^,],%31[^,],%zu,%u,%d,%63[^\n]", &tid, &t, action, ptr, &bytes,
                          &stream, &device, tagf), 8);
  assert_string_equal(action, "alloc");
  assert_int_equal(bytes, 4096);
  assert_int_equal(stream, 3);
  assert_int_equal(device, 0);
  assert_string_equal(tagf, "\"act,\"\"x\"\"\"");
  char want[32];
  snprintf(want, sizeof want, "0x%llx", (unsigned long long)p);
  assert_string_equal(ptr, want);
  assert_non_null(strstr(lines[2], ",alloc_failed,0x0,77,1,0,"));
  assert_non_null(strstr(lines[3], ",free,"));
  weft_resource_destroy(l);
  fake_upstream_destroy(up);
}

/* RMM's columns, as its replay benchmark reads them. */
static void test_log_lines_in_rmm_columns(void **state) {
  (void)state;
  nlines = 0;
  weft_runtime_t *rt = fake_init(4);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *l = NULL;
  assert_int_equal(weft_logging_create_rmm(rt, &up->base, NULL, sink, (void *)(intptr_t)42, &l), WEFT_OK);
  assert_string_equal(lines[0], "Thread,Time,Action,Pointer,Size,Stream");
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(l, 4096, fake_stream(3), "t", &p), WEFT_OK);
  up->fail_alloc = WEFT_ERR_OUT_OF_MEMORY;
  CUdeviceptr q = 0;
  assert_int_equal(weft_resource_allocate(l, 77, fake_stream(1), "t", &q), WEFT_ERR_OUT_OF_MEMORY);
  up->fail_alloc = WEFT_OK;
  assert_int_equal(weft_resource_deallocate(l, p, 4096, fake_stream(2), "t"), WEFT_OK);
  assert_int_equal(nlines, 4);
  long tid;
  long long secs;
  long usec;
  char action[32], ptr[32], stream[32];
  size_t bytes;
  assert_int_equal(sscanf(lines[1], "%ld,%lld.%6ld,%31[^,],%31[^,],%zu,%31s", &tid, &secs, &usec, action, ptr, &bytes,
                          stream), 7);
  assert_string_equal(action, "allocate");
  assert_int_equal(bytes, 4096);
  assert_true(secs > 1700000000); /* seconds since the epoch */
  char want[32];
  snprintf(want, sizeof want, "0x%llx", (unsigned long long)p);
  assert_string_equal(ptr, want);
  snprintf(want, sizeof want, "0x%llx", (unsigned long long)(uintptr_t)fake_stream(3)->raw); /* the CUstream */
  assert_string_equal(stream, want);
  assert_non_null(strstr(lines[2], ",allocate failure,0x0,77,"));
  assert_non_null(strstr(lines[3], ",deallocate,"));
  weft_resource_destroy(l);
  fake_upstream_destroy(up);
}

static void test_log_to_a_file_and_unopenable_paths(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *l = NULL;
  assert_int_equal(weft_logging_create(rt, &up->base, "/nonexistent/dir/log.csv", NULL, NULL, &l),
                   WEFT_ERR_DRIVER);
  assert_non_null(strstr(weft_last_error(), "/nonexistent/dir/log.csv"));
  assert_int_equal(weft_logging_create(rt, &up->base, NULL, NULL, NULL, &l), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_logging_create(rt, &up->base, "x", sink, NULL, &l), WEFT_ERR_INVALID_ARGUMENT);
  char path[256];
  const char *dir = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/log.csv", dir ? dir : "/tmp");
  assert_int_equal(weft_logging_create(rt, &up->base, path, NULL, NULL, &l), WEFT_OK);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(l, 512, fake_stream(0), "", &p), WEFT_OK);
  assert_int_equal(weft_resource_deallocate(l, p, 512, fake_stream(1), ""), WEFT_OK);
  weft_resource_destroy(l);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char buf[512];
  int n = 0;
  while (fgets(buf, sizeof buf, f)) n++;
  fclose(f);
  assert_int_equal(n, 3);
  unlink(path);
  fake_upstream_destroy(up);
}

static void test_stats_by_tag_add_up(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *s = NULL;
  assert_int_equal(weft_stats_create(rt, &up->base, &s), WEFT_OK);
  static const char a[] = "activations", w[] = "weights";
  CUdeviceptr pa[3], pw;
  for (int i = 0; i < 3; i++) assert_int_equal(weft_resource_allocate(s, 1000, fake_stream(0), a, &pa[i]), WEFT_OK);
  assert_int_equal(weft_resource_allocate(s, 5000, fake_stream(1), w, &pw), WEFT_OK);
  up->fail_alloc = WEFT_ERR_OUT_OF_MEMORY;
  CUdeviceptr x;
  assert_int_equal(weft_resource_allocate(s, 9, fake_stream(1), w, &x), WEFT_ERR_OUT_OF_MEMORY);
  up->fail_alloc = WEFT_OK;
  assert_int_equal(weft_resource_deallocate(s, pa[0], 1000, fake_stream(0), a), WEFT_OK);
  weft_tag_stats_t t[4];
  assert_int_equal(weft_stats_by_tag(s, t, 4), 2);
  for (int i = 0; i < 2; i++) {
    if (strcmp(t[i].tag, "activations") == 0) {
      assert_int_equal(t[i].live_bytes, 2000);
      assert_int_equal(t[i].live_peak, 3000);
      assert_int_equal(t[i].allocs, 3);
      assert_int_equal(t[i].frees, 1);
    } else {
      assert_string_equal(t[i].tag, "weights");
      assert_int_equal(t[i].live_bytes, 5000);
      assert_int_equal(t[i].allocs, 1);
    }
  }
  assert_int_equal(weft_stats_by_tag(s, t, 1), 2); /* count even when out is short */
  weft_resource_stats_t st;
  weft_resource_stats(s, &st);
  assert_int_equal(st.live_bytes, 7000);
  assert_int_equal(st.live_peak, 8000);
  assert_int_equal(st.failures, 1);
  /* Many tags grow the table. */
  static char names[100][8];
  for (int i = 0; i < 100; i++) {
    snprintf(names[i], 8, "t%d", i);
    CUdeviceptr p;
    assert_int_equal(weft_resource_allocate(s, 256, fake_stream(0), names[i], &p), WEFT_OK);
    assert_int_equal(weft_resource_deallocate(s, p, 256, fake_stream(0), names[i]), WEFT_OK);
  }
  assert_int_equal(weft_stats_by_tag(s, NULL, 0), 102);
  for (int i = 1; i < 3; i++) assert_int_equal(weft_resource_deallocate(s, pa[i], 1000, fake_stream(0), a), WEFT_OK);
  assert_int_equal(weft_resource_deallocate(s, pw, 5000, fake_stream(0), w), WEFT_OK);
  weft_resource_destroy(s);
  assert_int_equal(up->live_bytes, 0);
  fake_upstream_destroy(up);
}

static void test_resource_calls_check_their_arguments(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *s = NULL;
  assert_int_equal(weft_stats_create(rt, &up->base, &s), WEFT_OK);
  CUdeviceptr p = 0;
  assert_int_equal(weft_resource_allocate(NULL, 1, fake_stream(0), "", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_allocate(s, 1, NULL, "", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_allocate(s, 1, fake_stream(0), "", NULL), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_allocate(s, 0, fake_stream(0), "", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(weft_last_error(), "bytes is 0"));
  assert_int_equal(weft_resource_allocate(s, SIZE_MAX, fake_stream(0), "", &p), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_deallocate(s, 0, 1, fake_stream(0), ""), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft_resource_deallocate(s, 0x1000, 0, fake_stream(0), ""), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(up->allocs, 0);
  /* A NULL tag reaches resources as "". */
  assert_int_equal(weft_resource_allocate(s, 1, fake_stream(0), NULL, &p), WEFT_OK);
  weft_tag_stats_t t;
  assert_int_equal(weft_stats_by_tag(s, &t, 1), 1);
  assert_string_equal(t.tag, "");
  assert_int_equal(weft_resource_deallocate(s, p, 1, fake_stream(0), NULL), WEFT_OK);
  assert_int_equal(weft_resource_trim(s, 0), WEFT_OK);
  assert_int_equal(weft_resource_trim(NULL, 0), WEFT_ERR_INVALID_ARGUMENT);
  weft_resource_stats_t st;
  weft_resource_stats(NULL, &st);
  assert_int_equal(st.allocs, 0);
  weft_resource_destroy(NULL);
  /* Adaptors refuse an upstream of another runtime. */
  fake_upstream_t *other = fake_upstream_create((weft_runtime_t *)&st);
  weft_resource_t *x = NULL;
  assert_int_equal(weft_stats_create(rt, &other->base, &x), WEFT_ERR_WRONG_DEVICE);
  fake_upstream_destroy(other);
  weft_resource_destroy(s);
  fake_upstream_destroy(up);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_log_lines_to_a_sink),
      cmocka_unit_test(test_log_lines_in_rmm_columns),
      cmocka_unit_test(test_log_to_a_file_and_unopenable_paths),
      cmocka_unit_test(test_stats_by_tag_add_up),
      cmocka_unit_test(test_resource_calls_check_their_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
