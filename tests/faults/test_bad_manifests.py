"""Generated bad manifests: each is rejected by `cutecc build` (dry run and real) with one
line naming the file and the key path, exit status 2, and nothing written.

tests/manifest/test_validation.py holds the hand-written cases; here hypothesis generates them: a
valid manifest (as data) takes one mutation drawn from a catalogue (wrong types at every
typed key, unknown dtypes, non-positive extents, duplicate and invalid names, unknown keys,
malformed or missing entry points, backward graphs with cycles, self-loops and missing
kernels, variant matrices over the limit, nested tuples, non-UTF-8 bytes, oversized
files, broken TOML), and the expected key path is known from the mutation. Valid
edge-case manifests (Unicode, long names, large matrices) plan exactly what they declare.
"""

from __future__ import annotations

import json
import keyword
import math
import tempfile
import unicodedata
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cutecc.archs import ARCH_RE
from cutecc.cli import main
from cutecc.contract import dtypes
from cutecc.manifest import ENTRY_RE, MAX_MANIFEST_BYTES, MAX_TUPLE_DEPTH, NAME_RE

from .conftest import soak

EXAMPLES = soak(40, 400)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
Doc = dict[str, Any]


# TOML out of data -------------------------------------------------------------------


def toml_value(v: Any) -> str:
    """One TOML value (inline tables and arrays only, so any document fits one line each)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def _string(v: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for c in v:
        if c in '"\\':
            out.append("\\" + c)
        elif unicodedata.category(c) == "Cc":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _key(k: str) -> str:
    return _string(k)


def toml(doc: Doc) -> bytes:
    return "".join(f"{_key(k)} = {toml_value(v)}\n" for k, v in doc.items()).encode()


# A valid manifest, as data -------------------------------------------------------------


def base() -> Doc:
    """Valid: one kernel, no variants (so error key paths carry no variant id)."""
    return {
        "archs": ["sm_90a"],
        "kernel": {"k": {
            "entry": "kk.elem:scale",
            "args": [
                {"kind": "stream"},
                {"name": "x", "dtype": "float32", "shape": ["n", 4]},
                {"name": "out", "role": "output", "dtype": "float32", "shape": ["n", 4]},
                {"kind": "scalar", "name": "alpha", "dtype": "float32", "default": 1.0},
            ],
            "constants": {"threads": 128},
        }},
    }


@contextmanager
def project() -> Any:
    """A fresh project directory with the (never imported) kernel package `kk`."""
    with tempfile.TemporaryDirectory(prefix="cutecc-bad-") as d:
        root = Path(d) / "proj"
        (root / "kk").mkdir(parents=True)
        (root / "kk" / "__init__.py").write_text("")
        (root / "kk" / "elem.py").write_text("def scale(*args, **kwargs):\n    return None\n")
        yield root


def rejected(content: bytes, key_path: str | None, fragment: str | None = None,
             name: str = "kernels.toml") -> str:
    """Assert `cutecc build` (dry run, then real) rejects `content`; returns the message."""
    with project() as proj:
        path = proj / name
        path.write_bytes(content)
        cache = proj.parent / "cache"
        for extra in (["--dry-run"], []):
            r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(cache), *extra])
            err = r.stderr
            assert r.exit_code == 2, (r.output, r.exception, content[:500])
            assert isinstance(r.exception, SystemExit), r.exception  # rendered, not raised
            # one line per error, the first in the file first (every error of a run at once)
            lines = err.splitlines()
            assert r.stdout == "" and lines and err.count("\n") == len(lines), err
            assert all(line.startswith("error: ") for line in lines), err
            head = f"error: {path.resolve()}: " + (f"{key_path}: " if key_path else "")
            assert err.startswith(head), (head, err)
            if fragment:
                assert fragment in lines[0], (fragment, err)
            assert not cache.exists() and not (proj / "kernels.lock").exists()
            assert sorted(p.name for p in proj.iterdir()) == sorted(["kk", name])
        return err


def accepted(doc: Doc) -> list[str]:
    """Assert `cutecc build --dry-run` plans `doc` and writes nothing; the planned labels."""
    with project() as proj:
        path = proj / "kernels.toml"
        path.write_bytes(toml(doc))
        cache = proj.parent / "cache"
        r = CliRunner().invoke(main, ["build", str(path), "--cache-dir", str(cache), "--dry-run"])
        assert r.exit_code == 0, (r.output, r.exception)
        assert not cache.exists() and not (proj / "kernels.lock").exists()
        return [line.split()[2] for line in r.stdout.splitlines() if line.startswith("would build")]


# Strategies ----------------------------------------------------------------------------

identifiers = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s) and not s.startswith("cutecc_"))
not_identifiers = st.text(min_size=0, max_size=12).filter(
    lambda s: not NAME_RE.fullmatch(s) or keyword.iskeyword(s))
scalars = st.one_of(st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1),
                    st.floats(allow_nan=False), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(identifiers, inner, max_size=3)), max_leaves=6)


def not_of(*types: type) -> st.SearchStrategy[Any]:
    """A TOML value of none of `types` (bool is not an int here)."""
    def ok(v: Any) -> bool:
        if isinstance(v, bool):
            return bool not in types
        return not isinstance(v, types)
    return values.filter(ok)


unknown_dtypes = st.text(min_size=1, max_size=12).filter(
    lambda s: dtypes.canonical(s) is None and not s.startswith("$"))


def printable(text: str) -> str:
    """How an error shows a name from the file: control and other unprintable characters
    escaped, so the message stays one line."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _tally(tally, kind: str) -> None:
    tally.add("manifests", tried=1, rejected_exit_2=1, wrote_nothing=1, **{f"kind_{kind}": 1})


