/* Writes a memory snapshot and a timeline trace of a small 3-stream program on the simulator, for
 * the viewer test (test_viewer.sh): <dir>/snapshot.json, <dir>/trace.json, and <dir>/expect.txt
 * with what the viewer must draw (segments, blocks inside segments, wait rows). */
#include <stdio.h>
#include <string.h>

#include "tests/util/testutil.h"

#define TRY(x)                                                                                    \
  do {                                                                                            \
    weft_status_t st_ = (x);                                                                      \
    if (st_ != WEFT_OK) {                                                                         \
      fprintf(stderr, "%s: %s: %s\n", #x, weft_status_name(st_), weft_last_error());              \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 2) return fprintf(stderr, "usage: make_samples DIR\n"), 2;
  char path[1024];
  tu_env_t env;
  if (tu_init(&env, NULL) != 0) return 1;
  snprintf(path, sizeof path, "%s/trace.json", argv[1]);
  setenv("WEFT_TRACE_DEVICE", "1", 1); /* device slices too: the timeline's overlap line */
  TRY(weft_trace_start(path));
  weft_stream_t *s[3];
  for (unsigned i = 0; i < 3; i++) TRY(weft_stream_get(env.rt, i, &s[i]));
  weft_block_t none = {0}, a, b, c, d;
  TRY(weft_alloc(env.rt, 4096, s[0], "weights", &a));
  TRY(weft_alloc(env.rt, 8192, s[1], "activations", &b));
  TRY(weft_alloc(env.rt, 2048, s[2], "grads", &c));
  TRY(weft_alloc(env.rt, 1024, s[0], "tmp", &d));
  TRY(tu_fill(&env, s[0], a, 1024, 1));
  TRY(tu_combine(&env, s[1], b, none, a, none, none, 1024, 2)); /* waits: 1 <- 0 */
  TRY(tu_combine(&env, s[2], c, none, b, none, none, 512, 3));  /* waits: 2 <- 1 */
  TRY(weft_free(d, s[0]));
  TRY(weft_trace_stop());
  snprintf(path, sizeof path, "%s/snapshot.json", argv[1]);
  FILE *f = fopen(path, "w");
  if (f == NULL) return 1;
  TRY(weft_memory_snapshot(env.rt, f));
  fclose(f);
  weft_counters_t k;
  TRY(weft_runtime_counters(env.rt, &k));
  snprintf(path, sizeof path, "%s/expect.txt", argv[1]);
  f = fopen(path, "w");
  if (f == NULL) return 1;
  fprintf(f, "blocks 3\nwaits %llu\n", (unsigned long long)k.waits_issued);
  fclose(f);
  TRY(weft_free(a, s[2]));
  TRY(weft_free(b, s[2]));
  TRY(weft_free(c, s[2]));
  tu_fini(&env);
  return 0;
}
