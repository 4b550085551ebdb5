/* Shared setup of the memory tests that run on a real runtime, on the simulator or a GPU: a
 * runtime over the direct resource, two streams, and fault injection that is a no-op on a GPU. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "lib/core/driver.h"
#include "sim/weft_sim.h"
#include "weft/weft.h"

extern weft_runtime_t *rt;
extern weft_stream_t *s0, *s1;
extern const weft_sim_api_t *sim; /* NULL on a GPU */
extern const weft__driver_t *drv;

/** Device bytes in use on the simulator; 0 on a GPU, where cuMemGetInfo also moves with the
 * driver's own allocations and cannot prove the absence of a leak. */
uint64_t device_bytes(void);
/** cmocka group setup / teardown: the runtime (memory = DIRECT) and streams 0 and 1. */
int setup(void **state);
int teardown(void **state);
/** Arms the fault `spec` on the simulator and returns true; on a GPU injects nothing and returns
 * false: the call it targets must then succeed. */
bool inject(const char *spec);
void clear_faults(void);