# One mutation at a time, with the key path it must be reported at ----------------------

K = 'kernel "k"'
Mutation = Callable[[Doc], tuple[str, str | None]]  # mutate in place -> (key path, fragment)


def _set(path: str, value: Any) -> Mutation:
    def m(doc: Doc) -> tuple[str, str | None]:
        *parents, last = path.split("/")
        d: Any = doc
        for p in parents:
            d = d[int(p)] if isinstance(d, list) else d[p]
        d[int(last) if isinstance(d, list) else last] = value
        return "", None
    return m


# (where in the document, the key path reported, the types that are valid there)
TYPED = [
    ("archs", "archs", (list, str)),
    ("profile", "profile", (str,)),
    ("python_path", "python_path", (list,)),
    ("compile_options", "compile_options", (str,)),
    ("hardware", "hardware", (dict,)),
    ("kernel", "kernel", (dict,)),
    ("kernel/k", K, (dict,)),
    ("kernel/k/entry", f"{K}, entry", (str,)),
    ("kernel/k/args", f"{K}, args", (list,)),
    ("kernel/k/args/1", f"{K}, args[1]", (dict,)),
    ("kernel/k/args/1/shape", f"{K}, args[1].shape", (list,)),
    ("kernel/k/args/1/shape/1", f"{K}, args[1].shape[1]", (int, str)),
    ("kernel/k/args/1/dtype", f"{K}, args[1].dtype", (str,)),
    ("kernel/k/args/1/align", f"{K}, args[1].align", (int,)),
    ("kernel/k/args/3/default", f"{K}, args[3].default", (int, float)),
    ("kernel/k/constants", f"{K}, constants", (dict,)),
    # arrays are tuples, tables typed values: both may be valid there
    ("kernel/k/constants/threads", f"{K}, constants.threads", (int, float, str, bool, list, dict)),
    ("kernel/k/variants", f"{K}, variants", (dict,)),
    ("kernel/k/grad", f"{K}, grad", (dict,)),
    ("kernel/k/factory_args", f"{K}, factory_args", (dict,)),
]


