"""cutecc.plan.keyed_sources: what a build worker checks after its compile, before publishing:
the files its key read still hold the keyed bytes, and the modules it imported are those files."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

from cutecc.plan.key import SourceIndex
from cutecc.plan.keyed_sources import KeyedFile, problem


def _keyed(path: Path, module: str, rel: str) -> KeyedFile:
    return KeyedFile(str(path), module, rel, hashlib.sha256(path.read_bytes()).hexdigest())


def test_the_files_a_digest_read_are_what_the_worker_checks(tmp_path: Path) -> None:
    pkg = tmp_path / "kpkg_files"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text("from kpkg_files import helper\n")
    (pkg / "helper.py").write_text("X = 1\n")
    index = SourceIndex((tmp_path,))
    files = index.files("kpkg_files.ops")
    assert [(f.rel, f.module) for f in files] == [
        ("kpkg_files/__init__.py", "kpkg_files"), ("kpkg_files/helper.py", "kpkg_files.helper"),
        ("kpkg_files/ops.py", "kpkg_files.ops")]
    assert problem(files) is None
    # the key's digest is a function of exactly these files
    digest = hashlib.sha256(b"".join(f.rel.encode() + b"\0" + f.sha256.encode() + b"\0"
                                     for f in files)).hexdigest()
    assert index.digest("kpkg_files.ops")[0] == digest


def test_an_edited_or_removed_source_is_named(tmp_path: Path) -> None:
    f = tmp_path / "kmod_edit.py"
    f.write_text("X = 1\n")
    keyed = _keyed(f, "kmod_edit", "kmod_edit.py")
    f.write_text("X = 2\n")
    why = problem([keyed])
    assert why and "kmod_edit.py" in why and "changed since the build was planned" in why
    f.unlink()
    why = problem([keyed])
    assert why and "kmod_edit.py" in why


def test_a_module_imported_from_another_file_than_the_keyed_one_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keyed_file, imported_file = tmp_path / "a" / "kmod_where.py", tmp_path / "b" / "kmod_where.py"
    for f in (keyed_file, imported_file):
        f.parent.mkdir()
        f.write_text("X = 1\n")  # the same bytes: only where it came from differs
    spec = importlib.util.spec_from_file_location("kmod_where", imported_file)
    assert spec is not None
    monkeypatch.setitem(sys.modules, "kmod_where", importlib.util.module_from_spec(spec))
    why = problem([_keyed(keyed_file, "kmod_where", "kmod_where.py")])
    assert why and str(imported_file) in why and str(keyed_file) in why
    assert problem([_keyed(imported_file, "kmod_where", "kmod_where.py")]) is None
