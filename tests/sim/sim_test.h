/* Helpers shared by the simulator's unit tests: driver setup, a few kernel twins, and checks.
 *
 * The tests link the simulator (//sim:sim_impl) directly and call cu* and weft_sim_get_api()
 * without loading a driver. Kernels (all take 32-bit element counts):
 *   sim_test_fill(unsigned *dst, unsigned n, unsigned value)      writes dst[0..n)
 *   sim_test_copy(unsigned *dst, const unsigned *src, unsigned n)  reads src, writes dst
 *   sim_test_add(unsigned *dst, const unsigned *src, unsigned n)   reads src, read-writes dst
 */
#ifndef WEFT_TESTS_SIM_TEST_H
#define WEFT_TESTS_SIM_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <cuda.h>

#include "sim/weft_sim.h"

/* cuInit, primary context current on this thread, kernels registered; returns the API. */
const weft_sim_api_t *sim_test_init(void);
/* Makes the primary context current on the calling thread (for tests' own threads). */
void sim_test_thread_init(void);
CUfunction sim_test_kernel(const char *name);
CUstream sim_test_stream(void); /* a new non-blocking stream */
/* Launches a 1-D kernel of the three above on s (dst, src may be 0 for fill). */
CUresult sim_test_fill(CUstream s, CUdeviceptr dst, unsigned n, unsigned value);
CUresult sim_test_copy(CUstream s, CUdeviceptr dst, CUdeviceptr src, unsigned n);
CUresult sim_test_add(CUstream s, CUdeviceptr dst, CUdeviceptr src, unsigned n);
/* Reads element i of a device array (synchronous copy). */
unsigned sim_test_read(CUdeviceptr p, unsigned i);

#define CU_OK(expr) assert_int_equal((int)(expr), (int)CUDA_SUCCESS)
#define CU_IS(code, expr) assert_int_equal((int)(expr), (int)(code))

#endif
