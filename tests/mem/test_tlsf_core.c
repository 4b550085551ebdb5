/* The TLSF core alone (tlsf.h): size classes, fits, splitting, coalescing, lanes that never merge
 * with each other, retiring in age order, the address table, host-OOM-free paths, and a random
 * workload checked against a shadow map and the invariant walker after every step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/mem/tlsf.h"
#include "tests/mem/fake_runtime.h"

#define G WEFT__TLSF_GRANULE

static void test_classes_are_monotonic_and_small_ones_exact(void **state) {
  (void)state;
  unsigned prev = 0;
  for (uint64_t u = 1; u < 100000; u++) {
    unsigned c = weft__tlsf_class(u * G);
    assert_true(c >= prev);
    assert_true(c < WEFT__TLSF_CLASSES);
    if (u < WEFT__TLSF_SL) assert_int_equal(c, u);
    prev = c;
  }
  assert_true(weft__tlsf_class((1ull << 48) - G) < WEFT__TLSF_CLASSES);
  /* A large class spans at most 1/32 of its lower bound. */
  assert_int_equal(weft__tlsf_class(32 * G), weft__tlsf_class(32 * G + G - 1));
  assert_int_not_equal(weft__tlsf_class(64 * G), weft__tlsf_class(66 * G));
}

static void test_split_then_free_coalesces_back_to_one_range(void **state) {
  (void)state;
  weft__tlsf_t t;
  assert_int_equal(weft__tlsf_init(&t, 2), WEFT_OK);
  int chunk;
  assert_non_null(weft__tlsf_add_chunk(&t, 0x100000, 64 * G, &chunk, 0, 1));
  weft__tlsf_range_t *a = weft__tlsf_alloc(&t, weft__tlsf_find(&t, 0, 3 * G), 3 * G);
  weft__tlsf_range_t *b = weft__tlsf_alloc(&t, weft__tlsf_find(&t, 0, 5 * G), 5 * G);
  weft__tlsf_range_t *c = weft__tlsf_alloc(&t, weft__tlsf_find(&t, 0, 7 * G), 7 * G);
  assert_non_null(a); assert_non_null(b); assert_non_null(c);
  assert_int_equal(a->addr, 0x100000);
  assert_int_equal(b->addr, 0x100000 + 3 * G);
  assert_int_equal(c->addr, 0x100000 + 8 * G);
  assert_ptr_equal(weft__tlsf_lookup(&t, b->addr), b);
  assert_null(weft__tlsf_lookup(&t, b->addr + G));
  assert_int_equal(t.free_bytes, (64 - 15) * G);
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_free(&t, b, 0, 2);
  weft__tlsf_free(&t, a, 0, 3);
  assert_int_equal(t.lane[0].free_ranges, 2);
  weft__tlsf_range_t *all = weft__tlsf_free(&t, c, 0, 4);
  assert_true(weft__tlsf_is_whole_chunk(all));
  assert_int_equal(all->stamp, 4); /* the newest stamp wins */
  assert_ptr_equal(all->chunk, &chunk);
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_remove_chunk(&t, all);
  assert_int_equal(t.chunks, 0);
  assert_int_equal(t.free_bytes, 0);
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_destroy(&t);
}

static void test_neighbours_of_different_lanes_stay_apart_until_moved(void **state) {
  (void)state;
  weft__tlsf_t t;
  assert_int_equal(weft__tlsf_init(&t, 3), WEFT_OK);
  assert_non_null(weft__tlsf_add_chunk(&t, 0, 4 * G, NULL, 2, 0));
  weft__tlsf_range_t *a = weft__tlsf_alloc(&t, weft__tlsf_find(&t, 2, G), G);
  weft__tlsf_range_t *b = weft__tlsf_alloc(&t, weft__tlsf_find(&t, 2, G), G);
  weft__tlsf_free(&t, a, 0, 10);
  weft__tlsf_range_t *rb = weft__tlsf_free(&t, b, 1, 20);
  assert_int_equal(t.lane[0].free_ranges, 1);
  assert_int_equal(t.lane[1].free_ranges, 1);
  assert_null(weft__tlsf_find(&t, 0, 2 * G)); /* no cross-lane merge */
  assert_true(weft__tlsf_is_valid(&t));
  /* Retiring both into lane 2 merges all three pieces. */
  weft__tlsf_move(&t, weft__tlsf_oldest(&t, 0), 2, 0);
  weft__tlsf_range_t *all = weft__tlsf_move(&t, rb, 2, 0);
  assert_true(weft__tlsf_is_whole_chunk(all));
  assert_int_equal(all->size, 4 * G);
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_destroy(&t);
}

