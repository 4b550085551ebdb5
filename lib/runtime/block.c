/* Blocks: records with generations, weft_alloc / weft_free through the block's resource, and
 * host-side queries of a block's outstanding work. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/intern.h"
#include "lib/core/meta.h"
#include "lib/core/nvtx.h"
#include "lib/core/trace.h"
#include "lib/runtime/runtime.h"

/* The tag and size of a record that is not live, for a message: read under blocks_lock, since
 * the record may be handed out again meanwhile (a stream's cache reuses it at once). */
static const char *freed_tag(const struct weft__block *rec, size_t *bytes) {
  weft_runtime_t *rt = rec->rt;
  pthread_mutex_lock(&rt->blocks_lock);
  const char *tag = weft__block_tag(rec); /* interned: lives as long as the process */
  *bytes = rec->bytes;
  pthread_mutex_unlock(&rt->blocks_lock);
  return tag;
}

weft_status_t weft__block_check(weft_block_t b, const char *fn, struct weft__block **out) {
  struct weft__block *rec = b.rec;
  if (rec == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: the block handle is null", fn);
  /* One load: the generation and the state of one life. */
  uint64_t life = weft__block_life(rec), gen = weft__life_gen(life);
  if (gen != b.gen)
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: stale block handle (generation %llu, the record is now at %llu)",
                       fn, (unsigned long long)b.gen, (unsigned long long)gen);
  if (weft__life_state(life) != WEFT__BLOCK_LIVE) {
    size_t bytes;
    const char *tag = freed_tag(rec, &bytes);
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the block (tag '%s', %zu bytes) was freed", fn, tag, bytes);
  }
  if (!atomic_load_explicit(&rec->rt->alive, memory_order_acquire))
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the block's runtime was released", fn);
  *out = rec;
  return WEFT_OK;
}

/* ---- records ---------------------------------------------------------------------------------- */

/* Makes sure the record's read array fits every lane of the process's live clock domain now
 * (the tracker grows it for lanes that come later). */
static bool size_reads(weft_runtime_t *rt, struct weft__block *rec) {
  (void)rt;
  unsigned lanes = weft__tracker_lanes();
  if (rec->acc.reads_cap >= lanes) return true;
  uint64_t *r = weft__meta_realloc(rec->acc.reads, lanes * sizeof *r);
  if (r == NULL) return false;
  rec->acc.reads = r;
  rec->acc.reads_cap = lanes;
  return true;
}

/* Takes a record off the FIFO (NULL when none may be reused yet) and reserves a slot in the
 * address map for it (false when the host is out of memory): one pass under blocks_lock. */
static struct weft__block *take_record(weft_runtime_t *rt, bool *room) {
  pthread_mutex_lock(&rt->blocks_lock);
  struct weft__block *rec = rt->free_head;
  /* Keep the most recently freed records back so that a double free soon after a free is
   * reported as such rather than as a stale handle: reuse only when the FIFO is long enough. */
  if (rec != NULL && rt->free_count <= WEFT__FREED_KEPT && weft__block_state(rec) == WEFT__BLOCK_FREED) rec = NULL;
  if (rec != NULL) {
    rt->free_head = rec->next;
    if (rt->free_head == NULL) rt->free_tail = NULL;
    rt->free_count--;
  }
  *room = weft__map_reserve(&rt->by_ptr, rt->by_ptr_room + 1);
  if (*room) rt->by_ptr_room++;
  pthread_mutex_unlock(&rt->blocks_lock);
  return rec;
}

struct weft__block *weft__block_make(weft_runtime_t *rt, size_t bytes, const char *tag, weft_resource_t *resource) {
  bool room;
  struct weft__block *rec = take_record(rt, &room);
  if (rec == NULL && (rec = weft__meta_calloc(1, sizeof *rec)) != NULL) {
    atomic_init(&rec->life, WEFT__LIFE(0, WEFT__BLOCK_UNUSED));
    rec->rt = rt;
  }
  if (rec == NULL) {
    if (room) {
      pthread_mutex_lock(&rt->blocks_lock);
      rt->by_ptr_room--;
      pthread_mutex_unlock(&rt->blocks_lock);
    }
    return NULL;
  }
  rec->rt = rt;
  rec->room = room; /* retire gives the slot back */
  if (!room || !size_reads(rt, rec)) {
    weft__block_retire(rec);
    return NULL;
  }
  rec->next = rec->prev = NULL;
  rec->ptr = 0;
  rec->bytes = bytes;
  rec->tag = tag;
  rec->resource = resource;
  rec->alloc_stream = 0;
  rec->alloc_ns = 0;
  weft__access_init(&rec->acc, rec->acc.reads, rec->acc.reads_cap);
  return rec;
}

