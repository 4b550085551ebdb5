/* Replays a scale trace (WEFT_TEST_TRACE=0 output of //tests/scale:scale_quick, the "op N: "
 * lines) against weft, for shrinking a failure to a short reproducer (tools/scale_shrink.py).
 * Lines that no longer make sense after lines were deleted (a freed slot, a missing graph, a
 * status other than OK) are skipped. Exit status: 0 no race and no wrong status, 1 races,
 * 3 bad usage. Prints the races found (first 3) and the count.
 *   replay TRACE          runtime options from WEFT_* (WEFT_EVENT_RING, WEFT_OUTPUT_POLICY)
 *   WEFT_REPLAY_VERBOSE=1 prints each line executed and each skipped line's reason
 *   WEFT_REPLAY_ERROR=S   a call failing with a message containing S fails the replay (exit 1)
 *                         instead of skipping its line (for shrinking unexpected statuses);
 *                         set but empty: every failing call fails the replay (regression tests)
 * Lines not starting with "op " (comments) are ignored. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/util/testutil.h"

enum { SLOTS = 256, INNERS = 64, GRAPHS = 4096, STREAMS = 8 };

static tu_env_t env;
static weft_stream_t *st[STREAMS];
static weft_block_t slot[SLOTS], inner[INNERS];
static weft_graph_t *graph[GRAPHS];
static weft_exec_t *exec_[GRAPHS];
static int cap_origin = -1;
static weft_graph_t *last_graph;
static int verbose;
static long skipped;
static unsigned hostbuf[64];

static weft_block_t ref(const char *t, int *ok) {
  if (strcmp(t, "-") == 0) return (weft_block_t){0};
  if (t[0] == 'i') {
    int k = atoi(t + 1);
    if (k < 0 || k >= INNERS || inner[k].rec == NULL) *ok = 0;
    return k >= 0 && k < INNERS ? inner[k] : (weft_block_t){0};
  }
  int k = atoi(t);
  if (k < 0 || k >= SLOTS || slot[k].rec == NULL) *ok = 0;
  return k >= 0 && k < SLOTS ? slot[k] : (weft_block_t){0};
}

static void skip(const char *line, const char *why) {
  skipped++;
  if (verbose) fprintf(stderr, "  skipped (%s): %s", why, line);
}

static const char *fail_on; /* WEFT_REPLAY_ERROR: a status message containing this fails */

static int ok_status(weft_status_t r, const char *line) {
  if (r == WEFT_OK) return 1;
  char why[512];
  snprintf(why, sizeof why, "%s: %s", weft_status_name(r), weft_last_error());
  if (fail_on != NULL && (*fail_on == '\0' || strstr(why, fail_on) != NULL)) {
    printf("replay: error %s at: %s", why, line);
    fflush(stdout);
    _Exit(1);
  }
  skip(line, why);
  return 0;
}