static void test_age_list_keeps_free_order_and_split_keeps_place(void **state) {
  (void)state;
  weft__tlsf_t t;
  assert_int_equal(weft__tlsf_init(&t, 2), WEFT_OK);
  assert_non_null(weft__tlsf_add_chunk(&t, 0, 16 * G, NULL, 1, 0));
  weft__tlsf_range_t *r[8];
  for (int i = 0; i < 8; i++) r[i] = weft__tlsf_alloc(&t, weft__tlsf_find(&t, 1, 2 * G), 2 * G);
  /* Free the even ones on lane 0 with rising stamps (no two adjacent). */
  for (int i = 0; i < 8; i += 2) weft__tlsf_free(&t, r[i], 0, (uint64_t)(i + 1));
  uint64_t prev = 0;
  for (weft__tlsf_range_t *x = weft__tlsf_oldest(&t, 0); x; x = x->next_age) {
    assert_true(x->stamp > prev);
    prev = x->stamp;
  }
  /* Splitting the oldest keeps the remainder at the front. */
  weft__tlsf_range_t *oldest = weft__tlsf_oldest(&t, 0);
  uint64_t stamp = oldest->stamp;
  weft__tlsf_range_t *part = weft__tlsf_alloc(&t, oldest, G);
  assert_int_equal(weft__tlsf_oldest(&t, 0)->stamp, stamp);
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_free(&t, part, 0, 100);
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_destroy(&t);
}

static void test_find_prefers_a_good_fit(void **state) {
  (void)state;
  weft__tlsf_t t;
  assert_int_equal(weft__tlsf_init(&t, 1), WEFT_OK);
  /* Three chunks: 1000 granules, 40 granules, 33 granules. */
  assert_non_null(weft__tlsf_add_chunk(&t, 0x0, 1000 * G, NULL, 0, 0));
  assert_non_null(weft__tlsf_add_chunk(&t, 0x10000000, 40 * G, NULL, 0, 0));
  assert_non_null(weft__tlsf_add_chunk(&t, 0x20000000, 33 * G, NULL, 0, 0));
  weft__tlsf_range_t *r = weft__tlsf_find(&t, 0, 33 * G);
  assert_int_equal(r->size, 33 * G); /* exact class head */
  r = weft__tlsf_find(&t, 0, 36 * G);
  assert_int_equal(r->size, 40 * G); /* next class, not the 1000-granule one */
  assert_null(weft__tlsf_find(&t, 0, 1001 * G));
  weft__tlsf_destroy(&t);
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_random_workload_keeps_every_invariant(void **state) {
  (void)state;
  const unsigned lanes = 5;
  for (uint64_t seed = 1; seed <= 4; seed++) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull;
    weft__tlsf_t t;
    assert_int_equal(weft__tlsf_init(&t, lanes), WEFT_OK);
    for (int c = 0; c < 4; c++)
      assert_non_null(weft__tlsf_add_chunk(&t, (uint64_t)(c + 1) << 32, (uint64_t)(1 + c) << 22, NULL, 4, 0));
    weft__tlsf_range_t *live[512] = {0};
    uint64_t stamp = 1;
    for (int step = 0; step < 20000; step++) {
      unsigned k = (unsigned)(rng(&s) % 512);
      if (live[k] != NULL) {
        weft__tlsf_free(&t, live[k], (unsigned)(rng(&s) % lanes), stamp++);
        live[k] = NULL;
      } else if (rng(&s) % 8 == 0) {
        unsigned lane = (unsigned)(rng(&s) % (lanes - 1));
        weft__tlsf_range_t *o;
        while ((o = weft__tlsf_oldest(&t, lane)) != NULL && rng(&s) % 4 != 0) weft__tlsf_move(&t, o, 4, 0);
      } else {
        uint64_t size = ((rng(&s) % 4 == 0) ? 1 + rng(&s) % 4096 : 1 + rng(&s) % 16) * G;
        unsigned lane = (unsigned)(rng(&s) % lanes);
        weft__tlsf_range_t *r = weft__tlsf_find(&t, lane, size);
        if (r == NULL) continue;
        assert_true(r->size >= size);
        live[k] = weft__tlsf_alloc(&t, r, size);
        assert_non_null(live[k]);
        assert_int_equal(live[k]->size, size);
      }
      if (step % 97 == 0) assert_true(weft__tlsf_is_valid(&t));
    }
    /* No two live ranges overlap (each is found by its address and tiles its chunk). */
    assert_true(weft__tlsf_is_valid(&t));
    for (int k = 0; k < 512; k++)
      if (live[k]) weft__tlsf_free(&t, live[k], 4, 0);
    /* Everything free in one lane: each chunk is one range again. */
    assert_int_equal(t.lane[4].free_ranges + t.lane[0].free_ranges + t.lane[1].free_ranges + t.lane[2].free_ranges +
                         t.lane[3].free_ranges >= 4, 1);
    for (unsigned l = 0; l < 4; l++) {
      weft__tlsf_range_t *o;
      while ((o = weft__tlsf_oldest(&t, l)) != NULL) weft__tlsf_move(&t, o, 4, 0);
    }
    assert_int_equal(t.lane[4].free_ranges, 4);
    assert_int_equal(t.allocated.count, 0);
    assert_true(weft__tlsf_is_valid(&t));
    weft__tlsf_destroy(&t);
  }
}

