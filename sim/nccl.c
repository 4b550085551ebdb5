/* Simulated NCCL: nccl.h's ABI over the simulated devices of one process, so that programs that
 * drive collectives (weft's communicators, the data-parallel example) run in CI with the race
 * oracle. libweft_sim.so exports nccl* next to cu*.
 *
 * Communicators: ncclCommInitAll (one rank per listed device), or ncclCommInitRank with one
 * unique id from ncclGetUniqueId (each rank on its own thread or in its own process, blocking
 * until all joined, or all ranks inside one ncclGroupStart/End). Ranks of one id form a *clique*.
 *
 * Processes: a unique id names a *board*, a directory (in /dev/shm where there is one, else
 * TMPDIR or /tmp) through which the processes of a clique meet. Each rank registers there
 * (rank-R holds its pid); ncclCommInitRank returns once every rank registered, or fails with
 * ncclSystemError after WEFT_SIM_NCCL_WAIT_MS (10 s at least). A rank of another process is *remote*. When a
 * fused operation reaches its stream's head it *posts* its parts for its remote partners, each
 * a file made whole at once (link or rename): a collective's send bytes for every remote rank
 * (c-SEQ-FROM-TO), a send's bytes (s-SEQ-FROM-TO), and a receive's arrival (r-SEQ-TO-FROM, for
 * its sender). Its remote partners are ready when their files are there; the reader takes each
 * file and removes it. Results are computed in rank order from every rank's bytes, so every
 * process computes the same values. The oracle stays per process: its clocks order the local
 * members only (memory of other processes is not this process's). The last rank destroyed
 * removes what was addressed to its process and the board.
 *
 * A collective or a send/receive is an operation on the caller's stream. Inside a group, every
 * operation of one communicator on one stream becomes one fused operation, as NCCL fuses a
 * group's work into one kernel per rank (so a rank may post its send and its receive in either
 * order). Each collective call of a communicator takes the next sequence number; the calls with
 * the same number on every rank are one collective. A send from a to b matches b's receive from
 * a with the same per-pair number.
 *
 * Rendezvous: a fused operation is ready when, for every part of it, the partners (the same
 * collective on every other rank, the matching receive or send) are fused operations at the
 * heads of their streams, and so on transitively. Then the whole set runs at once: every member
 * stream's clock becomes the join of all members' clocks (a collective synchronises its ranks)
 * and is ticked on its own lane; each rank's part reads its send range and writes its receive
 * range with its own clock (the oracle sees a collective that starts before its input is written
 * as a race), and the results are computed from copies of every send buffer taken first (so
 * in-place collectives are right). Partners never posted leave the operation waiting: a
 * synchronisation then times out (CUDA_ERROR_LAUNCH_TIMEOUT), where NCCL would hang.
 *
 * Captured on a capturing stream, an operation becomes a graph node (a kernel node, as NCCL's
 * are) holding a template; each launch of the graph makes it an operation of that launch, with the
 * communicator's next sequence numbers taken at the launch's start in node order, which runs when
 * its partners (nodes of the other ranks' launches, or queued operations) are ready, as above.
 *
 * Data types: int8, uint8, int32, uint32, int64, uint64, float32, float64; operations sum, prod,
 * max, min, avg. float16 / bfloat16 and pre-multiplied sums are not modelled
 * (ncclInvalidArgument, counted as unimplemented). Fault injection reaches every nccl function ("ncclAllReduce:1:2": the first
 * call returns ncclResult_t 2).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim/internal.h"

#define SIM_MAGIC_COMM 0x434f4d4du

typedef enum { P_ALLREDUCE, P_BROADCAST, P_REDUCE, P_ALLGATHER, P_REDUCESCATTER, P_SEND, P_RECV } part_kind_t;

/* One collective call, or one side of a send / receive, of one rank. */
typedef struct part {
  part_kind_t kind;
  const void *send;
  void *recv;
  size_t count; /* elements: per rank for all-gather (send) and reduce-scatter (receive) */
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root, peer;
  uint64_t seq; /* collectives: the communicator's; send / receive: per peer and direction */
  bool numbered; /* took its sequence number when called (queued, not captured) */
} part_t;

typedef struct sim__clique sim__clique_t;

struct sim__comm {
  uint32_t magic;
  sim__clique_t *q;
  int rank, dev;
  uint64_t coll_seq;
  uint64_t *send_seq, *recv_seq; /* [nranks] */
  ncclResult_t async;
  int aborted; /* ncclCommAbort took it out of its clique; its aborted operations free it */
  /* NCCL connects a communicator lazily: its collectives' connections at its first collective
   * (all-reduce, all-gather, broadcast, reduce, reduce-scatter share them), its point-to-point
   * ones at its first send or receive (connect, below). */
  int coll_connected, p2p_connected;
  /* Graph nodes holding its collectives as templates (captured, cloned, instantiated). NCCL's
   * ncclCommDestroy waits until the graphs that captured the communicator's collectives are
   * destroyed (CUDA_SEMANTICS.md; conformance_nccl "destroy with a live graph"): here it refuses
   * while any is alive. An aborted communicator's memory stays until its last one goes. */
  size_t graph_refs;
};
typedef struct sim__comm sim__comm_t;

/* One rank's fused operation: queued on a stream until it runs (stream and op), or a node of a
 * graph launch (exec and node), or, in a graph, the template its launches copy (none of them). */
typedef struct fused {
  sim__comm_t *comm;
  sim__stream_t *stream;
  sim__op_t *op;
  sim__exec_t *exec;
  size_t node;
  part_t *parts;
  size_t n;
  struct fused *next; /* the clique's queued operations */
  int mark;           /* visited by the readiness walk */
  int posted;         /* its parts are on the board for its remote partners */
  int aborted;        /* its communicator was aborted: it runs alone, doing nothing */
} fused_t;

/* The longest board path a unique id holds (after "weft-sim" and the counter). */
#define BOARD_MAX (NCCL_UNIQUE_ID_BYTES - 16)

struct sim__clique {
  ncclUniqueId id;
  int by_id;          /* made by ncclCommInitRank (found by id) */
  char board[BOARD_MAX]; /* the id's board ("" for ids not made here, ncclCommInitAll) */
  int remote;         /* some rank lives in another process (known once every rank joined) */
  int complete;       /* every rank joined */
  int nranks, joined;
  sim__comm_t **ranks;
  fused_t *queued;
  sim__clique_t *next;
};

static sim__clique_t *g_cliques;
static pthread_cond_t g_joined = PTHREAD_COND_INITIALIZER;
static uint64_t g_next_id = 1;

/* A group in progress on this thread: its parts by (communicator, stream), in call order. */
typedef struct grouped {
  sim__comm_t *comm;
  sim__stream_t *stream;
  part_t *parts;
  size_t n, cap;
} grouped_t;
static __thread int g_depth;
static __thread grouped_t *g_grouped;
static __thread size_t g_ngrouped, g_capgrouped;
static __thread ncclResult_t g_group_error;

