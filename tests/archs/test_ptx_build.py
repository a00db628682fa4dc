"""A `compute_80` build through the DSL (tests/gpu/arch_kernels' scale_ptx): its library
carries the kernel's PTX for sm_80 and no cubin, so any newer GPU's driver compiles it at
load; a process loading for sm_90 (an H100) offers it and lowers a call to its custom call.
Running it is the GPU suite's (tests/gpu/test_fallback_gpu.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import REPO, opts

import cutecc
from cutecc import cubin
from cutecc.commands.build import build
from cutecc.runtime.library import target_name
from cutecc.store.view import StoreView


def test_a_compute_80_build_carries_ptx_and_lowers_for_an_h100(dsl: None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "tests" / "gpu"))
    sys.modules.pop("arch_kernels", None)
    r = build(REPO / "tests" / "gpu" / "arch_kernels" / "kernels.toml", opts(cache_dir=tmp_path / "c"),
              lock=False)
    assert r.ok, r.warnings()
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", "none")  # a CPU host's: PTX is not judged
    ks = cutecc.load(tmp_path / "c", arch="sm_90")
    (b,) = ks.scale_ptx.builds
    lib = b.library.read_bytes()
    assert b.arch == "compute_80" and cubin.cubins(lib) == [] and cubin.ptx_targets(lib) == ["sm_80"]
    # the build records the PTX's ISA (nvidia-cutlass-dsl 4.8.1 writes 9.4), which a CUDA 13.0
    # driver (the lent machines') cannot JIT-compile: there the entry is set aside
    entry = StoreView(tmp_path / "c").get(b.key)
    assert entry is not None and entry.meta.ptx_isa == cubin.ptx_isa(lib) == "9.4"
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", "13.0")
    old = cutecc.load(tmp_path / "c", arch="sm_90")
    assert not old.scale_ptx.builds
    assert any("PTX ISA 9.4 needs a CUDA 13.4 driver" in p for p in old.problems), old.problems
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", "none")
    assert b"\0" in lib[lib.index(b".target sm_80"):]  # NUL-terminated, as the driver reads PTX
    text = jax.jit(lambda x: ks.scale_ptx(x, factor=2.0)).trace(
        jax.ShapeDtypeStruct((1000,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    assert target_name(b.key) in text
    assert not ks.scale_b200.builds  # the sm_100a one: nothing for sm_90 (its fallback serves)
