"""Installed files told by their stat against their RECORD (`cutecc.toolchain.recordstat`):
an untouched install is keyed without reading a file, with the digest hashing gives; every
edit (same size, mtime put back; `touch -r`; `cp -p`; a link; a RECORD rewritten or touched
after it; a copy keeping times) is hashed and moves the digest; and where ctimes move
without an edit (a second install by hardlink, an archive unpacked dist-info first) the
files are hashed, not trusted.

Real files in temporary directories: real `os.link`, `tarfile` extraction, `touch` and `cp`.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

import cutecc.toolchain.dists as dists
import cutecc.toolchain.hashcache
import cutecc.toolchain.recordstat
from cutecc.toolchain.hashcache import HashCache

FILES = {
    "fakelib/__init__.py": "from . import core\n",
    "fakelib/core.py": "import fakelib.util\n\n\ndef kern(x, out, stream):\n    return fakelib.util.K\n",
    "fakelib/util.py": "K = 1\n" + "# padding\n" * 200,
    "fakelib/sub/__init__.py": "",
    "fakelib/sub/k.py": "V = 1\n",
}
TOTAL = sum(len(t.encode()) for t in FILES.values())
TICK = 0.03  # longer than one tick of the file system's clock: the next write's ctime is later


def _row(rel: str, data: bytes) -> str:
    b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={b64},{len(data)}\n"


def install(site: Path, files: dict[str, str] = FILES, *, link_from: Path | None = None) -> Path:
    """Install `fakelib` 1.0 into `site` as pip does: the files (hardlinked from `link_from`'s
    as uv's link mode does, when given), then INSTALLER, then RECORD, last."""
    info = site / "fakelib-1.0.dist-info"
    info.mkdir(parents=True)
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        if link_from is not None:
            os.link(link_from / rel, site / rel)
        else:
            (site / rel).write_text(text)
    time.sleep(TICK)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakelib\nVersion: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    time.sleep(TICK)
    rows = "".join(_row(rel, text.encode()) for rel, text in files.items())
    own = "".join(f"{info.name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD"))
    (info / "RECORD").write_text(rows + own)
    return info


def forget() -> None:
    importlib.invalidate_caches()
    for f in vars(dists).values():
        if callable(getattr(f, "cache_clear", None)):
            f.cache_clear()


def digest(site: Path, *, trust: bool = True) -> tuple[str, int]:
    """`fakelib`'s full digest as planning computes it from `site` (nothing remembered), and
    how many bytes were read and hashed for it."""
    forget()
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(site))
        forget()
        hashes = HashCache(None, trust_records=trust)
        got = dists.DistIndex(hashes).digest("fakelib", full=True)
    forget()
    return got, hashes.hashed_bytes


