/* Two-level segregated fit over abstract address ranges (see tlsf.h for the model). */
#include "lib/mem/tlsf.h"

#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"

#define SLAB_RECORDS 256

static inline unsigned clz64(uint64_t x) { return (unsigned)__builtin_clzll(x); }
static inline unsigned ctz64(uint64_t x) { return (unsigned)__builtin_ctzll(x); }

unsigned weft__tlsf_class(uint64_t size) {
  WEFT_ASSERT(size < WEFT__TLSF_MAX_BYTES);
  uint64_t u = size >> WEFT__TLSF_GRANULE_LOG2;
  if (u < WEFT__TLSF_SL) return (unsigned)u;
  unsigned fl = 63u - clz64(u);
  unsigned sl = (unsigned)(u >> (fl - WEFT__TLSF_SL_LOG2)) - WEFT__TLSF_SL;
  return WEFT__TLSF_SL + (fl - WEFT__TLSF_SL_LOG2) * WEFT__TLSF_SL + sl;
}

/* ---- record slabs ---------------------------------------------------------------------- */

static bool ensure_spare(weft__tlsf_t *t, size_t need) {
  if (t->spare_count >= need) return true;
  if (t->slab_count == t->slab_cap) {
    size_t cap = t->slab_cap ? t->slab_cap * 2 : 16;
    void **s = weft__meta_realloc(t->slabs, cap * sizeof *s);
    if (s == NULL) return false;
    t->slabs = s;
    t->slab_cap = cap;
  }
  weft__tlsf_range_t *slab = weft__meta_alloc(SLAB_RECORDS * sizeof *slab);
  if (slab == NULL) return false;
  t->slabs[t->slab_count++] = slab;
  for (size_t i = 0; i < SLAB_RECORDS; i++) {
    slab[i].next_free = t->spare;
    t->spare = &slab[i];
  }
  t->spare_count += SLAB_RECORDS;
  return true;
}

static weft__tlsf_range_t *take_record(weft__tlsf_t *t) {
  weft__tlsf_range_t *r = t->spare;
  WEFT_ASSERT(r != NULL);
  t->spare = r->next_free;
  t->spare_count--;
  memset(r, 0, sizeof *r);
  return r;
}

static void put_record(weft__tlsf_t *t, weft__tlsf_range_t *r) {
  r->next_free = t->spare;
  t->spare = r;
  t->spare_count++;
}

/* ---- allocated ranges by address ------------------------------------------------------------- */

/* The table's key of an address: never 0 (the empty key), also for ranges that start at 0. */
static inline uint64_t key(uint64_t addr) { return addr + 1; }

weft__tlsf_range_t *weft__tlsf_lookup(const weft__tlsf_t *t, uint64_t addr) {
  const uint64_t *v = weft__map_find(&t->allocated, key(addr));
  return v != NULL ? (weft__tlsf_range_t *)(uintptr_t)*v : NULL;
}

/* ---- free lists ------------------------------------------------------------------------ */

/* Inserts free range r into its lane's class list, and into the age list after `after` (NULL:
 * at the front) or, when at_tail, at the tail. */
static void list_insert_at(weft__tlsf_t *t, weft__tlsf_range_t *r, bool at_tail, weft__tlsf_range_t *after) {
  weft__tlsf_lane_t *L = &t->lane[r->lane];
  unsigned c = weft__tlsf_class(r->size);
  r->prev_free = NULL;
  r->next_free = L->heads[c];
  if (r->next_free) r->next_free->prev_free = r;
  L->heads[c] = r;
  L->bitmap[c / 64] |= 1ull << (c % 64);
  L->words |= 1ull << (c / 64);
  if (at_tail) after = L->newest;
  r->prev_age = after;
  r->next_age = after ? after->next_age : L->oldest;
  if (after) after->next_age = r; else L->oldest = r;
  if (r->next_age) r->next_age->prev_age = r; else L->newest = r;
  L->free_bytes += r->size;
  L->free_ranges++;
  t->free_bytes += r->size;
}

