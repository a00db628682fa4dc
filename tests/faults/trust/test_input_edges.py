"""Input edges are refused: trailing newlines in archs, reserved kernel names, out-of-range
defaults, extents and alignments, symbolic extents of 2^31 and more.

Seen: `archs = ["sm_90a\\n"]` passes the arch check (a `$` anchor matches before a final
newline) and every compile then fails with a DSL KeyError traceback; `load(arch="sm_90a\\n")`
is accepted; kernel names `_private` or `get` shadow the kernel set's own attributes; an
int32 scalar default of 2^40 is accepted (the DSL truncates it to 0); static extents from
2^31 to 2^63 and `align = 2^40` are accepted; symbolic extents are compiled as 32-bit, so a
call with an extent of 2^31 or more is not safe.

The manifest cases use `cutecc build --dry-run` (plans, compiles nothing): a bad input
must be exit 2 with one line naming the file and key path, and plan nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import ARCH, CUTECC_ROOT, Cache, cli, one_line_error, out, py

AXPY_ARGS = '''[
  { kind = "stream" },
  { kind = "scalar", name = "alpha", dtype = "float32", default = 1.0 },
  { name = "x", dtype = "float32", shape = [X_SHAPE], ALIGN },
  { name = "y", role = "inout", dtype = "float32", shape = [X_SHAPE] },
  { kind = "none" },SCALAR
]'''


def manifest(tmp_path: Path, *, archs: str = '["sm_90a"]', name: str = "axpy",
             x_shape: str = '"n"', align: str = "align = 16", scalar: str = "") -> Path:
    args = (AXPY_ARGS.replace("X_SHAPE", x_shape).replace("ALIGN", align)
            .replace("SCALAR", f"\n  {scalar}," if scalar else ""))
    text = (f'archs = {archs}\npython_path = ["{CUTECC_ROOT}"]\n\n[kernel.{name}]\n'
            f'entry = "kernels.axpy:axpy_"\nargs = {args}\nconstants = {{ threads = 256 }}\n')
    path = tmp_path / "kernels.toml"
    path.write_text(text)
    return path


def refused(path: Path, *fragments: str) -> str:
    r = cli("build", path, "--dry-run", "--cache-dir", path.parent / "cache")
    assert "would build" not in r.stdout, f"accepted and planned:\n{r.stdout.strip()}"
    err = one_line_error(r, (2,))
    assert len(err.strip().splitlines()) == 1, err
    for f in fragments:
        assert f in err, (f, err)
    return err


def test_the_dry_run_of_a_good_manifest_plans_one_entry(tmp_path: Path) -> None:
    """(Control, passes today: the template itself is fine.)"""
    r = cli("build", manifest(tmp_path), "--dry-run", "--cache-dir", tmp_path / "cache")
    assert r.returncode == 0 and "would build axpy[default]@sm_90a" in r.stdout, out(r)


@pytest.mark.parametrize("archs", ['["sm_90a\\n"]', '"sm_90a\\n"'])
def test_an_arch_with_a_trailing_newline_is_refused(tmp_path: Path, archs: str) -> None:
    """`archs = ["sm_90a\\n"]` is not an arch (full-match regexes)."""
    refused(manifest(tmp_path, archs=archs), "archs")


def test_a_kernel_arch_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    """The same in a kernel's own `archs`."""
    path = manifest(tmp_path)
    path.write_text(path.read_text() + 'archs = ["sm_90a\\n"]\n')
    refused(path, "archs")


def test_load_refuses_an_arch_with_a_trailing_newline(built: Cache) -> None:
    """`cutecc.load(arch="sm_90a\\n")` is a CuteccError, not an arch."""
    r = py("import sys, cutecc\nfrom cutecc.errors import CuteccError\n"
           "try:\n    ks = cutecc.load(sys.argv[1], arch='sm_90a\\n')\n    print('ACCEPTED', repr(ks.arch))\n"
           "except CuteccError as e:\n    print('REFUSED', e)\n", built.root)
    assert r.stdout.startswith("REFUSED"), out(r)


@pytest.mark.parametrize("name", ["_private", "get", "register_all", "problems", "arch"])
def test_a_kernel_name_that_shadows_the_kernel_set_is_refused(tmp_path: Path, name: str) -> None:
    """A kernel is an attribute of the kernel set (`kernels.NAME`): names
    starting with `_` and the set's own attributes are reserved."""
    refused(manifest(tmp_path, name=name), name)


@pytest.mark.parametrize("dtype,value", [("int32", 2**40), ("int32", -(2**31) - 1),
                                         ("float32", 1e39)])
def test_a_scalar_default_out_of_its_dtypes_range_is_refused(tmp_path: Path, dtype: str,
                                                             value: float) -> None:
    """An int32 default of 2^40 (the DSL truncates it to 0) is refused, and so
    is a float32 default that overflows to inf."""
    scalar = f'{{ kind = "scalar", name = "count", dtype = "{dtype}", default = {value} }}'
    refused(manifest(tmp_path, scalar=scalar), "default")


@pytest.mark.parametrize("extent", [2**31, 2**40, 2**63 - 1])
def test_a_static_extent_of_2_31_or_more_is_refused(tmp_path: Path, extent: int) -> None:
    """Static extents are range-checked for what the DSL compiles (32-bit)."""
    refused(manifest(tmp_path, x_shape=str(extent)), "shape")


@pytest.mark.parametrize("align", [2**40, 2**32])
def test_an_alignment_beyond_what_the_dsl_accepts_is_refused(tmp_path: Path, align: int) -> None:
    """`align = 2^40` is refused (and 2^32: beyond any 32-bit field; XLA itself
    guarantees only 16-byte aligned entry parameters, see NOTES.md)."""
    refused(manifest(tmp_path, align=f"align = {align}"), "align")


LOWER = r'''
import json, sys
import jax, jax.numpy as jnp
import cutecc
from cutecc.errors import CuteccError
ks = cutecc.load(sys.argv[1], arch=sys.argv[2], kernels=["mul"])
x = jax.ShapeDtypeStruct((int(sys.argv[3]),), jnp.float32)
try:
    jax.jit(lambda a, b: ks.mul(a, b)).trace(x, x).lower(lowering_platforms=("cuda",))
    print(json.dumps({"lowered": True}))
except CuteccError as e:
    print(json.dumps({"lowered": False, "error": str(e)}))
'''


def test_a_call_with_a_symbolic_extent_of_2_31_is_refused_or_the_contract_is_64_bit(
        built: Cache) -> None:
    """The symbolic `n` is compiled as a 32-bit `cute.sym_int()`: lowering a
    call with n = 2^31 must be refused by dispatch (naming the extent), unless the entry's
    contract records 64-bit symbolic extents (a field such as `extent_bits: 64` or
    `index_dtype: "int64"` in its args)."""
    r = py(LOWER, built.root, ARCH, str(2**31))
    assert r.returncode == 0, out(r)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if not got["lowered"]:
        assert "2147483648" in got["error"] or "2^31" in got["error"] or "int32" in got["error"], got
        return
    args = json.dumps(built.meta(built.key("mul", "float32"))["args"])
    assert re.search(r'"(\w*(extent|index|sym)\w*)": ("int64"|64)', args), (
        "a call with n = 2^31 lowered against a kernel compiled with 32-bit symbolic extents")