/* ---- entry and exit ---- */

/* A call that fails inside a group fails the group: its end returns the first failure and
 * enqueues nothing (the simulator's model: only injected faults make a call of a valid group fail,
 * which cannot be done on a GPU). */
#define NCCL_CALL(fn, expr)                                            \
  do {                                                                 \
    CUresult sim_r_ = sim__enter(SIM_FN_##fn, 1);                      \
    ncclResult_t nr_ = sim_r_ == CUDA_SUCCESS ? (expr) : from_cu(sim_r_); \
    if (nr_ != ncclSuccess && g_depth > 0 && g_group_error == ncclSuccess) g_group_error = nr_; \
    sim__leave();                                                      \
    return nr_;                                                        \
  } while (0)

/* A refused entry: not initialised (cuInit), or an injected fault's code as an ncclResult_t. */
static ncclResult_t from_cu(CUresult r) {
  return r == CUDA_ERROR_NOT_INITIALIZED ? ncclUnhandledCudaError : (ncclResult_t)r;
}

static sim__comm_t *comm_get(ncclComm_t c) { return sim__handle_get(c, SIM_MAGIC_COMM); }

static size_t dt_size(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0; /* half types and the rest: not modelled */
  }
}

/* ---- versions, ids, errors ---- */

static ncclResult_t get_version(int *v) {
  if (v == NULL) return ncclInvalidArgument;
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version) { NCCL_CALL(ncclGetVersion, get_version(version)); }

static ncclResult_t unique_id(ncclUniqueId *id) {
  if (id == NULL) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  uint64_t n = g_next_id++;
  memcpy(id->internal, "weft-sim", 8);
  memcpy(id->internal + 8, &n, sizeof n);
  /* The board: unique across processes and runs (pid, counter, time). */
  const char *tmp = getenv("TMPDIR");
  const char *root = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : tmp != NULL && *tmp ? tmp : "/tmp";
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  int len = snprintf(id->internal + 16, BOARD_MAX, "%s/weft-sim-nccl-%d-%llu-%lx", root, (int)getpid(),
                     (unsigned long long)n, (unsigned long)t.tv_nsec);
  if (len < 0 || len >= BOARD_MAX)
    snprintf(id->internal + 16, BOARD_MAX, "/tmp/weft-sim-nccl-%d-%llu", (int)getpid(), (unsigned long long)n);
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) { NCCL_CALL(ncclGetUniqueId, unique_id(uniqueId)); }

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

static __thread char g_last_error[256];
const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return g_last_error;
}

static ncclResult_t fail(ncclResult_t r, const char *what) {
  snprintf(g_last_error, sizeof g_last_error, "weft-sim nccl: %s", what);
  return r;
}

/* ---- the board: the ranks of other processes ---- */

long sim__nccl_wait_ms(void) {
  const char *env = getenv("WEFT_SIM_NCCL_WAIT_MS");
  return env && *env ? strtol(env, NULL, 10) : 10000;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Waits on g_joined (the simulator's lock released) for at most ms milliseconds. */
static void wait_joined_signal(long ms) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct timespec until = sim__after_ms(now, ms);
  (void)pthread_cond_timedwait(&g_joined, &sim.lock, &until);
}

/* q's board file `name` into out. */
static void board_file(const sim__clique_t *q, const char *name, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s", q->board, name);
}

static int board_has(const sim__clique_t *q, const char *name) {
  char path[BOARD_MAX + 64];
  struct stat st;
  board_file(q, name, path, sizeof path);
  return stat(path, &st) == 0;
}

/* Writes `bytes` of data as each of the files names[0..n): each appears whole at once (a
 * temporary file, linked under every name). A board that cannot be written is the simulator's
 * own failure: it stops the process. */
static void board_put(const sim__clique_t *q, const void *data, size_t bytes, char (*names)[48], size_t n) {
  static uint64_t counter;
  char tmp[BOARD_MAX + 64], path[BOARD_MAX + 64];
  snprintf(tmp, sizeof tmp, "%s/.tmp-%d-%llu", q->board, (int)getpid(), (unsigned long long)++counter);
  int fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY, 0600);
  const unsigned char *at = data;
  size_t left = bytes;
  while (fd >= 0 && left > 0) {
    ssize_t w = write(fd, at, left);
    if (w <= 0) break;
    at += w;
    left -= (size_t)w;
  }
  if (fd < 0 || left != 0 || close(fd) != 0) {
    fprintf(stderr, "weft-sim nccl: cannot write the board %s: %s\n", q->board, strerror(errno));
    abort();
  }
  for (size_t i = 0; i < n; i++) {
    board_file(q, names[i], path, sizeof path);
    if (link(tmp, path) != 0) {
      fprintf(stderr, "weft-sim nccl: cannot post %s: %s\n", path, strerror(errno));
      abort();
    }
  }
  unlink(tmp);
}

/* Reads and removes board file `name`: its bytes (NULL when absent or not `want` bytes long). */
static void *board_take(const sim__clique_t *q, const char *name, size_t want) {
  char path[BOARD_MAX + 64];
  board_file(q, name, path, sizeof path);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  unsigned char *buf = sim__xmalloc(want + 1);
  size_t got = 0;
  ssize_t r;
  while ((r = read(fd, buf + got, want + 1 - got)) > 0) got += (size_t)r;
  close(fd);
  unlink(path);
  if (got != want) {
    free(buf);
    return NULL;
  }
  return buf;
}

static void board_remove(const sim__clique_t *q, const char *name) {
  char path[BOARD_MAX + 64];
  board_file(q, name, path, sizeof path);
  unlink(path);
}

/* Registers rank r of q on its board (rank-R holds this process's id); -1 when that rank is
 * registered already. */
static int board_register(sim__clique_t *q, int r) {
  char path[BOARD_MAX + 64], name[48];
  if (mkdir(q->board, 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "weft-sim nccl: cannot make the board %s: %s\n", q->board, strerror(errno));
    abort();
  }
  snprintf(name, sizeof name, "rank-%d", r);
  board_file(q, name, path, sizeof path);
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) return -1;
  dprintf(fd, "%d\n", (int)getpid());
  close(fd);
  return 0;
}

/* Rank r leaves the board: its registration and what was addressed to it go; the board goes
 * with the last rank. */
static void board_leave(sim__clique_t *q, int r) {
  char name[48], suffix[16];
  snprintf(name, sizeof name, "rank-%d", r);
  board_remove(q, name);
  snprintf(suffix, sizeof suffix, "-%d", r);
  DIR *dir = opendir(q->board);
  struct dirent *e;
  while (dir != NULL && (e = readdir(dir)) != NULL) {
    size_t len = strlen(e->d_name), sl = strlen(suffix);
    if ((e->d_name[0] == 'c' || e->d_name[0] == 's' || e->d_name[0] == 'r') && e->d_name[1] == '-' && len > sl &&
        strcmp(e->d_name + len - sl, suffix) == 0 && strchr(e->d_name + 2, '-') != NULL &&
        strchr(strchr(e->d_name + 2, '-') + 1, '-') == e->d_name + len - sl)
      board_remove(q, e->d_name);
  }
  if (dir != NULL) closedir(dir);
  rmdir(q->board); /* fails while other ranks are registered */
}

