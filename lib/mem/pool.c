/* weft's pool: a TLSF sub-allocator (tlsf.h) over chunks from an upstream resource, with
 * stream-ordered reuse.
 *
 * Every free range remembers where it was freed: lane t (the pool stream index) and stamp k (the
 * tick of weft__tracker_point(s) at the free), meaning "reusable by work ordered after tick k of
 * stream t". Lane `idle` (= stream count) holds ranges whose free is known complete (stamp 0):
 * usable by anyone at once. An allocation of n bytes on stream s takes, in order:
 *   1. a fit in lane s: stream order alone makes it safe (same-stream reuse at once);
 *   2. a fit in the idle lane;
 *   3. a fit in another lane t whose free point s is already ordered after (tracker knowledge:
 *      earlier waits, transitively) or that the host finds complete (an event query); a complete
 *      point retires every range of lane t up to it to the idle lane, where they merge;
 *   4. after retiring every lane as far as the host sees completion (one event query per lane;
 *      pieces freed on different streams then merge in the idle lane) a fit in the idle lane,
 *      else a new chunk from upstream, while under max_bytes (if upstream refuses, wholly idle chunks
 *      go back first and growth is tried once more);
 *   5. a fit in another lane t, after making s wait for that one free point (one
 *      cuStreamWaitEvent on the event of the freeing tick — never a wait for all of t);
 *   6. when the free bytes suffice but no single range does: s waits for the newest point of
 *      each lane holding free ranges, and those ranges are relabelled to lane s, where they
 *      merge; then a fit in lane s;
 *   7. when growth failed and giving back wholly free chunks would make room (chunks never merge
 *      with each other, so a request larger than any free chunk needs them returned): the host
 *      waits for the newest free point of every lane (in RELAXED capture mode, so no capture is
 *      disturbed),
 *      everything retires to the idle lane, idle chunks go back upstream and growth is tried
 *      once more. Only when this fails too: OUT_OF_MEMORY.
 * At the cap (max_bytes leaves no room for another chunk) steps 1-4 become: retire every lane as
 * far as the host sees completion, then take the smallest fit among lane s, the idle lane and the
 * lanes s is already ordered after. Placement then decides whether later requests fit: taking
 * the first fit of lane s carves up ranges that would merge with neighbours freed on other
 * streams. On tests/mem/test_pool_stress.c's small pool (12 MiB cap, 4 MiB chunks, requests up to
 * 512 KiB, about 6 MiB live) the lane-first order failed for 1 of 100 seeds on the simulator and
 * 8 of 100 with WEFT_SIM_LAZY=1 (a device far behind the host, as a GPU is); this order for 0 of
 * 400 and 2 of 400. Those failures are fragmentation by live blocks, which no waiting can undo.
 *
 * Merging across lanes: two free neighbours merge only when they are in the same lane, keeping
 * the newer stamp (within one stream a later point covers an earlier one). We do not merge ranges
 * of different streams, because the merged range would need a set of points (every user would
 * wait for all of them, serialising streams that never shared data). Ranges meet again once their
 * frees are known complete: retiring moves them to the idle lane, where all neighbours merge.
 *
 * Chunks are added to lane s with the point of s just after the upstream allocation (upstream
 * memory is usable by work on s after the call; other streams are ordered behind s as for a
 * free). A trim retires every lane as far as the host sees completion, then gives wholly idle
 * chunks back to upstream (on stream 0: their work is complete, any stream serves).
 *
 * Large blocks (see DEDICATED_*) get a chunk of their own, exactly their size. Mixing them into
 * shared chunks is what fragments a sub-allocator: a few small live blocks pin a chunk that a
 * large request cannot use. A freed large block's chunk is *kept* whole, with the point of its
 * free, for the next request of exactly its size (a training step asks for the same shapes every
 * step): the freeing stream takes it back at once, another stream when it is ordered after the
 * free or the host sees the free complete (one event query), as for free ranges. Kept chunks are
 * few (KEEP_*): the oldest goes back to upstream when more are freed (on the freeing stream,
 * after a wait for the old free unless already ordered), and trim, growth failures and the last
 * resort give them back as they give back idle chunks. Small requests never carve them. Before,
 * every large pair was a cuMemAllocFromPoolAsync + cuMemFreeAsync pair (615-1242 ns on an H200,
 * bench_alloc's native pool row).
 *
 * Each stream keeps its last few frees of blocks in shared chunks aside (CACHE_SLOTS), still
 * allocated in the TLSF, for its next request of exactly their size: the pattern of a training
 * step, which frees and asks again for the same shapes on the same stream. Such a request is served
 * from the cache, stream order alone making the reuse safe, with no search, split, merge or
 * address-table change (bench/README.md, "Instructions per operation": the TLSF's share was about
 * 660 of the pair's 1190 instructions). Everything else sees cached ranges as ordinary frees: they
 * go into the TLSF (flush_caches) before the pool grows, at the cap, and before a trim or destroy,
 * and a snapshot shows them as free ranges of their stream. At the cap nothing is cached: a free
 * range there merges with its neighbours at once.
 *
 * Sizes are rounded up to 256 bytes (the alignment); live bytes count what callers asked for.
 */
#include <string.h>

#include "lib/core/lock.h"
#include "lib/mem/mem.h"
#include "lib/mem/tlsf.h"

