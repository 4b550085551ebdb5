/* The NCCL boundary (nccl.h): loading the library and naming its failures. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "lib/core/nccl.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static weft__nccl_t g_nccl;
static weft_status_t g_status;
static char g_message[512];

static void load_once(void) {
  const char *want = getenv("WEFT_NCCL");
  if (want == NULL || *want == '\0') want = "libnccl.so.2";
  bool sim = strcmp(want, "sim") == 0;
  if (sim) {
    const weft__driver_t *drv;
    if (weft__driver_get(&drv) != WEFT_OK || weft_driver_symbol("weft_sim_version") == NULL) {
      g_status = WEFT_ERR_NOT_SUPPORTED;
      snprintf(g_message, sizeof g_message, "WEFT_NCCL=sim needs the simulator as the driver (WEFT_DRIVER=sim)");
      return;
    }
  } else if ((g_nccl.handle = dlopen(want, RTLD_NOW | RTLD_LOCAL)) == NULL) {
    g_status = WEFT_ERR_NOT_SUPPORTED;
    snprintf(g_message, sizeof g_message, "no NCCL: dlopen(%s): %s (set WEFT_NCCL to its path)", want, dlerror());
    return;
  }
  snprintf(g_nccl.path, sizeof g_nccl.path, "%s", sim ? "sim" : want);
#define WEFT__NCCL_LOAD(name)                                                                   \
  *(void **)&g_nccl.name = sim ? weft_driver_symbol(#name) : dlsym(g_nccl.handle, #name);      \
  if (g_nccl.name == NULL) {                                                                    \
    g_status = WEFT_ERR_NOT_SUPPORTED;                                                          \
    snprintf(g_message, sizeof g_message, "NCCL at %s has no %s", g_nccl.path, #name);          \
    return;                                                                                     \
  }
  WEFT_NCCL_FUNCS(WEFT__NCCL_LOAD)
#undef WEFT__NCCL_LOAD
  if (g_nccl.ncclGetVersion(&g_nccl.version) != ncclSuccess) g_nccl.version = 0;
  g_status = WEFT_OK;
}

weft_status_t weft__nccl_get(const weft__nccl_t **out) {
  pthread_once(&g_once, load_once);
  if (g_status != WEFT_OK) return weft__error(g_status, "%s", g_message);
  *out = &g_nccl;
  return WEFT_OK;
}

weft_status_t weft__nccl_fail(const weft__nccl_t *n, ncclResult_t r, const char *what) {
  const char *last = n->ncclGetLastError(NULL);
  weft_status_t st = r == ncclInvalidArgument || r == ncclInvalidUsage ? WEFT_ERR_INVALID_ARGUMENT : WEFT_ERR_COMM;
  return weft__error(st, "%s: NCCL error %d (%s)%s%s", what, (int)r, n->ncclGetErrorString(r),
                     last != NULL && *last ? ": " : "", last != NULL ? last : "");
}
