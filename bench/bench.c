/* weft_bench: every benchmark of issue 7 in one run, each weft figure next to its raw-driver
 * baseline from the same run.
 *
 *   weft_bench [--quick] [section ...]     sections: alloc tracker waits replay pipeline comm comm_procs dp curves
 *                                          (default all)
 *
 * On a GPU (WEFT_DRIVER unset) the whole run takes well under a minute. On the simulator
 * (WEFT_DRIVER=sim) counts are scaled down and every table says the figures are not performance
 * numbers: that run proves the harness works (CI runs it with --quick as //bench:bench_smoke).
 * CSV goes to $OUT/bench.csv when OUT is set (the GPU machine's result folder), else ./bench.csv.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "examples/pipeline/pipeline_kernels.h"
#include "examples/pipeline/pipeline_kernels_sim.h"

typedef struct section {
  const char *name;
  void (*run)(bench_t *b);
} section_t;

/* In the order issue 7 lists them. */
static const section_t sections[] = {
    {"alloc", bench_alloc},
    {"tracker", bench_tracker},
    {"waits", bench_waits},
    {"replay", bench_replay},
    {"pipeline", bench_pipeline},
    {"comm", bench_comm},
    {"comm_procs", bench_comm_procs},
    {"dp", bench_dp},
    {"curves", bench_curves},
};
#define NSECTIONS (sizeof sections / sizeof sections[0])

static void usage(void) {
  fprintf(stderr, "usage: weft_bench [--quick] [section ...]\nsections:");
  for (size_t i = 0; i < NSECTIONS; i++) fprintf(stderr, " %s", sections[i].name);
  fprintf(stderr, "\n");
  exit(2);
}

static FILE *open_csv(char *path, size_t cap) {
  const char *out = getenv("OUT");
  snprintf(path, cap, "%s%sbench.csv", out && *out ? out : "", out && *out ? "/" : "");
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    perror(path);
    exit(1);
  }
  fprintf(f, "section,row,metric,unit,baseline,x,rep,value,machine\n");
  return f;
}

/* The primary context of device 0, current on this thread: raw baselines run in the same context
 * as weft (which retains the same primary context), and retaining it for the whole run keeps it
 * alive between the sections' runtimes. */
static void open_context(bench_t *b) {
  CUdevice dev;
  BENCH_CU(b->drv->cuDeviceGet(&dev, 0));
  BENCH_CU(b->drv->cuDevicePrimaryCtxRetain(&b->ctx, dev));
  BENCH_CU(b->drv->cuCtxSetCurrent(b->ctx));
}

static void print_header(const bench_t *b, const weft_driver_info_t *info) {
  char name[128] = "?";
  CUdevice dev;
  if (b->drv->cuDeviceGet(&dev, 0) == CUDA_SUCCESS) (void)b->drv->cuDeviceGetName(name, sizeof name, dev);
  char date[32];
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
  printf("# weft benchmarks\n\n");
  printf("- device: %s\n- driver: %s, CUDA %d.%d\n- date: %s\n- weft: %u.%u.%u\n- counts: %s, median of %u runs\n\n",
         b->sim ? "the CPU simulator" : name, info->path, info->version / 1000, info->version % 1000 / 10, date,
         WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH,
         b->quick ? "--quick" : b->sim ? "scaled down for the simulator" : "full", b->reps);
  if (b->sim)
    printf("> **simulator: not performance numbers.** The simulator runs the driver on the CPU; these "
           "tables show that the harness works, not how fast weft is. Run on a GPU for figures.\n\n");
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--comm-child") == 0) return bench_comm_child(argc, argv);
  bench_t b = {0};
  int want[NSECTIONS] = {0}, any = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      b.quick = 1;
      continue;
    }
    size_t k;
    for (k = 0; k < NSECTIONS && strcmp(argv[i], sections[k].name) != 0; k++) {}
    if (k == NSECTIONS) usage();
    want[k] = any = 1;
  }
  weft_driver_info_t info;
  BENCH_WEFT(weft_driver_info(&info));
  BENCH_WEFT(weft__driver_get(&b.drv));
  b.sim = info.is_simulator;
  b.reps = b.quick ? 3 : b.sim ? 3 : 9;
  open_context(&b);
  pipeline_kernels_register_sim();
  BENCH_CU(b.drv->cuModuleLoadData(&b.module, pipeline_kernels_fatbin));
  BENCH_CU(b.drv->cuModuleGetFunction(&b.lcg, b.module, "pipeline_transform"));
  char csv_path[512];
  b.csv = open_csv(csv_path, sizeof csv_path);
  print_header(&b, &info);
  uint64_t start = bench_now_ns();
  for (size_t k = 0; k < NSECTIONS; k++)
    if (!any || want[k]) sections[k].run(&b);
  printf("Total %.1f s. CSV: %s\n", (double)(bench_now_ns() - start) / 1e9, csv_path);
  fclose(b.csv);
  BENCH_CU(b.drv->cuModuleUnload(b.module));
  CUdevice dev;
  BENCH_CU(b.drv->cuDeviceGet(&dev, 0));
  BENCH_CU(b.drv->cuDevicePrimaryCtxRelease(dev));
  return 0;
}

/* ---- the floor of a tracker (bench.h) ---- */

typedef struct floor_hist {
  unsigned wlane;
  uint64_t wtick, rtick[2];
} floor_hist_t;
static struct {
  pthread_mutex_t m;
  floor_hist_t h[4];
  uint64_t tick[2]; /* each stream's newest tick */
  uint64_t seen[2]; /* the other stream's tick each stream waited for */
} g_floor = {.m = PTHREAD_MUTEX_INITIALIZER};

void bench_floor_reset(void) {
  pthread_mutex_lock(&g_floor.m);
  memset(g_floor.h, 0, sizeof g_floor.h);
  memset(g_floor.tick, 0, sizeof g_floor.tick);
  memset(g_floor.seen, 0, sizeof g_floor.seen);
  pthread_mutex_unlock(&g_floor.m);
}

bool bench_floor_use(unsigned side, int out, int in, int holds) {
  pthread_mutex_lock(&g_floor.m);
  uint64_t k = ++g_floor.tick[side], need = 0;
  const floor_hist_t *ho = &g_floor.h[out];
  if (ho->wlane != side && ho->wtick > need) need = ho->wtick;
  if (ho->rtick[side ^ 1] > need) need = ho->rtick[side ^ 1];
  if (in >= 0 && g_floor.h[in].wlane != side && g_floor.h[in].wtick > need) need = g_floor.h[in].wtick;
  bool wait = need > g_floor.seen[side];
  if (wait) g_floor.seen[side] = g_floor.tick[side ^ 1];
  g_floor.h[out] = (floor_hist_t){side, k, {0, 0}};
  if (in >= 0) g_floor.h[in].rtick[side] = k;
  if (holds == 2) { /* weft's shape: the work is enqueued between two holds */
    pthread_mutex_unlock(&g_floor.m);
    pthread_mutex_lock(&g_floor.m);
  }
  pthread_mutex_unlock(&g_floor.m);
  return wait;
}
