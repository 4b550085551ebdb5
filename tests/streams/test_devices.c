/* Runtimes on two devices (issue 14): each device's runtime allocates its memory from its own
 * device, tracks its own streams and gives everything back at release; copies, kernels and
 * memsets on one device's stream may use the other's blocks, ordered across devices. On the
 * simulator with WEFT_SIM_DEVICES=2 (see BUILD; test_devices_no_peer without peer access) and
 * on a GPU machine with two devices; skipped with one. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/runtime/runtime.h"
#include "sim/weft_sim.h"
#include "tests/kernels/test_kernels.h"
#include "tests/kernels/test_kernels_sim.h"
#include "tests/streams/prog.h"
#include "weft/weft.h"

#define N 4096 /* unsigned elements per block */

#define MAXD 8 /* the most devices a test uses (the simulator's maximum) */

static const weft__driver_t *drv;
/* How many devices the helpers below open and close: 2, or every device (up to MAXD) for the
 * random programs. */
static int g_nd = 2;

/* Positive controls: every runtime's tracker issues no waits (on) or does again (off). */
static void weft_test_no_waits(weft_runtime_t **rt, int on) {
  for (int d = 0; d < g_nd; d++) rt[d]->tracker.no_waits = on != 0;
}

/* The end of a positive control: waits on again, every device synchronised, and the oracle must
 * have seen races (forgotten afterwards). */
static void end_positive_control(weft_runtime_t **rt, const weft_sim_api_t *sim) {
  weft_test_no_waits(rt, 0);
  for (int d = 0; d < g_nd; d++) assert_int_equal(weft_runtime_synchronize(rt[d]), WEFT_OK);
  weft_sim_stats_t st;
  sim->stats(&st);
  assert_true(st.races > 0);
  sim->reset_races();
}

/* That the first 1024 words of b, copied to the host on s, all equal `value`. */
static void expect_uniform(weft_stream_t *s, weft_block_t b, unsigned value) {
  unsigned host[1024];
  assert_int_equal(weft_copy_from_block(s, host, b, 0, sizeof host), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(s), WEFT_OK);
  for (unsigned i = 0; i < 1024; i++) assert_int_equal(host[i], value);
}

/* Each device's runtime with options o (NULL: the defaults), and its first three pool streams. */
static void open_devices(weft_runtime_t **rt, weft_stream_t *(*s)[3], const weft_options_t *o) {
  for (int d = 0; d < g_nd; d++) {
    assert_int_equal(weft_runtime_get(d, o, &rt[d]), WEFT_OK);
    for (unsigned i = 0; i < 3; i++) assert_int_equal(weft_stream_get(rt[d], i, &s[d][i]), WEFT_OK);
  }
}

static int two_devices(void) {
  assert_int_equal(weft__driver_get(&drv), WEFT_OK);
  int n = 0;
  assert_int_equal(drv->cuDeviceGetCount(&n), CUDA_SUCCESS);
  return n >= 2;
}

/* Whether device 0 and device 1 can access each other's memory. */
static int peers_can(void);