#define POOL_ALIGN WEFT__TLSF_GRANULE
/* Every request a resource accepts, and what adaptors stacked above add to it, has a size class. */
_Static_assert(WEFT__MEM_MAX_BYTES <= WEFT__TLSF_MAX_BYTES / 2, "the TLSF classes must cover twice WEFT__MEM_MAX_BYTES");
/* Blocks of at least max(chunk_bytes / 16, 2 MiB) get a dedicated chunk. Measured on the random
 * workload of tests/mem/test_pool_stream_order.c (sizes 256 B .. 64 MiB log-uniform, 64 MiB
 * chunks): peak reserved / peak live is 2.0 with no dedicated chunks, 1.2 from chunk/4, 1.1 from
 * chunk/8 and 1.04-1.07 from chunk/16. */
#define DEDICATED_FRACTION 16
#define DEDICATED_MIN (2ull << 20)
/* Freed dedicated chunks kept for their size: at most KEEP_COUNT chunks and KEEP_CHUNKS times
 * chunk_bytes (a larger one goes back at once). */
#define KEEP_COUNT 4
#define KEEP_CHUNKS 2
/* Frees each stream keeps aside for a request of the same size (see the top of this file). */
#define CACHE_SLOTS 8
static const char chunk_tag[] = "weft.pool.chunk";

typedef struct chunk {
  CUdeviceptr base;   /* what upstream returned */
  uint64_t bytes;     /* what we asked upstream for */
  int dedicated;      /* 1: holds one large block (its range stays allocated in the TLSF) */
  bool kept;          /* dedicated, its block freed: on the kept list, reusable for its size */
  weft__point_t freed; /* kept: where its block was freed (stream = idle lane: known complete) */
  struct chunk *prev, *next;
  struct chunk *kept_next; /* kept list, oldest first */
} chunk_t;

/* A stream's cached frees: ranges still allocated in the TLSF (held = 1), each with the tick of
 * the stream's point at its free (0: the stream had no pending work; the idle lane's stamp). */
typedef struct lane_cache {
  unsigned n;
  struct {
    weft__tlsf_range_t *r;
    uint64_t stamp;
  } e[CACHE_SLOTS];
} lane_cache_t;

typedef struct pool {
  weft_resource_t base;       /* first: the resource view */
  weft__lock_t lock;          /* rank 20; guards everything below (lock.h: the pair's hot path) */
  weft__tracker_t *tr;
  weft_pool_options_t opt;
  unsigned idle;              /* lane of known-complete ranges (= tr->n) */
  uint64_t dedicated_min;     /* requests of at least this many bytes get a dedicated chunk */
  weft__tlsf_t tlsf;
  chunk_t *chunks;            /* every chunk held from upstream */
  uint64_t reserved, reserved_peak; /* chunk bytes held from upstream */
  chunk_t *kept, *kept_tail;  /* kept dedicated chunks, oldest first */
  unsigned n_kept;
  uint64_t kept_bytes, keep_bytes; /* held in kept chunks; the most they may hold */
  lane_cache_t *cache;        /* [idle]: each stream lane's cached frees */
  unsigned cached;            /* ranges in all caches */
} pool_t;

weft_pool_options_t weft_pool_options_default(void) {
  weft_pool_options_t o;
  o.chunk_bytes = weft_options_default().pool_chunk_bytes;
  o.max_bytes = 0;
  o.release_empty_chunks = 1;
  return o;
}

/* The tracker's point for pool lane t (stream index t of the pool's runtime) at tick k: the
 * tracker numbers streams by their lane in the process's live clock domain. (The idle lane
 * appears only with tick 0, which every stream is ordered after.) */
static weft__point_t at_lane(const pool_t *p, unsigned t, uint64_t k) { return (weft__point_t){p->tr->base + t, k}; }

/* Retires lane t's ranges freed at or before tick `upto` to the idle lane (oldest first). */
static void retire(pool_t *p, unsigned t, uint64_t upto) {
  weft__tlsf_range_t *r;
  while ((r = weft__tlsf_oldest(&p->tlsf, t)) != NULL && r->stamp <= upto) weft__tlsf_move(&p->tlsf, r, p->idle, 0);
}

/* Retires each stream lane as far as the host sees its frees complete (event queries). */
static void retire_all(pool_t *p) {
  for (unsigned t = 0; t < p->idle; t++) {
    weft__tlsf_range_t *newest = weft__tlsf_newest(&p->tlsf, t);
    if (newest == NULL) continue;
    weft__point_t pt = at_lane(p, t, newest->stamp);
    if (weft__tracker_poll(p->tr, pt)) {
      retire(p, t, newest->stamp);
      continue;
    }
    /* Stamps rise along the age list: stop at the first point not complete. */
    weft__tlsf_range_t *r;
    while ((r = weft__tlsf_oldest(&p->tlsf, t)) != NULL) {
      weft__point_t q = at_lane(p, t, r->stamp);
      if (!weft__tracker_poll(p->tr, q)) break;
      retire(p, t, r->stamp);
    }
  }
}

/* Stream lane t's cached frees become ordinary free ranges of lane t (or of the idle lane, for
 * a stamp of 0). A lane's age list needs stamps that never fall, and an ordinary free may have
 * come after a cached one: a stamp below the lane's newest is raised to it (within one stream a
 * later point covers an earlier one, so the range only becomes reusable a little later). */
static void flush_cache(pool_t *p, unsigned t) {
  lane_cache_t *c = &p->cache[t];
  for (unsigned i = 0; i < c->n; i++) {
    weft__tlsf_range_t *r = c->e[i].r;
    uint64_t k = c->e[i].stamp;
    r->held = 0;
    if (k == 0) {
      weft__tlsf_free(&p->tlsf, r, p->idle, 0);
      continue;
    }
    const weft__tlsf_range_t *newest = weft__tlsf_newest(&p->tlsf, t);
    if (newest != NULL && newest->stamp > k) k = newest->stamp;
    weft__tlsf_free(&p->tlsf, r, t, k);
  }
  p->cached -= c->n;
  c->n = 0;
}

