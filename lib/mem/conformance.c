/* weft_resource_conformance: one suite that every resource and adaptor must pass, built-in or
 * user-written (as RMM's mr_ref_test_basic runs against every memory resource). It uses only the
 * public resource calls, so it checks exactly what weft_alloc relies on. */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "lib/mem/mem.h"

#define ROUNDS 2
#define BLOCKS 24

typedef struct run {
  const weft_resource_t *r;
  FILE *report;
  unsigned failed;
} run_t;

static void fail(run_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(run_t *t, const char *fmt, ...) {
  t->failed++;
  if (t->report == NULL) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(t->report, "weft_resource_conformance(%s): ", t->r->ops && t->r->ops->name ? t->r->ops->name : "?");
  vfprintf(t->report, fmt, ap);
  fputc('\n', t->report);
  va_end(ap);
}

/* Sizes around the boundaries resources care about: the 256-byte alignment, small classes,
 * pages, MiB-sized blocks that may get chunks of their own. */
static const size_t sizes[BLOCKS] = {1,    7,     255,   256,    257,       1000,      4096,     4097,
                                     8191, 8192,  65536, 100000, 1u << 20,  (1u << 20) + 1, 3u << 20, 256,
                                     512,  768,   1024,  2048,   (5u << 20) + 3, 12345, 4 << 20,  31};

static bool overlaps(CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn) { return a < b + bn && b < a + an; }

unsigned weft_resource_conformance(weft_resource_t *r, weft_stream_t *s, weft_stream_t *other, FILE *report) {
  run_t t = {r, report, 0};
  if (r == NULL || r->ops == NULL || r->ops->allocate == NULL || r->ops->deallocate == NULL || s == NULL ||
      other == NULL) {
    if (report != NULL) fprintf(report, "weft_resource_conformance: NULL resource, ops or stream\n");
    return 1;
  }
  weft_resource_stats_t before, now;
  weft_resource_stats(r, &before);
  /* Bad calls are refused before the resource sees them, and change no count. */
  CUdeviceptr p = 0;
  if (weft_resource_allocate(r, 0, s, "conformance", &p) != WEFT_ERR_INVALID_ARGUMENT) fail(&t, "0 bytes accepted");
  if (weft_resource_allocate(r, (size_t)1 << 49, s, "conformance", &p) != WEFT_ERR_INVALID_ARGUMENT)
    fail(&t, "2^49 bytes accepted");
  if (weft_resource_allocate(r, 256, s, "conformance", NULL) != WEFT_ERR_INVALID_ARGUMENT) fail(&t, "NULL out accepted");
  if (weft_resource_deallocate(r, 0, 256, s, "conformance") != WEFT_ERR_INVALID_ARGUMENT) fail(&t, "pointer 0 accepted");
  weft_resource_stats(r, &now);
  if (memcmp(&now, &before, sizeof now) != 0) fail(&t, "refused calls changed the statistics");

  CUdeviceptr ptr[BLOCKS];
  for (int round = 0; round < ROUNDS; round++) {
    size_t live = 0;
    unsigned made = 0;
    for (unsigned i = 0; i < BLOCKS; i++) {
      weft_stream_t *on = i % 2 ? other : s;
      weft_status_t st = weft_resource_allocate(r, sizes[i], on, "conformance", &ptr[i]);
      if (st != WEFT_OK) {
        fail(&t, "allocate(%zu) on stream %d: %s (%s)", sizes[i], (int)on->index, weft_status_name(st),
             weft_last_error());
        break;
      }
      made++;
      live += sizes[i];
      if (ptr[i] == 0 || ptr[i] % 256 != 0) fail(&t, "allocate(%zu) gave 0x%llx, not 256-byte aligned", sizes[i], (unsigned long long)ptr[i]);
      for (unsigned j = 0; j < i; j++)
        if (overlaps(ptr[i], sizes[i], ptr[j], sizes[j]))
          fail(&t, "live blocks overlap: 0x%llx+%zu and 0x%llx+%zu", (unsigned long long)ptr[i], sizes[i],
               (unsigned long long)ptr[j], sizes[j]);
    }
    weft_resource_stats(r, &now);
    if (now.live_bytes != before.live_bytes + live)
      fail(&t, "live_bytes %" PRIu64 " after allocating %zu bytes from %" PRIu64, now.live_bytes, live, before.live_bytes);
    if (now.allocs != before.allocs + made + (uint64_t)round * BLOCKS)
      fail(&t, "allocs %" PRIu64 ", expected %" PRIu64, now.allocs, before.allocs + made + (uint64_t)round * BLOCKS);
    if (now.live_peak < now.live_bytes || now.reserved_peak < now.reserved_bytes) fail(&t, "a peak below its current value");
    if (now.reserved_bytes < now.live_bytes) fail(&t, "reserved_bytes below live_bytes");
    /* A free's stream already waits for every use of its block (the contract): each stream
     * waits for the other's allocations first. */
    if (weft__tracker_order(s, weft__tracker_point(other)) != WEFT_OK ||
        weft__tracker_order(other, weft__tracker_point(s)) != WEFT_OK)
      fail(&t, "ordering the two streams: %s", weft_last_error());
    /* Free in an order unlike the allocation's, on the other stream for every third block. */
    for (unsigned k = 0; k < made; k++) {
      unsigned i = (k * 7) % made;
      while (ptr[i] == 0) i = (i + 1) % made;
      weft_stream_t *on = k % 3 ? s : other;
      weft_status_t st = weft_resource_deallocate(r, ptr[i], sizes[i], on, "conformance");
      if (st != WEFT_OK) fail(&t, "deallocate(0x%llx, %zu): %s (%s)", (unsigned long long)ptr[i], sizes[i],
                               weft_status_name(st), weft_last_error());
      ptr[i] = 0;
    }
    weft_resource_stats(r, &now);
    if (now.live_bytes != before.live_bytes) fail(&t, "live_bytes %" PRIu64 " after freeing everything, was %" PRIu64,
                                                  now.live_bytes, before.live_bytes);
    if (now.frees != before.frees + (uint64_t)round * BLOCKS + made)
      fail(&t, "frees %" PRIu64 ", expected %" PRIu64, now.frees, before.frees + (uint64_t)round * BLOCKS + made);
    if (made < BLOCKS) break;
  }
  weft_status_t st = weft_resource_trim(r, 0);
  if (st != WEFT_OK) fail(&t, "trim(0): %s (%s)", weft_status_name(st), weft_last_error());
  weft_resource_stats(r, &now);
  if (now.failures != before.failures) fail(&t, "failures grew from %" PRIu64 " to %" PRIu64, before.failures, now.failures);
  return t.failed;
}
