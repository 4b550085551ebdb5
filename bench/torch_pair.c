/* libtorch_pair.so: host time of one alloc + free pair made the way PyTorch makes them, through
 * (A) weft's CUDAPluggableAllocator adapter (weft_torch_alloc / weft_torch_free from
 * libweft_torch.so), (B) PyTorch's own caching allocator (raw_alloc_with_stream / raw_delete) and
 * (C) weft without the adapter: weft_alloc + weft_block_ptr + weft_free (weft.h, the same
 * library's exports) on the same stream, adopted by the same runtime (issue 17's goal names this
 * pair), in the same process and run. Driven by bench/torch_pair.py (ctypes) after `import torch`
 * has loaded libc10_cuda.so and initialised its allocator; nothing here links weft or torch
 * (weft.h gives the types only).
 *
 * How (B) is reached. c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size_t, cudaStream_t)
 * and raw_delete(void *) are tried first as exported functions (dlsym, RTLD_DEFAULT, then the
 * already loaded libc10_cuda.so with RTLD_NOLOAD). In PyTorch 2.x they are inline in
 * CUDACachingAllocator.h (`return get()->raw_alloc_with_stream(n, s);` with get() =
 * allocator.load()) and are not exported (2.11: only `allocator` is, in .dynsym). Then this file
 * does what the inline function does: it loads the exported std::atomic<CUDAAllocator *>
 * `c10::cuda::CUDACachingAllocator::allocator` and makes the virtual call itself. The vtable slots
 * are found, not assumed: the library's .symtab (present in PyTorch's wheels) names the methods
 * `...CUDACachingAllocator::<ns>::<class>::raw_alloc_with_stream(unsigned long, CUstream_st *)`
 * and `...::raw_delete(void *)`; their load addresses are looked up in the allocator object's
 * vtable (bounded by its _ZTV symbol), whose class is reported (normally
 * Native::NativeCachingAllocator; CudaMallocAsync::CudaMallocAsyncAllocator with
 * PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync). The call is then, per alloc and per free:
 * atomic load of `allocator`, load of the vptr, load of the slot, indirect call with `this` first
 * (the Itanium C++ ABI), the same instructions PyTorch's inline wrapper compiles to.
 *
 * Timing: for each repeat, each allocator in turn (weft, torch, weft, torch, ...): WARMUP pairs
 * untimed, then `pairs` rounds of the size list, each size allocated on `stream` and freed at once
 * (the free names the allocation stream, as PyTorch's do), CLOCK_MONOTONIC around the rounds. Both
 * allocators are called through the same pointer-to-wrapper indirection, so the harness costs both
 * the same. Host time only: no kernels, no synchronisation. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr1, RTLD_DEFAULT */
#endif
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "weft/weft.h"

#define TP_API __attribute__((visibility("default")))

#define WARMUP 384 /* untimed pairs before each timed loop */

#define C10_NS "_ZN3c104cuda20CUDACachingAllocator"
#define SYM_ALLOC C10_NS "21raw_alloc_with_streamEmP11CUstream_st"
#define SYM_DELETE C10_NS "10raw_deleteEPv"
#define SYM_ALLOCATOR C10_NS "9allocatorE"
#define SUFFIX_ALLOC "21raw_alloc_with_streamEmP11CUstream_st"
#define SUFFIX_DELETE "10raw_deleteEPv"

static char last_error[1024];
static char torch_how[512];

/* Records (and prints to stderr) why something failed; the message stays for
 * torch_pair_last_error(). Several messages of one run are joined with "; ". */
static void fail(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "torch_pair: %s\n", msg);
  size_t used = strlen(last_error);
  snprintf(last_error + used, sizeof last_error - used, "%s%s", used ? "; " : "", msg);
}

/* ---- (A) weft ---------------------------------------------------------------------------- */

static void *(*weft_alloc_fn)(ssize_t, int, void *);
static void (*weft_free_fn)(void *, ssize_t, int, void *);
static const char *(*weft_error_fn)(void);

/* dlopens libweft_torch.so (kept open: weft's runtime lives in it) and finds the adapter. */
static int load_weft(const char *path) {
  if (!path || !*path) {
    fail("weft: no library path given");
    return -1;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fail("weft: dlopen(%s): %s", path, dlerror());
    return -1;
  }
  *(void **)&weft_alloc_fn = dlsym(h, "weft_torch_alloc");
  *(void **)&weft_free_fn = dlsym(h, "weft_torch_free");
  *(void **)&weft_error_fn = dlsym(h, "weft_torch_last_error");
  if (!weft_alloc_fn || !weft_free_fn) {
    fail("weft: %s lacks weft_torch_alloc / weft_torch_free", path);
    return -1;
  }
  return 0;
}