/* Every stream's cached frees become ordinary free ranges. */
static void flush_caches(pool_t *p) {
  for (unsigned t = 0; p->cached != 0 && t < p->idle; t++) flush_cache(p, t);
}

/* Whether the pool is at its cap: no room for another chunk under max_bytes. */
static bool at_cap(const pool_t *p) {
  return p->opt.max_bytes != 0 && p->reserved + p->opt.chunk_bytes > p->opt.max_bytes;
}

/* Unlinks a chunk from the pool's chunk list and frees its record (its memory went upstream). */
static void drop_chunk(pool_t *p, chunk_t *c) {
  p->reserved -= c->bytes;
  if (c->prev) c->prev->next = c->next; else p->chunks = c->next;
  if (c->next) c->next->prev = c->prev;
  weft__meta_free(c);
}

/* Gives every wholly idle chunk back to upstream, on stream s (one that takes part in no capture;
 * the frees are complete), while more than `keep` bytes stay reserved. A chunk whose release
 * fails stays in the pool. Returns the first failure (or OK). */
static weft_status_t release_idle_chunks(pool_t *p, uint64_t keep, weft_stream_t *s) {
  weft_status_t first = WEFT_OK;
  weft__tlsf_range_t *r = weft__tlsf_oldest(&p->tlsf, p->idle);
  while (r != NULL) {
    weft__tlsf_range_t *next = r->next_age;
    if (weft__tlsf_is_whole_chunk(r)) {
      chunk_t *c = r->chunk;
      if (p->reserved - c->bytes < keep) {
        r = next;
        continue;
      }
      weft_status_t st = weft__resource_deallocate(p->base.upstream, c->base, c->bytes, s, chunk_tag);
      if (st != WEFT_OK) {
        if (first == WEFT_OK) first = st;
      } else {
        weft__tlsf_remove_chunk(&p->tlsf, r);
        drop_chunk(p, c);
      }
    }
    r = next;
  }
  return first;
}

/* Whether work on s from now on may use kept chunk c's memory with no wait: s freed it, its free
 * is known complete, or s is already ordered after it. */
static bool kept_ready(const pool_t *p, weft_stream_t *s, const chunk_t *c) {
  return c->freed.stream == s->index || c->freed.stream == p->idle ||
         weft__tracker_is_ordered(s, at_lane(p, c->freed.stream, c->freed.tick));
}

/* Takes kept chunk c off the kept list (prev: its predecessor there, or NULL). */
static void unkeep(pool_t *p, chunk_t *c, chunk_t *prev) {
  if (prev != NULL) prev->kept_next = c->kept_next;
  else p->kept = c->kept_next;
  if (p->kept_tail == c) p->kept_tail = prev;
  c->kept_next = NULL;
  c->kept = false;
  p->n_kept--;
  p->kept_bytes -= c->bytes;
}

/* A kept chunk of exactly n bytes that work on s may use now (at most one event query, for the
 * oldest candidate), taken off the kept list; NULL when there is none. */
static chunk_t *take_kept(pool_t *p, weft_stream_t *s, uint64_t n) {
  chunk_t *prev = NULL, *cand = NULL, *cand_prev = NULL;
  for (chunk_t *c = p->kept; c != NULL; prev = c, c = c->kept_next) {
    if (c->bytes != n) continue;
    if (kept_ready(p, s, c)) {
      unkeep(p, c, prev);
      return c;
    }
    if (cand == NULL) {
      cand = c;
      cand_prev = prev;
    }
  }
  if (cand == NULL || !weft__tracker_poll(p->tr, at_lane(p, cand->freed.stream, cand->freed.tick))) return NULL;
  unkeep(p, cand, cand_prev);
  return cand;
}

/* Gives dedicated chunk c back to upstream on s and forgets it (kept or not). Upstream orders its
 * reuse after the work on s: the caller made sure s is ordered after c's free. */
static weft_status_t give_back(pool_t *p, chunk_t *c, chunk_t *kept_prev, weft_stream_t *s) {
  weft_status_t st = weft__resource_deallocate(p->base.upstream, c->base, c->bytes, s, chunk_tag);
  if (st != WEFT_OK) return st;
  if (c->kept) unkeep(p, c, kept_prev);
  weft__tlsf_range_t *r = weft__tlsf_lookup(&p->tlsf, c->base);
  weft__tlsf_remove_chunk(&p->tlsf, weft__tlsf_free(&p->tlsf, r, p->idle, 0));
  drop_chunk(p, c);
  return WEFT_OK;
}

/* How far release_kept goes. */
typedef enum { KEPT_NO_WAIT, KEPT_COMPLETE, KEPT_ALL } kept_release_t;

/* Gives kept chunk c back to upstream without a wait: on s if s may use it at once (kept_ready),
 * else on the stream that freed it, where stream order covers the free, unless that stream takes
 * part in a capture or code outside weft may be capturing on it (it was exposed): then c stays
 * kept and BUSY is returned. */
static weft_status_t release_no_wait(pool_t *p, chunk_t *c, chunk_t *prev, weft_stream_t *s) {
  if (kept_ready(p, s, c)) return give_back(p, c, prev, s);
  weft_stream_t *t = &p->tr->streams[c->freed.stream];
  if (atomic_load_explicit(&t->exposed, memory_order_relaxed) || weft__tracker_hold(t, "pool") != WEFT_OK)
    return WEFT_ERR_BUSY; /* (hold's CAPTURE message is not an error of the caller's) */
  weft_status_t st = give_back(p, c, prev, t);
  weft__tracker_unhold(t);
  return st;
}

