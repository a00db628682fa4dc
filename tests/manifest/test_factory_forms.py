"""Published launchers that need more than `entry` and plain factory values: a
factory returning a tuple of launchers (`entry = "mod:factory[1]"`), Python
objects as variant values (`{ import = "pkg.mod:Name" }`, keyed by the module's source), and
a library that asks torch for the GPU's properties while it is constructed, answered on this
CPU host from the hardware profile (the answers keyed). Toy kernels under tmp_path; the
builds compile with the real DSL (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TOY_KERNEL, opts

from cutecc.contract.args import TensorArg
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan

ARGS = '''args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
'''

FACTORIES = '''\
from toy.ops import broken, scale


def pair():
    """Two launchers, as published factories return them (the first fails to compile)."""
    return broken, scale


def with_op(op):
    """A launcher for an operator class named by the manifest (never imported here)."""
    assert isinstance(op, type) and op.__module__ == "pub.opsdef", op
    return scale
'''

OPSDEF = '''\
class Double:
    factor = 2.0


class Triple:
    factor = 3.0
'''


def _project(root: Path, kernels: str, archs: str = '["sm_90a"]') -> Path:
    for rel, text in {"toy/__init__.py": "", "toy/ops.py": TOY_KERNEL, "pub/__init__.py": "",
                      "pub/factories.py": FACTORIES, "pub/opsdef.py": OPSDEF}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "kernels.toml").write_text(f"archs = {archs}\n" + kernels)
    return root / "kernels.toml"


def _kernel(name: str, entry: str, extra: str = "factory_args = {}\n") -> str:
    return f'\n[kernel.{name}]\nentry = "{entry}"\n{extra}{ARGS}'


# Item 7: a factory returning a tuple of launchers -------------------------------------------

def test_an_index_into_a_factory_result_names_one_launcher(tmp_path: Path) -> None:
    from cutecc.commands.build import build

    manifest = _project(tmp_path, _kernel("second", "pub.factories:pair[1]")
                        + _kernel("first", "pub.factories:pair[0]"))
    keys = {p.kernel.name: p.key for p in plan(load_manifest(manifest))}
    assert keys["first"] != keys["second"]
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False)
    by = {o.planned.kernel.name: o for o in report.outcomes}
    assert by["second"].status == "built", by["second"].error
    assert by["first"].status == "failed" and "no_such_dsl_function" in (by["first"].error or "")


@pytest.mark.parametrize("entry, why", [
    ("pub.factories:pair[x]", 'not of the form "package.module:attr'),
    ("pub.factories:pair[]", 'not of the form "package.module:attr'),
    ("pub.factories:pair[1].x", 'not of the form "package.module:attr'),
])
def test_bad_indexed_entries_are_manifest_errors(tmp_path: Path, entry: str, why: str) -> None:
    manifest = _project(tmp_path, _kernel("k", entry))
    with pytest.raises(CuteccError, match=why) as e:
        load_manifest(manifest)
    assert e.value.exit_code == 2 and e.value.key_path == 'kernel "k", entry'


def test_an_index_past_the_result_says_what_the_factory_returned(tmp_path: Path) -> None:
    from cutecc.build.compiler import resolve_entry

    _project(tmp_path, "")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(IndexError, match=r"pub.factories:pair\[5\]: the factory returned a tuple of 2"):
            resolve_entry("pub.factories:pair[5]", ())
        assert callable(resolve_entry("pub.factories:pair[1]", ()))
        # named without an index: the tuple is no launcher, and the error says how to pick one
        with pytest.raises(TypeError, match=r'pub.factories:pair: the factory returned a tuple of 2, '
                                            r'not a launcher: name one with an index, '
                                            r'entry = "pub.factories:pair\[i\]" \(i from 0 to 1\)'):
            resolve_entry("pub.factories:pair", ())
    finally:
        sys.path.remove(str(tmp_path))
        for m in [m for m in sys.modules if m.split(".")[0] in ("pub", "toy")]:
            del sys.modules[m]


# Item 7: Python objects (import references) as variant values --------------------------------

OPS_KERNEL = _kernel("op", "pub.factories:with_op", '''factory_args = { op = "$op" }
variants = { op = [{ import = "pub.opsdef:Double" }, { import = "pub.opsdef:Triple" }] }
''')


def test_import_references_are_variant_values_keyed_by_their_module(tmp_path: Path) -> None:
    manifest = _project(tmp_path, OPS_KERNEL)
    k = load_manifest(manifest).kernel("op")
    assert [v.id for v in k.variants] == ["op=pub.opsdef:Double", "op=pub.opsdef:Triple"]
    assert dict(k.variants[1].factory_args or ()) == {"op": {"import": "pub.opsdef:Triple"}}
    assert dict(k.variants[0].call) == {"op": "pub.opsdef:Double"}  # chosen at call time by its text
    before = {p.variant.id: p for p in plan(load_manifest(manifest))}
    assert all("pub.opsdef" in p.inputs["imports"] for p in before.values())
    (tmp_path / "pub/opsdef.py").write_text(OPSDEF + "\n\nclass Quadruple:\n    factor = 4.0\n")
    after = {p.variant.id: p for p in plan(load_manifest(manifest))}
    assert all(after[i].key != before[i].key for i in before)  # the module's source is keyed


@pytest.mark.parametrize("variants, where, why", [
    ('{ op = [{ import = "pub.opsdef:Double" }, 3] }', "variants.op[1]",
     "takes only { import = ... } values"),
    ('{ op = [{ import = "nocolon" }] }', "variants.op[0].import", 'must be "package.module:attr"'),
    ('{ op = [{ dtype = "float32" }] }', "variants.op[0]", "must be a number, string, bool or"),
    ('{ op = [{ import = "pub.opsdef:A" }, { import = "pub.opsdef:A" }] }', "variants.op", "repeats"),
])
def test_bad_import_variant_values_are_manifest_errors(tmp_path: Path, variants: str, where: str,
                                                       why: str) -> None:
    manifest = _project(tmp_path, OPS_KERNEL.replace(OPS_KERNEL.split("variants = ")[1].split("\n")[0],
                                                     variants))
    with pytest.raises(CuteccError, match=why) as e:
        load_manifest(manifest)
    assert e.value.exit_code == 2 and where in (e.value.key_path or ""), e.value.key_path


def test_an_import_variant_value_is_refused_where_a_plain_value_is_needed(tmp_path: Path) -> None:
    manifest = _project(tmp_path, OPS_KERNEL.replace('dtype = "float32", shape = ["n"] }',
                                                     'dtype = "$op", shape = ["n"] }', 1))
    with pytest.raises(CuteccError, match="is an import reference") as e:
        load_manifest(manifest)
    assert "args[0].dtype" in (e.value.key_path or "")


def test_a_missing_imported_name_is_a_planning_error(tmp_path: Path) -> None:
    manifest = _project(tmp_path, OPS_KERNEL.replace("pub.opsdef:Triple", "pub.opsdef:Nope"))
    with pytest.raises(CuteccError, match='module "pub.opsdef" defines no "Nope"') as e:
        plan(load_manifest(manifest))
    assert e.value.exit_code == 2 and "factory_args.op" in (e.value.key_path or "")


@pytest.mark.usefixtures("dsl")
def test_import_variant_values_build(tmp_path: Path) -> None:
    from cutecc.commands.build import build

    manifest = _project(tmp_path, OPS_KERNEL)
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False)
    assert report.ok and report.count("built") == 2, report.warnings()


def test_an_imported_factory_value_is_keyed_by_its_module(tmp_path: Path) -> None:
    manifest = _project(tmp_path, _kernel("op", "pub.factories:with_op",
                                          'factory_args = { op = { import = "pub.opsdef:Double" } }\n'))
    [before] = plan(load_manifest(manifest))
    (tmp_path / "pub/opsdef.py").write_text(OPSDEF + "\nX = 1\n")
    [after] = plan(load_manifest(manifest))
    assert after.key != before.key


# Item 5: a library that asks torch for the GPU while its launcher is constructed -------------

ASKS_GPU = '''\
import cutlass
import cutlass.cute as cute
import torch

from toy.ops import scale


class Sized:
    """Picks its block size from the device's shared-memory opt-in limit, as FlashInfer does."""

    def __init__(self):
        props = torch.cuda.get_device_properties(0)
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.cuda.current_device() == 0
        assert torch.cuda.get_device_capability("cuda:0") == (props.major, props.minor) == (9, 0)
        assert props.multi_processor_count > 100 and torch.cuda.get_device_name().startswith("NVIDIA")
        self.threads = 64 if props.shared_memory_per_block_optin > 200_000 else 128

    @cute.jit
    def __call__(self, x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream):
        scale(x, out, factor, stream, self.threads)
