/* The race oracle: vector clocks and the per-region access history.
 *
 * Happens-before is tracked with vector clocks over *lanes*: lane 0 is the host (all host threads
 * together, since the simulator cannot see how threads synchronise with each other), each stream
 * has a lane, and each chain of an executable graph has one. An access is remembered as its epoch
 * (lane, tick); a later access with clock C is ordered after it iff C[lane] >= tick (FastTrack).
 *
 * History lives per mapped region as a sorted list of byte intervals, each with the last write and
 * the reads since (one per lane; a read ordered before a newer one is dropped, since any write
 * unordered with the old read is also unordered with the newer one). A write replaces everything
 * in its range and collapses it into one interval, so whole-buffer kernels keep one interval.
 * Any unordered pair where one side writes is a race: counted once per (op, op) pair, and the first
 * SIM_MAX_RACES_KEPT are kept with descriptions.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

/* ---- vector clocks ---- */

static void vc_reserve(sim__vc_t *vc, uint32_t n) {
  if (n <= vc->cap) return;
  uint32_t c = vc->cap ? vc->cap : 8;
  while (c < n) c *= 2;
  vc->v = sim__xrealloc(vc->v, (size_t)c * sizeof *vc->v);
  memset(vc->v + vc->cap, 0, (size_t)(c - vc->cap) * sizeof *vc->v);
  vc->cap = c;
}

void sim__vc_free(sim__vc_t *vc) {
  free(vc->v);
  memset(vc, 0, sizeof *vc);
}

void sim__vc_join(sim__vc_t *dst, const sim__vc_t *src) {
  if (src->n > dst->n) {
    vc_reserve(dst, src->n);
    dst->n = src->n;
  }
  for (uint32_t i = 0; i < src->n; i++)
    if (src->v[i] > dst->v[i]) dst->v[i] = src->v[i];
}

void sim__vc_copy(sim__vc_t *dst, const sim__vc_t *src) {
  vc_reserve(dst, src->n);
  if (src->n) memcpy(dst->v, src->v, (size_t)src->n * sizeof *src->v);
  if (dst->n > src->n) memset(dst->v + src->n, 0, (size_t)(dst->n - src->n) * sizeof *dst->v);
  dst->n = src->n > dst->n ? src->n : dst->n;
}

void sim__vc_set(sim__vc_t *vc, uint32_t lane, uint32_t tick) {
  if (lane >= vc->n) {
    vc_reserve(vc, lane + 1);
    vc->n = lane + 1;
  }
  vc->v[lane] = tick;
}

/* ---- the host clock ---- */

sim__snap_t *sim__snap_host(void) {
  if (sim.host_snap == NULL) {
    sim__snap_t *s = sim__xcalloc(1, sizeof *s);
    s->refs = 1; /* the cache's reference */
    sim__vc_copy(&s->vc, &sim.host_vc);
    sim.host_snap = s;
  }
  sim.host_snap->refs++;
  return sim.host_snap;
}

void sim__snap_unref(sim__snap_t *s) {
  if (s == NULL || --s->refs > 0) return;
  sim__vc_free(&s->vc);
  free(s);
}

static void host_changed(void) {
  sim__snap_unref(sim.host_snap);
  sim.host_snap = NULL;
}

void sim__host_join(const sim__vc_t *vc) {
  if (!sim.oracle) return;
  sim__vc_join(&sim.host_vc, vc);
  host_changed();
}

void sim__host_access_ctx(sim__actx_t *ctx, const char *what) {
  uint32_t tick = sim__vc_get(&sim.host_vc, SIM_HOST_LANE) + 1;
  if (sim.oracle) {
    sim__vc_set(&sim.host_vc, SIM_HOST_LANE, tick);
    host_changed();
  }
  ctx->vc = &sim.host_vc;
  ctx->who = (sim__who_t){.op = sim.next_op_id++, .lane = SIM_HOST_LANE, .tick = tick, .stream = -1, .what = what};
  ctx->dev = -1;
}

/* ---- races ---- */

/* Ops already reported against the op now executing (one report per pair). */
static uint64_t g_seen[16];
static size_t g_nseen;

void sim__oracle_begin(void) { g_nseen = 0; }

static void describe(char *out, size_t n, const sim__who_t *w) {
  const char *name = w->name ? w->name : "";
  const char *sep = w->name ? " " : "";
  if (w->stream == -1) snprintf(out, n, "%s%s%s on the host (op %" PRIu64 ")", w->what, sep, name, w->op);
  else if (w->stream == -2) snprintf(out, n, "%s%s%s in a graph launch (op %" PRIu64 ")", w->what, sep, name, w->op);
  else snprintf(out, n, "%s%s%s on stream %d (op %" PRIu64 ")", w->what, sep, name, w->stream, w->op);
}

