/* probe_capture_query: what the capture questions a stream-ordered allocation asks cost the host,
 * by stream. weft asks the driver whether a stream captures at each weft_alloc and weft_free on a
 * stream outside code may capture (an adopted one: PyTorch's), and for the legacy stream it first
 * makes sure its context is current (the legacy handle names the current context's stream): the
 * PyTorch adapter's pair on the legacy stream cost 52 ns more than on a side stream on 2 x H200
 * (bench/data/h200x2-411a409) with the same instructions but for two cuCtxGetCurrent. This asks
 * what each question costs on each kind of stream. Rows interleaved, 11 samples of 200,000 calls
 * each; medians (min-max), ns per call:
 *   ctx        cuCtxGetCurrent
 *   is/X       cuStreamIsCapturing(X)
 *   info/X     cuStreamGetCaptureInfo(X) (status and id, the form weft's probe uses where it
 *              needs the id)
 * X: side (a non-blocking stream of the context), blocking (a blocking one), null (NULL: the
 * legacy stream), legacy (CU_STREAM_LEGACY), ptds (CU_STREAM_PER_THREAD).
 * Prints what the driver answers; asserts nothing. Run by hand on a GPU machine:
 *   bazel build -c opt //tools/probes:probe_capture_query && bazel-bin/tools/probes/probe_capture_query */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "tools/probes/probe.h"

#define N 200000
#define REPS 11

enum { SIDE, BLOCKING, NUL, LEGACY, PTDS, KINDS };
static const char *const kind_names[KINDS] = {"side", "blocking", "null", "legacy", "ptds"};
enum { ROWS = 1 + 2 * KINDS };

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  CUstream st[KINDS];
  TRY(d->cuStreamCreateWithPriority(&st[SIDE], CU_STREAM_NON_BLOCKING, 0));
  TRY(d->cuStreamCreateWithPriority(&st[BLOCKING], CU_STREAM_DEFAULT, 0));
  st[NUL] = NULL;
  st[LEGACY] = CU_STREAM_LEGACY;
  st[PTDS] = CU_STREAM_PER_THREAD;
  if (d->cuStreamGetCaptureInfo == NULL) {
    printf("the driver has no cuStreamGetCaptureInfo\n");
    return 1;
  }
  static double ns[ROWS][REPS];
  volatile unsigned sink = 0;
  for (int r = 0; r < REPS; r++)
    for (int row = 0; row < ROWS; row++) {
      int k = (row - 1) % KINDS;
      CUcontext c;
      CUstreamCaptureStatus cs;
      cuuint64_t id;
      uint64_t t0 = probe_now();
      if (row == 0) {
        for (int i = 0; i < N; i++) sink += d->cuCtxGetCurrent(&c) == CUDA_SUCCESS;
      } else if (row <= KINDS) {
        for (int i = 0; i < N; i++) sink += d->cuStreamIsCapturing(st[k], &cs) == CUDA_SUCCESS;
      } else {
        for (int i = 0; i < N; i++) sink += d->cuStreamGetCaptureInfo(st[k], &cs, &id, NULL, NULL, NULL, NULL) == CUDA_SUCCESS;
      }
      ns[row][r] = (double)(probe_now() - t0) / N;
    }
  if (sink != (unsigned)(ROWS * REPS * N)) printf("(some calls failed: %u of %u succeeded)\n", sink, ROWS * REPS * N);
  printf("| call | stream | median ns | min-max ns |\n| --- | --- | ---: | ---: |\n");
  for (int row = 0; row < ROWS; row++) {
    qsort(ns[row], REPS, sizeof ns[row][0], probe_cmp_double);
    printf("| %s | %s | %.1f | %.1f-%.1f |\n", row == 0 ? "cuCtxGetCurrent" : row <= KINDS ? "cuStreamIsCapturing" : "cuStreamGetCaptureInfo",
           row == 0 ? "-" : kind_names[(row - 1) % KINDS], ns[row][REPS / 2], ns[row][0], ns[row][REPS - 1]);
  }
  return 0;
}