weft_block_t weft__block_publish(struct weft__block *rec) {
  weft_runtime_t *rt = rec->rt;
  pthread_mutex_lock(&rt->blocks_lock);
  rec->prev = NULL;
  rec->next = rt->live;
  if (rt->live != NULL) rt->live->prev = rec;
  rt->live = rec;
  rt->live_count++;
  WEFT_ASSERT(rec->room);
  rec->room = false;
  rt->by_ptr_room--;
  if (rec->ptr != 0) {
    bool added;
    uint64_t *v = weft__map_insert(&rt->by_ptr, rec->ptr, &added); /* reserved: cannot fail */
    *v = (uint64_t)(uintptr_t)rec;                                  /* the newest block at an address */
  }
  pthread_mutex_unlock(&rt->blocks_lock);
  uint64_t gen = weft__block_next_life(rec);
  return (weft_block_t){rec, gen};
}

/* Unlinks a LIVE/FREEING record from the live list and the address map (blocks_lock held). */
static void unlink_live(weft_runtime_t *rt, struct weft__block *rec) {
  uint64_t *v = rec->ptr != 0 ? weft__map_find(&rt->by_ptr, rec->ptr) : NULL;
  if (v != NULL && *v == (uint64_t)(uintptr_t)rec) weft__map_remove(&rt->by_ptr, rec->ptr);
  if (rec->prev != NULL) rec->prev->next = rec->next;
  else rt->live = rec->next;
  if (rec->next != NULL) rec->next->prev = rec->prev;
  rec->next = rec->prev = NULL;
  rt->live_count--;
}

/* Puts a record on the FIFO of reusable records, giving back its reserved map slot (blocks_lock
 * held). */
static void retire_locked(weft_runtime_t *rt, struct weft__block *rec) {
  if (rec->room) { /* made, never published */
    rec->room = false;
    rt->by_ptr_room--;
  }
  rec->next = NULL;
  if (rt->free_tail != NULL) rt->free_tail->next = rec;
  else rt->free_head = rec;
  rt->free_tail = rec;
  rt->free_count++;
}

void weft__block_retire(struct weft__block *rec) {
  weft_runtime_t *rt = rec->rt;
  pthread_mutex_lock(&rt->blocks_lock);
  retire_locked(rt, rec);
  pthread_mutex_unlock(&rt->blocks_lock);
}

/* A freed record leaves the live list and waits on the FIFO. */
void weft__block_end(struct weft__block *rec) {
  weft_runtime_t *rt = rec->rt;
  pthread_mutex_lock(&rt->blocks_lock);
  unlink_live(rt, rec);
  weft__block_set_state(rec, WEFT__BLOCK_FREED);
  retire_locked(rt, rec);
  pthread_mutex_unlock(&rt->blocks_lock);
}

bool weft__block_claim(struct weft__block *rec, uint64_t gen) {
  uint64_t expected = WEFT__LIFE(gen, WEFT__BLOCK_LIVE);
  return atomic_compare_exchange_strong_explicit(&rec->life, &expected, WEFT__LIFE(gen, WEFT__BLOCK_FREEING),
                                                 memory_order_acq_rel, memory_order_acquire);
}

void weft__block_unclaim(struct weft__block *rec) { weft__block_set_state(rec, WEFT__BLOCK_LIVE); }

void weft__block_forget(struct weft__block *rec, uint64_t gen) {
  /* Once: a block already freed (or being freed) by someone else is theirs to end. */
  if (weft__block_claim(rec, gen)) weft__block_end(rec);
}

/* ---- weft_alloc / weft_free ------------------------------------------------------------------ */

weft_status_t weft_set_oom_handler(weft_runtime_t *rt, weft_oom_handler_t fn, void *user) {
  if (weft__runtime_check(rt, "weft_set_oom_handler") == NULL) return weft__runtime_check_status(rt);
  pthread_mutex_lock(&rt->blocks_lock);
  rt->oom_handler = fn;
  rt->oom_user = user;
  pthread_mutex_unlock(&rt->blocks_lock);
  return WEFT_OK;
}

void weft__tally_add(weft__tally_t *t, const void *key, uint64_t bytes) {
  size_t i = 0;
  while (i < t->n && t->key[i] != key) i++;
  if (i == t->n) {
    if (t->n == 256) return;
    t->key[t->n] = key;
    t->bytes[t->n] = t->count[t->n] = 0;
    t->n++;
  }
  t->bytes[i] += bytes;
  t->count[i]++;
}

