/* The status table and the thread's last failure (error.h, debug.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"

unsigned weft_version(void) { return WEFT_VERSION; }

const char *weft_status_str(weft_status_t s) {
  switch (s) {
#define WEFT__STATUS_STR(name, code, msg) \
  case WEFT_##name:                       \
    return msg;
    WEFT_STATUS_MAP(WEFT__STATUS_STR)
#undef WEFT__STATUS_STR
  }
  return "unknown weft status";
}

const char *weft_status_name(weft_status_t s) {
  switch (s) {
#define WEFT__STATUS_NAME(name, code, msg) \
  case WEFT_##name:                        \
    return "WEFT_" #name;
    WEFT_STATUS_MAP(WEFT__STATUS_NAME)
#undef WEFT__STATUS_NAME
  }
  return "WEFT_UNKNOWN_STATUS";
}

/* Per thread: the message of the last failure and the driver result behind it. */
static _Thread_local char tls_message[512];
static _Thread_local CUresult tls_driver_result;

const char *weft_last_error(void) { return tls_message; }
CUresult weft_last_driver_error(void) { return tls_driver_result; }
void weft__error_set_driver(CUresult r) { tls_driver_result = r; }

weft_status_t weft__error(weft_status_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_message, sizeof tls_message, fmt, ap);
  va_end(ap);
  return s;
}

#if WEFT__TEST_POINTS
void (*_Atomic weft__test_hook)(const char *point, void *arg);
#endif

_Noreturn void weft__assert_fail(const char *expr, const char *file, int line) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "weft assertion failed: %s:%d: %s\n", file, line, expr);
  if (n > 0) {
    ssize_t ignored = write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    (void)ignored;
  }
  abort();
}

bool weft__debug_report(const char *checker, const char *what) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "weft invariant broken: %s: %s\n", checker, what);
  if (n > 0) {
    ssize_t ignored = write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    (void)ignored;
  }
  return false;
}
