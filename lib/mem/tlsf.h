/* The pool's sub-allocator core: two-level segregated fit over abstract address ranges.
 *
 * Pure bookkeeping (no driver, no locks): the caller adds chunks [addr, addr + size) and carves
 * allocations out of them. Every size is a multiple of WEFT__TLSF_GRANULE (256 bytes, the pool's
 * alignment). Free ranges sit in size classes:
 *   - small (< 32 granules, under 8 KiB): one exact class per multiple of 256, so a hit wastes
 *     nothing;
 *   - large: TLSF classes, 32 second-level classes per power of two (class width <= 1/32 of its
 *     lower bound), found through two levels of bitmaps in O(1).
 * A search tries the head of the request's own class (good fit), then the first non-empty class
 * whose every member is large enough. The found range is split: the front is handed out, the
 * rest stays free. Freed ranges merge with free physical neighbours in O(1).
 *
 * Lanes. Each free range belongs to a lane and carries a 64-bit stamp. The pool uses one lane per
 * stream (the stamp is the tick of the stream's free point) and one "idle" lane for ranges whose
 * frees are known complete. Neighbours merge only when they are in the same lane; the merged range
 * keeps the larger stamp (in one stream, a later point covers an earlier one). Each lane also
 * keeps its ranges in insertion order (oldest first), so ranges can be retired to another lane in
 * stamp order, amortised O(1) each.
 *
 * Allocated ranges are found by address through lib/core's hash table. Range records come
 * from slabs of metadata memory and are recycled.
 * Only weft__tlsf_add_chunk and weft__tlsf_alloc may need memory; they change nothing when it is
 * missing.
 */
#ifndef WEFT_MEM_TLSF_H
#define WEFT_MEM_TLSF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/core/container.h"
#include "weft/weft.h"

#define WEFT__TLSF_GRANULE 256u
#define WEFT__TLSF_GRANULE_LOG2 8
#define WEFT__TLSF_SL_LOG2 5                          /* 32 second-level classes */
#define WEFT__TLSF_SL (1u << WEFT__TLSF_SL_LOG2)
/* Classes cover sizes below 2^41 granules: WEFT__TLSF_MAX_BYTES (2^49, exclusive). Requests go
 * up to WEFT__MEM_MAX_BYTES (2^48) inclusive, and adaptors add a little on top (a guard's
 * canaries), so the table reaches twice that; pool.c asserts the two agree and refuses more. */
#define WEFT__TLSF_FL_MAX 41
#define WEFT__TLSF_MAX_BYTES (1ull << (WEFT__TLSF_FL_MAX + WEFT__TLSF_GRANULE_LOG2))
#define WEFT__TLSF_CLASSES (WEFT__TLSF_SL + (WEFT__TLSF_FL_MAX - WEFT__TLSF_SL_LOG2) * WEFT__TLSF_SL)
#define WEFT__TLSF_WORDS ((WEFT__TLSF_CLASSES + 63) / 64)
#define WEFT__TLSF_MAX_LANES 65                       /* 64 streams + idle */

/** x rounded up to the granule: the size a range of x bytes takes. */
static inline uint64_t weft__tlsf_round_up(uint64_t x) {
  return (x + WEFT__TLSF_GRANULE - 1) & ~(uint64_t)(WEFT__TLSF_GRANULE - 1);
}

/** One range of a chunk: free (in a lane's class list and age list) or allocated (in the address table). */
typedef struct weft__tlsf_range {
  uint64_t addr;                          /* first byte; multiple of the granule */
  uint64_t size;                          /* bytes; multiple of the granule, > 0 */
  struct weft__tlsf_range *prev_phys;     /* the range just below in the same chunk, or NULL */
  struct weft__tlsf_range *next_phys;     /* the range just above in the same chunk, or NULL */
  struct weft__tlsf_range *prev_free;     /* class list (free ranges) */
  struct weft__tlsf_range *next_free;     /* class list; also the record free list */
  struct weft__tlsf_range *prev_age;      /* lane age list, oldest first (free ranges) */
  struct weft__tlsf_range *next_age;
  uint64_t stamp;                         /* free ranges: the lane's stamp (pool: free tick) */
  void *chunk;                            /* the caller's chunk pointer, shared by its ranges */
  uint32_t lane;                          /* free ranges: lane index */
  uint32_t is_free;                       /* 1 free, 0 allocated */
  uint32_t held;                          /* allocated ranges: the caller's mark, never read here (the
                                           * pool: 1 while a stream's cache holds the range) */
} weft__tlsf_range_t;