@SETTINGS
@given(where=st.sampled_from(TYPED), data=st.data())
def test_a_wrong_type_anywhere_is_named_by_its_key_path(where, data, tally) -> None:
    path, key_path, ok_types = where
    value = data.draw(not_of(*ok_types), label="value")
    doc = base()
    _set(path, value)(doc)
    err = rejected(toml(doc), None)
    # The first error met names this key (or, for an element of an array, that element).
    assert f": {key_path}" in err, (key_path, err)
    _tally(tally, "wrong_type")


@SETTINGS
@given(dtype=unknown_dtypes, where=st.sampled_from([1, 2, 3]))
def test_an_unknown_dtype_lists_the_known_ones(dtype: str, where: int, tally) -> None:
    doc = base()
    doc["kernel"]["k"]["args"][where]["dtype"] = dtype
    rejected(toml(doc), f"{K}, args[{where}].dtype", "unknown dtype")
    _tally(tally, "unknown_dtype")


@SETTINGS
@given(extent=st.integers(2 ** 31, 2 ** 63 - 1), arg=st.sampled_from([1, 2]), dim=st.sampled_from([0, 1]))
def test_an_extent_of_2_31_or_more_is_refused(extent: int, arg: int, dim: int, tally) -> None:
    """Extents are 32-bit in the compiled layouts."""
    doc = base()
    doc["kernel"]["k"]["args"][arg]["shape"][dim] = extent
    rejected(toml(doc), f"{K}, args[{arg}].shape[{dim}]", "a static extent must be at most 2^31-1")
    _tally(tally, "bad_extent")


@SETTINGS
@given(dtype=st.sampled_from(["int32", "int64"]), data=st.data())
def test_a_scalar_default_out_of_its_dtype_is_refused(dtype: str, data, tally) -> None:
    """The DSL would truncate an int32 default of 2^40 to 0."""
    lo, hi = (-(2 ** 31), 2 ** 31 - 1) if dtype == "int32" else (-(2 ** 63), 2 ** 63 - 1)
    value = data.draw(st.one_of(st.integers(hi + 1, hi * 4), st.integers(lo * 4, lo - 1)))
    doc = base()
    doc["kernel"]["k"]["args"][3].update(dtype=dtype, default=value)
    if abs(value) >= 2 ** 63:  # TOML integers are 64-bit: such a file does not parse
        return
    rejected(toml(doc), f"{K}, args[3].default", f"out of the range of {dtype}")
    _tally(tally, "bad_scalar_default")


@SETTINGS
@given(name=st.sampled_from(["_k", "_", "get", "problems", "register_all", "arch", "root"]))
def test_a_kernel_name_the_kernel_set_owns_is_refused(name: str, tally) -> None:
    """`ks._private` or `ks.get` must stay the kernel set's own."""
    doc = base()
    doc["kernel"] = {name: doc["kernel"]["k"]}
    rejected(toml(doc), f'kernel "{name}"', "reserved")
    _tally(tally, "reserved_name")


@SETTINGS
@given(extent=st.integers(-(2 ** 63), 0), arg=st.sampled_from([1, 2]), dim=st.sampled_from([0, 1]))
def test_a_zero_or_negative_extent_is_refused(extent: int, arg: int, dim: int, tally) -> None:
    doc = base()
    doc["kernel"]["k"]["args"][arg]["shape"][dim] = extent
    rejected(toml(doc), f"{K}, args[{arg}].shape[{dim}]",
             f"a static extent must be positive, got {extent}")
    _tally(tally, "bad_extent")


@SETTINGS
@given(twin=st.sampled_from([(1, 2), (1, 3), (2, 3)]))
def test_duplicate_argument_names(twin: tuple[int, int], tally) -> None:
    doc = base()
    a, b = twin
    doc["kernel"]["k"]["args"][b]["name"] = doc["kernel"]["k"]["args"][a]["name"]
    rejected(toml(doc), f"{K}, args", "is used twice")
    _tally(tally, "duplicate_name")


