/* Probe (asserts nothing): cuStreamWriteValue32 through weft's driver table and through
 * weft_write_value32, on memory from cuMemAlloc and from weft_alloc. */
#include <stdio.h>

#include "lib/core/driver.h"
#include "weft/weft.h"

int main(void) {
  const weft__driver_t *d;
  if (weft__driver_get(&d) != WEFT_OK) return printf("no driver: %s\n", weft_last_error()), 0;
  weft_runtime_t *rt;
  if (weft_runtime_get(0, NULL, &rt) != WEFT_OK) return printf("runtime: %s\n", weft_last_error()), 0;
  weft_stream_t *s;
  (void)weft_stream_get(rt, 1, &s);
  CUdeviceptr p;
  printf("cuMemAlloc %d\n", d->cuMemAlloc(&p, 4096));
  printf("table write32 on pool stream: %d\n", d->cuStreamWriteValue32(weft_stream_raw(s), p, 7, 0));
  CUstream own;
  d->cuStreamCreateWithPriority(&own, CU_STREAM_NON_BLOCKING, 0);
  printf("table write32 on own stream: %d\n", d->cuStreamWriteValue32(own, p, 7, 0));
  weft_block_t w, a;
  printf("wrap %d\n", weft_block_wrap(rt, p, 4096, "wrapped", &w));
  weft_status_t st = weft_write_value32(s, w, 0, 7);
  printf("weft_write_value32 wrapped: %s %s\n", weft_status_name(st), weft_last_error());
  printf("alloc %d\n", weft_alloc(rt, 64, s, "a", &a));
  CUdeviceptr pa;
  (void)weft_block_ptr(a, &pa);
  printf("a at %llx; table write32: %d\n", (unsigned long long)pa, d->cuStreamWriteValue32(weft_stream_raw(s), pa, 7, 0));
  st = weft_write_value32(s, a, 0, 7);
  printf("weft_write_value32 alloc: %s %s\n", weft_status_name(st), weft_last_error());
  st = weft_memset32(s, a, 0, 0, 64);
  st = weft_write_value32(s, a, 0, 7);
  printf("after memset32: %s %s\n", weft_status_name(st), weft_last_error());
  return 0;
}
