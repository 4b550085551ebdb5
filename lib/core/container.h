/* The small containers every layer shares, so that no file writes its own: a growable array, a
 * hash table keyed by a non-zero 64-bit integer (a pointer or a device address), a small-buffer
 * helper for arrays that usually fit on the stack, and the overflow-checked multiply behind them.
 * All memory comes from the metadata arena (meta.h). None of them locks: the owner does.
 */
#ifndef WEFT_CORE_CONTAINER_H
#define WEFT_CORE_CONTAINER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** *out = n * size; false (and *out untouched) when the product overflows size_t. */
static inline bool weft__mul_size(size_t n, size_t size, size_t *out) {
  size_t r;
  if (__builtin_mul_overflow(n, size, &r)) return false;
  *out = r;
  return true;
}

/* ---- growable array --------------------------------------------------------------------------- */

/** A growable array of `elem`-byte elements. Zero-initialise it with WEFT__VEC_INIT(T); the data
 * may move on growth, so never keep a pointer to an element across a push. */
typedef struct weft__vec {
  void *data;  /* [cap] elements */
  size_t len;  /* elements in use */
  size_t cap;  /* elements allocated */
  size_t elem; /* bytes per element */
} weft__vec_t;

#define WEFT__VEC_INIT(T) ((weft__vec_t){NULL, 0, 0, sizeof(T)})
/** Element i as a T (no bounds check). */
#define WEFT__VEC_AT(v, T, i) (((T *)(v)->data)[i])

/** Makes room for `more` elements beyond len; false when out of host memory (nothing changed). */
bool weft__vec_reserve(weft__vec_t *v, size_t more);
/** Appends one zeroed element and returns it; NULL when out of host memory (nothing changed). */
void *weft__vec_push(weft__vec_t *v);
/** Frees the storage; the vector is empty (and reusable) afterwards. */
void weft__vec_free(weft__vec_t *v);

/* ---- hash table ------------------------------------------------------------------------------ */

/** A hash table from non-zero 64-bit keys to 64-bit values: open addressing, linear probing,
 * backward-shift deletion (no tombstones), load at most 1/2. Zero-initialise it. Values are
 * whatever the owner stores (an index + 1, a pointer, a size). */
typedef struct weft__map {
  uint64_t *keys; /* [cap]; 0 marks an empty slot */
  uint64_t *vals; /* [cap] */
  size_t cap;     /* a power of two, or 0 before the first insertion */
  size_t count;   /* keys present */
} weft__map_t;

/** The value slot of `key`, or NULL when absent. */
uint64_t *weft__map_find(const weft__map_t *m, uint64_t key);
/** Makes room for `more` new keys without further allocation; false when out of host memory. */
bool weft__map_reserve(weft__map_t *m, size_t more);
/** The value slot of `key`, inserting it with value 0 when absent (*added says which); NULL when
 * out of host memory (nothing changed). */
uint64_t *weft__map_insert(weft__map_t *m, uint64_t key, bool *added);
/** Removes `key`; false when it was absent. Never allocates. */
bool weft__map_remove(weft__map_t *m, uint64_t key);
/** Frees the storage; the map is empty (and reusable) afterwards. */
void weft__map_free(weft__map_t *m);
/** Iteration: for (size_t i = 0; i < m->cap; i++) if (m->keys[i] != 0) ... (no changes meanwhile). */

/** Checks the table: count matches, every key is reachable from its home slot. Never allocates. */
bool weft__map_is_valid(const weft__map_t *m);

/* ---- small buffers ------------------------------------------------------------------------------ */

/** An array of n elements of `size` bytes: `small` (room for small_n) when it fits, else metadata
 * memory (NULL when out of host memory or when n * size overflows). Release with weft__small_free. */
static inline void *weft__small_alloc(void *small, size_t small_n, size_t n, size_t size);
/** Releases what weft__small_alloc returned (nothing when it was the small buffer). */
static inline void weft__small_free(void *small, void *p);
/** weft__small_alloc's metadata memory, and its release (out of line: the rare case). */
void *weft__small_alloc_heap(size_t n, size_t size);
void weft__small_free_heap(void *p);

static inline void *weft__small_alloc(void *small, size_t small_n, size_t n, size_t size) {
  return n <= small_n ? small : weft__small_alloc_heap(n, size);
}

static inline void weft__small_free(void *small, void *p) {
  if (p != small) weft__small_free_heap(p);
}

#endif /* WEFT_CORE_CONTAINER_H */
