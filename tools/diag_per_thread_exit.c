/* Diagnostic without weft (GPU machine): threads that work on their per-thread default stream
 * (CU_STREAM_PER_THREAD) and end, one after another, each ordered after the previous one's work
 * through events, as weft orders them. argv[1] picks the steps of each thread: w (wait for the
 * previous work's event on its per-thread stream), m (a memset there), r (record an event there,
 * which the main thread's stream then waits for), p (an allocation from a pool there,
 * cuMemAllocFromPoolAsync; with a: cuMemAllocAsync from the device's default pool), u (a memset
 * of it there), f (its free there, cuMemFreeAsync; else the main thread frees it after the
 * join), h (the pool's calls on a helper stream instead, ordered by events), s (synchronise its
 * per-thread stream before it ends), c (cuCtxSynchronize before it ends), q (query the event it
 * recorded), H (the allocation's stream synchronised by the host right after it), z (sleep 200 ms before it ends), Q (cuStreamQuery of its stream until done), K and X
 * (its stream synchronised by a handler at its exit, see exit_sync).
 * argv[2]: threads (default 20). A join not done in 10 s prints
 * the phase of the thread and exits 3.
 *   gcc -O1 -g -I/usr/local/cuda/include tools/diag_per_thread_exit.c -L/usr/local/cuda/lib64/stubs \
 *       -lcuda -lpthread -o diag_per_thread_exit */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CK(x)                                                                                      \
  do {                                                                                             \
    CUresult e_ = (x);                                                                             \
    if (e_ != CUDA_SUCCESS) {                                                                      \
      const char *s_;                                                                              \
      cuGetErrorName(e_, &s_);                                                                     \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);                               \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

static CUcontext ctx;
static CUdeviceptr buf;
static CUmemoryPool pool;
static CUevent prev;  /* the previous work's event (the main stream's) */
static CUevent mine;  /* the thread's recorded event */
static const char *steps;
static volatile const char *phase = "start";
#define PH(name, call) do { phase = name; CK(call); } while (0)
static volatile int current = -1;

static CUstream helper;      /* h: the pool's calls go here, ordered before the per-thread stream */
static CUevent helped;
static CUdeviceptr kept;     /* an allocation the thread did not free (the main thread frees it) */

/* K, X: the thread's per-thread stream synchronised at its exit, by a pthread key's destructor
 * (K, the key made after cuInit) or a C++-style thread-exit handler (X, registered after the
 * thread's first driver call): whether it runs before the driver's own teardown. */
static pthread_key_t exit_key;
static volatile int exit_sync_rc = -1;
static void exit_sync(void *arg) {
  (void)arg;
  exit_sync_rc = (int)cuStreamSynchronize(CU_STREAM_PER_THREAD);
}
extern int __cxa_thread_atexit_impl(void (*)(void *), void *, void *);
extern void *__dso_handle;

static void *body(void *arg) {
  int i = (int)(long)arg;
  CK(cuCtxSetCurrent(ctx));
  CUstream pt = CU_STREAM_PER_THREAD;
  if (strchr(steps, 'w')) PH("wait", cuStreamWaitEvent(pt, prev, 0));
  if (strchr(steps, 'm')) PH("memset", cuMemsetD32Async(buf, (unsigned)i, 1 << 20, pt));
  if (strchr(steps, 'p')) {
    CUstream on = strchr(steps, 'h') ? helper : pt;
    CUdeviceptr t;
    if (strchr(steps, 'a')) PH("default pool alloc", cuMemAllocAsync(&t, 4 << 20, on));
    else PH("pool alloc", cuMemAllocFromPoolAsync(&t, 4 << 20, pool, on));
    if (on != pt) {
      PH("helper record", cuEventRecord(helped, on));
      PH("helper wait", cuStreamWaitEvent(pt, helped, 0));
    }
    if (strchr(steps, 'H')) PH("host sync after the allocation", cuStreamSynchronize(on));
    if (strchr(steps, 'u')) PH("pool memset", cuMemsetD32Async(t, 1, 1 << 20, pt));
    if (strchr(steps, 'f')) {
      if (on != pt) {
        PH("record before free", cuEventRecord(helped, pt));
        PH("helper waits", cuStreamWaitEvent(on, helped, 0));
      }
      PH("pool free", cuMemFreeAsync(t, on));
    } else {
      kept = t;
    }
  }
  if (strchr(steps, 'r')) PH("record", cuEventRecord(mine, pt));
  if (strchr(steps, 'q')) phase = "query", (void)cuEventQuery(mine);
  if (strchr(steps, 's')) PH("sync", cuStreamSynchronize(pt));
  if (strchr(steps, 'c')) PH("ctx sync", cuCtxSynchronize());
  if (strchr(steps, 'z')) phase = "sleep", usleep(200000);
  if (strchr(steps, 'Q')) {
    phase = "query until done";
    while (cuStreamQuery(pt) == CUDA_ERROR_NOT_READY) {
    }
  }
  if (strchr(steps, 'K')) pthread_setspecific(exit_key, (void *)1);
  if (strchr(steps, 'X')) __cxa_thread_atexit_impl(exit_sync, NULL, __dso_handle);
  phase = "exit";
  return NULL;
}

static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    int seen = current;
    sleep(10);
    if (seen == current && seen >= 0) {
      printf("steps %s: thread %d not joined after 10 s, phase %s\n", steps, seen, phase);
      fflush(stdout);
      _exit(3);
    }
  }
}

int main(int argc, char **argv) {
  steps = argc > 1 ? argv[1] : "wmr";
  int n = argc > 2 ? atoi(argv[2]) : 20;
  CUdevice dev;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuMemAlloc(&buf, 4 << 20));
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CK(cuMemPoolCreate(&pool, &props));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CK(cuEventCreate(&prev, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&mine, CU_EVENT_DISABLE_TIMING));
  pthread_key_create(&exit_key, exit_sync);
  CK(cuStreamCreate(&helper, CU_STREAM_NON_BLOCKING));
  CK(cuEventCreate(&helped, CU_EVENT_DISABLE_TIMING));
  CK(cuMemsetD32Async(buf, 7, 1 << 20, s));
  CK(cuEventRecord(prev, s));
  pthread_t w;
  pthread_create(&w, NULL, watchdog, NULL);
  for (int i = 0; i < n; i++) {
    pthread_t th;
    phase = "start";
    current = i;
    pthread_create(&th, NULL, body, (void *)(long)i);
    pthread_join(th, NULL);
    current = -1;
    if (strchr(steps, 'K') || strchr(steps, 'X')) {
      if (exit_sync_rc != 0) {
        printf("steps %s: thread %d: the exit handler's cuStreamSynchronize gave %d\n", steps, i, exit_sync_rc);
        return 4;
      }
      exit_sync_rc = -1;
    }
    if (strchr(steps, 'r')) CK(cuStreamWaitEvent(s, mine, 0));
    if (kept != 0) {
      CK(cuCtxSynchronize()); /* (the thread's work: it recorded nothing to wait for) */
      CK(cuMemFreeAsync(kept, s));
      kept = 0;
    }
    CK(cuMemsetD32Async(buf, 9, 1 << 20, s));
    CK(cuEventRecord(prev, s));
  }
  CK(cuStreamSynchronize(s));
  printf("steps %s: %d threads ok\n", steps, n);
  return 0;
}
