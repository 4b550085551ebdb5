/* NVTX in the weft domain (nvtx.h). */
#include <pthread.h>
#include <stdlib.h>

#include <nvtx3/nvToolsExt.h>

#include "lib/core/nvtx.h"

_Atomic int weft__nvtx_state;
static nvtxDomainHandle_t domain; /* written before the state says 2 (release) */

static void init(void) {
  const char *tool = getenv("NVTX_INJECTION64_PATH");
  bool attached = tool != NULL && tool[0] != '\0';
  if (attached) domain = nvtxDomainCreateA("weft");
  atomic_store_explicit(&weft__nvtx_state, attached ? 2 : 1, memory_order_release);
}

bool weft__nvtx_init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init);
  return atomic_load_explicit(&weft__nvtx_state, memory_order_acquire) == 2;
}

static nvtxEventAttributes_t attributes(const char *message) {
  nvtxEventAttributes_t a = {0};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = message;
  return a;
}

void weft__nvtx_mark_on(const char *message) {
  nvtxEventAttributes_t a = attributes(message);
  nvtxDomainMarkEx(domain, &a);
}

void weft__nvtx_push_on(const char *message) {
  nvtxEventAttributes_t a = attributes(message);
  nvtxDomainRangePushEx(domain, &a);
}

void weft__nvtx_pop_on(void) { nvtxDomainRangePop(domain); }
