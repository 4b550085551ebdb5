/* Probe (asserts nothing): what a use costs when another thread uses weft at the same time on a
 * stream of its own. Each of T threads (1, then 2) loops weft_use_begin + weft_use_end of one
 * block of its own on a pool stream of its own (no edge, lazy records: no driver call in the
 * loop), on runtime 0 or, with DEVICES=2, on runtime t % 2. Prints ns per use per thread: with no
 * sharing, 2 threads on 2 cores take what 1 takes; the difference is what threads pay for what
 * they share: weft's process-wide state (its lock, the live domain's lines) or the machine's
 * (two CPUs of one core: bench/data/h200x2-cac6634/thread_uses tells them apart).
 * With GAP_NS, each thread works that long on its own between uses (as a thread per rank spends
 * about 10 us in NCCL between all-reduces) and only the uses are timed: what a use costs when
 * the lines it shares were last written by the other thread, with the lock seldom contended.
 * PROBE_CPUS="a,b" pins thread 0 to CPU a and thread 1 to CPU b (the same socket, or two).
 * PROBE_CONTROL=1 makes thread 1 run its loop without the uses (its gaps only): a control, what
 * thread 0 pays then for a second thread that shares nothing of weft's.
 *   probe_thread_uses [USES] [GAP_NS]   (WEFT_DRIVER=sim works: the loop makes no driver call) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "weft/weft.h"

typedef struct worker {
  weft_stream_t *s;
  weft_block_t b;
  unsigned n;
  double gap;
  int cpu;     /* -1: not pinned */
  bool idle;   /* the gaps only, no use (PROBE_CONTROL) */
  pthread_barrier_t *start;
  double ns;
} worker_t;

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void *loop(void *arg) {
  worker_t *w = arg;
  weft_access_t a = {w->b, WEFT_READ_WRITE};
  if (w->cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(w->cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) abort();
  }
  pthread_barrier_wait(w->start);
  double t0 = now_ns(), in = 0;
  for (unsigned i = 0; i < w->n; i++) {
    double u0 = w->gap > 0 ? now_ns() : 0;
    if (!w->idle && (weft_use_begin(w->s, &a, 1) != WEFT_OK || weft_use_end(w->s, &a, 1) != WEFT_OK)) abort();
    if (w->gap > 0) {
      double u1 = now_ns();
      in += u1 - u0;
      while (now_ns() - u1 < w->gap) {
      }
    }
  }
  w->ns = (w->gap > 0 ? in : now_ns() - t0) / w->n;
  return NULL;
}

int main(int argc, char **argv) {
  unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 2000000;
  double gap = argc > 2 ? atof(argv[2]) : 0;
  int devices = getenv("DEVICES") != NULL ? atoi(getenv("DEVICES")) : 1;
  int cpu[2] = {-1, -1};
  if (getenv("PROBE_CPUS") != NULL && sscanf(getenv("PROBE_CPUS"), "%d,%d", &cpu[0], &cpu[1]) != 2)
    return printf("PROBE_CPUS: want \"a,b\"\n"), 2;
  weft_runtime_t *rt[2] = {NULL, NULL};
  for (int d = 0; d < devices; d++)
    if (weft_runtime_get(d, NULL, &rt[d]) != WEFT_OK) return printf("runtime %d: %s\n", d, weft_last_error()), 0;
  worker_t w[2];
  for (unsigned t = 0; t < 2; t++) {
    weft_runtime_t *r = rt[t % (unsigned)devices];
    if (weft_stream_get(r, 2 + t, &w[t].s) != WEFT_OK || weft_alloc(r, 256, w[t].s, "probe", &w[t].b) != WEFT_OK)
      return printf("setup: %s\n", weft_last_error()), 0;
    w[t].n = n;
    w[t].gap = gap;
    w[t].cpu = cpu[t];
    w[t].idle = t == 1 && getenv("PROBE_CONTROL") != NULL;
  }
  for (unsigned threads = 1; threads <= 2; threads++)
    for (int round = 0; round < 3; round++) {
      pthread_barrier_t start;
      pthread_barrier_init(&start, NULL, threads);
      pthread_t th[2];
      for (unsigned t = 0; t < threads; t++) {
        w[t].start = &start;
        pthread_create(&th[t], NULL, loop, &w[t]);
      }
      for (unsigned t = 0; t < threads; t++) pthread_join(th[t], NULL);
      pthread_barrier_destroy(&start);
      printf("devices %d, threads %u%s, gap %.0f ns, cpus %d,%d, round %d: ns per use", devices, threads,
             threads > 1 && w[1].idle ? " (thread 1 without uses)" : "", gap, cpu[0], threads > 1 ? cpu[1] : -1, round);
      for (unsigned t = 0; t < threads; t++) printf(" %.1f", w[t].ns);
      printf("\n");
    }
  return 0;
}
