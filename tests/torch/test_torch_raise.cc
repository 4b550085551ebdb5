// A failed allocation inside PyTorch (weft_torch.h): PyTorch's CUDAPluggableAllocator does not
// check what alloc returns, so libweft_torch.so throws a C++ std::runtime_error with weft's
// message through the caller's C++ frames instead of returning NULL. This program plays PyTorch's
// part: C++ (libstdc++ loaded), a library with soname libc10.so loaded (c10_stub), the adapter
// dlopened and called through a function pointer as CUDAPluggableAllocator calls it. Checks: the
// impossible allocation throws std::runtime_error naming weft's reason; nothing changed (later
// allocations and frees work, no byte left live); a 0-byte request still gives NULL without
// throwing. With WEFT_TEST_NO_C10=1 it does not load the stub: the failure must be NULL there, as
// for a C program. On the simulator (WEFT_DRIVER=sim) or a GPU (paths from WEFT_TORCH_LIB and
// WEFT_C10_STUB when not given as arguments). Exits 0 when every check holds.
#include <dlfcn.h>
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include <cuda.h>

static int failures = 0;
static void check(bool ok, const std::string &what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) failures++;
}

static uint64_t stat_of(int (*stats)(int, char *, size_t), const char *key) {
  char buf[4096], pat[64];
  if (stats(0, buf, sizeof buf) <= 0) return UINT64_MAX;
  std::snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *at = std::strstr(buf, pat);
  return at != nullptr ? std::strtoull(at + std::strlen(pat), nullptr, 10) : UINT64_MAX;
}

int main(int argc, char **argv) {
  const char *lib_path = argc > 1 ? argv[1] : std::getenv("WEFT_TORCH_LIB");
  const char *stub_path = argc > 2 ? argv[2] : std::getenv("WEFT_C10_STUB");
  const char *no_c10 = std::getenv("WEFT_TEST_NO_C10");
  bool c10 = !(no_c10 != nullptr && no_c10[0] == '1');
  if (lib_path == nullptr || (c10 && stub_path == nullptr)) {
    std::fprintf(stderr, "usage: test_torch_raise libweft_torch.so libc10_stub.so (or WEFT_TORCH_LIB, WEFT_C10_STUB)\n");
    return 2;
  }
  if (c10 && dlopen(stub_path, RTLD_NOW | RTLD_LOCAL) == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", stub_path, dlerror());
    return 2;
  }
  void *lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", lib_path, dlerror());
    return 2;
  }
  auto alloc = reinterpret_cast<void *(*)(ssize_t, int, CUstream)>(dlsym(lib, "weft_torch_alloc"));
  auto release = reinterpret_cast<void (*)(void *, ssize_t, int, CUstream)>(dlsym(lib, "weft_torch_free"));
  auto stats = reinterpret_cast<int (*)(int, char *, size_t)>(dlsym(lib, "weft_torch_stats"));
  if (alloc == nullptr || release == nullptr || stats == nullptr) return 2;
  void *warm = alloc(4096, 0, nullptr); // the runtime exists
  check(warm != nullptr, "a first allocation");
  release(warm, 4096, 0, nullptr);
  uint64_t live0 = stat_of(stats, "live_bytes"), failed0 = stat_of(stats, "alloc_failures");
  const ssize_t huge = (ssize_t)1 << 46; // 64 TiB: more than any device holds (an out-of-memory, not a refused size)
  bool threw = false;
  std::string what;
  void *p = nullptr;
  try {
    p = alloc(huge, 0, nullptr);
  } catch (const std::runtime_error &e) {
    threw = true;
    what = e.what();
  }
  if (c10) {
    check(threw, "an impossible allocation throws std::runtime_error inside PyTorch");
    check(what.find("weft_torch: weft_alloc") != std::string::npos &&
              (what.find("out of memory") != std::string::npos || what.find("larger than") != std::string::npos),
          "the exception names weft's reason: " + what);
  } else {
    check(!threw && p == nullptr, "an impossible allocation gives NULL where PyTorch is not loaded");
  }
  check(stat_of(stats, "alloc_failures") == failed0 + 1, "the failure is counted");
  bool zero_threw = false;
  void *z = nullptr;
  try {
    z = alloc(0, 0, nullptr);
  } catch (...) {
    zero_threw = true;
  }
  check(!zero_threw && z == nullptr, "a 0-byte request gives NULL without an exception");
  void *q = alloc(1 << 20, 0, nullptr);
  check(q != nullptr, "allocations work after the failure");
  release(q, 1 << 20, 0, nullptr);
  check(stat_of(stats, "live_bytes") == live0, "no byte left live");
  std::printf("%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
