/* Stream capture: work issued to a capturing stream becomes graph nodes instead of running.
 *
 * A capture has an origin stream, a graph being built and the set of streams taking part. Each
 * stream in it has a dependency set: the nodes its next captured work depends on (a new node
 * replaces the set with itself). A stream joins a capture by waiting on an event recorded in it
 * (a fork), and is rejoined when its last nodes become ancestors of the origin's dependencies;
 * ending the capture with a forked stream not rejoined fails with ..._UNJOINED.
 *
 * Unsafe calls (allocation, pool attributes, event queries, context synchronisation, synchronous
 * copies) consult sim__capture_unsafe(): under a GLOBAL capture (any thread, unless the caller's
 * mode is RELAXED) or the calling thread's own non-RELAXED capture they fail with
 * ..._UNSUPPORTED and invalidate the offending capture, which then ends with ..._INVALIDATED.
 */
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

static sim__capture_t *capture_find_origin(sim__stream_t *s) { return s->cap && s->cap->origin == s ? s->cap : NULL; }

void sim__capture_invalidate(sim__capture_t *c) { c->invalidated = 1; }

void sim__stream_set_deps(sim__stream_t *s, sim__node_t *const *deps, size_t n, int add) {
  if (!add) s->ndeps = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < s->ndeps && s->deps[j] != deps[i]) j++;
    if (j < s->ndeps) continue;
    sim__grow(&s->deps, &s->capdeps, s->ndeps + 1, sizeof *s->deps);
    s->deps[s->ndeps++] = deps[i];
  }
}

