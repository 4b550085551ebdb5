/* The simulated NCCL (sim/nccl.c) across two processes that share one ncclUniqueId (two simulated
 * devices, WEFT_SIM_DEVICES=2 in BUILD): each case spawns this binary again as rank 1 (on device 1,
 * `--rank1 IDFILE CASE`, the id written to a file) and runs rank 0 (on device 0) itself. Every
 * collective and a send / receive pair in one group give the right data on both ranks, in place
 * too, 20 all-reduces in a row as well; a captured all-reduce replays, each launch a new
 * collective; the board the id names is gone once both ranks destroyed their communicators; a
 * partner process that never posts leaves the synchronisation timing out. The race oracle is
 * per process: no race on either side. Every case is bounded (30 s), so a hang fails. */
#include <dirent.h>
#include <errno.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/sim/sim_test.h"

#define N 1024
#define BOUND_S 30 /* the longest a case may take, in either process */

static const weft_sim_api_t *api;
static int g_rank;           /* this process's rank (and device) */
static CUstream st;          /* this rank's stream: a new one each case (a failed case's may be stuck) */
static CUdeviceptr buf, out; /* 2 * N elements of up to 8 bytes each */
static pid_t g_child;        /* rank 0: the running rank 1, or 0 */
static int g_release = -1;   /* rank 0: the write end of the rank 1's stdin */

/* A failed check: rank 0 fails its cmocka test; rank 1 prints it and exits 1. */
static void failed(int line, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_rank == 1) {
    fprintf(stderr, "test_nccl_procs: rank 1 (child), line %d: %s\n", line, msg);
    exit(1);
  }
  fail_msg("rank 0, line %d: %s", line, msg);
  exit(1); /* not reached: fail_msg leaves the test */
}

