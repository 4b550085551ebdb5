/* A program that does not link weft loads a shared build of it the way a plugin host (Python,
 * a JNI library, an application's plugin loader) does: dlopen(RTLD_NOW | RTLD_LOCAL), with no
 * LD_PRELOAD and no GLIBC_TUNABLES. Then it calls one function the library exports and closes it.
 *   test_dlopen <path of the .so> <symbol: a function `unsigned f(void)` it exports>
 * Exits 0 when all of that works; else prints why and exits 1. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s LIBRARY.so SYMBOL\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];
  const char *symbol = argv[2];
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    printf("FAIL (a): dlopen(%s, RTLD_NOW | RTLD_LOCAL): %s\n", path, dlerror());
    return 1;
  }
  unsigned (*fn)(void) = NULL;
  *(void **)&fn = dlsym(handle, symbol); /* POSIX's way from an object pointer to a function's */
  if (fn == NULL) {
    printf("FAIL (a): %s does not export %s: %s\n", path, symbol, dlerror());
    return 1;
  }
  unsigned value = fn();
  if (dlclose(handle) != 0) {
    printf("FAIL (a): dlclose(%s): %s\n", path, dlerror());
    return 1;
  }
  printf("PASS (a): dlopen(%s, RTLD_NOW | RTLD_LOCAL), %s() = 0x%x, dlclose\n", path, symbol, value);
  return 0;
}
