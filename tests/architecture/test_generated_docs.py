"""The generated references (`docs/cli.md` from the click parser, `docs/settings.md` from
`cutecc.settings.TABLE`) are up to date: regenerate with `python -m cutecc.cli.docs`."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

from cutecc.cli import docs


def test_the_generated_references_are_up_to_date() -> None:
    assert docs.stale() == [], "run `python -m cutecc.cli.docs` and commit docs/cli.md, docs/settings.md"


def test_the_check_fails_on_a_stale_reference(tmp_path) -> None:
    for name, make in docs.REFERENCES.items():
        (tmp_path / name).write_text(make())
    assert docs.stale(tmp_path) == []
    (tmp_path / "settings.md").write_text(docs.settings_reference().replace("CUTECC_REMOTE_JOBS", "X"))
    assert docs.stale(tmp_path) == [str(tmp_path / "settings.md")]
    r = subprocess.run([sys.executable, "-m", "cutecc.cli.docs", "--check"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_every_setting_with_a_flag_is_in_the_cli_reference() -> None:
    from cutecc import settings

    text = docs.cli_reference()
    for s in settings.TABLE:
        if s.flag:
            assert f"`{s.flag}" in text or f", {s.flag}" in text, s.flag
            assert f"${s.env}" in text, s.env  # its help says what else sets it