/* How many ranks of q registered on its board. */
static int board_count(const sim__clique_t *q) {
  int n = 0;
  for (int r = 0; r < q->nranks; r++) {
    char name[48];
    snprintf(name, sizeof name, "rank-%d", r);
    n += board_has(q, name);
  }
  return n;
}

/* Waits (the simulator's lock released) until every rank of q joined, in this process or, for a
 * clique with a board, in others; then knows which ranks are remote. 0 after the wait limit
 * (at least 10 s: a process may start slowly). */
static int wait_all_joined(sim__clique_t *q) {
  long ms = sim__nccl_wait_ms();
  if (ms < 10000) ms = 10000;
  uint64_t deadline = now_ns() + (uint64_t)ms * 1000000u;
  while (q->board[0] ? board_count(q) < q->nranks : q->joined < q->nranks) {
    if (now_ns() > deadline) return 0;
    wait_joined_signal(q->board[0] ? 1 : 100);
  }
  for (int r = 0; r < q->nranks; r++) q->remote |= q->ranks[r] == NULL;
  q->complete = 1;
  return 1;
}

/* ---- communicators ---- */

static sim__comm_t *comm_new(sim__clique_t *q, int rank, int dev) {
  sim__comm_t *c = sim__xcalloc(1, sizeof *c);
  c->magic = SIM_MAGIC_COMM;
  c->q = q;
  c->rank = rank;
  c->dev = dev;
  c->send_seq = sim__xcalloc((size_t)q->nranks, sizeof *c->send_seq);
  c->recv_seq = sim__xcalloc((size_t)q->nranks, sizeof *c->recv_seq);
  q->ranks[rank] = c;
  q->joined++;
  sim__handle_add(c);
  return c;
}

static sim__clique_t *clique_new(int nranks) {
  sim__clique_t *q = sim__xcalloc(1, sizeof *q);
  q->nranks = nranks;
  q->ranks = sim__xcalloc((size_t)nranks, sizeof *q->ranks);
  q->next = g_cliques;
  g_cliques = q;
  return q;
}

static ncclResult_t init_all(ncclComm_t *comms, int ndev, const int *devlist) {
  if (comms == NULL || ndev <= 0) return fail(ncclInvalidArgument, "ncclCommInitAll: no communicators or ndev <= 0");
  for (int i = 0; i < ndev; i++) {
    int dev = devlist ? devlist[i] : i;
    if (dev < 0 || dev >= sim.ndev) return fail(ncclInvalidArgument, "ncclCommInitAll: no such device");
  }
  sim__clique_t *q = clique_new(ndev);
  for (int i = 0; i < ndev; i++) comms[i] = (ncclComm_t)comm_new(q, i, devlist ? devlist[i] : i);
  q->complete = 1;
  return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
  NCCL_CALL(ncclCommInitAll, init_all(comm, ndev, devlist));
}

static void comm_free(sim__comm_t *c);

/* Rank `rank` of the clique of `id` on the current context's device. Outside a group it waits
 * (the simulator's lock released) until every rank joined, here or in other processes, as
 * ncclCommInitRank blocks; ncclSystemError when they do not come. */
static ncclResult_t init_rank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  if (out == NULL || nranks <= 0 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: bad communicator pointer, nranks or rank");
  if (sim__need_ctx() != CUDA_SUCCESS) return fail(ncclUnhandledCudaError, "ncclCommInitRank: no current context");
  sim__clique_t *q = g_cliques;
  while (q != NULL && !(q->by_id && memcmp(&q->id, &id, sizeof id) == 0)) q = q->next;
  if (q == NULL) {
    q = clique_new(nranks);
    q->by_id = 1;
    q->id = id;
    if (memcmp(id.internal, "weft-sim", 8) == 0 && id.internal[16] == '/' && memchr(id.internal + 16, 0, BOARD_MAX))
      memcpy(q->board, id.internal + 16, BOARD_MAX);
  }
  if (q->nranks != nranks || q->ranks[rank] != NULL || (q->board[0] && board_register(q, rank) != 0))
    return fail(ncclInvalidUsage, "ncclCommInitRank: nranks differs from the other ranks', or the rank joined twice");
  sim__comm_t *c = comm_new(q, rank, sim__cur_dev());
  pthread_cond_broadcast(&g_joined);
  if (g_depth == 0 && !q->complete && !wait_all_joined(q)) {
    comm_free(c);
    return fail(ncclSystemError, "ncclCommInitRank: not every rank joined within the wait (WEFT_SIM_NCCL_WAIT_MS)");
  }
  *out = (ncclComm_t)c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  NCCL_CALL(ncclCommInitRank, init_rank(comm, nranks, commId, rank));
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config) {
  (void)config; /* blocking communicators only */
  NCCL_CALL(ncclCommInitRankConfig, init_rank(comm, nranks, commId, rank));
}

/* Frees clique q once no rank and no operation is left in it. */
static void clique_maybe_free(sim__clique_t *q) {
  if (q->joined != 0 || q->queued != NULL) return;
  sim__clique_t **link = &g_cliques;
  while (*link != q) link = &(*link)->next;
  *link = q->next;
  free(q->ranks);
  free(q);
}

/* Takes rank c out of its clique (and its board): its handle is gone. */
static void comm_leave(sim__comm_t *c) {
  sim__clique_t *q = c->q;
  sim__handle_remove(c);
  q->ranks[c->rank] = NULL;
  q->joined--;
  if (q->board[0]) board_leave(q, c->rank);
}

/* Frees a communicator that left its clique, and the clique if that was its last. */
static void comm_release(sim__comm_t *c) {
  sim__clique_t *q = c->q;
  free(c->send_seq);
  free(c->recv_seq);
  free(c);
  clique_maybe_free(q);
}

static void comm_free(sim__comm_t *c) {
  comm_leave(c);
  comm_release(c);
}

static int comm_idle(void *arg) {
  const sim__comm_t *c = arg;
  for (const fused_t *f = c->q->queued; f != NULL; f = f->next)
    if (f->comm == c) return 0;
  return 1;
}

/* ncclCommDestroy finalizes the communicator first, flushing the rank's issued operations: it
 * waits until they ran (conformance_nccl, measured on 2 GPUs). Operations that can never run (a
 * partner never posted) would hang NCCL; here they time out as a synchronisation does. */
