"""The examples' FA4 forward outside its built contract, on a real GPU: its declared jnp
attention fallback (examples/fa4_reference.py) serves the call, forward and under
jax.grad, correct against an independent reference on fresh random inputs; a call the
built kernel takes still runs the kernel (no fallback warning). quack's RMSNorm and
cross-entropy outside theirs (examples/quack_reference.py) likewise. And a kernel built only
for sm_100a (tests/gpu/arch_kernels, `$CUTECC_ARCH_CACHE`) serves its fallback on this
Hopper GPU, correct, eagerly, under jit and jax.grad.

FA4's sequence lengths are symbolic (any s_q, s_k is inside its contract), so the calls
outside it here are another head_dim (64: only 128 was built) and another dtype (float16:
only bfloat16 was built). Needs `$CUTECC_EXAMPLES_CACHE` (tests/gpu/run.sh), built from
an examples/kernels.toml that declares the fallback.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cutecc.errors import FallbackWarning

from .conftest import rand

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ARCH_MANIFEST = Path(__file__).resolve().parent / "arch_kernels" / "kernels.toml"


@pytest.fixture(scope="module")
def ks(examples_ks):
    import sys

    if str(EXAMPLES) not in sys.path:  # where a deployment installs its fallback module
        sys.path.insert(0, str(EXAMPLES))
    if examples_ks.fa4_fwd._fallback is None:
        pytest.skip("the examples cache was built from a kernels.toml without FA4's fallback")
    return examples_ks


def reference(q, k, v, scale: float, causal: bool):  # type: ignore[no-untyped-def]
    """Attention written out in float32 (not the fallback's jax.nn call), bottom-right causal."""
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        s_q, s_k = q.shape[1], k.shape[1]
        keep = jnp.arange(s_k)[None, :] <= jnp.arange(s_q)[:, None] + (s_k - s_q)
        s = jnp.where(keep[None, None], s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def close(got, want, tol: float) -> None:  # type: ignore[no-untyped-def]
    g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert g.shape == w.shape and np.isfinite(g).all()
    err = np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)
    assert err <= tol, f"relative error {err:.3g} > {tol}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("dtype", "d", "tol"), [("bfloat16", 64, 1.6e-2), ("float16", 128, 2e-3)])
def test_fa4_outside_its_contract_is_served_by_its_fallback(ks, rng, dtype: str, d: int, tol: float,
                                                            causal: bool) -> None:
    b, s_q, s_k, h = 2, 200, 333, 4
    q = rand(rng, (b, s_q, h, d), dtype)
    k, v = rand(rng, (b, s_k, h, d), dtype), rand(rng, (b, s_k, h, d), dtype)
    scale = 1 / math.sqrt(d)
    with pytest.warns(FallbackWarning, match="fa4_reference:fa4_fwd"):
        out = jax.jit(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=causal))(q, k, v)
    assert out.dtype == jnp.dtype(dtype) and out.shape == (b, s_q, h, d)
    close(out, reference(q, k, v, scale, causal), tol)

    def loss(f):  # type: ignore[no-untyped-def]
        return lambda q, k, v: (f(q, k, v).astype(jnp.float32) ** 2).sum()

    got = jax.jit(jax.grad(loss(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=scale, causal=causal)),
                           argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(lambda q, k, v: reference(q, k, v, scale, causal).astype(dtype)),
                    argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        assert g.dtype == jnp.dtype(dtype)
        close(g, w, 4 * tol)


def test_a_call_the_build_takes_runs_the_kernel(ks, rng) -> None:
    q, k, v = (rand(rng, (1, 256, 2, 128), "bfloat16") for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out = jax.jit(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=0.088, causal=False))(q, k, v)
        lowered = jax.jit(lambda q, k, v: ks.fa4_fwd(q, k, v, softmax_scale=0.088, causal=False)).lower(
            q, k, v).as_text()
    assert "cutecc_" in lowered  # the kernel's custom call, not the fallback's XLA ops
    close(out, reference(q, k, v, 0.088, False), 1.6e-2)


@pytest.mark.parametrize(("dtype", "tol"), [("bfloat16", 1e-2), ("float32", 1e-5)])
def test_quack_rmsnorm_outside_its_contract_is_served_by_its_fallback(ks, rng, dtype: str,
                                                                      tol: float) -> None:
    if ks.quack_rmsnorm._fallback is None:
        pytest.skip("the examples cache was built from a kernels.toml without quack's fallbacks")
    x, w = rand(rng, (300, 1024), dtype), rand(rng, (1024,), dtype)  # d = 1024: only 4096 was built
    with pytest.warns(FallbackWarning, match="quack_reference:quack_rmsnorm"):
        out = jax.jit(lambda x, w: ks.quack_rmsnorm(x, w, eps=1e-5))(x, w)
    xf, wf = np.asarray(x, np.float64), np.asarray(w, np.float64)
    close(out, xf / np.sqrt((xf ** 2).mean(-1, keepdims=True) + 1e-5) * wf, tol)
    g = jax.jit(jax.grad(lambda x, w: (ks.quack_rmsnorm(x, w).astype(jnp.float32) ** 2).sum(),
                         argnums=(0, 1)))(x, w)
    assert g[0].shape == x.shape and g[1].shape == w.shape and np.isfinite(np.asarray(g[0], np.float32)).all()


def test_quack_cross_entropy_outside_its_contract_is_served_by_its_fallback(ks, rng) -> None:
    if ks.quack_cross_entropy._fallback is None:
        pytest.skip("the examples cache was built from a kernels.toml without quack's fallbacks")
    m, vocab = 64, 1000  # only 32768 was built
    logits = rand(rng, (m, vocab), "bfloat16")
    target = jnp.asarray(rng.integers(0, vocab, m), jnp.int32).at[5].set(-100)
    with pytest.warns(FallbackWarning, match="quack_reference:quack_cross_entropy"):
        loss = jax.jit(ks.quack_cross_entropy)(logits, target)
    lf, t = np.asarray(logits, np.float64), np.asarray(target)
    lse = np.log(np.exp(lf - lf.max(-1, keepdims=True)).sum(-1)) + lf.max(-1)
    want = np.where(t != -100, lse - lf[np.arange(m), np.where(t != -100, t, 0)], 0.0)
    close(loss, want, 1e-5)


@pytest.fixture(scope="module")
def arch_ks(tmp_path_factory: pytest.TempPathFactory):
    """tests/gpu/arch_kernels (a kernel built only for sm_100a) from `$CUTECC_ARCH_CACHE`,
    else built here where the DSL is installed, loaded for this GPU."""
    import cutecc

    pre = os.environ.get("CUTECC_ARCH_CACHE")
    if pre:
        cache = Path(pre)
    else:
        pytest.importorskip("cutlass", reason=f"set CUTECC_ARCH_CACHE to a cache built from {ARCH_MANIFEST}")
        cache = tmp_path_factory.mktemp("arch-cache")
        r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(ARCH_MANIFEST), "--cache-dir",
                            str(cache), "--no-lock"], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr + r.stdout
    here = str(ARCH_MANIFEST.parent.parent)  # where a deployment installs its fallback module
    if here not in sys.path:
        sys.path.insert(0, here)
    return cutecc.load(cache)


