"""The GPU a process sees: its arch asked of the CUDA driver (no JAX backend started) only
where JAX would use that same GPU, else of JAX. A stand-in driver library, built with zig
from C, answers the driver's four calls as a chosen GPU would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cutecc import archs

DRIVER_C = r"""
static int fail_init = FAIL_INIT, count = COUNT, major = MAJOR, minor = MINOR;
int cuInit(unsigned flags) { return fail_init ? 100 : 0; }
int cuDeviceGetCount(int *n) { *n = count; return 0; }
int cuDeviceGet(int *dev, int ordinal) { if (ordinal >= count) return 101; *dev = ordinal; return 0; }
int cuDeviceGetAttribute(int *value, int attr, int dev) {
    if (attr == 75) { *value = major; return 0; }
    if (attr == 76) { *value = minor; return 0; }
    return 1;
}
"""


def _driver(tmp_path: Path, *, major: int = 9, minor: int = 0, count: int = 1, fail_init: int = 0) -> str:
    pytest.importorskip("ziglang", reason="the stand-in driver is built with zig (the build extra)")
    src = tmp_path / "cuda.c"
    src.write_text(DRIVER_C.replace("FAIL_INIT", str(fail_init)).replace("COUNT", str(count))
                   .replace("MAJOR", str(major)).replace("MINOR", str(minor)))
    lib = tmp_path / f"libcuda-{major}{minor}-{count}-{fail_init}.so"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-shared", "-fPIC", "-o", str(lib), str(src)],
                   check=True, capture_output=True, timeout=300)
    return str(lib)


def test_the_driver_names_its_first_devices_arch(tmp_path: Path) -> None:
    assert archs.driver_arch(_driver(tmp_path, major=9, minor=0)) == "sm_90"
    assert archs.driver_arch(_driver(tmp_path, major=10, minor=0)) == "sm_100"
    assert archs.driver_arch(_driver(tmp_path, major=8, minor=6)) == "sm_86"


def test_no_driver_no_device_or_a_failing_driver_is_no_answer(tmp_path: Path) -> None:
    assert archs.driver_arch(str(tmp_path / "libcuda-missing.so")) is None
    assert archs.driver_arch(_driver(tmp_path, count=0)) is None
    assert archs.driver_arch(_driver(tmp_path, fail_init=1)) is None
    assert archs.driver_arch(_driver(tmp_path, major=0, minor=0)) is None  # not a compute capability


@pytest.mark.parametrize(("platforms", "plugin", "uses"), [
    (None, True, True), ("", True, True), ("cuda", True, True), ("cuda,cpu", True, True),
    ("gpu", True, True), ("cpu", True, False), ("tpu,cpu", True, False), (None, False, False)])
def test_the_driver_is_asked_only_where_jax_would_use_its_first_gpu(
        monkeypatch: pytest.MonkeyPatch, platforms: str | None, plugin: bool, uses: bool) -> None:
    monkeypatch.setattr(archs, "_has_cuda_plugin", lambda: plugin)
    assert archs.jax_uses_driver_order(SimpleNamespace(jax_platforms=platforms)) is uses


def test_a_jax_without_cuda_learns_no_arch_from_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """On this host (no CUDA plugin, or no GPU): JAX has no GPU, and the answer is None."""
    import jax

    monkeypatch.delenv("CUTECC_ARCH", raising=False)
    if archs.jax_uses_driver_order(jax.config) and archs.driver_arch() is not None:
        pytest.skip("a GPU and JAX's CUDA plugin are here (tests/gpu covers that)")
    assert archs.device_arch() is None