@pytest.fixture(params=[False, True], ids=["by-content", "by-record"])
def site(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site directory with `fakelib` installed; stamps count as settled at once. by-record:
    the digest of a large distribution (RECORD + the hash of each file differing from it)."""
    monkeypatch.setattr(cutecc.toolchain.hashcache, "SETTLE_NS", 0)
    if request.param:
        monkeypatch.setattr(dists, "FULL_HASH_LIMIT", 0)
    d = tmp_path / "site"
    install(d)
    return d


def test_an_untouched_install_is_keyed_by_stat_with_the_digest_hashing_gives(site: Path) -> None:
    """Seen: a first planning read and hashed every installed file (torch: 1.14 GB)."""
    fast, read = digest(site)
    slow, read_all = digest(site, trust=False)
    assert (fast, read) == (slow, 0)
    assert read_all == TOTAL


def _same_size_edit(f: Path) -> None:
    """`f` rewritten with other bytes of the same size, its mtime put back."""
    st = f.stat()
    data = f.read_bytes()
    f.write_bytes(data.replace(b"1", b"2", 1))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns


def _edit_touch_r(site: Path, f: Path) -> None:
    ref = site.parent / "ref"
    subprocess.run(["cp", "-p", str(f), str(ref)], check=True)
    f.write_bytes(f.read_bytes().replace(b"1", b"2", 1))
    subprocess.run(["touch", "-r", str(ref), str(f)], check=True)


def _edit_cp_p(site: Path, f: Path) -> None:
    variant = site.parent / "variant.py"
    variant.write_bytes(f.read_bytes().replace(b"1", b"2", 1))
    os.utime(variant, ns=(0, f.stat().st_mtime_ns - 10**9))
    subprocess.run(["cp", "-p", str(variant), str(f)], check=True)


def _record_rewritten(site: Path, f: Path) -> None:
    _same_size_edit(f)
    time.sleep(TICK)
    record = site / "fakelib-1.0.dist-info/RECORD"
    record.write_text(record.read_text())  # the same text, written again after the edit


def _record_touched(site: Path, f: Path) -> None:
    _same_size_edit(f)
    time.sleep(TICK)
    subprocess.run(["touch", str(site / "fakelib-1.0.dist-info/RECORD")], check=True)


def _record_touched_r(site: Path, f: Path) -> None:
    _same_size_edit(f)
    time.sleep(TICK)
    subprocess.run(["touch", "-r", str(f), str(site / "fakelib-1.0.dist-info/RECORD")], check=True)


EDITS = {
    "same-size-mtime-kept": lambda site, f: _same_size_edit(f),
    "touch-r": _edit_touch_r,
    "cp-p": _edit_cp_p,
    "record-rewritten": _record_rewritten,
    "record-touched": _record_touched,
    "record-touch-r": _record_touched_r,
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_is_hashed_and_moves_the_digest(site: Path, edit: str) -> None:
    """Every way of editing an installed file while keeping its size (and its mtime) is
    caught, the RECORD rewritten or touched after the edit or not: the file's ctime is after
    its install's INSTALLER."""
    before, _ = digest(site)
    f = site / "fakelib/util.py"
    EDITS[edit](site, f)
    after, read = digest(site)
    assert after != before
    assert after == digest(site, trust=False)[0]
    assert read >= f.stat().st_size  # the edited file was read


def _reinstall(site: Path) -> None:
    shutil.rmtree(site / "fakelib")
    shutil.rmtree(site / "fakelib-1.0.dist-info")
    install(site)


def test_a_file_linked_into_place_is_hashed(site: Path) -> None:
    """An installed file replaced by a symbolic link to a same-size file older than the
    install (whose own ctime is before the INSTALLER's): hashed, not trusted."""
    before, _ = digest(site)
    older = site.parent / "older.py"
    older.write_bytes((site / "fakelib/util.py").read_bytes().replace(b"1", b"2", 1))
    time.sleep(TICK)
    _reinstall(site)
    (site / "fakelib/util.py").unlink()
    (site / "fakelib/util.py").symlink_to(older)
    after, read = digest(site)
    assert after != before and after == digest(site, trust=False)[0]
    assert read == older.stat().st_size


def test_a_record_rewritten_after_its_install_is_not_trusted(site: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A RECORD written again later than its install's span (shortened here), with a row
    naming another digest of the same size for an untouched file: the files are hashed
    (else the key would be that of an install holding the other content)."""
    monkeypatch.setattr(cutecc.toolchain.recordstat, "INSTALL_SPAN_NS", int(TICK * 1.5e9))
    record = site / "fakelib-1.0.dist-info/RECORD"
    data = (site / "fakelib/util.py").read_bytes()
    lie = _row("fakelib/util.py", data.replace(b"1", b"2", 1))
    time.sleep(2 * TICK)
    record.write_text("".join(lie if r.startswith("fakelib/util.py,") else r
                              for r in record.read_text().splitlines(keepends=True)))
    after, read = digest(site)
    assert after == digest(site, trust=False)[0]
    assert read == TOTAL


def test_a_directory_linked_into_place_is_hashed(site: Path) -> None:
    """A package directory replaced by a link to another tree (a developer's checkout) whose
    same-size edited file predates the install: its files are hashed, not trusted."""
    before, _ = digest(site)
    other = site.parent / "checkout/sub"
    shutil.copytree(site / "fakelib/sub", other)
    (other / "k.py").write_text("V = 2\n")
    os.utime(other / "k.py", ns=(0, 0))
    time.sleep(TICK)
    _reinstall(site)  # an install after the checkout's edit
    shutil.rmtree(site / "fakelib/sub")
    (site / "fakelib/sub").symlink_to(other, target_is_directory=True)
    after, read = digest(site)
    assert after != before and after == digest(site, trust=False)[0]
    assert read == len(b"V = 2\n")  # k.py (and the empty __init__.py)


@pytest.mark.parametrize("keep_times", [True, False], ids=["cp-a", "shutil-copytree"])
def test_a_tree_copied_with_its_times_after_an_edit_is_hashed(
        site: Path, tmp_path: Path, keep_times: bool) -> None:
    """A copy that puts mtimes back (`cp -a`, `shutil.copytree`: a venv copied, a container
    layer) makes every ctime the copy's, in whatever order: its RECORD's mtime is then far
    from its ctime, so the whole distribution is hashed and the edit made before the copy seen."""
    before, _ = digest(site)
    f = site / "fakelib/util.py"
    _same_size_edit(f)
    copy = tmp_path / "copy"
    time.sleep(0.15)  # the RECORD's mtime, put back, is then older than SEAL_NS from the copy's ctime
    if keep_times:
        subprocess.run(["cp", "-a", str(site), str(copy)], check=True)
    else:
        shutil.copytree(site, copy, symlinks=True)
    after, read = digest(copy)
    assert after != before and after == digest(copy, trust=False)[0]
    assert read == TOTAL


def test_a_second_install_by_hardlink_moves_the_firsts_ctimes_and_they_are_hashed(site: Path,
                                                                                   tmp_path: Path) -> None:
    """uv's hardlink mode installing the same wheel into a second venv links the first's
    files again: their ctimes move past the first's INSTALLER (no edit), so the first venv's
    files are hashed; the second's, linked before its own INSTALLER, are trusted."""
    before, _ = digest(site)
    time.sleep(TICK)
    second = tmp_path / "second"
    install(second, link_from=site)
    first, read = digest(site)
    assert (first, read) == (before, TOTAL)
    assert digest(second) == (before, 0)


@pytest.mark.parametrize("dist_info_first", [True, False], ids=["dist-info-first", "package-first"])
def test_an_archive_unpacked_is_hashed(site: Path, tmp_path: Path, dist_info_first: bool) -> None:
    """A tar of the site unpacked with `tarfile` (mtimes put back): written dist-info first,
    every file is newer than the RECORD; written package first after a same-size edit, the
    RECORD's mtime is the archive's, not its write's. Both: every file hashed, edit seen."""
    before, _ = digest(site)
    _same_size_edit(site / "fakelib/util.py")
    time.sleep(0.15)
    tar = tmp_path / "site.tar"
    with tarfile.open(tar, "w") as t:
        order = ["fakelib-1.0.dist-info", "fakelib"]
        for top in order if dist_info_first else order[::-1]:
            t.add(site / top, arcname=top)
    out = tmp_path / "unpacked"
    with tarfile.open(tar) as t:
        names = [m.name for m in t.getmembers()]
        assert names[0] == ("fakelib-1.0.dist-info" if dist_info_first else "fakelib")
        t.extractall(out, filter="fully_trusted")
    after, read = digest(out)
    assert after != before and after == digest(out, trust=False)[0]
    assert read == TOTAL


def test_a_row_without_a_well_formed_sha256_is_hashed(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a row's `sha256=` digest of 32 bytes stands for a file; any other is hashed."""
    monkeypatch.setattr(cutecc.toolchain.hashcache, "SETTLE_NS", 0)
    site = tmp_path / "site"
    info = install(site)
    record = info / "RECORD"
    text = record.read_text()
    rows = text.splitlines(keepends=True)
    util = next(i for i, r in enumerate(rows) if r.startswith("fakelib/util.py,"))
    k = next(i for i, r in enumerate(rows) if r.startswith("fakelib/sub/k.py,"))
    data = (site / "fakelib/util.py").read_bytes()
    rows[util] = f"fakelib/util.py,md5={hashlib.md5(data).hexdigest()},{len(data)}\n"
    rows[k] = rows[k].replace(",sha256=", ",sha256=A", 1)
    record.write_text("".join(rows))
    fast, read = digest(site)
    assert fast == digest(site, trust=False)[0]
    assert read == len(data) + len(b"V = 1\n")


MANIFEST = '''format = 1
archs = ["sm_90a"]

[kernel.k]
entry = "fakelib.core:kern"
args = [{ name = "x", dtype = "float32", shape = ["n"] },
        { name = "out", role = "output", dtype = "float32", shape = ["n"] }, { kind = "stream" }]
'''


def test_verify_deep_plans_with_every_installed_file_hashed(site: Path, tmp_path: Path) -> None:
    """An edit the stat rule cannot see (the INSTALLER and the RECORD written again after it,
    in place: a deliberate re-sealing) leaves a build's key as it was; `cutecc verify --deep`
    plans with every file hashed (`plan_again`), so its key is the edited content's."""
    from cutecc.commands.retrace import plan_again
    from cutecc.manifest import load_manifest
    from cutecc.plan.build_plan import plan

    m = tmp_path / "proj/kernels.toml"
    m.parent.mkdir()
    m.write_text(MANIFEST)

    def key(**kw: object) -> str:
        forget()
        with pytest.MonkeyPatch.context() as mp:
            mp.syspath_prepend(str(site))
            forget()
            got = plan(load_manifest(m), **kw)[0].key  # type: ignore[arg-type]
        forget()
        return got

    before = key()
    _same_size_edit(site / "fakelib/sub/k.py")  # (outside the entry's closure, whose sources are read)
    time.sleep(TICK)
    info = site / "fakelib-1.0.dist-info"
    for name in ("INSTALLER", "RECORD"):
        (info / name).write_bytes((info / name).read_bytes())
        time.sleep(TICK)
    assert key() == before  # what the rule cannot see (recordstat's docstring names it)
    hashed = key(hash_cache=HashCache(None, trust_records=False))
    assert hashed != before
    forget()
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(site))
        forget()
        again = plan_again(m)
    forget()
    assert [p.key for p in again.target.planned] == [hashed]