#define CHECK(cond) \
  do { if (!(cond)) failed(__LINE__, "%s", #cond); } while (0)
#define CHECK_AT(i, got, want)                                                              \
  do {                                                                                      \
    if ((got) != (want))                                                                    \
      failed(__LINE__, "element %d: got %g, want %g", (int)(i), (double)(got), (double)(want)); \
  } while (0)
#define CU_CHECK(expr)                                                                      \
  do {                                                                                      \
    CUresult r_ = (expr);                                                                   \
    if (r_ != CUDA_SUCCESS) failed(__LINE__, "%s returned CUresult %d", #expr, (int)r_);    \
  } while (0)
#define NC_CHECK(expr)                                                                      \
  do {                                                                                      \
    ncclResult_t r_ = (expr);                                                               \
    if (r_ != ncclSuccess)                                                                  \
      failed(__LINE__, "%s returned %d (%s)", #expr, (int)r_, ncclGetLastError(NULL));      \
  } while (0)

/* ---- one rank's side ---- */

static void setup_process(int rank) {
  g_rank = rank;
  api = sim_test_init();
  CUcontext ctx;
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx, rank));
  CU_CHECK(cuCtxSetCurrent(ctx));
  CU_CHECK(cuMemAlloc(&buf, 2 * N * 8));
  CU_CHECK(cuMemAlloc(&out, 2 * N * 8));
}

/* A new stream, and this rank's communicator of id. */
static ncclComm_t join(const ncclUniqueId *id) {
  st = sim_test_stream();
  ncclComm_t c = NULL;
  NC_CHECK(ncclCommInitRank(&c, 2, *id, g_rank));
  int n = 0, rank = -1, dev = -1;
  NC_CHECK(ncclCommCount(c, &n));
  NC_CHECK(ncclCommUserRank(c, &rank));
  NC_CHECK(ncclCommCuDevice(c, &dev));
  CHECK(n == 2 && rank == g_rank && dev == g_rank);
  return c;
}

/* The end of a case that ran: no race, the communicator and the stream destroyed. */
static void leave(ncclComm_t c) {
  NC_CHECK(ncclCommDestroy(c));
  CU_CHECK(cuStreamDestroy(st));
  CHECK(api->race_count() == 0);
}

static void put(CUdeviceptr p, const void *host, size_t bytes) { CU_CHECK(cuMemcpyHtoD(p, host, bytes)); }

/* Fills out with 0xff bytes (-1 as integers, NaN as floats), so a collective that writes nothing
 * there fails. */
static void poison_out(void) {
  static unsigned char junk[2 * N * 8];
  memset(junk, 0xff, sizeof junk);
  put(out, junk, sizeof junk);
}

static void get(CUdeviceptr p, void *host, size_t bytes) {
  CU_CHECK(cuStreamSynchronize(st));
  CU_CHECK(cuMemcpyDtoH(host, p, bytes));
}

static void collectives(const ncclUniqueId *id) {
  ncclComm_t c = join(id);
  const int r = g_rank;
  float f[N];
  int32_t h[2 * N], got[2 * N];
  /* All-reduce (sum): in place (float32), then out of place (int32). */
  for (int i = 0; i < N; i++) f[i] = (float)(i + 1000 * r);
  put(buf, f, sizeof f);
  NC_CHECK(ncclAllReduce((void *)buf, (void *)buf, N, ncclFloat32, ncclSum, c, st));
  get(buf, f, sizeof f);
  for (int i = 0; i < N; i++) CHECK_AT(i, f[i], (float)(2 * i + 1000));
  for (int i = 0; i < 2 * N; i++) h[i] = i * (r + 1);
  put(buf, h, sizeof h);
  poison_out();
  NC_CHECK(ncclAllReduce((void *)buf, (void *)out, N, ncclInt32, ncclSum, c, st));
  get(out, got, N * 4);
  for (int i = 0; i < N; i++) CHECK_AT(i, got[i], 3 * i);
  /* Average (float64): of i and i + 2. */
  double d[N];
  for (int i = 0; i < N; i++) d[i] = (double)(i + 2 * r);
  put(buf, d, sizeof d);
  poison_out();
  NC_CHECK(ncclAllReduce((void *)buf, (void *)out, N, ncclFloat64, ncclAvg, c, st));
  get(out, d, sizeof d);
  for (int i = 0; i < N; i++) CHECK_AT(i, d[i], (double)(i + 1));
  /* Broadcast from rank 1, reduce (max) to rank 0, all-gather, reduce-scatter (sum), of h. */
  put(buf, h, sizeof h);
  poison_out();
  NC_CHECK(ncclBroadcast((void *)buf, (void *)out, N, ncclInt32, 1, c, st));
  get(out, got, N * 4);
  for (int i = 0; i < N; i++) CHECK_AT(i, got[i], 2 * i);
  poison_out();
  NC_CHECK(ncclReduce((void *)buf, (void *)out, N, ncclInt32, ncclMax, 0, c, st));
  get(out, got, N * 4);
  if (r == 0)
    for (int i = 0; i < N; i++) CHECK_AT(i, got[i], 2 * i);
  poison_out();
  NC_CHECK(ncclAllGather((void *)buf, (void *)out, N, ncclInt32, c, st));
  get(out, got, 2 * N * 4);
  for (int i = 0; i < N; i++) {
    CHECK_AT(i, got[i], i);
    CHECK_AT(N + i, got[N + i], 2 * i);
  }
  poison_out();
  NC_CHECK(ncclReduceScatter((void *)buf, (void *)out, N, ncclInt32, ncclSum, c, st));
  get(out, got, N * 4);
  for (int i = 0; i < N; i++) CHECK_AT(i, got[i], 3 * (r * N + i));
  /* Send / receive both ways in one group: rank 0 posts its send first, rank 1 its receive. */
  for (int i = 0; i < N; i++) h[i] = 7 * i + r;
  put(buf, h, N * 4);
  poison_out();
  NC_CHECK(ncclGroupStart());
  if (r == 0) NC_CHECK(ncclSend((void *)buf, N, ncclInt32, 1, c, st));
  NC_CHECK(ncclRecv((void *)out, N, ncclInt32, 1 - r, c, st));
  if (r == 1) NC_CHECK(ncclSend((void *)buf, N, ncclInt32, 0, c, st));
  NC_CHECK(ncclGroupEnd());
  get(out, got, N * 4);
  for (int i = 0; i < N; i++) CHECK_AT(i, got[i], 7 * i + (1 - r));
  /* 20 in-place all-reduces (sum, int64) queued before one synchronisation: 3i, doubled 19 times. */
  int64_t x[N];
  for (int i = 0; i < N; i++) x[i] = (int64_t)i * (r + 1);
  put(buf, x, sizeof x);
  for (int k = 0; k < 20; k++) NC_CHECK(ncclAllReduce((void *)buf, (void *)buf, N, ncclInt64, ncclSum, c, st));
  get(buf, x, sizeof x);
  for (int i = 0; i < N; i++) CHECK_AT(i, x[i], ((int64_t)3 * i) << 19);
  leave(c);
}

/* Each rank captures an in-place all-reduce; 3 launches with new inputs, an eager all-reduce
 * between the second and the third (sequence numbers stay in step across processes). */
static void captured(const ncclUniqueId *id) {
  ncclComm_t c = join(id);
  CUgraph g;
  CUgraphExec x;
  CU_CHECK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_RELAXED));
  NC_CHECK(ncclAllReduce((void *)buf, (void *)buf, N, ncclFloat32, ncclSum, c, st));
  CU_CHECK(cuStreamEndCapture(st, &g));
  CU_CHECK(cuGraphInstantiateWithFlags(&x, g, 0));
  for (int launch = 0; launch < 3; launch++) {
    float h[N], got[N];
    for (int i = 0; i < N; i++) h[i] = (float)(i * (launch + 1) + g_rank);
    put(buf, h, sizeof h);
    if (launch == 2) {
      poison_out();
      NC_CHECK(ncclAllReduce((void *)buf, (void *)out, N, ncclFloat32, ncclSum, c, st));
      get(out, got, sizeof got);
      for (int i = 0; i < N; i++) CHECK_AT(i, got[i], (float)(2 * i * (launch + 1) + 1));
    }
    CU_CHECK(cuGraphLaunch(x, st));
    get(buf, got, sizeof got);
    for (int i = 0; i < N; i++) CHECK_AT(i, got[i], (float)(2 * i * (launch + 1) + 1));
  }
  CU_CHECK(cuGraphExecDestroy(x));
  CU_CHECK(cuGraphDestroy(g));
  leave(c);
}

