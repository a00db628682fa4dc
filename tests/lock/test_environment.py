"""The lock's environment: which key-deciding distributions its keys were planned with, so a
build (or verify) elsewhere names, in one line and before any compile, what differs; and a
lock the build could not rewrite refused before any compile."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import opts, run_cli, write_toy_project

from cutecc.build import builder, outcome
from cutecc.cli import main
from cutecc.commands.build import build
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Environment, Lock, read_lock, write_lock
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan
from tests.toolchain.test_installed_code import BOTH, KERNEL, LIB, forget, install, project


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    forget()
    yield d
    forget()


def _lock_planned_in_this_environment(manifest: Path) -> Path:
    forget()
    planned = plan(load_manifest(manifest))
    path = manifest.parent / "kernels.lock"
    write_lock(path, Lock((), environment=builder.environment_of(planned)))
    return path


def test_a_lock_records_the_distributions_its_keys_were_planned_with(tmp_path: Path, site: Path) -> None:
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    lock = read_lock(_lock_planned_in_this_environment(m))
    assert lock.environment is not None
    got = dict(lock.environment.distributions)
    assert got["fakelib"].startswith("1.0 ") and "nvidia-cutlass-dsl" in got
    # written once per line, sorted: a drift diffs as one line per distribution
    text = (m.parent / "kernels.lock").read_text()
    assert '   "fakelib": "1.0 ' in text
    assert read_lock(m.parent / "kernels.lock") == lock


def test_a_build_in_another_environment_names_what_differs_before_compiling(
        tmp_path: Path, site: Path) -> None:
    info = install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    _lock_planned_in_this_environment(m)
    shutil.rmtree(info)
    shutil.rmtree(site / "fakelib")
    install(site, "fakelib", "1.1", {**LIB, "fakelib/util.py": "K = 3\n"})
    notes: list[str] = []

    class Notes(outcome.Progress):
        def note(self, text: str) -> None:
            notes.append(text)

        def start(self, total: int) -> None:
            notes.append(f"start {total}")

    report = build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True, progress=Notes())
    assert [str(d) for d in report.drift] == ["fakelib 1.0 -> 1.1"]
    assert len(notes) == 1 and "fakelib 1.0 -> 1.1" in notes[0] and "kernels.lock" in notes[0]
    assert report.to_json()["drift"][0]["distribution"] == "fakelib"


def test_the_drift_line_names_the_manifests_pins(tmp_path: Path, site: Path) -> None:
    info = install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    m.write_text(m.read_text().replace('archs = ["sm_90a"]\n',
                                       'archs = ["sm_90a"]\n[build]\npins = "pins/build.txt"\n'))
    _lock_planned_in_this_environment(m)
    shutil.rmtree(info)
    install(site, "fakelib", "1.0.post1", LIB)
    report = build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True)
    assert [str(d) for d in report.drift] == ["fakelib 1.0 -> 1.0.post1"]
    assert f"pip install --require-hashes -r {m.parent / 'pins/build.txt'}" in (report.drift_note or "")


def test_the_same_environment_says_nothing(tmp_path: Path, site: Path) -> None:
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    _lock_planned_in_this_environment(m)
    report = build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True)
    assert report.drift == [] and report.drift_note is None


@pytest.mark.parametrize("content", [b"{not json", b'{"format": 3, "entries": 7}', b"\xff" * 100,
                                     b'{"format": 3, "entries": [], "environment": {"format": 1, '
                                     b'"distributions": {"x": 5}}}'])
def test_a_bad_lock_is_refused_before_anything_compiles(tmp_path: Path, content: bytes) -> None:
    m = write_toy_project(tmp_path / "proj")
    (m.parent / "kernels.lock").write_bytes(content)
    t0 = time.monotonic()
    with pytest.raises(CuteccError) as e:
        build(m, opts(cache_dir=tmp_path / "cache"))
    assert time.monotonic() - t0 < 5
    assert "kernels.lock" in str(e.value.where)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("meta.json"))
    assert (m.parent / "kernels.lock").read_bytes() == content  # nothing lost


def test_a_lock_that_is_no_regular_file_is_refused_before_anything_compiles(tmp_path: Path) -> None:
    m = write_toy_project(tmp_path / "proj")
    os.mkfifo(m.parent / "kernels.lock")  # reading it would block forever
    r = CliRunner().invoke(main, ["build", str(m), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 2, r.output
    assert "kernels.lock" in r.output and "regular file" in r.output


def test_an_environment_of_a_later_format_decides_nothing(tmp_path: Path) -> None:
    p = tmp_path / "kernels.lock"
    p.write_text(json.dumps({"format": 3, "entries": [],
                             "environment": {"format": 99, "anything": [1]}}))
    assert read_lock(p).environment is None


def test_a_drift_says_gone_and_same_version_other_files() -> None:
    from cutecc.lock.environment import Drift

    assert str(Drift("a", "1.0 x", None)) == "a 1.0 -> absent"
    assert str(Drift("a", None, "2 y")) == "a absent -> 2"
    assert str(Drift("a", "1.0 x", "1.0 y")) == "a 1.0 -> 1.0 (other files)"


def test_a_partial_build_keeps_the_distributions_it_did_not_reach() -> None:
    old = Environment((("a", "1 x"), ("b", "2 y")))
    new = Environment((("b", "3 z"),))
    assert new.merged(old).distributions == (("a", "1 x"), ("b", "3 z"))


def test_verify_names_the_distributions_whose_version_differs_from_the_locks(tmp_path: Path) -> None:
    import importlib.metadata as md

    from cutecc.commands.verify import verify
    from cutecc.store.writer import Store

    click_version = md.version("click")
    lock = tmp_path / "kernels.lock"
    write_lock(lock, Lock((), environment=Environment((("click", f"{click_version} d"),
                                                       ("filelock", "0.0.1 d")))))
    Store(tmp_path / "cache").ensure()
    r = CliRunner().invoke(main, ["verify", "--lock", str(lock), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert f"filelock 0.0.1 -> {md.version('filelock')}" in r.output and "click" not in r.output
    assert verify(tmp_path / "cache").drift_note is None


DEP = {"fakedep/__init__.py": "N = 1\n"}
SUBSETS = (KERNEL.format(name="uses_dep", entry="kp.uses_dep:kern")
           + KERNEL.format(name="uses_lib", entry="kp.uses_lib:kern"))


def test_a_subset_build_leaves_the_locks_environment_as_it_is(tmp_path: Path, site: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One kernel imports `fakedep` (its code is keyed by content), another reaches it only as
    `fakelib`'s requirement (keyed by its RECORD): the lock's environment names it the same
    whichever of them a build planned, so `--kernel` rewrites nothing and warns of nothing;
    an edit of one of its installed files is named, whichever kernel is built."""
    from helpers import fake_compile

    import cutecc.build.executors.local

    monkeypatch.setattr(cutecc.build.executors.local, "compile_all",
                        lambda *a, remote=None, limits=None: fake_compile(*a))
    install(site, "fakedep", "1.0", DEP)
    install(site, "fakelib", "1.0", LIB, requires=("fakedep",))
    m = project(tmp_path, SUBSETS)
    (m.parent / "kp/uses_dep.py").write_text("import fakedep\n\n\ndef kern(x, out, stream):\n    pass\n")
    cache = tmp_path / "cache"
    assert build(m, opts(cache_dir=cache)).ok
    lock = m.parent / "kernels.lock"
    whole = lock.read_bytes()
    assert '"fakedep": "1.0 ' in whole.decode()
    for kernel in ("uses_dep", "uses_lib", "uses_dep"):
        forget()
        r = build(m, opts(cache_dir=cache), kernels=(kernel,))
        assert r.ok and r.drift == [] and r.drift_note is None, (kernel, r.drift_note)
        assert lock.read_bytes() == whole, kernel
    forget()
    assert build(m, opts(cache_dir=cache)).ok and lock.read_bytes() == whole
    # an installed file really changed: said, whichever kernel reaches it
    (site / "fakedep/__init__.py").write_text("N = 2\n")
    for kernel in ("uses_lib", "uses_dep"):
        forget()
        r = build(m, opts(cache_dir=cache), kernels=(kernel,), dry_run=True)
        assert [str(d) for d in r.drift] == ["fakedep 1.0 -> 1.0 (other files)"], kernel