/* ---- (C) weft without the adapter ----------------------------------------------------------- */

static weft_status_t (*w_runtime_get)(int, const weft_options_t *, weft_runtime_t **);
static weft_status_t (*w_stream_adopt)(weft_runtime_t *, CUstream, weft_stream_t **);
static weft_status_t (*w_alloc)(weft_runtime_t *, size_t, weft_stream_t *, const char *, weft_block_t *);
static weft_status_t (*w_free)(weft_block_t, weft_stream_t *);
static weft_status_t (*w_block_ptr)(weft_block_t, CUdeviceptr *);
static const char *(*w_last_error)(void);
static weft_runtime_t *w_rt;
static weft_stream_t *w_stream;
static weft_block_t w_block; /* the block of the pair under way (each pair frees it at once) */
static int w_free_failed;    /* a weft_free failed: its loop's figure is NAN */
/* (w_rt stays retained for the process: the adapter's runtime lives as long anyway.) */

/* After load_weft: the weft.h calls of the same library, the adapter's runtime of `device` (made
 * by one adapter pair first, with the adapter's options) and `stream` adopted there (the adapter's
 * weft stream: adopting a handle again gives the same one). */
static int load_direct(const char *path, int device, void *stream) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) {
    fail("weft_alloc: %s is not loaded", path);
    return -1;
  }
  *(void **)&w_runtime_get = dlsym(h, "weft_runtime_get");
  *(void **)&w_stream_adopt = dlsym(h, "weft_stream_adopt");
  *(void **)&w_alloc = dlsym(h, "weft_alloc");
  *(void **)&w_free = dlsym(h, "weft_free");
  *(void **)&w_block_ptr = dlsym(h, "weft_block_ptr");
  *(void **)&w_last_error = dlsym(h, "weft_last_error");
  dlclose(h); /* (NOLOAD: load_weft's reference keeps it) */
  if (!w_runtime_get || !w_stream_adopt || !w_alloc || !w_free || !w_block_ptr || !w_last_error) {
    fail("weft_alloc: %s lacks weft.h's exports", path);
    return -1;
  }
  void *p = weft_alloc_fn(256, device, stream);
  if (!p) {
    fail("weft_alloc: the adapter's first pair failed: %s", weft_error_fn ? weft_error_fn() : "");
    return -1;
  }
  weft_free_fn(p, 256, device, stream);
  weft_status_t st;
  if (w_rt == NULL && (st = w_runtime_get(device, NULL, &w_rt)) != WEFT_OK) {
    fail("weft_alloc: weft_runtime_get(%d): %s", device, w_last_error());
    return -1;
  }
  if ((st = w_stream_adopt(w_rt, (CUstream)stream, &w_stream)) != WEFT_OK) {
    fail("weft_alloc: weft_stream_adopt: %s", w_last_error());
    return -1;
  }
  return 0;
}

/* ---- (B) PyTorch's caching allocator -------------------------------------------------------- */

static void *(*c10_alloc_fn)(size_t, void *); /* exported free functions, when they exist */
static void (*c10_delete_fn)(void *);
static void *volatile *c10_allocator;         /* &allocator: std::atomic<CUDAAllocator *> */
static size_t slot_alloc, slot_delete;        /* vtable indices of the two methods */

typedef void *(*vt_alloc_t)(void *self, size_t n, void *stream);
typedef void (*vt_delete_t)(void *self, void *ptr);

/* What raw_alloc_with_stream / raw_delete compile to: allocator.load()->method(...). */
static void *c10_virtual_alloc(size_t n, void *stream) {
  void *self = __atomic_load_n(c10_allocator, __ATOMIC_SEQ_CST);
  vt_alloc_t f;
  *(void **)&f = (*(void ***)self)[slot_alloc];
  return f(self, n, stream);
}
static void c10_virtual_delete(void *ptr) {
  void *self = __atomic_load_n(c10_allocator, __ATOMIC_SEQ_CST);
  vt_delete_t f;
  *(void **)&f = (*(void ***)self)[slot_delete];
  f(self, ptr);
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && memcmp(s + a - b, suffix, b) == 0;
}