@SETTINGS
@given(name=not_identifiers, where=st.sampled_from(["arg", "scalar", "kernel", "constant",
                                                    "variant"]))
def test_names_that_are_not_identifiers(name: str, where: str, tally) -> None:
    doc = base()
    k = doc["kernel"]["k"]
    if where == "arg":
        k["args"][1]["name"], key_path = name, f"{K}, args[1].name"
    elif where == "scalar":
        k["args"][3]["name"], key_path = name, f"{K}, args[3].name"
    elif where == "kernel":
        doc["kernel"] = {name: k}
        key_path = f'kernel "{name}"'
    elif where == "constant":
        k["constants"] = {name: 1}
        key_path = f"{K}, constants.{name}"
    else:
        k["variants"] = {name: [1, 2]}
        k["constants"] = {"threads": f"${name}"}
        key_path = f"{K}, variants.{name}"
    err = rejected(toml(doc), None)
    assert f": {printable(key_path)}: " in err, (key_path, err)
    _tally(tally, "bad_identifier")


LEVELS = [  # (where an unknown key goes, key path, the keys allowed there)
    ((), "<top level>", {"format", "archs", "profile", "python_path", "compile_options",
                         "hardware", "kernel"}),
    (("kernel", "k"), K, {"entry", "factory_args", "args", "constants", "variants", "archs",
                          "profile", "compile_options", "grad", "description"}),
    (("kernel", "k", "args", 1), f"{K}, args[1]", {"kind", "name", "role", "dtype", "shape",
                                                   "layout", "align"}),
    (("kernel", "k", "args", 3), f"{K}, args[3]", {"kind", "name", "dtype", "default"}),
    (("kernel", "k", "args", 0), f"{K}, args[0]", {"kind"}),
]


@SETTINGS
@given(level=st.sampled_from(LEVELS), key=st.text(min_size=1, max_size=16), value=values)
@example(level=LEVELS[0], key="two\nlines", value=1)  # a quoted TOML key may hold a newline
@example(level=LEVELS[2], key="\x1b[31mred", value="x")  # or a terminal escape
def test_an_unknown_key_at_any_level(level, key: str, value: Any, tally) -> None:
    where, key_path, allowed = level
    assume(key not in allowed)
    doc = base()
    d: Any = doc
    for p in where:
        d = d[p]
    d[key] = value
    err = rejected(toml(doc), key_path, "unknown key")
    assert f'unknown key "{printable(key)}"' in err
    _tally(tally, "unknown_key")


@SETTINGS
@given(entry=st.text(max_size=30).filter(lambda s: not ENTRY_RE.fullmatch(s)))
def test_a_malformed_entry_point(entry: str, tally) -> None:
    doc = base()
    doc["kernel"]["k"]["entry"] = entry
    rejected(toml(doc), f"{K}, entry", "is not of the form")
    _tally(tally, "malformed_entry")


@SETTINGS
@given(module=st.lists(identifiers, min_size=1, max_size=3), attr=identifiers)
def test_an_entry_module_that_is_nowhere(module: list[str], attr: str, tally) -> None:
    assume(module[0] != "kk")
    doc = base()
    doc["kernel"]["k"]["entry"] = f"{'.'.join(module)}:{attr}"
    assume(ENTRY_RE.fullmatch(doc["kernel"]["k"]["entry"]))
    import importlib.util

    assume(importlib.util.find_spec(module[0]) is None)  # not an installed package either
    rejected(toml(doc), f"{K}, entry", "cannot find module")
    _tally(tally, "missing_entry_module")


