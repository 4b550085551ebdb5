/* Linking weft must never replace the program's malloc: weft's jemalloc is renamed (weft__je_*),
 * so malloc/free/mallocx resolve to the C library or to nothing.
 *
 * Built twice: statically linked with weft (the object files in the executable), and with
 * WEFT_SHARED_LIB set to the path of libweft.so, which it dlopens and inspects the same way. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "weft/weft.h"

static void *g_scope = RTLD_DEFAULT;

/* The file that defines the symbol `name` as seen from g_scope, or NULL. */
static const char *defining_file(const char *name) {
  void *p = dlsym(g_scope, name);
  if (p == NULL) return NULL;
  Dl_info info;
  if (dladdr(p, &info) == 0) return "?";
  return info.dli_fname;
}

static void test_malloc_family_comes_from_libc(void **state) {
  (void)state;
  const char *names[] = {"malloc", "free", "calloc", "realloc", "posix_memalign", "aligned_alloc",
                         "malloc_usable_size", "memalign", "valloc"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *f = defining_file(names[i]);
    assert_non_null(f);
    /* The C library, or a sanitizer's runtime when the test runs under one; never weft. */
    if (strstr(f, "libc.so") == NULL && strstr(f, "libasan") == NULL && strstr(f, "libtsan") == NULL)
      fail_msg("%s is defined by %s, not libc", names[i], f);
  }
}

static void test_no_jemalloc_names_are_visible(void **state) {
  (void)state;
  const char *names[] = {"mallocx", "dallocx", "mallctl", "je_malloc", "sdallocx", "malloc_conf",
                         "weft__je_malloc", "weft__je_mallocx"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *f = defining_file(names[i]);
    if (f != NULL && (g_scope != RTLD_DEFAULT || strncmp(names[i], "weft__", 6) != 0))
      fail_msg("%s is visible (from %s)", names[i], f);
  }
}

/* weft's own allocations work and the program's malloc still works alongside. */
static void test_both_heaps_work_together(void **state) {
  (void)state;
#ifdef WEFT_TEST_SHARED
  weft_options_t (*defaults)(void) = NULL;
  weft_status_t (*validate)(const weft_options_t *) = NULL;
  {
#else
  weft_options_t (*defaults)(void) = weft_options_default;
  weft_status_t (*validate)(const weft_options_t *) = weft_options_validate;
  if (g_scope != RTLD_DEFAULT) {
#endif
    *(void **)&defaults = dlsym(g_scope, "weft_options_default");
    *(void **)&validate = dlsym(g_scope, "weft_options_validate");
    assert_non_null(defaults);
    assert_non_null(validate);
  }
  weft_options_t o = defaults();
  assert_int_equal(validate(&o), WEFT_OK);
  void *p = malloc(1 << 20);
  assert_non_null(p);
  memset(p, 1, 1 << 20);
  free(p);
}

int main(void) {
  const char *so = getenv("WEFT_SHARED_LIB");
  if (so != NULL) {
    g_scope = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (g_scope == NULL) {
      fprintf(stderr, "cannot open %s: %s\n", so, dlerror());
      return 1;
    }
    /* The shared library exports weft's API and nothing else. */
    if (dlsym(g_scope, "weft_version") == NULL || dlsym(g_scope, "weft__meta_alloc") != NULL) {
      fprintf(stderr, "libweft.so exports the wrong symbols\n");
      return 1;
    }
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_malloc_family_comes_from_libc),
      cmocka_unit_test(test_no_jemalloc_names_are_visible),
      cmocka_unit_test(test_both_heaps_work_together),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