/* Device memory of `dev` in use, as its driver says (cuMemGetInfo with its context current). */
static size_t used_on(int dev) {
  CUcontext c;
  assert_int_equal(drv->cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
  assert_int_equal(drv->cuCtxSetCurrent(c), CUDA_SUCCESS);
  size_t fr = 0, total = 0;
  assert_int_equal(drv->cuMemGetInfo(&fr, &total), CUDA_SUCCESS);
  assert_int_equal(drv->cuCtxSetCurrent(NULL), CUDA_SUCCESS); /* weft binds its own again */
  assert_int_equal(drv->cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
  return total - fr;
}

static void test_each_device_has_its_runtime(void **state) {
  (void)state;
  if (!two_devices()) skip();
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  weft_runtime_t *rt[2];
  weft_stream_t *s[2];
  weft_block_t b[2];
  size_t used0 = used_on(0), used1 = used_on(1);
  for (int dev = 0; dev < 2; dev++) {
    assert_int_equal(weft_runtime_get(dev, NULL, &rt[dev]), WEFT_OK);
    assert_int_equal(weft_runtime_device(rt[dev]), dev);
    assert_int_equal(weft_stream_get(rt[dev], 1, &s[dev]), WEFT_OK);
    assert_int_equal(weft_alloc(rt[dev], 64u << 20, s[dev], "big", &b[dev]), WEFT_OK);
    assert_int_equal(weft_memset32(s[dev], b[dev], 0, 0x100u + (unsigned)dev, 64u << 20), WEFT_OK);
  }
  /* On the simulator each device counts its own memory exactly: 64 MiB more on each. (A GPU's
   * count moves with the driver's own allocations.) */
  if (sim != NULL) {
    assert_true(used_on(0) >= used0 + (64u << 20));
    assert_true(used_on(1) >= used1 + (64u << 20));
  }
  for (int dev = 0; dev < 2; dev++) {
    unsigned host[N];
    assert_int_equal(weft_copy_from_block(s[dev], host, b[dev], 0, sizeof host), WEFT_OK);
    assert_int_equal(weft_stream_synchronize(s[dev]), WEFT_OK);
    for (unsigned i = 0; i < N; i++) assert_int_equal(host[i], 0x100u + (unsigned)dev);
  }
  /* A block is freed by its own runtime only: refused, nothing changed. */
  assert_int_equal(weft_free(b[0], s[1]), WEFT_ERR_WRONG_DEVICE);
  for (int dev = 0; dev < 2; dev++) {
    assert_int_equal(weft_free(b[dev], s[dev]), WEFT_OK);
    assert_int_equal(weft_runtime_release(rt[dev]), WEFT_OK);
  }
  if (sim != NULL) {
    weft_sim_stats_t st;
    sim->stats(&st);
    assert_int_equal(st.races, 0);
    assert_int_equal(used_on(0), used0);
    assert_int_equal(used_on(1), used1);
  }
}

/* A copy between devices with weft_copy_block: the destination's stream waits for the source's
 * writer on the other device, and the source's later writer waits for the copy; both directions,
 * data right, no race (the oracle), and a positive control with the waits turned off. */
static void test_copy_between_devices_is_ordered_both_ways(void **state) {
  (void)state;
  if (!two_devices()) skip();
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  weft_runtime_t *rt[2];
  weft_stream_t *s[2][3];
  open_devices(rt, s, NULL);
  enum { BYTES = 8u << 20 };
  for (int round = 0; round < 3; round++) {
    int positive = round == 2 && sim != NULL; /* no waits: the copy races with its writer */
    weft_block_t a, b;
    assert_int_equal(weft_alloc(rt[0], BYTES, s[0][0], "a", &a), WEFT_OK);
    assert_int_equal(weft_alloc(rt[1], BYTES, s[1][0], "b", &b), WEFT_OK);
    if (positive) weft_test_no_waits(rt, 1);
    assert_int_equal(weft_memset32(s[0][1], a, 0, 0x1000u + (unsigned)round, BYTES), WEFT_OK); /* device 0 writes a */
    /* Device 1 copies a into b on its stream 2: waits for the memset on device 0. */
    assert_int_equal(weft_copy_block(s[1][2], b, 0, a, 0, BYTES), WEFT_OK);
    /* Device 0 writes a again on another stream: waits for the copy's read on device 1. */
    assert_int_equal(weft_memset32(s[0][2], a, 0, 0xdead, BYTES), WEFT_OK);
    /* And back: device 0 copies b into a on its stream 1 (b is device 1's: the far side). */
    assert_int_equal(weft_copy_block(s[0][1], a, 0, b, 0, BYTES), WEFT_OK);
    if (positive) {
      end_positive_control(rt, sim);
    } else {
      unsigned host[1024];
      assert_int_equal(weft_copy_from_block(s[0][0], host, a, BYTES - sizeof host, sizeof host), WEFT_OK);
      assert_int_equal(weft_stream_synchronize(s[0][0]), WEFT_OK);
      for (unsigned i = 0; i < 1024; i++) assert_int_equal(host[i], 0x1000u + (unsigned)round);
      if (sim != NULL) {
        weft_sim_stats_t st;
        sim->stats(&st);
        assert_int_equal(st.races, 0);
      }
    }
    assert_int_equal(weft_free(a, s[0][0]), WEFT_OK);
    assert_int_equal(weft_free(b, s[1][0]), WEFT_OK);
  }
  weft_block_t x, y;
  assert_int_equal(weft_alloc(rt[0], 4096, s[0][0], "x", &x), WEFT_OK);
  assert_int_equal(weft_alloc(rt[0], 4096, s[0][0], "y", &y), WEFT_OK);
  /* Both blocks of device 0, the copy on device 1: a use of two far blocks, which needs peer
   * access (NOT_SUPPORTED without it, nothing done). */
  assert_int_equal(weft_memset32(s[0][1], x, 0, 0x55u, 4096), WEFT_OK);
  assert_int_equal(weft_memset32(s[0][2], y, 0, 0x66u, 4096), WEFT_OK);
  assert_int_equal(weft_copy_block(s[1][0], y, 0, x, 0, 4096), peers_can() ? WEFT_OK : WEFT_ERR_NOT_SUPPORTED);
  expect_uniform(s[0][0], y, peers_can() ? 0x55u : 0x66u);
  assert_int_equal(weft_free(x, s[0][0]), WEFT_OK);
  assert_int_equal(weft_free(y, s[0][0]), WEFT_OK);
  for (int d = 0; d < 2; d++) assert_int_equal(weft_runtime_release(rt[d]), WEFT_OK);
}

static int peers_can(void) {
  int a = 0, b = 0;
  assert_int_equal(drv->cuDeviceCanAccessPeer(&a, 0, 1), CUDA_SUCCESS);
  assert_int_equal(drv->cuDeviceCanAccessPeer(&b, 1, 0), CUDA_SUCCESS);
  return a && b;
}

/* The test kernels loaded in each device's context. */
typedef struct {
  CUmodule mod[MAXD];
  CUfunction combine[MAXD], fill[MAXD];
  unsigned spin;
} kernels_t;

static void kernels_load(kernels_t *k, weft_runtime_t **rt, const weft_sim_api_t *sim) {
  weft_test_kernels_register_sim();
  for (int d = 0; d < g_nd; d++) {
    assert_int_equal(drv->cuCtxSetCurrent(rt[d]->tracker.ctx), CUDA_SUCCESS);
    assert_int_equal(drv->cuModuleLoadData(&k->mod[d], test_kernels_fatbin), CUDA_SUCCESS);
    assert_int_equal(drv->cuModuleGetFunction(&k->combine[d], k->mod[d], "weft_test_combine"), CUDA_SUCCESS);
    assert_int_equal(drv->cuModuleGetFunction(&k->fill[d], k->mod[d], "weft_test_fill"), CUDA_SUCCESS);
  }
  k->spin = sim != NULL ? 0 : 20000; /* on a GPU each kernel spins 20 us first: a missing wait shows */
}

static void kernels_unload(kernels_t *k) {
  for (int d = 0; d < g_nd; d++) assert_int_equal(drv->cuModuleUnload(k->mod[d]), CUDA_SUCCESS);
}

/* On the simulator, that its oracle saw no race (the report printed otherwise). */
static void expect_no_race(const weft_sim_api_t *sim) {
  if (sim == NULL) return;
  weft_sim_stats_t st;
  sim->stats(&st);
  if (st.races != 0) sim->print_report();
  assert_int_equal(st.races, 0);
}

/* Two devices' runtimes, three streams each, and the kernels (g_nd = 2), or a skip without two
 * devices that can access each other's memory; the simulator's API (NULL on a GPU). And their
 * end. */
static const weft_sim_api_t *open_two(weft_runtime_t **rt, weft_stream_t *(*s)[3], kernels_t *k) {
  if (!two_devices() || !peers_can()) skip();
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  g_nd = 2;
  open_devices(rt, s, NULL);
  kernels_load(k, rt, sim);
  return sim;
}
static void close_two(weft_runtime_t **rt, kernels_t *k) {
  kernels_unload(k);
  for (int d = 0; d < 2; d++) assert_int_equal(weft_runtime_release(rt[d]), WEFT_OK);
}

static CUdeviceptr ptr(weft_block_t b) {
  CUdeviceptr p = 0;
  assert_int_equal(weft_block_ptr(b, &p), WEFT_OK);
  return p;
}

/* weft_test_combine on s (device d): out = salt + 7 in0 + 13 in1 (element-wise), with out
 * written and the inputs read; any block may be of either device. */
static weft_status_t combine(const kernels_t *k, int d, weft_stream_t *s, weft_block_t out, weft_block_t in0,
                             weft_block_t in1, unsigned n, unsigned salt) {
  CUdeviceptr p[5] = {ptr(out), 0, ptr(in0), ptr(in1), 0};
  unsigned spin = k->spin;
  void *params[8] = {&p[0], &p[1], &p[2], &p[3], &p[4], &n, &salt, (void *)&spin};
  weft_launch_t l = {.func = k->combine[d], .grid = {(n + 255) / 256}, .block = {256}, .params = params};
  weft_access_t a[3] = {{out, WEFT_WRITE}, {in0, WEFT_READ}, {in1, WEFT_READ}};
  return weft_launch(s, &l, a, 3);
}

/* The same through the split form: weft_use_begin, the launch on the raw stream, weft_use_end. */
static weft_status_t combine_split(const kernels_t *k, int d, weft_stream_t *s, weft_block_t out, weft_block_t in0,
                                   weft_block_t in1, unsigned n, unsigned salt) {
  weft_access_t a[3] = {{out, WEFT_WRITE}, {in0, WEFT_READ}, {in1, WEFT_READ}};
  weft_status_t st = weft_use_begin(s, a, 3);
  if (st != WEFT_OK) return st;
  CUdeviceptr p[5] = {ptr(out), 0, ptr(in0), ptr(in1), 0};
  unsigned spin = k->spin;
  void *params[8] = {&p[0], &p[1], &p[2], &p[3], &p[4], &n, &salt, (void *)&spin};
  assert_int_equal(drv->cuLaunchKernel(k->combine[d], (n + 255) / 256, 1, 1, 256, 1, 1, 0, weft_stream_raw(s), params, NULL),
                   CUDA_SUCCESS);
  return weft_use_end(s, a, 3);
}

/* Random programs over blocks of both devices (issue 14: "a use on device 1 that reads a block
 * written on device 0 waits for the needed event"): kernels on either device's streams read
 * and write blocks of any device (every device there is, up to 8: test_devices_8 runs eight simulated
 * ones), memsets and copies cross too, with no event of the test's. The data
 * ends equal to a host model; the simulator's oracle sees no race; with the waits turned off it
 * sees races (positive control). */
static void test_random_programs_across_devices(void **state) {
  (void)state;
  if (!two_devices()) skip();
  if (!peers_can()) skip(); /* test_devices_no_peer checks the refusal */
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  int count = 0;
  assert_int_equal(drv->cuDeviceGetCount(&count), CUDA_SUCCESS);
  g_nd = count < MAXD ? count : MAXD; /* every device: test_devices_8 runs eight */
  const int nd = g_nd;
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  open_devices(rt, s, NULL);
  kernels_t k;
  kernels_load(&k, rt, sim);
  enum { PER = 4, NB = PER * MAXD, NE = 2048 };
  const int nb = PER * nd, steps = 120 * nd; /* blocks PER*d .. PER*d+PER-1 are device d's */
  int seeds = sim != NULL ? 6 : 3;
  for (int seed = 0; seed < seeds; seed++) {
    int positive = sim != NULL && seed == seeds - 1;
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1);
#define RND(m) ((unsigned)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (m))
    weft_block_t b[NB];
    unsigned model[NB];
    for (int i = 0; i < nb; i++) {
      int d = i / PER;
      assert_int_equal(weft_alloc(rt[d], NE * 4, s[d][0], "r", &b[i]), WEFT_OK);
      model[i] = 1000u + (unsigned)i;
      assert_int_equal(weft_memset32(s[d][1], b[i], 0, model[i], NE * 4), WEFT_OK);
    }
    if (positive) weft_test_no_waits(rt, 1);
    for (int step = 0; step < steps; step++) {
      int d = (int)RND((unsigned)nd);
      weft_stream_t *on = s[d][RND(3)];
      unsigned o = RND((unsigned)nb), i0 = RND((unsigned)nb), i1 = RND((unsigned)nb), what = RND(10);
      if (what < 7) { /* a kernel on device d over blocks of any devices */
        if (i0 == o) i0 = (o + 1) % (unsigned)nb;
        if (i1 == o) i1 = (o + 2) % (unsigned)nb;
        unsigned salt = (unsigned)step;
        /* Every fourth through the split form (weft_use_begin / weft_use_end). */
        weft_status_t (*run)(const kernels_t *, int, weft_stream_t *, weft_block_t, weft_block_t, weft_block_t, unsigned,
                             unsigned) = RND(4) == 0 ? combine_split : combine;
        assert_int_equal(run(&k, d, on, b[o], b[i0], b[i1], NE, salt), WEFT_OK);
        model[o] = salt + 7u * model[i0] + 13u * model[i1];
      } else if (what < 8) { /* a memset, maybe of the other device's block */
        unsigned v = 77u * (unsigned)step;
        assert_int_equal(weft_memset32(on, b[o], 0, v, NE * 4), WEFT_OK);
        model[o] = v;
      } else { /* a copy between two devices, on a stream of one of them */
        int dd = (int)(o / PER), sd = (dd + 1 + (int)RND((unsigned)nd - 1)) % nd;
        unsigned src = (unsigned)sd * PER + RND(PER);
        int cd = RND(2) ? dd : sd; /* two statements: RND twice in one expression is unsequenced */
        weft_stream_t *cs = s[cd][RND(3)];
        assert_int_equal(weft_copy_block(cs, b[o], 0, b[src], 0, NE * 4), WEFT_OK);
        model[o] = model[src];
      }
    }
    if (positive) {
      end_positive_control(rt, sim);
    } else {
      for (int i = 0; i < nb; i++) {
        static unsigned host[NE];
        int d = i / PER;
        assert_int_equal(weft_copy_from_block(s[d][2], host, b[i], 0, sizeof host), WEFT_OK);
        assert_int_equal(weft_stream_synchronize(s[d][2]), WEFT_OK);
        for (unsigned e = 0; e < NE; e += 97) assert_int_equal(host[e], model[i]);
        assert_int_equal(host[NE - 1], model[i]);
      }
      if (sim != NULL) {
        weft_sim_stats_t st;
        sim->stats(&st);
        if (st.races != 0) sim->print_report();
        assert_int_equal(st.races, 0);
      }
    }
    for (int i = 0; i < nb; i++) assert_int_equal(weft_free(b[i], s[i / PER][0]), WEFT_OK);
#undef RND
  }
  kernels_unload(&k);
  for (int d = 0; d < nd; d++) assert_int_equal(weft_runtime_release(rt[d]), WEFT_OK);
  g_nd = 2;
}

/* Waits across devices on ticks whose ring slots were taken again (the brief: "long random
 * programs race after event-ring evictions", with small rings). Random programs over every device
 * (up to 8), rings of 4 events, eager records and lazy ones: round by round a stream A writes a
 * shared block X of its device, then runs 5 to 9 more kernels on a block of its own while other
 * streams (of any device) read that block now and then (each such read makes A record, lazy
 * records too), and then a stream of another device reads X: the tick that wrote X was evicted
 * from A's ring, so the reader waits on a newer event of A standing in for it (counted as a ring
 * eviction). Random kernels over every block go between the rounds. */

enum { EV_SH = 2, EV_NE = 1024, EV_NBMAX = MAXD * (EV_SH + 6) };

/* The runtimes of one records mode (g_nd devices, rings of 4), three streams each, the kernels. */
typedef struct ev_rig {
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  kernels_t k;
  const weft_sim_api_t *sim;
} ev_rig_t;

static void ev_open(ev_rig_t *g, unsigned lazy) {
  weft_options_t o = weft_options_default();
  o.event_ring = 4;
  o.lazy_records = lazy;
  g->sim = weft_sim_api(weft_driver_symbol);
  open_devices(g->rt, g->s, &o);
  kernels_load(&g->k, g->rt, g->sim);
}

static void ev_close(ev_rig_t *g) {
  kernels_unload(&g->k);
  for (int d = 0; d < g_nd; d++) assert_int_equal(weft_runtime_release(g->rt[d]), WEFT_OK);
}

static uint64_t ev_evictions(const ev_rig_t *g) {
  uint64_t n = 0;
  for (int d = 0; d < g_nd; d++) {
    weft_counters_t c;
    assert_int_equal(weft_runtime_counters(g->rt[d], &c), WEFT_OK);
    n += c.ring_evictions;
  }
  return n;
}

/* One program (above) from `seed`, `rounds` rounds. `positive`: weft's waits off, and the oracle
 * must then see races. `fault` (NULL: none): a simulator fault spec armed for the program's calls;
 * a kernel that fails changed nothing, so its block keeps its value in the model (*failed counts
 * them; without a fault none may fail). Otherwise the data ends equal to the model, and the oracle
 * sees no race. Returns the ring evictions the program's waits met. */
static uint64_t ev_program(ev_rig_t *g, uint64_t seed, int rounds, int positive, const char *fault, unsigned *failed) {
  const int nd = g_nd, ns = 3 * nd; /* stream j is s[j / 3][j % 3] */
  /* Blocks: per device EV_SH shared ones (X), then per stream its own P (written by it) and Q
   * (read only), all on the stream's device. */
  const int nb = nd * EV_SH + 2 * ns;
  weft_stream_t *(*s)[3] = g->s;
  uint64_t x = seed;
#define RND(m) ((unsigned)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (m))
  weft_block_t b[EV_NBMAX];
  unsigned model[EV_NBMAX];
  int dev[EV_NBMAX];
  for (int i = 0; i < nb; i++) {
    dev[i] = i < nd * EV_SH ? i / EV_SH : (i - nd * EV_SH) % ns / 3;
    assert_int_equal(weft_alloc(g->rt[dev[i]], EV_NE * 4, s[dev[i]][0], "ev", &b[i]), WEFT_OK);
    model[i] = 3000u + (unsigned)i;
    assert_int_equal(weft_memset32(s[dev[i]][0], b[i], 0, model[i], EV_NE * 4), WEFT_OK);
  }
  for (int d = 0; d < nd; d++) assert_int_equal(weft_runtime_synchronize(g->rt[d]), WEFT_OK);
  if (g->sim != NULL) g->sim->reset_races();
  uint64_t ev0 = ev_evictions(g);
  if (positive) weft_test_no_waits(g->rt, 1);
  if (fault != NULL) assert_int_equal((g->sim->fail)(fault), 0);
  unsigned salt = 0;
  *failed = 0;
#define P_OF(j) (nd * EV_SH + 2 * (j))
#define Q_OF(j) (nd * EV_SH + 2 * (j) + 1)
#define RUN(j, out, in0, in1)                                                                                 \
  do {                                                                                                        \
    int d_ = (j) / 3;                                                                                         \
    salt++;                                                                                                   \
    weft_status_t st_ = combine(&g->k, d_, s[d_][(j) % 3], b[out], b[in0], b[in1], EV_NE, salt);              \
    if (st_ == WEFT_OK)                                                                                       \
      model[out] = salt + 7u * model[in0] + 13u * model[in1];                                                 \
    else if (fault != NULL)                                                                                   \
      ++*failed;                                                                                              \
    else                                                                                                      \
      fail_msg("seed %llu: %s: %s", (unsigned long long)seed, weft_status_name(st_), weft_last_error());      \
  } while (0)
  for (int round = 0; round < rounds; round++) {
    int a = (int)RND((unsigned)ns), da = a / 3;
    int xb = da * EV_SH + (int)RND(EV_SH); /* a shared block of A's device */
    int i0 = (int)RND((unsigned)nb), i1 = (int)RND((unsigned)nb);
    if (i0 == xb) i0 = Q_OF(a);
    if (i1 == xb) i1 = Q_OF(a);
    RUN(a, xb, i0, i1); /* A writes X */
    unsigned more = 5 + RND(5);
    for (unsigned m = 0; m < more; m++) {
      RUN(a, P_OF(a), Q_OF(a), Q_OF(a)); /* A's own work: a tick a later reader may stand in */
      int c = (int)RND((unsigned)ns);
      if (c != a && RND(2)) RUN(c, P_OF(c), P_OF(a), Q_OF(c)); /* c reads A's newest: A records */
    }
    /* B, of another device, reads X: A's tick of X was taken from its ring meanwhile. */
    int db = (da + 1 + (int)RND((unsigned)nd - 1)) % nd, bj = 3 * db + (int)RND(3);
    int yb = db * EV_SH + (int)RND(EV_SH);
    RUN(bj, yb, xb, Q_OF(bj));
    for (unsigned r = RND(4); r > 0; r--) { /* random kernels over every block */
      int j = (int)RND((unsigned)ns), out = (int)RND((unsigned)nb), in0 = (int)RND((unsigned)nb),
          in1 = (int)RND((unsigned)nb);
      if (out >= nd * EV_SH && (out - nd * EV_SH) % 2 == 1) out--; /* Q blocks stay read-only */
      if (in0 == out) in0 = Q_OF(j);
      if (in1 == out) in1 = Q_OF(j);
      RUN(j, out, in0, in1);
    }
  }
#undef RUN
#undef P_OF
#undef Q_OF
#undef RND
  if (fault != NULL) assert_int_equal((g->sim->fail)(NULL), 0);
  uint64_t evictions = ev_evictions(g) - ev0;
  if (positive) {
    end_positive_control(g->rt, g->sim);
  } else {
    for (int i = 0; i < nb; i++) {
      static unsigned host[EV_NE];
      assert_int_equal(weft_copy_from_block(s[dev[i]][2], host, b[i], 0, sizeof host), WEFT_OK);
      assert_int_equal(weft_stream_synchronize(s[dev[i]][2]), WEFT_OK);
      for (unsigned e = 0; e < EV_NE; e++)
        if (host[e] != model[i])
          fail_msg("seed %llu%s%s: block %d element %u: %u, expected %u", (unsigned long long)seed,
                   fault != NULL ? ", fault " : "", fault != NULL ? fault : "", i, e, host[e], model[i]);
    }
    expect_no_race(g->sim);
  }
  for (int i = 0; i < nb; i++) assert_int_equal(weft_free(b[i], s[dev[i]][0]), WEFT_OK);
  return evictions;
}

/* Each program must evict (premise: counted over the runtimes, else the test fails); the data
 * ends equal to the host model and the oracle sees no race; the last seed on the simulator runs
 * with weft's waits off and must then race (positive control). */
static void test_evicted_ticks_across_devices(void **state) {
  (void)state;
  if (!two_devices()) skip();
  if (!peers_can()) skip(); /* test_devices_no_peer checks the refusal */
  int count = 0;
  assert_int_equal(drv->cuDeviceGetCount(&count), CUDA_SUCCESS);
  g_nd = count < MAXD ? count : MAXD;
  for (unsigned lazy = 0; lazy <= 1; lazy++) {
    ev_rig_t g;
    ev_open(&g, lazy);
    int seeds = g.sim != NULL ? 5 : 2;
    for (int seed = 0; seed < seeds; seed++) {
      int positive = g.sim != NULL && seed == seeds - 1;
      unsigned failed;
      uint64_t n = ev_program(&g, 0x2545f4914f6cdd1dull * (uint64_t)(seed + 11 + 100 * (int)lazy), 12 * g_nd,
                              positive, NULL, &failed);
      printf("%d devices, %s records, seed %d: ring evictions %llu%s\n", g_nd, lazy ? "lazy" : "eager", seed,
             (unsigned long long)n, positive ? " (waits off: positive control)" : "");
      /* (No wait, no eviction: the positive control issues none.) */
      if (!positive && n == 0) fail_msg("premise: no ring eviction (%s records, seed %d)", lazy ? "lazy" : "eager", seed);
    }
    ev_close(&g);
  }
  g_nd = 2;
}

/* The same programs on two devices with a fault at the Nth call of the driver functions a wait on
 * an evicted tick goes through (the stand-in's wait, the records that fill the ring, the launch
 * between them), N over the program's calls (every wait's, every ninth record's and launch's): every call either succeeds or fails with nothing
 * changed, so the data ends equal to the model kept of the calls that succeeded, with no race.
 * Premises: the faults fire, those of waits and launches fail kernels, and the programs evict. */
static void test_faults_on_evicted_ticks_across_devices(void **state) {
  (void)state;
  if (!two_devices() || weft_sim_api(weft_driver_symbol) == NULL) skip(); /* fault injection */
  if (!peers_can()) skip();
  g_nd = 2;
  static const char *const fns[] = {"cuStreamWaitEvent", "cuEventRecord", "cuLaunchKernel"};
  for (unsigned lazy = 0; lazy <= 1; lazy++) {
    ev_rig_t g;
    ev_open(&g, lazy);
    for (unsigned f = 0; f < sizeof fns / sizeof fns[0]; f++) {
      unsigned cells = 0, failed_calls = 0;
      uint64_t evictions = 0, fired = 0;
      /* Every wait of the first 160 (the stand-ins' call); every ninth record and launch. */
      bool every = strcmp(fns[f], "cuStreamWaitEvent") == 0;
      for (unsigned nth = 1; nth <= (every ? 160u : 200u); nth += every ? 1 : 9) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s:%u:CUDA_ERROR_UNKNOWN", fns[f], nth);
        weft_sim_stats_t st0, st1;
        g.sim->stats(&st0);
        unsigned failed;
        evictions += ev_program(&g, 0x9e3779b97f4a7c15ull * (nth + 1), 16, 0, spec, &failed);
        g.sim->stats(&st1);
        fired += st1.faults_injected - st0.faults_injected;
        failed_calls += failed;
        cells++;
      }
      printf("%s records, %s: %u cells, %llu faults fired, %u kernels refused, %llu ring evictions\n",
             lazy ? "lazy" : "eager", fns[f], cells, (unsigned long long)fired, failed_calls,
             (unsigned long long)evictions);
      /* A failed record of a use's own event fails nothing: the use's work is in, and its tick
       * is recorded when a waiter needs it (clock.c, record_for_others). A failed wait or launch
       * fails its kernel. */
      bool refusals = strcmp(fns[f], "cuEventRecord") != 0;
      if (fired == 0 || (refusals && failed_calls == 0) || evictions == 0)
        fail_msg("premise: %s (%s records): %llu faults fired, %u kernels refused, %llu ring evictions", fns[f],
                 lazy ? "lazy" : "eager", (unsigned long long)fired, failed_calls, (unsigned long long)evictions);
    }
    ev_close(&g);
  }
}

