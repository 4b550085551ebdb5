/* The shared containers (container.h). */
#include <string.h>

#include "lib/core/container.h"
#include "lib/core/meta.h"

bool weft__vec_reserve(weft__vec_t *v, size_t more) {
  if (more <= v->cap - v->len) return true;
  size_t need, cap = v->cap ? v->cap : 8, bytes;
  if (__builtin_add_overflow(v->len, more, &need)) return false;
  while (cap < need)
    if (__builtin_mul_overflow(cap, 2, &cap)) return false;
  if (!weft__mul_size(cap, v->elem, &bytes)) return false;
  void *d = weft__meta_realloc(v->data, bytes);
  if (d == NULL) return false;
  v->data = d;
  v->cap = cap;
  return true;
}

void *weft__vec_push(weft__vec_t *v) {
  if (!weft__vec_reserve(v, 1)) return NULL;
  void *e = (char *)v->data + v->len * v->elem;
  memset(e, 0, v->elem);
  v->len++;
  return e;
}

void weft__vec_free(weft__vec_t *v) {
  weft__meta_free(v->data);
  v->data = NULL;
  v->len = v->cap = 0;
}

/* Fibonacci hashing: the top log2(cap) bits of key * 2^64/phi. Only the top bits mix every bit
 * of the key; keeping middle bits (a shift, then a mask) sent keys in arithmetic progression,
 * as device addresses of one size are, to consecutive homes: one run of every key
 * (tests/core:test_containers, test_map_spreads_keys_with_a_common_stride). */
static inline size_t home(const weft__map_t *m, uint64_t key) {
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - __builtin_ctzll(m->cap))); /* cap >= 16 here */
}

uint64_t *weft__map_find(const weft__map_t *m, uint64_t key) {
  if (m->cap == 0 || key == 0) return NULL;
  for (size_t i = home(m, key);; i = (i + 1) & (m->cap - 1)) {
    if (m->keys[i] == key) return &m->vals[i];
    if (m->keys[i] == 0) return NULL;
  }
}

static void put(weft__map_t *m, uint64_t key, uint64_t val) {
  size_t i = home(m, key);
  while (m->keys[i] != 0) i = (i + 1) & (m->cap - 1);
  m->keys[i] = key;
  m->vals[i] = val;
  m->count++;
}

bool weft__map_reserve(weft__map_t *m, size_t more) {
  size_t need;
  if (__builtin_add_overflow(m->count, more, &need) || need > SIZE_MAX / 2) return false;
  if (need * 2 <= m->cap) return true;
  size_t cap = m->cap ? m->cap : 16;
  while (cap < need * 2) cap *= 2;
  uint64_t *keys = weft__meta_calloc(cap, sizeof *keys);
  uint64_t *vals = weft__meta_calloc(cap, sizeof *vals);
  if (keys == NULL || vals == NULL) {
    weft__meta_free(keys);
    weft__meta_free(vals);
    return false;
  }
  weft__map_t old = *m;
  m->keys = keys;
  m->vals = vals;
  m->cap = cap;
  m->count = 0;
  for (size_t i = 0; i < old.cap; i++)
    if (old.keys[i] != 0) put(m, old.keys[i], old.vals[i]);
  weft__meta_free(old.keys);
  weft__meta_free(old.vals);
  return true;
}

uint64_t *weft__map_insert(weft__map_t *m, uint64_t key, bool *added) {
  uint64_t *v = weft__map_find(m, key);
  if (added != NULL) *added = v == NULL;
  if (v != NULL || key == 0) return v;
  if (!weft__map_reserve(m, 1)) return NULL;
  put(m, key, 0);
  return weft__map_find(m, key);
}

bool weft__map_remove(weft__map_t *m, uint64_t key) {
  uint64_t *v = weft__map_find(m, key);
  if (v == NULL) return false;
  size_t mask = m->cap - 1, i = (size_t)(v - m->vals), j = i;
  /* Backward shift: move later members of the probe run into the hole when their home slot does
   * not lie cyclically in (i, j]. */
  for (;;) {
    j = (j + 1) & mask;
    if (m->keys[j] == 0) break;
    size_t h = home(m, m->keys[j]);
    bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
    if (!stays) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->keys[i] = 0;
  m->vals[i] = 0;
  m->count--;
  return true;
}

void weft__map_free(weft__map_t *m) {
  weft__meta_free(m->keys);
  weft__meta_free(m->vals);
  memset(m, 0, sizeof *m);
}

bool weft__map_is_valid(const weft__map_t *m) {
  size_t n = 0;
  for (size_t i = 0; i < m->cap; i++) {
    if (m->keys[i] == 0) continue;
    n++;
    /* Every slot from the key's home up to it must be occupied, or a lookup would stop early. */
    for (size_t j = home(m, m->keys[i]); j != i; j = (j + 1) & (m->cap - 1))
      if (m->keys[j] == 0) return false;
  }
  return n == m->count && (m->cap == 0 || m->count * 2 <= m->cap);
}

void *weft__small_alloc_heap(size_t n, size_t size) {
  size_t bytes;
  if (!weft__mul_size(n, size, &bytes)) return NULL;
  return weft__meta_alloc(bytes);
}

void weft__small_free_heap(void *p) { weft__meta_free(p); }
