/* graph/: capture sessions, the explicit builder, executable graphs and replay, graph pools.
 *
 * graph/ sits on lib's block records (lib/runtime.h): outputs of graphs are weft blocks, and the
 * access summary names blocks. lib/ reaches graph/ only through the hooks graph/ installs at load
 * time (lib/runtime.h: weft__graph_alloc_hook, weft__graph_free_hook, weft__graph_release_hook).
 *
 * Locks: a graph pool's lock ranks 20 (like a resource); graph/ takes the tracker lock (30)
 * only through streams/ functions or around weft__capture_block().
 */
#ifndef WEFT_GRAPH_GRAPH_H
#define WEFT_GRAPH_GRAPH_H

#include "lib/runtime.h"

/** One block from outside the graph that the graph touches, and how. */
typedef struct weft__gsummary {
  weft_block_t block;
  unsigned kind;
} weft__gsummary_t;

/** One block the graph allocates and does not free. */
typedef struct weft__goutput {
  CUdeviceptr ptr;
  size_t bytes;
  const char *tag;
} weft__goutput_t;

/** A range of a graph pool's memory. */
typedef struct weft__grange {
  CUdeviceptr ptr;
  size_t bytes;
  weft__point_t point;    /* the free's point in `domain`'s clocks */
  const void *domain;     /* the capture whose clocks `point` is in; NULL: complete */
} weft__grange_t;

struct weft_graph_pool {
  weft_runtime_t *rt;
  pthread_mutex_t lock;     /* rank 20 */
  CUdeviceptr *chunks;      /* cuMemAlloc'd, freed at destroy */
  size_t *chunk_bytes;
  size_t n_chunks;
  weft__grange_t *free;     /* free ranges, unsorted */
  size_t n_free, cap_free;
  uint64_t reserved;        /* bytes of all chunks */
  unsigned users;           /* graphs and sessions drawing from it */
};

struct weft_graph {
  weft_runtime_t *rt;
  CUgraph g;
  weft_graph_memory_t memory;
  weft_graph_pool_t *pool;  /* PRIVATE_POOL */
  bool own_pool;
  weft__gsummary_t *summary;
  size_t n_summary;
  weft__goutput_t *outputs;
  size_t n_outputs;
  weft_exec_t *exec;        /* at most one */
  size_t live_outputs;      /* outputs of launches not yet freed */
};

struct weft_exec {
  weft_graph_t *graph;
  CUgraphExec x;
  bool auto_free;           /* the runtime's output_policy was AUTO_FREE at instantiation */
  weft_block_t *outs;       /* [graph->n_outputs] handles of the latest launch ({0}: none) */
  weft__point_t *freed;     /* [graph->n_outputs] where an output was freed outside the graph:
                               the next launch reallocates the same address, so it must be
                               ordered after that free ({0, 0}: nothing pending) */
};

/** graph/'s side of a capture session (weft__capture_t.owner). */
typedef struct weft__gsession {
  weft__capture_t *cap;
  weft_capture_options_t opts;
  weft_graph_pool_t *pool;
  bool own_pool;
  struct weft__block **allocs; /* blocks allocated inside, live or freed (NULL once freed) */
  size_t n_allocs, cap_allocs;
} weft__gsession_t;

/* gpool.c */
weft_status_t weft__gpool_new(weft_runtime_t *rt, weft_graph_pool_t **out);
/** A range of `bytes` for capture `domain`; *point says what its first user must wait for. */
weft_status_t weft__gpool_alloc(weft_graph_pool_t *p, size_t bytes, const void *domain, CUdeviceptr *ptr,
                                weft__point_t *point);
/** Gives a range back; it may be reused after `point` (in `domain`'s clocks). */
weft_status_t weft__gpool_free(weft_graph_pool_t *p, CUdeviceptr ptr, size_t bytes, const void *domain, weft__point_t point);
/** The capture `domain` ended: its points become "complete" for graphs replayed after it. */
void weft__gpool_settle(weft_graph_pool_t *p, const void *domain);

/* exec.c */
/** Makes a graph object from its parts (takes ownership of the arrays). */
weft_status_t weft__graph_make(weft_runtime_t *rt, CUgraph g, weft_graph_memory_t memory, weft_graph_pool_t *pool,
                               bool own_pool, weft__gsummary_t *summary, size_t n_summary, weft__goutput_t *outputs,
                               size_t n_outputs, weft_graph_t **out);
/** weft_free of an output block of an exec (not capturing): frees graph memory as needed. */
weft_status_t weft__exec_free_output(struct weft__block *rec, weft_stream_t *s);

#endif /* WEFT_GRAPH_GRAPH_H */