/* Where the devices cannot access each other's memory (test_devices_no_peer: WEFT_SIM_PEER=0),
 * a kernel or memset on one device over the other's block is refused with NOT_SUPPORTED and
 * changes nothing; a copy between them still works (a peer copy needs no access). */
static void test_without_peer_access_uses_are_refused_copies_work(void **state) {
  (void)state;
  if (!two_devices()) skip();
  if (peers_can()) skip(); /* the devices can: test_random_programs_across_devices covers them */
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  weft_runtime_t *rt[2];
  weft_stream_t *s[2];
  weft_block_t b[2];
  for (int d = 0; d < 2; d++) {
    assert_int_equal(weft_runtime_get(d, NULL, &rt[d]), WEFT_OK);
    assert_int_equal(weft_stream_get(rt[d], 1, &s[d]), WEFT_OK);
    assert_int_equal(weft_alloc(rt[d], 4096, s[d], "b", &b[d]), WEFT_OK);
    assert_int_equal(weft_memset32(s[d], b[d], 0, 10u + (unsigned)d, 4096), WEFT_OK);
  }
  kernels_t k;
  kernels_load(&k, rt, sim);
  weft_counters_t before, after;
  assert_int_equal(weft_runtime_counters(rt[1], &before), WEFT_OK);
  assert_int_equal(weft_runtime_enable_peer_access(rt[0], rt[1]), WEFT_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(weft_last_error(), "cannot access"));
  assert_int_equal(combine(&k, 0, s[0], b[0], b[1], b[1], 1024, 3), WEFT_ERR_NOT_SUPPORTED);
  assert_int_equal(weft_memset32(s[0], b[1], 0, 5, 4096), WEFT_ERR_NOT_SUPPORTED);
  assert_int_equal(weft_runtime_counters(rt[1], &after), WEFT_OK);
  assert_memory_equal(&before, &after, sizeof before); /* the far runtime saw nothing */
  assert_int_equal(weft_runtime_enable_peer_access(rt[0], rt[0]), WEFT_OK); /* itself: nothing to do */
  assert_int_equal(weft_copy_block(s[0], b[0], 0, b[1], 0, 4096), WEFT_OK);
  expect_uniform(s[0], b[0], 11u);
  expect_no_race(sim);
  kernels_unload(&k);
  for (int d = 0; d < 2; d++) {
    assert_int_equal(weft_free(b[d], s[d]), WEFT_OK);
    assert_int_equal(weft_runtime_release(rt[d]), WEFT_OK);
  }
}

