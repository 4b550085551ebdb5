/* graph/: captures, the explicit builder, executable graphs and replay, graph pools (internal
 * header; layer 5, the top layer below the umbrella //lib:weft).
 *
 * A graph is made of the runtime's streams and blocks, so graph/ sits on lib/runtime; the runtime
 * never calls graph/. What a capture changes about weft_alloc it says through the capture's
 * allocation context (weft__capture_t.alloc_to): the runtime's graph memory-node resource, or a
 * graph pool (itself a resource). Outputs of launches are blocks whose resource is their graph's
 * output resource, so weft_free gives them back to the graph.
 *
 * Locks: a graph pool's and a graph's lock rank 20 (like resources) and are never nested; graph/
 * takes the tracker lock (30) only through streams/ functions. exec.c's graph_driver_lock is a
 * leaf around the driver's graph-memory calls (taken under any of them, nothing taken under it).
 */
#ifndef WEFT_GRAPH_GRAPH_H
#define WEFT_GRAPH_GRAPH_H

#include "lib/core/container.h"
#include "lib/core/handle.h"
#include "lib/mem/tlsf.h"
#include "lib/runtime/runtime.h"

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

/** Device memory for graphs captured with WEFT_GRAPH_MEMORY_PRIVATE_POOL, as a resource that
 * the capture drawing from it hands weft_alloc. TLSF over cuMemAlloc'd chunks: lane t holds
 * ranges freed on pool stream t inside the active capture, stamped with the free's tick in that
 * capture's clocks; the idle lane holds ranges free for anyone. */
struct weft_graph_pool {
  weft_resource_t base;     /* first */
  weft__tracker_t *tr;
  pthread_mutex_t lock;     /* rank 20; guards everything below */
  weft__tlsf_t tlsf;
  unsigned idle;            /* the idle lane (= stream count) */
  weft__vec_t chunks;       /* weft__gchunk_t: cuMemAlloc'd, freed at destroy */
  uint64_t reserved, reserved_peak; /* bytes of all chunks */
  unsigned users;           /* graphs and captures drawing from it */
  weft__capture_t *active;  /* the capture drawing from it now (one at a time), or NULL */
  bool implicit;            /* made for one capture's graph: destroyed with it */
  bool doomed;              /* a destroy failed part way: no capture may draw from it again */
  /* The pool's memory as one block for the tracker: every launch of a graph drawing from the pool
   * writes it, so launches of graphs that share the pool are ordered whatever streams they run on
   * (guarded by the tracker lock). */
  weft__access_state_t acc;
};

/** The resource a graph's launch outputs belong to (embedded in the graph). */
typedef struct weft__goutputs {
  weft_resource_t base;     /* first */
  struct weft_graph *graph;
} weft__goutputs_t;

struct weft_graph {
  weft_runtime_t *rt;
  CUgraph g;
  weft_graph_memory_t memory;
  weft_graph_pool_t *pool;  /* PRIVATE_POOL: the pool its memory lives in */
  weft__gsummary_t *summary;
  size_t n_summary;
  weft__goutput_t *outputs;
  size_t n_outputs;
  weft__goutputs_t out_res; /* resource of its launches' output blocks */
  pthread_mutex_t lock;     /* rank 20; guards exec, outs, freed, live_outputs; held by launches */
  weft_exec_t *exec;        /* at most one */
  /* Kept by the graph, not the exec: outputs outlive an exec, and the next exec of the graph
   * reallocates the same addresses. */
  weft_block_t *outs;       /* [n_outputs] handles of the latest launch ({0}: none, or freed) */
  weft__point_t *freed;     /* [n_outputs] where an output was freed outside the graph: the next
                               launch must follow that free ({0, 0}: nothing pending) */
  weft_exec_t *outs_from;   /* the exec whose launch made outs (NULL once it is destroyed) */
  size_t live_outputs;      /* output blocks of launches not yet freed */
  /* Collectives, sends or receives were captured into it: with several runtimes in the process
   * a launch makes its stream exact first (weft__tracker_exact), as posting them live does: each
   * rank's graph is launched apart, and a later event standing in for a point before the launch
   * would cover collectives that wait for another rank's launch, posted behind that wait. */
  bool collectives;
  /* With collectives: linked under its capture's id while it lives (its exec keeps it alive), so
   * a communicator whose collectives it holds is not destroyed under it (weft__capture_held). */
  weft__capture_hold_t hold;
};