'''


def _gpu_project(root: Path, profile: str = "h100") -> Path:
    pytest.importorskip("torch", reason="needs torch (the examples extra)")
    extra = f'profile = "{profile}"\nfactory_args = {{}}\n'
    manifest = _project(root, _kernel("sized", "pub.asks:Sized", extra)
                        + _kernel("plain", "toy.ops:scale", 'constants = { threads = 64 }\n'))
    (root / "pub/asks.py").write_text(ASKS_GPU)
    return manifest


@pytest.mark.extra
def test_device_answers_are_keyed_for_code_that_reaches_torch(tmp_path: Path) -> None:
    manifest = _gpu_project(tmp_path)
    h100 = {p.kernel.name: p for p in plan(load_manifest(manifest))}
    assert h100["sized"].inputs["device"]["shared_memory_per_block_optin"] == 232448
    assert h100["sized"].inputs["device"]["major"] == 9 and "device" not in h100["plain"].inputs
    manifest.write_text(manifest.read_text().replace('profile = "h100"', 'profile = "a100"'))
    a100 = {p.kernel.name: p for p in plan(load_manifest(manifest))}
    assert a100["sized"].key != h100["sized"].key  # another profile, other answers, another key
    assert a100["plain"].key == h100["plain"].key


@pytest.mark.extra
@pytest.mark.usefixtures("dsl")
def test_a_launcher_that_asks_torch_for_the_gpu_builds_on_a_cpu_host(tmp_path: Path) -> None:
    from cutecc.commands.build import build

    manifest = _gpu_project(tmp_path)
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False)
    by = {o.planned.kernel.name: o for o in report.outcomes}
    assert by["sized"].status == "built", by["sized"].error
    # a fact the profile cannot answer fails the build, saying which and where to add it
    manifest.write_text(manifest.read_text().replace('profile = "h100"', 'profile = "bare"')
                        + '\n[hardware.bare]\nsm_count = 132\n')
    report = build(manifest, opts(cache_dir=tmp_path / "cache", jobs=1), lock=False)
    err = {o.planned.kernel.name: o for o in report.outcomes}["sized"].error or ""
    assert "hardware profile \"bare\" cannot answer it; add name = ... to [hardware.bare]" in err, err


@pytest.mark.extra
def test_device_answers_are_checked_on_a_gpu_host_and_torch_is_restored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    torch = pytest.importorskip("torch", reason="needs torch (the examples extra)")
    from cutecc.manifest import BUILTIN_PROFILES
    from cutecc.toolchain import devicequery

    facts = devicequery.answers(BUILTIN_PROFILES["h100"], "sm_90a", "h100")
    real = types.SimpleNamespace(multi_processor_count=132, shared_memory_per_block_optin=166912,
                                 major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a host with a GPU
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: real)
    before = {n: getattr(torch.cuda, n) for n in ("is_available", "get_device_properties",
                                                  "get_device_capability", "device_count")}
    with devicequery.answering(facts):
        props = torch.cuda.get_device_properties(0)
        assert props.multi_processor_count == 132 and torch.cuda.get_device_capability() == (9, 0)
        with pytest.raises(RuntimeError, match="GPU answers shared_memory_per_block_optin = 166912"):
            _ = props.shared_memory_per_block_optin  # the key says 232448
    assert {n: getattr(torch.cuda, n) for n in before} == before


# Item 7: cutlass_call's `mode`, a permuted view of the caller's array -----------------------

def _mode_manifest(root: Path, x: str) -> Path:
    return _project(root, f'''
