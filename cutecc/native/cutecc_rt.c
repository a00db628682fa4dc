/* cutecc's runtime library, linked once per toolchain (see cutecc/linker.py) into
 * libcutecc_rt_<key>.so together with the DSL's static CUDA-dialect runtime (whole archive)
 * and the static CUDA runtime; every kernel library of that toolchain links against it.
 *
 * 1. The two symbols of libcute_dsl_runtime.so that a CuTe DSL TVM-FFI object may call
 *    (signatures from that library's CuteDSLRuntime.h), so no library links the 43 MB
 *    runtime and the deploy host needs only libtvm_ffi.so.
 * 2. What a kernel's wrapper (kernel_wrap.c) calls: `cutecc_rt_relabel` makes a failure name
 *    the kernel (its label and arch come in as arguments, so nothing here depends on a
 *    kernel) and adds what the GPU is when the library holds no code for it;
 *    `cutecc_rt_sync_check_enabled` and `cutecc_rt_sync_check` implement CUTECC_SYNC_CHECK,
 *    which synchronises the stream after the kernel so an asynchronous fault (an illegal
 *    address, a trap) is reported by the call that caused it.
 * 3. `cutecc_rt_abi_version`, which the loader checks before any kernel library binds to it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

/* The few CUDA runtime (libcudart_static.a) entry points used here, declared by hand: the
 * runtime wheel ships cuda_runtime_api.h without the crt/ headers it includes. Values are
 * those of CUDA 13's driver_types.h. */
typedef int cudaError_t;
typedef void* cudaStream_t;
enum {
  cudaSuccess = 0,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorInvalidAddressSpace = 717,
  cudaErrorInvalidPc = 718,
  cudaErrorLaunchFailure = 719,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaStreamCaptureStatusNone = 0,
};
extern const char* cudaGetErrorName(cudaError_t error);
extern const char* cudaGetErrorString(cudaError_t error);
extern cudaError_t cudaGetLastError(void);
extern cudaError_t cudaGetDevice(int* device);
extern cudaError_t cudaDeviceGetAttribute(int* value, int attr, int device);
extern cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int* status);
extern cudaError_t cudaStreamSynchronize(cudaStream_t stream);

#ifndef CUTECC_RT_LABEL
#error "cutecc.linker defines CUTECC_RT_LABEL (the runtime's key)"
#endif

#define CUTECC_RT_API __attribute__((visibility("default")))
#define CUTECC_RT_ABI 1 /* bump when a cutecc_rt_* signature or meaning changes */
#define CUTECC_SYNC_ENV "CUTECC_SYNC_CHECK"

/* Embedded in the library so `strings` tells what it is. */
__attribute__((used)) static const char cutecc_rt_ident[] = "cutecc-runtime: " CUTECC_RT_LABEL;

typedef void (*cutecc_set_error_fn)(const char* kind, const char** parts, int32_t num_parts);

/* The CUDA error the DSL reported during this thread's current kernel call: set by
 * CuteDSLRT_TVMFFISetRaisedCudaError, read and cleared by the kernel's wrapper through
 * cutecc_rt_relabel right after the call, on the same thread. */
static _Thread_local int cutecc_cuda_error = 0;

/* Errors after which the CUDA context is unusable: every later call reports them too. */
static int cutecc_is_sticky(int code) {
  switch (code) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
      return 1;
    default:
      return 0;
  }
}

static void cutecc_format_cuda_error(char* out, size_t size, int code) {
  const char* name = cudaGetErrorName((cudaError_t)code);
  const char* text = cudaGetErrorString((cudaError_t)code);
  snprintf(out, size, "CUDA error %d (%s): %s", code, name ? name : "?", text ? text : "?");
}

CUTECC_RT_API void CuteDSLRT_TVMFFISetRaisedCudaError(cutecc_set_error_fn set_error, int32_t code) {
  char message[256];
  const char* parts[1] = {message};
  cutecc_cuda_error = code;
  cutecc_format_cuda_error(message, sizeof(message), code);
  if (set_error != NULL) {
    set_error("RuntimeError", parts, 1);
  } else {
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", message);
  }
}

