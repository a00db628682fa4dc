"""The root manifest built for aarch64 (Grace) hosts on this x86-64 host.

Every library is checked from its ELF headers (machine, needed libraries, exported
symbols, glibc symbol versions); a second build from another directory gives the same
bytes; and, where qemu-user and an aarch64 glibc are installed (Debian: qemu-user,
libc6-arm64-cross, libstdc++6-arm64-cross), every kernel is loaded and called under
qemu-aarch64 against the pinned aarch64 libtvm_ffi.so: tvm-ffi's argument checks must
refuse a wrong call by argument, and pass a right one, which then fails only for lack of
a CUDA driver. No GPU runs here: docs/shipping.md says how a Grace user checks a pack.
"""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, opts

from cutecc.errors import CuteccError

pytestmark = pytest.mark.usefixtures("dsl")  # it compiles: slow by the one rule

QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")
HARNESS = Path(__file__).with_name("qemu_call.c")
EXPORTED_BY_KERNELS = {"__tvm_ffi_cutecc_kernel"}
GLIBC_LIBS = {"libc.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libm.so.6",
              "ld-linux-aarch64.so.1"}
# DLDataTypeCode and bits of each dtype a root kernel takes.
DL_DTYPES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "int32": (0, 32)}


def _project(dest: Path) -> Path:
    proj = dest / "proj"
    proj.mkdir(parents=True)
    shutil.copytree(REPO / "kernels", proj / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "kernels.toml", proj / "kernels.toml")
    return proj / "kernels.toml"


def _build(manifest: Path, cache: Path, kernels: tuple[str, ...] = (),
           lock_file: Path | None = None) -> None:
    pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
    from cutecc.commands.build import build

    report = build(manifest, opts(cache_dir=cache, jobs=2), platforms=("aarch64",), kernels=kernels,
                   lock_file=lock_file)
    assert report.ok, [o.error for o in report.outcomes if o.error]


@pytest.fixture(scope="module")
def grace(tmp_path_factory: pytest.TempPathFactory, dsl: None) -> tuple[Path, Path]:
    """The root manifest built for aarch64 only: (manifest, cache)."""
    root = tmp_path_factory.mktemp("grace")
    manifest = _project(root)
    _build(manifest, root / "c")
    return manifest, root / "c"


@pytest.fixture(scope="module")
def grace_examples(tmp_path_factory: pytest.TempPathFactory, examples_extra: None,
                   dsl: None) -> tuple[Path, Path]:
    """examples/kernels.toml built for aarch64 only: (lock file, cache). The cache is
    $CUTECC_GRACE_EXAMPLES_CACHE when set (built beforehand: this build then only plans)."""
    root = tmp_path_factory.mktemp("grace-examples")
    cache = Path(os.environ.get("CUTECC_GRACE_EXAMPLES_CACHE") or root / "c")
    _build(REPO / "examples" / "kernels.toml", cache, lock_file=root / "kernels.lock")
    return root / "kernels.lock", cache


def _libraries(cache: Path, lock_path: Path | None = None) -> tuple[list[tuple[object, Path]], list[Path]]:
    """(lock line, kernel library) of each locked entry, and the runtime libraries."""
    from cutecc.lock.lockfile import read_lock
    from cutecc.store import Store

    store = Store(cache)
    lock = read_lock(lock_path or cache.parent / "proj" / "kernels.lock")
    kernels = [(le, e.path / le.pin.library) for e, le in lock.resolve(store)]
    runtimes = sorted(p for p in cache.glob("runtimes/*/*/libcutecc_rt_*.so") if _machine(p) == 183)
    return kernels, runtimes


def _machine(path: Path) -> int:
    with open(path, "rb") as f:
        head = f.read(20)
    return int(struct.unpack_from("<H", head, 18)[0])


