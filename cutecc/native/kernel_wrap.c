/* The per-kernel half of cutecc's native code, linked into each kernel library with the
 * DSL's object (see cutecc/linker.py); everything else lives in the runtime library
 * (cutecc_rt.c) the kernel library links against.
 *
 * The exported TVM-FFI entry point CUTECC_EXPORT calls the DSL's function CUTECC_INNER; on
 * failure the runtime re-raises the error naming the kernel (CUTECC_ENTRY, CUTECC_ARCH,
 * CUTECC_KEY: all inputs of the key, so the library's bytes stay a function of its key),
 * and with CUTECC_SYNC_CHECK set it waits for the kernel so a fault is reported here.
 */
#include <stdint.h>

#include <tvm/ffi/c_api.h>

#if !defined(CUTECC_EXPORT) || !defined(CUTECC_INNER) || !defined(CUTECC_ENTRY) || \
    !defined(CUTECC_ARCH) || !defined(CUTECC_KEY)
#error "cutecc.linker defines CUTECC_EXPORT, CUTECC_INNER, CUTECC_ENTRY, CUTECC_ARCH, CUTECC_KEY"
#endif

#define CUTECC_WHO "cutecc kernel " CUTECC_ENTRY " (built for " CUTECC_ARCH ", cache key " CUTECC_KEY ")"

/* Embedded in the library so `strings kernel.so` tells what it is. */
__attribute__((used)) static const char cutecc_ident[] = "cutecc-label: " CUTECC_WHO;
static const char cutecc_who[] = CUTECC_WHO;
static const char cutecc_arch[] = CUTECC_ARCH;

int CUTECC_INNER(void* handle, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

/* In the runtime library (cutecc_rt.c). */
void cutecc_rt_relabel(const char* who, const char* arch, const TVMFFIAny* args, int32_t num_args);
int cutecc_rt_sync_check_enabled(void);
int cutecc_rt_sync_check(const char* who, const char* arch, const TVMFFIAny* args, int32_t num_args);

__attribute__((visibility("default"))) int CUTECC_EXPORT(void* handle, const TVMFFIAny* args,
                                                         int32_t num_args, TVMFFIAny* result) {
  int rc = CUTECC_INNER(handle, args, num_args, result);
  if (__builtin_expect(rc != 0, 0)) {
    cutecc_rt_relabel(cutecc_who, cutecc_arch, args, num_args);
    return rc;
  }
  if (__builtin_expect(cutecc_rt_sync_check_enabled(), 0)) {
    return cutecc_rt_sync_check(cutecc_who, cutecc_arch, args, num_args);
  }
  return 0;
}