struct weft_exec {
  weft_graph_t *graph;
  CUgraphExec x;
  bool auto_free;           /* the runtime's output_policy was AUTO_FREE at instantiation */
};

/* gpool.c */
extern const weft_resource_ops_t weft__gpool_ops;
/** A new graph pool of the runtime of `tr`. */
weft_status_t weft__gpool_new(weft__tracker_t *tr, weft_runtime_t *rt, weft_graph_pool_t **out);
/** Makes capture c the one drawing from p (BUSY while another capture does). */
weft_status_t weft__gpool_attach(weft_graph_pool_t *p, weft__capture_t *c);
/** c ended: every range freed inside it becomes free for anyone (graphs that share a pool replay
 * in the order they were captured, as PyTorch's graph pools do). Without a graph (`made` false)
 * the ranges it allocated and did not free come back too. */
void weft__gpool_detach(weft_graph_pool_t *p, weft__capture_t *c, bool made);
/** The graph pool behind a capture's allocation context, or NULL (graph memory nodes). */
weft_graph_pool_t *weft__gpool_of(weft_resource_t *alloc_to);
/** Takes a use of graph pool p for public call fn, which hands p to a capture (a destroy of p says
 * BUSY until weft__gpool_unuse): OK, or STALE_HANDLE / INVALID_ARGUMENT (p is not a live pool),
 * WRONG_DEVICE (p is not of runtime rt). */
weft_status_t weft__gpool_use(weft_graph_pool_t *p, weft_runtime_t *rt, const char *fn);
/** Drops a use of p by a graph or a capture; an implicit pool goes with its last user (its
 * destroy's status; after a failed one the unused pool stays among the runtime's dependents,
 * so the runtime's last release says BUSY rather than free memory the driver may still use). */
weft_status_t weft__gpool_unuse(weft_graph_pool_t *p);

/* exec.c */
/** OK when p is a live object of `kind` (a graph, exec, graph pool or builder); INVALID_ARGUMENT
 * for NULL, STALE_HANDLE once destroyed, both naming `fn`. */
weft_status_t weft__graph_handle(const void *p, weft__handle_kind_t kind, const char *fn);
/** Enters live object p of `kind` (weft__handle_enter) for public call fn, which reads p until
 * weft__handle_leave: a concurrent destroy of p waits until then. OK, inside; else the error of
 * weft__graph_handle (STALE_HANDLE once destroyed), not inside. Inside, call no destroy of p (it
 * would free what the call reads) and nothing that waits for another thread's destroy of p. */
weft_status_t weft__graph_enter(const void *p, weft__handle_kind_t kind, const char *fn);
/** weft__handle_remove_unheld(p, kind) for destroy `fn`, as a status: OK (removed), STALE_HANDLE
 * (destroyed already), BUSY (the calling thread is inside p: a capture handler that a call on p
 * runs, destroying p, would free what that call reads; nothing done). */
weft_status_t weft__graph_unlist(void *p, weft__handle_kind_t kind, const char *fn);
/** Removes graph object p of `kind` for its destroy `fn` unless busy(p) says it is in use (BUSY,
 * its message): p is entered for the check (a concurrent destroy may free it once we leave), then
 * removed, which waits until no call is inside p, then checked again (a call inside may have
 * taken a claim meanwhile: p is then live again, BUSY returned). OK: p is removed, no call is
 * inside it or can enter, and the caller frees it (or restores it if freeing fails). */
weft_status_t weft__graph_remove(void *p, weft__handle_kind_t kind, const char *fn, weft_status_t (*busy)(void *p));
/** Makes a graph object from its parts (takes ownership of the arrays and of g). */
weft_status_t weft__graph_make(weft_runtime_t *rt, CUgraph g, weft_graph_memory_t memory, weft_graph_pool_t *pool,
                               weft__gsummary_t *summary, size_t n_summary, weft__goutput_t *outputs,
                               size_t n_outputs, weft_graph_t **out);

#endif /* WEFT_GRAPH_GRAPH_H */