[kernel.k]
entry = "toy.ops:scale"
args = [
  {x},
  {{ name = "out", role = "output", dtype = "float32", shape = ["a", "b", "c"] }},
  {{ kind = "stream" }},
]
''')


@pytest.mark.parametrize("mode, layout", [("[1, 0, 2]", "[1, 2, 0]"), ("[2, 0, 1]", "[0, 2, 1]"),
                                          ("[2, 1, 0]", '"column-major"'), ("[0, 1, 2]", '"row-major"')])
def test_mode_is_the_stride_order_of_a_permuted_view(tmp_path: Path, mode: str, layout: str) -> None:
    """`mode = [..]` (cutlass_call's): the kernel's mode i is dimension mode[i] of the array
    passed, a view with no copy: the kernel sees the stride order `layout = [rank - 1 - m for
    m in mode]`. Unlike `layout`, the call passes the array as the caller holds it (and gets
    results in its order): another contract, so another key, except for the identity."""
    tensor = '{{ name = "x", dtype = "float32", shape = ["a", "b", "c"], {} }}'
    by_mode = plan(load_manifest(_mode_manifest(tmp_path / "m", tensor.format(f"mode = {mode}"))))
    by_layout = plan(load_manifest(_mode_manifest(tmp_path / "l", tensor.format(f"layout = {layout}"))))
    x, y = by_mode[0].variant.args[0], by_layout[0].variant.args[0]
    assert isinstance(x, TensorArg) and isinstance(y, TensorArg)
    assert x.order == y.order and x.perm == y.perm
    identity = mode == "[0, 1, 2]"
    assert x.mode is not identity and not y.mode
    assert x.transpose is None and (y.transpose is None) is identity
    assert (by_mode[0].key == by_layout[0].key) is identity


@pytest.mark.parametrize("extra, why", [
    ("mode = [0, 0, 1]", "a permutation of 0..2"),
    ("mode = [1, 0]", "a permutation of 0..2"),
    ('mode = [1, 0, 2], layout = "column-major"', "not both"),
    ('mode = [1, 0, 2], role = "scratch"', "not for scratch"),
])
def test_bad_modes_are_manifest_errors(tmp_path: Path, extra: str, why: str) -> None:
    tensor = f'{{ name = "x", dtype = "float32", shape = ["a", "b", "c"], {extra} }}'
    with pytest.raises(CuteccError, match=why) as e:
        load_manifest(_mode_manifest(tmp_path, tensor))
    assert e.value.exit_code == 2 and "args[0]" in (e.value.key_path or "")