/* One all-reduce; rank 0 sees the board while both communicators live. */
static void board(const ncclUniqueId *id) {
  ncclComm_t c = join(id);
  const char *dir = (const char *)id->internal + 16;
  struct stat sb;
  if (g_rank == 0) CHECK(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode));
  int32_t h[N];
  for (int i = 0; i < N; i++) h[i] = i + g_rank;
  put(buf, h, sizeof h);
  NC_CHECK(ncclAllReduce((void *)buf, (void *)buf, N, ncclInt32, ncclSum, c, st));
  get(buf, h, sizeof h);
  for (int i = 0; i < N; i++) CHECK_AT(i, h[i], 2 * i + 1);
  leave(c);
}

static int reap(void);
static void expect_rank1_ok(int status);

/* Rank 1 joins and never posts. Rank 0's all-reduce times out while rank 1 lives (blocked on its
 * stdin), and again once rank 1 destroyed its communicator and exited. */
static void never_posts(const ncclUniqueId *id) {
  ncclComm_t c = join(id);
  if (g_rank == 1) {
    char ch;
    while (read(0, &ch, 1) > 0) {
    }
    NC_CHECK(ncclCommDestroy(c));
    return;
  }
  NC_CHECK(ncclAllReduce((void *)buf, (void *)out, N, ncclFloat32, ncclSum, c, st));
  CU_IS(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(st));
  expect_rank1_ok(reap()); /* closes rank 1's stdin */
  CU_IS(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(st));
  CHECK(api->race_count() == 0);
  /* Its all-reduce is still queued: abort may drop it (the last rank: the board goes) or refuse
   * (ncclInvalidUsage: the board stays, so this removes it, not to leave it in /dev/shm). */
  const char *dir = (const char *)id->internal + 16;
  ncclResult_t a = ncclCommAbort(c);
  if (a != ncclSuccess && a != ncclInvalidUsage) failed(__LINE__, "ncclCommAbort returned %d", (int)a);
  struct stat sb;
  if (a == ncclSuccess) CHECK(stat(dir, &sb) == -1 && errno == ENOENT);
  DIR *d = opendir(dir);
  if (d == NULL) return;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlinkat(dirfd(d), e->d_name, 0);
  closedir(d);
  rmdir(dir);
}

typedef struct side {
  const char *name;
  void (*run)(const ncclUniqueId *id);
} side_t;
static const side_t sides[] = {
    {"collectives", collectives}, {"captured", captured}, {"board", board}, {"never_posts", never_posts}};

static const side_t *side_named(const char *name) {
  for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++)
    if (strcmp(sides[i].name, name) == 0) return &sides[i];
  return NULL;
}

/* Child mode: rank 1's side of one case. */
static int rank1_main(const char *idfile, const char *name) {
  g_rank = 1;
  alarm(BOUND_S); /* a hang kills it (SIGALRM): rank 0 reports the signal */
  const side_t *s = side_named(name);
  ncclUniqueId id;
  FILE *f = fopen(idfile, "rb");
  if (s == NULL || f == NULL || fread(&id, sizeof id, 1, f) != 1) {
    fprintf(stderr, "test_nccl_procs: rank 1: no case '%s' or unreadable id file %s\n", name, idfile);
    return 2;
  }
  fclose(f);
  setup_process(1);
  s->run(&id);
  return 0;
}