/* Counts a race; its zeroed log entry, or NULL once SIM_MAX_RACES_KEPT are kept. */
static weft_sim_race_t *count_race(void) {
  sim.races++;
  sim.stats.races = sim.races;
  if (sim.nrace_log >= SIM_MAX_RACES_KEPT) return NULL;
  if (sim.race_log == NULL) sim.race_log = sim__xcalloc(SIM_MAX_RACES_KEPT, sizeof *sim.race_log);
  weft_sim_race_t *r = &sim.race_log[sim.nrace_log++];
  memset(r, 0, sizeof *r);
  return r;
}

/* Reports a race between `first` (earlier access) and `second` (the op executing). `first` may be
 * NULL for an access to unallocated memory. */
static void report(const sim__who_t *first, int first_writes, const sim__who_t *second, int second_writes,
                   uintptr_t ptr, size_t bytes) {
  uint64_t key = first ? first->op : 0;
  for (size_t i = 0; i < g_nseen; i++)
    if (g_seen[i] == key) return;
  if (g_nseen < sizeof g_seen / sizeof g_seen[0]) g_seen[g_nseen++] = key;
  weft_sim_race_t *r = count_race();
  if (r == NULL) return;
  if (first) {
    describe(r->first_desc, sizeof r->first_desc, first);
    r->first_op = first->op;
    r->first_stream = first->stream;
  } else {
    snprintf(r->first_desc, sizeof r->first_desc, "no live allocation (unallocated or freed memory)");
    r->first_stream = -1;
  }
  describe(r->second_desc, sizeof r->second_desc, second);
  r->second_op = second->op;
  r->second_stream = second->stream;
  r->ptr = (CUdeviceptr)ptr;
  r->bytes = bytes;
  r->first_writes = first_writes;
  r->second_writes = second_writes;
}

void sim__hazard_report(const char *first, const char *second) {
  weft_sim_race_t *r = count_race();
  if (r == NULL) return;
  snprintf(r->first_desc, sizeof r->first_desc, "%s", first);
  snprintf(r->second_desc, sizeof r->second_desc, "%s", second);
  r->first_stream = r->second_stream = -1;
  r->first_writes = r->second_writes = 1;
}

void sim__race_report(void) {
  for (size_t i = 0; i < sim.nrace_log; i++) {
    const weft_sim_race_t *r = &sim.race_log[i];
    fprintf(stderr,
            "weft-sim race %zu: %zu bytes at 0x%llx\n  %s %s\n  %s %s\n  with no happens-before order between them\n",
            i + 1, r->bytes, (unsigned long long)r->ptr, r->first_writes ? "written by" : "read by", r->first_desc,
            r->second_writes ? "written by" : "read by", r->second_desc);
  }
  fprintf(stderr, "weft-sim: %" PRIu64 " race(s) found\n", sim.races);
}

/* ---- history ---- */

static int ordered(const sim__who_t *w, const sim__actx_t *ctx) {
  return w->op == ctx->who.op || sim__vc_get(ctx->vc, w->lane) >= w->tick;
}

static void seg_free(sim__seg_t *s) { free(s->reads); }

/* Inserts a copy of `src` (or an empty segment when src is NULL) at index i, covering [lo, hi). */
static void seg_insert(sim__hist_t *h, size_t i, const sim__seg_t *src, uintptr_t lo, uintptr_t hi) {
  sim__grow(&h->s, &h->cap, h->n + 1, sizeof *h->s);
  memmove(h->s + i + 1, h->s + i, (h->n - i) * sizeof *h->s);
  h->n++;
  sim__seg_t *d = &h->s[i];
  memset(d, 0, sizeof *d);
  if (src) {
    d->w = src->w;
    d->has_w = src->has_w;
    if (src->nreads) {
      d->reads = sim__xmalloc(src->nreads * sizeof *d->reads);
      memcpy(d->reads, src->reads, src->nreads * sizeof *d->reads);
      d->nreads = d->capreads = src->nreads;
    }
  }
  d->lo = lo;
  d->hi = hi;
}

/* Splits segment i at p (lo < p < hi): i keeps [lo, p), i+1 gets [p, hi). */
static void seg_split(sim__hist_t *h, size_t i, uintptr_t p) {
  sim__seg_t copy = h->s[i];
  seg_insert(h, i + 1, &copy, p, copy.hi);
  h->s[i].hi = p;
}