@SETTINGS
@given(n=st.integers(2, 5), data=st.data())
def test_backward_graphs_with_cycles_self_loops_or_missing_kernels(n: int, data, tally) -> None:
    """Every kernel takes one array and returns one; any backward edge is then invalid (the
    backward must take two), whatever the graph: cycles, self-loops, dangling names."""
    names = [f"k{i}" for i in range(n)]
    targets = st.one_of(st.sampled_from(names), identifiers)
    edges = data.draw(st.dictionaries(st.sampled_from(names), targets, min_size=1), label="edges")
    doc = base()
    one = doc["kernel"].pop("k")
    for name in names:
        k = json.loads(json.dumps(one))
        k["args"] = k["args"][:3]
        if name in edges:
            k["grad"] = {"backward": edges[name]}
        doc["kernel"][name] = k
    first = next(nm for nm in names if nm in edges)
    target = edges[first]
    fragment = ("a kernel cannot be its own backward" if target == first else
                "must take the forward inputs" if target in names else f'no kernel "{target}"')
    rejected(toml(doc), f'kernel "{first}", grad.backward', fragment)
    _tally(tally, "backward_graph")


@SETTINGS
@given(arch=st.text(max_size=10).filter(lambda s: not ARCH_RE.fullmatch(s)),
       per_kernel=st.booleans())
def test_an_arch_that_is_not_one(arch: str, per_kernel: bool, tally) -> None:
    doc = base()
    if per_kernel:
        doc["kernel"]["k"]["archs"] = [arch]
        key_path = f"{K}, archs[0]"
    else:
        doc["archs"] = ["sm_90a", arch]
        key_path = "archs[1]"
    rejected(toml(doc), key_path, "is not a GPU architecture")
    _tally(tally, "bad_arch")


@settings(max_examples=soak(10, 60), deadline=None)
@given(sizes=st.lists(st.integers(2, 60), min_size=2, max_size=4).filter(
    lambda s: math.prod(s) > 10_000))
def test_a_variant_matrix_over_the_limit(sizes: list[int], tally) -> None:
    doc = base()
    k = doc["kernel"]["k"]
    k["variants"] = {f"p{i}": list(range(n)) for i, n in enumerate(sizes)}
    k["constants"] = {f"c{i}": f"$p{i}" for i in range(len(sizes))}
    rejected(toml(doc), f"{K}, variants", f"expands to {math.prod(sizes)} variants")
    _tally(tally, "variant_explosion")


@settings(max_examples=soak(10, 60), deadline=None)
@given(depth=st.integers(MAX_TUPLE_DEPTH + 1, 60))
def test_tuples_nested_too_deep(depth: int, tally) -> None:
    doc = base()
    arg: Any = {"name": "out", "role": "output", "dtype": "float32", "shape": ["n", 4]}
    for _ in range(depth):
        arg = {"kind": "tuple", "items": [arg]}
    doc["kernel"]["k"]["args"][2] = arg
    rejected(toml(doc), f"{K}, args[2]" + ".items[0]" * MAX_TUPLE_DEPTH,
             f"tuples nested more than {MAX_TUPLE_DEPTH} deep")
    _tally(tally, "deep_tuple")


@settings(max_examples=soak(5, 20), deadline=None)
@given(depth=st.integers(2_000, 300_000), kind=st.sampled_from("[{"))
def test_arrays_or_tables_nested_beyond_the_parser(depth: int, kind: str, tally) -> None:
    value = "[" * depth + "1" + "]" * depth if kind == "[" else "{a = " * depth + "1" + "}" * depth
    rejected(f"x = {value}\n".encode(), None, "nested too deeply")
    _tally(tally, "deep_nesting")


@SETTINGS
@given(at=st.integers(0, 10_000), bad=st.sampled_from([b"\xff", b"\xfe", b"\x80", b"\xc3(",
                                                        b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc",
                                                        b"\xed\xa0\x80"]))
def test_bytes_that_are_not_utf8(at: int, bad: bytes, tally) -> None:
    good = toml(base())  # ASCII only: any offset is a character boundary
    at = at % (len(good) + 1)
    rejected(good[:at] + bad + good[at:], None, f"not UTF-8 (byte {at})")
    _tally(tally, "non_utf8")


