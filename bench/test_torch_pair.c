/* libtorch_pair.so (bench/torch_pair.c) on the simulator, where PyTorch is absent: the adapter's
 * pair and weft_alloc + weft_free's are timed on the legacy stream and on a stream of the
 * program's, every repeat a positive number of ns; PyTorch's allocator (bit 2) is skipped with a
 * reason, not timed; bad arguments are refused. The GPU run (tools/run_torch_gpu.sh) times all
 * three under PyTorch.
 *   test_torch_pair <libtorch_pair.so> <libweft_torch.so> */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <cuda.h>

static const char *bench_so, *weft_so;
typedef int (*run_fn)(const char *, const char *, int, void *, const size_t *, int, int, int, int, double *, int);
static run_fn run;
static const char *(*last_error)(void);

static void load(void) {
  if (run != NULL) return;
  void *h = dlopen(bench_so, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) fail_msg("dlopen(%s): %s", bench_so, dlerror());
  *(void **)&run = dlsym(h, "torch_pair_run");
  *(void **)&last_error = dlsym(h, "torch_pair_last_error");
  assert_non_null(run);
  assert_non_null(last_error);
}

/* Both weft contenders on `stream`: every repeat timed; PyTorch asked for too and skipped. */
static void time_on(void *stream) {
  enum { REPEATS = 3 };
  const size_t sizes[] = {512, 1 << 20};
  double out[3 * REPEATS];
  int rc = run(weft_so, "/nonexistent/libc10_cuda.so", 0, stream, sizes, 2, 200, REPEATS, 7, out, 3 * REPEATS);
  assert_int_equal(rc, 5); /* the adapter and weft_alloc; PyTorch could not be loaded */
  assert_true(strstr(last_error(), "libc10_cuda.so") != NULL); /* why PyTorch was skipped */
  for (int r = 0; r < REPEATS; r++) {
    assert_true(out[3 * r] > 0 && isfinite(out[3 * r]));         /* the adapter */
    assert_true(isnan(out[3 * r + 1]));                          /* PyTorch: not timed */
    assert_true(out[3 * r + 2] > 0 && isfinite(out[3 * r + 2])); /* weft_alloc + weft_free */
  }
}

static void test_the_legacy_stream(void **state) {
  (void)state;
  load();
  time_on(NULL);
}

static void test_a_stream_of_the_program(void **state) {
  (void)state;
  load();
  /* The driver weft loaded (the simulator), through weft.h's weft_driver_symbol of the library. */
  void *w = dlopen(weft_so, RTLD_NOW | RTLD_NOLOAD);
  assert_non_null(w);
  void *(*sym)(const char *) = (void *(*)(const char *))dlsym(w, "weft_driver_symbol");
  assert_non_null(sym);
  typedef CUresult (*create_fn)(CUstream *, unsigned, int);
  create_fn create = (create_fn)sym("cuStreamCreateWithPriority");
  assert_non_null(create);
  CUstream s;
  assert_int_equal(create(&s, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  time_on(s);
}

static void test_bad_arguments_are_refused(void **state) {
  (void)state;
  load();
  const size_t sizes[] = {1 << 20}, zero[] = {0};
  double out[6];
  assert_int_equal(run(weft_so, NULL, 0, NULL, sizes, 1, 10, 2, 5, out, 5), -1); /* out too short */
  assert_int_equal(run(weft_so, NULL, 0, NULL, sizes, 1, 10, 2, 8, out, 6), -1); /* no such allocator */
  assert_int_equal(run(weft_so, NULL, 0, NULL, zero, 1, 10, 2, 5, out, 6), -1);  /* size 0 */
  assert_int_equal(run("/nonexistent/libweft_torch.so", NULL, 0, NULL, sizes, 1, 10, 2, 5, out, 6), 0);
  assert_true(strstr(last_error(), "dlopen") != NULL);
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  bench_so = argv[1];
  weft_so = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_legacy_stream),
      cmocka_unit_test(test_a_stream_of_the_program),
      cmocka_unit_test(test_bad_arguments_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