static void seg_apply(sim__seg_t *s, int writes, const sim__actx_t *ctx) {
  uintptr_t lo = s->lo;
  size_t n = s->hi - s->lo;
  if (s->has_w && !ordered(&s->w, ctx)) report(&s->w, 1, &ctx->who, writes, lo, n);
  if (writes) {
    for (uint32_t i = 0; i < s->nreads; i++)
      if (!ordered(&s->reads[i], ctx)) report(&s->reads[i], 0, &ctx->who, 1, lo, n);
    s->w = ctx->who;
    s->has_w = 1;
    s->nreads = 0;
    return;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < s->nreads; i++)
    if (!ordered(&s->reads[i], ctx)) s->reads[k++] = s->reads[i];
  s->nreads = k;
  if (s->nreads == s->capreads) {
    s->capreads = s->capreads ? s->capreads * 2 : 2;
    s->reads = sim__xrealloc(s->reads, s->capreads * sizeof *s->reads);
  }
  s->reads[s->nreads++] = ctx->who;
}

static int seg_same(const sim__seg_t *a, const sim__seg_t *b) {
  if (a->hi != b->lo || a->has_w != b->has_w || a->nreads != b->nreads) return 0;
  if (a->has_w && a->w.op != b->w.op) return 0;
  for (uint32_t i = 0; i < a->nreads; i++)
    if (a->reads[i].op != b->reads[i].op) return 0;
  return 1;
}

/* Merges equal neighbours among segments [from, to] (inclusive, clamped). */
static void coalesce(sim__hist_t *h, size_t from, size_t to) {
  if (from > 0) from--;
  if (to + 1 < h->n) to++;
  size_t i = from;
  while (i < to && i + 1 < h->n) {
    if (seg_same(&h->s[i], &h->s[i + 1])) {
      h->s[i].hi = h->s[i + 1].hi;
      seg_free(&h->s[i + 1]);
      memmove(h->s + i + 1, h->s + i + 2, (h->n - i - 2) * sizeof *h->s);
      h->n--;
      to--;
    } else {
      i++;
    }
  }
}

static void hist_access(sim__hist_t *h, uintptr_t lo, uintptr_t hi, int writes, const sim__actx_t *ctx) {
  /* first segment ending after lo */
  size_t a = 0, b = h->n;
  while (a < b) {
    size_t m = (a + b) / 2;
    if (h->s[m].hi <= lo) a = m + 1;
    else b = m;
  }
  size_t i = a, first = a;
  uintptr_t pos = lo;
  while (pos < hi) {
    if (i < h->n && h->s[i].lo <= pos) {
      if (h->s[i].lo < pos) {
        seg_split(h, i, pos);
        i++;
        first = i;
      }
      if (h->s[i].hi > hi) seg_split(h, i, hi);
    } else {
      uintptr_t end = (i < h->n && h->s[i].lo < hi) ? h->s[i].lo : hi;
      seg_insert(h, i, NULL, pos, end);
    }
    seg_apply(&h->s[i], writes, ctx);
    pos = h->s[i].hi;
    i++;
  }
  if (i > first) coalesce(h, first, i - 1);
}

void sim__hist_free(sim__hist_t *h) {
  for (size_t i = 0; i < h->n; i++) seg_free(&h->s[i]);
  free(h->s);
  memset(h, 0, sizeof *h);
}

static sim__region_t *region_for(CUdeviceptr ptr, size_t bytes) {
  sim__region_t *r = sim__region_find((uintptr_t)ptr);
  if (r == NULL || !r->allocated || (uintptr_t)ptr + bytes > r->base + r->size) return NULL;
  return r;
}

int sim__range_valid(CUdeviceptr ptr, size_t bytes) { return bytes == 0 || region_for(ptr, bytes) != NULL; }

int sim__oracle_access(CUdeviceptr ptr, size_t bytes, int writes, const sim__actx_t *ctx) {
  if (bytes == 0) return 0;
  sim__region_t *r = region_for(ptr, bytes);
  if (r == NULL) {
    sim__region_t *any = sim__region_find((uintptr_t)ptr);
    const sim__who_t *freer = any && any->has_last_free ? &any->last_free : NULL;
    report(freer, freer != NULL, &ctx->who, writes, (uintptr_t)ptr, bytes);
    return -1;
  }
  if (sim.oracle) hist_access(&r->hist, (uintptr_t)ptr, (uintptr_t)ptr + bytes, writes, ctx);
  return 0;
}
