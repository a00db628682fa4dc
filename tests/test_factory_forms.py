"""Published launchers that need more than `entry` and plain factory values (issue 23, items
5 and 7): a factory returning a tuple of launchers (`entry = "mod:factory[1]"`), Python
objects as variant values (`{ import = "pkg.mod:Name" }`, keyed by the module's source), and
a library that asks torch for the GPU's properties while it is constructed, answered on this
CPU host from the hardware profile (the answers keyed). Toy kernels under tmp_path; the
builds compile with the real DSL (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TOY_KERNEL

from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan import plan

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
    report = build(manifest, cache_dir=tmp_path / "cache", jobs=1, lock=False)
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
    from cutecc.compiler import resolve_entry

    _project(tmp_path, "")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(IndexError, match=r"pub.factories:pair\[5\]: the factory returned a tuple of 2"):
            resolve_entry("pub.factories:pair[5]", ())
        assert callable(resolve_entry("pub.factories:pair[1]", ()))
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


def test_import_variant_values_build(tmp_path: Path) -> None:
    from cutecc.commands.build import build

    manifest = _project(tmp_path, OPS_KERNEL)
    report = build(manifest, cache_dir=tmp_path / "cache", jobs=1, lock=False)
    assert report.ok and report.count("built") == 2, report.warnings()


def test_an_imported_factory_value_is_keyed_by_its_module(tmp_path: Path) -> None:
    manifest = _project(tmp_path, _kernel("op", "pub.factories:with_op",
                                          'factory_args = { op = { import = "pub.opsdef:Double" } }\n'))
    [before] = plan(load_manifest(manifest))
    (tmp_path / "pub/opsdef.py").write_text(OPSDEF + "\nX = 1\n")
    [after] = plan(load_manifest(manifest))
    assert after.key != before.key
