/* Host twins of tests/kernels/test_kernels.cu for the simulator. */
#pragma once

/** Registers the twins with the simulator when it is the loaded driver; returns 1 if it did,
 * 0 on a real GPU. */
int weft_test_kernels_register_sim(void);