/** One lane: class lists, their bitmaps and the age list. */
typedef struct weft__tlsf_lane {
  uint64_t words;                         /* bit w: bitmap word w is non-zero */
  uint64_t bitmap[WEFT__TLSF_WORDS];      /* bit c: class c is non-empty */
  weft__tlsf_range_t *heads[WEFT__TLSF_CLASSES];
  weft__tlsf_range_t *oldest, *newest;    /* age list */
  uint64_t free_bytes;                    /* sum of the lane's free range sizes */
  uint64_t free_ranges;
} weft__tlsf_lane_t;

typedef struct weft__tlsf {
  unsigned lanes;
  weft__tlsf_lane_t *lane;                /* [lanes] */
  weft__map_t allocated;                  /* address -> weft__tlsf_range_t * of allocated ranges */
  weft__tlsf_range_t *spare;              /* recycled records (linked by next_free) */
  size_t spare_count;
  void **slabs;                           /* record slabs, for destroy */
  size_t slab_count, slab_cap;
  uint64_t free_bytes;                    /* over all lanes */
  uint64_t chunk_bytes;                   /* sum of added chunks */
  uint64_t chunks;
} weft__tlsf_t;

/** Sets up `lanes` (1..65) lanes. Errors: INVALID_ARGUMENT, HOST_OUT_OF_MEMORY. */
weft_status_t weft__tlsf_init(weft__tlsf_t *t, unsigned lanes);
/** Frees all metadata (chunks are the caller's; nothing is returned anywhere). */
void weft__tlsf_destroy(weft__tlsf_t *t);

/** Adds the chunk [addr, addr + size) (granule-aligned, 0 < size < WEFT__TLSF_MAX_BYTES) as one free range of `lane`
 * with `stamp`. Returns the range, or NULL when host memory is short (nothing changed). */
weft__tlsf_range_t *weft__tlsf_add_chunk(weft__tlsf_t *t, uint64_t addr, uint64_t size, void *chunk, unsigned lane,
                                         uint64_t stamp);
/** Forgets a chunk that is wholly one free range (weft__tlsf_is_whole_chunk). */
void weft__tlsf_remove_chunk(weft__tlsf_t *t, weft__tlsf_range_t *r);
/** True when free range r spans its whole chunk. */
static inline bool weft__tlsf_is_whole_chunk(const weft__tlsf_range_t *r) {
  return r->is_free && r->prev_phys == NULL && r->next_phys == NULL;
}

/** A free range of `lane` of at least `size` bytes (granule multiple, < WEFT__TLSF_MAX_BYTES), or
 * NULL. O(1). */
weft__tlsf_range_t *weft__tlsf_find(const weft__tlsf_t *t, unsigned lane, uint64_t size);
/** Hands out the first `size` bytes of free range r (splitting off the rest, which stays free in
 * r's lane with r's stamp) and registers them by address. Returns the allocated range, or NULL
 * when host memory is short (nothing changed). */
weft__tlsf_range_t *weft__tlsf_alloc(weft__tlsf_t *t, weft__tlsf_range_t *r, uint64_t size);
/** The allocated range starting at addr, or NULL. */
weft__tlsf_range_t *weft__tlsf_lookup(const weft__tlsf_t *t, uint64_t addr);
/** Frees allocated range r into `lane` with `stamp`, merging with free neighbours of the same
 * lane. Returns the resulting free range. Never allocates. */
weft__tlsf_range_t *weft__tlsf_free(weft__tlsf_t *t, weft__tlsf_range_t *r, unsigned lane, uint64_t stamp);
/** Moves free range r to `lane` with `stamp`, merging there. Returns the resulting range. */
weft__tlsf_range_t *weft__tlsf_move(weft__tlsf_t *t, weft__tlsf_range_t *r, unsigned lane, uint64_t stamp);
/** The oldest / newest free range of a lane (age order), or NULL. Walk with ->next_age. */
static inline weft__tlsf_range_t *weft__tlsf_oldest(const weft__tlsf_t *t, unsigned lane) { return t->lane[lane].oldest; }
static inline weft__tlsf_range_t *weft__tlsf_newest(const weft__tlsf_t *t, unsigned lane) { return t->lane[lane].newest; }

/** Hands every free range of lanes 0..lanes-1 to `free_range`, lane by lane, oldest first (the
 * segments op of a resource built on the core: weft_memory_snapshot). */
void weft__tlsf_free_ranges(const weft__tlsf_t *t, unsigned lanes, void (*free_range)(void *ctx, const weft_free_range_t *r),
                            void *ctx);

/** The size class of `size` bytes, < WEFT__TLSF_MAX_BYTES (exposed for tests). */
unsigned weft__tlsf_class(uint64_t size);

/** Walks every structure: lists match bitmaps, neighbours link both ways and tile their chunk,
 * no two same-lane free neighbours are unmerged, counters add up, the address table holds
 * exactly the allocated ranges. Never allocates. */
bool weft__tlsf_is_valid(const weft__tlsf_t *t);

#endif /* WEFT_MEM_TLSF_H */