/* Finds the vtable slots of raw_alloc_with_stream / raw_delete for the object `allocator` points
 * to, from the .symtab of `file` (loaded at `base`). 0, or -1 with the reason recorded. */
static int find_slots(const char *file, uintptr_t base) {
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    fail("torch: cannot read %s for its symbol table", file);
    if (fd >= 0) close(fd);
    return -1;
  }
  const unsigned char *img = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (img == MAP_FAILED) {
    fail("torch: cannot map %s", file);
    return -1;
  }
  int rc = -1;
  const Elf64_Ehdr *eh = (const void *)img;
  if ((size_t)st.st_size < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
      eh->e_ident[EI_CLASS] != ELFCLASS64) {
    fail("torch: %s is not a 64-bit ELF file", file);
    goto out;
  }
  if (eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > (uint64_t)st.st_size) {
    fail("torch: %s: section headers out of the file", file);
    goto out;
  }
  const Elf64_Shdr *sh = (const void *)(img + eh->e_shoff);
  const Elf64_Shdr *symtab = NULL;
  for (int i = 0; i < eh->e_shnum; i++)
    if (sh[i].sh_type == SHT_SYMTAB) symtab = &sh[i];
  if (!symtab) {
    fail("torch: %s has no .symtab (stripped): cannot find the allocator's vtable slots", file);
    goto out;
  }
  const Elf64_Sym *sym = (const void *)(img + symtab->sh_offset);
  const char *names = (const char *)(img + sh[symtab->sh_link].sh_offset);
  size_t nsym = symtab->sh_size / sizeof *sym;

  void *self = __atomic_load_n(c10_allocator, __ATOMIC_SEQ_CST);
  if (!self) {
    fail("torch: c10::cuda::CUDACachingAllocator::allocator is NULL (CUDA not initialised?)");
    goto out;
  }
  uintptr_t vptr = (uintptr_t)*(void **)self;
  /* The vtable: the _ZTV object holding vptr (the address points past offset-to-top and RTTI). */
  const char *vt_name = NULL;
  uintptr_t vt_end = 0;
  for (size_t i = 0; i < nsym; i++) {
    const char *n = names + sym[i].st_name;
    if (ELF64_ST_TYPE(sym[i].st_info) != STT_OBJECT || strncmp(n, "_ZTV", 4) != 0) continue;
    uintptr_t lo = base + sym[i].st_value;
    if (vptr > lo && vptr < lo + sym[i].st_size) {
      vt_name = n;
      vt_end = lo + sym[i].st_size;
      break;
    }
  }
  if (!vt_name) {
    Dl_info di;
    int known = dladdr((void *)vptr, &di) && di.dli_fname;
    fail("torch: the current CUDA allocator's vtable (%#lx, in %s) is not one of %s's: was "
         "PyTorch's allocator changed?",
         (unsigned long)vptr, known ? di.dli_fname : "?", file);
    goto out;
  }
  size_t n_slots = (vt_end - vptr) / sizeof(void *);
  const uintptr_t *vt = (const uintptr_t *)vptr;
  int found_alloc = 0, found_delete = 0;
  for (size_t i = 0; i < nsym && !(found_alloc && found_delete); i++) {
    const char *n = names + sym[i].st_name;
    if (ELF64_ST_TYPE(sym[i].st_info) != STT_FUNC || sym[i].st_value == 0 ||
        strncmp(n, C10_NS, strlen(C10_NS)) != 0)
      continue;
    int is_alloc = ends_with(n, SUFFIX_ALLOC), is_delete = ends_with(n, SUFFIX_DELETE);
    if (!is_alloc && !is_delete) continue;
    uintptr_t addr = base + sym[i].st_value;
    for (size_t k = 0; k < n_slots; k++) {
      if (vt[k] != addr) continue;
      if (is_alloc) slot_alloc = k, found_alloc = 1;
      else slot_delete = k, found_delete = 1;
      break;
    }
  }
  if (!found_alloc || !found_delete) {
    fail("torch: %s's vtable (%s) has no %s%s%s", file, vt_name, found_alloc ? "" : "raw_alloc_with_stream",
         found_alloc || found_delete ? "" : " nor ", found_delete ? "" : "raw_delete");
    goto out;
  }
  snprintf(torch_how, sizeof torch_how, "virtual call through c10::cuda::CUDACachingAllocator::allocator "
           "(vtable %s, slots %zu and %zu, from %s's .symtab)", vt_name, slot_alloc, slot_delete, file);
  rc = 0;
