/* host_instr: each of weft's hot host paths, alone, in a loop of its own function, so that
 * callgrind can count the instructions of one path (tools/host_instr.sh runs it once per path
 * with --toggle-collect=path_<name> and divides by the loop's count). Instructions are not time,
 * but they are exact and repeatable on any CPU machine: a change to a hot path shows its effect
 * here before a GPU run measures it (bench/README.md, "Instructions per operation").
 *
 *   host_instr PATH [N]      PATH: use1 use4 use16 eager1 eager16 edge launch alloc pool torch torch0 cpair
 *                            cpair0 group
 *                            ranks (and evict: HOST_INSTR_EVICT's eviction alone, for HOST_INSTR_TIME)
 *
 * Runs on the simulator (WEFT_DRIVER=sim; `group` and `ranks` also WEFT_NCCL=sim WEFT_SIM_DEVICES=2); the
 * simulator's own instructions are left out by the script (it counts the objects of this binary
 * only). `group` is bench/bench_comm.c's one-thread group: one weft group of one all-reduce per
 * device, 1 MiB each; `ranks` the same all-reduces as a thread per rank posts them (a call per
 * device, no group: exact waits), from one thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/core/driver.h"
#include "lib/runtime/runtime.h"
#include "lib/torch/weft_torch.h"
#include "weft/weft.h"

#define CHECK(call)                                                                    \
  do {                                                                                 \
    weft_status_t st_ = (call);                                                        \
    if (st_ != WEFT_OK) {                                                              \
      fprintf(stderr, "host_instr: %s: %s\n", #call, weft_last_error());              \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

#define BLOCKS 16

/* HOST_INSTR_EVICT=bytes: after every operation, write that many bytes of a buffer of its own
 * (evict), as a driver call beside each use may do on a GPU host: the next operation then finds
 * weft's metadata out of the first-level cache. tools/host_instr.sh counts each path's D1
 * misses this way ("cold lines", a footprint measure: tools/host_instr_time.sh found no time in
 * them on two CPUs, bench/README.md). evict is left out of the counts (not a path_ function). */
static size_t g_evict;
static unsigned char *g_evict_buf;

__attribute__((noinline)) static void evict(void) {
  if (g_evict == 0) return;
  for (size_t i = 0; i < g_evict; i += 64) g_evict_buf[i]++;
}

/* HOST_INSTR_TIME=1: the measured round's time per operation, on stderr. On the simulator that
 * is weft's host work and the simulator's, on whatever CPU runs it: with and without
 * HOST_INSTR_EVICT, and `host_instr evict N` (the eviction alone), it tells what cold lines cost
 * on that CPU (tools/host_instr_time.sh). */
static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void report(const char *path, unsigned n, uint64_t t0) {
  if (getenv("HOST_INSTR_TIME") != NULL) fprintf(stderr, "%s %.1f ns/op\n", path, (double)(now_ns() - t0) / n);
}

typedef struct ctx {
  weft_runtime_t *rt;
  weft_stream_t *s[5]; /* s[0], s[1] wait on each other (eager); s[2]: nobody waits on it (lazy);
                        s[3], s[4]: the eager step's (path_step) */
  weft_block_t blk[BLOCKS], own[BLOCKS];
  weft_access_t acc[BLOCKS];
  weft_resource_t *res;
  unsigned n;
} ctx_t;

/* k accesses, a quarter written (at least one), as bench/bench_tracker.c's rows. */
static void accesses(ctx_t *c, const weft_block_t *b, size_t k) {
  size_t writes = k / 4 ? k / 4 : 1;
  for (size_t i = 0; i < k; i++) c->acc[i] = (weft_access_t){b[i], i < writes ? WEFT_WRITE : WEFT_READ};
}

__attribute__((noinline)) static void path_use(ctx_t *c, weft_stream_t *s, size_t k) {
  for (unsigned i = 0; i < c->n; i++) {
    CHECK(weft_use_begin(s, c->acc, k));
    CHECK(weft_use_end(s, c->acc, k));
    evict();
  }
}

__attribute__((noinline)) static void path_edge(ctx_t *c) {
  for (unsigned i = 0; i < c->n; i++) {
    weft_stream_t *s = c->s[i & 1];
    CHECK(weft_use_begin(s, c->acc, 1));
    CHECK(weft_use_end(s, c->acc, 1));
    evict();
  }
}

static weft_status_t nothing(weft_stream_t *s, void *arg) {
  (void)s;
  (void)arg;
  return WEFT_OK;
}

/* One kernel of bench/bench_replay.c's eager step (without the kernel's driver call): operation i
 * writes one of two blocks and reads the other, on s[3] for ten operations, then on s[4] for ten,
 * so every tenth needs a wait on the other stream. */
__attribute__((noinline)) static void path_step(ctx_t *c) {
  for (unsigned i = 0; i < c->n; i++) {
    weft_access_t acc[2] = {{c->blk[i % 2], WEFT_WRITE}, {c->blk[(i + 1) % 2], WEFT_READ}};
    CHECK(weft__use_run(c->s[3 + (i / 10) % 2], acc, 2, "instr", nothing, NULL));
    evict();
  }
}

