/* The stream cache: a block freed on stream s stays in s's cache, memory and record both, for s's
 * next weft_alloc of the same size. Stream order alone makes that reuse safe: the free made s wait
 * for every use of the block, so whatever s enqueues afterwards runs after all of them, and the
 * new block's history starts at s's point like any new block's (set by the free, in the lock
 * hold of its waits: weft__tracker_free_kept). The reuse costs one lock (the lane's) and a scan
 * of at most WEFT__CACHE_SLOTS records: no tracker call, no resource call, no address-map or
 * live-list update, no record recycling, no driver call, and (the lane keeping the room its
 * take freed: weft__cache_put) no write to a word every thread shares. This is PyTorch's
 * caching allocator's fast path (a block freed on a stream is reused by that stream), and issue
 * 13's measurement asked for it: on an H100 the adapter's alloc + free pair took 408 ns through
 * the resource stack against PyTorch's 379 ns.
 *
 * What a cached block is: state WEFT__BLOCK_CACHED, still in the runtime's live list and address
 * map (no other block can start at its address while the cache holds its memory), still live for
 * its resource (weft_resource_stats counts it; weft_runtime_counters gives cached_blocks and
 * cached_bytes). Handles to it are stale (freed), weft_block_find and weft_free_ptr do not see
 * it.
 *
 * Where cached memory goes back to its resource (always on the stream that cached it, which is
 * ordered after every use): when s's cache is full (its oldest blocks, to make room), when an
 * allocation runs out of memory (every lane, before the OOM handler), at weft_runtime_trim and
 * weft_runtime_set_resource, and at the runtime's release (with the live blocks). A lane whose
 * stream takes part in a capture, or cannot be used now (the legacy stream while a blocking
 * stream captures), keeps its blocks until a later flush.
 *
 * Only blocks of the runtime's stack outside captures are cached, and not with the guard or a log
 * in the stack: they must see every free. */
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/lock.h"
#include "lib/runtime/runtime.h"

void weft__cache_init(weft_runtime_t *rt) {
  for (unsigned i = 0; i < WEFT__MAX_STREAMS; i++) {
    rt->cache[i].lock = (weft__lock_t)WEFT__LOCK_INIT;
    rt->cache[i].n = 0;
    rt->cache[i].bytes = rt->cache[i].room = 0;
  }
  atomic_store(&rt->cache_room, 0);
  atomic_store(&rt->cache_spare, false);
}

/* Takes `bytes` of room a lane gave back off the runtime's count. */
static void drop_room(weft_runtime_t *rt, uint64_t bytes) {
  atomic_fetch_sub_explicit(&rt->cache_room, bytes, memory_order_relaxed);
}

/* Whether lane c (locked) has room for `need` bytes of blocks, growing its room if the bound
 * allows; false (nothing changed) when it does not. The count never passes the bound, not even
 * for a moment (a failed grow would otherwise refuse another lane's that fits). */
static bool has_room(weft_runtime_t *rt, weft__stream_cache_t *c, uint64_t need) {
  if (need <= c->room) return true;
  uint64_t grow = need - c->room;
  uint64_t cur = atomic_load_explicit(&rt->cache_room, memory_order_relaxed);
  do {
    if (grow > rt->opts.stream_cache_bytes - cur) return false;
  } while (!atomic_compare_exchange_weak_explicit(&rt->cache_room, &cur, cur + grow, memory_order_relaxed,
                                                  memory_order_relaxed));
  c->room += grow;
  return true;
}

/* Says that some lane may have room its blocks do not fill (a take kept it, or a put gave back
 * more than it needed): the next put that finds the bound reached reclaims it. Stored only when
 * not set already, so that the takes of a busy cache only read the word. */
static void note_spare(weft_runtime_t *rt) {
  if (!atomic_load_explicit(&rt->cache_spare, memory_order_relaxed))
    atomic_store_explicit(&rt->cache_spare, true, memory_order_relaxed);
}

/* Every used lane gives back the room its blocks do not fill (a lane's takes keep theirs). Called
 * with no lane locked (they are leaves), when a put finds the bound reached, and by flushes. */
static void reclaim_room(weft_runtime_t *rt) {
  weft__tracker_t *tr = &rt->tracker;
  atomic_store_explicit(&rt->cache_spare, false, memory_order_relaxed); /* a take from now on sets it */
  for (unsigned i = 0; i < tr->n && weft__tracker_lane_used(tr, i); i++) {
    weft__stream_cache_t *c = &rt->cache[i];
    weft__lock(&c->lock);
    if (c->room > c->bytes) {
      drop_room(rt, c->room - c->bytes);
      c->room = c->bytes;
    }
    weft__unlock(&c->lock);
  }
}

