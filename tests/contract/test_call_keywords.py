"""Variant parameters the input tensors cannot tell apart (FA4's
`causal`) are call keywords; two variants no call can tell apart are a manifest error;
the runtime never picks one of equals silently. Built for sm_90a, lowered on the CPU."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from call_keyword_kernels import OPS
from helpers import opts

import cutecc
from cutecc.commands.build import build
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.runtime.library import target_name

MANIFEST = '''archs = ["sm_90a"]

[kernel.attn]
entry = "fa.ops:attn"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
constants = { causal = "$causal" }
variants = { causal = [false, true] }
grad = { backward = "attn_bwd" }

[kernel.attn_bwd]
entry = "fa.ops:attn_bwd"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "ct", dtype = "float32", shape = ["n"] },
  { name = "dx", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "stream" },
]
constants = { causal = "$causal" }
variants = { causal = [false, true] }

[kernel.typed]
entry = "fa.ops:attn"
args = [
  { name = "x", dtype = "$dtype", shape = ["n"] },
  { name = "out", role = "output", dtype = "$dtype", shape = ["n"] },
  { kind = "stream" },
]
constants = { causal = "$causal" }
variants = { dtype = ["float32", "int32"], causal = [false, true] }
'''


def _project(root: Path, manifest: str = MANIFEST) -> Path:
    (root / "fa").mkdir(parents=True)
    (root / "fa/__init__.py").write_text("")
    (root / "fa/ops.py").write_text(OPS)
    (root / "kernels.toml").write_text(manifest)
    return root / "kernels.toml"


def test_parameters_the_tensors_cannot_tell_apart_are_call_keywords(tmp_path: Path) -> None:
    m = load_manifest(_project(tmp_path))
    assert [v.call for v in m.kernel("attn").variants] == [(("causal", False),), (("causal", True),)]
    # dtype tells variants apart through the arrays: only causal is a keyword
    assert {v.call for v in m.kernel("typed").variants} == {(("causal", False),), (("causal", True),)}


def test_variants_no_call_can_tell_apart_are_a_manifest_error(tmp_path: Path) -> None:
    # 1 and 1.0 are equal to a caller (True and 1 are not: see the dispatch test)
    text = MANIFEST.replace("variants = { causal = [false, true] }", "variants = { causal = [1, 1.0] }", 1)
    with pytest.raises(CuteccError) as e:
        load_manifest(_project(tmp_path, text))
    assert e.value.exit_code == 2 and e.value.key_path == 'kernel "attn", variants'
    assert "cannot be told apart by any call" in str(e.value)
    assert 'variants "causal=1" and "causal=1.0"' in str(e.value)


def test_a_keyword_that_is_also_a_scalar_is_a_manifest_error(tmp_path: Path) -> None:
    scalar = '  { kind = "scalar", name = "causal", dtype = "float32" },\n'
    text = MANIFEST.replace('{ kind = "stream" },\n]\nconstants',
                            '{ kind = "stream" },\n' + scalar + ']\nconstants', 1)
    with pytest.raises(CuteccError, match='call keyword "causal" is also the name of a runtime scalar'):
        load_manifest(_project(tmp_path, text))


@pytest.fixture(scope="module")
def built(dsl: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kw")
    manifest = _project(root)
    report = build(manifest, opts(cache_dir=root / "cache", jobs=2))
    failed = [(o.status, o.error) for o in report.outcomes if o.error]
    assert {o.status for o in report.outcomes} == {"built"}, failed
    return manifest, root / "cache"


def _lower(fn, *specs) -> str:
    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def _targets(text: str) -> list[str]:
    return re.findall(r"stablehlo.custom_call @(\w+)", text)


@pytest.mark.usefixtures("dsl")
def test_a_call_keyword_reaches_each_variant_under_jit(built: tuple[Path, Path]) -> None:
    _, cache = built
    ks = cutecc.load(cache, arch="sm_90a")
    x = jax.ShapeDtypeStruct((100,), jnp.float32)
    by = {b.variant: b for b in ks.attn.builds}
    assert set(by) == {"causal=False", "causal=True"}
    for causal in (False, True):
        b, env = ks.attn.select(x, causal=causal)
        assert b is by[f"causal={causal}"] and env == {"n": 100}
        assert _targets(_lower(lambda x, c=causal: ks.attn(x, causal=c), x)) == [target_name(b.key)]
    assert "causal=True" in repr(ks.attn) and "causal" in str(ks.attn.__signature__)
    assert ks.attn.keywords == {"causal": [False, True]}


@pytest.mark.usefixtures("dsl")
def test_leaving_the_keyword_out_is_an_error_listing_the_choices(built: tuple[Path, Path]) -> None:
    ks = cutecc.load(built[1], arch="sm_90a")
    x = jax.ShapeDtypeStruct((100,), jnp.float32)
    with pytest.raises(CuteccError, match=r"missing call keyword 'causal'.*causal = False or True"):
        _lower(lambda x: ks.attn(x), x)
    with pytest.raises(CuteccError, match=r"causal=2 was not built; built: causal=False, causal=True"):
        ks.attn.select(x, causal=2)
    with pytest.raises(CuteccError, match=r"causal=1 was not built"):  # 1 is not True
        ks.attn.select(x, causal=1)
    # a misspelt keyword: the error names the call keywords, not only the runtime scalars
    with pytest.raises(CuteccError, match=r"unknown keyword argument 'casual'; runtime scalars: "
                                          r"none; call keywords: causal"):
        _lower(lambda x: ks.attn(x, causal=True, casual=True), x)


@pytest.mark.usefixtures("dsl")
def test_grad_pairs_the_backward_of_the_same_keyword(built: tuple[Path, Path]) -> None:
    ks = cutecc.load(built[1], arch="sm_90a")
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    fwd = {b.variant: b.key for b in ks.attn.builds}
    bwd = {b.variant: b.key for b in ks.attn_bwd.builds}
    for causal in (False, True):
        text = _lower(jax.grad(lambda x, c=causal: (ks.attn(x, causal=c) ** 2).sum()), x)
        v = f"causal={causal}"
        assert _targets(text) == [target_name(fwd[v]), target_name(bwd[v])]


@pytest.mark.usefixtures("dsl")
def test_keywords_survive_the_lock(built: tuple[Path, Path]) -> None:
    manifest, cache = built
    lock = manifest.parent / "kernels.lock"
    assert lock.is_file()
    ks = cutecc.load(cache, arch="sm_90a", lock=lock, allow_unsigned=True)
    assert ks.typed.keywords == {"causal": [False, True]}
    b, _ = ks.typed.select(jax.ShapeDtypeStruct((8,), jnp.int32), causal=True)
    assert b.variant == "dtype=int32,causal=True"


@pytest.mark.usefixtures("dsl")
def test_list_and_show_name_the_call_keywords(built: tuple[Path, Path]) -> None:
    from cutecc.commands.list import list_entries
    from cutecc.commands.show import show

    rows = list_entries(built[1], kernel="attn").rows
    assert sorted(r.call for r in rows) == ["causal=False", "causal=True"]
    assert "CALL WITH" in list_entries(built[1]).lines()[0]
    row = next(r for r in rows if r.call == "causal=True")
    assert "call with  causal=True" in show(row.key, built[1]).lines()
