/* lib/core's shared containers against simple models: the hash table against a brute-force
 * array through a random mix of inserts, finds and removals (colliding keys included), the
 * growable array, the small buffer, and the overflow-checked multiply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/container.h"
#include "lib/core/meta.h"

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

enum { KEYS = 512 };

static void test_map_matches_a_brute_force_model(void **state) {
  (void)state;
  weft__meta_stats_t before, after;
  weft__meta_stats(&before);
  for (uint64_t seed = 1; seed <= 8; seed++) {
    weft__map_t m = {0};
    uint64_t model_key[KEYS] = {0}, model_val[KEYS] = {0};
    uint64_t s = seed * 0x2545F4914F6CDD1Dull;
    for (int op = 0; op < 20000; op++) {
      unsigned k = (unsigned)(rng(&s) % KEYS);
      /* Keys that share low bits (device addresses 256 apart) and pointer-like keys. */
      uint64_t key = seed & 1 ? 0x7f0000000000ull + (uint64_t)k * 256 : (uint64_t)(k + 1) << 32;
      switch (rng(&s) % 3) {
        case 0: {
          bool added;
          uint64_t *v = weft__map_insert(&m, key, &added);
          assert_non_null(v);
          assert_int_equal(added, model_key[k] == 0);
          *v = op + 1u;
          model_key[k] = key;
          model_val[k] = op + 1u;
          break;
        }
        case 1: {
          uint64_t *v = weft__map_find(&m, key);
          if (model_key[k] == 0) assert_null(v);
          else assert_int_equal(*v, model_val[k]);
          break;
        }
        default:
          assert_int_equal(weft__map_remove(&m, key), model_key[k] != 0);
          model_key[k] = 0;
      }
      if (op % 997 == 0) assert_true(weft__map_is_valid(&m));
    }
    size_t n = 0;
    for (int k = 0; k < KEYS; k++) n += model_key[k] != 0;
    assert_int_equal(m.count, n);
    for (size_t i = 0; i < m.cap; i++)
      if (m.keys[i] != 0) assert_non_null(weft__map_find(&m, m.keys[i]));
    assert_true(weft__map_is_valid(&m));
    weft__map_free(&m);
  }
  weft__meta_stats(&after);
  assert_int_equal(after.live, before.live);
}

/* The longest run of occupied slots: every lookup, insert and removal in it scans up to its end. */
static size_t longest_run(const weft__map_t *m) {
  size_t best = 0, run = 0;
  for (size_t i = 0; i < 2 * m->cap; i++) { /* twice round: a run may wrap */
    run = m->keys[i & (m->cap - 1)] != 0 ? run + 1 : 0;
    if (run > best) best = run;
  }
  return best < m->cap ? best : m->cap;
}

/* Keys in arithmetic progressions (device addresses of one size class, pointers of one slab
 * size) spread over the table: a hash that keeps only middle bits of the product put such keys
 * in consecutive homes, one run of every key (a pool's free then scanned every live range). */
static void test_map_spreads_keys_with_a_common_stride(void **state) {
  (void)state;
  static const uint64_t strides[] = {8, 16, 256, 4096, 1u << 21, 1ull << 30, 3 * 256, 1u << 20};
  static const uint64_t counts[] = {9, 33, 60, 200, 600, 2000};
  for (size_t j = 0; j < sizeof strides / sizeof strides[0]; j++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      weft__map_t m = {0};
      for (uint64_t k = 0; k < counts[c]; k++)
        assert_non_null(weft__map_insert(&m, 0x7f0ed9400001ull + k * strides[j], NULL));
      /* Load at most 1/2: uniform hashing gives runs of a few slots (about 15 for 2000 keys). */
      size_t run = longest_run(&m);
      if (run > 12 + counts[c] / 16)
        fail_msg("stride %llu, %llu keys: a run of %zu occupied slots of %zu", (unsigned long long)strides[j],
                 (unsigned long long)counts[c], run, m.cap);
      assert_true(weft__map_is_valid(&m));
      weft__map_free(&m);
    }
}

static void test_map_rejects_the_empty_key(void **state) {
  (void)state;
  weft__map_t m = {0};
  assert_null(weft__map_insert(&m, 0, NULL));
  assert_null(weft__map_find(&m, 0));
  assert_false(weft__map_remove(&m, 0));
  weft__map_free(&m);
}

static void test_vec_grows_and_keeps_elements(void **state) {
  (void)state;
  weft__vec_t v = WEFT__VEC_INIT(uint32_t);
  for (uint32_t i = 0; i < 10000; i++) {
    uint32_t *e = weft__vec_push(&v);
    assert_non_null(e);
    assert_int_equal(*e, 0);
    *e = i * 3;
  }
  assert_int_equal(v.len, 10000);
  for (uint32_t i = 0; i < 10000; i++) assert_int_equal(WEFT__VEC_AT(&v, uint32_t, i), i * 3);
  assert_false(weft__vec_reserve(&v, SIZE_MAX));
  assert_int_equal(v.len, 10000);
  weft__vec_free(&v);
  assert_int_equal(v.len, 0);
  assert_null(v.data);
}

static void test_small_buffer_and_checked_multiply(void **state) {
  (void)state;
  int small[4];
  assert_ptr_equal(weft__small_alloc(small, 4, 4, sizeof(int)), small);
  int *big = weft__small_alloc(small, 4, 5, sizeof(int));
  assert_non_null(big);
  assert_ptr_not_equal(big, small);
  weft__small_free(small, big);
  weft__small_free(small, small);
  assert_null(weft__small_alloc(small, 4, SIZE_MAX / 2, 16));
  size_t out = 7;
  assert_false(weft__mul_size(SIZE_MAX / 2 + 1, 2, &out));
  assert_int_equal(out, 7);
  assert_true(weft__mul_size(1u << 20, 1u << 20, &out));
  assert_int_equal(out, (size_t)1 << 40);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map_matches_a_brute_force_model),
      cmocka_unit_test(test_map_spreads_keys_with_a_common_stride),
      cmocka_unit_test(test_map_rejects_the_empty_key),
      cmocka_unit_test(test_vec_grows_and_keeps_elements),
      cmocka_unit_test(test_small_buffer_and_checked_multiply),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
