/* Probe (asserts nothing): how the loaded driver answers cuStreamWriteValue32 / WaitValue32 for
 * device memory from cuMemAlloc on a non-blocking stream, through the entry points weft can get:
 * dlsym of the versioned names and cuGetProcAddress at several CUDA versions. */

#include <dlfcn.h>
#include <stdio.h>

#include <cuda.h>

typedef CUresult (*wv32_t)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

int main(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return printf("no driver\n"), 0;
  CUresult (*init)(unsigned) = dlsym(h, "cuInit");
  CUresult (*get)(CUdevice *, int) = dlsym(h, "cuDeviceGet");
  CUresult (*retain)(CUcontext *, CUdevice) = dlsym(h, "cuDevicePrimaryCtxRetain");
  CUresult (*setc)(CUcontext) = dlsym(h, "cuCtxSetCurrent");
  CUresult (*alloc)(CUdeviceptr *, size_t) = dlsym(h, "cuMemAlloc_v2");
  CUresult (*mk)(CUstream *, unsigned, int) = dlsym(h, "cuStreamCreateWithPriority");
  CUresult (*sync)(CUstream) = dlsym(h, "cuStreamSynchronize");
  CUresult (*attr)(int *, CUdevice_attribute, CUdevice) = dlsym(h, "cuDeviceGetAttribute");
  gpa_t gpa = dlsym(h, "cuGetProcAddress_v2");
  CUdevice d;
  CUcontext c;
  init(0);
  get(&d, 0);
  retain(&c, d);
  setc(c);
  int a1 = -1, a2 = -1, a3 = -1;
  attr(&a1, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d);
  attr(&a2, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, d);
  attr(&a3, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, d);
  printf("attributes: 64-bit mem ops %d, wait NOR %d, flush remote writes %d\n", a1, a2, a3);
  CUdeviceptr p;
  CUstream s, s0 = NULL;
  printf("cuMemAlloc %d\n", alloc(&p, 4096));
  printf("stream %d\n", mk(&s, CU_STREAM_NON_BLOCKING, 0));
  const char *names[] = {"cuStreamWriteValue32", "cuStreamWriteValue32_v2", "cuStreamWriteValue32_ptsz",
                         "cuStreamWriteValue32_v2_ptsz"};
  for (int i = 0; i < 4; i++) {
    wv32_t f = (wv32_t)dlsym(h, names[i]);
    if (!f) {
      printf("dlsym %s: absent\n", names[i]);
      continue;
    }
    printf("dlsym %s: stream %d, null stream %d, flags1 %d\n", names[i], f(s, p, 7, 0), f(s0, p, 7, 0), f(s, p, 7, 1));
  }
  int versions[] = {8000, 11070, 12000, 12080, 13000};
  for (int i = 0; i < 5; i++) {
    void *fp = NULL;
    CUdriverProcAddressQueryResult q;
    CUresult r = gpa("cuStreamWriteValue32", &fp, versions[i], CU_GET_PROC_ADDRESS_DEFAULT, &q);
    Dl_info info = {0};
    if (fp) dladdr(fp, &info);
    printf("gpa %d: r %d q %d fp %p (%s): call %d\n", versions[i], r, q, fp, info.dli_sname ? info.dli_sname : "?",
           fp ? ((wv32_t)fp)(s, p, 7, 0) : -1);
  }
  printf("sync %d\n", sync(s));
  return 0;
}