/* Issue 14: "waits stay minimal (equal to the transitive reduction) across devices, as on one
 * device". Random programs (prog.h: each use a kernel reading up to three blocks and writing up
 * to two) over blocks of every device, each use on one of three streams of any device: the waits
 * weft issues, summed over the runtimes, equal the cross-stream edges of the transitive reduction
 * of the program's dependency graph, counted from scratch with the streams of all devices as one
 * set; the data equals the sequential model and the oracle sees no race. The runtimes record
 * eagerly (lazy_records = 0): a stream that records lazily may wait later than needed, and then
 * fewer times. Premise: the programs cross devices. */
static void test_waits_across_devices_equal_the_reduction(void **state) {
  (void)state;
  if (!two_devices()) skip();
  if (!peers_can()) skip(); /* test_devices_no_peer checks the refusal */
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  int count = 0;
  assert_int_equal(drv->cuDeviceGetCount(&count), CUDA_SUCCESS);
  g_nd = count < MAXD ? count : MAXD;
  const int nd = g_nd;
  weft_options_t o = weft_options_default();
  assert_int_equal(weft_options_from_env(&o), WEFT_OK); /* test_devices_ring4: rings of 4 */
  o.lazy_records = 0;
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  open_devices(rt, s, &o);
  kernels_t k;
  kernels_load(&k, rt, sim);
  enum { PER = 3, NE = 512 };
  const unsigned nb = PER * (unsigned)nd, ns = 3 * (unsigned)nd; /* block b on device b / PER; stream g = 3 d + j */
  unsigned seeds = sim != NULL ? 4 : 2, uses = 60u * (unsigned)nd;
  uint64_t crossing = 0;
  for (unsigned seed = 1; seed <= seeds; seed++) {
    prog_t p;
    prog_init(&p, nb, ns, NE);
    prog_random(&p, uses, 0x5eedull * seed);
    weft_block_t b[PER * MAXD];
    static unsigned model[PER * MAXD][NE], tmp[NE];
    for (unsigned i = 0; i < nb; i++) {
      int d = (int)(i / PER);
      assert_int_equal(weft_alloc(rt[d], NE * 4, s[d][0], "prog", &b[i]), WEFT_OK);
      assert_int_equal(weft_memset32(s[d][0], b[i], 0, 1000u * i, NE * 4), WEFT_OK);
      for (unsigned e = 0; e < NE; e++) model[i][e] = 1000u * i;
    }
    for (int d = 0; d < nd; d++) assert_int_equal(weft_runtime_synchronize(rt[d]), WEFT_OK);
    if (sim != NULL) sim->reset_races();
    uint64_t w0 = 0, w1 = 0, ev0 = 0, ev1 = 0;
    for (int d = 0; d < nd; d++) {
      weft_counters_t c;
      assert_int_equal(weft_runtime_counters(rt[d], &c), WEFT_OK);
      w0 += c.waits_issued;
      ev0 += c.ring_evictions;
    }
    for (unsigned v = 0; v < p.uses; v++) {
      const prog_use_t *u = &p.use[v];
      int d = (int)(u->stream / 3);
      weft_access_t a[5];
      size_t na = 0;
      CUdeviceptr ptrs[5] = {0};
      for (int i = 0; i < 2; i++)
        if (u->out[i] >= 0) {
          ptrs[i] = ptr(b[u->out[i]]);
          a[na++] = (weft_access_t){b[u->out[i]], WEFT_WRITE};
          crossing += (unsigned)u->out[i] / PER != (unsigned)d;
        }
      for (int i = 0; i < 3; i++)
        if (u->in[i] >= 0) {
          ptrs[2 + i] = ptr(b[u->in[i]]);
          int dup = 0;
          for (size_t j = 0; j < na; j++) dup |= a[j].block.rec == b[u->in[i]].rec;
          for (size_t j = 0; j < na && dup; j++)
            if (a[j].block.rec == b[u->in[i]].rec) a[j].kind = a[j].kind == WEFT_WRITE ? WEFT_READ_WRITE : a[j].kind;
          if (!dup) a[na++] = (weft_access_t){b[u->in[i]], WEFT_READ};
          crossing += (unsigned)u->in[i] / PER != (unsigned)d;
        }
      unsigned n = NE, salt = v, spin = k.spin;
      void *params[8] = {&ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3], &ptrs[4], &n, &salt, &spin};
      weft_launch_t l = {.func = k.combine[d], .grid = {(NE + 255) / 256}, .block = {256}, .params = params};
      weft_status_t st = weft_launch(s[d][u->stream % 3], &l, a, na);
      if (st != WEFT_OK) fail_msg("seed %u use %u: %s: %s", seed, v, weft_status_name(st), weft_last_error());
      for (unsigned e = 0; e < NE; e++) {
        unsigned val = v;
        if (u->in[0] >= 0) val += 7u * model[u->in[0]][e];
        if (u->in[1] >= 0) val += 13u * model[u->in[1]][e];
        if (u->in[2] >= 0) val += 17u * model[u->in[2]][e];
        tmp[e] = val;
      }
      for (unsigned e = 0; e < NE; e++) {
        if (u->out[0] >= 0) model[u->out[0]][e] = tmp[e];
        if (u->out[1] >= 0) model[u->out[1]][e] = tmp[e] ^ 0x55555555u;
      }
    }
    for (int d = 0; d < nd; d++) {
      weft_counters_t c;
      assert_int_equal(weft_runtime_counters(rt[d], &c), WEFT_OK);
      w1 += c.waits_issued;
      ev1 += c.ring_evictions;
    }
    uint64_t minimal = prog_reduction_edges(&p);
    printf("%d devices, seed %u: %u uses, waits %llu, transitive reduction %llu, ring evictions %llu\n", nd, seed,
           p.uses, (unsigned long long)(w1 - w0), (unsigned long long)minimal, (unsigned long long)(ev1 - ev0));
    /* An evicted tick is waited on through a newer event (conservative): the count is exact only
     * without evictions; order and data are checked either way. */
    if (ev1 == ev0) assert_int_equal(w1 - w0, minimal);
    for (unsigned i = 0; i < nb; i++) {
      int d = (int)(i / PER);
      assert_int_equal(weft_copy_from_block(s[d][2], tmp, b[i], 0, sizeof tmp), WEFT_OK);
      assert_int_equal(weft_stream_synchronize(s[d][2]), WEFT_OK);
      for (unsigned e = 0; e < NE; e++)
        if (tmp[e] != model[i][e]) fail_msg("seed %u block %u element %u: %u, expected %u", seed, i, e, tmp[e], model[i][e]);
    }
    if (sim != NULL) {
      weft_sim_stats_t st;
      sim->stats(&st);
      if (st.races != 0) sim->print_report();
      assert_int_equal(st.races, 0);
    }
    for (unsigned i = 0; i < nb; i++) assert_int_equal(weft_free(b[i], s[i / PER][0]), WEFT_OK);
    prog_free(&p);
  }
  assert_true(crossing > 0); /* premise: uses touched blocks of other devices */
  kernels_unload(&k);
  for (int d = 0; d < nd; d++) assert_int_equal(weft_runtime_release(rt[d]), WEFT_OK);
}