static void list_insert(weft__tlsf_t *t, weft__tlsf_range_t *r) { list_insert_at(t, r, true, NULL); }

static void list_remove(weft__tlsf_t *t, weft__tlsf_range_t *r) {
  weft__tlsf_lane_t *L = &t->lane[r->lane];
  unsigned c = weft__tlsf_class(r->size);
  if (r->prev_free) r->prev_free->next_free = r->next_free; else L->heads[c] = r->next_free;
  if (r->next_free) r->next_free->prev_free = r->prev_free;
  if (L->heads[c] == NULL) {
    L->bitmap[c / 64] &= ~(1ull << (c % 64));
    if (L->bitmap[c / 64] == 0) L->words &= ~(1ull << (c / 64));
  }
  if (r->prev_age) r->prev_age->next_age = r->next_age; else L->oldest = r->next_age;
  if (r->next_age) r->next_age->prev_age = r->prev_age; else L->newest = r->prev_age;
  r->prev_free = r->next_free = r->prev_age = r->next_age = NULL;
  L->free_bytes -= r->size;
  L->free_ranges--;
  t->free_bytes -= r->size;
}

/* Puts r (not in any list) into `lane`, merging with free same-lane neighbours. */
static weft__tlsf_range_t *insert_merged(weft__tlsf_t *t, weft__tlsf_range_t *r, unsigned lane, uint64_t stamp) {
  r->is_free = 1;
  r->lane = lane;
  r->stamp = stamp;
  weft__tlsf_range_t *p = r->prev_phys;
  if (p != NULL && p->is_free && p->lane == lane) {
    list_remove(t, p);
    p->size += r->size;
    p->next_phys = r->next_phys;
    if (p->next_phys) p->next_phys->prev_phys = p;
    if (r->stamp > p->stamp) p->stamp = r->stamp;
    put_record(t, r);
    r = p;
  }
  weft__tlsf_range_t *n = r->next_phys;
  if (n != NULL && n->is_free && n->lane == lane) {
    list_remove(t, n);
    r->size += n->size;
    r->next_phys = n->next_phys;
    if (r->next_phys) r->next_phys->prev_phys = r;
    if (n->stamp > r->stamp) r->stamp = n->stamp;
    put_record(t, n);
  }
  list_insert(t, r);
  return r;
}

/* ---- public operations ----------------------------------------------------------------- */

weft_status_t weft__tlsf_init(weft__tlsf_t *t, unsigned lanes) {
  memset(t, 0, sizeof *t);
  if (lanes == 0 || lanes > WEFT__TLSF_MAX_LANES)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "tlsf: %u lanes (1..%u)", lanes, WEFT__TLSF_MAX_LANES);
  t->lane = weft__meta_calloc(lanes, sizeof *t->lane);
  if (t->lane == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "tlsf: no host memory for %u lanes", lanes);
  t->lanes = lanes;
  return WEFT_OK;
}

void weft__tlsf_destroy(weft__tlsf_t *t) {
  for (size_t i = 0; i < t->slab_count; i++) weft__meta_free(t->slabs[i]);
  weft__meta_free(t->slabs);
  weft__map_free(&t->allocated);
  weft__meta_free(t->lane);
  memset(t, 0, sizeof *t);
}

weft__tlsf_range_t *weft__tlsf_add_chunk(weft__tlsf_t *t, uint64_t addr, uint64_t size, void *chunk, unsigned lane,
                                         uint64_t stamp) {
  WEFT_ASSERT(lane < t->lanes && size > 0 && size < WEFT__TLSF_MAX_BYTES && size % WEFT__TLSF_GRANULE == 0 &&
              addr % WEFT__TLSF_GRANULE == 0);
  if (!ensure_spare(t, 1)) return NULL;
  weft__tlsf_range_t *r = take_record(t);
  r->addr = addr;
  r->size = size;
  r->chunk = chunk;
  t->chunks++;
  t->chunk_bytes += size;
  return insert_merged(t, r, lane, stamp);
}

