/* Stand-in libcuda.so.1 for running SGLang on a machine without an NVIDIA driver.
 *
 * sgl_kernel links against libcuda.so.1 and resolves these driver entry points when it is
 * imported, even with SGLANG_USE_CPU_ENGINE=1. Every call reports CUDA_ERROR_NO_DEVICE, so
 * any code path that really wanted a GPU fails cleanly instead of crashing. Arguments are
 * ignored except output pointers, which are cleared so callers never read garbage.
 * Built by engines/sglang/env.py: gcc -shared -fPIC -o libcuda.so.1 libcuda_stub.c
 */
#include <stddef.h>

#define CUDA_ERROR_NO_DEVICE 100

#define NO_DEVICE(name) int name(void) { return CUDA_ERROR_NO_DEVICE; }

NO_DEVICE(cuInit)
NO_DEVICE(cuStreamCreate)
NO_DEVICE(cuPointerGetAttribute)
NO_DEVICE(cuCtxPushCurrent_v2)
NO_DEVICE(cuCtxPopCurrent_v2)
NO_DEVICE(cuCtxFromGreenCtx)
NO_DEVICE(cuGreenCtxCreate)
NO_DEVICE(cuGreenCtxDestroy)
NO_DEVICE(cuGreenCtxGetDevResource)
NO_DEVICE(cuDeviceGetDevResource)
NO_DEVICE(cuDevResourceGenerateDesc)
NO_DEVICE(cuDevSmResourceSplitByCount)

int cuDeviceGetCount(int *count) {
    if (count) *count = 0;
    return CUDA_ERROR_NO_DEVICE;
}

int cuDriverGetVersion(int *version) {
    if (version) *version = 0;
    return CUDA_ERROR_NO_DEVICE;
}

int cuGetErrorString(int error, const char **str) {
    if (str) *str = "CUDA_ERROR_NO_DEVICE: stand-in libcuda, no NVIDIA driver on this machine";
    return CUDA_ERROR_NO_DEVICE;
}

int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    if (pfn) *pfn = NULL;
    return CUDA_ERROR_NO_DEVICE;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                        int *status) {
    if (pfn) *pfn = NULL;
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return CUDA_ERROR_NO_DEVICE;
}