static void test_bad_lane_counts_are_rejected(void **state) {
  (void)state;
  weft__tlsf_t t;
  assert_int_equal(weft__tlsf_init(&t, 0), WEFT_ERR_INVALID_ARGUMENT);
  assert_int_equal(weft__tlsf_init(&t, WEFT__TLSF_MAX_LANES + 1), WEFT_ERR_INVALID_ARGUMENT);
}

/* Every size a pool can be handed has a class: requests up to WEFT__MEM_MAX_BYTES (2^48) and
 * what adaptors add on top (a guard's two canaries of up to 1 MiB each). */
static void test_largest_sizes_have_classes(void **state) {
  (void)state;
  assert_true(weft__tlsf_class(WEFT__MEM_MAX_BYTES) < WEFT__TLSF_CLASSES);
  unsigned prev = weft__tlsf_class(WEFT__MEM_MAX_BYTES - 64 * G);
  for (uint64_t size = WEFT__MEM_MAX_BYTES - 64 * G; size <= WEFT__MEM_MAX_BYTES + (2u << 20); size += G) {
    unsigned c = weft__tlsf_class(size);
    assert_true(c < WEFT__TLSF_CLASSES);
    assert_true(c >= prev);
    prev = c;
  }
}

/* A chunk of 2^48 bytes: added, found, handed out whole, freed, removed, with every invariant. */
static void test_largest_chunk_round_trips(void **state) {
  (void)state;
  weft__tlsf_t t;
  assert_int_equal(weft__tlsf_init(&t, 2), WEFT_OK);
  int chunk;
  weft__tlsf_range_t *r = weft__tlsf_add_chunk(&t, 1ull << 40, WEFT__MEM_MAX_BYTES, &chunk, 1, 0);
  assert_non_null(r);
  assert_true(weft__tlsf_is_valid(&t));
  assert_ptr_equal(weft__tlsf_find(&t, 1, WEFT__MEM_MAX_BYTES), r);
  assert_ptr_equal(weft__tlsf_find(&t, 1, WEFT__MEM_MAX_BYTES - G), r);
  weft__tlsf_range_t *a = weft__tlsf_alloc(&t, r, WEFT__MEM_MAX_BYTES);
  assert_non_null(a);
  assert_true(weft__tlsf_is_valid(&t));
  r = weft__tlsf_free(&t, a, 1, 1);
  assert_true(weft__tlsf_is_whole_chunk(r));
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_remove_chunk(&t, r);
  assert_true(weft__tlsf_is_valid(&t));
  weft__tlsf_destroy(&t);
}

/* The pool over a fake upstream, asked for the largest request any resource accepts: it either
 * gets it (the fake upstream hands out addresses, not memory) or says OUT_OF_MEMORY, and gives
 * everything back. */
static void test_pool_takes_the_largest_request(void **state) {
  (void)state;
  weft_runtime_t *rt = fake_init(2);
  fake_upstream_t *up = fake_upstream_create(rt);
  weft_resource_t *pool = NULL;
  assert_int_equal(weft_pool_create(rt, &up->base, NULL, &pool), WEFT_OK);
  for (int round = 0; round < 2; round++) {
    CUdeviceptr p = 0;
    weft_status_t st = weft_resource_allocate(pool, (size_t)WEFT__MEM_MAX_BYTES, fake_stream(0), "big", &p);
    assert_true(st == WEFT_OK || st == WEFT_ERR_OUT_OF_MEMORY);
    if (st == WEFT_OK) {
      assert_true(p % G == 0);
      assert_int_equal(weft_resource_deallocate(pool, p, (size_t)WEFT__MEM_MAX_BYTES, fake_stream(0), "big"), WEFT_OK);
    }
    /* Beyond the limit: refused before anything happens. */
    assert_int_equal(weft_resource_allocate(pool, (size_t)WEFT__MEM_MAX_BYTES + 1, fake_stream(0), "big", &p),
                     WEFT_ERR_INVALID_ARGUMENT);
    up->capacity = 1ull << 30; /* the second round: upstream refuses */
  }
  weft_resource_destroy(pool);
  assert_int_equal(up->live_bytes, 0);
  fake_upstream_destroy(up);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_classes_are_monotonic_and_small_ones_exact),
      cmocka_unit_test(test_split_then_free_coalesces_back_to_one_range),
      cmocka_unit_test(test_neighbours_of_different_lanes_stay_apart_until_moved),
      cmocka_unit_test(test_age_list_keeps_free_order_and_split_keeps_place),
      cmocka_unit_test(test_find_prefers_a_good_fit),
      cmocka_unit_test(test_random_workload_keeps_every_invariant),
      cmocka_unit_test(test_bad_lane_counts_are_rejected),
      cmocka_unit_test(test_largest_sizes_have_classes),
      cmocka_unit_test(test_largest_chunk_round_trips),
      cmocka_unit_test(test_pool_takes_the_largest_request),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
