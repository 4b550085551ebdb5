/* A program that does not link weft: it loads libweft.so with a plain dlopen (RTLD_NOW |
 * RTLD_LOCAL, no LD_PRELOAD, no GLIBC_TUNABLES), calls weft_version, checks that weft's internals
 * are not exported, closes it and prints one line. What a plugin host or a language binding does.
 *   dlopen PREFIX/lib/libweft.so          (default: "libweft.so" on the library search path)
 * weft.h is included for WEFT_VERSION only (the version this program was compiled against). */
#include <dlfcn.h>
#include <stdio.h>

#include "weft/weft.h"

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "libweft.so";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  unsigned (*version)(void);
  *(void **)&version = dlsym(lib, "weft_version");
  if (version == NULL) {
    fprintf(stderr, "dlopen: %s has no weft_version: %s\n", path, dlerror());
    return 1;
  }
  unsigned v = version();
  if (v != WEFT_VERSION) {
    fprintf(stderr, "dlopen: %s is weft %#x, weft.h says %#x\n", path, v, WEFT_VERSION);
    return 1;
  }
  /* Only the weft_* API is exported (lib/shared's version script): no internals. */
  const char *hidden[] = {"weft__driver_load", "weft__error"};
  for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
    if (dlsym(lib, hidden[i]) != NULL) {
      fprintf(stderr, "dlopen: %s exports %s\n", path, hidden[i]);
      return 1;
    }
  if (dlclose(lib) != 0) {
    fprintf(stderr, "dlopen: dlclose: %s\n", dlerror());
    return 1;
  }
  printf("dlopen: %s: weft_version() = %u.%u.%u\n", path, v >> 16, (v >> 8) & 0xffu, v & 0xffu);
  return 0;
}
