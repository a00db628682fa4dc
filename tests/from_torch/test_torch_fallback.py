"""cutecc.torch serves a kernel's `fallback_torch` where no build fits a call, as the JAX
front end serves `fallback`: the result is the fallback's, autograd differentiates it, the
miss warns once and is counted once per signature and process (eager calls have no trace).
Runs where torch is installed; CPU tensors, since the fallback path never launches."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from helpers import fallback_manifest, opts  # noqa: E402

import cutecc.torch as ct  # noqa: E402
from cutecc.commands.build import build  # noqa: E402
from cutecc.errors import FallbackWarning  # noqa: E402
from cutecc.store.misses import read_misses  # noqa: E402

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


def test_fallback_torch_serves_a_call_no_build_fits(fallback_project: Path) -> None:
    fallback_project.write_text(fallback_manifest(fallback_torch="toyfb.ref_torch:scale"))
    cache = fallback_project.parent.parent / "cache"
    assert build(fallback_project, opts(cache_dir=cache)).ok
    ks = ct.load(cache, arch="sm_90a")
    x = torch.randn(3, 32, requires_grad=True)
    with pytest.warns(FallbackWarning, match="toyfb.ref_torch:scale"):
        out = ks.scale(x, factor=2.0)
    torch.testing.assert_close(out, torch.sin(x) * 2.0)
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2.0 * torch.cos(x.detach()))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        ks.scale(torch.randn(3, 32), factor=2.0)
    (m,) = read_misses(cache)
    assert m.count == 1 and m.arrays == (("float32", (3, 32)),)
