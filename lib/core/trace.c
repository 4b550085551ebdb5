/* The timeline trace (trace.h) and its public calls (weft_trace_start / weft_trace_stop). */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/core/trace.h"
#include "weft/weft.h"

_Atomic int weft__trace_active;

/* A leaf lock: file writes, and the device spans' own driver calls (event records, synchronisations
 * of span events, the base's one synchronisation). */
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_file;
static bool trace_first;                 /* no event written yet */

/* Tracks: a pool stream's is its index; its device timestamps' DEVICE_TID + index; a capture's
 * CAPTURE_TID + (capture id mod CAPTURES) * 64 + index. */
enum { DEVICE_TID = 1000, CAPTURE_TID = 100000, CAPTURES = 20000 };

/* Tracks already named, as device << 32 | tid + 1 (0: empty), open addressing; when full, later
 * tracks stay unnamed (the viewer shows their number). */
enum { NAMED = 8192 };
static uint64_t named[NAMED];

unsigned weft__trace_tid(unsigned stream, uint64_t capture_id) {
  return capture_id == 0 ? stream : CAPTURE_TID + (unsigned)(capture_id % CAPTURES) * 64u + stream;
}

/* Whether (device, tid) was named before; names it now if not (and there is room). */
static bool name_once(int device, unsigned tid) {
  uint64_t key = ((uint64_t)(uint32_t)device << 32 | tid) + 1;
  for (size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 51), probes = 0; probes < NAMED; i = (i + 1) % NAMED, probes++) {
    if (named[i] == key) return true;
    if (named[i] == 0) {
      named[i] = key;
      return false;
    }
  }
  return true;
}
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

/* One event line (the lock held). Names the event's track the first time it appears, and sorts
 * each stream's device track right after it, captures after all streams. */
static void put(int device, unsigned tid, const char *event) {
  if (trace_file == NULL) return;
  if (!name_once(device, tid)) {
    char name[64];
    unsigned sort;
    if (tid < DEVICE_TID) {
      snprintf(name, sizeof name, "stream %u", tid);
      sort = tid * 2;
    } else if (tid < CAPTURE_TID) {
      snprintf(name, sizeof name, "stream %u (device)", tid - DEVICE_TID);
      sort = (tid - DEVICE_TID) * 2 + 1;
    } else {
      snprintf(name, sizeof name, "capture %u, stream %u", (tid - CAPTURE_TID) / 64, (tid - CAPTURE_TID) % 64);
      sort = tid;
    }
    fprintf(trace_file,
            "%s{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %u, \"args\": {\"name\": \"%s\"}},\n"
            "{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": %d, \"tid\": %u, \"args\": {\"sort_index\": %u}}",
            trace_first ? "" : ",\n", device, tid, name, device, tid, sort);
    trace_first = false;
  }
  fprintf(trace_file, "%s%s", trace_first ? "" : ",\n", event);
  trace_first = false;
}

static void label_span(int device, unsigned tid, const char *name, const char *args_json);

