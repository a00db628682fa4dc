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
from helpers import REPO

import cutecc
from cutecc import cubin
from cutecc.commands.build import build
from cutecc.runtime.library import target_name


def test_a_compute_80_build_carries_ptx_and_lowers_for_an_h100(dsl: None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "tests" / "gpu"))
    sys.modules.pop("arch_kernels", None)
    r = build(REPO / "tests" / "gpu" / "arch_kernels" / "kernels.toml", cache_dir=tmp_path / "c", lock=False)
    assert r.ok, r.warnings()
    ks = cutecc.load(tmp_path / "c", arch="sm_90")
    (b,) = ks.scale_ptx.builds
    lib = b.library.read_bytes()
    assert b.arch == "compute_80" and cubin.cubins(lib) == [] and cubin.ptx_targets(lib) == ["sm_80"]
    assert b"\0" in lib[lib.index(b".target sm_80"):]  # NUL-terminated, as the driver reads PTX
    text = jax.jit(lambda x: ks.scale_ptx(x, factor=2.0)).trace(
        jax.ShapeDtypeStruct((1000,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    assert target_name(b.key) in text
    assert not ks.scale_b200.builds  # the sm_100a one: nothing for sm_90 (its fallback serves)
