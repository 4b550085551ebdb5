/* Probe (asserts nothing): what a use costs when another thread uses weft at the same time on a
 * stream of its own. Each of T threads (1, then 2) loops weft_use_begin + weft_use_end of one
 * block of its own on a pool stream of its own (no edge, lazy records: no driver call in the
 * loop), on runtime 0 or, with DEVICES=2, on runtime t % 2. Prints ns per use per thread: with no
 * sharing, 2 threads on 2 cores take what 1 takes; the difference is what threads pay for weft's
 * process-wide state (its lock, the live domain's busy mask and counters, lanes sharing lines).
 *   probe_thread_uses [USES]   (WEFT_DRIVER=sim works: the loop makes no driver call) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "weft/weft.h"

typedef struct worker {
  weft_stream_t *s;
  weft_block_t b;
  unsigned n;
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
  pthread_barrier_wait(w->start);
  double t0 = now_ns();
  for (unsigned i = 0; i < w->n; i++)
    if (weft_use_begin(w->s, &a, 1) != WEFT_OK || weft_use_end(w->s, &a, 1) != WEFT_OK) abort();
  w->ns = (now_ns() - t0) / w->n;
  return NULL;
}

int main(int argc, char **argv) {
  unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 2000000;
  int devices = getenv("DEVICES") != NULL ? atoi(getenv("DEVICES")) : 1;
  weft_runtime_t *rt[2] = {NULL, NULL};
  for (int d = 0; d < devices; d++)
    if (weft_runtime_get(d, NULL, &rt[d]) != WEFT_OK) return printf("runtime %d: %s\n", d, weft_last_error()), 0;
  worker_t w[2];
  for (unsigned t = 0; t < 2; t++) {
    weft_runtime_t *r = rt[t % (unsigned)devices];
    if (weft_stream_get(r, 2 + t, &w[t].s) != WEFT_OK || weft_alloc(r, 256, w[t].s, "probe", &w[t].b) != WEFT_OK)
      return printf("setup: %s\n", weft_last_error()), 0;
    w[t].n = n;
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
      printf("devices %d, threads %u, round %d: ns per use", devices, threads, round);
      for (unsigned t = 0; t < threads; t++) printf(" %.1f", w[t].ns);
      printf("\n");
    }
  return 0;
}