/* Issue 14: collectives and kernels "capturable under the same capture rules as everything
 * else". A capture on device 0 whose kernel reads a block of device 1 and whose memset writes
 * another: the graph's access summary holds both far blocks, so each launch waits for device 1's
 * conflicting work (a cross-device wait) and device 1's later work waits for the launch, as for
 * any use. Checked by data over rounds where device 1 rewrites its blocks between launches, and
 * by the oracle. A peer copy, which CUDA cannot capture, is refused and leaves the capture
 * going. */
static void test_captures_may_use_blocks_of_other_devices(void **state) {
  (void)state;
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  weft_block_t near, far, far2, copy;
  assert_int_equal(weft_alloc(rt[0], 4096, s[0][0], "near", &near), WEFT_OK);
  assert_int_equal(weft_alloc(rt[0], 4096, s[0][0], "copy", &copy), WEFT_OK); /* for the refused copy */
  assert_int_equal(weft_alloc(rt[1], 4096, s[1][0], "far", &far), WEFT_OK);
  assert_int_equal(weft_alloc(rt[1], 4096, s[1][0], "far2", &far2), WEFT_OK);
  assert_int_equal(weft_memset32(s[1][0], far, 0, 0, 4096), WEFT_OK);
  assert_int_equal(weft_memset32(s[1][0], far2, 0, 0, 4096), WEFT_OK);
  assert_int_equal(weft_capture_begin(s[0][1], NULL), WEFT_OK);
  assert_int_equal(combine(&k, 0, s[0][1], near, far, far, 1024, 9), WEFT_OK);
  assert_int_equal(weft_memset32(s[0][1], far2, 0, 0x77u, 4096), WEFT_OK);
  /* CUDA cannot capture a peer copy: refused before the driver sees it, the capture goes on. */
  assert_int_equal(weft_copy_block(s[0][1], copy, 0, far, 0, 4096), WEFT_ERR_CAPTURE);
  weft_graph_t *g = NULL;
  assert_int_equal(weft_capture_end(s[0][1], &g), WEFT_OK);
  weft_access_t sum[4];
  assert_int_equal(weft_graph_summary(g, sum, 4), 3);
  weft_exec_t *e = NULL;
  assert_int_equal(weft_graph_instantiate(g, s[0][1], &e), WEFT_OK);
  for (unsigned round = 0; round < 4; round++) {
    /* Device 1 writes far (the graph reads it) and far2 (the graph overwrites it) first. */
    assert_int_equal(combine(&k, 1, s[1][round % 3], far, far2, far2, 1024, round), WEFT_OK);
    assert_int_equal(weft_exec_launch(e, s[0][(round + 1) % 3]), WEFT_OK);
    /* Then reads far2 after the launch wrote it: this use waits for the launch. */
    assert_int_equal(combine(&k, 1, s[1][(round + 2) % 3], far, far2, far2, 1024, 100 + round), WEFT_OK);
    unsigned far_now = round + 20u * (round == 0 ? 0u : 0x77u); /* far as the launch read it */
    expect_uniform(s[0][0], near, 9u + 20u * far_now);
    expect_uniform(s[1][0], far, 100u + round + 20u * 0x77u);
  }
  if (sim != NULL) {
    weft_sim_stats_t st;
    sim->stats(&st);
    if (st.races != 0) sim->print_report();
    assert_int_equal(st.races, 0);
    /* Positive control: the same round without weft's waits races across the devices. */
    weft_test_no_waits(rt, 1);
    assert_int_equal(combine(&k, 1, s[1][0], far, far2, far2, 1024, 7), WEFT_OK);
    assert_int_equal(weft_exec_launch(e, s[0][1]), WEFT_OK);
    assert_int_equal(combine(&k, 1, s[1][2], far, far2, far2, 1024, 8), WEFT_OK);
    end_positive_control(rt, sim);
  }
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_free(near, s[0][0]), WEFT_OK);
  assert_int_equal(weft_free(copy, s[0][0]), WEFT_OK);
  assert_int_equal(weft_free(far, s[1][0]), WEFT_OK);
  assert_int_equal(weft_free(far2, s[1][0]), WEFT_OK);
  close_two(rt, &k);
}

/* A capture begun by code outside weft (cuStreamBeginCapture on weft_stream_raw of a device-0
 * stream) while device 1 has pending work on a block the captured kernel reads: weft adopts the
 * capture, records nothing of device 1's live clock into it, and the capture ends valid. The
 * graph, launched by that code after synchronising device 1 (weft cannot order a launch it does
 * not see), computes from the block's data. */
