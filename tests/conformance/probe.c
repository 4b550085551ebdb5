/* probe: prints what the loaded driver returns for calls whose behaviour CUDA_SEMANTICS.md does
 * not pin down, one line each ("probe <what>: <code>"), asserting nothing. Run it on a GPU and
 * on the simulator (WEFT_DRIVER=sim) and compare: this is how the simulator's answers to these
 * corner cases were chosen. Each probe starts from a clean state (fresh streams, no capture).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"

static const weft__driver_t *d;
static CUcontext g_ctx;

static void show(const char *what, CUresult r) {
  const char *name = NULL;
  d->cuGetErrorName(r, &name);
  printf("probe %-64s: %d %s\n", what, (int)r, name ? name : "?");
}

static CUstream stream(void) {
  CUstream s = NULL;
  d->cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0);
  return s;
}

static void end(const char *what, CUstream s) {
  CUgraph g = NULL;
  char buf[128];
  snprintf(buf, sizeof buf, "  then EndCapture (%s)", what);
  show(buf, d->cuStreamEndCapture(s, &g));
  if (g) d->cuGraphDestroy(g);
}

static CUmemoryPool pool(CUmemAllocationHandleType h) {
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.handleTypes = h;
  CUmemoryPool p = NULL;
  d->cuMemPoolCreate(&p, &props);
  return p;
}

typedef struct arg {
  CUstream s;
  CUresult r;
  int what; /* 0 alloc, 1 end capture, 2 ctx sync without context */
} arg_t;

static void *thread_fn(void *p) {
  arg_t *a = p;
  if (a->what != 2) d->cuCtxSetCurrent(g_ctx);
  if (a->what == 0) {
    CUdeviceptr x;
    a->r = d->cuMemAlloc(&x, 256);
    if (a->r == CUDA_SUCCESS) d->cuMemFree(x);
  } else if (a->what == 1) {
    CUgraph g = NULL;
    a->r = d->cuStreamEndCapture(a->s, &g);
    if (g) d->cuGraphDestroy(g);
  } else {
    a->r = d->cuCtxSynchronize();
  }
  return NULL;
}

static CUresult in_thread(CUstream s, int what) {
  arg_t a = {s, CUDA_SUCCESS, what};
  pthread_t t;
  pthread_create(&t, NULL, thread_fn, &a);
  pthread_join(t, NULL);
  return a.r;
}

