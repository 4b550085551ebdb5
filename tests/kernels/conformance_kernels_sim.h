/* Host twins of tests/kernels/conformance_kernels.cu for the simulator. */
#ifndef WEFT_TESTS_KERNELS_CONFORMANCE_KERNELS_SIM_H
#define WEFT_TESTS_KERNELS_CONFORMANCE_KERNELS_SIM_H

#include "sim/weft_sim.h"

/** Registers weft_conf_fill and weft_conf_copy with the simulator; 0 on success. */
int weft_conf_register_sim_kernels(const weft_sim_api_t *api);

#endif
