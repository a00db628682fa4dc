"""An optional tensor chosen per variant (issue 48, item 9): `present = "$p"` on an input
puts the tensor, or None, in its slot, so a launcher whose batched and variable-length forms
differ by a None in one slot is one kernel and one callable. The manifest's records, keys
and errors; then a real build of a toy CuTe launcher with an optional operand, and calls
through both variants dispatched on this CPU host (`select`, `jax.eval_shape`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import opts

from cutecc.contract.args import NoneArg, TensorArg, args_to_json
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest

# The launcher: the GPU suite's own (tests/gpu/form_kernels/ops.py, whose `axpb` runs there
# against NumPy), written into the project as its module `opt.ops`.
OPS = (Path(__file__).resolve().parents[1] / "gpu" / "form_kernels" / "ops.py").read_text(encoding="utf-8")

MANIFEST = '''archs = ["sm_90a"]

[kernel.axpb]
entry = "opt.ops:axpb"
variants = {{ biased = [false, true] }}
args = [
  {{ name = "x", dtype = "float32", shape = ["n"] }},
  {{ name = "bias", dtype = "float32", shape = ["n"]{present} }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }},
  {{ kind = "scalar", name = "factor", dtype = "float32", default = 1.0 }},
  {{ kind = "stream" }},
]
'''


def _project(root: Path, present: str = ', present = "$biased"') -> Path:
    (root / "opt").mkdir(parents=True, exist_ok=True)
    (root / "opt/__init__.py").write_text("")
    (root / "opt/ops.py").write_text(OPS)
    (root / "kernels.toml").write_text(MANIFEST.format(present=present))
    return root / "kernels.toml"


def test_a_bool_axis_puts_the_tensor_or_none_in_the_slot(tmp_path: Path) -> None:
    k = load_manifest(_project(tmp_path)).kernel("axpb")
    by = {v.id: v for v in k.variants}
    assert set(by) == {"biased=False", "biased=True"}
    plain, biased = by["biased=False"], by["biased=True"]
    assert plain.args[1] == NoneArg(slot="bias") and isinstance(biased.args[1], TensorArg)
    assert plain.convention.slots == (("x", True), ("bias", False))
    assert biased.convention.slots == (("x", True), ("bias", True)) and biased.convention.absent == ()
    assert [t.name for t in plain.convention.inputs] == ["x"]
    assert plain.call == biased.call == ()  # the arrays tell them apart: no call keyword
    # keyed: the slot's name in the None variant's contract; a plain None argument keeps its form
    assert args_to_json(plain.args)[1] == {"kind": "none", "slot": "bias"}
    assert args_to_json((NoneArg(),)) == [{"kind": "none"}]


@pytest.mark.parametrize(("old", "new", "why"), [
    ("[false, true]", '["no", "yes"]', "args[1].present: must be true, false or a \"$param\" whose values "
     "are true and false, got 'no'"),
    ('present = "$biased"', 'present = "$biased", role = "inout"', "only an input may be optional"),
])
def test_bad_optional_slots_are_manifest_errors(tmp_path: Path, old: str, new: str, why: str) -> None:
    manifest = _project(tmp_path)
    manifest.write_text(manifest.read_text().replace(old, new))
    with pytest.raises(CuteccError) as e:
        load_manifest(manifest)
    assert why in str(e.value) and 'kernel "axpb", variant biased=' in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, dsl: None) -> tuple[Path, Path]:
    from cutecc.commands.build import build

    root = tmp_path_factory.mktemp("optional")
    manifest = _project(root / "proj")
    report = build(manifest, opts(cache_dir=root / "cache", jobs=1), lock=False)
    assert report.ok and report.count("built") == 2, report.warnings()
    return root / "cache", manifest


def test_one_kernel_one_callable_picks_by_none_or_array(built: tuple[Path, Path]) -> None:
    import jax
    import jax.numpy as jnp

    import cutecc

    k = cutecc.load(built[0], arch="sm_90a", manifest=built[1]).axpb
    x = jax.ShapeDtypeStruct((1000,), jnp.float32)
    assert k.select(x, x)[0].variant == "biased=True"
    assert k.select(x, None)[0].variant == "biased=False"  # None in the optional slot
    assert k.select(x)[0].variant == "biased=False"  # or the slot left out
    # the whole call path (jit's trace, the primitive's shapes), both variants
    assert jax.eval_shape(k, x, x).shape == (1000,)
    assert jax.eval_shape(lambda a: k(a, None, factor=2.0), x).shape == (1000,)
    assert jax.eval_shape(k, x).shape == (1000,)
    assert "(x: float32['n'], bias: None, factor: float32)" in repr(k)
    assert list(k.__signature__.parameters)[:2] == ["x", "bias"]


def test_a_none_where_no_variant_takes_one_is_a_wrong_call(built: tuple[Path, Path]) -> None:
    import jax
    import jax.numpy as jnp

    import cutecc
    from cutecc.errors import CallTypeError

    k = cutecc.load(built[0], arch="sm_90a", manifest=built[1]).axpb
    x = jax.ShapeDtypeStruct((1000,), jnp.float32)
    with pytest.raises(CallTypeError, match=r"argument 0 is None: its optional slots \(bias\) take None"):
        k.select(None, x)
    with pytest.raises(CallTypeError, match="argument 0 is None"):
        jax.eval_shape(lambda a: k(None, a), x)
    with pytest.raises(CallTypeError, match="takes 2 array"):
        k.select(x, x, x)


def test_cutecc_torch_takes_the_none_too(built: tuple[Path, Path]) -> None:
    """The same dispatch from PyTorch: the call gets as far as the device check (CPU tensors
    here), so None in the slot, or the slot left out, was taken; a wrong None is refused."""
    torch = pytest.importorskip("torch", reason="needs torch (cutecc[torch])")
    import cutecc.torch as ct
    from cutecc.errors import CuteccError

    k = ct.load(built[0], arch="sm_90a", manifest=built[1]).axpb
    x = torch.ones(1000)
    assert k.select(x, None)[0].variant == "biased=False" and k.select(x, x)[0].variant == "biased=True"
    for call in ((x, None), (x,), (x, x)):
        with pytest.raises(CuteccError, match="cutecc kernels run on CUDA devices"):
            k(*call)
    with pytest.raises(TypeError, match=r"argument 0 is None: its optional slots \(bias\) take None"):
        k(None, x)