/* Gives kept chunks back to upstream: KEPT_NO_WAIT those release_no_wait can; KEPT_COMPLETE also
 * those the host sees complete (an event query each), on s; KEPT_ALL every one, s first waiting
 * for each free it is not ordered after (a last resort: the wait ties s to another stream). A
 * chunk whose wait or release fails stays kept. Returns the first failure (or OK). */
static weft_status_t release_kept(pool_t *p, weft_stream_t *s, kept_release_t how) {
  weft_status_t first = WEFT_OK;
  chunk_t *prev = NULL;
  for (chunk_t *c = p->kept, *next; c != NULL; c = next) {
    next = c->kept_next;
    weft_status_t st = release_no_wait(p, c, prev, s);
    if (st == WEFT_ERR_BUSY && how != KEPT_NO_WAIT) {
      weft__point_t freed = at_lane(p, c->freed.stream, c->freed.tick);
      if (weft__tracker_poll(p->tr, freed)) st = give_back(p, c, prev, s);
      else if (how == KEPT_ALL && (st = weft__tracker_order(s, freed)) == WEFT_OK) st = give_back(p, c, prev, s);
    }
    if (st == WEFT_OK) continue; /* c is gone; prev stays */
    if (st != WEFT_ERR_BUSY && first == WEFT_OK) first = st;
    prev = c;
  }
  return first;
}

/* Keeps dedicated chunk c, whose block s just freed, for a later request of its size. To stay
 * within KEEP_*, the oldest kept chunks go back first (release_no_wait); if that is not enough,
 * c itself goes back at once (on s, where it was freed). Nothing here waits or queries: keeping
 * never ties s to another stream. */
static weft_status_t keep_chunk(pool_t *p, chunk_t *c, weft_stream_t *s) {
  chunk_t *prev = NULL;
  for (chunk_t *k = p->kept, *next; k != NULL && (p->n_kept == KEEP_COUNT || p->kept_bytes + c->bytes > p->keep_bytes);
       k = next) {
    next = k->kept_next;
    if (release_no_wait(p, k, prev, s) != WEFT_OK) prev = k;
  }
  if (p->n_kept == KEEP_COUNT || p->kept_bytes + c->bytes > p->keep_bytes) return give_back(p, c, NULL, s);
  weft__point_t pt = weft__tracker_point(s);
  c->freed = pt.tick == 0 ? (weft__point_t){p->idle, 0} : (weft__point_t){s->index, pt.tick};
  c->kept = true;
  c->kept_next = NULL;
  if (p->kept_tail != NULL) p->kept_tail->kept_next = c;
  else p->kept = c;
  p->kept_tail = c;
  p->n_kept++;
  p->kept_bytes += c->bytes;
  return WEFT_OK;
}

/* Takes a new chunk able to hold n bytes from upstream into lane s. When upstream refuses a whole
 * chunk for want of memory, smaller ones are tried (halving, down to n): a device with less free
 * memory than chunk_bytes still serves small blocks. */
static weft_status_t grow(pool_t *p, uint64_t n, weft_stream_t *s, bool dedicated, weft__tlsf_range_t **out) {
  uint64_t bytes = (dedicated || n > p->opt.chunk_bytes) ? n : p->opt.chunk_bytes;
  if (p->opt.max_bytes != 0 && p->reserved + bytes > p->opt.max_bytes) {
    bytes = n;
    if (p->reserved + bytes > p->opt.max_bytes)
      return weft__error(WEFT_ERR_OUT_OF_MEMORY, "pool: max_bytes %llu reached (%llu reserved, %llu more needed)",
                         (unsigned long long)p->opt.max_bytes, (unsigned long long)p->reserved,
                         (unsigned long long)bytes);
  }
  chunk_t *c = weft__meta_calloc(1, sizeof *c);
  if (c == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "pool: no host memory for a chunk record");
  CUdeviceptr base = 0;
  weft_status_t st = weft__resource_allocate(p->base.upstream, bytes, s, chunk_tag, &base);
  while ((st == WEFT_ERR_OUT_OF_MEMORY || st == WEFT_ERR_OVER_BUDGET) && bytes > n) {
    bytes = bytes / 2 > n ? weft__tlsf_round_up(bytes / 2) : n;
    st = weft__resource_allocate(p->base.upstream, bytes, s, chunk_tag, &base);
  }
  if (st != WEFT_OK) {
    weft__meta_free(c);
    return st;
  }
  uint64_t lo = weft__tlsf_round_up(base), hi = (base + bytes) & ~(uint64_t)(POOL_ALIGN - 1);
  weft__tlsf_range_t *r = NULL;
  if (hi > lo && hi - lo >= n) {
    weft__point_t pt = weft__tracker_point(s);
    unsigned lane = pt.tick == 0 ? p->idle : s->index;
    r = weft__tlsf_add_chunk(&p->tlsf, lo, hi - lo, c, lane, pt.tick);
  }
  if (r == NULL) {
    weft_status_t d = weft__resource_deallocate(p->base.upstream, base, bytes, s, chunk_tag);
    weft__meta_free(c);
    if (hi > lo && hi - lo >= n)
      return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "pool: no host memory for a chunk's range record%s",
                         d == WEFT_OK ? "" : " (and giving the chunk back failed)");
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "pool: upstream returned unaligned memory 0x%llx too small to align",
                       (unsigned long long)base);
  }
  c->base = base;
  c->bytes = bytes;
  c->dedicated = dedicated && lo == base && hi - lo == n;
  c->next = p->chunks;
  if (c->next) c->next->prev = c;
  p->chunks = c;
  weft__mem_reserve(&p->reserved, &p->reserved_peak, bytes);
  *out = r;
  return WEFT_OK;
}

