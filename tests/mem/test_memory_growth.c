/* Growth and trim on a small device (the simulator with WEFT_SIM_MEMORY=48M, see BUILD), each a
 * bug of issue 12 that failed on commit fb3bb08:
 *   - the default 64 MiB chunk does not fit: a 4 KiB allocation must still succeed (the pool falls
 *     back to smaller chunks);
 *   - after 40 MiB were freed and the top resource trimmed, the memory must be back with the
 *     driver: a graph that allocates 40 MiB instantiates and runs;
 *   - an allocation that cannot be served says how much was asked, reserved and free.
 * Simulator only (the device size is the simulator's). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/cmocka_env.h"

static tu_env_t env;

static int setup(void **state) {
  (void)state;
  return tu_init(&env, NULL);
}
static int teardown(void **state) {
  (void)state;
  tu_fini(&env);
  return 0;
}
static void test_small_device_still_serves_small_blocks(void **state) {
  (void)state;
  if (env.sim == NULL) skip();
  weft_block_t b;
  weft_status_t st = weft_alloc(env.rt, 4096, tu_stream(&env, 0), "small", &b);
  if (st != WEFT_OK) fail_msg("weft_alloc(4 KiB): %s: %s", weft_status_name(st), weft_last_error());
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), b, 1024, 7), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
}

static weft_status_t graph_body(weft_stream_t *s, void *arg) {
  weft_block_t t;
  weft_status_t st = weft_alloc(env.rt, 40u << 20, s, "graph temporary", &t);
  if (st == WEFT_OK) st = tu_fill(&env, s, t, 1024, 1);
  if (st == WEFT_OK) st = weft_free(t, s);
  (void)arg;
  return st;
}

static void test_trim_gives_memory_back_to_the_driver(void **state) {
  (void)state;
  if (env.sim == NULL) skip();
  weft_block_t b;
  assert_int_equal(weft_alloc(env.rt, 40u << 20, tu_stream(&env, 0), "big", &b), WEFT_OK);
  assert_int_equal(weft_free(b, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(weft_runtime_trim(env.rt), WEFT_OK); /* the stream's cached block too */
  weft_graph_t *g;
  assert_int_equal(weft_capture_run(tu_stream(&env, 0), NULL, graph_body, NULL, &g), WEFT_OK);
  weft_exec_t *e;
  weft_status_t st = weft_graph_instantiate(g, tu_stream(&env, 0), &e);
  if (st != WEFT_OK) fail_msg("weft_graph_instantiate: %s: %s", weft_status_name(st), weft_last_error());
  assert_int_equal(weft_exec_launch(e, tu_stream(&env, 0)), WEFT_OK);
  assert_int_equal(weft_runtime_synchronize(env.rt), WEFT_OK);
  assert_int_equal(weft_exec_destroy(e), WEFT_OK);
  assert_int_equal(weft_graph_destroy(g), WEFT_OK);
  assert_int_equal(weft_graph_memory_trim(env.rt), WEFT_OK);
}

static void test_out_of_memory_says_the_sizes(void **state) {
  (void)state;
  if (env.sim == NULL) skip();
  weft_block_t b;
  assert_int_equal(weft_alloc(env.rt, 100u << 20, tu_stream(&env, 0), "too big", &b), WEFT_ERR_OUT_OF_MEMORY);
  const char *m = weft_last_error();
  if (strstr(m, "104857600 bytes") == NULL || strstr(m, "reserved") == NULL || strstr(m, "largest free range") == NULL)
    fail_msg("the message does not give the sizes: %s", m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_device_still_serves_small_blocks),
      cmocka_unit_test(test_trim_gives_memory_back_to_the_driver),
      cmocka_unit_test(test_out_of_memory_says_the_sizes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