static void test_an_outside_capture_may_read_another_device_s_block(void **state) {
  (void)state;
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  weft_block_t near, far;
  assert_int_equal(weft_alloc(rt[0], 4096, s[0][0], "near", &near), WEFT_OK);
  assert_int_equal(weft_alloc(rt[1], 4096, s[1][0], "far", &far), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt[0]), WEFT_OK);
  assert_int_equal(weft_memset32(s[1][1], far, 0, 4, 4096), WEFT_OK); /* pending on device 1 */
  CUstream raw = weft_stream_raw(s[0][2]);
  assert_int_equal(drv->cuStreamBeginCapture(raw, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  assert_int_equal(combine(&k, 0, s[0][2], near, far, far, 1024, 3), WEFT_OK);
  CUgraph g = NULL;
  assert_int_equal(drv->cuStreamEndCapture(raw, &g), CUDA_SUCCESS);
  assert_non_null(g);
  CUgraphExec ge = NULL;
  assert_int_equal(drv->cuGraphInstantiateWithFlags(&ge, g, 0), CUDA_SUCCESS);
  assert_int_equal(weft_runtime_synchronize(rt[1]), WEFT_OK);
  assert_int_equal(drv->cuGraphLaunch(ge, raw), CUDA_SUCCESS);
  assert_int_equal(drv->cuStreamSynchronize(raw), CUDA_SUCCESS);
  expect_uniform(s[0][0], near, 3u + 20u * 4u);
  assert_int_equal(drv->cuGraphExecDestroy(ge), CUDA_SUCCESS);
  assert_int_equal(drv->cuGraphDestroy(g), CUDA_SUCCESS);
  expect_no_race(sim);
  assert_int_equal(weft_free(near, s[0][0]), WEFT_OK);
  assert_int_equal(weft_free(far, s[1][0]), WEFT_OK);
  close_two(rt, &k);
}

/* Faults on the path across devices: each of the driver calls a use across devices makes (the
 * far stream's record in its own context, the context switches, the cross-device wait, the
 * launch, the copies) fails in turn, at its 1st..8th call in a fixed program of kernels and
 * copies (a peer copy where the blocks are on two devices) on both devices over blocks of both. A use that fails has enqueued nothing and changed nothing (weft.h); one that
 * succeeded is ordered: the data ends equal to a model that skips the failed uses, the oracle
 * sees no race, and the clocks stay valid. Simulator only (fault injection). */
static void test_faults_across_devices_leave_order_and_data(void **state) {
  (void)state;
  if (weft_sim_api(weft_driver_symbol) == NULL) skip(); /* fault injection needs the simulator */
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  static const char *const names[] = {"cuEventRecord",  "cuStreamWaitEvent", "cuCtxSetCurrent",
                                      "cuLaunchKernel", "cuMemcpyPeerAsync", "cuMemcpyDtoDAsync"};
  enum { NB = 4, OPS = 16 };
  unsigned fired = 0, failed_ops = 0, fired_by[sizeof names / sizeof names[0]] = {0};
  for (unsigned f = 0; f < sizeof names / sizeof names[0]; f++)
    for (unsigned nth = 1; nth <= 8; nth++) {
      weft_block_t b[NB]; /* b[0], b[1] on device 0; b[2], b[3] on device 1 */
      unsigned model[NB];
      for (unsigned i = 0; i < NB; i++) {
        int d = (int)(i / 2);
        assert_int_equal(weft_alloc(rt[d], 4096, s[d][0], "f", &b[i]), WEFT_OK);
        assert_int_equal(weft_memset32(s[d][0], b[i], 0, i + 1, 4096), WEFT_OK);
        model[i] = i + 1;
      }
      weft_sim_stats_t st0, st1;
      sim->stats(&st0);
      char spec[64];
      snprintf(spec, sizeof spec, "%s:%u:CUDA_ERROR_UNKNOWN", names[f], nth);
      assert_int_equal((sim->fail)(spec), 0);
      for (unsigned op = 0; op < OPS; op++) {
        int d = (int)(op % 2);
        unsigned out = (op * 3 + 1) % NB, in = (op * 5 + 2) % NB;
        if (in == out) in = (in + 1) % NB;
        /* Every fourth op copies the whole block: between devices (a peer copy), or every eighth
         * within one device. */
        if (op % 8 == 7) in = out ^ 1u;
        weft_status_t st = op % 4 == 3 ? weft_copy_block(s[d][op % 3], b[out], 0, b[in], 0, 4096)
                                       : combine(&k, d, s[d][op % 3], b[out], b[in], b[in], 1024, op);
        if (st == WEFT_OK) model[out] = op % 4 == 3 ? model[in] : op + 20u * model[in];
        else failed_ops++;
      }
      assert_int_equal((sim->fail)(NULL), 0);
      sim->stats(&st1);
      fired += (unsigned)(st1.faults_injected - st0.faults_injected);
      fired_by[f] += (unsigned)(st1.faults_injected - st0.faults_injected);
      for (int d = 0; d < 2; d++) assert_int_equal(weft_runtime_synchronize(rt[d]), WEFT_OK);
      for (unsigned i = 0; i < NB; i++) {
        unsigned host[1024];
        int d = (int)(i / 2);
        assert_int_equal(weft_copy_from_block(s[d][1], host, b[i], 0, sizeof host), WEFT_OK);
        assert_int_equal(weft_stream_synchronize(s[d][1]), WEFT_OK);
        if (host[0] != model[i] || host[1023] != model[i])
          fail_msg("%s: block %u is %u, expected %u", spec, i, host[0], model[i]);
      }
      if (st1.races != 0) sim->print_report();
      assert_int_equal(st1.races, 0);
      for (int d = 0; d < 2; d++) assert_true(weft__tracker_is_valid(&rt[d]->tracker));
      for (unsigned i = 0; i < NB; i++) assert_int_equal(weft_free(b[i], s[i / 2][0]), WEFT_OK);
    }
  printf("faults across devices: %u fired, %u uses failed\n", fired, failed_ops);
  for (unsigned f = 0; f < sizeof names / sizeof names[0]; f++)
    if (fired_by[f] == 0) fail_msg("%s: the fault fired nowhere", names[f]);
  assert_true(fired >= 16 && failed_ops > 0); /* premise: the faults hit the program */
  close_two(rt, &k);
}

/* A runtime created while another has clocks in use: the process's clocks grow longer (their
 * rows and every ring snapshot are copied), and what the snapshots said still holds: a wait that
 * is implied through an event recorded before the growth is not issued again. */
static void test_clocks_grow_with_a_new_runtime_and_keep_what_they_knew(void **state) {
  (void)state;
  if (!two_devices()) skip();
  if (!peers_can()) skip();
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  weft_options_t o = weft_options_default();
  o.lazy_records = 0;
  weft_runtime_t *rt0, *rt1;
  weft_stream_t *s[3], *t;
  assert_int_equal(weft_runtime_get(0, &o, &rt0), WEFT_OK);
  for (unsigned i = 0; i < 3; i++) assert_int_equal(weft_stream_get(rt0, i, &s[i]), WEFT_OK);
  /* Device 1's runtime will take lanes beyond the clocks' length (they never shrink: earlier
   * tests of this process may have grown them), so that they must grow. */
  unsigned stride0 = rt0->tracker.live->stride;
  if (rt0->tracker.base != 0 || stride0 > 64) {
    assert_int_equal(weft_runtime_release(rt0), WEFT_OK);
    skip(); /* no room to show the growth */
  }
  g_nd = 1;
  kernels_t k;
  weft_runtime_t *rts[MAXD] = {rt0};
  kernels_load(&k, rts, sim);
  weft_block_t a, b, c;
  assert_int_equal(weft_alloc(rt0, 4096, s[0], "a", &a), WEFT_OK);
  assert_int_equal(weft_alloc(rt0, 4096, s[0], "b", &b), WEFT_OK);
  assert_int_equal(weft_alloc(rt0, 4096, s[0], "c", &c), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt0), WEFT_OK);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(rt0, &c0), WEFT_OK);
  assert_int_equal(weft_memset32(s[0], a, 0, 1, 4096), WEFT_OK);
  assert_int_equal(combine(&k, 0, s[1], b, a, a, 1024, 2), WEFT_OK); /* s1 waits for s0 */
  weft_options_t o1 = o;
  o1.stream_count = stride0;
  o1.adopt_streams = 0;
  assert_int_equal(weft_runtime_get(1, &o1, &rt1), WEFT_OK);
  assert_true(rt0->tracker.live->stride > stride0); /* premise: the clocks grew */
  /* c from b and a on s2: one wait (for s1), the one for s0 implied through s1's event. */
  assert_int_equal(combine(&k, 0, s[2], c, b, a, 1024, 3), WEFT_OK);
  assert_int_equal(weft_runtime_counters(rt0, &c1), WEFT_OK);
  assert_int_equal(c1.waits_issued - c0.waits_issued, 2);
  /* The new runtime's stream reads c (a wait across devices) into its own block. */
  assert_int_equal(weft_stream_get(rt1, 0, &t), WEFT_OK);
  kernels_unload(&k);
  g_nd = 2;
  rts[1] = rt1;
  kernels_load(&k, rts, sim);
  weft_block_t x;
  assert_int_equal(weft_alloc(rt1, 4096, t, "x", &x), WEFT_OK);
  assert_int_equal(combine(&k, 1, t, x, c, c, 1024, 4), WEFT_OK);
  unsigned host[1024];
  assert_int_equal(weft_copy_from_block(t, host, x, 0, sizeof host), WEFT_OK);
  assert_int_equal(weft_stream_synchronize(t), WEFT_OK);
  unsigned vb = 2u + 20u * 1u, vc = 3u + 7u * vb + 13u * 1u;
  for (unsigned i = 0; i < 1024; i++) assert_int_equal(host[i], 4u + 20u * vc);
  expect_no_race(sim);
  assert_true(weft__tracker_is_valid(&rt0->tracker));
  assert_int_equal(weft_free(x, t), WEFT_OK);
  assert_int_equal(weft_free(a, s[0]), WEFT_OK);
  assert_int_equal(weft_free(b, s[0]), WEFT_OK);
  assert_int_equal(weft_free(c, s[0]), WEFT_OK);
  kernels_unload(&k);
  assert_int_equal(weft_runtime_release(rt1), WEFT_OK);
  assert_int_equal(weft_runtime_release(rt0), WEFT_OK);
}

/* A runtime given back while another runtime's block remembers a read on one of its streams:
 * the lanes go back to the process (their work is complete), a new runtime of that device takes
 * them again, and both the old read and the new streams order correctly. */
static void test_lanes_of_a_released_runtime_are_taken_again_safely(void **state) {
  (void)state;
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  unsigned lane0 = s[1][0]->lane;
  weft_block_t x, out;
  assert_int_equal(weft_alloc(rt[0], 4096, s[0][0], "x", &x), WEFT_OK);
  assert_int_equal(weft_memset32(s[0][0], x, 0, 3, 4096), WEFT_OK);
  assert_int_equal(weft_alloc(rt[1], 4096, s[1][0], "out", &out), WEFT_OK);
  assert_int_equal(combine(&k, 1, s[1][0], out, x, x, 1024, 1), WEFT_OK); /* x read on device 1 */
  assert_int_equal(weft_free(out, s[1][0]), WEFT_OK);
  kernels_unload(&k);
  assert_int_equal(weft_runtime_release(rt[1]), WEFT_OK);
  assert_int_equal(weft_runtime_get(1, NULL, &rt[1]), WEFT_OK);
  for (unsigned i = 0; i < 3; i++) assert_int_equal(weft_stream_get(rt[1], i, &s[1][i]), WEFT_OK);
  assert_int_equal(s[1][0]->lane, lane0); /* premise: the same lanes again */
  kernels_load(&k, rt, sim);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(rt[0], &c0), WEFT_OK);
  /* The old read is complete: the write needs no wait for it. */
  assert_int_equal(weft_memset32(s[0][1], x, 0, 5, 4096), WEFT_OK);
  assert_int_equal(weft_runtime_counters(rt[0], &c1), WEFT_OK);
  assert_int_equal(c1.waits_issued, c0.waits_issued);
  /* The new runtime's stream reads x after that write: one wait. */
  assert_int_equal(weft_alloc(rt[1], 4096, s[1][0], "out", &out), WEFT_OK);
  assert_int_equal(weft_runtime_counters(rt[1], &c0), WEFT_OK);
  assert_int_equal(combine(&k, 1, s[1][0], out, x, x, 1024, 2), WEFT_OK);
  assert_int_equal(weft_runtime_counters(rt[1], &c1), WEFT_OK);
  assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
  expect_uniform(s[1][0], out, 2u + 7u * 5 + 13u * 5);
  expect_no_race(sim);
  assert_int_equal(weft_free(out, s[1][0]), WEFT_OK);
  assert_int_equal(weft_free(x, s[0][0]), WEFT_OK);
  close_two(rt, &k);
}

/* A block made before its reader's runtime: that runtime's streams are lanes the block's history
 * had no room for (its reads array is sized to the lanes there were). The read grows the history
 * (streams/tracker.c, admit_live), and a later write on the block's device waits for that read.
 * First in the list: lanes never shrink, so the new runtime's lanes are beyond the block's room
 * only while no earlier test has made them. */