/* A use with its work (the shape of weft_launch, without the kernel's driver call). */
__attribute__((noinline)) static void path_run(ctx_t *c, weft_stream_t *s, size_t k) {
  for (unsigned i = 0; i < c->n; i++) {
    CHECK(weft__use_run(s, c->acc, k, "instr", nothing, NULL));
    evict();
  }
}

__attribute__((noinline)) static void path_alloc(ctx_t *c) {
  for (unsigned i = 0; i < c->n; i++) {
    weft_block_t b;
    CHECK(weft_alloc(c->rt, 1u << 20, c->s[2], "instr", &b));
    CHECK(weft_free(b, c->s[2]));
    evict();
  }
}

__attribute__((noinline)) static void path_pool(ctx_t *c) {
  for (unsigned i = 0; i < c->n; i++) {
    CUdeviceptr p;
    CHECK(weft_resource_allocate(c->res, 1u << 20, c->s[2], "", &p));
    CHECK(weft_resource_deallocate(c->res, p, 1u << 20, c->s[2], ""));
    evict();
  }
}

__attribute__((noinline)) static void path_torch(ctx_t *c, CUstream raw) {
  for (unsigned i = 0; i < c->n; i++) {
    void *p = weft_torch_alloc(1 << 20, 0, raw);
    if (p == NULL) {
      fprintf(stderr, "host_instr: weft_torch_alloc: %s\n", weft_torch_last_error());
      exit(1);
    }
    weft_torch_free(p, 1 << 20, 0, raw);
    evict();
  }
}

/* weft_alloc + weft_block_ptr + weft_free on the adapter's stream, adopted by the adapter's
 * runtime: bench/torch_pair.c's pair without the adapter (issue 17's "through the default stack"). */
__attribute__((noinline)) static void path_cpair(weft_runtime_t *rt, weft_stream_t *s, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    weft_block_t b;
    CUdeviceptr p;
    CHECK(weft_alloc(rt, 1 << 20, s, "torch", &b));
    CHECK(weft_block_ptr(b, &p));
    CHECK(weft_free(b, s));
    evict();
  }
}

/* One thread, one weft group of an all-reduce per device. */
__attribute__((noinline)) static void path_group(unsigned n, weft_comm_t *const *comm, const weft_block_t *buf) {
  for (unsigned i = 0; i < n; i++) {
    CHECK(weft_comm_group_begin());
    for (int r = 0; r < 2; r++)
      CHECK(weft_all_reduce(comm[r], buf[r], 0, buf[r], 0, 1u << 18, WEFT_FLOAT32, WEFT_SUM, NULL));
    CHECK(weft_comm_group_end());
    evict();
  }
}

/* The same all-reduces as a thread per rank posts them: a call per device, no group (each
 * makes its stream's waits exact: weft.h, "Exact waits"). */
__attribute__((noinline)) static void path_ranks(unsigned n, weft_comm_t *const *comm, const weft_block_t *buf) {
  for (unsigned i = 0; i < n; i++) {
    for (int r = 0; r < 2; r++)
      CHECK(weft_all_reduce(comm[r], buf[r], 0, buf[r], 0, 1u << 18, WEFT_FLOAT32, WEFT_SUM, NULL));
    evict();
  }
}