/* Step 6: s waits for the newest free point of every other lane with free ranges; their ranges
 * (and the idle ones) move to lane s and merge. */
static weft_status_t gather(pool_t *p, weft_stream_t *s) {
  unsigned me = s->index;
  for (unsigned t = 0; t < p->idle; t++) {
    weft__tlsf_range_t *newest = weft__tlsf_newest(&p->tlsf, t);
    if (t == me || newest == NULL) continue;
    weft__point_t pt = at_lane(p, t, newest->stamp);
    weft_status_t st = weft__tracker_order(s, pt);
    if (st != WEFT_OK) return st;
  }
  uint64_t stamp = weft__tracker_point(s).tick;
  for (unsigned t = 0; t <= p->idle; t++) {
    if (t == me) continue;
    weft__tlsf_range_t *r;
    while ((r = weft__tlsf_oldest(&p->tlsf, t)) != NULL) weft__tlsf_move(&p->tlsf, r, me, stamp);
  }
  return WEFT_OK;
}

/* Bytes of chunks that are wholly free (in any lane): what a release could give back. */
static uint64_t whole_free_bytes(const pool_t *p) {
  uint64_t bytes = 0;
  for (unsigned t = 0; t <= p->idle; t++)
    for (const weft__tlsf_range_t *r = weft__tlsf_oldest(&p->tlsf, t); r != NULL; r = r->next_age)
      if (weft__tlsf_is_whole_chunk(r)) bytes += ((const chunk_t *)r->chunk)->bytes;
  return bytes + p->kept_bytes;
}

/* Step 7, the last resort before OUT_OF_MEMORY when growth failed (st says why): the host waits
 * for the newest free point of every lane, everything retires to the idle lane (where all free
 * neighbours merge) and wholly free chunks go back upstream, so that growth can try once more.
 * Only worth it when giving chunks back would make room: pieces already merged in gather(), and
 * chunks never merge with each other. Returns NULL with *st unchanged when it does nothing.
 *
 * Locks: the pool lock (rank 20) is dropped while the host blocks, so other threads keep using
 * the pool and nothing the awaited work does (host callbacks) can meet it. Points synced stay complete, so on
 * return each lane retires up to its synced point whatever changed meanwhile. */
static weft__tlsf_range_t *settle(pool_t *p, weft_stream_t *s, uint64_t n, weft_status_t *st) {
  if (!p->opt.release_empty_chunks) return NULL;
  uint64_t whole = whole_free_bytes(p);
  if (whole == 0 || (*st == WEFT_ERR_OUT_OF_MEMORY && p->opt.max_bytes != 0 &&
                     p->reserved - whole + n > p->opt.max_bytes))
    return NULL;
  weft__point_t pts[WEFT__TLSF_MAX_LANES];
  size_t k = 0;
  for (unsigned t = 0; t < p->idle; t++) {
    weft__tlsf_range_t *newest = weft__tlsf_newest(&p->tlsf, t);
    if (newest != NULL) pts[k++] = at_lane(p, t, newest->stamp);
  }
  weft__unlock(&p->lock);
  weft_status_t sync = weft__tracker_sync_points(p->tr, pts, k);
  weft__lock(&p->lock);
  if (sync != WEFT_OK) {
    *st = sync;
    return NULL;
  }
  for (size_t i = 0; i < k; i++) retire(p, pts[i].stream - p->tr->base, pts[i].tick);
  weft__tlsf_range_t *r = weft__tlsf_find(&p->tlsf, p->idle, n);
  if (r == NULL && release_kept(p, s, KEPT_ALL) == WEFT_OK && release_idle_chunks(p, 0, s) == WEFT_OK)
    *st = grow(p, n, s, false, &r);
  return r;
}

/* Steps 1-4 at the cap: every lane retires as far as the host sees completion, then the
 * smallest fit among lane s, the idle lane and the lanes s is already ordered after. */
static weft__tlsf_range_t *find_tight(pool_t *p, weft_stream_t *s, uint64_t n) {
  retire_all(p);
  weft__tlsf_range_t *best = NULL, *c;
  for (unsigned t = 0; t <= p->idle; t++) {
    if ((c = weft__tlsf_find(&p->tlsf, t, n)) == NULL) continue;
    if (t != s->index && t != p->idle && !weft__tracker_is_ordered(s, at_lane(p, t, c->stamp))) continue;
    if (best == NULL || c->size < best->size) best = c;
  }
  return best;
}

/* The pool's invariants beyond the TLSF's: stamps never fall along a stream lane's age list (what
 * retiring in age order and waiting for a lane's newest free rely on), and the caches hold
 * distinct allocated ranges, marked held, below dedicated_min, p->cached of them. */
static __attribute__((unused)) bool pool_is_valid(const pool_t *p) {
  if (!weft__tlsf_is_valid(&p->tlsf)) return false;
  unsigned cached = 0;
  for (unsigned t = 0; t < p->idle; t++) {
    for (const weft__tlsf_range_t *r = weft__tlsf_oldest(&p->tlsf, t); r != NULL && r->next_age != NULL; r = r->next_age)
      if (r->stamp > r->next_age->stamp) {
        return weft__debug_report("pool_is_valid", "a stream lane's stamps fall along its age list");
      }
    const lane_cache_t *c = &p->cache[t];
    for (unsigned i = 0; i < c->n; i++) {
      const weft__tlsf_range_t *r = c->e[i].r;
      if (r->is_free || !r->held || r->size >= p->dedicated_min || weft__tlsf_lookup(&p->tlsf, r->addr) != r) {
        return weft__debug_report("pool_is_valid", "a stream's cache holds a range that is not an allocated, held one");
      }
    }
    cached += c->n;
  }
  if (cached != p->cached) return weft__debug_report("pool_is_valid", "the caches' count is wrong");
  return true;
}

