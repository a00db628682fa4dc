"""The link: a runtime library per toolchain, kernel libraries with one exported symbol
that need only it and libtvm_ffi.so, the native wrapper that names the kernel in every
error, and check mode (CUTECC_SYNC_CHECK), tested without a GPU.

The wrapper's behaviour is driven through a stand-in for the DSL's object: a small C file
defining `__tvm_ffi_cutecc_impl` that fails the way DSL-generated code does (it calls
`CuteDSLRT_TVMFFISetRaisedCudaError(TVMFFIErrorSetRaisedFromCStrParts, code)`, the ABI
read from a compiled object), linked by the real recipe against the real runtime library.
"""

from __future__ import annotations

import ctypes.util
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PY, REPO

import cutecc
from cutecc.build import linker
from cutecc.build.compiler import INNER_SYMBOL, SYMBOL
from cutecc.errors import CuteccError
from cutecc.plan.key import toolchain
from cutecc.store import Store, homes
from cutecc.toolchain.versions import ZIG_TARGET

try:
    TOOLS = linker.toolchain_paths()
except CuteccError:  # a deploy-like machine: no build extra, nothing to link with
    TOOLS = None
needs_link = pytest.mark.skipif(TOOLS is None, reason="needs the build extra (the link inputs)")
HAS_DRIVER = ctypes.util.find_library("cuda") is not None
FAULTS = REPO / "tests" / "gpu" / "faulty_kernels" / "kernels.toml"

FAKE_DSL_OBJECT = r'''
#include <stdint.h>
#include <tvm/ffi/c_api.h>

typedef void (*set_error_fn)(const char*, const char**, int32_t);
void CuteDSLRT_TVMFFISetRaisedCudaError(set_error_fn set_error, int32_t code);
void CuteDSLRT_TVMFFISetRaisedCudaLaunchError(
    set_error_fn, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int64_t,
    int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t,
    const char*, const char*, int32_t, int32_t, int32_t);

/* args[0] chooses: 0 succeeds; > 0 is a CUDA error code reported as DSL code does;
 * -1 raises a ValueError; -2 reports an invalid launch configuration. */
int __tvm_ffi_cutecc_impl(void* h, const TVMFFIAny* args, int32_t n, TVMFFIAny* r) {
  (void)h; (void)r;
  int64_t what = n > 0 ? args[0].v_int64 : 0;
  if (what > 0) {
    CuteDSLRT_TVMFFISetRaisedCudaError(TVMFFIErrorSetRaisedFromCStrParts, (int32_t)what);
    return -1;
  }
  if (what == -1) {
    TVMFFIErrorSetRaisedFromCStr("ValueError", "Expects 2 parameters when calling: `f(x: Tensor)`");
    return -1;
  }
  if (what == -2) {
    CuteDSLRT_TVMFFISetRaisedCudaLaunchError(TVMFFIErrorSetRaisedFromCStrParts, 1, 1, 1, 2048,
        1, 1, 2048, 0, 0, 1024, 1024, 1024, 64, 2147483647, 65535, 65535, 49152, 232448,
        "block_threads > max_threads_per_block", "k.py", 12, 5, 9);
    return -1;
  }
  return 0;
}
'''

CALL = r'''
import ctypes, json, os, sys
import tvm_ffi
ctypes.CDLL(sys.argv[4], mode=os.RTLD_LOCAL)  # the runtime library, found by its soname next
module = tvm_ffi.load_module(sys.argv[1])
out = []
for args in json.loads(sys.argv[3]):
    try:
        getattr(module, sys.argv[2])(*args)
        out.append(None)
    except Exception as e:
        out.append([type(e).__name__, str(e)])
print(json.dumps(out))
'''

ENTRY, ARCH, KEY = "pkg.kern:launch", "sm_90a", hashlib.sha256(b"k").hexdigest()
WHO = f"cutecc kernel {ENTRY} (built for {ARCH}, cache key {KEY[:12]}): "


def compile_c(source: Path, out: Path) -> None:
    """An object file of a C stand-in, compiled by the link's own zig."""
    subprocess.run([str(TOOLS["zig"]), "cc", "-target", ZIG_TARGET, "-c", "-fPIC", "-O2",
                    f"-I{TOOLS['tvm_include']}", "-o", str(out), str(source)], check=True,
                   env={**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(homes.zig()),
                        "ZIG_LOCAL_CACHE_DIR": str(homes.zig())})


