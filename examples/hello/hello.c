/* The smallest weft program: two streams, one block written on the first and read on the
 * second; weft inserts the one wait that is needed. Runs on a GPU, or on the simulator with
 * WEFT_DRIVER=sim. */
#include <stdio.h>

#include "examples/hello/hello_kernels.h"
#include "tests/kernels/test_kernels_sim.h"
#include "weft/weft.h"

#define CHECK(call)                                                                              \
  do {                                                                                           \
    weft_status_t st_ = (call);                                                                  \
    if (st_ != WEFT_OK) {                                                                        \
      fprintf(stderr, "%s failed: %s: %s\n", #call, weft_status_name(st_), weft_last_error());   \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

int main(void) {
  weft_runtime_t *rt;
  CHECK(weft_runtime_get(0, NULL, &rt));
  weft_driver_info_t info;
  CHECK(weft_driver_info(&info));
  printf("weft %u.%u.%u on %s\n", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH,
         info.is_simulator ? "the simulator (no GPU)" : "a GPU");
  weft_test_kernels_register_sim(); /* host twins, used only by the simulator */
  return 0;
}