void weft__trace_slice(int device, unsigned stream, const char *name, uint64_t ts, uint64_t dur, const char *args_json) {
  if (!weft__trace_on()) return;
  label_span(device, stream, name, args_json);
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

/* ---- device timestamps ---------------------------------------------------------------------- */

struct weft__trace_span {
  const weft__driver_t *drv;
  int device;
  unsigned stream;
  CUevent start, end;
  char *name, *args;             /* set when named (metadata memory) */
  weft__trace_span_t *next;      /* on its device's free list */
};

enum { DEVICES = 16, SPANS = 4096 };

/* Per device, under trace_lock: the base event that maps device time to the host's clock. */
static struct {
  const weft__driver_t *drv;
  CUcontext ctx;
  CUevent base;
  uint64_t base_us;              /* host time at which the base event had completed */
  bool set;
  weft__trace_span_t *free;      /* spans whose events can be recorded again */
} dev[DEVICES];
static weft__trace_span_t *pending[SPANS]; /* ended and named, not written yet */
static size_t npending;
_Atomic bool weft__trace_device_wanted; /* WEFT_TRACE_DEVICE=1 when the trace started (trace.h) */
static _Thread_local weft__trace_span_t *tls_ended; /* ended by this thread, waiting for its name */
/* tls_ended, as a thread-specific value too: a thread that ends before naming its span gives it
 * back (ended_release), instead of leaving it and its two events behind. */
static pthread_key_t ended_key;
static pthread_once_t ended_once = PTHREAD_ONCE_INIT;
static bool ended_keyed;

/* Back on its device's free list (trace_lock held). */
static void recycle(weft__trace_span_t *sp) {
  weft__meta_free(sp->name);
  weft__meta_free(sp->args);
  sp->name = sp->args = NULL;
  sp->next = dev[sp->device].free;
  dev[sp->device].free = sp;
}

/* Frees a span whose device was flushed away meanwhile (its events are left alone: the device's
 * context may be gone with its runtime). */
static void discard(weft__trace_span_t *sp) {
  weft__meta_free(sp->name);
  weft__meta_free(sp->args);
  weft__meta_free(sp);
}

/* Runs `stmt` with the device's context current on this thread (trace_lock held). */
#define IN_CONTEXT(d, stmt)                                                     \
  do {                                                                          \
    CUcontext cur_ = NULL;                                                      \
    bool swap_ = dev[d].drv->cuCtxGetCurrent(&cur_) == CUDA_SUCCESS && cur_ != dev[d].ctx; \
    if (swap_) (void)dev[d].drv->cuCtxSetCurrent(dev[d].ctx);                   \
    stmt;                                                                       \
    if (swap_) (void)dev[d].drv->cuCtxSetCurrent(cur_);                         \
  } while (0)

/* Writes the waiting spans of `device` (all devices if < 0), in the order they were named
 * (trace_lock held). A span whose events cannot be read is dropped. */
static void flush_locked(int device) {
  size_t kept = 0;
  for (size_t i = 0; i < npending; i++) {
    weft__trace_span_t *sp = pending[i];
    int d = sp->device;
    if (device >= 0 && d != device) {
      pending[kept++] = sp;
      continue;
    }
    float from_base = 0, dur = 0;
    CUresult r = CUDA_SUCCESS;
    IN_CONTEXT(d, WEFT__RELAXED(dev[d].drv, {
      r = dev[d].drv->cuEventSynchronize(sp->end);
      if (r == CUDA_SUCCESS) r = dev[d].drv->cuEventElapsedTime(&from_base, dev[d].base, sp->start);
      if (r == CUDA_SUCCESS) r = dev[d].drv->cuEventElapsedTime(&dur, sp->start, sp->end);
    }));
    if (r == CUDA_SUCCESS && trace_file != NULL) {
      char ev[2048];
      size_t at = (size_t)snprintf(ev, sizeof ev, "{\"ph\": \"X\", \"cat\": \"device\", \"name\": \"");
      (void)weft__json_escape(ev, &at, sizeof ev - 200, sp->name);
      uint64_t ts = dev[d].base_us + (uint64_t)(from_base > 0 ? from_base * 1000.0 : 0);
      snprintf(ev + at, sizeof ev - at, "\", \"pid\": %d, \"tid\": %u, \"ts\": %" PRIu64 ", \"dur\": %.3f%s%s}", d,
               DEVICE_TID + sp->stream, ts, dur > 0 ? dur * 1000.0 : 0.0, sp->args ? ", \"args\": " : "",
               sp->args ? sp->args : "");
      put(d, DEVICE_TID + sp->stream, ev);
    }
    recycle(sp);
  }
  npending = kept;
}

/* Forgets the base and the free spans of device d (trace_lock held; nothing of d waiting). */
static void forget_device(int d) {
  if (!dev[d].set) return;
  IN_CONTEXT(d, {
    (void)dev[d].drv->cuEventDestroy(dev[d].base);
    for (weft__trace_span_t *sp = dev[d].free, *next; sp != NULL; sp = next) {
      next = sp->next;
      (void)dev[d].drv->cuEventDestroy(sp->start);
      (void)dev[d].drv->cuEventDestroy(sp->end);
      weft__meta_free(sp);
    }
  });
  dev[d].free = NULL;
  dev[d].set = false;
}

void weft__trace_device_flush(int device) {
  if (device < 0 || device >= DEVICES) return;
  pthread_mutex_lock(&trace_lock);
  flush_locked(device);
  forget_device(device);
  pthread_mutex_unlock(&trace_lock);
}

/* A span with both events, from the device's free list or new (trace_lock held). */
static weft__trace_span_t *span_get(const weft__driver_t *drv, int device) {
  weft__trace_span_t *sp = dev[device].free;
  if (sp != NULL) {
    dev[device].free = sp->next;
    return sp;
  }
  if ((sp = weft__meta_calloc(1, sizeof *sp)) == NULL) return NULL;
  if (drv->cuEventCreate(&sp->start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    weft__meta_free(sp);
    return NULL;
  }
  if (drv->cuEventCreate(&sp->end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    (void)drv->cuEventDestroy(sp->start);
    weft__meta_free(sp);
    return NULL;
  }
  sp->device = device;
  sp->drv = drv;
  return sp;
}

weft__trace_span_t *weft__trace_device_begin(const weft__driver_t *drv, int device, unsigned stream, void *raw) {
  if (!weft__trace_device_on() || device < 0 || device >= DEVICES || drv->cuEventElapsedTime == NULL) return NULL;
  pthread_mutex_lock(&trace_lock);
  if (!dev[device].set) {
    /* The base: recorded on this stream and waited for, then read against the host's clock. */
    CUevent base;
    CUcontext ctx = NULL;
    CUresult r = drv->cuCtxGetCurrent(&ctx);
    if (r == CUDA_SUCCESS) r = drv->cuEventCreate(&base, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) {
      WEFT__RELAXED(drv, {
        r = drv->cuEventRecord(base, (CUstream)raw);
        if (r == CUDA_SUCCESS) r = drv->cuEventSynchronize(base);
      });
      if (r != CUDA_SUCCESS) (void)drv->cuEventDestroy(base);
    }
    if (r == CUDA_SUCCESS) {
      dev[device].drv = drv;
      dev[device].ctx = ctx;
      dev[device].base = base;
      dev[device].base_us = weft__trace_now_us();
      dev[device].set = true;
    }
  }
  weft__trace_span_t *sp = dev[device].set ? span_get(drv, device) : NULL;
  pthread_mutex_unlock(&trace_lock);
  if (sp == NULL) return NULL;
  sp->stream = stream;
  if (drv->cuEventRecord(sp->start, (CUstream)raw) != CUDA_SUCCESS) {
    weft__trace_device_drop(sp);
    return NULL;
  }
  return sp;
}

void weft__trace_device_drop(weft__trace_span_t *sp) {
  if (sp == NULL) return;
  pthread_mutex_lock(&trace_lock);
  bool set = dev[sp->device].set;
  if (set) recycle(sp);
  pthread_mutex_unlock(&trace_lock);
  if (!set) discard(sp);
}

static void ended_release(void *sp) { weft__trace_device_drop(sp); }

static void ended_key_create(void) { ended_keyed = pthread_key_create(&ended_key, ended_release) == 0; }

/* This thread's ended span becomes sp (NULL: none); false when the thread-specific value could
 * not be set (then nothing is kept). */
static bool set_ended(weft__trace_span_t *sp) {
  pthread_once(&ended_once, ended_key_create);
  if (!ended_keyed || pthread_setspecific(ended_key, sp) != 0) return false;
  tls_ended = sp;
  return true;
}

void weft__trace_device_end(weft__trace_span_t *sp, void *raw) {
  if (sp == NULL) return;
  weft__trace_span_t *old = tls_ended;
  (void)set_ended(NULL); /* setting NULL, or the value held now, cannot fail */
  tls_ended = NULL;
  weft__trace_device_drop(old);
  if (sp->drv->cuEventRecord(sp->end, (CUstream)raw) != CUDA_SUCCESS || !set_ended(sp)) weft__trace_device_drop(sp);
}

/* Names this thread's ended span with the slice written for its stream, and queues it. */
static void label_span(int device, unsigned tid, const char *name, const char *args_json) {
  weft__trace_span_t *sp = tls_ended;
  if (sp == NULL || sp->device != device || sp->stream != tid) return;
  (void)set_ended(NULL);
  tls_ended = NULL;
  sp->name = weft__meta_strdup(name ? name : "");
  sp->args = args_json ? weft__meta_strdup(args_json) : NULL;
  pthread_mutex_lock(&trace_lock);
  if (!dev[device].set) { /* flushed away meanwhile: its events went with the context */
    pthread_mutex_unlock(&trace_lock);
    discard(sp);
    return;
  }
  if (npending == SPANS) flush_locked(-1);
  pending[npending++] = sp;
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
    const char *want = getenv("WEFT_TRACE_DEVICE");
    atomic_store_explicit(&weft__trace_device_wanted, want != NULL && strcmp(want, "1") == 0, memory_order_relaxed);
    atomic_store(&weft__trace_active, 1);
  }
  pthread_mutex_unlock(&trace_lock);
  return st;
}

weft_status_t weft_trace_stop(void) {
  pthread_mutex_lock(&trace_lock);
  atomic_store(&weft__trace_active, 0);
  int bad = 0;
  flush_locked(-1);
  for (int d = 0; d < DEVICES; d++) forget_device(d);
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