def test_a_kernel_built_only_for_sm_100a_serves_its_fallback_here(arch_ks, rng) -> None:
    if arch_ks.arch.startswith("sm_100"):
        pytest.skip(f"this GPU ({arch_ks.arch}) runs the sm_100a build itself")
    k = arch_ks.scale_b200
    assert not k.builds and any("built for sm_100a, cannot run on" in w for w in k.unusable), k.unusable
    x = rand(rng, (100_003,), "float32")
    with pytest.warns(FallbackWarning, match=f"no build for {arch_ks.arch}.*arch_kernels.ref:scale"):
        out = k(x, factor=2.5)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * np.float32(2.5))
    # run from its checked closure (the newest build's pins), not imported from disk
    assert sys.modules["arch_kernels.ref"].__file__ == str(ARCH_MANIFEST.parent / "ref.py")
    assert sys.modules["arch_kernels"].__path__ == []  # nothing unpinned is importable below it
    with warnings.catch_warnings():  # the same signature: warned once
        warnings.simplefilter("error", FallbackWarning)
        out2 = jax.jit(lambda x: k(x, factor=2.5))(x)
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))
    g = jax.jit(jax.grad(lambda x: k(x, factor=3.0).sum()))(x)
    np.testing.assert_array_equal(np.asarray(g), np.full(x.shape, 3.0, np.float32))


