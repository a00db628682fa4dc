"""docs/archs.md's table of which built target runs on which GPU: every line is what the
runtime's rule (`cutecc.archs.runs_on`) says, so the table cannot drift from the code."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

from cutecc.archs import check_device_arch, dsl_arch, is_arch, is_ptx, runs_on
from cutecc.errors import CuteccError

ROW = re.compile(r"^\| `((?:sm|compute)_\w+)` \| `(sm_\w+)`[^|]*\| (yes|no) \|", re.M)


def test_every_line_of_the_arch_table_is_the_runtimes_rule() -> None:
    rows = ROW.findall((REPO / "docs" / "archs.md").read_text())
    assert len(rows) >= 19
    wrong = [(b, d, said) for b, d, said in rows if (runs_on(b, d) > 0) != (said == "yes")]
    assert not wrong, wrong


def test_the_better_match_wins_where_several_run() -> None:
    assert runs_on("sm_90a", "sm_90") > runs_on("sm_90", "sm_90") > 0
    assert runs_on("sm_80", "sm_80") > runs_on("sm_80", "sm_86") > 0
    # exact machine code, then family or an older minor, then portable PTX
    assert runs_on("sm_90a", "sm_90") > runs_on("sm_90", "sm_90") > runs_on("compute_90", "sm_90") > 0
    assert runs_on("sm_100f", "sm_103") > runs_on("compute_100", "sm_103") > 0
    assert runs_on("sm_80", "sm_89") > runs_on("compute_80", "sm_89") > 0


def test_portable_ptx_is_named_apart_from_gpus() -> None:
    assert is_arch("compute_80") and is_ptx("compute_80") and not is_ptx("sm_80")
    assert not is_arch("compute_90a") and not is_arch("compute_100f")  # PTX carries no suffix here
    assert dsl_arch("compute_80") == "sm_80" and dsl_arch("sm_90a") == "sm_90a"
    with pytest.raises(CuteccError, match="names portable PTX, not a GPU"):
        check_device_arch("compute_80", "--gpu")