def _dynamic(data: bytes) -> tuple[int, list[str], set[str]]:
    """(e_machine, DT_NEEDED names, defined global/weak default-visibility dynamic symbols)."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    e_type, machine = struct.unpack_from("<HH", data, 16)
    assert e_type == 3  # ET_DYN
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table: tuple[int, ...], at: int) -> str:
        start = table[4] + at
        return data[start:data.index(b"\0", start)].decode()

    needed, exported = [], set()
    for sh in sections:
        if sh[1] == 6:  # SHT_DYNAMIC
            strtab = sections[sh[6]]
            for off in range(sh[4], sh[4] + sh[5], 16):
                tag, val = struct.unpack_from("<qQ", data, off)
                if tag == 1:
                    needed.append(string(strtab, val))
        if sh[1] == 11:  # SHT_DYNSYM
            strtab = sections[sh[6]]
            for off in range(sh[4], sh[4] + sh[5], 24):
                name, info, other, shndx = struct.unpack_from("<IBBH", data, off)
                if shndx != 0 and info >> 4 in (1, 2) and other & 3 == 0 and name:
                    exported.add(string(strtab, name))
    return machine, needed, exported


def test_every_root_kernel_is_locked_for_aarch64(grace: tuple[Path, Path]) -> None:
    from cutecc.lock.lockfile import read_lock

    manifest, _ = grace
    lock = read_lock(manifest.parent / "kernels.lock")
    x86 = read_lock(REPO / "kernels.lock")
    assert {e.platform for e in lock.entries} == {"aarch64"}
    assert {(e.kernel, e.variant, e.arch) for e in lock.entries} == \
        {(e.kernel, e.variant, e.arch) for e in x86.entries}
    assert not {e.key for e in lock.entries} & {e.key for e in x86.entries}


def test_every_aarch64_library_is_an_aarch64_shared_object_that_needs_only_what_it_should(
        grace: tuple[Path, Path]) -> None:
    from cutecc.toolchain.elf import glibc_minor, manylinux_tag
    from cutecc.toolchain.versions import RUNTIME_EXPORTS

    kernels, runtimes = _libraries(grace[1])
    assert len(runtimes) == 1 and kernels
    rt = runtimes[0]
    machine, needed, exported = _dynamic(rt.read_bytes())
    assert machine == 183  # EM_AARCH64
    assert "libtvm_ffi.so" in needed and set(needed) - {"libtvm_ffi.so"} <= GLIBC_LIBS, needed
    assert "cutecc_rt_abi_version" in exported and "CuteDSLRT_TVMFFISetRaisedCudaError" in exported
    assert all(any(s.startswith(g.rstrip("*")) for g in RUNTIME_EXPORTS) for s in exported), exported
    for le, lib in kernels:
        machine, needed, exported = _dynamic(lib.read_bytes())
        assert machine == 183, le
        assert needed == [rt.name, "libtvm_ffi.so"] or sorted(needed) == sorted([rt.name, "libtvm_ffi.so"])
        assert exported == EXPORTED_BY_KERNELS, (le, exported)
    libs = [(p.name, p.read_bytes()) for _, p in kernels] + [(rt.name, rt.read_bytes())]
    assert glibc_minor(libs) <= 28  # zig's target: glibc 2.28 at most
    assert manylinux_tag(libs).endswith("_aarch64")


def test_an_entry_whose_platform_is_not_its_keys_is_refused(grace: tuple[Path, Path]) -> None:
    from cutecc.entry.rules import meta_problem
    from cutecc.store import Store

    kernels, _ = _libraries(grace[1])
    le = kernels[0][0]
    meta = Store(grace[1]).get(le.key).doc  # type: ignore[attr-defined, union-attr]
    assert meta["platform"] == "aarch64" and meta_problem(meta, le.key) is None  # type: ignore[attr-defined]
    for damaged in ({**meta, "platform": "x86_64"}, {k: v for k, v in meta.items() if k != "platform"}):
        assert "differs from the key's 'aarch64'" in str(meta_problem(damaged, le.key))  # type: ignore[attr-defined]


def test_a_second_build_elsewhere_gives_the_same_bytes(grace: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    """Reproducible across builds: another project directory and cache, same keys and bytes
    (two kernels: one with a runtime scalar and an inout tensor, one with a factory)."""
    from cutecc.lock.lockfile import read_lock

    manifest = _project(tmp_path)
    _build(manifest, tmp_path / "c", kernels=("axpy", "rmsnorm"))
    first = {e.key: (e.pin.sha256, e.pin.runtime)
             for e in read_lock(grace[0].parent / "kernels.lock").entries}
    again = read_lock(manifest.parent / "kernels.lock").entries
    assert len(again) == 5
    assert all(first[e.key] == (e.pin.sha256, e.pin.runtime) for e in again)


def _harness(tmp: Path) -> tuple[Path, Path]:
    """The qemu_call harness built for aarch64, and the directory of libtvm_ffi.so."""
    from cutecc.toolchain import targetlibs
    from cutecc.toolchain.versions import toolchain_paths

    zig, libs = toolchain_paths()["zig"], targetlibs.paths("aarch64")
    out = tmp / "qemu_call"
    r = subprocess.run([str(zig), "cc", "-target", "aarch64-linux-gnu.2.28", "-O1", "-o", str(out),
                        str(HARNESS), f"-I{libs['tvm_include']}", f"-L{libs['tvm_lib']}", "-ltvm_ffi",
                        "-ldl"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out, libs["tvm_lib"]


def _call_args(meta: dict[str, object], wrong_dtype: bool = False) -> list[str]:
    """The harness's arguments for a right call of the entry (its canonical order: inputs,
    results, scalars), every symbolic extent 4096 or a multiple of it; `wrong_dtype`: the first tensor of
    another dtype."""
    from cutecc.contract.args import CallingConvention, args_from_json

    conv = CallingConvention.of(args_from_json(meta["args"]))  # type: ignore[arg-type]
    tensors = (*conv.ffi_inputs, *conv.ffi_results)
    value: dict[str, int] = {}  # each symbol: 4096, or a multiple of what it is declared a multiple of
    for t in tensors:
        for i, d in enumerate(t.extents):
            if isinstance(d, str):
                value[d] = math.lcm(value.get(d, 4096), t.multiple(i))
    out = []
    for t in tensors:
        dims = [d if isinstance(d, int) else value[d] for d in (t.extents[p] for p in t.perm)]
        code, bits = DL_DTYPES[t.dtype]
        if wrong_dtype and not out:
            code, bits = (2, 64)
        out.append(f"t:{code}:{bits}:" + "x".join(map(str, dims)))
    for s in conv.scalars:
        out.append("f:1.0" if s.dtype.startswith(("float", "bfloat")) else "i:1")
    return out


needs_qemu = pytest.mark.skipif(
    QEMU is None or not (SYSROOT / "lib" / "libstdc++.so.6").is_file(),
    reason="needs qemu-user, libc6-arm64-cross and libstdc++6-arm64-cross")


def _check_under_qemu(cache: Path, lock_path: Path | None, tmp: Path) -> int:
    """Load and call every locked kernel of `cache` under qemu-aarch64 three ways: no
    arguments and a mistyped first tensor (tvm-ffi refuses both, naming the count or the
    argument), and a right call (the checks pass; the CUDA call fails: no driver here).
    Returns how many kernels were checked."""
    from cutecc.store import Store

    harness, tvm_lib = _harness(tmp)
    kernels, runtimes = _libraries(cache, lock_path)
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join([*(str(r.parent) for r in runtimes), str(tvm_lib)])}
    store = Store(cache)

    def call(lib: Path, *args: str) -> dict[str, str]:
        r = subprocess.run([str(QEMU), "-L", str(SYSROOT), str(harness), str(lib),
                            "__tvm_ffi_cutecc_kernel", *args], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0, (lib, r.stdout, r.stderr)
        lines = r.stdout.splitlines()
        assert lines[0] == "LOADED", r.stdout
        return dict(x.split(" ", 1) for x in lines[1:])

    for le, lib in kernels:
        entry = store.get(le.key)  # type: ignore[attr-defined]
        assert entry is not None
        meta = entry.doc
        right = _call_args(meta)
        none = call(lib)
        assert none["KIND"] == "TypeError" and f"Expects {len(right)} parameters" in none["MESSAGE"], none
        assert f"cutecc kernel {meta['entry']} " in none["MESSAGE"]  # cutecc's wrapper names it
        wrong = call(lib, *_call_args(meta, wrong_dtype=True))
        assert wrong["KIND"] == "ValueError" and "argument #0" in wrong["MESSAGE"], (le, wrong)
        ok = call(lib, *right)
        assert ok["KIND"] == "RuntimeError" and "cudaErrorInsufficientDriver" in ok["MESSAGE"], (le, ok)
    return len(kernels)


@needs_qemu
def test_every_root_kernel_loads_and_checks_its_arguments_under_qemu(grace: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    assert _check_under_qemu(grace[1], None, tmp_path) == 11


@needs_qemu
def test_every_examples_kernel_loads_and_checks_its_arguments_under_qemu(
        grace_examples: tuple[Path, Path], tmp_path: Path) -> None:
    """The published kernels (quack, flash-attn-4 forward and backward) retarget too."""
    lock_path, cache = grace_examples
    assert _check_under_qemu(cache, lock_path, tmp_path) == 15


def test_packs_hold_one_platform_and_the_runtime_serves_only_its_own(grace: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    """A lock naming both platforms (the aarch64 build plus an x86-64 build of axpy) packs
    one platform per wheel, tagged for it; loading it on this x86-64 host serves axpy and
    sets every aarch64 entry aside with the reason."""
    import cutecc
    from cutecc.commands.pack import pack
    from cutecc.lock.lockfile import read_lock

    manifest, cache = grace
    lock = tmp_path / "kernels.lock"
    shutil.copy(manifest.parent / "kernels.lock", lock)
    from cutecc.commands.build import build

    report = build(manifest, opts(cache_dir=cache), platforms=("x86_64",), kernels=("axpy",),
                   lock_file=lock)
    assert report.ok
    both = read_lock(lock)
    assert both.platforms == ("aarch64", "x86_64") and len(both.entries) == 12
    with pytest.raises(CuteccError, match="entries for aarch64 and x86_64; .*pass --platform"):
        pack(name="grace-kernels", version="1.0", lock=lock, cache_dir=cache, out=tmp_path / "d")
    arm = pack(name="grace-kernels", version="1.0", lock=lock, cache_dir=cache, out=tmp_path / "a",
               platform="aarch64")
    assert arm.path.name.endswith("-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl")
    assert {e.platform for e in arm.lock.entries} == {"aarch64"} and len(arm.lock.entries) == 11
    x86 = pack(name="grace-kernels", version="1.0", lock=lock, cache_dir=cache, out=tmp_path / "x",
               platform="x86_64")
    assert x86.path.name.endswith("_x86_64.whl") and [e.kernel for e in x86.lock.entries] == ["axpy"]

    ks = cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    assert ks.axpy.variants == ["default"]
    problems = ks.problems
    assert len(problems) == 11 and all("built for aarch64 hosts, this host is x86_64" in p for p in problems)
    with pytest.raises(CuteccError, match="built for aarch64 hosts"):
        ks.mul(*[])