bool weft__cache_holds(weft_runtime_t *rt) {
  if (atomic_load_explicit(&rt->cache_room, memory_order_relaxed) == 0) return false;
  /* Room is kept after takes: ask the lanes whether they hold a block (a rare path). */
  weft__tracker_t *tr = &rt->tracker;
  bool any = false;
  for (unsigned i = 0; !any && i < tr->n && weft__tracker_lane_used(tr, i); i++) {
    weft__stream_cache_t *c = &rt->cache[i];
    weft__lock(&c->lock);
    any = c->n != 0;
    weft__unlock(&c->lock);
  }
  return any;
}

/* Removes slot i of lane c (locked). */
static struct weft__block *remove_slot(weft__stream_cache_t *c, unsigned i) {
  struct weft__block *rec = c->slot[i];
  memmove(&c->slot[i], &c->slot[i + 1], (c->n - i - 1) * sizeof c->slot[0]);
  c->n--;
  c->bytes -= rec->bytes;
  return rec;
}

/* Gives a block taken out of a lane back to its resource on s, which is ordered after every use
 * of it, and ends its record. On failure the memory stays with the record (CACHED, in no lane):
 * the runtime's release frees it with the live blocks. */
static weft_status_t give_back(weft_stream_t *s, struct weft__block *rec) {
  /* The resource may call the driver; weft_free's fast path has not bound the context. */
  weft_status_t st = weft__tracker_bind(s->tr);
  if (st == WEFT_OK) st = weft__resource_deallocate(rec->resource, rec->ptr, rec->bytes, s, rec->tag);
  if (st != WEFT_OK && st != WEFT_ERR_CORRUPTED) return st;
  weft__block_end(rec);
  return WEFT_OK;
}

bool weft__cache_accepts(const weft_stream_t *s, const struct weft__block *rec) {
  const weft_runtime_t *rt = s->runtime;
  return rt->cache_on && rec->resource == rt->top && rec->bytes <= rt->opts.stream_cache_bytes;
}

/* Room: a lane's blocks never pass its room, and the lanes' rooms never pass the bound
 * (opts.stream_cache_bytes). A take leaves the lane's room as it was and a put within the room
 * takes none, so the common pair (a block freed and allocated again on one stream) touches only
 * its lane; room grows by one atomic compare-and-swap on the runtime's count, within the bound.
 * When the bound is reached, the lane makes room from its own blocks (they can go back on s),
 * oldest first, as long as the other lanes' room leaves space for the block; where it does not,
 * every lane first gives back the room its blocks do not fill (reclaim_room), and if the other
 * lanes' blocks alone still leave no space, the free is not kept. */
bool weft__cache_put(weft_stream_t *s, struct weft__block *rec) {
  weft_runtime_t *rt = s->runtime;
  uint64_t cap = rt->opts.stream_cache_bytes;
  WEFT_ASSERT_INTERNAL(weft__cache_accepts(s, rec)); /* the caller asked before the free's waits */
  weft__stream_cache_t *c = &rt->cache[s->index];
  struct weft__block *old[WEFT__CACHE_SLOTS];
  unsigned n_old = 0;
  bool kept = false;
  for (bool reclaimed = false;; reclaimed = true) {
    weft__lock(&c->lock);
    /* A full lane gives its oldest block back whatever happens: the room that leaves counts. */
    uint64_t need = c->bytes + rec->bytes - (c->n == WEFT__CACHE_SLOTS ? c->slot[0]->bytes : 0);
    if (has_room(rt, c, need)) {
      if (c->n == WEFT__CACHE_SLOTS) {
        old[n_old++] = remove_slot(c, 0);
        if (need < c->room) note_spare(rt);
      }
      kept = true;
      break;
    }
    uint64_t total = atomic_load_explicit(&rt->cache_room, memory_order_relaxed);
    uint64_t others = total - (total >= c->room ? c->room : total);
    if (others + rec->bytes > cap) {
      /* Not kept where the other lanes' blocks fill the bound; a reclaim first, where a lane may
       * hold room it does not fill. */
      if (reclaimed || !atomic_load_explicit(&rt->cache_spare, memory_order_relaxed)) break;
      weft__unlock(&c->lock);
      reclaim_room(rt);
      continue;
    }
    while (c->n > 0) {
      old[n_old++] = remove_slot(c, 0);
      need = c->bytes + rec->bytes;
      if (has_room(rt, c, need)) {
        kept = true;
        if (need < c->room) note_spare(rt);
        break;
      }
    }
    break;
  }
  if (kept) {
    WEFT_ASSERT_INTERNAL(c->n < WEFT__CACHE_SLOTS && c->bytes + rec->bytes <= c->room);
    weft__block_set_state(rec, WEFT__BLOCK_CACHED);
    c->slot[c->n++] = rec;
    c->bytes += rec->bytes;
    c->puts++;
  }
  weft__unlock(&c->lock);
  for (unsigned i = 0; i < n_old; i++) (void)give_back(s, old[i]); /* a failure keeps the memory held */
  return kept;
}