static weft__tlsf_range_t *find_ready(pool_t *p, weft_stream_t *s, uint64_t n) {
  unsigned me = s->index;
  weft__tlsf_range_t *r = weft__tlsf_find(&p->tlsf, me, n);
  if (r != NULL) return r;
  if ((r = weft__tlsf_find(&p->tlsf, p->idle, n)) != NULL) return r;
  for (unsigned t = 0; t < p->idle; t++) {
    if (t == me || (r = weft__tlsf_find(&p->tlsf, t, n)) == NULL) continue;
    weft__point_t pt = at_lane(p, t, r->stamp);
    if (weft__tracker_is_ordered(s, pt)) return r;
    if (weft__tracker_poll(p->tr, pt)) {
      retire(p, t, r->stamp);
      return weft__tlsf_find(&p->tlsf, p->idle, n);
    }
  }
  return NULL;
}

/* The failure of an allocation that no free range, growth or wait could serve, with the sizes
 * that explain it (the upstream's reason follows). Locked. */
static weft_status_t out_of_memory(pool_t *p, size_t bytes, weft_status_t st) {
  char why[256];
  snprintf(why, sizeof why, "%s", weft_last_error());
  uint64_t largest = 0;
  for (unsigned t = 0; t <= p->idle; t++)
    for (const weft__tlsf_range_t *r = weft__tlsf_oldest(&p->tlsf, t); r != NULL; r = r->next_age)
      if (r->size > largest) largest = r->size;
  return weft__error(st,
                     "pool: no memory for %zu bytes: %llu bytes reserved (%llu free, largest free range %llu); "
                     "upstream: %s",
                     bytes, (unsigned long long)p->reserved, (unsigned long long)p->tlsf.free_bytes,
                     (unsigned long long)largest, why);
}

static weft_status_t pool_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                   CUdeviceptr *out) {
  pool_t *p = (pool_t *)self;
  /* Only adaptors piled far beyond any real stack could ask for this much (each adds at most a
   * few MiB to a request of at most 2^48); refused rather than classed out of bounds. */
  if ((uint64_t)bytes > WEFT__TLSF_MAX_BYTES - POOL_ALIGN)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "pool: %zu bytes is beyond the pool's largest size class", bytes);
  uint64_t n = weft__tlsf_round_up(bytes);
  weft_status_t st = WEFT_OK;
  weft__lock(&p->lock);
  weft__tlsf_range_t *r = NULL;
  /* A free of this size on s, kept aside: stream order makes it safe at once. */
  lane_cache_t *lc = &p->cache[s->index];
  for (unsigned i = lc->n; i-- > 0;) {
    if (lc->e[i].r->size != n) continue;
    r = lc->e[i].r;
    lc->e[i] = lc->e[--lc->n];
    p->cached--;
    r->held = 0;
    weft__counts_out(&p->base.counts, bytes);
    weft__unlock(&p->lock);
    *out = (CUdeviceptr)r->addr;
    return WEFT_OK;
  }
  /* Large blocks get a chunk of their own (a kept one of their size if s may use it): they never
   * pin a shared chunk. Where upstream has no room, the kept chunks go back first. */
  if (n >= p->dedicated_min) {
    chunk_t *k = take_kept(p, s, n);
    if (k != NULL) {
      weft__counts_out(&p->base.counts, bytes);
      weft__unlock(&p->lock);
      *out = k->base;
      return WEFT_OK;
    }
    /* A miss: kept chunks s can give back with no wait go back first, so that keeping never
     * adds to what the pool holds while it grows. */
    if (p->kept != NULL) (void)release_kept(p, s, KEPT_NO_WAIT);
    weft_status_t g = grow(p, n, s, true, &r);
    if ((g == WEFT_ERR_OUT_OF_MEMORY || g == WEFT_ERR_OVER_BUDGET) && p->kept != NULL &&
        release_kept(p, s, KEPT_ALL) == WEFT_OK)
      (void)grow(p, n, s, true, &r);
  }
  /* At the cap (no room for another chunk) placement decides whether later requests fit. */
  bool tight = at_cap(p);
  if (r == NULL) r = tight ? find_tight(p, s, n) : find_ready(p, s, n);
  if (r == NULL && !tight) {
    /* Before growing: frees the host can see complete retire to the idle lane, where pieces
     * freed on different streams merge (one event query per lane with free ranges). */
    retire_all(p);
    r = weft__tlsf_find(&p->tlsf, p->idle, n);
  }
  if (r == NULL && p->cached != 0) {
    /* Before growing, cached frees serve any size and stream, as ordinary free ranges. */
    flush_caches(p);
    r = tight ? find_tight(p, s, n) : find_ready(p, s, n);
  }
  if (r == NULL) {
    st = grow(p, n, s, false, &r);
    if ((st == WEFT_ERR_OUT_OF_MEMORY || st == WEFT_ERR_OVER_BUDGET) && p->opt.release_empty_chunks) {
      /* Idle chunks too small for n may be what keeps upstream from giving a bigger one. */
      retire_all(p);
      if ((r = weft__tlsf_find(&p->tlsf, p->idle, n)) == NULL && release_kept(p, s, KEPT_ALL) == WEFT_OK &&
          release_idle_chunks(p, 0, s) == WEFT_OK)
        st = grow(p, n, s, false, &r);
    }
  }
  if (r == NULL) {
    /* Growth failed (st says why): a fit freed on another stream, after one wait. */
    weft_status_t wait_st = WEFT_OK;
    for (unsigned t = 0; t < p->idle; t++) {
      weft__tlsf_range_t *c;
      if (t == s->index || (c = weft__tlsf_find(&p->tlsf, t, n)) == NULL) continue;
      weft__point_t pt = at_lane(p, t, c->stamp);
      if ((wait_st = weft__tracker_order(s, pt)) == WEFT_OK) r = c;
      break;
    }
    if (r == NULL && wait_st == WEFT_OK && p->tlsf.free_bytes >= n && (wait_st = gather(p, s)) == WEFT_OK)
      r = weft__tlsf_find(&p->tlsf, s->index, n);
    if (wait_st != WEFT_OK) st = wait_st;
    else if (r == NULL && (st == WEFT_ERR_OUT_OF_MEMORY || st == WEFT_ERR_OVER_BUDGET)) r = settle(p, s, n, &st);
  }
  weft__tlsf_range_t *a = r ? weft__tlsf_alloc(&p->tlsf, r, n) : NULL;
  if (r != NULL && a == NULL) st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "pool: no host memory for a range record");
  if (a == NULL && (st == WEFT_ERR_OUT_OF_MEMORY || st == WEFT_ERR_OVER_BUDGET)) st = out_of_memory(p, bytes, st);
  if (a == NULL) {
    weft__unlock(&p->lock);
    return st;
  }
  WEFT_ASSERT_EXPENSIVE(pool_is_valid(p));
  weft__counts_out(&p->base.counts, bytes);
  weft__unlock(&p->lock);
  *out = (CUdeviceptr)a->addr;
  return WEFT_OK;
}