@pytest.fixture(scope="module")
def runtime_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This toolchain's runtime library, linked as a build links it."""
    return linker.link_runtime(tmp_path_factory.mktemp("runtime"), toolchain()["runtime"])


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory, runtime_lib: Path) -> Path:
    """The stand-in object, linked exactly as a kernel is."""
    d = tmp_path_factory.mktemp("fake-dsl")
    (d / "fake.c").write_text(FAKE_DSL_OBJECT)
    compile_c(d / "fake.c", d / "fake.o")
    linker.link(d / "fake.o", d / "kernel.so", SYMBOL, entry=ENTRY, arch=ARCH, key=KEY,
                runtime=runtime_lib)
    shutil.copyfile(runtime_lib, d / runtime_lib.name)  # what `call` loads first
    return d / "kernel.so"


def call(lib: Path, calls: list[list[int]], env: dict[str, str] | None = None,
         symbol: str = SYMBOL, runtime: Path | None = None) -> list[list[str] | None]:
    """Call the library's kernel function once per argument list, in a fresh process, its
    runtime library (by default the one beside it, else its cache entry's) loaded first:
    the (exception type, message) of each call, or None where it returned."""
    if runtime is None:
        runtime = next(lib.parent.glob("libcutecc_rt_*.so"), None) or _runtime_of(lib)
    full = {k: v for k, v in os.environ.items() if k != "CUTECC_SYNC_CHECK"}
    r = subprocess.run([PY, "-c", CALL, str(lib), symbol, json.dumps(calls), str(runtime)],
                       capture_output=True, text=True, timeout=120, env={**full, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _runtime_of(lib: Path) -> Path:
    """The runtime library of a cache entry's library (`<root>/entries/ab/<key>/kernel.so`)."""
    rec = json.loads((lib.parent / "meta.json").read_text())["runtime"]
    return lib.parents[3] / "runtimes" / rec["key"][:2] / rec["key"] / rec["library"]


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


# The link --------------------------------------------------------------------------


def needed(lib: Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line}


GLIBC_LIBS = {"libc.so.6", "ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0", "librt.so.1",
              "libm.so.6"}


@needs_link
def test_every_example_library_exports_only_the_wrapper_and_needs_only_its_runtime(
        example_cache: Path) -> None:
    store = Store(example_cache)
    entries = list(store.entries())
    assert entries
    runtimes = {e.doc["runtime"]["key"] for e in entries}
    assert runtimes == {toolchain()["runtime"]}  # one runtime library for the whole toolchain
    for e in entries:
        lib = e.path / e.doc["library"]
        assert e.doc["symbol"] == SYMBOL
        assert exported(lib) == {f"__tvm_ffi_{SYMBOL}"}, e.key
        who = f"cutecc kernel {e.doc['entry']} (built for {e.doc['arch']}, cache key {e.key[:12]})"
        assert f"cutecc-label: {who}".encode() in lib.read_bytes(), e.key
        assert needed(lib) == {e.doc["runtime"]["library"], "libtvm_ffi.so"}, e.key
        assert lib.stat().st_size < 64 << 10, e.key  # the kernel's object and the wrapper only
    [rt] = list(store.runtimes())
    rt_lib = rt.path / rt.doc["library"]
    assert needed(rt_lib) <= GLIBC_LIBS | {"libtvm_ffi.so"} and "libtvm_ffi.so" in needed(rt_lib)
    exports = exported(rt_lib)
    assert {"CuteDSLRT_TVMFFISetRaisedCudaError", "cutecc_rt_relabel", "cutecc_rt_abi_version",
            "cuda_dialect_init_library_once", "_cudaLaunchKernelEx"} <= exports
    assert not {x for x in exports if x.startswith("cuda")} - {x for x in exports
                                                               if x.startswith("cuda_dialect_")}
    soname = subprocess.run(["readelf", "-d", str(rt_lib)], capture_output=True, text=True).stdout
    assert f"Library soname: [{rt.doc['library']}]" in soname


@needs_link
def test_a_real_kernel_error_names_the_kernel_and_keeps_its_kind(example_cache: Path) -> None:
    e = next(x for x in Store(example_cache).entries() if x.doc["kernel"] == "mul")
    (got,) = call(e.path / e.doc["library"], [[]])  # no arguments: the DSL's own check fails
    assert got is not None
    kind, message = got
    assert kind == "TypeError"
    assert message.startswith(f"cutecc kernel kernels.elementwise:mul (built for sm_90a, "
                              f"cache key {e.key[:12]}): "), message
    assert "Expects 3 parameters" in message and "x: Tensor" in message  # the DSL's text, whole


@needs_link
def test_the_inner_function_stays_hidden(fake_lib: Path) -> None:
    assert exported(fake_lib) == {f"__tvm_ffi_{SYMBOL}"}
    (got,) = call(fake_lib, [[]], symbol=INNER_SYMBOL)
    assert got is not None and got[0] == "AttributeError"


@needs_link
def test_an_unresolved_symbol_fails_the_link_not_the_load(tmp_path: Path, runtime_lib: Path) -> None:
    (tmp_path / "bad.c").write_text(FAKE_DSL_OBJECT.replace(
        "return 0;\n}", "extern int cutecc_no_such_function(void);\n  return cutecc_no_such_function();\n}"))
    compile_c(tmp_path / "bad.c", tmp_path / "bad.o")
    with pytest.raises(CuteccError, match="cutecc_no_such_function"):
        linker.link(tmp_path / "bad.o", tmp_path / "bad.so", SYMBOL, entry=ENTRY, arch=ARCH, key=KEY,
                    runtime=runtime_lib)


@needs_link
def test_a_kernel_library_does_not_load_without_its_runtime_library(fake_lib: Path) -> None:
    code = "import sys, tvm_ffi\ntvm_ffi.load_module(sys.argv[1])\n"
    r = subprocess.run([PY, "-c", code, str(fake_lib)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "libcutecc_rt_" in r.stderr  # bound by soname, never by path


@needs_link
def test_links_are_deterministic_and_need_old_glibc_only(tmp_path: Path, runtime_lib: Path,
                                                          fake_lib: Path) -> None:
    from cutecc.toolchain import elf

    again = linker.link_runtime(tmp_path, toolchain()["runtime"])
    assert again.read_bytes() == runtime_lib.read_bytes()
    (tmp_path / "fake.c").write_text(FAKE_DSL_OBJECT)
    compile_c(tmp_path / "fake.c", tmp_path / "fake.o")
    linker.link(tmp_path / "fake.o", tmp_path / "kernel.so", SYMBOL, entry=ENTRY, arch=ARCH, key=KEY,
                runtime=again)
    assert (tmp_path / "kernel.so").read_bytes() == fake_lib.read_bytes()
    tag = elf.manylinux_tag([("rt", runtime_lib.read_bytes()), ("k", fake_lib.read_bytes())])
    assert tag == "manylinux2014_x86_64.manylinux_2_17_x86_64"


def test_the_link_recipe_in_the_key_follows_the_native_sources() -> None:
    def short(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()[:16]

    from cutecc.toolchain import versions as tc

    assert f"3+rt.{short(tc.RUNTIME_SOURCE)}+wrap.{short(tc.WRAPPER_SOURCE)}" == tc.RECIPE_VERSION
    assert toolchain()["link_recipe"] == tc.RECIPE_VERSION
    assert tc.runtime_inputs()["source"] == hashlib.sha256(tc.RUNTIME_SOURCE.read_bytes()).hexdigest()


@needs_link
@pytest.mark.parametrize("text", ['plain', 'quo"te and back\\slash', "tri??graph", "tab\tnew\nline é"])
def test_labels_reach_c_unchanged(tmp_path: Path, text: str) -> None:
    (tmp_path / "p.c").write_text('#include <stdio.h>\nint main(void) { fputs(S, stdout); return 0; }\n')
    subprocess.run([str(TOOLS["zig"]), "cc", "-target", ZIG_TARGET, f"-DS={linker.c_string(text)}",
                    "-o", str(tmp_path / "p"), str(tmp_path / "p.c")], check=True,
                   env={**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(homes.zig())})
    out = subprocess.run([str(tmp_path / "p")], capture_output=True, check=True).stdout
    assert out == text.encode()


# The wrapper ------------------------------------------------------------------------


@needs_link
def test_cuda_errors_name_the_kernel_and_the_error(fake_lib: Path) -> None:
    ok, fault, no_image, bad_arg, launch = call(fake_lib, [[0], [700], [209], [-1], [-2]])
    assert ok is None
    assert fault == ["RuntimeError", WHO + "CUDA error 700 (cudaErrorIllegalAddress): an illegal memory "
                     "access was encountered; the CUDA context of this process is now unusable (a fault "
                     "of this kind may also come from earlier work on the GPU): restart the process"]
    assert no_image == ["RuntimeError", WHO + "CUDA error 209 (cudaErrorNoKernelImageForDevice): no kernel "
                        "image is available for execution on the device"]
    assert bad_arg == ["ValueError", WHO + "Expects 2 parameters when calling: `f(x: Tensor)`"]
    assert launch[0] == "RuntimeError" and launch[1].startswith(
        WHO + "invalid launch configuration (block_threads > max_threads_per_block): grid (1, 1, 1), "
        "block (2048, 1, 1) = 2048 threads, 0 bytes of dynamic shared memory; GPU 0 allows 1024 "
        "threads per block"), launch[1]
    assert launch[1].endswith("launched at k.py:12:5")


@needs_link
@pytest.mark.parametrize("value", ["0", "off", " No ", "FALSE", ""])
def test_check_mode_off_never_synchronises(fake_lib: Path, value: str) -> None:
    # Without a driver any synchronisation would fail, so success means none was tried.
    assert call(fake_lib, [[0], [0]], env={"CUTECC_SYNC_CHECK": value}) == [None, None]


@needs_link
@pytest.mark.skipif(HAS_DRIVER, reason="needs a machine without a CUDA driver, where a sync must fail")
@pytest.mark.parametrize("value", ["1", "yes", "on"])
def test_check_mode_synchronises_after_the_kernel_and_names_it(fake_lib: Path, value: str) -> None:
    first, second = call(fake_lib, [[0], [0]], env={"CUTECC_SYNC_CHECK": value})
    for got in (first, second):
        assert got is not None and got[0] == "RuntimeError"
        assert got[1].startswith(WHO + "CUDA error 35 (cudaErrorInsufficientDriver)"), got[1]
        assert "seen by CUTECC_SYNC_CHECK when synchronising the stream after this kernel" in got[1]


def test_check_mode_keeps_kernels_out_of_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    from cutecc.runtime.runtime_settings import RuntimeSettings

    monkeypatch.delenv("CUTECC_SYNC_CHECK", raising=False)
    assert not RuntimeSettings.from_environment().sync_check
    for value, on in [("1", True), ("on", True), (" off ", False), ("0", False)]:
        monkeypatch.setenv("CUTECC_SYNC_CHECK", value)
        assert RuntimeSettings.from_environment().sync_check is on


# The fault kernels of the GPU suite --------------------------------------------------


@needs_link
@pytest.mark.usefixtures("dsl")  # compiles the fault kernels
def test_the_fault_kernels_build_and_lower_and_other_archs_are_set_aside(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="building needs the DSL")
    from helpers import run_cli

    cache = tmp_path / "faults"
    r = run_cli("build", str(FAULTS), "--cache-dir", str(cache), "--no-lock", "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    built = {(e["kernel"], e["arch"]) for e in json.loads(r.stdout)["entries"]}
    assert built == {("shifted_copy", "sm_90a"), ("doubled_or_trap", "sm_90a"),
                     ("copy_elsewhere", "sm_100a"), ("copy_elsewhere", "sm_80"),
                     ("tuned_copy", "sm_90a")}  # its tuning candidates: `cutecc tune`
    code = (
        "import sys, jax, jax.numpy as jnp, cutecc\n"
        "ks = cutecc.load(sys.argv[1], arch='sm_90a')\n"
        "s = jax.ShapeDtypeStruct((1000,), jnp.float32)\n"
        "print(jax.jit(lambda x: ks.shifted_copy(x, shift=1 << 40)).trace(s)"
        ".lower(lowering_platforms=('cuda',)).as_text())\n")
    r = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "shift = 1099511627776 : i64" in r.stdout
    ks = cutecc.load(cache, arch="sm_90")
    with pytest.raises(CuteccError) as err:
        ks.copy_elsewhere.select()
    text = str(err.value)
    assert "built for sm_100a, cannot run on sm_90" in text and "built for sm_80, cannot run on sm_90" in text
    assert "cutecc build --arch" in text
