/* Diagnostic without weft (2-GPU machine): two ranks of one process (ncclCommInitAll), each
 * capturing a grouped send+recv to the other rank into a CUDA graph and replaying it 3 times,
 * the value received checked. Forms: argv[1] "threads" (a thread per rank captures its own
 * graph) or "one" (one thread captures both in one NCCL group); argv[2] "graphmem" (the buffers
 * are allocated and freed inside the capture, graph memory nodes) or "plain" (cuMemAlloc before).
 * A phase table is printed if a run is not done in 30 s.
 *   gcc -O1 -I/usr/local/cuda/include tools/diag_nccl_graph_p2p.c -L/usr/local/cuda/lib64/stubs \
 *       -L/usr/local/cuda/lib64 -lcuda -lnccl -lpthread -o diag_nccl_graph_p2p */
#include <cuda.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 64
static CUcontext ctx[2];
static CUstream st[2];
static ncclComm_t comm[2];
static int graphmem, threads;
static volatile const char *phase[2] = {"start", "start"};

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
#define NK(x)                                                                                      \
  do {                                                                                             \
    ncclResult_t e_ = (x);                                                                         \
    if (e_ != ncclSuccess) {                                                                       \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(e_));           \
      exit(2);                                                                                     \
    }                                                                                              \
  } while (0)

static CUdeviceptr out[2], pin[2], pout[2];
static CUgraph g[2];
static CUgraphExec ge[2];

/* Rank r's part of the capture (its stream already capturing). */
static void capture_body(int r, CUdeviceptr *t1, CUdeviceptr *t2) {
  if (graphmem) {
    CK(cuMemAllocAsync(t1, N * 4, st[r]));
    CK(cuMemAllocAsync(t2, N * 4, st[r]));
  } else {
    *t1 = pin[r];
    *t2 = pout[r];
  }
  CK(cuMemsetD32Async(*t1, 100u * (unsigned)r + 7, N, st[r]));
}

static void capture_tail(int r, CUdeviceptr t1, CUdeviceptr t2) {
  CK(cuMemcpyDtoDAsync(out[r], t2, N * 4, st[r]));
  if (graphmem) {
    CK(cuMemFreeAsync(t1, st[r]));
    CK(cuMemFreeAsync(t2, st[r]));
  }
}

static void replay_and_check(int r) {
  for (int rep = 0; rep < 3; rep++) {
    CK(cuMemsetD32Async(out[r], 0xdead, N, st[r]));
    phase[r] = "launch";
    CK(cuGraphLaunch(ge[r], st[r]));
    phase[r] = "synchronize";
    CK(cuStreamSynchronize(st[r]));
    unsigned got[N];
    CK(cuMemcpyDtoH(got, out[r], sizeof got));
    unsigned want = 100u * (unsigned)(1 - r) + 7;
    if (got[0] != want) {
      fprintf(stderr, "rank %d replay %d: %u, want %u\n", r, rep, got[0], want);
      exit(1);
    }
  }
  phase[r] = "done";
}

static void *rank_thread(void *arg) {
  int r = (int)(long)arg;
  CK(cuCtxSetCurrent(ctx[r]));
  CUdeviceptr t1, t2;
  phase[r] = "capture";
  CK(cuStreamBeginCapture(st[r], CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  capture_body(r, &t1, &t2);
  phase[r] = "group end";
  NK(ncclGroupStart());
  NK(ncclSend((void *)t1, N, ncclUint32, 1 - r, comm[r], st[r]));
  NK(ncclRecv((void *)t2, N, ncclUint32, 1 - r, comm[r], st[r]));
  NK(ncclGroupEnd());
  capture_tail(r, t1, t2);
  phase[r] = "end capture";
  CK(cuStreamEndCapture(st[r], &g[r]));
  phase[r] = "instantiate";
  CK(cuGraphInstantiate(&ge[r], g[r], 0));
  replay_and_check(r);
  return NULL;
}

static void on_alarm(int s) {
  (void)s;
  fprintf(stderr, "HANG (%s, %s): rank 0 at %s, rank 1 at %s\n", threads ? "threads" : "one", graphmem ? "graphmem" : "plain",
          phase[0], phase[1]);
  _exit(3);
}

int main(int argc, char **argv) {
  threads = argc > 1 && strcmp(argv[1], "threads") == 0;
  graphmem = argc > 2 && strcmp(argv[2], "graphmem") == 0;
  signal(SIGALRM, on_alarm);
  alarm(30);
  CK(cuInit(0));
  for (int r = 0; r < 2; r++) {
    CUdevice d;
    CK(cuDeviceGet(&d, r));
    CK(cuDevicePrimaryCtxRetain(&ctx[r], d));
    CK(cuCtxSetCurrent(ctx[r]));
    CK(cuStreamCreate(&st[r], CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc(&out[r], N * 4));
    CK(cuMemAlloc(&pin[r], N * 4));
    CK(cuMemAlloc(&pout[r], N * 4));
  }
  int devs[2] = {0, 1};
  NK(ncclCommInitAll(comm, 2, devs));
  /* connect send/recv eagerly, from one thread */
  NK(ncclGroupStart());
  for (int r = 0; r < 2; r++) {
    NK(ncclSend((void *)pin[r], N, ncclUint32, 1 - r, comm[r], st[r]));
    NK(ncclRecv((void *)pout[r], N, ncclUint32, 1 - r, comm[r], st[r]));
  }
  NK(ncclGroupEnd());
  for (int r = 0; r < 2; r++) {
    CK(cuCtxSetCurrent(ctx[r]));
    CK(cuStreamSynchronize(st[r]));
  }
  if (threads) {
    pthread_t th[2];
    for (long r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_thread, (void *)r);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  } else {
    CUdeviceptr t1[2], t2[2];
    for (int r = 0; r < 2; r++) {
      CK(cuCtxSetCurrent(ctx[r]));
      CK(cuStreamBeginCapture(st[r], CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
      capture_body(r, &t1[r], &t2[r]);
    }
    NK(ncclGroupStart());
    for (int r = 0; r < 2; r++) {
      NK(ncclSend((void *)t1[r], N, ncclUint32, 1 - r, comm[r], st[r]));
      NK(ncclRecv((void *)t2[r], N, ncclUint32, 1 - r, comm[r], st[r]));
    }
    NK(ncclGroupEnd());
    for (int r = 0; r < 2; r++) {
      CK(cuCtxSetCurrent(ctx[r]));
      capture_tail(r, t1[r], t2[r]);
      CK(cuStreamEndCapture(st[r], &g[r]));
      CK(cuGraphInstantiate(&ge[r], g[r], 0));
    }
    /* replays: both ranks launched before either is waited for */
    for (int rep = 0; rep < 3; rep++) {
      for (int r = 0; r < 2; r++) {
        CK(cuCtxSetCurrent(ctx[r]));
        CK(cuMemsetD32Async(out[r], 0xdead, N, st[r]));
        CK(cuGraphLaunch(ge[r], st[r]));
      }
      for (int r = 0; r < 2; r++) {
        CK(cuCtxSetCurrent(ctx[r]));
        CK(cuStreamSynchronize(st[r]));
        unsigned got[N];
        CK(cuMemcpyDtoH(got, out[r], sizeof got));
        if (got[0] != 100u * (unsigned)(1 - r) + 7) {
          fprintf(stderr, "rank %d: %u\n", r, got[0]);
          return 1;
        }
      }
    }
  }
  printf("OK (%s, %s)\n", threads ? "threads" : "one", graphmem ? "graphmem" : "plain");
  return 0;
}
