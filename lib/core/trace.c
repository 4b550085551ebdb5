/* The timeline trace (trace.h) and its public calls (weft_trace_start / weft_trace_stop). */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/core/error.h"
#include "lib/core/trace.h"
#include "weft/weft.h"

_Atomic int weft__trace_active;

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER; /* a leaf: file writes only */
static FILE *trace_file;
static bool trace_first;                 /* no event written yet */
static uint64_t named[16];               /* bit s of named[device]: stream s has its track name */

uint64_t weft__trace_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

size_t weft__json_escape(char *buf, size_t *at, size_t cap, const char *s) {
  const unsigned char *c = (const unsigned char *)(s ? s : "");
  for (; *c != '\0' && *at + 7 < cap; c++) {
    if (*c == '"' || *c == '\\') {
      buf[(*at)++] = '\\';
      buf[(*at)++] = (char)*c;
    } else if (*c < 0x20) {
      *at += (size_t)snprintf(buf + *at, cap - *at, "\\u%04x", *c);
    } else {
      buf[(*at)++] = (char)*c;
    }
  }
  buf[*at] = '\0';
  return (size_t)(c - (const unsigned char *)(s ? s : ""));
}

/* One event line (the lock held). Names the stream's track the first time it appears. */
static void put(int device, unsigned stream, const char *event) {
  if (trace_file == NULL) return;
  if (device >= 0 && device < 16 && stream < 64 && !(named[device] >> stream & 1)) {
    named[device] |= 1ull << stream;
    fprintf(trace_file, "%s{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %u, \"args\": {\"name\": "
                        "\"stream %u\"}}",
            trace_first ? "" : ",\n", device, stream, stream);
    trace_first = false;
  }
  fprintf(trace_file, "%s%s", trace_first ? "" : ",\n", event);
  trace_first = false;
}

void weft__trace_slice(int device, unsigned stream, const char *name, uint64_t ts, uint64_t dur, const char *args_json) {
  if (!weft__trace_on()) return;
  char ev[2048];
  size_t at = (size_t)snprintf(ev, sizeof ev, "{\"ph\": \"X\", \"name\": \"");
  (void)weft__json_escape(ev, &at, sizeof ev - 200, name);
  snprintf(ev + at, sizeof ev - at, "\", \"pid\": %d, \"tid\": %u, \"ts\": %" PRIu64 ", \"dur\": %" PRIu64 "%s%s}",
           device, stream, ts, dur, args_json ? ", \"args\": " : "", args_json ? args_json : "");
  pthread_mutex_lock(&trace_lock);
  put(device, stream, ev);
  pthread_mutex_unlock(&trace_lock);
}

void weft__trace_instant(int device, unsigned stream, const char *name, const char *args_json) {
  if (!weft__trace_on()) return;
  char ev[1024];
  size_t at = (size_t)snprintf(ev, sizeof ev, "{\"ph\": \"i\", \"s\": \"t\", \"name\": \"");
  (void)weft__json_escape(ev, &at, sizeof ev - 200, name);
  snprintf(ev + at, sizeof ev - at, "\", \"pid\": %d, \"tid\": %u, \"ts\": %" PRIu64 "%s%s}", device, stream,
           weft__trace_now_us(), args_json ? ", \"args\": " : "", args_json ? args_json : "");
  pthread_mutex_lock(&trace_lock);
  put(device, stream, ev);
  pthread_mutex_unlock(&trace_lock);
}

void weft__trace_wait(int device, unsigned from, uint64_t recorded_us, unsigned to) {
  if (!weft__trace_on()) return;
  static _Atomic uint64_t next_id;
  uint64_t id = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed) + 1;
  char s[256], f[256];
  snprintf(s, sizeof s,
           "{\"ph\": \"s\", \"name\": \"wait\", \"cat\": \"weft\", \"id\": %" PRIu64 ", \"pid\": %d, \"tid\": %u, "
           "\"ts\": %" PRIu64 "}",
           id, device, from, recorded_us);
  snprintf(f, sizeof f,
           "{\"ph\": \"f\", \"bp\": \"e\", \"name\": \"wait\", \"cat\": \"weft\", \"id\": %" PRIu64 ", \"pid\": %d, "
           "\"tid\": %u, \"ts\": %" PRIu64 "}",
           id, device, to, weft__trace_now_us());
  pthread_mutex_lock(&trace_lock);
  put(device, from, s);
  put(device, to, f);
  pthread_mutex_unlock(&trace_lock);
}

weft_status_t weft_trace_start(const char *path) {
  if (path == NULL || path[0] == '\0') return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_trace_start: no path");
  pthread_mutex_lock(&trace_lock);
  weft_status_t st = WEFT_OK;
  if (trace_file != NULL) {
    st = weft__error(WEFT_ERR_BUSY, "weft_trace_start: a trace is being written already (weft_trace_stop first)");
  } else if ((trace_file = fopen(path, "w")) == NULL) {
    st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_trace_start: cannot open '%s' for writing", path);
  } else {
    fputs("[\n", trace_file);
    trace_first = true;
    memset(named, 0, sizeof named);
    atomic_store(&weft__trace_active, 1);
  }
  pthread_mutex_unlock(&trace_lock);
  return st;
}

weft_status_t weft_trace_stop(void) {
  pthread_mutex_lock(&trace_lock);
  atomic_store(&weft__trace_active, 0);
  int bad = 0;
  if (trace_file != NULL) {
    fputs("\n]\n", trace_file);
    bad = fclose(trace_file) != 0;
    trace_file = NULL;
  }
  pthread_mutex_unlock(&trace_lock);
  return bad ? weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_trace_stop: writing the trace failed") : WEFT_OK;
}

static void stop_at_exit(void) {
  if (weft_trace_stop() != WEFT_OK) fprintf(stderr, "weft: %s\n", weft_last_error());
}

static void start_from_env(void) {
  const char *path = getenv("WEFT_TRACE");
  if (path != NULL && path[0] != '\0' && weft_trace_start(path) == WEFT_OK) atexit(stop_at_exit);
}

void weft__trace_from_env(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, start_from_env);
}
