/* The smallest program built against weft from another workspace: gets the runtime of device 0,
 * allocates a block on a pool stream, fills it, reads it back and checks it. Runs on a GPU, or on
 * the simulator with WEFT_DRIVER=sim. */
#include <stdio.h>

#include "weft/weft.h"

#define CHECK(call)                                                                            \
  do {                                                                                         \
    weft_status_t st_ = (call);                                                                \
    if (st_ != WEFT_OK) {                                                                      \
      fprintf(stderr, "%s failed: %s: %s\n", #call, weft_status_name(st_), weft_last_error()); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

int main(void) {
  weft_runtime_t *rt;
  CHECK(weft_runtime_get(0, NULL, &rt));
  weft_driver_info_t info;
  CHECK(weft_driver_info(&info));
  weft_stream_t *s;
  CHECK(weft_stream_get(rt, 0, &s));
  weft_block_t block;
  CHECK(weft_alloc(rt, 1 << 20, s, "consumer", &block));
  CHECK(weft_memset32(s, block, 0, 0xC0FFEEu, 1 << 20));
  unsigned back[4];
  CHECK(weft_copy_from_block(s, back, block, 4096, sizeof back));
  CHECK(weft_stream_synchronize(s));
  for (int i = 0; i < 4; i++)
    if (back[i] != 0xC0FFEEu) {
      fprintf(stderr, "read back %#x, expected 0xc0ffee\n", back[i]);
      return 1;
    }
  CHECK(weft_free(block, s));
  printf("weft %u.%u.%u from @weft//lib:weft on %s: allocated, filled and read back 1 MiB\n", weft_version() >> 16,
         (weft_version() >> 8) & 0xff, weft_version() & 0xff, info.is_simulator ? "the simulator" : "a GPU");
  CHECK(weft_runtime_release(rt));
  return 0;
}