/* The three tags with the most live bytes (tags are interned: a pointer names a tag). */
static void top_tags(weft_runtime_t *rt, weft_oom_info_t *info) {
  weft__tally_t *t = calloc(1, sizeof *t);
  if (t == NULL) return;
  pthread_mutex_lock(&rt->blocks_lock);
  for (const struct weft__block *b = rt->live; b != NULL; b = b->next)
    if (weft__block_state(b) != WEFT__BLOCK_CACHED) weft__tally_add(t, weft__block_tag(b), b->bytes);
  pthread_mutex_unlock(&rt->blocks_lock);
  for (int k = 0; k < 3; k++) {
    size_t best = t->n;
    for (size_t i = 0; i < t->n; i++)
      if (t->bytes[i] != 0 && (best == t->n || t->bytes[i] > t->bytes[best])) best = i;
    if (best == t->n) break;
    info->top_tags[k] = t->key[best] != NULL ? t->key[best] : "";
    info->top_tag_bytes[k] = t->bytes[best];
    t->bytes[best] = 0;
  }
  free(t);
}

/* An allocation from r failed with OUT_OF_MEMORY or OVER_BUDGET: the handler may free and ask for
 * one more try; otherwise (or if that fails too) the error says what was asked and held. */
static weft_status_t out_of_memory(weft_runtime_t *rt, weft_resource_t *r, size_t bytes, const char *tag,
                                   weft_stream_t *s, CUdeviceptr *out, weft_status_t st) {
  char reason[512];
  snprintf(reason, sizeof reason, "%s", weft_last_error());
  weft_oom_info_t info = {bytes, tag ? tag : "", (int)s->index, st, 0, 0, rt->opts.budget_bytes, {NULL}, {0}, reason};
  weft_resource_stats_t rs;
  weft_resource_stats(r, &rs);
  info.live_bytes = rs.live_bytes;
  info.reserved_bytes = rs.reserved_bytes;
  top_tags(rt, &info);
  pthread_mutex_lock(&rt->blocks_lock);
  weft_oom_handler_t fn = rt->oom_handler;
  void *user = rt->oom_user;
  pthread_mutex_unlock(&rt->blocks_lock);
  if (fn != NULL && fn(rt, &info, user) != 0) {
    /* The handler's frees may have gone to the streams' caches: they go back first. */
    if (r == rt->top && weft__cache_holds(rt))
      (void)weft__cache_flush(rt, false);
    weft_status_t again = weft__resource_allocate(r, bytes, s, tag, out);
    if (again == WEFT_OK || (again != WEFT_ERR_OUT_OF_MEMORY && again != WEFT_ERR_OVER_BUDGET)) return again;
    st = again;
    snprintf(reason, sizeof reason, "%s (tried again after the OOM handler)", weft_last_error());
    weft_resource_stats(r, &rs);
    info.live_bytes = rs.live_bytes;
    info.reserved_bytes = rs.reserved_bytes;
    memset(info.top_tags, 0, sizeof info.top_tags);
    memset(info.top_tag_bytes, 0, sizeof info.top_tag_bytes);
    top_tags(rt, &info);
  }
  /* WEFT_SNAPSHOT_ON_OOM=path: what the memory looked like when it ran out. */
  const char *snap_path = getenv("WEFT_SNAPSHOT_ON_OOM");
  FILE *snap = snap_path != NULL && snap_path[0] != '\0' ? fopen(snap_path, "w") : NULL;
  if (snap != NULL) {
    if (weft_memory_snapshot(rt, snap) != WEFT_OK) { /* the failure being reported matters more */
    }
    fclose(snap);
  }
  char tops[192] = "";
  for (int k = 0; k < 3 && info.top_tags[k] != NULL; k++) {
    size_t used = strlen(tops);
    snprintf(tops + used, sizeof tops - used, "%s'%s' %llu", k ? ", " : "", info.top_tags[k],
             (unsigned long long)info.top_tag_bytes[k]);
  }
  return weft__error(st,
                     "weft_alloc: %s: requested %zu bytes (tag '%s', stream %d); live %llu, reserved %llu, "
                     "budget %llu bytes; top tags by live bytes: %s; %s",
                     st == WEFT_ERR_OVER_BUDGET ? "over budget" : "out of memory", bytes, info.tag, info.stream,
                     (unsigned long long)info.live_bytes, (unsigned long long)info.reserved_bytes,
                     (unsigned long long)info.budget_bytes, tops[0] ? tops : "none", reason);
}

/* Tells the trace and NVTX of a new block (a block from a stream's cache is counted there). */
/* announce_alloc's work, where a trace or an NVTX tool listens (out of line: its buffers make
 * a frame with a stack guard, which every allocation paid for when it was inline). */
