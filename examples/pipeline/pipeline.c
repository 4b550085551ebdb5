/* A three-stage pipeline: chunks of data are copied to the device, transformed by a kernel and
 * copied back, each stage on its own stream so that the copy of one chunk overlaps the compute of
 * another. The program declares only what each step reads and writes; weft makes every stream
 * wait for exactly the earlier steps it conflicts with:
 *   - compute of chunk c waits for the copy-in of chunk c (read after write),
 *   - copy-out of chunk c waits for its compute (read after write),
 *   - with three buffers per stage, refilling a buffer waits for the step that last read it
 *     (write after read).
 * Then the same pipeline runs on one stream, the output of both is checked against the host, and
 * the program prints both throughputs. Exit status 0 means the output was right (and, on the
 * simulator, that its race oracle found no unordered access).
 *
 *   bazel build //examples/pipeline
 *   bazel-bin/examples/pipeline/pipeline                                          a GPU
 *   WEFT_DRIVER=sim LD_LIBRARY_PATH=bazel-bin/sim bazel-bin/examples/pipeline/pipeline   the simulator
 *
 * WEFT_TRACE=trace.json (with WEFT_TRACE_DEVICE=1 for device timestamps) writes its timeline, and
 * PIPELINE_SNAPSHOT=snapshot.json a memory snapshot; tools/weft_view.html shows both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "examples/pipeline/pipeline_kernels.h"
#include "examples/pipeline/pipeline_kernels_sim.h"
#include "sim/weft_sim.h"
#include "weft/weft.h"

#define BUFFERS 3 /* per stage: a chunk can be in copy-in, compute and copy-out at once */
#define RUNS 3    /* timed runs per configuration; the best is reported */