static ncclResult_t comm_destroy(ncclComm_t h) {
  sim__comm_t *c = comm_get(h);
  if (c == NULL) return fail(ncclInvalidArgument, "ncclCommDestroy: not a communicator");
  if (sim__run_until(comm_idle, c) != CUDA_SUCCESS)
    return fail(ncclInvalidUsage, "ncclCommDestroy: operations of this rank cannot run (partners never posted)");
  if (c->graph_refs != 0) { /* NCCL would wait for the graphs' destruction: for ever, on this thread */
    char first[128];
    snprintf(first, sizeof first, "ncclCommDestroy of rank %d with %zu graph node(s) of its collectives alive", c->rank,
             c->graph_refs);
    sim__hazard_report(first, "NCCL waits until those graphs are destroyed (on a GPU the call blocks)");
    return fail(ncclInvalidUsage, "ncclCommDestroy: graphs that captured this communicator's collectives are still "
                                  "alive; NCCL waits until they are destroyed (destroy the graphs and their execs first)");
  }
  comm_free(c);
  return ncclSuccess;
}

/* ncclCommAbort: as NCCL aborts the rank's uncompleted operations, each queued operation of c
 * becomes aborted (at its stream's head it runs alone and does nothing; its partners wait for it
 * no more and time out, as NCCL's peers of an aborted rank fail), and c leaves at once. */
static ncclResult_t comm_abort(ncclComm_t h) {
  sim__comm_t *c = comm_get(h);
  if (c == NULL) return fail(ncclInvalidArgument, "ncclCommAbort: not a communicator");
  int pending = 0;
  for (fused_t *f = c->q->queued; f != NULL; f = f->next)
    if (f->comm == c) f->aborted = pending = 1;
  comm_leave(c);
  if (pending || c->graph_refs != 0) c->aborted = 1; /* freed with its last operation or graph node */
  else comm_release(c);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { NCCL_CALL(ncclCommDestroy, comm_destroy(comm)); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { NCCL_CALL(ncclCommAbort, comm_abort(comm)); }

static ncclResult_t comm_finalize(ncclComm_t h) {
  return comm_get(h) != NULL ? ncclSuccess : fail(ncclInvalidArgument, "ncclCommFinalize: not a communicator");
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { NCCL_CALL(ncclCommFinalize, comm_finalize(comm)); }

static ncclResult_t comm_query(ncclComm_t h, int *count, int *device, int *rank, ncclResult_t *async) {
  sim__comm_t *c = comm_get(h);
  if (c == NULL) return fail(ncclInvalidArgument, "not a communicator");
  if (count) *count = c->q->nranks;
  if (device) *device = c->dev;
  if (rank) *rank = c->rank;
  if (async) *async = c->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (count == NULL) return ncclInvalidArgument;
  NCCL_CALL(ncclCommCount, comm_query(comm, count, NULL, NULL, NULL));
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (device == NULL) return ncclInvalidArgument;
  NCCL_CALL(ncclCommCuDevice, comm_query(comm, NULL, device, NULL, NULL));
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (rank == NULL) return ncclInvalidArgument;
  NCCL_CALL(ncclCommUserRank, comm_query(comm, NULL, NULL, rank, NULL));
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (asyncError == NULL) return ncclInvalidArgument;
  NCCL_CALL(ncclCommGetAsyncError, comm_query(comm, NULL, NULL, NULL, asyncError));
}

/* ---- posting operations ---- */

/* Queues one fused operation of comm c on stream s. */
static void enqueue_fused(sim__comm_t *c, sim__stream_t *s, part_t *parts, size_t n) {
  fused_t *f = sim__xcalloc(1, sizeof *f);
  f->comm = c;
  f->stream = s;
  f->parts = parts;
  f->n = n;
  sim__action_t act = {.kind = SIM_ACT_NCCL};
  act.u.nccl.fused = f;
  sim__enqueue(s, &act);
  f->op = s->tail;
  f->next = c->q->queued;
  c->q->queued = f;
}

/* A fused operation of comm c on stream s: queued, or a graph node when s captures (the node
 * then holds it as the template its launches copy). */
static int part_is_coll(const part_t *p);
static void unnumber(sim__comm_t *c, const part_t *parts, size_t n);

/* NCCL's lazy connection of c for parts about to be issued on s (measured with NCCL 2.28.3 on 2 x
 * H100, tests/conformance/conformance_nccl.c's first case): a communicator's first collective,
 * or first send / receive, makes its connections, with CUDA calls a GLOBAL capture does not
 * permit. Issued into a GLOBAL capture, ncclGroupEnd fails with ncclInternalError and the capture
 * is invalidated (it ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED); the connections are made
 * all the same (the next such call succeeds). Eager, RELAXED and THREAD_LOCAL: connected, fine. */
static ncclResult_t connect(sim__comm_t *c, sim__stream_t *s, const part_t *parts, size_t n) {
  int coll = 0, p2p = 0;
  for (size_t i = 0; i < n; i++) {
    if (part_is_coll(&parts[i])) coll = 1;
    else p2p = 1;
  }
  int fresh = (coll && !c->coll_connected) || (p2p && !c->p2p_connected);
  c->coll_connected |= coll;
  c->p2p_connected |= p2p;
  if (!fresh || s->cap == NULL || s->cap->mode != CU_STREAM_CAPTURE_MODE_GLOBAL) return ncclSuccess;
  sim__capture_invalidate(s->cap);
  return fail(ncclInternalError, coll ? "a communicator's first collective makes its connections, which a GLOBAL "
                                        "capture does not permit (operation not permitted when stream is capturing): "
                                        "the capture is invalidated"
                                      : "a communicator's first send or receive makes its connections, which a "
                                        "GLOBAL capture does not permit (operation not permitted when stream is "
                                        "capturing): the capture is invalidated");
}

static ncclResult_t submit_fused(sim__comm_t *c, sim__stream_t *s, part_t *parts, size_t n) {
  if (s->cap == NULL) {
    enqueue_fused(c, s, parts, n);
    return ncclSuccess;
  }
  fused_t *f = sim__xcalloc(1, sizeof *f);
  f->comm = c;
  f->parts = parts;
  f->n = n;
  c->graph_refs++; /* a template (sim__nccl_release lets go of it) */
  sim__action_t act = {.kind = SIM_ACT_NCCL};
  act.u.nccl.fused = f;
  return sim__capture_add(s, &act, CU_GRAPH_NODE_TYPE_KERNEL, NULL) == CUDA_SUCCESS ? ncclSuccess : ncclInvalidUsage;
}

static ncclResult_t post(ncclComm_t h, cudaStream_t hs, part_t p) {
  sim__comm_t *c = comm_get(h);
  if (c == NULL) return fail(ncclInvalidArgument, "not a communicator");
  /* NCCL uses a call's stream with the communicator's device current (cudaSetDevice(comm->cudaDev)
   * before it launches), so a default handle (0, legacy, per-thread) names that device's stream,
   * whichever device the caller had current (conformance: "nccl per-thread stream"). */
  sim__stream_t *s = sim__stream_default((CUstream)hs, c->dev);
  if (s == NULL) s = sim__stream_get((CUstream)hs);
  if (s == NULL) return fail(ncclInvalidArgument, "not a stream");
  if (s->dev != c->dev) return fail(ncclInvalidArgument, "the stream is not on the communicator's device");
  if (dt_size(p.dt) == 0) {
    sim.stats.unimplemented++;
    return fail(ncclInvalidArgument, "data type not modelled by the simulator");
  }
  if ((p.kind == P_SEND || p.kind == P_RECV || p.kind == P_BROADCAST || p.kind == P_REDUCE) &&
      ((p.kind == P_SEND || p.kind == P_RECV ? p.peer : p.root) < 0 ||
       (p.kind == P_SEND || p.kind == P_RECV ? p.peer : p.root) >= c->q->nranks))
    return fail(ncclInvalidArgument, "peer or root out of range");
  if ((p.kind != P_SEND && p.kind != P_RECV && p.op > ncclAvg) || p.op < 0)
    return fail(ncclInvalidArgument, "reduction operation not modelled by the simulator");
  /* Captured, it takes its sequence number at each launch; queued, now. */
  if (s->cap == NULL) {
    if (p.kind == P_SEND) p.seq = c->send_seq[p.peer]++;
    else if (p.kind == P_RECV) p.seq = c->recv_seq[p.peer]++;
    else p.seq = c->coll_seq++;
    p.numbered = true;
  }
  if (g_depth == 0) {
    ncclResult_t cr = connect(c, s, &p, 1);
    if (cr != ncclSuccess) {
      unnumber(c, &p, 1);
      return cr;
    }
    part_t *one = sim__xmalloc(sizeof *one);
    *one = p;
    return submit_fused(c, s, one, 1);
  }
  size_t g = 0;
  while (g < g_ngrouped && !(g_grouped[g].comm == c && g_grouped[g].stream == s)) g++;
  if (g == g_ngrouped) {
    sim__grow(&g_grouped, &g_capgrouped, g_ngrouped + 1, sizeof *g_grouped);
    g_grouped[g_ngrouped++] = (grouped_t){c, s, NULL, 0, 0};
  }
  grouped_t *gr = &g_grouped[g];
  sim__grow(&gr->parts, &gr->cap, gr->n + 1, sizeof *gr->parts);
  gr->parts[gr->n++] = p;
  return ncclSuccess;
}

#define POST(fn, ...) NCCL_CALL(fn, post(comm, stream, (part_t){__VA_ARGS__}))

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  POST(ncclAllReduce, .kind = P_ALLREDUCE, .send = sendbuff, .recv = recvbuff, .count = count, .dt = datatype, .op = op);
}
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  POST(ncclBroadcast, .kind = P_BROADCAST, .send = sendbuff, .recv = recvbuff, .count = count, .dt = datatype,
       .root = root);
}
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  POST(ncclReduce, .kind = P_REDUCE, .send = sendbuff, .recv = recvbuff, .count = count, .dt = datatype, .op = op,
       .root = root);
}
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  POST(ncclAllGather, .kind = P_ALLGATHER, .send = sendbuff, .recv = recvbuff, .count = sendcount, .dt = datatype);
}
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  POST(ncclReduceScatter, .kind = P_REDUCESCATTER, .send = sendbuff, .recv = recvbuff, .count = recvcount,
       .dt = datatype, .op = op);
}
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  POST(ncclSend, .kind = P_SEND, .send = sendbuff, .count = count, .dt = datatype, .peer = peer);
}
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  POST(ncclRecv, .kind = P_RECV, .recv = recvbuff, .count = count, .dt = datatype, .peer = peer);
}