CUresult sim__capture_add(sim__stream_t *s, sim__action_t *act, CUgraphNodeType type, sim__node_t **out) {
  sim__capture_t *c = s->cap;
  if (c->invalidated) {
    sim__action_release(act);
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  sim__node_t *node;
  CUresult r = sim__graph_add(c->graph, type, act, s->deps, s->ndeps, &node);
  if (r != CUDA_SUCCESS) return r;
  s->ndeps = 0;
  sim__stream_set_deps(s, &node, 1, 0);
  if (out) *out = node;
  return CUDA_SUCCESS;
}

void sim__capture_join(sim__stream_t *s, sim__capture_t *c, sim__node_t *const *deps, size_t n) {
  if (s->cap == c) {
    sim__stream_set_deps(s, deps, n, 1);
    return;
  }
  s->cap = c;
  sim__grow(&c->streams, &c->capstreams, c->nstreams + 1, sizeof *c->streams);
  c->streams[c->nstreams++] = s;
  sim__stream_set_deps(s, deps, n, 0);
}

static sim__graph_t *end(sim__capture_t *c);

void sim__capture_stream_leave(sim__stream_t *s) {
  sim__capture_t *c = s->cap;
  if (c == NULL) return;
  if (c->origin == s) {
    sim__graph_unref(end(c));
    return;
  }
  for (size_t i = 0; i < c->nstreams; i++) {
    if (c->streams[i] != s) continue;
    c->streams[i] = c->streams[--c->nstreams];
    break;
  }
  s->cap = NULL;
  s->ndeps = 0;
}

CUresult sim__capture_unsafe(void) {
  CUstreamCaptureMode tm = sim__self()->mode;
  if (tm == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  pthread_t me = pthread_self();
  int prohibited = 0;
  for (sim__capture_t *c = sim.captures; c != NULL; c = c->next) {
    int mine = pthread_equal(c->thread, me);
    if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
        (!mine && tm == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      sim__capture_invalidate(c);
      prohibited = 1;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult sim__legacy_implicit(CUstream h, int enqueues) {
  if (h != NULL && h != CU_STREAM_LEGACY) return CUDA_SUCCESS;
  CUresult r = CUDA_SUCCESS;
  for (sim__capture_t *c = sim.captures; c != NULL; c = c->next)
    for (size_t i = 0; i < c->nstreams; i++)
      if (!(c->streams[i]->flags & CU_STREAM_NON_BLOCKING)) {
        r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        if (enqueues) sim__capture_invalidate(c);
        break;
      }
  return r;
}

/* ---- begin / end ---- */

static CUresult begin_capture(CUstream hs, CUstreamCaptureMode mode) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  if (s->is_null) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->cap != NULL) return CUDA_ERROR_ILLEGAL_STATE;
  sim__capture_t *c = sim__xcalloc(1, sizeof *c);
  c->id = sim.next_capture_id++;
  c->mode = mode;
  c->thread = pthread_self();
  c->origin = s;
  c->graph = sim__graph_new();
  c->next = sim.captures;
  sim.captures = c;
  sim__capture_join(s, c, NULL, 0);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode) {
  SIM_CALL(cuStreamBeginCapture, begin_capture(hStream, mode));
}

/* Ends c for every stream in it; returns its graph reference (the caller keeps or drops it). */
static sim__graph_t *end(sim__capture_t *c) {
  for (size_t i = 0; i < c->nstreams; i++) {
    c->streams[i]->cap = NULL;
    c->streams[i]->ndeps = 0;
  }
  free(c->streams);
  sim__events_capture_ended(c);
  for (sim__capture_t **link = &sim.captures; *link != NULL; link = &(*link)->next) {
    if (*link != c) continue;
    *link = c->next;
    break;
  }
  sim__graph_t *g = c->graph;
  free(c);
  return g;
}

/* Marks n and its ancestors (iteratively: captured graphs can be long chains). */
static void mark_ancestors(sim__node_t *n, unsigned char *seen, sim__node_t ***stack, size_t *cap) {
  size_t top = 0;
  sim__grow(stack, cap, 1, sizeof **stack);
  (*stack)[top++] = n;
  while (top > 0) {
    sim__node_t *x = (*stack)[--top];
    if (seen[x->index]) continue;
    seen[x->index] = 1;
    sim__grow(stack, cap, top + x->nin, sizeof **stack);
    for (size_t i = 0; i < x->nin; i++) (*stack)[top++] = x->in[i];
  }
}

/* Whether every stream forked into c has rejoined the origin. */
static int all_joined(sim__capture_t *c) {
  sim__stream_t *o = c->origin;
  unsigned char *seen = sim__xcalloc(c->graph->n + 1, 1);
  sim__node_t **stack = NULL;
  size_t cap = 0;
  for (size_t i = 0; i < o->ndeps; i++) mark_ancestors(o->deps[i], seen, &stack, &cap);
  free(stack);
  int ok = 1;
  for (size_t i = 0; i < c->nstreams && ok; i++) {
    sim__stream_t *s = c->streams[i];
    if (s == o) continue;
    for (size_t j = 0; j < s->ndeps; j++)
      if (!seen[s->deps[j]->index]) ok = 0;
  }
  free(seen);
  return ok;
}

static CUresult end_capture(CUstream hs, CUgraph *out) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (s->cap == NULL) return CUDA_ERROR_ILLEGAL_STATE;
  sim__capture_t *c = capture_find_origin(s);
  if (c == NULL) {
    sim__capture_invalidate(s->cap);
    return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  }
  *out = NULL;
  /* Ending from another thread fails and also ends the capture: the beginning thread's
   * EndCapture then says CUDA_ERROR_ILLEGAL_STATE (measured, H200). */
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
    sim__graph_unref(end(c));
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  if (c->invalidated) {
    sim__graph_unref(end(c));
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  if (!all_joined(c)) {
    sim__graph_unref(end(c));
    return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  }
  *out = (CUgraph)end(c);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  SIM_CALL(cuStreamEndCapture, end_capture(hStream, phGraph));
}

/* ---- state ---- */

static CUstreamCaptureStatus status_of(const sim__stream_t *s) {
  if (s->cap == NULL) return CU_STREAM_CAPTURE_STATUS_NONE;
  return s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

static CUresult is_capturing(CUstream hs, CUstreamCaptureStatus *out) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = sim__legacy_implicit(hs, 0);
  if (r != CUDA_SUCCESS) return r;
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  *out = status_of(s);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  SIM_CALL(cuStreamIsCapturing, is_capturing(hStream, captureStatus));
}

static CUresult get_capture_info(CUstream hs, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                 const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = sim__legacy_implicit(hs, 0);
  if (r != CUDA_SUCCESS) return r;
  if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
  *status = status_of(s);
  if (s->cap == NULL) return CUDA_SUCCESS;
  if (id) *id = s->cap->id;
  if (graph) *graph = (CUgraph)s->cap->graph;
  if (deps) *deps = (const CUgraphNode *)s->deps;
  if (edges) {
    sim__grow(&s->edge_buf, &s->capedge, s->ndeps + 1, sizeof *s->edge_buf);
    memset(s->edge_buf, 0, (s->ndeps + 1) * sizeof *s->edge_buf);
    *edges = s->edge_buf;
  }
  if (ndeps) *ndeps = s->ndeps;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                                        CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                        const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out) {
  SIM_CALL(cuStreamGetCaptureInfo, get_capture_info(hStream, captureStatus_out, id_out, graph_out, dependencies_out,
                                                    edgeData_out, numDependencies_out));
}

static CUresult update_deps(CUstream hs, CUgraphNode *deps, const CUgraphEdgeData *edges, size_t n, unsigned flags) {
  sim__stream_t *s = sim__stream_get(hs);
  if (s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)
    return CUDA_ERROR_INVALID_VALUE;
  if (n > 0 && deps == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (s->cap == NULL) return CUDA_ERROR_ILLEGAL_STATE;
  if (s->cap->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  for (size_t i = 0; i < n; i++) {
    sim__node_t *node = sim__node_get(deps[i]);
    if (node == NULL || node->g != s->cap->graph) return CUDA_ERROR_INVALID_VALUE;
    if (edges != NULL) {
      static const CUgraphEdgeData zero;
      if (memcmp(&edges[i], &zero, sizeof zero) != 0) return sim__unimplemented();
    }
  }
  sim__stream_set_deps(s, (sim__node_t *const *)deps, n, flags == CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamUpdateCaptureDependencies(CUstream hStream, CUgraphNode *dependencies,
                                                   const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                                   unsigned int flags) {
  SIM_CALL(cuStreamUpdateCaptureDependencies, update_deps(hStream, dependencies, dependencyData, numDependencies, flags));
}

static CUresult exchange_mode(CUstreamCaptureMode *mode) {
  if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      *mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = sim__self()->mode;
  sim__self()->mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  SIM_CALL(cuThreadExchangeStreamCaptureMode, exchange_mode(mode));
}