/* Issue 14: what two devices answer (peer access, events and pools across devices). */
static void two_devices(void) {
  int n = 0;
  d->cuDeviceGetCount(&n);
  printf("probe   devices: %d\n", n);
  if (n < 2 || d->cuDeviceCanAccessPeer == NULL) return;
  int can = -1;
  show("cuDeviceCanAccessPeer(0, 1)", d->cuDeviceCanAccessPeer(&can, 0, 1));
  printf("probe   can access 0 -> 1: %d\n", can);
  show("cuDeviceCanAccessPeer(0, 0)", d->cuDeviceCanAccessPeer(&can, 0, 0));
  printf("probe   can access 0 -> 0: %d\n", can);
  show("cuDeviceCanAccessPeer(0, 7)", d->cuDeviceCanAccessPeer(&can, 0, 7));
  CUcontext c1 = NULL;
  d->cuDevicePrimaryCtxRetain(&c1, 1);
  d->cuCtxSetCurrent(g_ctx);
  show("cuCtxEnablePeerAccess(ctx1, 1)", d->cuCtxEnablePeerAccess(c1, 1));
  show("cuCtxEnablePeerAccess(ctx0 itself, 0)", d->cuCtxEnablePeerAccess(g_ctx, 0));
  show("cuCtxDisablePeerAccess(ctx1) never enabled", d->cuCtxDisablePeerAccess(c1));
  show("cuCtxEnablePeerAccess(ctx1, 0)", d->cuCtxEnablePeerAccess(c1, 0));
  show("cuCtxEnablePeerAccess(ctx1, 0) again", d->cuCtxEnablePeerAccess(c1, 0));
  show("cuCtxDisablePeerAccess(ctx1)", d->cuCtxDisablePeerAccess(c1));
  show("cuCtxDisablePeerAccess(ctx1) again", d->cuCtxDisablePeerAccess(c1));
  CUstream s0 = stream();
  CUevent e0;
  d->cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING);
  CUdeviceptr m0 = 0, m1 = 0;
  d->cuMemAlloc(&m0, 1 << 20);
  d->cuCtxSetCurrent(c1);
  CUstream s1 = stream();
  CUevent e1;
  d->cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING);
  d->cuMemAlloc(&m1, 1 << 20);
  size_t fr = 0, tot = 0;
  d->cuMemGetInfo(&fr, &tot);
  printf("probe   cuMemGetInfo with ctx1 current: total %zu\n", tot);
  show("ctx1 current: cuEventRecord(event of ctx0, stream of dev 0)", d->cuEventRecord(e0, s0));
  show("ctx1 current: cuStreamWaitEvent(stream of dev 1, event of dev 0)", d->cuStreamWaitEvent(s1, e0, 0));
  show("ctx1 current: cuEventRecord(event of ctx0, stream of dev 1)", d->cuEventRecord(e0, s1));
  show("ctx1 current: cuStreamSynchronize(stream of dev 0)", d->cuStreamSynchronize(s0));
  show("ctx1 current: cuMemsetD32Async(dev 0 memory, stream of dev 1)", d->cuMemsetD32Async(m0, 7, 256, s1));
  show("ctx1 current: cuMemcpyDtoDAsync(dev1 <- dev0, stream of dev 1), no peer access",
       d->cuMemcpyDtoDAsync(m1, m0, 1 << 20, s1));
  show("ctx1 current: cuMemcpyPeerAsync(dev1 <- dev0, stream of dev 1)", d->cuMemcpyPeerAsync(m1, c1, m0, g_ctx, 1 << 20, s1));
  show("ctx1 current: cuStreamSynchronize(s1)", d->cuStreamSynchronize(s1));
  d->cuCtxSetCurrent(g_ctx);
  show("ctx0 current: cuMemsetD32Async(dev 0 memory, stream of dev 1)", d->cuMemsetD32Async(m0, 7, 256, s1));
  show("ctx0 current: cuEventRecord(event of ctx1, stream of dev 1)", d->cuEventRecord(e1, s1));
  show("ctx0 current: cuStreamWaitEvent(stream of dev 0, event of dev 1)", d->cuStreamWaitEvent(s0, e1, 0));
  CUmemoryPool p0 = pool(CU_MEM_HANDLE_TYPE_NONE);
  CUmemLocation l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1}, l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemAccess_flags fl = 99;
  show("cuMemPoolGetAccess(pool of dev 0, dev 1)", d->cuMemPoolGetAccess(&fl, p0, &l1));
  printf("probe   access of dev 1 to pool of dev 0: %d\n", (int)fl);
  show("cuMemPoolGetAccess(pool of dev 0, dev 0)", d->cuMemPoolGetAccess(&fl, p0, &l0));
  printf("probe   access of dev 0 to its pool: %d\n", (int)fl);
  CUdeviceptr q = 0;
  show("cuMemAllocFromPoolAsync(pool of dev 0, stream of dev 1), no access", d->cuMemAllocFromPoolAsync(&q, 4096, p0, s1));
  if (q) d->cuMemFreeAsync(q, s1);
  d->cuStreamSynchronize(s1);
  CUmemAccessDesc a1 = {l1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}, a0n = {l0, CU_MEM_ACCESS_FLAGS_PROT_NONE};
  show("cuMemPoolSetAccess(pool of dev 0, dev 1 READWRITE)", d->cuMemPoolSetAccess(p0, &a1, 1));
  show("cuMemPoolGetAccess(pool of dev 0, dev 1) after", d->cuMemPoolGetAccess(&fl, p0, &l1));
  printf("probe   access of dev 1 to pool of dev 0 now: %d\n", (int)fl);
  show("cuMemPoolSetAccess(pool of dev 0, dev 0 NONE)", d->cuMemPoolSetAccess(p0, &a0n, 1));
  q = 0;
  show("cuMemAllocFromPoolAsync(pool of dev 0, stream of dev 1), with access", d->cuMemAllocFromPoolAsync(&q, 4096, p0, s1));
  if (q) d->cuMemFreeAsync(q, s1);
  show("cuStreamSynchronize(s1) after pool calls", d->cuStreamSynchronize(s1));
  /* Copies of pool memory between devices, with and without the pool's access for the other. */
  {
    CUmemAccessDesc none1 = {l1, CU_MEM_ACCESS_FLAGS_PROT_NONE};
    d->cuCtxSetCurrent(g_ctx);
    d->cuMemPoolSetAccess(p0, &none1, 1);
    CUdeviceptr q0 = 0;
    d->cuMemAllocFromPoolAsync(&q0, 1 << 20, p0, s0);
    d->cuStreamSynchronize(s0);
    d->cuCtxSetCurrent(c1);
    show("pool memory of dev 0 -> dev 1 memory: cuMemcpyDtoDAsync on dev 1's stream, no pool access",
         d->cuMemcpyDtoDAsync(m1, q0, 1 << 20, s1));
    show("  then cuStreamSynchronize(s1)", d->cuStreamSynchronize(s1));
    show("pool memory of dev 0 -> dev 1 memory: cuMemcpyPeerAsync on dev 1's stream, no pool access",
         d->cuMemcpyPeerAsync(m1, c1, q0, g_ctx, 1 << 20, s1));
    show("  then cuStreamSynchronize(s1)", d->cuStreamSynchronize(s1));
    d->cuCtxSetCurrent(g_ctx);
    show("pool memory of dev 0 -> dev 1 memory: cuMemcpyDtoDAsync on dev 0's stream, no pool access",
         d->cuMemcpyDtoDAsync(m1, q0, 1 << 20, s0));
    show("  then cuStreamSynchronize(s0)", d->cuStreamSynchronize(s0));
    show("dev 1 memory -> pool memory of dev 0: cuMemcpyDtoDAsync on dev 0's stream",
         d->cuMemcpyDtoDAsync(q0, m1, 1 << 20, s0));
    show("  then cuStreamSynchronize(s0)", d->cuStreamSynchronize(s0));
    d->cuMemPoolSetAccess(p0, &a1, 1);
    d->cuCtxSetCurrent(c1);
    show("pool memory of dev 0 -> dev 1 memory: cuMemcpyDtoDAsync on dev 1's stream, with pool access",
         d->cuMemcpyDtoDAsync(m1, q0, 1 << 20, s1));
    show("  then cuStreamSynchronize(s1)", d->cuStreamSynchronize(s1));
    d->cuCtxSetCurrent(g_ctx);
    d->cuMemFreeAsync(q0, s0);
    d->cuStreamSynchronize(s0);
  }
  CUmemAccessDesc a7 = {{CU_MEM_LOCATION_TYPE_DEVICE, 7}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  show("cuMemPoolSetAccess(pool of dev 0, dev 7)", d->cuMemPoolSetAccess(p0, &a7, 1));
  d->cuMemPoolDestroy(p0);
  d->cuMemFree(m0);
  d->cuMemFree(m1);
  d->cuDevicePrimaryCtxRelease(1);
}