/* ---- groups ---- */

static ncclResult_t group_start(void) {
  if (g_depth++ == 0) g_group_error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { NCCL_CALL(ncclGroupStart, group_start()); }

/* A failed group's queued calls give back the sequence numbers they took, as NCCL launches none
 * of them: the numbers of a group's calls are each communicator's newest, so counting back
 * restores the counters (communicators are not used from two threads at once). */
static void unnumber(sim__comm_t *c, const part_t *parts, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!parts[i].numbered) continue;
    if (parts[i].kind == P_SEND) c->send_seq[parts[i].peer]--;
    else if (parts[i].kind == P_RECV) c->recv_seq[parts[i].peer]--;
    else c->coll_seq--;
  }
}

static ncclResult_t group_end(void) {
  if (g_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_depth > 0) return ncclSuccess;
  /* Every (communicator, stream) of the group connects (and each GLOBAL capture meeting a first
   * connection is invalidated) before anything is issued: a failure fails the whole group. */
  if (g_group_error == ncclSuccess)
    for (size_t g = 0; g < g_ngrouped; g++) {
      ncclResult_t x = connect(g_grouped[g].comm, g_grouped[g].stream, g_grouped[g].parts, g_grouped[g].n);
      if (g_group_error == ncclSuccess) g_group_error = x;
    }
  for (size_t g = 0; g < g_ngrouped; g++) {
    ncclResult_t r = ncclSuccess;
    if (g_group_error == ncclSuccess) {
      r = submit_fused(g_grouped[g].comm, g_grouped[g].stream, g_grouped[g].parts, g_grouped[g].n);
    } else { /* the group failed: nothing of it runs, and its calls give their numbers back */
      unnumber(g_grouped[g].comm, g_grouped[g].parts, g_grouped[g].n);
      free(g_grouped[g].parts);
    }
    if (r != ncclSuccess && g_group_error == ncclSuccess) g_group_error = r;
  }
  g_ngrouped = 0;
  /* The list goes with the group (a thread's buffer would outlive the thread). */
  free(g_grouped);
  g_grouped = NULL;
  g_capgrouped = 0;
  /* Ranks initialised in the group: complete once all joined. */
  for (sim__clique_t *q = g_cliques; q != NULL; q = q->next)
    if (q->by_id && !q->complete && !wait_all_joined(q) && g_group_error == ncclSuccess)
      g_group_error = fail(ncclSystemError, "ncclGroupEnd: not every rank joined within the wait (WEFT_SIM_NCCL_WAIT_MS)");
  return g_group_error;
}

/* A refused entry (an injected fault) fails the call as NCCL's own failures inside ncclGroupEnd
 * do: the group ends all the same (NCCL takes its depth down first) and nothing of it runs. */
ncclResult_t ncclGroupEnd(void) {
  CUresult r = sim__enter(SIM_FN_ncclGroupEnd, 1);
  ncclResult_t nr;
  if (r == CUDA_SUCCESS) {
    nr = group_end();
  } else {
    nr = from_cu(r);
    if (g_depth > 0) {
      if (g_group_error == ncclSuccess) g_group_error = nr;
      (void)group_end(); /* the outermost end discards the group's operations */
    }
  }
  sim__leave();
  return nr;
}

/* ---- rendezvous (the scheduler's side) ---- */

static int part_is_coll(const part_t *p) { return p->kind != P_SEND && p->kind != P_RECV; }