static weft_status_t pool_deallocate(weft_resource_t *self, CUdeviceptr ptr, size_t bytes, weft_stream_t *s,
                                     const char *tag) {
  pool_t *p = (pool_t *)self;
  weft__lock(&p->lock);
  weft__tlsf_range_t *r = weft__tlsf_lookup(&p->tlsf, ptr);
  /* A freed block's range is cached (held), or its chunk kept: either way, freed. */
  if (r != NULL && (r->held || ((chunk_t *)r->chunk)->kept)) r = NULL;
  if (r == NULL || r->size != weft__tlsf_round_up(bytes)) {
    weft__unlock(&p->lock);
    if (r == NULL)
      return weft__error(WEFT_ERR_INVALID_ARGUMENT, "pool: 0x%llx was not allocated from this pool (or was freed)",
                         (unsigned long long)ptr);
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "pool: 0x%llx was allocated with another size than %zu bytes",
                       (unsigned long long)ptr, bytes);
  }
  chunk_t *c = r->chunk;
  if (c->dedicated) {
    weft_status_t st = keep_chunk(p, c, s);
    if (st != WEFT_OK) {
      weft__unlock(&p->lock);
      return st;
    }
  } else {
    weft__point_t pt = weft__tracker_point(s);
    lane_cache_t *lc = &p->cache[s->index];
    if (lc->n < CACHE_SLOTS && r->size < p->dedicated_min && !at_cap(p)) {
      r->held = 1;
      lc->e[lc->n].r = r;
      lc->e[lc->n++].stamp = pt.tick;
      p->cached++;
    } else {
      weft__tlsf_free(&p->tlsf, r, pt.tick == 0 ? p->idle : s->index, pt.tick);
    }
  }
  WEFT_ASSERT_EXPENSIVE(pool_is_valid(p));
  weft__counts_back(&p->base.counts, bytes);
  weft__unlock(&p->lock);
  return WEFT_OK;
}

void weft__pool_recount(weft_resource_t *r, uint64_t bytes, bool out) {
  pool_t *p = (pool_t *)r;
  weft__lock(&p->lock);
  if (out) weft__counts_out(&p->base.counts, bytes);
  else weft__counts_back(&p->base.counts, bytes);
  weft__unlock(&p->lock);
}

static void pool_stats(const weft_resource_t *self, weft_resource_stats_t *out) {
  pool_t *p = (pool_t *)self;
  weft__lock(&p->lock);
  out->reserved_bytes = p->reserved;
  out->reserved_peak = p->reserved_peak;
  weft__unlock(&p->lock);
}

/* Wholly idle chunks go back to upstream (on a stream that takes part in no capture), then the
 * upstream trims what it caches (the driver's pool keeps freed memory until trimmed). */
static weft_status_t pool_trim(weft_resource_t *self, size_t keep) {
  pool_t *p = (pool_t *)self;
  weft_stream_t *on = weft__tracker_hold_live(p->tr, "pool trim");
  if (on == NULL) return WEFT_ERR_CAPTURE;
  weft__lock(&p->lock);
  flush_caches(p);
  retire_all(p);
  weft_status_t st = p->opt.release_empty_chunks ? release_kept(p, on, KEPT_COMPLETE) : WEFT_OK;
  if (st == WEFT_OK && p->opt.release_empty_chunks) st = release_idle_chunks(p, keep, on);
  weft__unlock(&p->lock);
  weft__tracker_unhold(on);
  return st == WEFT_OK ? weft__resource_trim(p->base.upstream, keep) : st;
}

/* Gives every chunk back. Work may still run on ranges freed on any stream (or on blocks the
 * caller never freed): stream 0 first waits for the newest free point of every lane. */
/* Gives every chunk back, on a stream that takes part in no capture, after the newest free point
 * of every lane (the host waits for a point it cannot order the stream after). Chunks upstream
 * refuses are reported and left behind. */