int main(void) {
  if (weft__driver_get(&d) != WEFT_OK) {
    fprintf(stderr, "probe: no driver: %s\n", weft_last_error());
    return 1;
  }
  d->cuDevicePrimaryCtxRetain(&g_ctx, 0);
  d->cuCtxSetCurrent(g_ctx);
  printf("probe: driver %s\n", d->info.path);
  CUdeviceptr dev;
  d->cuMemAlloc(&dev, 1 << 20);
  CUstream s = stream(), o = stream();
  CUevent e, e2;
  d->cuEventCreate(&e, 0);
  d->cuEventCreate(&e2, 0);
  unsigned host[4];
  cuuint64_t v64;

  show("cuCtxSynchronize, nothing queued", d->cuCtxSynchronize());

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  d->cuEventRecord(e, s);
  show("GLOBAL: cuEventQuery(captured event)", d->cuEventQuery(e));
  end("after query of captured event", s);
  show("cuEventQuery(event last recorded in an ended capture)", d->cuEventQuery(e));
  show("cuStreamWaitEvent(o, event last recorded in an ended capture)", d->cuStreamWaitEvent(o, e, 0));

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  d->cuEventRecord(e, s);
  show("GLOBAL: cuEventSynchronize(captured event)", d->cuEventSynchronize(e));
  end("after sync of captured event", s);

  d->cuEventRecord(e2, o);
  d->cuStreamSynchronize(o);
  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuEventQuery(event recorded outside)", d->cuEventQuery(e2));
  end("after query of outside event", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuEventSynchronize(event recorded outside)", d->cuEventSynchronize(e2));
  end("after sync of outside event", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuStreamQuery(capturing stream)", d->cuStreamQuery(s));
  end("after query of capturing stream", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuStreamSynchronize(capturing stream)", d->cuStreamSynchronize(s));
  end("after sync of capturing stream", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuStreamSynchronize(other, idle stream)", d->cuStreamSynchronize(o));
  end("after sync of other stream", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuStreamQuery(other, idle stream)", d->cuStreamQuery(o));
  end("after query of other stream", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuMemcpyDtoH (sync)", d->cuMemcpyDtoH(host, dev, 4));
  end("after sync memcpy", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuMemcpyHtoD (sync)", d->cuMemcpyHtoD(dev, host, 4));
  end("after sync memcpy HtoD", s);

  CUmemoryPool p = pool(CU_MEM_HANDLE_TYPE_NONE);
  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuMemPoolTrimTo", d->cuMemPoolTrimTo(p, 0));
  end("after trim", s);

  CUdeviceptr x;
  d->cuMemAlloc(&x, 256);
  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuMemFree", d->cuMemFree(x));
  end("after cuMemFree", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuMemGetInfo", d->cuMemGetInfo((size_t *)&v64, (size_t *)host));
  end("after cuMemGetInfo", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: cuMemPoolCreate", d->cuMemPoolCreate(&p, &(CUmemPoolProps){.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}}));
  end("after cuMemPoolCreate", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("GLOBAL: other thread ends the capture", in_thread(s, 1));
  end("on the beginning thread", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  show("THREAD_LOCAL: other thread cuMemAlloc", in_thread(s, 0));
  show("THREAD_LOCAL: own cuMemAlloc", d->cuMemAlloc(&x, 256));
  end("thread-local after own alloc", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
  show("RELAXED: own cuMemAlloc", d->cuMemAlloc(&x, 256));
  show("RELAXED: cuMemFree", d->cuMemFree(x));
  end("relaxed", s);

  show("BeginCapture(NULL stream)", d->cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
  show("BeginCapture(CU_STREAM_LEGACY)", d->cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL));
  show("EndCapture(not capturing)", d->cuStreamEndCapture(s, &(CUgraph){NULL}));
  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  show("BeginCapture twice", d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  show("GLOBAL: cuStreamWaitEvent(never-recorded event)", d->cuStreamWaitEvent(s, e2 ? e2 : e, 0));
  CUevent fresh;
  d->cuEventCreate(&fresh, 0);
  show("GLOBAL: cuStreamWaitEvent(fresh event)", d->cuStreamWaitEvent(s, fresh, 0));
  show("GLOBAL: cuStreamWaitValue32", d->cuStreamWaitValue32(s, dev, 0, 0));
  end("after wait value", s);

  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  d->cuMemsetD32Async(dev, 1, 4, s);
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = (const CUgraphEdgeData *)1;
  size_t n = 0;
  CUstreamCaptureStatus st;
  show("GetCaptureInfo with edgeData", d->cuStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, &edges, &n));
  printf("probe   edgeData pointer is %s, n=%zu\n", edges ? "non-NULL" : "NULL", n);
  end("memset capture", s);

  show("cuMemPoolExportToShareableHandle(no handle types)", d->cuMemPoolExportToShareableHandle(host, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemoryPool pt = pool(CU_MEM_HANDLE_TYPE_NONE);
  cuuint64_t max = UINT64_MAX;
  d->cuMemPoolSetAttribute(pt, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max);
  d->cuMemAllocFromPoolAsync(&x, 1 << 20, pt, s);
  d->cuMemFreeAsync(x, s);
  d->cuStreamSynchronize(s);
  d->cuMemPoolGetAttribute(pt, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v64);
  printf("probe   pool reserved after 1 MiB alloc+free (threshold max): %llu\n", (unsigned long long)v64);
  d->cuMemPoolTrimTo(pt, 0);
  d->cuMemPoolGetAttribute(pt, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v64);
  printf("probe   pool reserved after trim to 0: %llu\n", (unsigned long long)v64);
  cuuint64_t one = 1;
  show("pool set USED_MEM_HIGH to 1", d->cuMemPoolSetAttribute(pt, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one));
  show("pool set USED_MEM_CURRENT to 0", d->cuMemPoolSetAttribute(pt, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &(cuuint64_t){0}));

  show("cuMemFreeAsync(cuMemAlloc memory)", d->cuMemFreeAsync(dev, s));
  d->cuStreamSynchronize(s);
  d->cuMemAlloc(&dev, 1 << 20);

  CUgraph g;
  d->cuGraphCreate(&g, 0);
  CUgraphNode a, b;
  d->cuGraphAddEmptyNode(&a, g, NULL, 0);
  d->cuGraphAddEmptyNode(&b, g, &a, 1);
  show("cuGraphAddDependencies(duplicate edge)", d->cuGraphAddDependencies(g, &a, &b, NULL, 1));
  show("cuGraphAddDependencies(cycle)", d->cuGraphAddDependencies(g, &b, &a, NULL, 1));
  CUgraphExec xg;
  show("cuGraphInstantiate(cycle)", d->cuGraphInstantiateWithFlags(&xg, g, 0));
  d->cuGraphDestroy(g);

  /* graph allocation rules beyond the document */
  d->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUdeviceptr ga;
  d->cuMemAllocAsync(&ga, 4096, s);
  d->cuMemsetD32Async(ga, 3, 1024, s);
  d->cuStreamEndCapture(s, &g);
  d->cuGraphInstantiateWithFlags(&xg, g, 0);
  show("graph: first launch", d->cuGraphLaunch(xg, s));
  show("graph: relaunch before the first one ran (no sync)", d->cuGraphLaunch(xg, s));
  show("graph: cuMemFreeAsync of the live allocation", d->cuMemFreeAsync(ga, s));
  show("graph: cuMemFreeAsync of it again", d->cuMemFreeAsync(ga, s));
  show("graph: cuMemFree (sync) of graph memory", d->cuMemFree(ga));
  d->cuStreamSynchronize(s);
  show("graph: cuGraphLaunch into a capture", (d->cuStreamBeginCapture(o, CU_STREAM_CAPTURE_MODE_GLOBAL), d->cuGraphLaunch(xg, o)));
  end("graph launch capture", o);
  d->cuGraphExecDestroy(xg);
  d->cuGraphDestroy(g);
  d->cuDeviceGraphMemTrim(0);
  cuuint64_t gu, gr;
  d->cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &gu);
  d->cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &gr);
  printf("probe   graph memory after all freed and trimmed: used %llu reserved %llu\n", (unsigned long long)gu,
         (unsigned long long)gr);
  show("set graph USED_MEM_CURRENT to 0", d->cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &(cuuint64_t){0}));
  show("set graph USED_MEM_HIGH to 5", d->cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &(cuuint64_t){5}));

  float ms;
  CUevent t1, t2;
  d->cuEventCreate(&t1, 0);
  d->cuEventCreate(&t2, 0);
  show("cuEventElapsedTime(never recorded)", d->cuEventElapsedTime(&ms, t1, t2));
  show("cuEventCreate(INTERPROCESS without DISABLE_TIMING)", d->cuEventCreate(&t1, CU_EVENT_INTERPROCESS));
  show("cuCtxSynchronize on a thread without a context", in_thread(NULL, 2));
  show("cuStreamCreateWithPriority(flags 0x10)", d->cuStreamCreateWithPriority(&o, 0x10, 0));
  int prio;
  CUstream ps;
  d->cuStreamCreateWithPriority(&ps, 0, -100);
  d->cuStreamGetPriority(ps, &prio);
  printf("probe   priority -100 reads back as %d\n", prio);
  unsigned long long id0 = 0, id1 = 0;
  show("cuStreamGetId(NULL)", d->cuStreamGetId(NULL, &id0));
  d->cuStreamGetId(ps, &id1);
  printf("probe   stream ids: legacy %llu, new %llu\n", id0, id1);
  show("cuMemsetD32Async(misaligned)", d->cuMemsetD32Async(dev + 2, 0, 1, s));
  show("cuMemAllocAsync(0 bytes)", d->cuMemAllocAsync(&x, 0, s));
  show("cuMemFree(0)", d->cuMemFree(0));
  show("cuLaunchHostFunc(NULL fn)", d->cuLaunchHostFunc(s, NULL, NULL));
  two_devices();
  return 0;
}