CUTECC_RT_API void CuteDSLRT_TVMFFISetRaisedCudaLaunchError(
    cutecc_set_error_fn set_error, int32_t grid_x, int32_t grid_y, int32_t grid_z,
    int32_t block_x, int32_t block_y, int32_t block_z, int32_t block_threads,
    int64_t dynamic_smem, int32_t device, int32_t max_threads, int32_t max_block_x,
    int32_t max_block_y, int32_t max_block_z, int32_t max_grid_x, int32_t max_grid_y,
    int32_t max_grid_z, int32_t max_smem, int32_t max_smem_optin, const char* violation,
    const char* source_file, int32_t source_line, int32_t source_col, int32_t source_end_col) {
  char message[1024];
  const char* parts[1] = {message};
  (void)source_end_col;
  snprintf(message, sizeof(message),
           "invalid launch configuration (%s): grid (%d, %d, %d), block (%d, %d, %d) = %d threads, "
           "%lld bytes of dynamic shared memory; GPU %d allows %d threads per block, block up to "
           "(%d, %d, %d), grid up to (%d, %d, %d), %d bytes of shared memory per block (%d opt-in); "
           "launched at %s:%d:%d",
           violation ? violation : "?", grid_x, grid_y, grid_z, block_x, block_y, block_z,
           block_threads, (long long)dynamic_smem, device, max_threads, max_block_x, max_block_y,
           max_block_z, max_grid_x, max_grid_y, max_grid_z, max_smem, max_smem_optin,
           source_file ? source_file : "?", source_line, source_col);
  if (set_error != NULL) {
    set_error("RuntimeError", parts, 1);
  } else {
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", message);
  }
}

/* The CUDA device of the call: that of its first CUDA tensor, else the current one. */
static int cutecc_device_of(const TVMFFIAny* args, int32_t num_args) {
  for (int32_t i = 0; i < num_args; ++i) {
    const DLTensor* t = NULL;
    if (args[i].type_index == kTVMFFIDLTensorPtr) {
      t = (const DLTensor*)args[i].v_ptr;
    } else if (args[i].type_index == kTVMFFITensor && args[i].v_obj != NULL) {
      t = (const DLTensor*)((const char*)args[i].v_obj + sizeof(TVMFFIObject));
    }
    if (t != NULL && t->device.device_type == kDLCUDA) return t->device.device_id;
  }
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess ? device : 0;
}

/* Whether code built for `arch` runs on compute capability major.minor (the rule of
 * cutecc.archs.runs_on): `sm_90a` only on 9.0, `sm_100f` on 10.x from 10.0, plain `sm_80`
 * on 8.x from 8.0. */
static int cutecc_arch_runs_on(const char* arch, int major, int minor) {
  int number = 0;
  const char* p = arch + 3;
  if (strncmp(arch, "sm_", 3) != 0) return 1; /* unknown form: make no claim */
  while (*p >= '0' && *p <= '9') number = number * 10 + (*p++ - '0');
  if (number < 10) return 1;
  if (number / 10 != major) return 0;
  return *p == 'a' ? number % 10 == minor : number % 10 <= minor;
}

/* " this GPU (..) cannot run it; build it for this GPU: ..." when the library has no code
 * for the device, else "". */
static void cutecc_arch_note(char* out, size_t size, const char* arch, int device) {
  int major = 0, minor = 0;
  out[0] = '\0';
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (cutecc_arch_runs_on(arch, major, minor)) return;
  snprintf(out, size,
           "; this library holds code for %s only, and GPU %d is sm_%d%d (compute "
           "capability %d.%d), which cannot run it: build the kernel for this GPU, e.g. "
           "`cutecc build --arch sm_%d%d%s`",
           arch, device, major, minor, major, minor, major, minor, major >= 9 ? "a" : "");
}

static const char kStickyNote[] =
    "; the CUDA context of this process is now unusable (a fault of this kind may also come "
    "from earlier work on the GPU): restart the process";

