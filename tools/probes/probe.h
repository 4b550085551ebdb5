/* What the driver probes share: the driver table weft loaded (WEFT_DRIVER), a TRY that prints the
 * failing call and returns 1, and the primary context of device 0 made current. */
#ifndef WEFT_PROBE_H
#define WEFT_PROBE_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "lib/core/driver.h"
#include "weft/weft.h"

static const weft__driver_t *d;
static CUcontext ctx;
static CUdevice dev;

#define TRY(x)                                                                               \
  do {                                                                                       \
    CUresult r_ = (x);                                                                       \
    if (r_ != CUDA_SUCCESS) {                                                                \
      printf("%s:%d %s failed: %s\n", __FILE__, __LINE__, #x, weft_driver_error_name(r_));   \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

/* Loads the driver and makes device 0's primary context current: 0, or 1 after printing why
 * (a missing driver is not a failure of the probe: probe_start makes main return 0). */
static int probe_context(void) {
  TRY(d->cuInit(0));
  TRY(d->cuDeviceGet(&dev, 0));
  TRY(d->cuDevicePrimaryCtxRetain(&ctx, dev));
  TRY(d->cuCtxSetCurrent(ctx));
  return 0;
}

/* In main: `int rc; if (!probe_start(&rc)) return rc;` */
static int probe_start(int *rc) {
  if (weft__driver_get(&d) != WEFT_OK) {
    printf("no driver: %s\n", weft_last_error());
    *rc = 0;
    return 0;
  }
  *rc = probe_context();
  return *rc == 0;
}

/* CLOCK_MONOTONIC in ns, for the probes that time calls. */
static inline uint64_t probe_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* qsort's comparison of doubles (the samples whose median a probe prints). */
static inline int probe_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#endif /* WEFT_PROBE_H */