@settings(max_examples=soak(3, 10), deadline=None)
@given(extra=st.integers(1, 64 * 1024), padding=st.sampled_from(["comment", "string"]))
def test_files_over_the_size_limit(extra: int, padding: str, tally) -> None:
    good = toml(base())
    head, tail = (b"#", b"\n") if padding == "comment" else (b'description_ = "', b'"\n')
    filler = MAX_MANIFEST_BYTES - len(good) - len(head) - len(tail) + extra
    content = good + head + b"x" * filler + tail
    assert len(content) > MAX_MANIFEST_BYTES
    rejected(content, None, f"manifest is {len(content)} bytes, over the")
    _tally(tally, "oversized")


@SETTINGS
@given(junk=st.sampled_from(['x = ', '[kernel', 'a = "unterminated', 'a = 1\na = 2',
                             "= 3", "a = [1,,2]", 'a = {b = 1,}', "a = 0x", "a = 1979-05-27T"]))
def test_text_that_is_not_toml(junk: str, tally) -> None:
    rejected(toml(base()) + junk.encode() + b"\n", None, "invalid TOML")
    _tally(tally, "invalid_toml")


@SETTINGS
@given(where=st.sampled_from([("archs", "tool.cutecc.archs", (list, str)),
                              ("profile", "tool.cutecc.profile", (str,)),
                              ("kernel", "tool.cutecc.kernel", (dict,))]), data=st.data())
def test_pyproject_tool_cutecc_names_the_full_key_path(where, data, tally) -> None:
    key, key_path, ok_types = where
    doc = base()
    doc[key] = data.draw(not_of(*ok_types))
    text = toml({"tool": {"cutecc": doc}}) + b"[project]\nname = \"x\"\n"
    err = rejected(text, None, name="pyproject.toml")
    assert f": {key_path}" in err, err
    _tally(tally, "pyproject")


# Valid edge cases: accepted, planned exactly, nothing written --------------------------


@settings(max_examples=soak(15, 100), deadline=None)
@given(names=st.lists(identifiers, min_size=1, max_size=4, unique=True),
       sizes=st.lists(st.integers(1, 12), min_size=0, max_size=3),
       archs=st.lists(st.sampled_from(["sm_90a", "sm_80", "sm_100a", "sm_120f", "sm_86"]),
                      min_size=1, max_size=3, unique=True),
       description=st.text(max_size=40), extent=st.integers(1, 2 ** 31 - 1))
def test_edge_case_manifests_plan_exactly_what_they_declare(names, sizes, archs, description,
                                                            extent, tally) -> None:
    doc = base()
    doc["archs"] = archs
    one = doc["kernel"].pop("k")
    for name in names:
        k = json.loads(json.dumps(one))
        k["description"] = description
        k["args"][1]["shape"] = ["n", extent]
        k["args"][2]["shape"] = ["n", extent]
        k["variants"] = {f"p{i}": list(range(n)) for i, n in enumerate(sizes)}
        k["constants"] = {"threads": 128, **{f"c{i}": f"$p{i}" for i in range(len(sizes))}}
        doc["kernel"][name] = k
    planned = accepted(doc)
    assert len(planned) == len(names) * math.prod(sizes) * len(archs)
    assert {p.split("[")[0] for p in planned} == set(names)
    tally.add("manifests", valid_edge_cases_planned=1)


@pytest.mark.usefixtures("dsl")
def test_an_entry_attribute_the_module_lacks_is_caught_before_compiling(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="a real build needs the build extra")
    from .conftest import write_toy_project

    manifest = write_toy_project(tmp_path / "proj", threads=(64,))
    manifest.write_text(manifest.read_text().replace("toy.ops:scale", "toy.ops:no_such_launcher"))
    r = CliRunner().invoke(main, ["build", str(manifest), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 2 and f'{manifest.resolve()}: kernel "scale", entry: ' in r.stderr
    assert 'module "toy.ops" defines no "no_such_launcher"' in r.stderr
    assert "Traceback" not in r.output and not (tmp_path / "cache").exists()