__attribute__((noinline)) static void announce_alloc_on(weft_runtime_t *rt, weft_stream_t *s,
                                                        const struct weft__block *rec) {
  if (weft__trace_on()) {
    char args[320];
    size_t at = (size_t)snprintf(args, sizeof args, "{\"bytes\": %zu, \"ptr\": \"0x%llx\", \"tag\": \"", rec->bytes,
                                 (unsigned long long)rec->ptr);
    (void)weft__json_escape(args, &at, sizeof args - 4, weft__block_tag(rec));
    snprintf(args + at, sizeof args - at, "\"}");
    weft__trace_instant(rt->ordinal, weft__tracker_trace_tid(s), "weft_alloc", args);
  }
  if (weft__nvtx_on()) {
    char m[160];
    snprintf(m, sizeof m, "weft_alloc '%s' %zu bytes on stream %u", weft__block_tag(rec), rec->bytes, s->index);
    weft__nvtx_mark(m);
  }
}

/* Tells the trace and NVTX of an allocation (two loads when neither listens). */
static inline void announce_alloc(weft_runtime_t *rt, weft_stream_t *s, const struct weft__block *rec) {
  if (__builtin_expect(weft__trace_on() || weft__nvtx_on(), 0)) announce_alloc_on(rt, s, rec);
}

/* A block s cached (cache.c) handed out again: a new generation, its history already that of a
 * new block on s (the free restarted it). The tag and allocation facts are stored atomically:
 * snapshots read them under blocks_lock, which the reuse does not take. */
static weft_status_t reuse_cached(weft_stream_t *s, struct weft__block *rec, const char *itag, weft_block_t *out) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  __atomic_store_n(&rec->tag, itag, __ATOMIC_RELAXED);
  __atomic_store_n(&rec->alloc_stream, s->index, __ATOMIC_RELAXED);
  __atomic_store_n(&rec->alloc_ns, (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec, __ATOMIC_RELAXED);
  *out = (weft_block_t){rec, weft__block_next_life(rec)};
  announce_alloc(s->runtime, s, rec);
  return WEFT_OK;
}

/* ---- the allocation fast path -----------------------------------------------------------------
 * The common case of weft_alloc and weft_free, a block of the stream's cache handed out again or
 * freed into it, without what the general path does for every other case: the stream's full
 * check and weft__stream_prepare, which binds the context (weft__stream_ready binds it only
 * where the driver's capture question needs it), and the tracker's general path (free_live). The
 * same steps otherwise, in the same order; any other case, and every error, goes to the general
 * path with nothing changed (tests/streams/test_alloc_fast_path compares the two; the tracker's
 * no_fast_path turns this one off too). The PyTorch adapter's pair is made of these two calls
 * (issue 17: at most a third of PyTorch's caching allocator's pair). */

/* weft_alloc's fast path: true with *st (the block in *out, or the stream's failed capture
 * question, as the general path would return it), or false, nothing changed: the general path
 * takes the call (its arguments, a capture, deferred frees, a cache miss). */
static bool alloc_fast(weft_runtime_t *rt, size_t bytes, weft_stream_t *s, const char *tag, weft_block_t *out,
                       weft_status_t *st) {
  const char *itag;
  if (s == NULL || out == NULL || bytes == 0 || bytes > ((size_t)1 << 48) || s->runtime != rt || !rt->cache_on ||
      (itag = weft__intern(tag)) == NULL || !weft__stream_ready(s, st))
    return false;
  if (*st != WEFT_OK) return true;
  weft_resource_t *r;
  weft__tracker_capture_of(s, &r);
  struct weft__block *cached = r == NULL ? weft__cache_take(s, bytes, rt->top, true) : NULL;
  return cached != NULL && (*st = reuse_cached(s, cached, itag, out)) == WEFT_OK;
}

static weft_status_t alloc_general(weft_runtime_t *rt, size_t bytes, weft_stream_t *s, const char *tag,
                                   weft_block_t *out);

weft_status_t weft_alloc(weft_runtime_t *rt, size_t bytes, weft_stream_t *s, const char *tag, weft_block_t *out) {
  weft_status_t st;
  return alloc_fast(rt, bytes, s, tag, out, &st) ? st : alloc_general(rt, bytes, s, tag, out);
}

/* weft_alloc's general path: every case the fast path leaves (out of line: its error buffer
 * gives it a frame with a stack guard, which the fast path does not need). */
