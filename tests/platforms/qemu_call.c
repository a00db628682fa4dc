/* Test harness, built for the target platform and run under qemu-user: loads one kernel
 * library (its runtime library and libtvm_ffi.so found through LD_LIBRARY_PATH), calls its
 * TVM-FFI entry with arguments described on the command line, and prints what the call
 * returned and, on error, the error's kind and message. No GPU is needed: tensors are
 * DLTensors on CUDA device 0 whose data pointer is never read on the host.
 *
 * usage: qemu_call LIBRARY SYMBOL [ARG...]
 *   t:CODE:BITS:D0xD1x...  a tensor (DLDataTypeCode CODE, BITS wide, row-major, dims D0, D1...)
 *   f:VALUE  a float      i:VALUE  an integer      n  None
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tvm/ffi/c_api.h>

#define MAX_ARGS 64
#define MAX_DIMS 8

int main(int argc, char** argv) {
  static DLTensor tensors[MAX_ARGS];
  static int64_t shapes[MAX_ARGS][MAX_DIMS];
  static int64_t strides[MAX_ARGS][MAX_DIMS];
  static TVMFFIAny args[MAX_ARGS];
  if (argc < 3 || argc - 3 > MAX_ARGS) {
    fprintf(stderr, "usage: qemu_call LIBRARY SYMBOL [ARG...] (at most %d)\n", MAX_ARGS);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    printf("LOAD-FAILED %s\n", dlerror());
    return 3;
  }
  TVMFFISafeCallType fn = (TVMFFISafeCallType)dlsym(lib, argv[2]);
  if (fn == NULL) {
    printf("NO-SYMBOL %s\n", argv[2]);
    return 4;
  }
  printf("LOADED\n");
  int n = argc - 3;
  for (int i = 0; i < n; ++i) {
    const char* a = argv[3 + i];
    memset(&args[i], 0, sizeof(args[i]));
    if (a[0] == 't') {
      DLTensor* t = &tensors[i];
      int code = 0, bits = 0, used = 0;
      if (sscanf(a, "t:%d:%d:%n", &code, &bits, &used) != 2) return 2;
      const char* p = a + used;
      int nd = 0;
      while (*p && nd < MAX_DIMS) {
        shapes[i][nd++] = strtoll(p, (char**)&p, 10);
        if (*p == 'x') ++p;
      }
      t->data = (void*)(uintptr_t)(0x100000u * (unsigned)(i + 1)); /* aligned, never read */
      t->device.device_type = kDLCUDA;
      t->device.device_id = 0;
      t->ndim = nd;
      t->dtype.code = (uint8_t)code;
      t->dtype.bits = (uint8_t)bits;
      t->dtype.lanes = 1;
      t->shape = shapes[i];
      for (int d = nd - 1, s = 1; d >= 0; --d) {
        strides[i][d] = s;
        s *= shapes[i][d];
      }
      t->strides = strides[i];
      t->byte_offset = 0;
      args[i].type_index = kTVMFFIDLTensorPtr;
      args[i].v_ptr = t;
    } else if (a[0] == 'f') {
      args[i].type_index = kTVMFFIFloat;
      args[i].v_float64 = strtod(a + 2, NULL);
    } else if (a[0] == 'i') {
      args[i].type_index = kTVMFFIInt;
      args[i].v_int64 = strtoll(a + 2, NULL, 10);
    } else {
      args[i].type_index = kTVMFFINone;
    }
  }
  TVMFFIAny result;
  memset(&result, 0, sizeof(result));
  int rc = fn(NULL, args, n, &result);
  printf("RC %d\n", rc);
  if (rc != 0) {
    TVMFFIObjectHandle err = NULL;
    TVMFFIErrorMoveFromRaised(&err);
    if (err != NULL) {
      const TVMFFIErrorCell* cell =
          (const TVMFFIErrorCell*)((const char*)err + sizeof(TVMFFIObject));
      printf("KIND %.*s\n", (int)cell->kind.size, cell->kind.data);
      printf("MESSAGE %.*s\n", (int)cell->message.size, cell->message.data);
      TVMFFIObjectDecRef(err);
    }
  }
  return 0;
}
