/* Host metadata: where weft keeps its own records (blocks, free lists, event rings, graphs).
 *
 * By default everything comes from a private jemalloc arena (mallctl "arenas.create", then
 * mallocx/dallocx with MALLOCX_ARENA), so weft's records never mix with the program's heap and can
 * be inspected on their own. The jemalloc linked in is Debian's archive with every global symbol
 * renamed to weft__je_* at build time (lib/core/BUILD): weft never defines malloc, free or any
 * jemalloc name, in the static or the shared build. Building with
 * --define=weft_metadata=libc uses the C library instead (WEFT_META_LIBC).
 */
#ifndef WEFT_CORE_META_H
#define WEFT_CORE_META_H

#include <stddef.h>
#include <stdint.h>

/** Allocates `bytes` (> 0) aligned to 16, uninitialised; NULL when the host is out of memory. */
void *weft__meta_alloc(size_t bytes);
/** As weft__meta_alloc(), zero-filled. */
void *weft__meta_calloc(size_t count, size_t size);
/** Frees a pointer from weft__meta_alloc/calloc/realloc (NULL is ignored). */
void weft__meta_free(void *p);
/** Resizes; on failure returns NULL and leaves `p` valid and unchanged. */
void *weft__meta_realloc(void *p, size_t bytes);
/** Duplicates a NUL-terminated string into metadata memory. */
char *weft__meta_strdup(const char *s);

/** Metadata accounting, for tests and weft_runtime_print(). */
typedef struct weft__meta_stats {
  uint64_t allocs;       /* successful allocations since start */
  uint64_t frees;        /* frees of non-NULL pointers since start */
  int64_t live;          /* allocs - frees */
  unsigned arena;        /* jemalloc arena index, or UINT32_MAX with the libc fallback */
  const char *backend;   /* "jemalloc" or "libc" */
} weft__meta_stats_t;
void weft__meta_stats(weft__meta_stats_t *out);

#endif
