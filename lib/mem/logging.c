/* The logging adaptor: one CSV line per allocate and deallocate, to a file or a sink callback,
 * in weft's columns or in RMM's (so that RMM's replay tools read the log):
 *
 *   weft: thread,time_ns,action,ptr,bytes,stream,device,tag
 *   RMM:  Thread,Time,Action,Pointer,Size,Stream
 *
 * weft: thread is the kernel thread id; time_ns is CLOCK_MONOTONIC; action is alloc, free,
 * alloc_failed or free_failed; ptr is hex (0 for a failed allocation); stream is the pool index;
 * tag is quoted when it holds a comma, a quote or a line break (quotes doubled, RFC 4180).
 * RMM: the same thread id; Time in seconds since the epoch (microseconds); Action allocate,
 * deallocate, "allocate failure" or "deallocate failure"; Pointer hex; Size bytes; Stream the
 * CUstream handle in hex (0x0 for the legacy stream).
 * Lines are written under the adaptor's lock, after the upstream call returned, so they appear
 * whole and in the order the calls completed; a file is line-buffered, so the log is complete up
 * to the last call even if the program dies. The sink is called under that lock: it must not
 * call back into the resource.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lib/mem/mem.h"

#define LINE_MAX_BYTES 512

static const char header[] = "thread,time_ns,action,ptr,bytes,stream,device,tag";
static const char rmm_header[] = "Thread,Time,Action,Pointer,Size,Stream";

typedef struct logging {
  weft_resource_t base;     /* first */
  pthread_mutex_t lock;     /* rank 20; guards out and sink calls; not held across upstream */
  weft__tracker_t *tr;
  FILE *out;                /* owned, or NULL with a sink */
  weft_log_sink_fn sink;
  void *user;
  bool rmm;                 /* RMM's columns */
} logging_t;

static long thread_id(void) {
  static _Thread_local long tid;
  if (tid == 0) tid = (long)syscall(SYS_gettid);
  return tid;
}

/* Appends tag as one CSV field. */
static size_t put_tag(char *buf, size_t at, size_t cap, const char *tag) {
  bool quote = strpbrk(tag, ",\"\r\n") != NULL;
  if (quote && at < cap - 1) buf[at++] = '"';
  for (const char *c = tag; *c != '\0' && at < cap - 2; c++) {
    if (*c == '"') buf[at++] = '"';
    buf[at++] = *c;
  }
  if (quote && at < cap - 1) buf[at++] = '"';
  buf[at] = '\0';
  return at;
}

/* ok: the call succeeded; alloc: an allocation (else a free). */
static void emit(logging_t *l, bool alloc, bool ok, CUdeviceptr p, size_t bytes, const weft_stream_t *s,
                 const char *tag) {
  struct timespec ts;
  char line[LINE_MAX_BYTES];
  if (l->rmm) {
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(line, sizeof line, "%ld,%lld.%06ld,%s%s,0x%llx,%zu,0x%llx", thread_id(), (long long)ts.tv_sec,
             ts.tv_nsec / 1000, alloc ? "allocate" : "deallocate", ok ? "" : " failure", (unsigned long long)p, bytes,
             (unsigned long long)(uintptr_t)s->raw);
  } else {
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int n = snprintf(line, sizeof line, "%ld,%llu,%s,0x%llx,%zu,%u,%d,", thread_id(),
                     (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec,
                     alloc ? (ok ? "alloc" : "alloc_failed") : (ok ? "free" : "free_failed"), (unsigned long long)p,
                     bytes, s->index, l->tr->ordinal);
    if (n < 0 || (size_t)n >= sizeof line) n = (int)sizeof line - 1;
    put_tag(line, (size_t)n, sizeof line, tag);
  }
  if (l->out != NULL) {
    fputs(line, l->out);
    fputc('\n', l->out);
  } else {
    l->sink(l->user, line);
  }
}

static weft_status_t logging_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                      CUdeviceptr *out) {
  logging_t *l = (logging_t *)self;
  CUdeviceptr p = 0;
  weft_status_t st = weft__resource_allocate(l->base.upstream, bytes, s, tag, &p);
  pthread_mutex_lock(&l->lock);
  emit(l, true, st == WEFT_OK, p, bytes, s, tag);
  pthread_mutex_unlock(&l->lock);
  if (st == WEFT_OK) *out = p;
  return st;
}

static weft_status_t logging_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                        const char *tag) {
  logging_t *l = (logging_t *)self;
  weft_status_t st = weft__resource_deallocate(l->base.upstream, p, bytes, s, tag);
  pthread_mutex_lock(&l->lock);
  emit(l, false, st == WEFT_OK, p, bytes, s, tag);
  pthread_mutex_unlock(&l->lock);
  return st;
}

static weft_status_t logging_destroy(weft_resource_t *self) {
  logging_t *l = (logging_t *)self;
  weft_status_t st = WEFT_OK;
  if (l->out != NULL && fclose(l->out) != 0)
    st = weft__error(WEFT_ERR_DRIVER, "logging: closing the log failed: %s", strerror(errno));
  pthread_mutex_destroy(&l->lock);
  weft__meta_free(l);
  return st;
}

const weft_resource_ops_t weft__logging_ops = {
    .name = "logging",
    .allocate = logging_allocate,
    .deallocate = logging_deallocate,
    .destroy = logging_destroy,
};

weft_status_t weft__logging_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream, const char *path,
                                   weft_log_sink_fn sink, void *user, bool rmm, weft_resource_t **out) {
  const char *who = rmm ? "weft_logging_create_rmm" : "weft_logging_create";
  const char *head = rmm ? rmm_header : header;
  weft_status_t st;
  if ((st = weft__mem_check_upstream(who, rt, upstream)) != WEFT_OK) return st;
  if ((path == NULL) == (sink == NULL))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: give exactly one of a path and a sink", who);
  logging_t *l = weft__meta_calloc(1, sizeof *l);
  if (l == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  if ((st = weft__mem_lock_init(&l->lock, who)) != WEFT_OK) {
    weft__meta_free(l);
    return st;
  }
  if (path != NULL) {
    l->out = fopen(path, "w");
    if (l->out == NULL) {
      st = weft__error(WEFT_ERR_DRIVER, "%s: cannot open '%s' for writing: %s", who, path, strerror(errno));
      pthread_mutex_destroy(&l->lock);
      weft__meta_free(l);
      return st;
    }
    setvbuf(l->out, NULL, _IOLBF, 0);
    fputs(head, l->out);
    fputc('\n', l->out);
  } else {
    l->sink = sink;
    l->user = user;
    sink(user, head);
  }
  l->rmm = rmm;
  weft__resource_init(&l->base, &weft__logging_ops, upstream, rt);
  l->tr = tr;
  *out = &l->base;
  return WEFT_OK;
}