#define CHECK(call)                                                                            \
  do {                                                                                         \
    weft_status_t st_ = (call);                                                                \
    if (st_ != WEFT_OK) {                                                                      \
      fprintf(stderr, "%s failed: %s: %s\n", #call, weft_status_name(st_), weft_last_error()); \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

/* weft does not link the CUDA driver: it loads it at run time (or the simulator), so the few
 * driver calls weft has no wrapper for are looked up in the library it loaded. */
typedef CUresult (*module_load_fn)(CUmodule *module, const void *image);
typedef CUresult (*module_get_function_fn)(CUfunction *f, CUmodule module, const char *name);
typedef CUresult (*module_unload_fn)(CUmodule module);
typedef CUresult (*host_alloc_fn)(void **p, size_t bytes, unsigned flags);
typedef CUresult (*host_free_fn)(void *p);

static void *driver(const char *name) {
  void *f = weft_driver_symbol(name);
  if (f == NULL) {
    fprintf(stderr, "the CUDA driver has no %s\n", name);
    exit(1);
  }
  return f;
}

/* Page-locked host memory, without which copies cannot overlap kernels; the simulator has no
 * cuMemHostAlloc and gets ordinary memory. */
static void *host_alloc(size_t bytes, int *pinned) {
  host_alloc_fn f = (host_alloc_fn)weft_driver_symbol("cuMemHostAlloc");
  void *p = NULL;
  *pinned = f != NULL && f(&p, bytes, 0) == CUDA_SUCCESS;
  if (!*pinned && (p = malloc(bytes)) == NULL) {
    fprintf(stderr, "out of host memory\n");
    exit(1);
  }
  return p;
}

static void host_free(void *p, int pinned) {
  if (!pinned) free(p);
  else if (((host_free_fn)driver("cuMemFreeHost"))(p) != CUDA_SUCCESS) fprintf(stderr, "cuMemFreeHost failed\n");
}

typedef struct pipeline {
  weft_runtime_t *rt;
  CUfunction transform;
  unsigned chunks, elems, rounds;
  size_t chunk_bytes;
  const unsigned *in;
  unsigned *out;
  weft_block_t din[BUFFERS], dout[BUFFERS];
} pipeline_t;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Pushes every chunk through the three stages on the given streams (they may be one stream) and
 * waits for the last copy-out. Returns the seconds it took. */
static double run(const pipeline_t *p, weft_stream_t *copy_in, weft_stream_t *compute, weft_stream_t *copy_out) {
  double start = now_s();
  for (unsigned c = 0; c < p->chunks; c++) {
    weft_block_t din = p->din[c % BUFFERS], dout = p->dout[c % BUFFERS];
    size_t at = (size_t)c * p->elems;
    CHECK(weft_copy_to_block(copy_in, din, 0, p->in + at, p->chunk_bytes));

    CUdeviceptr out_ptr, in_ptr;
    CHECK(weft_block_ptr(dout, &out_ptr));
    CHECK(weft_block_ptr(din, &in_ptr));
    unsigned n = p->elems, rounds = p->rounds;
    void *params[] = {&out_ptr, &in_ptr, &n, &rounds};
    weft_launch_t launch = {.func = p->transform, .grid = {(n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096},
                            .block = {256}, .params = params};
    weft_access_t accesses[] = {{dout, WEFT_WRITE}, {din, WEFT_READ}};
    CHECK(weft_launch(compute, &launch, accesses, 2));

    CHECK(weft_copy_from_block(copy_out, p->out + at, dout, 0, p->chunk_bytes));
  }
  CHECK(weft_runtime_synchronize(p->rt));
  return now_s() - start;
}

/* Compares every output element with the host's result; returns the number of wrong ones. */
static size_t verify(const pipeline_t *p) {
  size_t wrong = 0, n = (size_t)p->chunks * p->elems;
  unsigned mul, add;
  pipeline_transform_map(p->rounds, &mul, &add);
  for (size_t i = 0; i < n; i++) {
    unsigned want = mul * p->in[i] + add;
    if (p->out[i] != want && wrong++ == 0)
      fprintf(stderr, "element %zu (chunk %zu): %u, expected %u\n", i, i / p->elems, p->out[i], want);
  }
  return wrong;
}

/* Runs once to warm up (pool growth, module load), then RUNS times; returns the best time, having
 * checked the output of every run. */
static double best_of(pipeline_t *p, weft_stream_t *copy_in, weft_stream_t *compute, weft_stream_t *copy_out,
                      const char *what) {
  double best = 0;
  for (int r = 0; r <= RUNS; r++) {
    memset(p->out, 0, (size_t)p->chunks * p->chunk_bytes);
    double t = run(p, copy_in, compute, copy_out);
    size_t wrong = verify(p);
    if (wrong != 0) {
      fprintf(stderr, "%s: %zu wrong elements\n", what, wrong);
      exit(1);
    }
    if (r > 0 && (best == 0 || t < best)) best = t;
  }
  return best;
}

int main(void) {
  pipeline_t p = {0};
  CHECK(weft_runtime_get(0, NULL, &p.rt));
  weft_driver_info_t info;
  CHECK(weft_driver_info(&info));
  const int sim = info.is_simulator;
  /* On the simulator every byte is copied by the CPU: a smaller problem. */
  p.chunks = sim ? 8 : 32;
  p.elems = sim ? 16384 : 1u << 20;
  p.rounds = 1024;
  p.chunk_bytes = (size_t)p.elems * sizeof(unsigned);

  pipeline_kernels_register_sim();
  CUmodule module;
  if (((module_load_fn)driver("cuModuleLoadData"))(&module, pipeline_kernels_fatbin) != CUDA_SUCCESS ||
      ((module_get_function_fn)driver("cuModuleGetFunction"))(&p.transform, module, "pipeline_transform") !=
          CUDA_SUCCESS) {
    fprintf(stderr, "cannot load the pipeline kernel\n");
    return 1;
  }

  size_t total = (size_t)p.chunks * p.chunk_bytes;
  int in_pinned, out_pinned;
  unsigned *in = host_alloc(total, &in_pinned);
  p.out = host_alloc(total, &out_pinned);
  for (size_t i = 0; i < (size_t)p.chunks * p.elems; i++) in[i] = (unsigned)i * 2654435761u;
  p.in = in;

  weft_stream_t *s[3];
  for (unsigned i = 0; i < 3; i++) CHECK(weft_stream_get(p.rt, i, &s[i]));
  for (int k = 0; k < BUFFERS; k++) {
    CHECK(weft_alloc(p.rt, p.chunk_bytes, s[0], "chunk in", &p.din[k]));
    CHECK(weft_alloc(p.rt, p.chunk_bytes, s[0], "chunk out", &p.dout[k]));
  }
  const weft_sim_api_t *oracle = weft_sim_api(weft_driver_symbol);

  printf("weft pipeline on %s: %u chunks of %zu KiB, %u rounds per element, %s host memory\n",
         sim ? "the simulator (timings are not performance numbers)" : "a GPU", p.chunks, p.chunk_bytes / 1024,
         p.rounds, in_pinned && out_pinned ? "page-locked" : "pageable");
  weft_counters_t c0, c1;
  CHECK(weft_runtime_counters(p.rt, &c0));
  double three = best_of(&p, s[0], s[1], s[2], "three streams");
  CHECK(weft_runtime_counters(p.rt, &c1));
  double one = best_of(&p, s[0], s[0], s[0], "one stream");
  double gb = 2.0 * (double)total / 1e9; /* bytes copied in and out */
  unsigned long long runs = RUNS + 1, waits = (c1.waits_issued - c0.waits_issued) / runs,
                     skipped = (c1.waits_skipped - c0.waits_skipped) / runs;
  printf("  three streams: %8.2f ms  %7.2f GB/s  %llu waits issued (%.2f per chunk), %llu conflicts already ordered\n",
         three * 1e3, gb / three, waits, (double)waits / p.chunks, skipped);
  printf("  one stream:    %8.2f ms  %7.2f GB/s\n", one * 1e3, gb / one);
  printf("  three streams vs one: %.2fx the throughput; output verified (%zu elements, both runs)\n", one / three,
         (size_t)p.chunks * p.elems);

  /* PIPELINE_SNAPSHOT=path: the device memory with every buffer live (tools/weft_view.html). */
  const char *snap = getenv("PIPELINE_SNAPSHOT");
  if (snap != NULL && *snap != '\0') {
    FILE *f = fopen(snap, "w");
    if (f == NULL) {
      fprintf(stderr, "cannot write %s\n", snap);
      return 1;
    }
    CHECK(weft_memory_snapshot(p.rt, f));
    fclose(f);
    printf("  memory snapshot: %s\n", snap);
  }
  int status = 0;
  if (oracle != NULL) {
    printf("  simulator race oracle: %llu unordered accesses\n", (unsigned long long)oracle->race_count());
    if (oracle->race_count() != 0) {
      oracle->print_report();
      status = 1;
    }
  }
  for (int k = 0; k < BUFFERS; k++) {
    CHECK(weft_free(p.din[k], s[0]));
    CHECK(weft_free(p.dout[k], s[0]));
  }
  CHECK(weft_stream_synchronize(s[0]));
  ((module_unload_fn)driver("cuModuleUnload"))(module);
  host_free(in, in_pinned);
  host_free(p.out, out_pinned);
  CHECK(weft_runtime_release(p.rt));
  return status;
}
