/* NVTX (issue 16): with an NVTX tool attached (tests/core/nvtx_inject.c through
 * NVTX_INJECTION64_PATH), weft creates its "weft" domain and marks or ranges its uses, the waits
 * it inserts (naming the streams), allocations and frees (tags and sizes); every range pushed is
 * popped. On the simulator. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tests/util/cmocka_env.h"

static const char *tool;

static void test_weft_domain_uses_waits_allocs_frees(void **state) {
  (void)state;
  assert_int_equal(setenv("NVTX_INJECTION64_PATH", tool, 1), 0); /* before weft's first NVTX call */
  tu_env_t env;
  tu_init(&env, NULL);
  weft_block_t none = {0};
  weft_block_t x = tu_alloc(&env, 1024, 0, "x"), y = tu_alloc(&env, 1024, 1, "y");
  assert_int_equal(tu_fill(&env, tu_stream(&env, 0), x, 256, 1), WEFT_OK);
  assert_int_equal(tu_combine(&env, tu_stream(&env, 1), y, none, x, none, none, 256, 2), WEFT_OK);
  assert_int_equal(weft_free(x, tu_stream(&env, 1)), WEFT_OK);
  assert_int_equal(weft_free(y, tu_stream(&env, 1)), WEFT_OK);
  void *h = dlopen(tool, RTLD_NOW | RTLD_NOLOAD);
  if (h == NULL) fail_msg("the NVTX tool was not loaded: %s", dlerror());
  const char *(*log)(void) = (const char *(*)(void))dlsym(h, "weft_test_nvtx_log");
  int (*pops)(void) = (int (*)(void))dlsym(h, "weft_test_nvtx_pops");
  assert_non_null(log);
  const char *l = log();
  const char *want[] = {"domain weft\n", "push weft_launch\n", "mark weft wait: stream 1 waits for stream 0",
                        "mark weft_alloc 'x' 1024 bytes on stream 0\n", "mark weft_free 'x' 1024 bytes on stream 1\n"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (strstr(l, want[i]) == NULL) fail_msg("no \"%s\" in what the tool saw:\n%s", want[i], l);
  int pushes = 0;
  for (const char *p = l; (p = strstr(p, "push ")) != NULL; p++) pushes++;
  assert_int_equal(pops(), pushes);
  tu_fini(&env);
}

int main(int argc, char **argv) {
  tool = argc > 1 ? argv[1] : "tests/core/libnvtx_inject.so";
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_weft_domain_uses_waits_allocs_frees)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