out:
  munmap((void *)img, (size_t)st.st_size);
  return rc;
}

/* Finds PyTorch's pair: exported functions, else the virtual call. c10_so: the path of
 * libc10_cuda.so (already loaded by `import torch`), or NULL to try its soname. */
static int load_torch(const char *c10_so) {
  c10_alloc_fn = NULL;
  c10_delete_fn = NULL;
  c10_allocator = NULL;
  torch_how[0] = 0;
  const char *name = c10_so && *c10_so ? c10_so : "libc10_cuda.so";
  void *lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD); /* NULL when not loaded: never loads it */
  /* Where to look: the global scope (RTLD_DEFAULT), then libc10_cuda.so itself (torch loads its
   * libraries RTLD_LOCAL, so they are usually not in the global scope). */
  void *scopes[2] = {RTLD_DEFAULT, lib};
  int n_scopes = lib ? 2 : 1;
  for (int i = 0; i < n_scopes && !(c10_alloc_fn && c10_delete_fn); i++) {
    *(void **)&c10_alloc_fn = dlsym(scopes[i], SYM_ALLOC);
    *(void **)&c10_delete_fn = dlsym(scopes[i], SYM_DELETE);
  }
  if (c10_alloc_fn && c10_delete_fn) {
    snprintf(torch_how, sizeof torch_how, "exported functions raw_alloc_with_stream / raw_delete");
    return 0;
  }
  c10_alloc_fn = NULL;
  c10_delete_fn = NULL;
  for (int i = 0; i < n_scopes && !c10_allocator; i++) *(void **)&c10_allocator = dlsym(scopes[i], SYM_ALLOCATOR);
  if (!c10_allocator) {
    fail("torch: %s and %s not found (nor %s), in the process or in %s%s: is torch imported and its "
         "CUDA initialised?",
         SYM_ALLOC, SYM_DELETE, SYM_ALLOCATOR, name, lib ? "" : " (not loaded)");
    return -1;
  }
  struct link_map *lm = NULL;
  Dl_info di;
  if (!dladdr1((void *)c10_allocator, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm || !di.dli_fname) {
    fail("torch: cannot tell which library defines %s", SYM_ALLOCATOR);
    return -1;
  }
  return find_slots(di.dli_fname, (uintptr_t)lm->l_addr);
}

/* ---- the timed loop --------------------------------------------------------------------------- */

/* One allocator as the loop sees it: both go through these pointers alike. */
typedef struct ops {
  const char *name;
  void *(*alloc)(size_t n, int device, void *stream);
  void (*free)(void *p, size_t n, int device, void *stream);
  const char *(*error)(void); /* why an allocation failed, if the allocator says */
} ops_t;

static void *weft_op_alloc(size_t n, int device, void *stream) { return weft_alloc_fn((ssize_t)n, device, stream); }
static void weft_op_free(void *p, size_t n, int device, void *stream) { weft_free_fn(p, (ssize_t)n, device, stream); }
static void *torch_op_alloc(size_t n, int device, void *stream) {
  (void)device;
  return c10_alloc_fn ? c10_alloc_fn(n, stream) : c10_virtual_alloc(n, stream);
}
static void torch_op_free(void *p, size_t n, int device, void *stream) {
  (void)n, (void)device, (void)stream;
  if (c10_delete_fn) c10_delete_fn(p);
  else c10_virtual_delete(p);
}

static void *direct_op_alloc(size_t n, int device, void *stream) {
  (void)device, (void)stream;
  CUdeviceptr p = 0;
  if (w_alloc(w_rt, n, w_stream, "torch", &w_block) != WEFT_OK) return NULL;
  (void)w_block_ptr(w_block, &p);
  return (void *)(uintptr_t)p;
}
static void direct_op_free(void *p, size_t n, int device, void *stream) {
  (void)p, (void)n, (void)device, (void)stream;
  if (w_free(w_block, w_stream) != WEFT_OK && !w_free_failed) { /* the timings then say nothing */
    fail("weft_alloc: weft_free: %s", w_last_error());
    w_free_failed = 1;
  }
}

static const char *weft_op_error(void) { return weft_error_fn ? weft_error_fn() : ""; }
static const char *torch_op_error(void) { return "raw_alloc_with_stream returned NULL"; }
static const char *direct_op_error(void) { return w_last_error ? w_last_error() : ""; }