__attribute__((noinline)) static weft_status_t alloc_general(weft_runtime_t *rt, size_t bytes, weft_stream_t *s,
                                                             const char *tag, weft_block_t *out) {
  weft_status_t st;
  if (weft__runtime_check(rt, "weft_alloc") == NULL) return weft__runtime_check_status(rt);
  if ((st = weft__stream_check(s, "weft_alloc")) != WEFT_OK) return st;
  if (s->runtime != rt) return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_alloc: the stream belongs to another runtime");
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_alloc: out is NULL");
  if (bytes == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_alloc: bytes is 0");
  if (bytes > ((size_t)1 << 48))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_alloc: %zu bytes is larger than any device", bytes);
  const char *itag = weft__intern(tag);
  if (itag == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_alloc: no host memory for the tag");
  weft__runtime_flush_deferred(rt);
  if ((st = weft__stream_prepare(s)) != WEFT_OK) return st;
  /* Inside a capture, the capture says where to allocate (graph memory); else the runtime's stack. */
  weft_resource_t *r;
  weft__tracker_capture_of(s, &r);
  if (r == NULL) {
    r = rt->top;
    struct weft__block *cached = weft__cache_take(s, bytes, r, false);
    if (cached != NULL) return reuse_cached(s, cached, itag, out);
  }
  struct weft__block *rec = weft__block_make(rt, bytes, itag, r);
  if (rec == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_alloc: no host memory for a block record");
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  rec->alloc_stream = s->index;
  rec->alloc_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
  st = weft__resource_allocate(r, bytes, s, itag, &rec->ptr);
  if ((st == WEFT_ERR_OUT_OF_MEMORY || st == WEFT_ERR_OVER_BUDGET) && r == rt->top &&
      weft__cache_holds(rt)) {
    /* The streams' cached blocks (the stack's memory) go back first, then once more. */
    (void)weft__cache_flush(rt, false);
    st = weft__resource_allocate(r, bytes, s, itag, &rec->ptr);
  }
  if (st == WEFT_ERR_OUT_OF_MEMORY || st == WEFT_ERR_OVER_BUDGET) st = out_of_memory(rt, r, bytes, itag, s, &rec->ptr, st);
  if (st != WEFT_OK) {
    weft__block_retire(rec);
    return st;
  }
  /* Other streams' first use waits for everything s did before handing the memory out. */
  if ((st = weft__tracker_new_block(s, &rec->acc, weft__block_gen(rec) + 1)) != WEFT_OK) {
    char why[256];
    snprintf(why, sizeof why, "%s", weft_last_error());
    (void)weft__resource_deallocate(r, rec->ptr, bytes, s, itag);
    weft__block_retire(rec);
    return weft__error(st, "%s", why);
  }
  *out = weft__block_publish(rec);
  atomic_fetch_add_explicit(&rt->allocs, 1, memory_order_relaxed);
  announce_alloc(rt, s, rec);
  return WEFT_OK;
}

/* The live block whose memory starts at ptr, from the address map (blocks_lock held), or NULL. */
static struct weft__block *starting_at(weft_runtime_t *rt, CUdeviceptr ptr) {
  uint64_t *v = weft__map_find(&rt->by_ptr, ptr);
  return v != NULL ? (struct weft__block *)(uintptr_t)*v : NULL;
}

weft_status_t weft_block_find(weft_runtime_t *rt, CUdeviceptr ptr, weft_block_t *out) {
  if (weft__runtime_check(rt, "weft_block_find") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL || ptr == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_block_find: null pointer or NULL out");
  pthread_mutex_lock(&rt->blocks_lock);
  struct weft__block *rec = starting_at(rt, ptr);
  /* Not a block's start: the block that contains it, if any (a walk of the live list). */
  for (struct weft__block *b = rt->live; rec == NULL && b != NULL; b = b->next)
    if (b->ptr != 0 && ptr > b->ptr && ptr - b->ptr < b->bytes) rec = b;
  weft_block_t h = {0};
  uint64_t life = rec != NULL ? weft__block_life(rec) : 0;
  if (rec != NULL && weft__life_state(life) == WEFT__BLOCK_LIVE) h = (weft_block_t){rec, weft__life_gen(life)};
  pthread_mutex_unlock(&rt->blocks_lock);
  if (h.rec == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_block_find: no live block at 0x%llx", (unsigned long long)ptr);
  *out = h;
  return WEFT_OK;
}

static weft_status_t free_on_prepared(weft_block_t b, weft_stream_t *s);
static inline weft_status_t free_or_defer(weft_block_t b, weft_stream_t *s, weft_status_t prepared);

weft_status_t weft_free_ptr(weft_runtime_t *rt, CUdeviceptr ptr, weft_stream_t *s) {
  if (weft__runtime_check(rt, "weft_free_ptr") == NULL) return weft__runtime_check_status(rt);
  /* A capture that ended on s first gives its blocks to its graph: they are no longer weft's. */
  weft_status_t st = weft__stream_check(s, "weft_free_ptr");
  if (st != WEFT_OK) return st;
  weft__runtime_flush_deferred(rt);
  weft_status_t prepared = weft__stream_prepare(s);
  weft_block_t b;
  pthread_mutex_lock(&rt->blocks_lock);
  struct weft__block *rec = ptr != 0 ? starting_at(rt, ptr) : NULL;
  /* A block its stream cached is freed: no live block starts there. */
  uint64_t life = rec != NULL ? weft__block_life(rec) : 0;
  if (rec != NULL && weft__life_state(life) == WEFT__BLOCK_CACHED) rec = NULL;
  if (rec != NULL) b = (weft_block_t){rec, weft__life_gen(life)};
  pthread_mutex_unlock(&rt->blocks_lock);
  if (rec == NULL && prepared == WEFT_OK)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_free_ptr: no live block starts at 0x%llx", (unsigned long long)ptr);
  return rec != NULL ? free_or_defer(b, s, prepared) : prepared;
}

weft_status_t weft_block_wrap(weft_runtime_t *rt, CUdeviceptr ptr, size_t bytes, const char *tag, weft_block_t *out) {
  if (weft__runtime_check(rt, "weft_block_wrap") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL || ptr == 0 || bytes == 0)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_block_wrap: null pointer, zero size or NULL out");
  const char *itag = weft__intern(tag);
  struct weft__block *rec = itag ? weft__block_make(rt, bytes, itag, NULL) : NULL;
  if (rec == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_block_wrap: no host memory");
  rec->ptr = ptr;
  *out = weft__block_publish(rec);
  return WEFT_OK;
}

/* Puts a block whose free did not happen back to LIVE and returns st. */
static weft_status_t undo_free(struct weft__block *rec, weft_status_t st) {
  weft__block_unclaim(rec);
  return st;
}

/* Checks a handle for a free on s and claims its block. */
static weft_status_t claim_for_free(weft_block_t b, weft_stream_t *s) {
  struct weft__block *rec = b.rec;
  static const char stale[] = "weft_free: stale block handle (the record holds a newer block)";
  if (weft__block_gen(rec) != b.gen) return weft__error(WEFT_ERR_STALE_HANDLE, stale);
  if (rec->rt != s->runtime)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_free: the block belongs to another runtime than the stream");
  /* The record may be handed out again from here on (the stream cache does it at once, on any
   * thread): the claim names the generation, so it never takes the later block. */
  WEFT__TEST_POINT("weft_free: checked", rec);
  bool claimed = weft__block_claim(rec, b.gen);
  WEFT__TEST_POINT("weft_free: claim tried", rec);
  if (claimed) return WEFT_OK;
  if (weft__block_gen(rec) != b.gen) return weft__error(WEFT_ERR_STALE_HANDLE, stale);
  size_t bytes;
  const char *tag = freed_tag(rec, &bytes);
  return weft__error(WEFT_ERR_DOUBLE_FREE, "weft_free: the block (tag '%s', %zu bytes) was already freed", tag, bytes);
}

static weft_status_t free_claimed(weft_block_t b, weft_stream_t *s);

/* weft_free once s is checked and prepared (weft__stream_prepare). */
static weft_status_t free_on_prepared(weft_block_t b, weft_stream_t *s) {
  weft_status_t st = claim_for_free(b, s);
  return st == WEFT_OK ? free_claimed(b, s) : st;
}

/* Whether a failed prepare of s means: s is the legacy stream and a blocking stream is capturing
 * (any work on it would invalidate that capture: STREAM_CAPTURE_IMPLICIT). */
static bool legacy_blocked(const weft_stream_t *s, weft_status_t prepared) {
  return prepared == WEFT_ERR_CAPTURE && s->adopted && (s->raw == NULL || s->raw == CU_STREAM_LEGACY) &&
         weft_last_driver_error() == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

/* The free of a prepared stream, or, on the legacy stream while a blocking stream captures, the
 * claim now and the free later (weft__runtime_flush_deferred), as PyTorch's allocator defers
 * its frees during a capture. */
static inline weft_status_t free_or_defer(weft_block_t b, weft_stream_t *s, weft_status_t prepared) {
  if (prepared == WEFT_OK) return free_on_prepared(b, s);
  if (!legacy_blocked(s, prepared)) return prepared;
  weft_status_t st = claim_for_free(b, s);
  if (st != WEFT_OK) return st;
  weft_runtime_t *rt = s->runtime;
  pthread_mutex_lock(&rt->blocks_lock);
  weft__deferred_t *d = weft__vec_push(&rt->deferred);
  if (d != NULL) {
    *d = (weft__deferred_t){b, s};
    atomic_fetch_add_explicit(&rt->n_deferred, 1, memory_order_release);
  }
  pthread_mutex_unlock(&rt->blocks_lock);
  if (d == NULL) {
    weft__block_unclaim(b.rec);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_free: no host memory to defer a free on the legacy stream");
  }
  return WEFT_OK;
}

void weft__runtime_flush_deferred(weft_runtime_t *rt) {
  if (atomic_load_explicit(&rt->n_deferred, memory_order_acquire) == 0) return;
  pthread_mutex_lock(&rt->blocks_lock);
  weft__vec_t todo = rt->deferred;
  rt->deferred = WEFT__VEC_INIT(weft__deferred_t);
  atomic_store_explicit(&rt->n_deferred, 0, memory_order_release);
  pthread_mutex_unlock(&rt->blocks_lock);
  for (size_t i = 0; i < todo.len; i++) {
    weft__deferred_t d = WEFT__VEC_AT(&todo, weft__deferred_t, i);
    weft_status_t prepared = weft__stream_prepare(d.s);
    if (prepared == WEFT_OK) {
      (void)free_claimed(d.b, d.s); /* its failures are the resource's, as in free_all_blocks */
      continue;
    }
    /* Still blocked (or the stream cannot be used at all): keep it for later. */
    pthread_mutex_lock(&rt->blocks_lock);
    weft__deferred_t *again = weft__vec_push(&rt->deferred);
    if (again != NULL) {
      *again = d;
      atomic_fetch_add_explicit(&rt->n_deferred, 1, memory_order_release);
    }
    pthread_mutex_unlock(&rt->blocks_lock);
    if (again == NULL) weft__block_unclaim(d.b.rec); /* live again: freed with the runtime */
  }
  weft__vec_free(&todo);
}

/* free_announced's mark, where an NVTX tool listens (out of line, as announce_alloc_on). */
__attribute__((noinline)) static void free_announced_on(weft_stream_t *s, const struct weft__block *rec) {
  char m[160];
  snprintf(m, sizeof m, "weft_free '%s' %zu bytes on stream %u", weft__block_tag(rec), rec->bytes, s->index);
  weft__nvtx_mark(m);
}

/* Tells NVTX of a free, and counts it unless s's cache kept the block (counted there). */
static inline void free_announced(weft_stream_t *s, const struct weft__block *rec, bool kept) {
  if (__builtin_expect(weft__nvtx_on(), 0)) free_announced_on(s, rec);
  if (!kept) atomic_fetch_add_explicit(&((weft_runtime_t *)s->runtime)->frees, 1, memory_order_relaxed);
}

/* The free of a claimed block on prepared stream s. */
static weft_status_t free_claimed(weft_block_t b, weft_stream_t *s) {
  struct weft__block *rec = b.rec;
  weft_status_t st;
  weft_resource_t *r = rec->resource, *capture_to;
  weft__capture_t *c = weft__tracker_capture_of(s, &capture_to);
  if (c != NULL && r != capture_to)
    return undo_free(rec, weft__error(WEFT_ERR_CAPTURE,
                                      "weft_free: block '%s' was allocated outside the capture running on stream %u; "
                                      "freeing it inside would free it at every launch: free it after weft_capture_end",
                                      rec->tag, s->index));
  if (r != NULL && r->ops->deallocate == NULL)
    return undo_free(rec, weft__error(WEFT_ERR_INVALID_ARGUMENT,
                                      "weft_free: block '%s' belongs to '%s'; give it back there", rec->tag,
                                      r->ops->name ? r->ops->name : "its owner"));
  /* The free is a write: s waits for every outstanding use. Outside a capture s may keep the
   * block (cache.c): its history then restarts at s's point in the same lock hold. */
  weft__use_t use = {&rec->acc, WEFT_WRITE, b.gen};
  uint64_t t0 = weft__trace_on() ? weft__trace_now_us() : 0;
  weft_access_t traced = {b, WEFT_WRITE};
  bool keep = c == NULL && weft__cache_accepts(s, rec);
  /* A free into the cache binds the context where it calls the driver (weft__tracker_free_kept,
   * weft__cache_put); the rest may call it at once (weft_free's fast path did not bind it). */
  if (!keep && (st = weft__tracker_bind(s->tr)) != WEFT_OK) return undo_free(rec, st);
  st = keep ? weft__tracker_free_kept(s, &rec->acc) : weft__tracker_free_begin(s, &use, 1);
  if (st == WEFT_OK && weft__trace_on()) weft__trace_use(s, "weft_free", &traced, 1, t0);
  if (st == WEFT_OK && keep && weft__cache_put(s, rec)) {
    free_announced(s, rec, true); /* the tag read atomically: another thread may hand the block out already */
    return WEFT_OK;
  }
  /* The cache had no room: the resource takes it, in s's context. CORRUPTED from the guard:
   * freed, but the memory around the block was damaged. */
  if (st == WEFT_OK && keep) st = weft__tracker_bind(s->tr);
  if (st == WEFT_OK && r != NULL) st = weft__resource_deallocate(r, rec->ptr, rec->bytes, s, rec->tag);
  if (st != WEFT_OK && st != WEFT_ERR_CORRUPTED) return undo_free(rec, st);
  if (c != NULL) weft__tracker_free_block(s, &rec->acc);
  free_announced(s, rec, false);
  weft__block_end(rec);
  return st;
}

weft_status_t weft_free(weft_block_t b, weft_stream_t *s) {
  if (b.rec == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_free: the block handle is null");
  /* The fast path (above weft_alloc): s ready without binding, no deferred free to make first. */
  weft_status_t prepared;
  if (s != NULL && weft__stream_ready(s, &prepared)) return free_or_defer(b, s, prepared);
  weft_status_t st = weft__stream_check(s, "weft_free");
  if (st != WEFT_OK) return st;
  weft__runtime_flush_deferred(s->runtime);
  return free_or_defer(b, s, weft__stream_prepare(s));
}

/* ---- queries ------------------------------------------------------------------------------------ */

/* The record of a live handle, for a query with an output parameter. */
static weft_status_t query(weft_block_t b, const void *out, const char *fn, struct weft__block **rec) {
  weft_status_t st = weft__block_check(b, fn, rec);
  if (st == WEFT_OK && out == NULL) st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  return st;
}

weft_status_t weft_block_ptr(weft_block_t b, CUdeviceptr *out) {
  struct weft__block *rec;
  weft_status_t st = query(b, out, "weft_block_ptr", &rec);
  if (st == WEFT_OK) *out = rec->ptr;
  return st;
}

weft_status_t weft_block_size(weft_block_t b, size_t *out) {
  struct weft__block *rec;
  weft_status_t st = query(b, out, "weft_block_size", &rec);
  if (st == WEFT_OK) *out = rec->bytes;
  return st;
}

const char *weft_block_tag(weft_block_t b) {
  struct weft__block *rec;
  return weft__block_check(b, "weft_block_tag", &rec) == WEFT_OK ? weft__block_tag(rec) : "";
}

weft_status_t weft_block_synchronize(weft_block_t b) {
  struct weft__block *rec;
  weft_status_t st = weft__block_check(b, "weft_block_synchronize", &rec);
  if (st != WEFT_OK) return st;
  weft__tracker_t *tr = &rec->rt->tracker;
  weft__point_t pts[WEFT__MAX_LANES + 1];
  size_t n = weft__tracker_conflicts(tr, &rec->acc, WEFT_WRITE, pts);
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) return st;
  weft__runtime_refresh_captures(rec->rt);
  return weft__tracker_sync_points(tr, pts, n);
}

weft_status_t weft_block_export_event(weft_block_t b, weft_access_kind_t kind, CUevent *out) {
  struct weft__block *rec;
  weft_status_t st = weft__block_check(b, "weft_block_export_event", &rec);
  if (st != WEFT_OK) return st;
  if (out == NULL || (kind != WEFT_READ && kind != WEFT_WRITE && kind != WEFT_READ_WRITE))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_block_export_event: bad kind or NULL out");
  weft__tracker_t *tr = &rec->rt->tracker;
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) return st;
  weft__point_t pts[WEFT__MAX_LANES + 1];
  size_t n = weft__tracker_conflicts(tr, &rec->acc, (unsigned)kind, pts);
  /* Gather every conflicting point on one live stream (the first point's if it is not capturing),
   * then record the caller's event there: later than needed at worst, never earlier. */
  weft_stream_t *on = NULL;
  unsigned first = n > 0 && pts[0].stream - tr->base < tr->n_pool ? pts[0].stream - tr->base : 0; /* a lane of tr? */
  for (unsigned k = 0; k < tr->n_pool && on == NULL; k++) {
    weft_stream_t *t = &tr->streams[(first + k) % tr->n_pool];
    if (weft__tracker_capture_of(t, NULL) == NULL) on = t;
  }
  if (on == NULL)
    return weft__error(WEFT_ERR_CAPTURE, "weft_block_export_event: every pool stream is capturing; no live stream to "
                       "record the event on");
  for (size_t i = 0; i < n; i++)
    if ((st = weft__tracker_order(on, pts[i])) != WEFT_OK) return st;
  CUevent ev;
  WEFT__CU_TRY(tr->drv->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CUresult r = tr->drv->cuEventRecord(ev, on->raw);
  if (r != CUDA_SUCCESS) {
    tr->drv->cuEventDestroy(ev);
    return weft__driver_fail(r, "cuEventRecord");
  }
  *out = ev;
  return WEFT_OK;
}
