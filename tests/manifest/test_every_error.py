"""Every manifest error of a run at once, in file order and capped: two grad pairings that
each leave a returned output's cotangent untaken are both named, beside a kernel that does
not parse between them; one error alone is raised as it always was."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cutecc.cli import main
from cutecc.errors import CuteccError, ManifestErrors
from cutecc.manifest import load_manifest
from cutecc.manifest.parse import MAX_REPORTED_ERRORS

FWD = """
[kernel.{name}]
entry = "kk.elem:rownorm"
args = [
  {{ name = "x", dtype = "float32", shape = ["m", "n"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["m", "n"] }},
  {{ name = "rstd", role = "output", dtype = "float32", shape = ["m"] }},
  {{ kind = "stream" }},
]
grad = {{ backward = "rownorm_bwd", args = ["x", "rstd", "cotangent.out"] }}
"""
BAD = """
[kernel.broken]
entry = "kk.elem:f"
args = [{ name = "x", dtype = "float33", shape = ["n"] }]
"""
BWD = """
[kernel.rownorm_bwd]
entry = "kk.elem:rownorm_bwd"
args = [
  { name = "x", dtype = "float32", shape = ["m", "n"] },
  { name = "rstd", dtype = "float32", shape = ["m"] },
  { name = "dout", dtype = "float32", shape = ["m", "n"] },
  { name = "dx", role = "output", dtype = "float32", shape = ["m", "n"] },
  { kind = "stream" },
]
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "kernels.toml"
    p.write_text(text)
    return p


def test_two_pairings_and_a_bad_kernel_are_reported_in_one_run(tmp_path: Path) -> None:
    p = _write(tmp_path, FWD.format(name="first") + BAD + FWD.format(name="second") + BWD)
    with pytest.raises(ManifestErrors) as info:
        load_manifest(p)
    e = info.value
    assert e.exit_code == 2 and isinstance(e, CuteccError)
    assert [x.key_path for x in e.errors] == ['kernel "first", grad.args', 'kernel "broken", args[0].dtype',
                                             'kernel "second", grad.args']
    assert all(x.where == str(p) for x in e.errors)
    assert 'takes no cotangent of returned output "rstd"' in e.errors[2].message
    assert e.key_path == 'kernel "first", grad.args' and "3 errors" in str(e)
    # at the CLI: one `error:` line each, in file order, exit 2
    r = CliRunner().invoke(main, ["build", str(p), "--cache-dir", str(tmp_path / "c")], prog_name="cutecc")
    lines = r.stderr.splitlines()
    assert r.exit_code == 2 and len(lines) == 3, r.stderr
    assert all(line.startswith("error: ") for line in lines)
    assert '"first"' in lines[0] and '"broken"' in lines[1] and '"second"' in lines[2]


def test_one_error_is_raised_as_itself(tmp_path: Path) -> None:
    p = _write(tmp_path, FWD.format(name="first") + BWD)
    with pytest.raises(CuteccError) as info:
        load_manifest(p)
    assert not isinstance(info.value, ManifestErrors)
    assert info.value.key_path == 'kernel "first", grad.args'


def test_the_report_is_capped(tmp_path: Path) -> None:
    n = MAX_REPORTED_ERRORS + 5
    p = _write(tmp_path, "".join(BAD.replace("broken", f"broken{i}") for i in range(n)))
    with pytest.raises(ManifestErrors) as info:
        load_manifest(p)
    e = info.value
    assert len(e.errors) == MAX_REPORTED_ERRORS and e.more == 5
    assert [x.key_path for x in e.errors][:2] == ['kernel "broken0", args[0].dtype',
                                                  'kernel "broken1", args[0].dtype']
    assert "and 5 more" in e.render()
