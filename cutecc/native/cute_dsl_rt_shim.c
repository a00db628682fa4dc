/* cutecc: the one symbol of libcute_dsl_runtime.so that a CuTe DSL TVM-FFI object needs.
 * Linking this instead of the 43 MB runtime library keeps a kernel's shared library
 * self-contained: it then depends on libtvm_ffi.so alone (the driver is opened lazily). */
#include <stdio.h>
#include <tvm/ffi/c_api.h>

extern const char* cudaGetErrorName(int error);
extern const char* cudaGetErrorString(int error);

void CuteDSLRT_TVMFFISetRaisedCudaError(int error) {
  char message[512];
  snprintf(message, sizeof(message), "CUDA error %d (%s): %s", error,
           cudaGetErrorName(error), cudaGetErrorString(error));
  TVMFFIErrorSetRaisedFromCStr("RuntimeError", message);
}