/* Replace the error the DSL raised by one whose message starts with `who` (the kernel's
 * label); `arch` is what the kernel's library was built for. */
CUTECC_RT_API void cutecc_rt_relabel(const char* who, const char* arch, const TVMFFIAny* args,
                                     int32_t num_args) {
  TVMFFIObjectHandle err = NULL;
  char kind[64] = "RuntimeError";
  char arch_note[512];
  const char* message = "the kernel failed without an error message";
  char* copy = NULL;
  int code = cutecc_cuda_error;
  cutecc_cuda_error = 0;
  TVMFFIErrorMoveFromRaised(&err);
  if (err != NULL) {
    const TVMFFIErrorCell* cell =
        (const TVMFFIErrorCell*)((const char*)err + sizeof(TVMFFIObject));
    if (cell->kind.size > 0 && cell->kind.size < sizeof(kind)) {
      memcpy(kind, cell->kind.data, cell->kind.size);
      kind[cell->kind.size] = '\0';
    }
    copy = (char*)malloc(cell->message.size + 1);
    if (copy != NULL) {
      memcpy(copy, cell->message.data, cell->message.size);
      copy[cell->message.size] = '\0';
      message = copy;
    }
  }
  cutecc_arch_note(arch_note, sizeof(arch_note), arch, cutecc_device_of(args, num_args));
  {
    const char* parts[5] = {who, ": ", message, arch_note, cutecc_is_sticky(code) ? kStickyNote : ""};
    TVMFFIErrorSetRaisedFromCStrParts(kind, parts, 5);
  }
  free(copy);
  if (err != NULL) TVMFFIObjectDecRef(err);
}

/* CUTECC_SYNC_CHECK, read once per process. Like cutecc's Python side: unset, or (ignoring
 * case and surrounding blanks) "", "0", "false", "no" or "off" mean off. */
CUTECC_RT_API int cutecc_rt_sync_check_enabled(void) {
  static int mode = -1;
  int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
  if (m < 0) {
    static const char* const kOff[] = {"", "0", "false", "no", "off"};
    const char* v = getenv(CUTECC_SYNC_ENV);
    m = 0;
    if (v != NULL) {
      size_t n;
      while (*v == ' ' || *v == '\t' || *v == '\n') ++v;
      n = strlen(v);
      while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\n')) --n;
      m = 1;
      for (size_t i = 0; i < sizeof(kOff) / sizeof(kOff[0]); ++i) {
        if (strlen(kOff[i]) == n && strncasecmp(v, kOff[i], n) == 0) m = 0;
      }
    }
    __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
  }
  return m;
}

/* Wait for the call's stream; on a CUDA error raise it, naming the kernel (`who`). */
CUTECC_RT_API int cutecc_rt_sync_check(const char* who, const char* arch, const TVMFFIAny* args,
                                       int32_t num_args) {
  int device = cutecc_device_of(args, num_args);
  cudaStream_t stream = (cudaStream_t)TVMFFIEnvGetStream(kDLCUDA, device);
  int capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
      capture != cudaStreamCaptureStatusNone) {
    return 0; /* recording a CUDA graph: nothing ran yet, and waiting would break the capture */
  }
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e == cudaSuccess) return 0;
  (void)cudaGetLastError(); /* clear it where it can be cleared */
  {
    char cuda[256];
    char arch_note[512];
    cutecc_format_cuda_error(cuda, sizeof(cuda), (int)e);
    cutecc_arch_note(arch_note, sizeof(arch_note), arch, device);
    const char* parts[6] = {
        who, ": ", cuda,
        ", seen by " CUTECC_SYNC_ENV " when synchronising the stream after this kernel (the "
        "fault is in this kernel or in work queued before it)",
        arch_note, cutecc_is_sticky((int)e) ? kStickyNote : ""};
    TVMFFIErrorSetRaisedFromCStrParts("RuntimeError", parts, 6);
  }
  return -1;
}

/* For the loader's check before any kernel binds to this library (calls no CUDA). */
CUTECC_RT_API int cutecc_rt_abi_version(void) { return CUTECC_RT_ABI; }