static void test_a_reader_newer_than_the_block_grows_its_history(void **state) {
  (void)state;
  if (!two_devices() || !peers_can()) skip();
  const weft_sim_api_t *sim = weft_sim_api(weft_driver_symbol);
  weft_runtime_t *rt[MAXD] = {NULL};
  weft_stream_t *s0, *t = NULL;
  assert_int_equal(weft_runtime_get(0, NULL, &rt[0]), WEFT_OK);
  assert_int_equal(weft_stream_get(rt[0], 0, &s0), WEFT_OK);
  weft_block_t x, out;
  assert_int_equal(weft_alloc(rt[0], 4096, s0, "x", &x), WEFT_OK);
  assert_int_equal(weft_memset32(s0, x, 0, 3, 4096), WEFT_OK);
  const struct weft__block *rec = x.rec;
  unsigned cap = rec->acc.reads_cap;
  weft_options_t o1 = weft_options_default();
  o1.stream_count = 16;
  o1.adopt_streams = 0;
  assert_int_equal(weft_runtime_get(1, &o1, &rt[1]), WEFT_OK);
  for (unsigned i = 0; i < o1.stream_count && t == NULL; i++) {
    weft_stream_t *u;
    assert_int_equal(weft_stream_get(rt[1], i, &u), WEFT_OK);
    if (u->lane >= cap) t = u;
  }
  if (t == NULL) { /* premise: a lane beyond the block's room */
    assert_int_equal(weft_free(x, s0), WEFT_OK);
    assert_int_equal(weft_runtime_release(rt[1]), WEFT_OK);
    assert_int_equal(weft_runtime_release(rt[0]), WEFT_OK);
    skip();
  }
  kernels_t k;
  g_nd = 2;
  kernels_load(&k, rt, sim);
  assert_int_equal(weft_alloc(rt[1], 4096, t, "out", &out), WEFT_OK);
  assert_int_equal(combine(&k, 1, t, out, x, x, 1024, 2), WEFT_OK); /* x read on a lane it had no room for */
  assert_true(rec->acc.reads_cap > t->lane);
  assert_true((rec->acc.reader_mask >> t->lane) & 1);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(rt[0], &c0), WEFT_OK);
  assert_int_equal(weft_memset32(s0, x, 0, 5, 4096), WEFT_OK); /* waits for that read */
  assert_int_equal(weft_runtime_counters(rt[0], &c1), WEFT_OK);
  assert_int_equal(c1.waits_issued - c0.waits_issued, 1);
  expect_uniform(t, out, 2u + 7u * 3 + 13u * 3);
  expect_uniform(s0, x, 5);
  expect_no_race(sim);
  assert_true(weft__tracker_is_valid(&rt[0]->tracker));
  assert_int_equal(weft_free(out, t), WEFT_OK);
  assert_int_equal(weft_free(x, s0), WEFT_OK);
  kernels_unload(&k);
  assert_int_equal(weft_runtime_release(rt[1]), WEFT_OK);
  assert_int_equal(weft_runtime_release(rt[0]), WEFT_OK);
}

/* The process has WEFT__MAX_LANES stream lanes over all its runtimes: a runtime that finds no
 * room is refused with BUSY and leaves nothing behind; once another is released it fits. */
static void test_a_runtime_without_free_lanes_is_refused_cleanly(void **state) {
  (void)state;
  int count = 0;
  assert_int_equal(weft__driver_get(&drv), WEFT_OK);
  assert_int_equal(drv->cuDeviceGetCount(&count), CUDA_SUCCESS);
  if (count < 3) skip(); /* two runtimes hold at most 2 x 64 lanes: test_devices_8 runs it */
  weft_options_t big = weft_options_default();
  big.stream_count = 48;
  big.adopt_streams = 16;
  weft_runtime_t *a, *b, *c;
  assert_int_equal(weft_runtime_get(0, &big, &a), WEFT_OK);
  assert_int_equal(weft_runtime_get(1, &big, &b), WEFT_OK);
  assert_int_equal(weft_runtime_get(2, NULL, &c), WEFT_ERR_BUSY);
  assert_non_null(strstr(weft_last_error(), "lanes"));
  assert_int_equal(weft_runtime_release(a), WEFT_OK);
  assert_int_equal(weft_runtime_get(2, NULL, &c), WEFT_OK);
  weft_stream_t *s;
  weft_block_t x;
  assert_int_equal(weft_stream_get(c, 0, &s), WEFT_OK);
  assert_int_equal(weft_alloc(c, 4096, s, "x", &x), WEFT_OK);
  assert_int_equal(weft_memset32(s, x, 0, 1, 4096), WEFT_OK);
  assert_int_equal(weft_free(x, s), WEFT_OK);
  assert_int_equal(weft_runtime_release(c), WEFT_OK);
  assert_int_equal(weft_runtime_release(b), WEFT_OK);
}

/* 8 threads, each with a block on each of two devices, pass data back and forth between the
 * devices (kernels on either device's streams reading the other's block) while the others do
 * the same: the shared clock domain under contention (run under tsan in CI). */
typedef struct {
  const kernels_t *k;
  weft_runtime_t **rt;
  weft_stream_t *(*s)[3];
  int id, rounds;
  unsigned result;
} ping_t;

static void *ping_main(void *arg) {
  ping_t *p = arg;
  weft_block_t blk[2];
  for (int d = 0; d < 2; d++)
    if (weft_alloc(p->rt[d], 4096, p->s[d][p->id % 3], "ping", &blk[d]) != WEFT_OK ||
        weft_memset32(p->s[d][p->id % 3], blk[d], 0, (unsigned)p->id, 4096) != WEFT_OK)
      return NULL;
  unsigned model[2] = {(unsigned)p->id, (unsigned)p->id};
  for (int r = 0; r < p->rounds; r++) {
    int d = r & 1; /* device d writes its block from the other device's */
    weft_stream_t *on = p->s[d][(unsigned)(p->id + r) % 3];
    if (combine(p->k, d, on, blk[d], blk[d ^ 1], blk[d ^ 1], 1024, (unsigned)r) != WEFT_OK) return NULL;
    model[d] = (unsigned)r + 20u * model[d ^ 1];
  }
  unsigned host[1024];
  if (weft_copy_from_block(p->s[0][0], host, blk[0], 0, sizeof host) != WEFT_OK ||
      weft_stream_synchronize(p->s[0][0]) != WEFT_OK)
    return NULL;
  int ok = 1;
  for (unsigned i = 0; i < 1024; i++) ok &= host[i] == model[0];
  for (int d = 0; d < 2; d++) ok &= weft_free(blk[d], p->s[d][0]) == WEFT_OK;
  p->result = ok ? 1 : 2;
  return NULL;
}

/* The thread's current context: weft_launch and the split form on a stream that names its
 * context (a pool stream) need none (tests/conformance "no current context"), and leave the
 * thread's as it was, none or another device's; their waits and records run all the same. On the
 * adopted legacy stream, which stands for the current context's, weft makes its runtime's context
 * current first, so the work runs on its device. */
typedef struct ctx_run {
  const kernels_t *k;
  weft_runtime_t **rt;
  weft_stream_t *(*s)[3];
  weft_block_t a, b, c;
  CUcontext seen[5]; /* the current context after each step */
  weft_status_t st[5];
} ctx_run_t;

static void *ctx_steps(void *arg) {
  ctx_run_t *r = arg;
  CUcontext none = (CUcontext)1;
  r->st[0] = drv->cuCtxGetCurrent(&none) == CUDA_SUCCESS && none == NULL ? WEFT_OK : WEFT_ERR_DRIVER;
  /* No context current: b = 5 + 20 a on s[0][1] (it waits for a's memset on s[0][0]). */
  r->st[1] = combine(r->k, 0, r->s[0][1], r->b, r->a, r->a, N, 5);
  (void)drv->cuCtxGetCurrent(&r->seen[1]);
  /* The split form on s[0][2], reading b (a wait on s[0][1], whose pending point is recorded). */
  weft_access_t rb = {r->b, WEFT_READ};
  r->st[2] = weft_use_begin(r->s[0][2], &rb, 1);
  if (r->st[2] == WEFT_OK) r->st[2] = weft_use_end(r->s[0][2], &rb, 1);
  (void)drv->cuCtxGetCurrent(&r->seen[2]);
  /* Device 1's context current: c = 1 + 20 b on device 0's s[0][0]. */
  if (drv->cuCtxSetCurrent(r->rt[1]->tracker.ctx) != CUDA_SUCCESS) return NULL;
  r->st[3] = combine(r->k, 0, r->s[0][0], r->c, r->b, r->b, N, 1);
  (void)drv->cuCtxGetCurrent(&r->seen[3]);
  /* Still device 1's: a = 2 + 20 c on device 0's legacy stream, adopted: weft binds device 0's. */
  weft_stream_t *legacy;
  r->st[4] = weft_stream_adopt(r->rt[0], CU_STREAM_LEGACY, &legacy);
  if (r->st[4] == WEFT_OK) r->st[4] = combine(r->k, 0, legacy, r->a, r->c, r->c, N, 2);
  (void)drv->cuCtxGetCurrent(&r->seen[4]);
  if (r->st[4] == WEFT_OK) r->st[4] = weft_stream_synchronize(legacy);
  return NULL;
}

static void test_launches_and_uses_leave_the_current_context_alone(void **state) {
  (void)state;
  weft_runtime_t *rt[2];
  weft_stream_t *s[2][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  ctx_run_t r = {.k = &k, .rt = rt, .s = s};
  assert_int_equal(weft_alloc(rt[0], N * 4, s[0][0], "ctx.a", &r.a), WEFT_OK);
  assert_int_equal(weft_alloc(rt[0], N * 4, s[0][0], "ctx.b", &r.b), WEFT_OK);
  assert_int_equal(weft_alloc(rt[0], N * 4, s[0][0], "ctx.c", &r.c), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt[0]), WEFT_OK);
  assert_int_equal(weft_memset32(s[0][0], r.a, 0, 3, N * 4), WEFT_OK);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, ctx_steps, &r), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  static const char *const step[5] = {"a new thread has no context", "weft_launch", "weft_use_begin / end",
                                      "weft_launch with device 1's context current",
                                      "weft_launch on the adopted legacy stream"};
  for (int i = 0; i < 5; i++)
    if (r.st[i] != WEFT_OK) fail_msg("%s: %s (%s)", step[i], weft_status_name(r.st[i]), weft_last_error());
  CUcontext want[5] = {NULL, NULL, NULL, rt[1]->tracker.ctx, rt[0]->tracker.ctx};
  for (int i = 1; i < 5; i++)
    if (r.seen[i] != want[i])
      fail_msg("after %s the thread's current context is %p, want %p", step[i], (void *)r.seen[i], (void *)want[i]);
  expect_uniform(s[0][0], r.b, 5 + 20 * 3);
  expect_uniform(s[0][0], r.c, 1 + 20 * (5 + 20 * 3));
  expect_uniform(s[0][0], r.a, 2 + 20 * (1 + 20 * (5 + 20 * 3)));
  expect_no_race(sim);
  for (int i = 0; i < 3; i++) assert_int_equal(weft_free((&r.a)[i], s[0][0]), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt[0]), WEFT_OK);
  close_two(rt, &k);
}

