/* A program built against an installed weft (tools/install.sh PREFIX), by make with
 * `pkg-config --cflags --libs weft` (the Makefile here) or by CMake with find_package(weft)
 * (examples/cmake_consumer, which builds this file with NAME="cmake_consumer"): gets the runtime of device 0, allocates 1 MiB on a pool
 * stream, fills it with weft_memset32 there, reads it back with weft_copy_from_block on a second
 * pool stream (weft makes that stream wait for the fill), checks every word, frees the block,
 * releases the runtime and prints one line. Exits non-zero on any failure. Runs on a GPU, or on
 * the simulator with WEFT_DRIVER=sim and libweft_sim.so on the library path
 * (LD_LIBRARY_PATH=PREFIX/lib). */
#include <stdio.h>

#include "weft/weft.h"

#ifndef NAME
#define NAME "make_consumer"
#endif
#define BYTES (1u << 20)
#define WORDS (BYTES / sizeof(unsigned))

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    weft_status_t st_ = (call);                                                                       \
    if (st_ != WEFT_OK) {                                                                             \
      fprintf(stderr, NAME ": %s failed: %s: %s\n", #call, weft_status_name(st_), weft_last_error()); \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)

static unsigned host[WORDS];

int main(void) {
  if (weft_version() != WEFT_VERSION) {
    fprintf(stderr, NAME ": weft.h is version %#x, the library %#x\n", WEFT_VERSION, weft_version());
    return 1;
  }
  weft_runtime_t *rt;
  CHECK(weft_runtime_get(0, NULL, &rt));
  weft_driver_info_t info;
  CHECK(weft_driver_info(&info));
  weft_stream_t *fill, *read;
  CHECK(weft_stream_get(rt, 0, &fill));
  CHECK(weft_stream_get(rt, 1, &read));

  weft_block_t block;
  CHECK(weft_alloc(rt, BYTES, fill, NAME, &block));
  CHECK(weft_memset32(fill, block, 0, 0xC0FFEEu, BYTES));
  CHECK(weft_memset32(fill, block, 4096, 0x5EEDu, 4096));
  CHECK(weft_copy_from_block(read, host, block, 0, BYTES)); /* waits for the fills */
  CHECK(weft_free(block, read));
  CHECK(weft_stream_synchronize(read));

  size_t bad = 0;
  for (size_t i = 0; i < WORDS; i++) {
    unsigned want = i >= 4096 / sizeof(unsigned) && i < 8192 / sizeof(unsigned) ? 0x5EEDu : 0xC0FFEEu;
    if (host[i] != want && bad++ == 0) fprintf(stderr, NAME ": word %zu is %#x, expected %#x\n", i, host[i], want);
  }
  weft_counters_t c;
  CHECK(weft_runtime_counters(rt, &c));
  CHECK(weft_runtime_release(rt));
  if (bad != 0) {
    fprintf(stderr, NAME ": %zu of %zu words wrong\n", bad, (size_t)WORDS);
    return 1;
  }
  if (c.waits_issued == 0) {
    fprintf(stderr, NAME ": the read-back on stream 1 did not wait for the fill on stream 0\n");
    return 1;
  }
  printf(NAME ": weft %u.%u.%u on %s: filled 1 MiB on stream 0, read it back on stream 1 (%llu wait), all correct\n",
         weft_version() >> 16, (weft_version() >> 8) & 0xffu, weft_version() & 0xffu,
         info.is_simulator ? "the simulator" : "a GPU", (unsigned long long)c.waits_issued);
  return 0;
}
