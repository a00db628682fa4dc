"""The examples' quack RMSNorm and cross-entropy declare jnp fallbacks
(examples/quack_reference.py): a call outside their built contracts (another hidden size or
vocabulary) returns the reference result on fresh random inputs, warns once per signature,
and jax.grad differentiates it; a call the contract takes does not reach the fallback.
On the CPU: the kernels are the manifest's contracts with nothing built behind them
(`helpers.unbuilt_kernels`), so only the fallback path can run here."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import REPO, unbuilt_kernels

from cutecc.build.builder import fallback_refs
from cutecc.errors import FallbackWarning
from cutecc.manifest import load_manifest
from cutecc.runtime.fallback import Fallback

EXAMPLES = REPO / "examples"


@pytest.fixture
def ks(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The examples' kernels, each with the fallback its manifest declares (as a build records it)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("quack_reference", None)
    kernels = unbuilt_kernels(EXAMPLES / "kernels.toml")
    for name, refs in fallback_refs(load_manifest(EXAMPLES / "kernels.toml")).items():
        kernels[name]._fallback = Fallback(name, refs["fallback"], arch="sm_90a", strict=False,
                                           misses_root=None, roots=[EXAMPLES],
                                           contracts=[b.conv for b in kernels[name].builds])
    yield kernels
    sys.modules.pop("quack_reference", None)


def _rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype)


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x, w = x.astype(np.float64), w.astype(np.float64)
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize(("dtype", "tol"), [("bfloat16", 1e-2), ("float32", 1e-5)])
def test_rmsnorm_outside_its_contract_is_its_reference(ks: dict[str, Any], dtype: str, tol: float) -> None:
    rng = np.random.default_rng()
    x, w = _rand(rng, (37, 1024), dtype), _rand(rng, (1024,), dtype)  # d = 1024: only 4096 was built
    said = r'"quack_rmsnorm" \(' + dtype + r"\[37, 1024\].*quack_reference"
    with pytest.warns(FallbackWarning, match=said):
        out = ks["quack_rmsnorm"](x, w, eps=1e-5)
    assert out.dtype == jnp.dtype(dtype) and out.shape == (37, 1024)
    want = _rmsnorm(np.asarray(x, np.float64), np.asarray(w, np.float64), 1e-5)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=tol, atol=tol)
    with warnings.catch_warnings():  # once per signature: under jit and again eagerly, silent
        warnings.simplefilter("error", FallbackWarning)
        again = jax.jit(lambda x, w: ks["quack_rmsnorm"](x, w, eps=1e-5))(x, w)
    np.testing.assert_array_equal(np.asarray(again, np.float32), np.asarray(out, np.float32))


def test_rmsnorm_grad_outside_its_contract_differentiates_the_reference(ks: dict[str, Any]) -> None:
    rng = np.random.default_rng()
    x, w = _rand(rng, (16, 1024), "float32"), _rand(rng, (1024,), "float32")
    ct = _rand(rng, (16, 1024), "float32")
    with pytest.warns(FallbackWarning):
        got = jax.grad(lambda x, w: (ks["quack_rmsnorm"](x, w, eps=1e-6) * ct).sum(), argnums=(0, 1))(x, w)
    xs, ws, c = (np.asarray(a, np.float64) for a in (x, w, ct))  # written out: d/dx, d/dw of sum(c * y)
    r = 1 / np.sqrt((xs ** 2).mean(-1, keepdims=True) + 1e-6)
    g = c * ws
    dx = r * g - xs * r ** 3 * (g * xs).mean(-1, keepdims=True)
    dw = (c * xs * r).sum(0)
    np.testing.assert_allclose(np.asarray(got[0]), dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(got[1]), dw, rtol=1e-4, atol=1e-3)


def test_cross_entropy_outside_its_contract_is_its_reference(ks: dict[str, Any]) -> None:
    rng = np.random.default_rng()
    m, vocab = 29, 1000  # only 32768 was built
    logits = _rand(rng, (m, vocab), "bfloat16")
    target = jnp.asarray(rng.integers(0, vocab, m), jnp.int32).at[3].set(-100).at[7].set(-100)
    with pytest.warns(FallbackWarning, match=r"quack_cross_entropy.*bfloat16\[29, 1000\], int32\[29\]"):
        loss = ks["quack_cross_entropy"](logits, target)
    lf, t = np.asarray(logits, np.float64), np.asarray(target)
    keep = t != -100
    lse = np.log(np.exp(lf - lf.max(-1, keepdims=True)).sum(-1)) + lf.max(-1)
    want = np.where(keep, lse - lf[np.arange(m), np.where(keep, t, 0)], 0.0)
    assert loss.dtype == jnp.float32 and loss.shape == (m,)
    np.testing.assert_allclose(np.asarray(loss), want, rtol=1e-5, atol=1e-5)
    # jax.grad: softmax minus the target's one-hot per kept row, nothing for ignored rows
    dl = jax.grad(lambda lg: ks["quack_cross_entropy"](lg.astype(jnp.bfloat16), target).sum())(
        logits.astype(jnp.float32))
    p = np.exp(lf - lse[:, None])
    p[np.arange(m), np.where(keep, t, 0)] -= 1
    want_g = np.where(keep[:, None], p, 0.0)
    np.testing.assert_allclose(np.asarray(dl), want_g, rtol=1e-2, atol=1e-4)  # a bf16 gradient
    # an ignore_index of the caller's is honoured too
    other = ks["quack_cross_entropy"](logits, target.at[0].set(5), ignore_index=5)
    assert float(other[0]) == 0.0


def test_a_call_the_contract_takes_does_not_reach_the_fallback(ks: dict[str, Any]) -> None:
    x, w = jnp.zeros((8, 4096), jnp.bfloat16), jnp.zeros((4096,), jnp.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        assert ks["quack_rmsnorm"]._served_by_fallback([x, w], {}, {}) == (False, None)
        logits, t = jnp.zeros((8, 32768), jnp.bfloat16), jnp.zeros((8,), jnp.int32)
        assert ks["quack_cross_entropy"]._served_by_fallback([logits, t], {}, {}) == (False, None)
    assert "quack_reference" not in sys.modules  # imported at a miss only


def test_the_reference_module_needs_neither_quack_nor_torch() -> None:
    src = Path(EXAMPLES / "quack_reference.py").read_text()
    assert "import quack" not in src and "torch" not in src.replace("PyTorch", "")
