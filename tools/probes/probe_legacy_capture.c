/* What the driver says about the legacy NULL stream (PyTorch's default stream) while another
 * stream is capturing: for a capturing stream made blocking or non-blocking, and each capture
 * mode, the answers of cuStreamGetCaptureInfo and cuStreamIsCapturing on the legacy stream, an
 * event record there (in RELAXED thread mode, as weft runs its eager work), and whether the
 * capture survived (cuStreamEndCapture). Also a record on another blocking stream. Asserts
 * nothing; prints one line per case. */
#include <string.h>

#include "tools/probes/probe.h"

static const char *name(CUresult r) { return weft_driver_error_name(r); }

static int one(unsigned flags, CUstreamCaptureMode mode, const char *mode_name, int target_legacy) {
  CUstream c, other;
  CUevent e;
  TRY(d->cuStreamCreateWithPriority(&c, flags, 0));
  TRY(d->cuStreamCreateWithPriority(&other, 0, 0));
  TRY(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUstream t = target_legacy ? CU_STREAM_LEGACY : other;
  TRY(d->cuStreamBeginCapture(c, mode));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUresult info = d->cuStreamGetCaptureInfo(t, &st, &id, NULL, NULL, NULL, NULL);
  CUstreamCaptureStatus st2 = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult is = d->cuStreamIsCapturing(t, &st2);
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  TRY(d->cuThreadExchangeStreamCaptureMode(&m));
  CUresult rec = d->cuEventRecord(e, t);
  TRY(d->cuThreadExchangeStreamCaptureMode(&m));
  CUgraph g = NULL;
  CUresult end = d->cuStreamEndCapture(c, &g);
  printf("capture on %-12s %-12s target %-7s: GetCaptureInfo %s (status %d), IsCapturing %s (status %d), "
         "EventRecord %s, EndCapture %s\n",
         flags ? "non-blocking" : "blocking", mode_name, target_legacy ? "legacy" : "blocking", name(info), (int)st,
         name(is), (int)st2, name(rec), name(end));
  if (g != NULL) TRY(d->cuGraphDestroy(g));
  (void)d->cuCtxSynchronize();
  TRY(d->cuEventDestroy(e));
  TRY(d->cuStreamDestroy(c));
  TRY(d->cuStreamDestroy(other));
  return 0;
}

/* Only a query of the legacy stream during a blocking stream's capture: does it end the capture? */
static int query_only(int is_capturing) {
  CUstream c;
  TRY(d->cuStreamCreateWithPriority(&c, 0, 0));
  TRY(d->cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult q = is_capturing ? d->cuStreamIsCapturing(CU_STREAM_LEGACY, &st)
                            : d->cuStreamGetCaptureInfo(CU_STREAM_LEGACY, &st, NULL, NULL, NULL, NULL, NULL);
  CUgraph g = NULL;
  CUresult end = d->cuStreamEndCapture(c, &g);
  printf("query only (%s on legacy during a blocking GLOBAL capture): %s, then EndCapture %s\n",
         is_capturing ? "IsCapturing" : "GetCaptureInfo", name(q), name(end));
  if (g != NULL) TRY(d->cuGraphDestroy(g));
  TRY(d->cuStreamDestroy(c));
  return 0;
}

int main(void) {
  int rc;
  if (!probe_start(&rc)) return rc;
  const struct { CUstreamCaptureMode m; const char *n; } modes[] = {
      {CU_STREAM_CAPTURE_MODE_GLOBAL, "GLOBAL"},
      {CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, "THREAD_LOCAL"},
      {CU_STREAM_CAPTURE_MODE_RELAXED, "RELAXED"}};
  if (query_only(0) != 0 || query_only(1) != 0) return 1;
  for (int target = 1; target >= 0; target--)
    for (unsigned f = 0; f < 2; f++)
      for (int i = 0; i < 3; i++)
        if (one(f ? CU_STREAM_NON_BLOCKING : 0, modes[i].m, modes[i].n, target) != 0) return 1;
  return 0;
}