void weft__tlsf_remove_chunk(weft__tlsf_t *t, weft__tlsf_range_t *r) {
  WEFT_ASSERT(weft__tlsf_is_whole_chunk(r));
  list_remove(t, r);
  t->chunks--;
  t->chunk_bytes -= r->size;
  put_record(t, r);
}

weft__tlsf_range_t *weft__tlsf_find(const weft__tlsf_t *t, unsigned lane, uint64_t size) {
  const weft__tlsf_lane_t *L = &t->lane[lane];
  if (L->free_bytes < size) return NULL;
  unsigned c = weft__tlsf_class(size);
  /* Good fit first: the head of the request's own class, when it is large enough. */
  weft__tlsf_range_t *h = L->heads[c];
  if (h != NULL && h->size >= size) return h;
  /* Then the first non-empty class above: every member is at least its lower bound > size. */
  unsigned start = c + 1;
  if (start >= WEFT__TLSF_CLASSES) return NULL;
  unsigned w = start / 64;
  uint64_t bits = L->bitmap[w] & (~0ull << (start % 64));
  if (bits == 0) {
    uint64_t words = (w + 1 < 64) ? (L->words & (~0ull << (w + 1))) : 0;
    if (words == 0) return NULL;
    w = ctz64(words);
    bits = L->bitmap[w];
  }
  return L->heads[w * 64 + ctz64(bits)];
}

weft__tlsf_range_t *weft__tlsf_alloc(weft__tlsf_t *t, weft__tlsf_range_t *r, uint64_t size) {
  WEFT_ASSERT(r->is_free && r->size >= size && size > 0 && size % WEFT__TLSF_GRANULE == 0);
  if (!ensure_spare(t, 1) || !weft__map_reserve(&t->allocated, 1)) return NULL;
  unsigned lane = r->lane;
  uint64_t stamp = r->stamp;
  weft__tlsf_range_t *prev_age = r->prev_age;
  list_remove(t, r);
  r->is_free = 0;
  if (r->size > size) {
    weft__tlsf_range_t *rest = take_record(t);
    rest->addr = r->addr + size;
    rest->size = r->size - size;
    rest->chunk = r->chunk;
    rest->prev_phys = r;
    rest->next_phys = r->next_phys;
    if (rest->next_phys) rest->next_phys->prev_phys = rest;
    r->next_phys = rest;
    r->size = size;
    rest->is_free = 1;
    rest->lane = lane;
    rest->stamp = stamp;
    /* The remainder keeps r's place in the age list (same stamp); its other neighbours are
     * allocated (r was merged), so no merge is due. */
    list_insert_at(t, rest, false, prev_age);
  }
  *weft__map_insert(&t->allocated, key(r->addr), NULL) = (uint64_t)(uintptr_t)r;
  return r;
}

weft__tlsf_range_t *weft__tlsf_free(weft__tlsf_t *t, weft__tlsf_range_t *r, unsigned lane, uint64_t stamp) {
  WEFT_ASSERT(!r->is_free && lane < t->lanes);
  weft__map_remove(&t->allocated, key(r->addr));
  return insert_merged(t, r, lane, stamp);
}

weft__tlsf_range_t *weft__tlsf_move(weft__tlsf_t *t, weft__tlsf_range_t *r, unsigned lane, uint64_t stamp) {
  WEFT_ASSERT(r->is_free && lane < t->lanes);
  list_remove(t, r);
  return insert_merged(t, r, lane, stamp);
}

/* ---- invariants ------------------------------------------------------------------------ */

#define CHECK(c, what) \
  do {                 \
    if (!(c)) return weft__debug_report("weft__tlsf_is_valid", what); \
  } while (0)

