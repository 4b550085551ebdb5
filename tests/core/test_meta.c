/* The host metadata arena: many threads allocating and freeing, accounting, and that records
 * really live in weft's private jemalloc arena. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/meta.h"

#define THREADS 8
#define ROUNDS 20000

static void *churn(void *arg) {
  uintptr_t seed = (uintptr_t)arg * 2654435761u + 1;
  void *slots[64] = {0};
  size_t sizes[64] = {0};
  for (int i = 0; i < ROUNDS; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    unsigned k = (unsigned)(seed >> 33) % 64;
    if (slots[k] != NULL) {
      /* The fill pattern must have survived: no other thread got the same memory. */
      unsigned char *p = slots[k];
      for (size_t j = 0; j < sizes[k]; j++)
        if (p[j] != (unsigned char)(k ^ (uintptr_t)arg)) return (void *)1;
      weft__meta_free(slots[k]);
      slots[k] = NULL;
    } else {
      sizes[k] = 1 + (size_t)(seed >> 40) % 4096;
      slots[k] = weft__meta_alloc(sizes[k]);
      if (slots[k] == NULL || ((uintptr_t)slots[k] & 15) != 0) return (void *)1;
      memset(slots[k], (int)(k ^ (uintptr_t)arg), sizes[k]);
    }
  }
  for (int k = 0; k < 64; k++) weft__meta_free(slots[k]);
  return NULL;
}

static void test_many_threads_allocate_and_free(void **state) {
  (void)state;
  weft__meta_stats_t before, after;
  weft__meta_stats(&before);
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(i + 1)), 0);
  for (int i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(t[i], &r);
    assert_null(r);
  }
  weft__meta_stats(&after);
  assert_true(after.allocs > before.allocs);
  assert_int_equal(after.live, before.live);
}

static void test_calloc_realloc_strdup(void **state) {
  (void)state;
  unsigned *z = weft__meta_calloc(1000, sizeof *z);
  assert_non_null(z);
  for (int i = 0; i < 1000; i++) assert_int_equal(z[i], 0);
  z[999] = 7;
  unsigned *g = weft__meta_realloc(z, 100000 * sizeof *z);
  assert_non_null(g);
  assert_int_equal(g[999], 7);
  weft__meta_free(g);
  char *s = weft__meta_strdup("weft");
  assert_string_equal(s, "weft");
  weft__meta_free(s);
  assert_null(weft__meta_alloc(0));
  assert_null(weft__meta_calloc(SIZE_MAX / 2, 4));
  weft__meta_free(NULL);
}

static void test_backend_is_a_private_arena(void **state) {
  (void)state;
  weft__meta_stats_t s;
  weft__meta_stats(&s);
#ifdef WEFT_META_LIBC
  assert_string_equal(s.backend, "libc");
#else
  assert_string_equal(s.backend, "jemalloc");
  /* arenas.create gives an index past the automatic arenas (at least 1). */
  assert_true(s.arena >= 1 && s.arena != UINT32_MAX);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_many_threads_allocate_and_free),
      cmocka_unit_test(test_calloc_realloc_strdup),
      cmocka_unit_test(test_backend_is_a_private_arena),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
