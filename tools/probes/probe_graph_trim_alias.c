/* Probe (asserts nothing): do two graphs with memory nodes, launched at once on unordered streams
 * right after cuDeviceGraphMemTrim, get the same physical memory for their temporaries?
 *
 *   GA: alloc T, set T = 0xaaaaaaaa, DELAY copies of 64 MiB (time), copy T -> DA, free T.
 *   GB: alloc U, set U = 0xbbbbbbbb, DELAY copies, copy U -> DB, free U.
 * Each round launches GA on sA and GB on sB (no dependency), synchronises, and checks DA and DB.
 * Rounds without a trim, then rounds with a trim before each launch pair. A wrong DA or DB means
 * the two launches shared memory without being ordered. */
#include <stdio.h>
#include <string.h>

#include "tools/probes/probe.h"

#define ROUNDS 20
#define DELAY 40
#define TEMP (1u << 20)
#define BIG (64u << 20)



static int capture(CUstream s, unsigned v, CUdeviceptr dst, CUdeviceptr x, CUdeviceptr y, CUgraph *g) {
  CUdeviceptr t;
  TRY(d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  TRY(d->cuMemAllocAsync(&t, TEMP, s));
  TRY(d->cuMemsetD32Async(t, v, TEMP / 4, s));
  for (int i = 0; i < DELAY; i++) TRY(d->cuMemcpyDtoDAsync(y, x, BIG, s));
  TRY(d->cuMemcpyDtoDAsync(dst, t, TEMP, s));
  TRY(d->cuMemFreeAsync(t, s));
  TRY(d->cuStreamEndCapture(s, g));
  return 0;
}

static unsigned word(CUdeviceptr p, size_t off) {
  unsigned a = 0;
  return d->cuMemcpyDtoH(&a, p + off, 4) == CUDA_SUCCESS ? a : 0xdeadbeef;
}

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  CUstream sA, sB;
  TRY(d->cuStreamCreateWithPriority(&sA, CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuStreamCreateWithPriority(&sB, CU_STREAM_NON_BLOCKING, 0));
  CUdeviceptr xa, ya, xb, yb, DA, DB;
  TRY(d->cuMemAlloc(&xa, BIG));
  TRY(d->cuMemAlloc(&ya, BIG));
  TRY(d->cuMemAlloc(&xb, BIG));
  TRY(d->cuMemAlloc(&yb, BIG));
  TRY(d->cuMemAlloc(&DA, TEMP));
  TRY(d->cuMemAlloc(&DB, TEMP));
  CUgraph ga, gb;
  CUgraphExec xA, xB;
  if (capture(sA, 0xaaaaaaaau, DA, xa, ya, &ga) || capture(sB, 0xbbbbbbbbu, DB, xb, yb, &gb)) return 1;
  TRY(d->cuGraphInstantiateWithFlags(&xA, ga, 0));
  TRY(d->cuGraphInstantiateWithFlags(&xB, gb, 0));
  for (int trim = 0; trim < 2; trim++) {
    int bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
      TRY(d->cuMemsetD32Async(DA, 0, TEMP / 4, sA));
      TRY(d->cuMemsetD32Async(DB, 0, TEMP / 4, sB));
      TRY(d->cuCtxSynchronize());
      if (trim) TRY(d->cuDeviceGraphMemTrim(dev));
      if (r % 2 == 0) {
        TRY(d->cuGraphLaunch(xA, sA));
        TRY(d->cuGraphLaunch(xB, sB));
      } else {
        TRY(d->cuGraphLaunch(xB, sB));
        TRY(d->cuGraphLaunch(xA, sA));
      }
      TRY(d->cuCtxSynchronize());
      unsigned a0 = word(DA, 0), a1 = word(DA, TEMP - 4), b0 = word(DB, 0), b1 = word(DB, TEMP - 4);
      if (a0 != 0xaaaaaaaau || a1 != 0xaaaaaaaau || b0 != 0xbbbbbbbbu || b1 != 0xbbbbbbbbu) {
        bad++;
        printf("  trim %d round %d: DA 0x%08x..0x%08x DB 0x%08x..0x%08x\n", trim, r, a0, a1, b0, b1);
      }
    }
    printf("trim %d: %d of %d rounds wrong\n", trim, bad, ROUNDS);
  }
  return 0;
}