static bool check_chunk(const weft__tlsf_t *t, const weft__tlsf_range_t *first, uint64_t *bytes) {
  uint64_t end = first->addr;
  const weft__tlsf_range_t *prev = NULL;
  for (const weft__tlsf_range_t *r = first; r != NULL; r = r->next_phys) {
    CHECK(r->prev_phys == prev, "prev_phys does not mirror next_phys");
    CHECK(r->addr == end, "ranges of a chunk do not tile it");
    CHECK(r->size > 0 && r->size % WEFT__TLSF_GRANULE == 0, "range size not a granule multiple");
    CHECK(r->chunk == first->chunk, "ranges of one chunk name different chunks");
    if (r->is_free) {
      CHECK(r->lane < t->lanes, "free range lane out of range");
      CHECK(prev == NULL || !prev->is_free || prev->lane != r->lane, "unmerged same-lane neighbours");
    } else {
      CHECK(weft__tlsf_lookup(t, r->addr) == r, "allocated range missing from the address table");
    }
    end = r->addr + r->size;
    *bytes += r->size;
    prev = r;
  }
  return true;
}

bool weft__tlsf_is_valid(const weft__tlsf_t *t) {
  uint64_t free_total = 0, chunks = 0, chunk_bytes = 0, allocated = 0;
  for (unsigned l = 0; l < t->lanes; l++) {
    const weft__tlsf_lane_t *L = &t->lane[l];
    uint64_t bytes = 0, n = 0;
    for (unsigned c = 0; c < WEFT__TLSF_CLASSES; c++) {
      bool bit = (L->bitmap[c / 64] >> (c % 64)) & 1;
      CHECK(bit == (L->heads[c] != NULL), "class bitmap disagrees with its list");
      const weft__tlsf_range_t *prev = NULL;
      for (const weft__tlsf_range_t *r = L->heads[c]; r != NULL; r = r->next_free) {
        CHECK(r->is_free && r->lane == l, "class list holds a range of another lane or an allocated one");
        CHECK(weft__tlsf_class(r->size) == c, "range in the wrong class");
        CHECK(r->prev_free == prev, "class list links broken");
        bytes += r->size;
        n++;
        prev = r;
        if (r->prev_phys == NULL) {
          uint64_t b = 0;
          if (!check_chunk(t, r, &b)) return false;
          chunks++;
          chunk_bytes += b;
        }
      }
    }
    for (unsigned w = 0; w < WEFT__TLSF_WORDS; w++)
      CHECK(((L->words >> w) & 1) == (L->bitmap[w] != 0), "first-level bitmap disagrees");
    uint64_t aged = 0;
    const weft__tlsf_range_t *prev = NULL;
    for (const weft__tlsf_range_t *r = L->oldest; r != NULL; r = r->next_age) {
      CHECK(r->prev_age == prev && r->lane == l && r->is_free, "age list broken");
      aged++;
      prev = r;
    }
    CHECK(prev == L->newest, "age list tail wrong");
    CHECK(aged == n && L->free_ranges == n && L->free_bytes == bytes, "lane counters wrong");
    free_total += bytes;
  }
  CHECK(free_total == t->free_bytes, "free byte total wrong");
  CHECK(weft__map_is_valid(&t->allocated), "address table broken");
  for (size_t i = 0; i < t->allocated.cap; i++) {
    if (t->allocated.keys[i] == 0) continue;
    const weft__tlsf_range_t *r = (const weft__tlsf_range_t *)(uintptr_t)t->allocated.vals[i];
    CHECK(key(r->addr) == t->allocated.keys[i], "address table key is not the range's address");
    CHECK(!r->is_free, "address table holds a free range");
    allocated++;
    if (r->prev_phys == NULL) {
      uint64_t b = 0;
      if (!check_chunk(t, r, &b)) return false;
      chunks++;
      chunk_bytes += b;
    }
  }
  CHECK(allocated == t->allocated.count, "address table count wrong");
  CHECK(chunks == t->chunks && chunk_bytes == t->chunk_bytes, "chunks do not add up");
  return true;
}

void weft__tlsf_free_ranges(const weft__tlsf_t *t, unsigned lanes, void (*free_range)(void *ctx, const weft_free_range_t *r),
                            void *ctx) {
  for (unsigned l = 0; l < lanes; l++)
    for (const weft__tlsf_range_t *r = weft__tlsf_oldest(t, l); r != NULL; r = r->next_age) {
      weft_free_range_t f = {r->addr, r->size, l};
      free_range(ctx, &f);
    }
}
