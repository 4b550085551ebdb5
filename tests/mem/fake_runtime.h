/* A fake runtime for lib/mem unit tests: a tracker whose points, orderings and completions the
 * test controls (no driver), and a fake upstream resource handing out fake addresses. Linked
 * instead of //streams and lib/runtime.c (see BUILD). */
#ifndef WEFT_TESTS_MEM_FAKE_RUNTIME_H
#define WEFT_TESTS_MEM_FAKE_RUNTIME_H

#include "lib/mem/mem.h"

#define FAKE_STREAMS 8

typedef struct fake_runtime {
  weft__tracker_t tr;
  uint64_t known[FAKE_STREAMS * FAKE_STREAMS];
  uint64_t host_known[FAKE_STREAMS];
  uint64_t completed[FAKE_STREAMS];  /* newest tick the "device" finished, per stream */
  uint64_t tick[FAKE_STREAMS];       /* newest tick handed out, per stream */
  unsigned waits, polls;             /* weft__tracker_order waits issued; poll calls */
  weft__point_t last_wait;           /* the point of the newest wait */
  weft_status_t fail_order;          /* non-OK: weft__tracker_order fails with it */
  int released;                      /* 1: weft__runtime_tracker says STALE */
  unsigned syncs;                    /* weft__tracker_sync_points calls (host waits) */
} fake_runtime_t;

extern fake_runtime_t fake;

/** Resets the fake with `n` streams; returns the runtime handle resources take. */
weft_runtime_t *fake_init(unsigned n);
weft_stream_t *fake_stream(unsigned i);
/** Enqueues one piece of work on stream i (its tick advances). */
void fake_work(unsigned i);
/** The device finished everything enqueued on stream i so far. */
void fake_complete(unsigned i);

/** The fake upstream: addresses from a bump counter (never reused), live set, failure injection. */
typedef struct fake_upstream {
  weft_resource_t base;
  pthread_mutex_t lock;
  uint64_t next;                     /* next address */
  uint64_t live_bytes, live_count, allocs, frees;
  weft_status_t fail_alloc;          /* non-OK: allocations fail with it */
  weft_status_t fail_free;           /* non-OK: deallocations fail with it */
  uint64_t capacity;                 /* 0: unlimited; else OUT_OF_MEMORY beyond this many live bytes */
  unsigned last_free_stream;         /* the stream of the newest successful free */
  CUdeviceptr ptrs[4096];
  uint64_t sizes[4096];
  const char *tags[4096];
} fake_upstream_t;

fake_upstream_t *fake_upstream_create(weft_runtime_t *rt);
void fake_upstream_destroy(fake_upstream_t *u);

#endif
