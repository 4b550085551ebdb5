/* Host metadata on a private jemalloc arena (see meta.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/meta.h"

static atomic_uint_fast64_t g_allocs, g_frees;

#ifdef WEFT_META_LIBC

static void meta_init(void) {}
#define META_ARENA UINT32_MAX
#define META_BACKEND "libc"
static void *raw_alloc(size_t n) { return aligned_alloc(16, (n + 15) & ~(size_t)15); }
static void *raw_realloc(void *p, size_t n) { return realloc(p, n); }
static void raw_free(void *p) { free(p); }

#else

/* jemalloc's API under the names lib/core/BUILD gave it (weft__je_ + the original name). */
int weft__je_mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
void *weft__je_mallocx(size_t size, int flags);
void *weft__je_rallocx(void *ptr, size_t size, int flags);
void weft__je_dallocx(void *ptr, int flags);
#define MALLOCX_ALIGN16 4 /* MALLOCX_LG_ALIGN(4) */
#define MALLOCX_ARENA_(a) ((int)(((unsigned)(a) + 1) << 20))
#define MALLOCX_TCACHE_NONE_ (((int)(-1 + 2)) << 8) /* MALLOCX_TCACHE(-1) */

static unsigned g_arena = UINT32_MAX;
static int g_flags;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void create_arena(void) {
  unsigned ind = 0;
  size_t sz = sizeof ind;
  if (weft__je_mallctl("arenas.create", &ind, &sz, NULL, 0) == 0) {
    g_arena = ind;
    /* Thread caches are per thread, not per arena: bypass them so that every record of weft's
     * lives in weft's arena and nowhere else. weft recycles its hot records itself. */
    g_flags = MALLOCX_ARENA_(ind) | MALLOCX_TCACHE_NONE_ | MALLOCX_ALIGN16;
  } else {
    g_flags = MALLOCX_ALIGN16; /* jemalloc's automatic arenas: still private to weft's copy */
  }
}
static void meta_init(void) { pthread_once(&g_once, create_arena); }
#define META_ARENA g_arena
#define META_BACKEND "jemalloc"
static void *raw_alloc(size_t n) { return weft__je_mallocx(n, g_flags); }
static void *raw_realloc(void *p, size_t n) { return weft__je_rallocx(p, n, g_flags); }
static void raw_free(void *p) { weft__je_dallocx(p, g_flags); }

#endif

void *weft__meta_alloc(size_t bytes) {
  if (bytes == 0 || bytes > ((size_t)1 << 48)) return NULL;
  meta_init();
  void *p = raw_alloc(bytes);
  if (p != NULL) atomic_fetch_add_explicit(&g_allocs, 1, memory_order_relaxed);
  return p;
}

void *weft__meta_calloc(size_t count, size_t size) {
  if (size != 0 && count > SIZE_MAX / size) return NULL;
  void *p = weft__meta_alloc(count * size);
  if (p != NULL) memset(p, 0, count * size);
  return p;
}

void weft__meta_free(void *p) {
  if (p == NULL) return;
  raw_free(p);
  atomic_fetch_add_explicit(&g_frees, 1, memory_order_relaxed);
}

void *weft__meta_realloc(void *p, size_t bytes) {
  if (p == NULL) return weft__meta_alloc(bytes);
  if (bytes == 0 || bytes > ((size_t)1 << 48)) return NULL;
  return raw_realloc(p, bytes);
}

char *weft__meta_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = weft__meta_alloc(n);
  if (d != NULL) memcpy(d, s, n);
  return d;
}

void weft__meta_stats(weft__meta_stats_t *out) {
  meta_init();
  out->allocs = atomic_load_explicit(&g_allocs, memory_order_relaxed);
  out->frees = atomic_load_explicit(&g_frees, memory_order_relaxed);
  out->live = (int64_t)(out->allocs - out->frees);
  out->arena = META_ARENA;
  out->backend = META_BACKEND;
}