/* The same for the one use path that creates events: an exact lane (weft__tracker_exact, as a
 * collective's stream is) whose ring is full of events the device has not reached grows it
 * (keep_room), which needs the runtime's context; from a thread with no current context the
 * growth makes it current for the creation and then leaves the thread as it was. The ring grows
 * only where the device lags (the lazy simulator: test_devices_lazy); elsewhere a skip. */
typedef struct grow_run {
  weft_stream_t *s;
  weft_block_t b;
  int uses;
  weft_status_t st;
  CUcontext seen;
} grow_run_t;

static void *grow_steps(void *arg) {
  grow_run_t *g = arg;
  weft_access_t w = {g->b, WEFT_WRITE};
  for (int i = 0; i < g->uses && g->st == WEFT_OK; i++) {
    if ((g->st = weft_use_begin(g->s, &w, 1)) == WEFT_OK) g->st = weft_use_end(g->s, &w, 1);
    (void)drv->cuCtxGetCurrent(&g->seen);
    if (g->seen != NULL) break;
  }
  return NULL;
}

static void test_an_exact_lanes_ring_grows_without_a_current_context(void **state) {
  (void)state;
  weft_runtime_t *rt[2];
  weft_stream_t *s[2][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  grow_run_t g = {.s = s[0][1], .uses = 300, .st = WEFT_OK};
  assert_int_equal(weft_alloc(rt[0], N * 4, s[0][1], "grow", &g.b), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt[0]), WEFT_OK);
  assert_int_equal(weft__tracker_exact(s[0][1]), WEFT_OK);
  weft_counters_t c0, c1;
  assert_int_equal(weft_runtime_counters(rt[0], &c0), WEFT_OK);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, grow_steps, &g), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(weft_runtime_counters(rt[0], &c1), WEFT_OK);
  if (g.st != WEFT_OK) fail_msg("a use on the exact lane: %s", weft_status_name(g.st));
  if (g.seen != NULL) fail_msg("after a use on the exact lane the thread's current context is %p, want none", (void *)g.seen);
  assert_int_equal(weft_free(g.b, s[0][1]), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(rt[0]), WEFT_OK);
  expect_no_race(sim);
  uint64_t grew = c1.ring_growths - c0.ring_growths;
  close_two(rt, &k);
  printf("exact lane: %llu ring growths over %d uses from no current context\n", (unsigned long long)grew, g.uses);
  if (grew == 0) skip(); /* the device kept up: no growth to check */
}

static void test_threads_pass_data_between_devices(void **state) {
  (void)state;
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  enum { T = 8 };
  pthread_t th[T];
  ping_t p[T];
  for (int i = 0; i < T; i++) {
    p[i] = (ping_t){.k = &k, .rt = rt, .s = s, .id = i, .rounds = sim != NULL ? 60 : 20};
    assert_int_equal(pthread_create(&th[i], NULL, ping_main, &p[i]), 0);
  }
  for (int i = 0; i < T; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  for (int i = 0; i < T; i++) {
    if (p[i].result != 1) fail_msg("thread %d: %s (%s)", i, p[i].result == 2 ? "wrong data" : "a call failed", weft_last_error());
  }
  expect_no_race(sim);
  close_two(rt, &k);
}

/* A thread that works on its per-thread streams of two devices and ends: weft synchronises both
 * at its end. (On the GPU, a per-thread stream torn down at a thread's end with work still queued
 * on stream-ordered pool memory allocated there never lets the thread end; weft's pool grows
 * from such a pool on the allocating stream. The lazy simulator keeps that work queued and
 * reports the hazard.) */
typedef struct two_pt {
  weft_runtime_t **rt;
  weft_status_t st;
  char why[256];
} two_pt_t;

static void *work_on_two_per_thread_streams(void *arg) {
  two_pt_t *t = arg;
  for (int d = 0; d < 2 && t->st == WEFT_OK; d++) {
    weft_stream_t *pt;
    weft_block_t b;
    t->st = weft_stream_adopt(t->rt[d], CU_STREAM_PER_THREAD, &pt);
    if (t->st == WEFT_OK) t->st = weft_alloc(t->rt[d], N * 4, pt, "pt", &b); /* the pool grows on pt */
    if (t->st == WEFT_OK) {
      t->st = weft_memset32(pt, b, 0, 7u + (unsigned)d, N * 4);
      weft_status_t f = weft_free(b, pt);
      if (t->st == WEFT_OK) t->st = f;
    }
    if (t->st != WEFT_OK) snprintf(t->why, sizeof t->why, "device %d: %s", d, weft_last_error());
  }
  return NULL;
}

static void test_a_thread_that_worked_on_per_thread_streams_of_two_devices_ends(void **state) {
  (void)state;
  weft_runtime_t *rt[MAXD];
  weft_stream_t *s[MAXD][3];
  kernels_t k;
  const weft_sim_api_t *sim = open_two(rt, s, &k);
  for (int round = 0; round < 4; round++) {
    two_pt_t t = {rt, WEFT_OK, ""};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, work_on_two_per_thread_streams, &t), 0);
    assert_int_equal(pthread_join(th, NULL), 0); /* (on the GPU, without weft's synchronisation: never) */
    if (t.st != WEFT_OK) fail_msg("round %d: %s: %s", round, weft_status_name(t.st), t.why);
  }
  expect_no_race(sim);
  close_two(rt, &k);
}

/* Every device's runtime made by a thread of its own at the same moment, over and over: the
 * runtimes share the process's clock domain, whose lanes one thread initialises while another
 * grows the domain's clocks (tsan: the lane's rings were made outside the lock before). First in
 * the program, while the domain's clocks are still short and each new runtime grows them. */
typedef struct maker {
  int device;
  pthread_barrier_t *start;
  weft_status_t st;
} maker_t;

static void *make_runtime(void *arg) {
  maker_t *m = arg;
  weft_runtime_t *rt;
  pthread_barrier_wait(m->start);
  m->st = weft_runtime_get(m->device, NULL, &rt);
  weft_stream_t *s;
  weft_block_t b;
  if (m->st == WEFT_OK) m->st = weft_stream_get(rt, 0, &s);
  if (m->st == WEFT_OK) m->st = weft_alloc(rt, 4096, s, "made", &b);
  if (m->st == WEFT_OK) m->st = weft_memset32(s, b, 0, 1, 4096);
  if (m->st == WEFT_OK) m->st = weft_free(b, s);
  if (m->st == WEFT_OK) m->st = weft_runtime_release(rt);
  return NULL;
}

static void test_runtimes_made_by_threads_at_once(void **state) {
  (void)state;
  assert_int_equal(weft__driver_get(&drv), WEFT_OK);
  int count = 0;
  assert_int_equal(drv->cuDeviceGetCount(&count), CUDA_SUCCESS);
  if (count < 2) skip();
  if (count > MAXD) count = MAXD;
  for (int round = 0; round < 20; round++) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)count);
    pthread_t t[MAXD];
    maker_t m[MAXD];
    for (int d = 0; d < count; d++) {
      m[d] = (maker_t){d, &start, WEFT_OK};
      assert_int_equal(pthread_create(&t[d], NULL, make_runtime, &m[d]), 0);
    }
    for (int d = 0; d < count; d++) assert_int_equal(pthread_join(t[d], NULL), 0);
    pthread_barrier_destroy(&start);
    for (int d = 0; d < count; d++)
      if (m[d].st != WEFT_OK) fail_msg("round %d, device %d: %s", round, d, weft_status_name(m[d].st));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_reader_newer_than_the_block_grows_its_history),
      cmocka_unit_test(test_runtimes_made_by_threads_at_once),
      cmocka_unit_test(test_each_device_has_its_runtime),
      cmocka_unit_test(test_copy_between_devices_is_ordered_both_ways),
      cmocka_unit_test(test_random_programs_across_devices),
      cmocka_unit_test(test_waits_across_devices_equal_the_reduction),
      cmocka_unit_test(test_evicted_ticks_across_devices),
      cmocka_unit_test(test_faults_on_evicted_ticks_across_devices),
      cmocka_unit_test(test_captures_may_use_blocks_of_other_devices),
      cmocka_unit_test(test_an_outside_capture_may_read_another_device_s_block),
      cmocka_unit_test(test_faults_across_devices_leave_order_and_data),
      cmocka_unit_test(test_clocks_grow_with_a_new_runtime_and_keep_what_they_knew),
      cmocka_unit_test(test_lanes_of_a_released_runtime_are_taken_again_safely),
      cmocka_unit_test(test_a_runtime_without_free_lanes_is_refused_cleanly),
      cmocka_unit_test(test_threads_pass_data_between_devices),
      cmocka_unit_test(test_launches_and_uses_leave_the_current_context_alone),
      cmocka_unit_test(test_an_exact_lanes_ring_grows_without_a_current_context),
      cmocka_unit_test(test_a_thread_that_worked_on_per_thread_streams_of_two_devices_ends),
      cmocka_unit_test(test_without_peer_access_uses_are_refused_copies_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
