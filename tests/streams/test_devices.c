/* Runtimes on two devices (issue 14's first step): each device's runtime allocates its memory
 * from its own device, tracks its own streams and gives everything back at release; a block of
 * one runtime used on the other's stream is refused with WRONG_DEVICE (cross-device tracking is
 * still to come). On the simulator with WEFT_SIM_DEVICES=2 (see BUILD) and on a GPU machine
 * with two devices; skipped with one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "lib/core/driver.h"
#include "lib/runtime/runtime.h"
#include "sim/weft_sim.h"
#include "weft/weft.h"

#define N 4096 /* unsigned elements per block */

static const weft__driver_t *drv;

/* Positive controls: every runtime's tracker issues no waits (on) or does again (off). */
static void weft_test_no_waits(weft_runtime_t **rt, int on) {
  for (int d = 0; d < 2; d++) rt[d]->tracker.no_waits = on != 0;
}

static int two_devices(void) {
  assert_int_equal(weft__driver_get(&drv), WEFT_OK);
  int n = 0;
  assert_int_equal(drv->cuDeviceGetCount(&n), CUDA_SUCCESS);
  return n >= 2;
}

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
  /* A block of device 0's runtime on device 1's stream: refused, nothing changed. */
  assert_int_equal(weft_memset32(s[1], b[0], 0, 7, 4096), WEFT_ERR_WRONG_DEVICE);
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
  for (int d = 0; d < 2; d++) {
    assert_int_equal(weft_runtime_get(d, NULL, &rt[d]), WEFT_OK);
    for (unsigned i = 0; i < 3; i++) assert_int_equal(weft_stream_get(rt[d], i, &s[d][i]), WEFT_OK);
  }
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
      weft_test_no_waits(rt, 0);
      for (int d = 0; d < 2; d++) assert_int_equal(weft_runtime_synchronize(rt[d]), WEFT_OK);
      weft_sim_stats_t st;
      sim->stats(&st);
      assert_true(st.races > 0);
      sim->reset_races();
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
  assert_int_equal(weft_copy_block(s[1][0], y, 0, x, 0, 4096), WEFT_ERR_WRONG_DEVICE); /* neither is device 1's */
  assert_int_equal(weft_free(x, s[0][0]), WEFT_OK);
  assert_int_equal(weft_free(y, s[0][0]), WEFT_OK);
  for (int d = 0; d < 2; d++) assert_int_equal(weft_runtime_release(rt[d]), WEFT_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_device_has_its_runtime),
      cmocka_unit_test(test_copy_between_devices_is_ordered_both_ways),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
