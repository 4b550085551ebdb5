#include "tests/mem/mem_env.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

weft_runtime_t *rt;
weft_stream_t *s0, *s1;
const weft_sim_api_t *sim; /* NULL on a GPU */
const weft__driver_t *drv;

/* Device bytes in use on the simulator; 0 on a GPU, where cuMemGetInfo also moves with the
 * driver's own allocations and cannot prove the absence of a leak. */
uint64_t device_bytes(void) {
  if (sim == NULL) return 0;
  weft_sim_stats_t st;
  sim->stats(&st);
  return st.bytes_in_use;
}

int setup(void **state) {
  (void)state;
  weft_options_t o = weft_options_default();
  o.memory = WEFT_MEMORY_DIRECT;
  if (weft_runtime_get(0, &o, &rt) != WEFT_OK) {
    fprintf(stderr, "runtime: %s\n", weft_last_error());
    return -1;
  }
  if (weft_stream_get(rt, 0, &s0) != WEFT_OK || weft_stream_get(rt, 1, &s1) != WEFT_OK) return -1;
  if (weft__driver_get(&drv) != WEFT_OK) return -1;
  sim = weft_sim_api(weft_driver_symbol);
  if (sim == NULL)
    print_message("GPU: simulator-only checks skipped: fault injection (faulted calls must succeed instead), "
                  "device-byte leak check\n");
  return 0;
}

int teardown(void **state) {
  (void)state;
  if (sim != NULL) (sim->fail)("");
  return weft_runtime_release(rt) == WEFT_OK ? 0 : -1;
}

/* Arms the fault `spec` on the simulator and returns true; on a GPU injects nothing and returns
 * false: the call it targets must then succeed. */
bool inject(const char *spec) {
  if (sim == NULL) return false;
  assert_int_equal((sim->fail)(spec), 0);
  return true;
}

void clear_faults(void) {
  if (sim != NULL) assert_int_equal((sim->fail)(""), 0);
}
