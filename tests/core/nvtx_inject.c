/* A minimal NVTX tool for tests/core:test_nvtx: loaded by NVTX through NVTX_INJECTION64_PATH,
 * it records the domains created and every mark and range push / pop of NVTX's domain API, which
 * the test reads back through weft_test_nvtx_log(). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_len;
static int depth, pops;

static void add(const char *what, const char *msg) {
  pthread_mutex_lock(&lock);
  int n = snprintf(log_buf + log_len, sizeof log_buf - log_len, "%s %s\n", what, msg ? msg : "");
  if (n > 0 && log_len + (size_t)n < sizeof log_buf) log_len += (size_t)n;
  pthread_mutex_unlock(&lock);
}

static const char *message(const nvtxEventAttributes_t *a) {
  return a != NULL && a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "";
}

static nvtxDomainHandle_t domain_create(const char *name) {
  add("domain", name);
  return (nvtxDomainHandle_t)(void *)0x1;
}
static void mark(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  (void)d;
  add("mark", message(a));
}
static int push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  (void)d;
  add("push", message(a));
  return ++depth;
}
static int pop(nvtxDomainHandle_t d) {
  (void)d;
  pthread_mutex_lock(&lock);
  pops++;
  pthread_mutex_unlock(&lock);
  return depth--;
}

/** What the tool saw, one line per call ("domain weft", "mark ...", "push ..."). */
const char *weft_test_nvtx_log(void) { return log_buf; }
/** Range pops seen. */
int weft_test_nvtx_pops(void) { return pops; }

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = NULL;
  unsigned size = 0;
  if (cb == NULL || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == NULL) return 0;
  if (size > NVTX_CBID_CORE2_DomainCreateA) {
    *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
    *table[NVTX_CBID_CORE2_DomainMarkEx] = (NvtxFunctionPointer)mark;
    *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push;
    *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop;
  }
  return 1;
}
