"""A constructor argument derived from shapes (issue 48, item 9): `from_shapes = { vec =
"gcd(n, 4)" }` makes a variant axis one a call's extents choose, so one declaration builds
what calls need and each call reaches the variant of its value (n = 4096: vec = 4; n = 4098:
vec = 2), with no call keyword. The expression (`gcd` added to the grammar), the manifest's
records and errors, then a real build of the toy kernel and calls dispatched on this CPU host."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TOY_KERNEL, opts

from cutecc.contract import expr
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.key import key_inputs

MANIFEST = '''archs = ["sm_90a"]

[kernel.vscale]
entry = "toy.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
constants = { threads = "$vec" }
variants = { vec = [1, 2, 4] }
from_shapes = { vec = "gcd(n, 4)" }
symbols = { n = { divisibility = "$vec" } }
'''


def _project(root: Path, text: str = MANIFEST) -> Path:
    (root / "toy").mkdir(parents=True, exist_ok=True)
    (root / "toy/__init__.py").write_text("")
    (root / "toy/ops.py").write_text(TOY_KERNEL)
    (root / "kernels.toml").write_text(text)
    return root / "kernels.toml"


def test_gcd_is_an_expression() -> None:
    assert expr.canonical("gcd( n ,4)") == "gcd(n, 4)"
    assert [expr.evaluate("gcd(n, 4)", {"n": n}) for n in (4096, 4098, 4097)] == [4, 2, 1]
    assert expr.multiple_of("gcd(n, 4)", {"n": 8}) == 4
    with pytest.raises(expr.ExprError, match="needs concrete extents"):
        expr.evaluate("gcd(n, 4)", {"n": object()})


def test_the_axis_is_chosen_by_shapes_not_by_a_keyword(tmp_path: Path) -> None:
    k = load_manifest(_project(tmp_path)).kernel("vscale")
    assert [v.id for v in k.variants] == ["vec=1", "vec=2", "vec=4"]
    for v in k.variants:
        assert v.call == () and v.from_shapes == (("vec", "gcd(n, 4)"),)
        assert dict(v.constants) == {"threads": dict(v.params)["vec"]}
        assert key_inputs(k, v, "sm_90a", "0" * 64)["from_shapes"] == {"vec": "gcd(n, 4)"}
    plain = load_manifest(_project(tmp_path, MANIFEST.replace('from_shapes = { vec = "gcd(n, 4)" }\n', "")))
    assert "from_shapes" not in key_inputs(plain.kernel("vscale"), plain.kernel("vscale").variants[0],
                                           "sm_90a", "0" * 64)  # only when set: other keys unchanged


@pytest.mark.parametrize(("old", "new", "why"), [
    ('{ vec = "gcd(n, 4)" }', '{ width = "gcd(n, 4)" }',
     "from_shapes.width: names no variant axis (axes: vec)"),
    ('{ vec = "gcd(n, 4)" }', '{ vec = "gcd(m, 4)" }', 'from_shapes.vec: "m" is not the extent of any input'),
    ('{ vec = "gcd(n, 4)" }', '{ vec = "4" }', "from_shapes.vec: reads no symbol"),
    ('{ vec = "gcd(n, 4)" }', '{ vec = "lcm(n, 4)" }', "from_shapes.vec: only calls of"),
    ('{ vec = "gcd(n, 4)" }', "{ vec = 4 }", "from_shapes.vec: must be an expression string"),
    ('constants = { threads = "$vec" }\nvariants = { vec = [1, 2, 4] }',
     'constants = { threads = 64, v = "$vec" }\nvariants = { vec = ["a", "b"] }',
     "variants.vec: an axis chosen from shapes takes ints"),
])
def test_bad_from_shapes_are_manifest_errors(tmp_path: Path, old: str, new: str, why: str) -> None:
    text = MANIFEST.replace(old, new).replace('symbols = { n = { divisibility = "$vec" } }\n', "")
    with pytest.raises(CuteccError) as e:
        load_manifest(_project(tmp_path, text))
    assert why in str(e.value) and 'kernel "vscale"' in str(e.value), str(e.value)


@pytest.mark.usefixtures("dsl")
def test_calls_reach_the_variant_their_extents_choose(tmp_path: Path) -> None:
    import jax
    import jax.numpy as jnp

    import cutecc
    from cutecc.commands.build import build
    from cutecc.commands.show import show
    from cutecc.runtime.variant_choice import chosen_problem

    manifest = _project(tmp_path / "proj")
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False)
    assert report.ok and report.count("built") == 3, report.warnings()
    k = cutecc.load(tmp_path / "cache", arch="sm_90a", manifest=manifest).vscale
    for n, vec in ((4096, 4), (4098, 2), (4097, 1)):
        x = jax.ShapeDtypeStruct((n,), jnp.float32)
        assert k.select(x)[0].variant == f"vec={vec}", n
        assert jax.eval_shape(k, x).shape == (n,)
    two = next(b for b in k.builds if b.variant == "vec=2")
    assert chosen_problem(two.from_shapes, {"n": 4096}) == "vec = gcd(n, 4) is 4 for these arrays, " \
        "built for vec = 2"
    assert chosen_problem(two.from_shapes, {"n": 4098}) == ""
    lines = show(two.key, cache_dir=tmp_path / "cache").lines()
    assert "chosen by  vec = gcd(n, 4) (this build: vec = 2)" in lines
