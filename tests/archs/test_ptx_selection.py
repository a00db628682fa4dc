"""Which build a GPU gets when a variant is built as machine code and as portable PTX:
exact machine code, then PTX, then the kernel's fallback (the runtime's rule, with
stand-in builds); and `cutecc list --gpu` / `cutecc show --gpu` say the same."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import fallback_manifest, opts

import cutecc
from cutecc import archs, cubin
from cutecc.commands.build import build
from cutecc.commands.list import list_entries
from cutecc.commands.show import show
from cutecc.errors import CuteccError, FallbackWarning, NoBuildFits

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")


@pytest.fixture
def cache(fallback_project: Path) -> Path:
    fallback_project.write_text(fallback_manifest(archs=["sm_90a", "compute_80"]))
    cache = fallback_project.parent.parent / "cache"
    assert build(fallback_project, opts(cache_dir=cache)).ok
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
    assert shown["on_gpu"] == {"gpu": "sm_90", "ptx_isa": "9.4", "runs": "yes: PTX, compiled by the driver "
                               "at load (PTX ISA 9.4: a CUDA 13.4 driver or newer)"}
    assert "on sm_90   yes: PTX" in "\n".join(shown.lines())
    with pytest.raises(CuteccError, match="names portable PTX, not a GPU"):
        list_entries(cache, gpu="compute_80")


# A CUDA driver JIT-compiles PTX up to the ISA it knows: an entry whose PTX is newer is set
# aside at load with the reason, and its call falls through to another build or the fallback.

NEEDS = ("d=64@compute_80 ({key}): PTX ISA 9.4 needs a CUDA 13.4 driver or newer to "
         "JIT-compile it; this driver (13.0) takes PTX ISA up to 9.0")


@pytest.mark.parametrize(("driver", "most"), [((12, 0), (8, 0)), ((12, 5), (8, 5)), ((12, 6), (8, 5)),
                                              ((12, 7), (8, 6)), ((12, 8), (8, 7)), ((12, 9), (8, 8)),
                                              ((13, 0), (9, 0)), ((13, 1), (9, 1)), ((13, 4), (9, 4)),
                                              ((14, 0), None), ((99, 9), None)])
def test_the_newest_ptx_isa_of_a_driver(driver: tuple[int, int], most: tuple[int, int] | None) -> None:
    assert archs.max_ptx_isa(driver) == most


def test_the_ptx_isa_is_read_from_the_ptx() -> None:
    lib = b"\x7fELF host code\n//\n.version 9.4\n.target sm_80\n.address_size 64\n"
    assert cubin.ptx_versions(lib) == ["9.4"] and cubin.ptx_isa(lib) == "9.4"
    assert cubin.ptx_isa(b".version 8.8\n.target sm_80\n.version 9.1\n") == "9.1"
    assert cubin.ptx_isa(b"no ptx .version 9.4 here") is None  # a directive opens a line
    assert archs.ptx_driver_problem("compute_80", "9.0", (13, 0)) is None
    assert archs.ptx_driver_problem("sm_90a", "9.4", (13, 0)) is None  # machine code: no PTX
    assert archs.ptx_driver_problem("compute_80", None, (13, 0)) is None  # unknown: the driver decides
    assert archs.ptx_driver_problem("compute_80", "9.4", None) is None  # no driver: not judged
    assert archs.ptx_driver_problem("compute_80", "9.9", (13, 0)) == (
        "PTX ISA 9.9 needs a newer CUDA driver to JIT-compile it; this driver (13.0) takes PTX ISA up to 9.0")


@pytest.mark.parametrize(("given", "got"), [("13.0", (13, 0)), ("13000", (13, 0)), ("12080", (12, 8)),
                                            ("none", None)])
def test_the_driver_version_can_be_given(given: str, got: tuple[int, int] | None) -> None:
    assert archs.driver_version(archs.parse_driver_version(given, "$CUTECC_DRIVER_VERSION")) == got
    for bad in ("thirteen", "9" * 100_000, "\uff11\uff13\uff10\uff10\uff10", "\u00b9\u00b3\u2070\u2070\u2070",
                "\u0661\u0663.\u0660"):  # a hostile length, digits not ASCII: refused, not parsed
        with pytest.raises(CuteccError, match="not a CUDA driver version") as e:
            archs.parse_driver_version(bad, "$CUTECC_DRIVER_VERSION")
        assert e.value.where == "$CUTECC_DRIVER_VERSION"


def test_a_build_records_the_ptx_isa(cache: Path) -> None:
    isa = {r.arch: cutecc_store(cache, r.key).meta.ptx_isa for r in list_entries(cache, kernel="scale")}
    assert isa == {"compute_80": "9.4", "sm_90a": None}


def cutecc_store(cache: Path, key: str):  # type: ignore[no-untyped-def]
    from cutecc.store.view import StoreView

    e = StoreView(cache).get(key)
    assert e is not None
    return e


def _ptx_key(cache: Path) -> str:
    return next(r.key for r in list_entries(cache, kernel="scale") if r.arch == "compute_80")


@pytest.mark.parametrize("old_entry", [False, True])
def test_an_old_driver_sets_the_ptx_aside_and_the_fallback_serves(
        cache: Path, monkeypatch: pytest.MonkeyPatch, old_entry: bool) -> None:
    key = _ptx_key(cache)
    if old_entry:  # built before cutecc recorded the ISA: read from the library's PTX
        meta = cache_meta(cache, key)
        doc = json.loads(meta.read_text())
        del doc["ptx_isa"]
        meta.write_text(json.dumps(doc))
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", "13000")
    ks = cutecc.load(cache, arch="sm_89")
    k = ks.scale
    assert not k.builds
    assert "scale: " + NEEDS.format(key=key[:12]) in ks.problems
    x = jnp.asarray(np.random.default_rng().standard_normal((3, 64)), jnp.float32)
    with pytest.warns(FallbackWarning, match="no build for sm_89"):
        y = k(x, factor=2.0)
    np.testing.assert_allclose(np.asarray(y), np.sin(np.asarray(x)) * 2.0, rtol=1e-6)
    # an sm_90 GPU has machine code beside it: served by that, nothing falls back
    assert cutecc.load(cache, arch="sm_90").scale.select(x)[0].arch == "sm_90a"


def test_no_fallback_names_the_reason(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", "13.0")
    monkeypatch.setenv("CUTECC_STRICT", "1")  # no fallback: the miss is an error
    k = cutecc.load(cache, arch="sm_89").scale
    why = r"PTX ISA 9\.4 needs a CUDA 13\.4 driver or newer.*this driver \(13\.0\) takes PTX ISA up to 9\.0"
    with pytest.raises(NoBuildFits, match="no usable build for arch sm_89: .*" + why):
        k(jnp.zeros((2, 64), jnp.float32))


@pytest.mark.parametrize("driver", ["13.4", "13.5", "14.0", "none"])
def test_a_driver_that_knows_the_ptx_is_offered_it(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                   driver: str) -> None:
    monkeypatch.setenv("CUTECC_DRIVER_VERSION", driver)
    ks = cutecc.load(cache, arch="sm_89")
    assert not [p for p in ks.problems if "PTX ISA" in p]
    assert ks.scale.select(jnp.zeros((2, 64), jnp.float32))[0].arch == "compute_80"


def cache_meta(cache: Path, key: str) -> Path:
    return cutecc_store(cache, key).path / "meta.json"
