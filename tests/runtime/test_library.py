"""Integrity before code runs; entries that cannot run here are reported, never loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import PY

import cutecc
from cutecc.errors import CuteccError
from cutecc.store import Store

CALL_MUL = (
    "import cutecc, jax, jax.numpy as jnp, sys\n"
    "ks = cutecc.load(sys.argv[1], arch='sm_90a')\n"
    "s = jax.ShapeDtypeStruct((16,), jnp.float32)\n"
    "try:\n"
    "    jax.jit(ks.mul).trace(s, s).lower(lowering_platforms=('cuda',))\n"
    "    print('LOWERED')\n"
    "except cutecc.CuteccError as e:\n"
    "    print('REFUSED', e)\n"
    "maps = open('/proc/self/maps').read()\n"
    "print('MAPPED' if 'cutecc_' in maps else 'NOT-MAPPED')\n"
)


def _f32_mul_entry(cache: Path):
    return next(e for e in Store(cache).entries()
                if e.doc["kernel"] == "mul" and e.doc["variant"] == "dtype=float32")


def _run(cache: Path) -> str:
    r = subprocess.run([PY, "-c", CALL_MUL, str(cache)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def cache_copy(example_cache: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(example_cache, tmp_path / "cache"))


def test_intact_library_loads(cache_copy: Path) -> None:
    out = _run(cache_copy)
    assert "LOWERED" in out and "MAPPED" in out


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "swap"])
def test_damaged_library_is_refused_and_never_mapped(cache_copy: Path, damage: str) -> None:
    e = _f32_mul_entry(cache_copy)
    lib = e.path / "kernel.so"
    data = bytearray(lib.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        lib.write_bytes(bytes(data))
    elif damage == "truncate":
        lib.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "delete":
        lib.unlink()
    else:  # another entry's library in its place
        other = next(x for x in Store(cache_copy).entries() if x.key != e.key)
        shutil.copyfile(other.path / "kernel.so", lib)
    out = _run(cache_copy)
    assert "REFUSED" in out and "NOT-MAPPED" in out
    assert e.key[:12] in out
    assert ("SHA-256" in out) if damage != "delete" else ("cannot read" in out)


def test_entries_for_another_arch_are_reported_at_call(example_cache: Path) -> None:
    ks = cutecc.load(example_cache, arch="sm_100a")
    assert ks.problems and all("cannot run on sm_100a" in p for p in ks.problems)
    with pytest.raises(CuteccError, match=r"built for sm_90a, cannot run on sm_100a.*--arch sm_100a"):
        ks.mul.select()
    with pytest.raises(CuteccError, match="entries unusable here"):
        cutecc.load(example_cache, arch="sm_100a", strict=True)


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("cutecc_artifact_format", "0", "artifact format '0'"),
    ("apache-tvm-ffi", "0.0.9", "built against apache-tvm-ffi 0.0"),
])
def test_incompatible_artifacts_are_reported(cache_copy: Path, field: str, value: str, fragment: str) -> None:
    e = _f32_mul_entry(cache_copy)
    meta = json.loads((e.path / "meta.json").read_text())
    meta["toolchain"][field] = value
    (e.path / "meta.json").write_text(json.dumps(meta))
    ks = cutecc.load(cache_copy, arch="sm_90a")
    assert any(fragment in p for p in ks.problems)
    assert "dtype=float32" not in ks.mul.variants and "dtype=float16" in ks.mul.variants


def test_load_without_gpu_or_arch_says_how(example_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jax
    if jax.default_backend() != "cpu":
        pytest.skip("CPU-only message")
    monkeypatch.delenv("CUTECC_ARCH", raising=False)
    with pytest.raises(CuteccError, match="no GPU is visible to JAX: pass arch="):
        cutecc.load(example_cache)


def test_load_does_not_open_libraries(example_cache: Path) -> None:
    code = ("import cutecc, sys\n"
            "ks = cutecc.load(sys.argv[1], arch='sm_90a')\n"
            "print(len(ks), 'cutecc_' in open('/proc/self/maps').read())\n")
    out = subprocess.run([PY, "-c", code, str(example_cache)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["4", "False"]


FAKE = "import os\nopen(os.environ['MARKER'], 'w').close()\nraise ImportError('fake')\n"


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("module", ["torch", "cuda.bindings"])
def test_first_call_does_not_import_tvm_ffis_optional_interop(
        example_cache: Path, tmp_path: Path, allow: bool, module: str) -> None:
    """apache-tvm-ffi imports torch and cuda-python when it can (seconds and tens of ms on a
    GPU host) for interop cutecc never uses; cutecc hides them from that import."""
    pkg = tmp_path / "site" / Path(*module.split("."))
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE)
    marker = tmp_path / "was-imported"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "MARKER": str(marker)}
    if allow:
        env["CUTECC_TVM_FFI_TORCH"] = "1"
    r = subprocess.run([PY, "-c", CALL_MUL, str(example_cache)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "LOWERED" in r.stdout and "MAPPED" in r.stdout
    assert marker.exists() is allow


# The runtime library ------------------------------------------------------------------

def _runtime_lib(cache: Path) -> Path:
    [rt] = list(Store(cache).runtimes())
    return rt.path / rt.doc["library"]


@pytest.mark.parametrize("damage", ["flip", "delete", "meta"])
def test_a_damaged_runtime_library_is_refused_before_any_library_is_mapped(cache_copy: Path,
                                                                          damage: str) -> None:
    lib = _runtime_lib(cache_copy)
    if damage == "flip":
        data = bytearray(lib.read_bytes())
        data[len(data) // 2] ^= 0x01
        lib.write_bytes(bytes(data))
    elif damage == "delete":
        lib.unlink()
    else:  # its metadata no longer describes its key
        meta = json.loads((lib.parent / "meta.json").read_text())
        meta["key_inputs"]["zig"] = "0.0.0"
        (lib.parent / "meta.json").write_text(json.dumps(meta))
    out = _run(cache_copy)
    assert "REFUSED" in out and "NOT-MAPPED" in out and "runtime library" in out
    assert {"flip": "SHA-256", "delete": "cannot read", "meta": "do not hash to"}[damage] in out


def test_one_runtime_library_serves_every_kernel_and_torch_and_cuda_python_stay_out(
        example_cache: Path) -> None:
    code = (
        "import cutecc, jax, jax.numpy as jnp, sys\n"
        "ks = cutecc.load(sys.argv[1], arch='sm_90a')\n"
        "s = jax.ShapeDtypeStruct((16,), jnp.float32)\n"
        "jax.jit(lambda a, b: (ks.mul(a, b), ks.axpy(a, b, alpha=2.0))).trace(s, s)"
        ".lower(lowering_platforms=('cuda',))\n"
        "maps = [ln.split()[-2] for ln in open('/proc/self/maps') if 'libcutecc_rt_' in ln]\n"
        "kernels = {ln.split()[4] for ln in open('/proc/self/maps') if 'memfd:cutecc_' in ln}\n"
        "print(len(set(maps)), len(kernels), 'cuda.bindings' in sys.modules, 'torch' in sys.modules)\n")
    out = subprocess.run([PY, "-c", code, str(example_cache)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2", "False", "False"], out.stdout
