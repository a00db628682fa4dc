"""Just-in-time builds in development (`cutecc.load(jit=True)`, `$CUTECC_JIT=1`): a call no
built variant fits compiles the variant that serves it, through the pipeline and key of
`cutecc build`, into the same cache; the next `cutecc build` of a manifest declaring that
variant finds it cached, and a second call lowers from the cache without compiling. Never on
by default; an error at load where it cannot work (no DSL, a lock, a read-only cache).

The first tests run the whole path with stand-in compiles (`helpers.fake_compile`); the
last compiles the toy kernel through the DSL."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from helpers import PY, REPO, TOY_KERNEL, fallback_manifest, opts

import cutecc
from cutecc.commands.build import build
from cutecc.commands.misses import misses
from cutecc.errors import CuteccError, FallbackWarning, JitBuildWarning, NoBuildFits
from cutecc.runtime.library import target_name
from cutecc.store.misses import read_misses

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


def _built(project: Path) -> Path:
    cache = project.parent.parent / "cache"
    r = build(project, opts(cache_dir=cache))
    assert r.ok, r.warnings()
    return cache


def _lower(fn: Any, *specs: Any) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def _call(kernel: Any, spec: Any) -> str:
    """What serves a call of `kernel` on `spec` (stand-in builds cannot be lowered): the
    variant of the build that does, or "fallback"."""
    served, _ = kernel._served_by_fallback([jnp.zeros(spec.shape, spec.dtype)], {}, {})
    return "fallback" if served else kernel.select(spec)[0].variant


def _spec(*shape: int, dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def test_a_miss_builds_its_variant_with_the_key_cutecc_build_then_finds(fallback_project: Path) -> None:
    cache = _built(fallback_project)
    ks = cutecc.load(cache, arch="sm_90a", jit=True)
    said = r'"scale" \(float32\[3, 32\]\).*compiled variant d=32 for sm_90a'
    with pytest.warns(JitBuildWarning, match=said):
        assert _call(ks.scale, _spec(3, 32)) == "d=32"  # the build, not the fallback
    (b32,) = [b for b in ks.scale.builds if b.variant == "d=32"]
    assert "toyfb.ref" not in sys.modules  # the fallback was never needed
    with warnings.catch_warnings():  # the same call again: served by the build, nothing warns
        warnings.simplefilter("error")
        assert _call(ks.scale, _spec(5, 32)) == "d=32"
    (m,) = read_misses(cache)
    assert m.reason == "no built variant fits; built just in time: variant d=32 for sm_90a"
    # what `cutecc misses --toml` prints for it, put in the manifest: the build finds it cached
    toml = "\n".join(misses(cache, toml=True, manifest=fallback_project).toml_lines())
    assert "variants = { d = [64, 32] }" in toml, toml
    fallback_project.write_text(fallback_manifest(ds=[64, 32]))
    r = build(fallback_project, opts(cache_dir=cache))
    assert r.ok and r.count("built") == 0, [(o.planned.label, o.status) for o in r.outcomes]
    assert b32.key in {o.planned.key for o in r.outcomes}
    # a fresh load of that build serves it with no just-in-time build at all
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cutecc.load(cache, arch="sm_90a").scale.select(_spec(3, 32))[0].key == b32.key


def test_a_second_process_finds_the_jit_build_cached(fallback_project: Path) -> None:
    cache = _built(fallback_project)
    with pytest.warns(JitBuildWarning, match="compiled variant d=32"):
        _call(cutecc.load(cache, arch="sm_90a", jit=True).scale, _spec(3, 32))
    with pytest.warns(JitBuildWarning, match="found cached variant d=32"):  # another load: a hit
        assert _call(cutecc.load(cache, arch="sm_90a", jit=True).scale, _spec(3, 32)) == "d=32"


def test_a_gpu_with_no_build_gets_the_variant_built_for_its_arch(fallback_project: Path) -> None:
    fallback_project.write_text(fallback_manifest(archs=["sm_100a"]))
    cache = _built(fallback_project)
    ks = cutecc.load(cache, arch="sm_90", jit=True)
    with pytest.warns(JitBuildWarning, match="no build for sm_90; compiled variant d=64 for sm_90a"):
        assert _call(ks.scale, _spec(2, 64)) == "d=64"
    assert [b.arch for b in ks.scale.builds] == ["sm_90a"]


def test_a_miss_no_variant_can_serve_falls_to_the_fallback_or_says_why(fallback_project: Path) -> None:
    cache = _built(fallback_project)
    ks = cutecc.load(cache, arch="sm_90a", jit=True)
    with pytest.warns(FallbackWarning, match="just-in-time build: .*change the contract.*dtype float16"):
        assert _call(ks.scale, _spec(3, 64, dtype=jnp.float16)) == "fallback"
    with pytest.raises(NoBuildFits, match=r"(?s)no built variant matches.*just-in-time build:.*float16"):
        _call(ks.plain, _spec(3, 64, dtype=jnp.float16))


def test_never_on_by_default_and_on_with_the_environment(fallback_project: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _built(fallback_project)
    ks = cutecc.load(cache, arch="sm_90a")
    with pytest.warns(FallbackWarning):  # default: the fallback, no build
        assert _call(ks.scale, _spec(3, 32)) == "fallback"
    assert ks.scale._jit is None and ks.scale.variants == ["d=64"]
    monkeypatch.setenv("CUTECC_JIT", "1")
    with pytest.warns(JitBuildWarning):
        assert _call(cutecc.load(cache, arch="sm_90a").scale, _spec(3, 32)) == "d=32"


@pytest.mark.parametrize("why", ["no-dsl", "lock", "read-only", "strict"])
def test_where_it_cannot_work_it_is_an_error_at_load(fallback_project: Path, monkeypatch: pytest.MonkeyPatch,
                                                     why: str) -> None:
    cache = _built(fallback_project)
    kw: dict[str, Any] = {}
    if why == "no-dsl":
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda n, *a: None if n == "cutlass" else real(n, *a))
        match = r"jit=True: the DSL \(nvidia-cutlass-dsl"
    elif why == "lock":
        kw, match = {"lock": fallback_project.parent / "kernels.lock", "allow_unsigned": True}, "pins exactly"
    elif why == "read-only":
        monkeypatch.setenv("CUTECC_READ_ONLY", "1")
        match = "CUTECC_READ_ONLY"
    else:
        kw, match = {"strict": True}, "strict=True"
    with pytest.raises(CuteccError, match=match):
        cutecc.load(cache, arch="sm_90a", jit=True, **kw)
    # the environment variable leaves a lock's load alone (a lock pins what runs)
    if why == "lock":
        monkeypatch.setenv("CUTECC_JIT", "1")
        assert cutecc.load(cache, arch="sm_90a", **kw).scale._jit is None


def test_jit_imports_nothing_of_the_build_side_until_a_miss(fallback_project: Path) -> None:
    cache = _built(fallback_project)
    code = ("import sys, warnings, jax, jax.numpy as jnp, cutecc\n"
            f"ks = cutecc.load({str(cache)!r}, arch='sm_90a', jit=True)\n"
            "x = jnp.zeros((3, 64), jnp.float32)\n"
            "assert ks.scale._served_by_fallback([x], {}, {}) == (False, None)\n"
            "print(sorted(m for m in sys.modules if m in ('cutecc.build.jit', 'cutecc.build.builder', "
            "'cutecc.plan.build_plan',"
            " 'cutecc.manifest', 'cutlass')))\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"  # jit=True, no miss: the runtime alone


TOY_STATIC = """\
archs = ["sm_90a"]