static weft_status_t pool_destroy(weft_resource_t *self) {
  pool_t *p = (pool_t *)self;
  weft_status_t first = WEFT_OK;
  flush_caches(p); /* their frees' points are waited for as any free's */
  weft_stream_t *on = p->chunks != NULL ? weft__tracker_hold_live(p->tr, "pool destroy") : NULL;
  if (p->chunks != NULL && on == NULL) first = WEFT_ERR_CAPTURE; /* the chunks stay allocated */
  for (unsigned t = 0; on != NULL && t < p->idle; t++) {
    weft__tlsf_range_t *newest = weft__tlsf_newest(&p->tlsf, t);
    if (t == on->index || newest == NULL) continue;
    weft__point_t pt = at_lane(p, t, newest->stamp);
    weft_status_t st = weft__tracker_order(on, pt);
    if (st != WEFT_OK) st = weft__tracker_sync_points(p->tr, &pt, 1);
    if (st != WEFT_OK && first == WEFT_OK) first = st;
  }
  for (chunk_t *c = on != NULL ? p->kept : NULL; c != NULL; c = c->kept_next) {
    if (c->freed.stream == on->index || c->freed.stream == p->idle) continue;
    weft__point_t freed = at_lane(p, c->freed.stream, c->freed.tick);
    weft_status_t st = weft__tracker_order(on, freed);
    if (st != WEFT_OK) st = weft__tracker_sync_points(p->tr, &freed, 1);
    if (st != WEFT_OK && first == WEFT_OK) first = st;
  }
  for (chunk_t *c = p->chunks, *next; c != NULL; c = next) {
    next = c->next;
    weft_status_t st = on != NULL ? weft__resource_deallocate(p->base.upstream, c->base, c->bytes, on, chunk_tag) : WEFT_OK;
    if (st != WEFT_OK && first == WEFT_OK) first = st;
    weft__meta_free(c);
  }
  if (on != NULL) weft__tracker_unhold(on);
  weft__tlsf_destroy(&p->tlsf);
  weft__meta_free(p->cache);
  weft__meta_free(p);
  return first;
}

static void pool_segments(const weft_resource_t *self, void (*segment)(void *ctx, const weft_segment_t *s),
                          void (*free_range)(void *ctx, const weft_free_range_t *r), void *ctx) {
  pool_t *p = (pool_t *)self;
  weft__lock(&p->lock);
  for (const chunk_t *c = p->chunks; c != NULL; c = c->next) {
    weft_segment_t s = {c->base, c->bytes, c->dedicated};
    segment(ctx, &s);
    if (c->kept) { /* wholly free, kept for its size */
      weft_free_range_t f = {c->base, c->bytes, c->freed.stream};
      free_range(ctx, &f);
    }
  }
  weft__tlsf_free_ranges(&p->tlsf, p->idle + 1, free_range, ctx);
  for (unsigned t = 0; t < p->idle; t++) /* cached frees are free memory of their stream */
    for (unsigned i = 0; i < p->cache[t].n; i++) {
      const weft__tlsf_range_t *r = p->cache[t].e[i].r;
      weft_free_range_t f = {r->addr, r->size, p->cache[t].e[i].stamp == 0 ? p->idle : t};
      free_range(ctx, &f);
    }
  weft__unlock(&p->lock);
}

const weft_resource_ops_t weft__pool_ops = {
    .name = "pool",
    .allocate = pool_allocate,
    .deallocate = pool_deallocate,
    .stats = pool_stats,
    .trim = pool_trim,
    .destroy = pool_destroy,
    .segments = pool_segments,
};

weft_status_t weft__pool_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream,
                                const weft_pool_options_t *opts, weft_resource_t **out) {
  static const char who[] = "weft_pool_create";
  weft_status_t st;
  if ((st = weft__mem_check_upstream(who, rt, upstream)) != WEFT_OK) return st;
  weft_pool_options_t o = opts ? *opts : weft_pool_options_default();
  if (o.chunk_bytes < POOL_ALIGN || o.chunk_bytes > WEFT__MEM_MAX_BYTES)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: chunk_bytes %llu outside %u..2^48", who,
                       (unsigned long long)o.chunk_bytes, POOL_ALIGN);
  if (o.max_bytes != 0 && o.max_bytes < o.chunk_bytes)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: max_bytes %llu is below chunk_bytes %llu", who,
                       (unsigned long long)o.max_bytes, (unsigned long long)o.chunk_bytes);
  o.chunk_bytes = weft__tlsf_round_up(o.chunk_bytes);
  if (tr->n == 0 || tr->n + 1 > WEFT__TLSF_MAX_LANES)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: %u streams (1..%d)", who, tr->n, WEFT__TLSF_MAX_LANES - 1);
  pool_t *p = weft__meta_calloc(1, sizeof *p);
  if (p == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  if ((p->cache = weft__meta_calloc(tr->n, sizeof *p->cache)) == NULL) {
    st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
    goto fail_cache;
  }
  if ((st = weft__tlsf_init(&p->tlsf, tr->n + 1)) != WEFT_OK) goto fail_tlsf;
  weft__resource_init(&p->base, &weft__pool_ops, upstream, rt);
  p->tr = tr;
  p->opt = o;
  p->idle = tr->n;
  p->dedicated_min = o.chunk_bytes / DEDICATED_FRACTION > DEDICATED_MIN ? o.chunk_bytes / DEDICATED_FRACTION : DEDICATED_MIN;
  p->keep_bytes = o.chunk_bytes * KEEP_CHUNKS;
  *out = &p->base;
  return WEFT_OK;
fail_tlsf:
  weft__meta_free(p->cache);
fail_cache:
  weft__meta_free(p);
  return st;
}