/* The queued fused operation of rank r holding the partner of part p of rank `me`, or NULL. */
static fused_t *partner(sim__clique_t *q, int me, const part_t *p, int r) {
  for (fused_t *f = q->queued; f != NULL; f = f->next) {
    if (f->aborted || f->comm->rank != r) continue;
    for (size_t i = 0; i < f->n; i++) {
      const part_t *o = &f->parts[i];
      if (part_is_coll(p) ? (part_is_coll(o) && o->seq == p->seq)
                          : (o->kind == (p->kind == P_SEND ? P_RECV : P_SEND) && o->peer == me && o->seq == p->seq))
        return f;
    }
  }
  return NULL;
}

/* ---- partners in other processes ---- */

/* Board file kinds: a collective's bytes from rank `from` for rank `to`; a send's bytes; a
 * receive's arrival (posted by the receiver `from` for its sender `to`). */
enum { BOARD_COLL = 'c', BOARD_SEND = 's', BOARD_ARRIVAL = 'r' };

/* The board file name of a part of kind `kind` (BOARD_COLL, BOARD_SEND, BOARD_ARRIVAL). */
static void board_name(char *out, int kind, uint64_t seq, int from, int to) {
  snprintf(out, 48, "%c-%llu-%d-%d", kind, (unsigned long long)seq, from, to);
}

static int is_remote(const sim__clique_t *q, int r) { return q->remote && q->ranks[r] == NULL; }

static size_t send_bytes(const part_t *p, int nranks);

/* Posts member m's parts for its remote partners (once, when m is at its stream's head): its
 * send bytes as they are now (a part whose range is not allocated posts no bytes: its readers
 * see it incomplete, as the oracle reports the access). */
static void post_parts(sim__clique_t *q, fused_t *m) {
  int me = m->comm->rank;
  char(*names)[48] = sim__xcalloc((size_t)q->nranks, sizeof *names);
  for (size_t i = 0; i < m->n; i++) {
    const part_t *p = &m->parts[i];
    size_t n = 0, sb = p->kind == P_RECV ? 0 : send_bytes(p, q->nranks);
    if (p->kind == P_RECV || p->kind == P_SEND) {
      if (!is_remote(q, p->peer)) continue;
      if (p->kind == P_SEND) board_name(names[n++], BOARD_SEND, p->seq, me, p->peer);
      else board_name(names[n++], BOARD_ARRIVAL, p->seq, me, p->peer);
    } else {
      for (int r = 0; r < q->nranks; r++)
        if (is_remote(q, r)) board_name(names[n++], BOARD_COLL, p->seq, me, r);
    }
    if (n == 0) continue;
    int valid = sb != 0 && sim__range_valid((CUdeviceptr)(uintptr_t)p->send, sb);
    board_put(q, valid ? p->send : "", valid ? sb : 0, names, n);
  }
  free(names);
  m->posted = 1;
}

/* Whether the remote partner r of part p of rank `me` has posted. */
static int remote_posted(const sim__clique_t *q, int me, const part_t *p, int r) {
  char name[48];
  if (p->kind == P_SEND) board_name(name, BOARD_ARRIVAL, p->seq, r, me);
  else if (p->kind == P_RECV) board_name(name, BOARD_SEND, p->seq, r, me);
  else board_name(name, BOARD_COLL, p->seq, r, me);
  return board_has(q, name);
}

/* Whether f may run now: the head of its stream, or a node of a running launch whose
 * predecessors are done. */
static int at_head(const fused_t *f) {
  if (f->exec != NULL) return f->exec->running && f->exec->pending[f->node] == 0;
  return f->stream->head == f->op;
}

/* Collects the fused operations that must run with f (f included) into set; 0 when one is
 * missing or not yet at its stream's head. */
static size_t closure(fused_t *f, fused_t ***set, size_t *cap) {
  sim__clique_t *q = f->comm->q;
  sim__grow(set, cap, 1, sizeof **set);
  if (f->aborted) { /* alone, doing nothing */
    (*set)[0] = f;
    return at_head(f) ? 1 : 0;
  }
  for (fused_t *g = q->queued; g != NULL; g = g->next) g->mark = 0;
  size_t n = 0;
  (*set)[n++] = f;
  f->mark = 1;
  for (size_t k = 0; k < n; k++) {
    fused_t *m = (*set)[k];
    if (!at_head(m)) return 0;
    if (q->remote && !m->posted) post_parts(q, m);
    for (size_t i = 0; i < m->n; i++) {
      const part_t *p = &m->parts[i];
      for (int r = 0; r < q->nranks; r++) {
        if (r == m->comm->rank || (!part_is_coll(p) && r != p->peer)) continue;
        if (is_remote(q, r)) {
          if (!remote_posted(q, m->comm->rank, p, r)) return 0;
          continue;
        }
        fused_t *o = partner(q, m->comm->rank, p, r);
        if (o == NULL) return 0;
        if (o->mark) continue;
        o->mark = 1;
        sim__grow(set, cap, n + 1, sizeof **set);
        (*set)[n++] = o;
      }
    }
  }
  return n;
}

static fused_t **g_set;
static size_t g_capset;

int sim__nccl_ready(const sim__action_t *act) { return closure(act->u.nccl.fused, &g_set, &g_capset) != 0; }

int sim__nccl_node_ready(const sim__exec_t *x, size_t node) {
  return x->nodes[node].nccl != NULL && closure(x->nodes[node].nccl, &g_set, &g_capset) != 0;
}

void sim__nccl_clone(sim__action_t *dst, const sim__action_t *src) {
  const fused_t *t = src->u.nccl.fused;
  fused_t *f = sim__xcalloc(1, sizeof *f);
  f->comm = t->comm;
  f->comm->graph_refs++;
  f->n = t->n;
  f->parts = sim__xmalloc(t->n * sizeof *f->parts);
  memcpy(f->parts, t->parts, t->n * sizeof *f->parts);
  dst->u.nccl.fused = f;
}

void sim__nccl_exec_start(sim__exec_t *x) {
  for (size_t i = 0; i < x->n; i++) {
    if (x->nodes[i].act.kind != SIM_ACT_NCCL) continue;
    const fused_t *t = x->nodes[i].act.u.nccl.fused;
    sim__comm_t *c = t->comm;
    fused_t *f = sim__xcalloc(1, sizeof *f);
    f->comm = c;
    f->exec = x;
    f->node = i;
    f->n = t->n;
    f->parts = sim__xmalloc(t->n * sizeof *f->parts);
    for (size_t k = 0; k < t->n; k++) {
      part_t p = t->parts[k];
      if (p.kind == P_SEND) p.seq = c->send_seq[p.peer]++;
      else if (p.kind == P_RECV) p.seq = c->recv_seq[p.peer]++;
      else p.seq = c->coll_seq++;
      f->parts[k] = p;
    }
    f->next = c->q->queued;
    c->q->queued = f;
    x->nodes[i].nccl = f;
  }
}

