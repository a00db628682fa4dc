"""docs/archs.md's table of which built target runs on which GPU: every line is what the
runtime's rule (`cutecc.archs.runs_on`) says, so the table cannot drift from the code."""

from __future__ import annotations

import re

from helpers import REPO

from cutecc.archs import runs_on

ROW = re.compile(r"^\| `(sm_\w+)` \| `(sm_\w+)`[^|]*\| (yes|no) \|", re.M)


def test_every_line_of_the_arch_table_is_the_runtimes_rule() -> None:
    rows = ROW.findall((REPO / "docs" / "archs.md").read_text())
    assert len(rows) >= 15
    wrong = [(b, d, said) for b, d, said in rows if (runs_on(b, d) > 0) != (said == "yes")]
    assert not wrong, wrong


def test_the_better_match_wins_where_several_run() -> None:
    assert runs_on("sm_90a", "sm_90") > runs_on("sm_90", "sm_90") > 0
    assert runs_on("sm_80", "sm_80") > runs_on("sm_80", "sm_86") > 0
