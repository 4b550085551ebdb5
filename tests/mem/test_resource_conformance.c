/* One suite for every resource (weft_resource_conformance, as RMM's mr_ref_test_basic): each
 * built-in resource and adaptor, stacked as weft stacks them, and a resource written here the way
 * a user would write one. A deliberately broken resource must fail it (the suite can fail). On
 * the simulator and on a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tests/mem/mem_env.h"

/* Conforming, and (on the simulator) without a race: the suite's frees on the stream other than
 * the allocating one are ordered after the allocation. */
static void expect_conforming(weft_resource_t *r) {
  if (sim != NULL) sim->reset_races();
  unsigned failed = weft_resource_conformance(r, s0, s1, stderr);
  if (failed != 0) fail_msg("resource '%s' failed %u conformance checks", r->ops->name, failed);
  if (sim != NULL && weft_stream_synchronize(s0) == WEFT_OK && weft_stream_synchronize(s1) == WEFT_OK &&
      sim->race_count() != 0) {
    sim->print_report();
    fail_msg("resource '%s': the conformance suite raced (%llu races)", r->ops->name,
             (unsigned long long)sim->race_count());
  }
}

static void test_direct_conforms(void **state) {
  (void)state;
  weft_resource_t *d;
  assert_int_equal(weft_direct_create(rt, &d), WEFT_OK);
  expect_conforming(d);
  weft_resource_destroy(d);
}

static void test_async_and_pool_conform(void **state) {
  (void)state;
  weft_resource_t *a, *p;
  assert_int_equal(weft_async_create(rt, NULL, &a), WEFT_OK);
  expect_conforming(a);
  weft_pool_options_t po = weft_pool_options_default();
  po.chunk_bytes = 8u << 20;
  assert_int_equal(weft_pool_create(rt, a, &po, &p), WEFT_OK);
  expect_conforming(p);
  weft_resource_destroy(p);
  weft_resource_destroy(a);
}

static void test_adaptors_conform(void **state) {
  (void)state;
  weft_resource_t *d, *b, *g, *l, *st;
  assert_int_equal(weft_direct_create(rt, &d), WEFT_OK);
  assert_int_equal(weft_budget_create(rt, d, 1ull << 30, NULL, &b), WEFT_OK);
  weft_guard_options_t go = weft_guard_options_default();
  go.quarantine_count = 4;
  assert_int_equal(weft_guard_create(rt, b, &go, &g), WEFT_OK);
  assert_int_equal(weft_logging_create(rt, g, "/dev/null", NULL, NULL, &l), WEFT_OK);
  assert_int_equal(weft_stats_create(rt, l, &st), WEFT_OK);
  weft_resource_t *each[] = {b, g, l, st};
  for (size_t i = 0; i < 4; i++) expect_conforming(each[i]);
  /* The counts of the layers below agree with what went through them. */
  weft_resource_stats_t sb, ss;
  weft_resource_stats(b, &sb);
  weft_resource_stats(st, &ss);
  assert_int_equal(ss.live_bytes, 0);
  assert_int_equal(sb.live_bytes, 0); /* the guard's quarantine was trimmed by the suite */
  assert_true(sb.allocs >= ss.allocs);
  weft_resource_destroy(st);
  weft_resource_destroy(l);
  weft_resource_destroy(g);
  weft_resource_destroy(b);
  weft_resource_destroy(d);
}

/* A resource as a user writes one: a bump allocator over one upstream block, freeing nothing
 * until it is empty. It writes only allocate/deallocate; weft counts. */
typedef struct bump {
  weft_resource_t base;
  CUdeviceptr start;
  uint64_t used, live, size;
  int broken; /* 1: hands out overlapping memory (the suite must notice) */
} bump_t;

static weft_status_t bump_alloc(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag, CUdeviceptr *out) {
  bump_t *b = (bump_t *)self;
  uint64_t n = (bytes + 255) & ~255ull;
  if (b->used + n > b->size) return WEFT_ERR_OUT_OF_MEMORY;
  *out = b->start + b->used;
  if (!b->broken) b->used += n;
  b->live++;
  return WEFT_OK;
}

static weft_status_t bump_free(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s, const char *tag) {
  bump_t *b = (bump_t *)self;
  if (--b->live == 0) b->used = 0;
  return WEFT_OK;
}

static const weft_resource_ops_t bump_ops = {.name = "bump", .allocate = bump_alloc, .deallocate = bump_free};

static void test_a_user_resource_conforms_and_a_broken_one_does_not(void **state) {
  (void)state;
  weft_resource_t *d;
  assert_int_equal(weft_direct_create(rt, &d), WEFT_OK);
  bump_t b = {.base = {.ops = &bump_ops, .rt = rt}, .size = 64u << 20};
  assert_int_equal(weft_resource_allocate(d, b.size, s0, "bump", &b.start), WEFT_OK);
  expect_conforming(&b.base);
  b.broken = 1;
  FILE *null = fopen("/dev/null", "w");
  assert_true(weft_resource_conformance(&b.base, s0, s1, null) > 0);
  fclose(null);
  assert_int_equal(weft_resource_deallocate(d, b.start, b.size, s0, "bump"), WEFT_OK);
  weft_resource_destroy(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_direct_conforms),
      cmocka_unit_test(test_async_and_pool_conform),
      cmocka_unit_test(test_adaptors_conform),
      cmocka_unit_test(test_a_user_resource_conforms_and_a_broken_one_does_not),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