/* Element-wise a = a (op) b, for `count` elements of type dt. */
static void reduce_into(void *a, const void *b, size_t count, ncclDataType_t dt, ncclRedOp_t op) {
#define RED(T)                                                               \
  for (size_t i = 0; i < count; i++) {                                       \
    T x = ((T *)a)[i], y = ((const T *)b)[i];                                \
    ((T *)a)[i] = op == ncclProd ? (T)(x * y) : op == ncclMax ? (x > y ? x : y) \
                  : op == ncclMin ? (x < y ? x : y) : (T)(x + y);            \
  }
  switch (dt) {
    case ncclInt8: RED(int8_t) break;
    case ncclUint8: RED(uint8_t) break;
    case ncclInt32: RED(int32_t) break;
    case ncclUint32: RED(uint32_t) break;
    case ncclInt64: RED(int64_t) break;
    case ncclUint64: RED(uint64_t) break;
    case ncclFloat32: RED(float) break;
    case ncclFloat64: RED(double) break;
    default: break;
  }
#undef RED
}

static void divide(void *a, size_t count, ncclDataType_t dt, int n) {
#define DIV(T) for (size_t i = 0; i < count; i++) ((T *)a)[i] = (T)(((T *)a)[i] / (T)n);
  switch (dt) {
    case ncclInt8: DIV(int8_t) break;
    case ncclUint8: DIV(uint8_t) break;
    case ncclInt32: DIV(int32_t) break;
    case ncclUint32: DIV(uint32_t) break;
    case ncclInt64: DIV(int64_t) break;
    case ncclUint64: DIV(uint64_t) break;
    case ncclFloat32: DIV(float) break;
    case ncclFloat64: DIV(double) break;
    default: break;
  }
#undef DIV
}

/* The bytes part p reads and writes on its rank. */
static size_t send_bytes(const part_t *p, int nranks) {
  size_t e = dt_size(p->dt);
  switch (p->kind) {
    case P_REDUCESCATTER: return p->count * e * (size_t)nranks;
    case P_RECV: return 0;
    default: return p->count * e;
  }
}
static size_t recv_bytes(const part_t *p, int nranks, int rank) {
  size_t e = dt_size(p->dt);
  switch (p->kind) {
    case P_ALLGATHER: return p->count * e * (size_t)nranks;
    case P_REDUCE: return rank == p->root ? p->count * e : 0;
    case P_SEND: return 0;
    default: return p->count * e;
  }
}

/* The part of member m that is the same collective as p (or p's partner), or NULL. */
static part_t *same_coll(fused_t *m, const part_t *p) {
  for (size_t i = 0; i < m->n; i++)
    if (part_is_coll(&m->parts[i]) && m->parts[i].seq == p->seq) return &m->parts[i];
  return NULL;
}

/* Runs the rendezvous set of f (a stream's head op or a launch's node): clocks, accesses, data,
 * then every member is finished (popped from its stream, or finished in its launch). */
/* Every member of a set that ran leaves the clique's queue, then its stream's head or its launch;
 * an aborted communicator goes with its last operation. */
static void retire_set(sim__clique_t *q, fused_t **set, size_t n) {
  for (size_t k = 0; k < n; k++) {
    fused_t **link = &q->queued;
    while (*link != set[k]) link = &(*link)->next;
    *link = set[k]->next;
  }
  for (size_t k = 0; k < n; k++) {
    fused_t *m = set[k];
    sim__comm_t *c = m->comm;
    if (m->exec == NULL) {
      sim__pop_head(m->stream); /* releases the op's action, m with it */
    } else {
      sim__exec_t *x = m->exec;
      size_t node = m->node;
      x->nodes[node].nccl = NULL;
      free(m->parts);
      free(m);
      sim__exec_finish_node(x, node);
    }
    if (!c->aborted || c->graph_refs != 0) continue;
    int left = 0;
    for (fused_t *g = q->queued; g != NULL && !left; g = g->next) left = g->comm == c;
    if (!left) comm_release(c); /* frees q too when it was the last of it */
  }
}