static int is_valid_stream(unsigned s) { return s < STREAMS; }

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: replay TRACE\n");
    return 3;
  }
  FILE *f = fopen(argv[1], "r");
  if (f == NULL) {
    perror(argv[1]);
    return 3;
  }
  verbose = getenv("WEFT_REPLAY_VERBOSE") != NULL;
  fail_on = getenv("WEFT_REPLAY_ERROR");
  if (tu_init(&env, NULL) != 0) return 3;
  for (unsigned i = 0; i < STREAMS; i++)
    if (weft_stream_get(env.rt, i, &st[i]) != WEFT_OK) return 3;
  char line[1024];
  long n = 0;
  while (fgets(line, sizeof line, f)) {
    const char *l = line;
    if (strncmp(l, "op ", 3) == 0) {
      const char *c = strstr(l, ": ");
      if (c == NULL) continue;
      l = c + 2;
    } else {
      continue;
    }
    n++;
    if (verbose) fprintf(stderr, "%s", l);
    unsigned s, size, k, nn;
    int i;
    long g;
    char a[5][16], mem[32];
    if (strstr(l, "BUSY expected") || strstr(l, "CAPTURE expected") || strstr(l, "on purpose") ||
        strncmp(l, "stream_query", 12) == 0 || strstr(l, " destroyed")) {
      continue;
    } else if (sscanf(l, "alloc slot %d (%u elements) on stream %u", &i, &size, &s) == 3) {
      if (i < 0 || i >= SLOTS || slot[i].rec != NULL || !is_valid_stream(s)) { skip(line, "slot"); continue; }
      weft_block_t b;
      if (ok_status(weft_alloc(env.rt, (size_t)size * 4, st[s], "scale", &b), line)) slot[i] = b;
    } else if (sscanf(l, "free slot %d on stream %u", &i, &s) == 2) {
      if (i < 0 || i >= SLOTS || slot[i].rec == NULL || !is_valid_stream(s)) { skip(line, "slot"); continue; }
      if (ok_status(weft_free(slot[i], st[s]), line)) slot[i] = (weft_block_t){0};
    } else if (sscanf(l, "slot %d auto-freed", &i) == 1) {
      if (i >= 0 && i < SLOTS) slot[i] = (weft_block_t){0};
    } else if (sscanf(l, "%*s fill slot %15s n %u on stream %u", a[0], &nn, &s) == 3) {
      int ok = 1;
      weft_block_t d = ref(a[0], &ok);
      if (!ok || !is_valid_stream(s)) { skip(line, "block"); continue; }
      ok_status(tu_fill(&env, st[s], d, nn, 12345), line);
    } else if (sscanf(l, "%*s combine out %15[^,],%15s in %15[^,],%15[^,],%15s n %u on stream %u", a[0], a[1], a[2], a[3],
                      a[4], &nn, &s) == 7) {
      int ok = 1;
      weft_block_t b[5];
      for (int j = 0; j < 5; j++) b[j] = ref(a[j], &ok);
      if (!ok || !is_valid_stream(s) || b[0].rec == NULL || b[2].rec == NULL) { skip(line, "block"); continue; }
      ok_status(tu_combine(&env, st[s], b[0], b[1], b[2], b[3], b[4], nn, 7), line);
    } else if (sscanf(l, "read slot %d (%u elements) to the host on stream %u", &i, &nn, &s) == 3) {
      if (i < 0 || i >= SLOTS || slot[i].rec == NULL || !is_valid_stream(s)) { skip(line, "slot"); continue; }
      size_t bytes;
      if (weft_block_size(slot[i], &bytes) != WEFT_OK || nn * 4u > bytes) { skip(line, "size"); continue; }
      ok_status(weft_copy_from_block(st[s], hostbuf, slot[i], 0, (size_t)nn * 4), line);
    } else if (sscanf(l, "stream_synchronize %u", &s) == 1) {
      if (!is_valid_stream(s)) continue;
      ok_status(weft_stream_synchronize(st[s]), line);
    } else if (sscanf(l, "block_synchronize slot %d", &i) == 1) {
      if (i < 0 || i >= SLOTS || slot[i].rec == NULL) { skip(line, "slot"); continue; }
      ok_status(weft_block_synchronize(slot[i]), line);
    } else if (strncmp(l, "runtime_synchronize", 19) == 0) {
      ok_status(weft_runtime_synchronize(env.rt), line);
    } else if (sscanf(l, "capture_begin on stream %u (%31[^)])", &s, mem) == 2) {
      if (cap_origin >= 0 || !is_valid_stream(s)) { skip(line, "capture"); continue; }
      weft_capture_options_t o = weft_capture_options_default();
      o.memory = strcmp(mem, "private pool") == 0 ? WEFT_GRAPH_MEMORY_PRIVATE_POOL : WEFT_GRAPH_MEMORY_NODES;
      if (ok_status(weft_capture_begin(st[s], &o), line)) cap_origin = (int)s;
      memset(inner, 0, sizeof inner);
    } else if (sscanf(l, "capture_join stream %u", &s) == 1) {
      if (cap_origin < 0 || !is_valid_stream(s)) { skip(line, "capture"); continue; }
      ok_status(weft_capture_join(st[cap_origin], st[s]), line);
    } else if (sscanf(l, "captured alloc i%u (%u elements) on stream %u", &k, &size, &s) == 3) {
      if (k >= INNERS || !is_valid_stream(s)) { skip(line, "inner"); continue; }
      weft_block_t b;
      if (ok_status(weft_alloc(env.rt, (size_t)size * 4, st[s], "inner", &b), line)) inner[k] = b;
    } else if (sscanf(l, "captured free i%u on stream %u", &k, &s) == 2) {
      if (k >= INNERS || inner[k].rec == NULL || !is_valid_stream(s)) { skip(line, "inner"); continue; }
      if (ok_status(weft_free(inner[k], st[s]), line)) inner[k] = (weft_block_t){0};
    } else if (sscanf(l, "capture_end on stream %u", &s) == 1) {
      if (cap_origin < 0) { skip(line, "capture"); continue; }
      last_graph = NULL;
      weft_graph_t *gr;
      if (ok_status(weft_capture_end(st[cap_origin], &gr), line)) last_graph = gr;
      cap_origin = -1;
      memset(inner, 0, sizeof inner);
    } else if (sscanf(l, "instantiate graph %ld on stream %u", &g, &s) == 2) {
      if (g < 0 || g >= GRAPHS || last_graph == NULL || !is_valid_stream(s)) { skip(line, "graph"); continue; }
      weft_exec_t *e;
      if (ok_status(weft_graph_instantiate(last_graph, st[s], &e), line)) {
        graph[g] = last_graph;
        exec_[g] = e;
      }
      last_graph = NULL;
    } else if (sscanf(l, "launch graph %ld on stream %u", &g, &s) == 2) {
      if (g < 0 || g >= GRAPHS || exec_[g] == NULL || !is_valid_stream(s)) { skip(line, "graph"); continue; }
      ok_status(weft_exec_launch(exec_[g], st[s]), line);
    } else if (sscanf(l, "graph %ld output %u is slot %d", &g, &k, &i) == 3) {
      if (g < 0 || g >= GRAPHS || exec_[g] == NULL || i < 0 || i >= SLOTS) { skip(line, "graph"); continue; }
      weft_block_t b;
      if (weft_exec_output(exec_[g], k, &b) == WEFT_OK && b.rec != NULL) slot[i] = b;
      else skip(line, "no output");
    } else if (sscanf(l, "destroy exec of graph %ld", &g) == 1) {
      if (g < 0 || g >= GRAPHS || exec_[g] == NULL) { skip(line, "graph"); continue; }
      ok_status(weft_exec_destroy(exec_[g]), line);
      exec_[g] = NULL;
    } else {
      skip(line, "unknown");
    }
  }
  fclose(f);
  if (cap_origin >= 0) {
    weft_graph_t *gr;
    if (weft_capture_end(st[cap_origin], &gr) == WEFT_OK) last_graph = gr;
  }
  weft_status_t r = weft_runtime_synchronize(env.rt);
  uint64_t races = tu_races(&env);
  printf("replay: %ld lines, %ld skipped, final sync %s, races %" PRIu64 "\n", n, skipped, weft_status_name(r), races);
  if (races && env.sim) {
    weft_sim_race_t rr[3];
    size_t m = env.sim->races(rr, 3);
    for (size_t j = 0; j < m; j++)
      printf("  race: %zu bytes: %s %s / %s %s\n", rr[j].bytes, rr[j].first_writes ? "written by" : "read by",
             rr[j].first_desc, rr[j].second_writes ? "written by" : "read by", rr[j].second_desc);
  }
  fflush(stdout);
  _Exit(races ? 1 : r == WEFT_OK ? 0 : 2);
}