enum { N_OPS = 3 };
static const ops_t all_ops[N_OPS] = {{"weft", weft_op_alloc, weft_op_free, weft_op_error},
                                     {"torch", torch_op_alloc, torch_op_free, torch_op_error},
                                     {"weft_alloc", direct_op_alloc, direct_op_free, direct_op_error}};

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* WARMUP untimed pairs, then the timed rounds; ns per pair, or NAN after a failed allocation. */
static double time_pairs(const ops_t *o, int device, void *stream, const size_t *sizes, int n_sizes, int pairs) {
  for (int i = 0; i < WARMUP; i++) {
    size_t n = sizes[i % n_sizes];
    void *p = o->alloc(n, device, stream);
    if (!p) {
      fail("%s: allocation of %zu bytes failed: %s", o->name, n, o->error());
      return NAN;
    }
    o->free(p, n, device, stream);
  }
  double t0 = now_ns();
  for (int r = 0; r < pairs; r++)
    for (int i = 0; i < n_sizes; i++) {
      void *p = o->alloc(sizes[i], device, stream);
      if (__builtin_expect(!p, 0)) {
        fail("%s: allocation of %zu bytes failed in the timed loop: %s", o->name, sizes[i], o->error());
        return NAN;
      }
      o->free(p, sizes[i], device, stream);
    }
  double ns = (now_ns() - t0) / ((double)pairs * n_sizes);
  return w_free_failed ? NAN : ns;
}

/* ---- exported -------------------------------------------------------------------------------- */

/** Times alloc + free pairs of `sizes` (n_sizes of them, each > 0) on `stream` (a cudaStream_t;
 * NULL: the legacy default stream) of `device`: `which` bit 1 = weft's adapter (libweft_torch.so
 * at weft_so), bit 2 = PyTorch's caching allocator (c10_so: the path of the loaded
 * libc10_cuda.so, or NULL), bit 4 = weft_alloc + weft_free of the same library without the
 * adapter (needs bit 1's library). For repeat r, out_ns[3 * r + k] is allocator k's ns per pair
 * (k: 0 adapter, 1 PyTorch, 2 weft_alloc; NAN when not timed); out_len >= 3 * repeats. Each
 * timed loop is `pairs` rounds of the list. Returns the bits of the allocators timed (an
 * allocator that cannot be loaded is skipped, its reason on stderr and in
 * torch_pair_last_error()), or -1 for bad arguments. */
TP_API int torch_pair_run(const char *weft_so, const char *c10_so, int device, void *stream, const size_t *sizes,
                          int n_sizes, int pairs, int repeats, int which, double *out_ns, int out_len) {
  last_error[0] = 0;
  w_free_failed = 0;
  if (!sizes || n_sizes < 1 || pairs < 1 || repeats < 1 || !out_ns || out_len < N_OPS * repeats || (which & ~7)) {
    fail("bad arguments (sizes, n_sizes >= 1, pairs >= 1, repeats >= 1, out_len >= 3 * repeats, which in 0..7)");
    return -1;
  }
  for (int i = 0; i < n_sizes; i++)
    if (sizes[i] == 0) {
      fail("bad arguments: size 0 (the allocators return NULL for it)");
      return -1;
    }
  for (int i = 0; i < N_OPS * repeats; i++) out_ns[i] = NAN;
  int ok = which;
  if ((ok & 5) && load_weft(weft_so) != 0) ok &= ~5;
  if ((ok & 2) && load_torch(c10_so) != 0) ok &= ~2;
  if ((ok & 4) && load_direct(weft_so, device, stream) != 0) ok &= ~4;
  for (int r = 0; r < repeats; r++)
    for (int k = 0; k < N_OPS; k++) {
      if (!(ok & (1 << k))) continue;
      out_ns[N_OPS * r + k] = time_pairs(&all_ops[k], device, stream, sizes, n_sizes, pairs);
      if (isnan(out_ns[N_OPS * r + k])) ok &= ~(1 << k);
    }
  return ok;
}

/** Why the last torch_pair_run skipped or stopped an allocator ("" if it did not). */
TP_API const char *torch_pair_last_error(void) { return last_error; }

/** How the last torch_pair_run reached PyTorch's allocator ("" if it did not). */
TP_API const char *torch_pair_torch_how(void) { return torch_how; }