static void run_set(fused_t *f) {
  size_t n = closure(f, &g_set, &g_capset);
  if (n == 0) return; /* not ready: collect() would not have offered it */
  fused_t **set = sim__xmalloc(n * sizeof *set);
  memcpy(set, g_set, n * sizeof *set);
  sim__clique_t *q = f->comm->q;
  if (f->aborted) { /* its communicator was aborted: it does nothing */
    retire_set(q, set, n);
    free(set);
    return;
  }
  int nranks = q->nranks;
  /* Clocks: every member after all members' work before the collective. */
  sim__vc_t join = {0};
  sim__vc_t **vcs = sim__xcalloc(n, sizeof *vcs); /* each member's clock: its stream's or its node's */
  for (size_t k = 0; k < n; k++) {
    fused_t *m = set[k];
    vcs[k] = m->exec != NULL ? &m->exec->nvc[m->node] : &m->stream->vc;
    if (sim.oracle && m->exec == NULL && m->op->snap != NULL) sim__vc_join(vcs[k], &m->op->snap->vc);
    if (sim.oracle) sim__vc_join(&join, vcs[k]);
  }
  sim__actx_t *ctx = sim__xcalloc(n, sizeof *ctx);
  for (size_t k = 0; k < n; k++) {
    fused_t *m = set[k];
    uint32_t lane, tick;
    if (m->exec != NULL) {
      lane = m->exec->lanes[m->exec->nodes[m->node].chain];
      tick = ++m->exec->ticks[m->exec->nodes[m->node].chain];
    } else {
      lane = m->stream->lane;
      tick = sim__vc_get(vcs[k], lane) + 1;
    }
    if (sim.oracle) {
      sim__vc_join(vcs[k], &join);
      sim__vc_set(vcs[k], lane, tick);
    }
    ctx[k] = (sim__actx_t){.vc = vcs[k], .dev = -1};
    ctx[k].who = (sim__who_t){.op = m->exec != NULL ? m->exec->run_id + m->node : m->op->id, .lane = lane, .tick = tick,
                              .stream = m->exec != NULL ? -2 : m->stream->id, .what = "nccl"};
  }
  free(vcs);
  sim__vc_free(&join);
  /* Accesses: every member's send ranges read, receive ranges written; a part whose ranges are
   * not allocated is skipped (reported by the oracle). Inputs are copied before any output. */
  int *ok = sim__xcalloc(n, sizeof *ok);
  for (size_t k = 0; k < n; k++) {
    ok[k] = 1;
    sim__oracle_begin();
    for (size_t i = 0; i < set[k]->n; i++) {
      const part_t *p = &set[k]->parts[i];
      size_t sb = send_bytes(p, nranks), rb = recv_bytes(p, nranks, set[k]->comm->rank);
      if (sb && sim__oracle_access((CUdeviceptr)(uintptr_t)p->send, sb, 0, &ctx[k]) != 0) ok[k] = 0;
      if (rb && sim__oracle_access((CUdeviceptr)(uintptr_t)p->recv, rb, 1, &ctx[k]) != 0) ok[k] = 0;
    }
  }
  /* Inputs first: a copy of every part's send range (in-place collectives overwrite them). */
  void ***snap = sim__xcalloc(n, sizeof *snap);
  for (size_t k = 0; k < n; k++) {
    snap[k] = sim__xcalloc(set[k]->n + 1, sizeof **snap);
    for (size_t i = 0; ok[k] && i < set[k]->n; i++) {
      size_t sb = send_bytes(&set[k]->parts[i], nranks);
      if (sb == 0) continue;
      snap[k][i] = sim__xmalloc(sb);
      memcpy(snap[k][i], set[k]->parts[i].send, sb);
    }
  }
  /* Outputs, part by part of each member, from those copies. */
  for (size_t k = 0; k < n; k++) {
    if (!ok[k]) continue;
    int me = set[k]->comm->rank;
    for (size_t i = 0; i < set[k]->n; i++) {
      part_t *p = &set[k]->parts[i];
      size_t e = dt_size(p->dt), bytes = p->count * e;
      if (p->kind == P_SEND) continue; /* the receiving side copies */
      if (p->kind == P_RECV && is_remote(q, p->peer)) {
        char name[48];
        board_name(name, BOARD_SEND, p->seq, p->peer, me);
        void *bytes_in = board_take(q, name, bytes);
        if (bytes_in != NULL) memcpy(p->recv, bytes_in, bytes);
        free(bytes_in);
        continue;
      }
      if (p->kind == P_RECV) {
        for (size_t j = 0; j < n; j++)
          for (size_t t = 0; t < set[j]->n; t++) {
            const part_t *o = &set[j]->parts[t];
            if (set[j]->comm->rank == p->peer && o->kind == P_SEND && o->peer == me && o->seq == p->seq &&
                snap[j][t] != NULL)
              memcpy(p->recv, snap[j][t], bytes < o->count * e ? bytes : o->count * e);
          }
        continue;
      }
      const void **src = sim__xcalloc((size_t)nranks, sizeof *src);
      void **taken = sim__xcalloc((size_t)nranks, sizeof *taken); /* remote ranks' bytes */
      for (size_t j = 0; j < n; j++) {
        part_t *o = same_coll(set[j], p);
        if (o != NULL) src[set[j]->comm->rank] = snap[j][o - set[j]->parts];
      }
      for (int r = 0; r < nranks; r++) {
        if (!is_remote(q, r)) continue;
        char name[48];
        board_name(name, BOARD_COLL, p->seq, r, me);
        src[r] = taken[r] = board_take(q, name, send_bytes(p, nranks));
      }
      int complete = 1;
      for (int r = 0; r < nranks; r++) complete &= src[r] != NULL;
      size_t sb = send_bytes(p, nranks);
      if (complete) {
        unsigned char *acc = sim__xmalloc(sb + 1);
        switch (p->kind) {
          case P_ALLREDUCE: case P_REDUCE: case P_REDUCESCATTER:
            memcpy(acc, src[0], sb);
            for (int r = 1; r < nranks; r++) reduce_into(acc, src[r], sb / e, p->dt, p->op);
            if (p->op == ncclAvg) divide(acc, sb / e, p->dt, nranks);
            if (p->kind == P_REDUCESCATTER) memcpy(p->recv, acc + (size_t)me * bytes, bytes);
            else if (p->kind == P_ALLREDUCE || me == p->root) memcpy(p->recv, acc, bytes);
            break;
          case P_BROADCAST: memcpy(p->recv, src[p->root], bytes); break;
          case P_ALLGATHER:
            for (int r = 0; r < nranks; r++) memcpy((unsigned char *)p->recv + (size_t)r * bytes, src[r], bytes);
            break;
          default: break;
        }
        free(acc);
      }
      for (int r = 0; r < nranks; r++) free(taken[r]);
      free(taken);
      free(src);
    }
  }
  /* What remote partners posted for parts that did not run (their ranges were not allocated)
   * or that need no bytes (a send's partner's arrival) is taken off the board too. */
  for (size_t k = 0; q->remote && k < n; k++) {
    int me = set[k]->comm->rank;
    for (size_t i = 0; i < set[k]->n; i++) {
      const part_t *p = &set[k]->parts[i];
      char name[48];
      if (p->kind == P_SEND || p->kind == P_RECV) {
        if (!is_remote(q, p->peer) || (ok[k] && p->kind == P_RECV)) continue;
        if (p->kind == P_SEND) board_name(name, BOARD_ARRIVAL, p->seq, p->peer, me);
        else board_name(name, BOARD_SEND, p->seq, p->peer, me);
        board_remove(q, name);
        continue;
      }
      for (int r = 0; !ok[k] && r < nranks; r++) {
        if (!is_remote(q, r)) continue;
        board_name(name, BOARD_COLL, p->seq, r, me);
        board_remove(q, name);
      }
    }
  }
  for (size_t k = 0; k < n; k++) {
    for (size_t i = 0; i < set[k]->n; i++) free(snap[k][i]);
    free(snap[k]);
  }
  free(snap);
  free(ok);
  free(ctx);
  retire_set(q, set, n);
  free(set);
}

void sim__nccl_run(sim__stream_t *s) { run_set(s->head->act.u.nccl.fused); }

void sim__nccl_run_node(sim__exec_t *x, size_t node) {
  if (x->nodes[node].nccl != NULL) run_set(x->nodes[node].nccl);
}

int sim__nccl_names(const sim__action_t *act, int (*in)(CUdeviceptr)) {
  const fused_t *f = act->u.nccl.fused;
  for (size_t i = 0; i < f->n; i++)
    if ((f->parts[i].send != NULL && in((CUdeviceptr)f->parts[i].send)) ||
        (f->parts[i].recv != NULL && in((CUdeviceptr)f->parts[i].recv)))
      return 1;
  return 0;
}

int sim__nccl_pending(void) {
  for (sim__clique_t *q = g_cliques; q != NULL; q = q->next)
    if (q->queued != NULL) return 1;
  return 0;
}

int sim__nccl_remote_pending(void) {
  for (sim__clique_t *q = g_cliques; q != NULL; q = q->next)
    if (q->remote && q->queued != NULL) return 1;
  return 0;
}

void sim__nccl_release(sim__action_t *act) {
  fused_t *f = act->u.nccl.fused;
  if (f == NULL) return;
  sim__comm_t *c = f->stream == NULL && f->exec == NULL ? f->comm : NULL; /* a graph node's template */
  free(f->parts);
  free(f);
  act->u.nccl.fused = NULL;
  if (c == NULL || --c->graph_refs != 0 || !c->aborted) return;
  for (const fused_t *g = c->q->queued; g != NULL; g = g->next)
    if (g->comm == c) return; /* its last queued operation frees it (retire_set) */
  comm_release(c);
}