def _median_ms(f, *args, n: int = 50) -> float:  # type: ignore[no-untyped-def]
    import time

    f(*args).block_until_ready()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f(*args).block_until_ready()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def _ptx_isa_of(ks, kernel: str) -> str | None:  # type: ignore[no-untyped-def]
    """The PTX ISA of `kernel`'s compute_80 entry, read from its library's PTX."""
    from cutecc.commands.list import list_entries
    from cutecc.cubin import ptx_isa
    from cutecc.store.view import StoreView

    (row,) = [r for r in list_entries(ks.root, kernel=kernel) if r.arch == "compute_80"]
    e = StoreView(ks.root).get(row.key)
    assert e is not None
    return ptx_isa((e.path / e.meta.library.name).read_bytes())


def test_a_ptx_only_build_runs_here_compiled_by_the_driver(arch_ks, rng, record_property) -> None:
    """scale_ptx is built as compute_80 PTX only: where this process's CUDA driver knows its
    PTX ISA, the driver compiles it for this GPU when its library is loaded; it serves calls
    (no fallback), exactly, at a measured speed. Where the driver is older than the PTX (a
    CUDA 13.0 driver takes PTX ISA up to 9.0; nvidia-cutlass-dsl 4.8.1 writes 9.4), the
    entry is set aside at load with that reason and the declared fallback serves, exactly."""
    from cutecc.archs import driver_version, max_ptx_isa, parse_version, show_version

    driver, isa = driver_version(), _ptx_isa_of(arch_ks, "scale_ptx")
    want = parse_version(isa)
    assert driver is not None and isa is not None and want is not None, (driver, isa)
    most = max_ptx_isa(driver)
    record_property("cuda_driver", show_version(driver))
    record_property("ptx_isa", isa)
    if most is not None and want > most:
        k = arch_ks.scale_ptx
        assert not k.builds, k.builds
        why = (f"PTX ISA {isa} needs a CUDA .* driver or newer to JIT-compile it; this driver "
               f"\\({show_version(driver)}\\) takes PTX ISA up to {show_version(most)}")
        assert any(re.search(r"@compute_80 \(\w+\): " + why, p) for p in arch_ks.problems), arch_ks.problems
        x = rand(rng, (100_003,), "float32")
        with pytest.warns(FallbackWarning, match=f"no build for {arch_ks.arch}.*arch_kernels.ref:scale"):
            out = jax.jit(lambda x: k(x, factor=2.5))(x)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * np.float32(2.5))
        print(f"\ncompute_80 PTX ISA {isa} set aside on CUDA driver {show_version(driver)}: fallback served")
        return
    k = arch_ks.scale_ptx
    (b,) = k.builds
    assert b.arch == "compute_80", b
    x = rand(rng, (1 << 24,), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        f = jax.jit(lambda x: k(x, factor=2.5))
        out = f(x)
        assert "cutecc_" in f.lower(x).as_text()
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * np.float32(2.5))
    ptx_ms = _median_ms(f, x)
    xla_ms = _median_ms(jax.jit(lambda x: x * np.float32(2.5)), x)
    record_property("ptx_scale_ms", ptx_ms)
    record_property("xla_scale_ms", xla_ms)
    print(f"\ncompute_80 PTX scale of 2^24 floats on {arch_ks.arch}: {ptx_ms:.3f} ms, XLA's: {xla_ms:.3f} ms")