static int group(unsigned n, bool grouped) {
  weft_runtime_t *rt[2];
  weft_comm_t *comm[2];
  weft_block_t buf[2];
  for (int r = 0; r < 2; r++) CHECK(weft_runtime_get(r, NULL, &rt[r]));
  CHECK(weft_comm_init_all(rt, 2, comm));
  for (int r = 0; r < 2; r++) {
    CHECK(weft_alloc(rt[r], 4u << 20, weft_comm_stream(comm[r]), "instr", &buf[r]));
    CHECK(weft_memset32(weft_comm_stream(comm[r]), buf[r], 0, 0, 4u << 20));
  }
  void (*path)(unsigned, weft_comm_t *const *, const weft_block_t *) = grouped ? path_group : path_ranks;
  path(n / 10 ? n / 10 : 1, comm, buf); /* warm-up round */
  for (int r = 0; r < 2; r++) CHECK(weft_stream_synchronize(weft_comm_stream(comm[r])));
  uint64_t t0 = now_ns();
  path(n, comm, buf);
  report(grouped ? "group" : "ranks", n, t0);
  for (int r = 0; r < 2; r++) {
    CHECK(weft_stream_synchronize(weft_comm_stream(comm[r])));
    CHECK(weft_free(buf[r], weft_comm_stream(comm[r])));
    CHECK(weft_comm_destroy(comm[r]));
  }
  for (int r = 0; r < 2; r++) CHECK(weft_runtime_release(rt[r]));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: host_instr PATH [N]\n");
    return 2;
  }
  const char *path = argv[1];
  const char *ev = getenv("HOST_INSTR_EVICT");
  g_evict = ev != NULL ? (size_t)strtoull(ev, NULL, 10) : 0;
  if (g_evict != 0 && (g_evict_buf = calloc(1, g_evict)) == NULL) return 1;
  ctx_t c = {.n = argc > 2 ? (unsigned)atoi(argv[2]) : 10000};
  if (strcmp(path, "evict") == 0) { /* the eviction alone, to subtract */
    uint64_t t0 = now_ns();
    for (unsigned i = 0; i < c.n; i++) evict();
    report(path, c.n, t0);
    return 0;
  }
  if (strcmp(path, "group") == 0) return group(c.n, true);
  if (strcmp(path, "ranks") == 0) return group(c.n, false);
  if (strcmp(path, "torch") == 0 || strcmp(path, "torch0") == 0 || strcmp(path, "cpair") == 0 ||
      strcmp(path, "cpair0") == 0) {
    /* torch0, cpair0: on the legacy stream (PyTorch's default stream), as PyTorch passes it (NULL). */
    bool legacy = path[5] == '0';
    /* The adapter makes its own runtime; the stream is one PyTorch would pass (weft adopts it). */
    const weft__driver_t *d;
    CUcontext ctx;
    CUstream raw = NULL;
    CHECK(weft__driver_get(&d));
    if (d->cuInit(0) != CUDA_SUCCESS || d->cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        d->cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        (!legacy && d->cuStreamCreateWithPriority(&raw, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS)) {
      fprintf(stderr, "host_instr: no stream for the adapter\n");
      return 1;
    }
    unsigned n = c.n;
    c.n = n / 10 ? n / 10 : 1; /* warm-up round: stream adoption, the pool's first chunk */
    path_torch(&c, raw);
    c.n = n;
    if (path[0] == 'c') { /* the adapter's runtime and stream, without the adapter */
      weft_runtime_t *rt;
      weft_stream_t *s;
      CHECK(weft_runtime_get(0, NULL, &rt));
      CHECK(weft_stream_adopt(rt, raw, &s));
      path_cpair(rt, s, n / 10 ? n / 10 : 1);
      uint64_t t0 = now_ns();
      path_cpair(rt, s, n);
      report(path, n, t0);
      return 0;
    }
    uint64_t t0 = now_ns();
    path_torch(&c, raw);
    report(path, n, t0);
    return 0;
  }
  weft_options_t o = weft_options_default();
  o.high_priority_streams = 0;
  o.memory = strcmp(path, "alloc") == 0 ? WEFT_MEMORY_ASYNC : WEFT_MEMORY_POOL;
  CHECK(weft_runtime_get(0, &o, &c.rt));
  for (unsigned k = 0; k < 5; k++) CHECK(weft_stream_get(c.rt, k, &c.s[k]));
  c.res = weft_runtime_resource(c.rt);
  for (int i = 0; i < BLOCKS; i++) CHECK(weft_alloc(c.rt, 256, c.s[0], "instr", &c.blk[i]));
  for (int i = 0; i < BLOCKS; i++) CHECK(weft_alloc(c.rt, 256, c.s[2], "instr.own", &c.own[i]));
  /* s[0] and s[1] each wait late on the other once (for a use that a later one joined: lazy
   * records): they record eagerly from then on. */
  static const unsigned on[] = {0, 0, 1, 1, 0}, which[] = {0, 1, 0, 1, 0};
  for (unsigned k = 0; k < 5; k++) {
    weft_access_t w = {c.blk[which[k]], WEFT_WRITE};
    CHECK(weft_use_begin(c.s[on[k]], &w, 1));
    CHECK(weft_use_end(c.s[on[k]], &w, 1));
  }
  CHECK(weft_runtime_synchronize(c.rt));
  unsigned n = c.n;
  c.n = n / 10 ? n / 10 : 1; /* warm-up round: whatever grows on first use grows now */
  for (int round = 0; round < 2; round++) {
    uint64_t t0 = now_ns();
    if (strncmp(path, "use", 3) == 0) {
      size_t k = (size_t)atoi(path + 3);
      accesses(&c, c.own, k);
      path_use(&c, c.s[2], k);
    } else if (strncmp(path, "eager", 5) == 0) {
      size_t k = (size_t)atoi(path + 5);
      accesses(&c, c.blk, k);
      path_use(&c, c.s[0], k);
    } else if (strcmp(path, "edge") == 0) {
      accesses(&c, c.blk, 1);
      path_edge(&c);
    } else if (strcmp(path, "launch") == 0) {
      accesses(&c, c.own, 4);
      path_run(&c, c.s[2], 4);
    } else if (strcmp(path, "step") == 0) {
      path_step(&c);
    } else if (strcmp(path, "alloc") == 0) {
      path_alloc(&c);
    } else if (strcmp(path, "pool") == 0) {
      path_pool(&c);
    } else {
      fprintf(stderr, "host_instr: unknown path %s\n", path);
      return 2;
    }
    if (round == 1) report(path, c.n, t0);
    CHECK(weft_runtime_synchronize(c.rt));
    c.n = n;
  }
  for (int i = 0; i < BLOCKS; i++) CHECK(weft_free(c.blk[i], c.s[0]));
  for (int i = 0; i < BLOCKS; i++) CHECK(weft_free(c.own[i], c.s[2]));
  CHECK(weft_runtime_release(c.rt));
  return 0;
}