struct weft__block *weft__cache_take(weft_stream_t *s, size_t bytes, weft_resource_t *r, bool fast) {
  weft_runtime_t *rt = s->runtime;
  if (!rt->cache_on) return NULL;
  weft__stream_cache_t *c = &rt->cache[s->index];
  struct weft__block *rec = NULL;
  weft__lock(&c->lock);
  for (unsigned i = c->n; i-- > 0;) /* the newest first: its memory is the most likely in cache */
    if (c->slot[i]->bytes == bytes && c->slot[i]->resource == r) {
      rec = remove_slot(c, i); /* the lane keeps the room */
      note_spare(rt);
      c->takes++;
      c->fast_takes += fast;
      weft__block_set_state(rec, WEFT__BLOCK_FREEING);
      break;
    }
  weft__unlock(&c->lock);
  return rec;
}

weft_status_t weft__cache_flush(weft_runtime_t *rt, bool strict) {
  weft__tracker_t *tr = &rt->tracker;
  weft_status_t first = WEFT_OK;
  reclaim_room(rt); /* lanes with no block, or whose blocks are all taken, have none after */
  for (unsigned i = 0; i < tr->n && weft__tracker_lane_used(tr, i); i++) {
    weft__stream_cache_t *c = &rt->cache[i];
    weft__lock(&c->lock);
    unsigned n = c->n;
    weft__unlock(&c->lock);
    if (n == 0) continue;
    weft_stream_t *s = &tr->streams[i];
    /* The stream must be usable for enqueueing now, from this thread, outside any capture. */
    if (!weft__tracker_owns(s)) continue;
    weft_status_t st = weft__stream_prepare(s);
    if (st == WEFT_OK) st = weft__tracker_hold(s, "weft_runtime_trim");
    if (st != WEFT_OK) {
      if (strict && first == WEFT_OK) first = st;
      continue;
    }
    struct weft__block *all[WEFT__CACHE_SLOTS];
    weft__lock(&c->lock);
    n = c->n;
    memcpy(all, c->slot, n * sizeof all[0]);
    c->n = 0;
    c->bytes = 0;
    drop_room(rt, c->room);
    c->room = 0;
    weft__unlock(&c->lock);
    for (unsigned k = 0; k < n; k++) {
      st = give_back(s, all[k]);
      if (st != WEFT_OK && first == WEFT_OK) first = st;
    }
    weft__tracker_unhold(s);
  }
  return first;
}

void weft__cache_forget(weft_runtime_t *rt) {
  for (unsigned i = 0; i < WEFT__MAX_STREAMS; i++) {
    weft__lock(&rt->cache[i].lock);
    rt->cache[i].n = 0;
    rt->cache[i].bytes = rt->cache[i].room = 0;
    rt->cache[i].takes = rt->cache[i].puts = rt->cache[i].fast_takes = 0;
    weft__unlock(&rt->cache[i].lock);
  }
  atomic_store(&rt->cache_room, 0);
  atomic_store(&rt->cache_spare, false);
}

void weft__cache_counts(weft_runtime_t *rt, uint64_t *takes, uint64_t *puts, uint64_t *blocks, uint64_t *bytes) {
  *takes = *puts = *blocks = *bytes = 0;
  for (unsigned i = 0; i < WEFT__MAX_STREAMS; i++) {
    weft__stream_cache_t *c = &rt->cache[i];
    weft__lock(&c->lock);
    *takes += c->takes;
    *puts += c->puts;
    *blocks += c->n;
    *bytes += c->bytes;
    weft__unlock(&c->lock);
  }
}