[kernel.scale]
entry = "toy.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["$n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["$n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
variants = { n = [NS] }
"""


def test_a_real_miss_compiles_once_and_build_then_finds_it_cached(dsl: None, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "toy").mkdir(parents=True)
    (proj / "toy" / "__init__.py").write_text("")
    (proj / "toy" / "ops.py").write_text(TOY_KERNEL)
    manifest = proj / "kernels.toml"
    manifest.write_text(TOY_STATIC.replace("NS", "64"))
    cache = tmp_path / "cache"
    assert build(manifest, opts(cache_dir=cache)).ok
    ks = cutecc.load(cache, arch="sm_90a", jit=True)
    with pytest.warns(JitBuildWarning, match="compiled variant n=32 for sm_90a"):
        text = _lower(lambda x: ks.scale(x, factor=2.0), _spec(32))
    (b32,) = [b for b in ks.scale.builds if b.variant == "n=32"]
    meta = json.loads((b32.library.parent / "meta.json").read_text())
    assert meta["key_inputs"]["arch"] == "sm_90a" and target_name(b32.key) in text
    with warnings.catch_warnings():  # lowered from the cache the second time: no compile, no warning
        warnings.simplefilter("error")
        assert target_name(b32.key) in _lower(lambda x: ks.scale(x), _spec(32))
    manifest.write_text(TOY_STATIC.replace("NS", "64, 32"))
    r = build(manifest, opts(cache_dir=cache))
    assert r.ok and r.count("built") == 0 and r.count("cached") == 2, [o.status for o in r.outcomes]
    assert b32.key in {o.planned.key for o in r.outcomes}


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the DSL (the build extra)")
def test_the_runtime_builds_only_through_a_registered_builder(tmp_path: Path) -> None:
    """The runtime offers a miss hook and builds nothing itself: loading through the runtime's
    own loader with jit=True and no builder registered is an error at load naming this;
    `cutecc.load` registers the build side's (a factory, the build side not yet imported)."""
    code = ("import sys\nfrom cutecc.errors import WorkError\nfrom cutecc.runtime import jit_hook\n"
            "from cutecc.runtime.loader import load\n"
            f"try:\n    load({str(tmp_path / 'none')!r}, arch='sm_90a', jit=True)\n"
            "except WorkError as e:\n    print(e.message)\n"
            "import cutecc\n"
            f"try:\n    cutecc.load({str(tmp_path / 'none')!r}, arch='sm_90a', jit=True)\n"
            "except Exception:\n    pass\n"
            "print(jit_hook.registered().__module__, jit_hook.registered().__name__,\n"
            "      'cutecc.build.jit' in sys.modules)\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    first, registered = r.stdout.strip().splitlines()[-2:]
    assert first.startswith("jit=True: no just-in-time builder is registered: load through `cutecc.load`")
    assert registered == "cutecc _jit_builder False"