/* ---- rank 0: spawning and reaping rank 1 ---- */

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_nccl_procs: rank 0 hung: a case took longer than 30 s\n";
  if (write(2, msg, sizeof msg - 1) < 0) {
  }
  if (g_child > 0) kill(g_child, SIGKILL);
  _exit(1);
}

/* Rank 1 of a case, its stdin a pipe from here (g_release), the id in a file. */
static void spawn(const char *name, const ncclUniqueId *id) {
  static int n;
  static char dir[4096];
  if (dir[0] == 0) {
    const char *t = getenv("TEST_TMPDIR");
    if (t != NULL && *t) snprintf(dir, sizeof dir, "%s", t);
    else assert_non_null(mkdtemp(strcpy(dir, "/tmp/test_nccl_procs-XXXXXX")));
  }
  char idfile[4200];
  snprintf(idfile, sizeof idfile, "%s/id-%d-%d", dir, (int)getpid(), n++);
  FILE *f = fopen(idfile, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(id, sizeof *id, 1, f), 1);
  assert_int_equal(fclose(f), 0);
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[0], 0);
    close(p[0]);
    close(p[1]);
    char *argv[] = {"/proc/self/exe", "--rank1", idfile, (char *)name, NULL};
    execv(argv[0], argv);
    _exit(127);
  }
  close(p[0]);
  g_release = p[1];
  g_child = pid;
  alarm(BOUND_S);
}

/* Waits up to BOUND_S for rank 1 (then kills it); its wait status, or -1 when it was killed. */
static int reap(void) {
  if (g_release >= 0) close(g_release);
  g_release = -1;
  if (g_child <= 0) return 0;
  int status = -1;
  struct timespec tick = {0, 10 * 1000 * 1000};
  for (int i = 0; i < BOUND_S * 100; i++) {
    pid_t w = waitpid(g_child, &status, WNOHANG);
    if (w == g_child) break;
    if (w < 0 && errno != EINTR) break;
    nanosleep(&tick, NULL);
    if (i == BOUND_S * 100 - 1) {
      kill(g_child, SIGKILL);
      waitpid(g_child, NULL, 0);
      status = -1;
    }
  }
  g_child = 0;
  alarm(0);
  return status;
}

static void expect_rank1_ok(int status) {
  if (status == -1) fail_msg("rank 1 did not exit within %d s (killed)", BOUND_S);
  if (WIFSIGNALED(status)) fail_msg("rank 1 was killed by signal %d", WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("rank 1 exited with status %d (its stderr says why)", WEXITSTATUS(status));
}

/* Rank 0's side of case `name` against a spawned rank 1; returns the id. */
static ncclUniqueId run_case(const char *name) {
  ncclUniqueId id;
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  spawn(name, &id);
  side_named(name)->run(&id);
  expect_rank1_ok(reap());
  return id;
}

static int teardown(void **state) { /* after a failed check: no rank 1 left behind */
  (void)state;
  if (g_child > 0) kill(g_child, SIGKILL);
  reap();
  return 0;
}

static void test_two_processes_run_every_collective(void **state) {
  (void)state;
  run_case("collectives");
}

static void test_two_processes_replay_a_captured_all_reduce(void **state) {
  (void)state;
  run_case("captured");
}

static void test_the_board_is_removed(void **state) {
  (void)state;
  ncclUniqueId id = run_case("board");
  const char *dir = (const char *)id.internal + 16;
  assert_memory_equal(id.internal, "weft-sim", 8);
  assert_int_equal(dir[0], '/');
  struct stat sb;
  assert_int_equal(stat(dir, &sb), -1);
  assert_int_equal(errno, ENOENT);
}

static void test_a_partner_process_that_never_posts_times_out(void **state) {
  (void)state;
  run_case("never_posts");
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--rank1") == 0) return rank1_main(argv[2], argv[3]);
  signal(SIGALRM, on_alarm);
  setup_process(0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_two_processes_run_every_collective, teardown),
      cmocka_unit_test_teardown(test_two_processes_replay_a_captured_all_reduce, teardown),
      cmocka_unit_test_teardown(test_the_board_is_removed, teardown),
      /* Last: rank 0's all-reduce stays queued if the abort refuses. */
      cmocka_unit_test_teardown(test_a_partner_process_that_never_posts_times_out, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