def test_a_format_1_environment_is_compared_by_version_alone() -> None:
    """Format 1 named a distribution reached only as a requirement by its RECORD: its
    digests are of another formula, so only versions tell a drift, and a partial build
    keeps none of them (the next whole build names them again)."""
    old = Environment.from_json({"format": 1, "distributions": {"a": "1 x", "b": "2 y"}}, "kernels.lock")
    assert old is not None and not old.digests
    here = Environment((("a", "1 other"), ("b", "3 z")))
    assert [str(d) for d in old.drift(here)] == ["b 2 -> 3"]
    assert here.merged(old) == here
    assert Environment.from_json(here.to_json(), "kernels.lock") == here and here.to_json()["format"] == 2


def _with_pins(m: Path, pins: str) -> Path:
    m.write_text(m.read_text().replace('archs = ["sm_90a"]\n',
                                       'archs = ["sm_90a"]\n[build]\npins = "requirements.txt"\n'))
    (m.parent / "requirements.txt").write_text(pins)
    return m.parent / "requirements.txt"


def test_the_drift_line_names_the_pin_to_change(tmp_path: Path, site: Path) -> None:
    """Seen: the pins had moved with the environment (a re-resolve), and the line said to
    install them: it names the pin that is not the lock's version instead."""
    info = install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    _lock_planned_in_this_environment(m)
    shutil.rmtree(info)
    install(site, "fakelib", "1.1", LIB)
    pins = _with_pins(m, "# pinned\nfakelib==1.1 \\\n    --hash=sha256:00\nother==2\n")
    report = build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True)
    note = report.drift_note or ""
    assert "fakelib 1.0 -> 1.1" in note, note
    assert f"in {pins}, change fakelib==1.1 to fakelib==1.0, then run `pip install --require-hashes " \
        f"-r {pins}`" in note, note
    pins.write_text("other==2\n")  # no pin for it at all
    note = build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True).drift_note or ""
    assert f"in {pins}, add fakelib==1.0, then run `pip install -r {pins}`" in note, note
    pins.write_text("fakelib==1.0\n")  # the pins are the lock's: installing them is the fix
    note = build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True).drift_note or ""
    assert f"run `pip install -r {pins}` to reproduce it" in note, note


def test_pins_unlike_what_is_installed_are_named_without_a_lock(tmp_path: Path, site: Path) -> None:
    install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    pins = _with_pins(m, "fakelib==0.9\n")
    note = build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True).drift_note or ""
    assert f"this environment is not the one {pins} pins (fakelib 1.0 installed, {pins} pins 0.9)" \
        in note, note
    pins.write_text("fakelib==1.0\n")
    assert build(m, opts(cache_dir=tmp_path / "cache"), dry_run=True).drift_note is None


def test_the_cli_says_the_drift_once(tmp_path: Path, site: Path) -> None:
    """Seen: the line printed twice (before the compile, and again with the warnings)."""
    info = install(site, "fakelib", "1.0", LIB)
    m = project(tmp_path, BOTH)
    _lock_planned_in_this_environment(m)
    shutil.rmtree(info)
    install(site, "fakelib", "1.1", LIB)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    for json_out in ((), ("--json",)):
        r = run_cli("build", str(m), "--dry-run", "--cache-dir", str(tmp_path / "cache"), *json_out,
                    env={"PYTHONPATH": path})
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stderr.count("was made in another environment (fakelib 1.0 -> 1.1)") == 1, r.stderr
