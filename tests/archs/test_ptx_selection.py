"""Which build a GPU gets when a variant is built as machine code and as portable PTX:
exact machine code, then PTX, then the kernel's fallback (the runtime's rule, with
stand-in builds); and `cutecc list --gpu` / `cutecc show --gpu` say the same."""

from __future__ import annotations

import warnings
from pathlib import Path

import jax.numpy as jnp
import pytest
from helpers import fallback_manifest

import cutecc
from cutecc.commands.build import build
from cutecc.commands.list import list_entries
from cutecc.commands.show import show
from cutecc.errors import CuteccError, FallbackWarning

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


@pytest.fixture
def cache(fallback_project: Path) -> Path:
    fallback_project.write_text(fallback_manifest(archs=["sm_90a", "compute_80"]))
    cache = fallback_project.parent.parent / "cache"
    assert build(fallback_project, cache_dir=cache).ok
    return cache


@pytest.mark.parametrize(("gpu", "gets"), [("sm_90", "sm_90a"), ("sm_89", "compute_80"),
                                           ("sm_100", "compute_80"), ("sm_75", None)])
def test_machine_code_then_ptx_then_the_fallback(cache: Path, gpu: str, gets: str | None) -> None:
    k = cutecc.load(cache, arch=gpu).scale
    x = jnp.zeros((2, 64), jnp.float32)
    if gets is None:
        assert not k.builds
        with pytest.warns(FallbackWarning, match=f"no build for {gpu}"):
            assert k._served_by_fallback([x], {}, {})[0]
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        assert k._served_by_fallback([x], {}, {}) == (False, None)
    assert k.select(x)[0].arch == gets


def test_list_and_show_say_what_a_gpu_gets(cache: Path) -> None:
    rows = {r.arch: r.on_gpu for r in list_entries(cache, kernel="scale", gpu="sm_89")}
    assert rows == {"compute_80": "* yes: PTX, compiled by the driver at load", "sm_90a": "no"}
    rows = {r.arch: r.on_gpu for r in list_entries(cache, kernel="scale", gpu="sm_90")}
    assert rows["sm_90a"] == "* yes: arch-specific code, exact chip"
    assert rows["compute_80"] == "yes: PTX, compiled by the driver at load"
    assert "ON sm_90" in "\n".join(list_entries(cache, gpu="sm_90").lines())
    key = next(r.key for r in list_entries(cache, kernel="scale") if r.arch == "compute_80")
    shown = show(key[:12], cache, gpu="sm_90")
    assert shown["on_gpu"] == {"gpu": "sm_90", "runs": "yes: PTX, compiled by the driver at load"}
    assert "on sm_90   yes: PTX" in "\n".join(shown.lines())
    with pytest.raises(CuteccError, match="names portable PTX, not a GPU"):
        list_entries(cache, gpu="compute_80")
