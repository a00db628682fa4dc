"""`cutecc verify`: re-hash every entry against its metadata and find what does not belong.

Reports missing, truncated (size differs) and altered (hash differs) files, malformed
metadata, and orphans: files an entry's metadata does not list, entry directories
without meta.json, and tmp/ leftovers whose key nobody has locked. `fix=True` moves
bad entries to quarantine/ (so the next build rebuilds them) and deletes orphans; it
never touches a healthy entry's files.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import filelock

from cutecc.entry import META, RESERVED_FILES, file_record, is_key, meta_problem
from cutecc.errors import CuteccError
from cutecc.locks import Busy
from cutecc.report import Report
from cutecc.store import Store, entry_trust_problem, read_meta

BAD = frozenset({"missing", "truncated", "altered", "malformed", "untrusted"})  # the entry is unusable


@dataclass
class Problem:
    kind: str  # one of BAD, or "orphan" (a file or dir nothing owns), "stale-tmp"
    path: str
    detail: str
    key: str | None = None
    action: str = ""  # after fix: "quarantined to ...", "removed", "busy: left as is"

    @property
    def fixed(self) -> bool:
        return self.action.startswith(("quarantined", "removed", "gone"))


@dataclass
class VerifyReport(Report):
    cache_dir: str
    entries: int = 0
    healthy: int = 0
    problems: list[Problem] = field(default_factory=list)
    fixed: bool = False

    @property
    def ok(self) -> bool:
        """Clean, or (after a fix) nothing left wrong."""
        return all(p.fixed for p in self.problems) if self.fixed else not self.problems

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "entries": self.entries, "healthy": self.healthy,
                "ok": self.ok, "fixed": self.fixed, "problems": [asdict(p) for p in self.problems]}

    def lines(self, verbose: int = 0) -> list[str]:
        out = [f"{p.kind:9}  {p.path}: {p.detail}" + (f" -> {p.action}" if p.action else "")
               for p in self.problems]
        out.append(f"{self.entries} entries, {self.healthy} healthy, {len(self.problems)} problem(s)"
                   f"{' (fixed)' if self.fixed and self.ok else ''} in {self.cache_dir}")
        return out


def check_entry(path: Path, key: str) -> list[Problem]:
    """The problems of one entry directory (empty when healthy)."""
    for link in (path, path / META):
        if link.is_symlink():  # cutecc publishes real files; a link's target can change under it
            return [Problem("malformed", str(link), f"a symbolic link (to {os.readlink(link)}), "
                            "not what cutecc published", key)]
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as e:
        return [Problem("malformed", str(path / META), f"unreadable metadata: {e}", key)]
    why = meta_problem(meta, key)  # the records, the key inputs and the fields they decide
    if why:
        return [Problem("malformed", str(path / META), why, key)]
    files: dict[str, Any] = meta["files"]
    out = []
    for name, rec in sorted(files.items()):
        f = path / name
        if f.is_symlink():  # cutecc writes none; its target is outside the entry's control
            out.append(Problem("altered", str(f), f"a symbolic link (to {os.readlink(f)}), not "
                               "the file the entry was built with", key))
            continue
        try:
            got = file_record(f)
        except FileNotFoundError:
            out.append(Problem("missing", str(f), "listed in meta.json, not on disk", key))
            continue
        except OSError as e:
            out.append(Problem("missing", str(f), f"unreadable: {e.strerror}", key))
            continue
        if got["size"] != rec["size"]:
            out.append(Problem("truncated", str(f), f"{got['size']} bytes, recorded {rec['size']}", key))
        elif got["sha256"] != rec["sha256"]:
            out.append(Problem("altered", str(f), f"sha256 {got['sha256'][:16]}.., recorded "
                               f"{rec['sha256'][:16]}..", key))
    if not any(p.kind in BAD for p in out):
        why = entry_trust_problem(path, list(files))
        if why:  # whoever could write it could have written its hashes too
            out.append(Problem("untrusted", str(path), why, key))
    try:
        names = sorted(os.listdir(path))
    except OSError:
        names = []
    for name in names:
        if name not in files and name not in RESERVED_FILES:
            out.append(Problem("orphan", str(path / name), "not listed in meta.json", key))
    return out


def verify(cache_dir: str | Path | None = None, *, fix: bool = False,
           lock_timeout: float = 0) -> VerifyReport:
    """Check the whole cache; with `fix`, quarantine bad entries and delete orphans.

    Fixing takes each key's lock (waiting up to `lock_timeout` s); a key held longer,
    e.g. by a build, is left as is and reported busy.
    """
    store = Store(cache_dir).require()
    store.check_trust()  # another user's cache is refused whole, never "fixed"
    report = VerifyReport(str(store.root), fixed=fix)
    for shard in _listdir(store.entries_dir):
        if shard.is_symlink():  # never followed: what it points to is not the cache's
            report.problems.append(Problem("orphan", str(shard), f"a symbolic link (to "
                                           f"{os.readlink(shard)}), not a shard directory"))
            continue
        if not shard.is_dir():
            report.problems.append(Problem("orphan", str(shard), "not a shard directory"))
            continue
        for d in _listdir(shard):
            key = d.name
            if not d.is_dir() or not is_key(key) or key[:2] != shard.name:
                if os.path.lexists(d):  # else removed (gc, rm) since we listed the shard
                    report.problems.append(Problem("orphan", str(d), "not an entry directory"))
                continue
            if not (d / META).exists():
                if d.exists():
                    report.problems.append(Problem("orphan", str(d),
                                                   "entry directory without meta.json", key))
                continue
            found = check_entry(d, key)
            if found and not d.exists():
                continue  # removed (gc, rm) while we looked: not damage
            report.entries += 1
            report.healthy += not any(p.kind in BAD for p in found)
            report.problems += found
    for d in _listdir(store.tmp_dir):
        key = d.name.split(".", 1)[0]
        try:
            with store.lock(key, timeout=0):
                if d.exists():  # not published or removed since we listed tmp/
                    report.problems.append(Problem("stale-tmp", str(d),
                                                   "leftover of a killed build", key))
        except filelock.Timeout:
            continue  # a build (or removal) of that key is under way
        except CuteccError as e:  # a read-only cache: nobody can be building into it here
            report.problems.append(Problem("stale-tmp", str(d), f"leftover of a killed build? "
                                           f"({e.message})", key))
    if fix:
        _fix(store, report)
    return report


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _fix(store: Store, report: VerifyReport) -> None:
    bad: dict[str, list[Problem]] = {}
    for p in report.problems:
        if p.kind in BAD and p.key:
            bad.setdefault(p.key, []).append(p)
    done: dict[str, str] = {}
    for key, probs in bad.items():
        reason = "; ".join(f"{p.kind}: {Path(p.path).name}: {p.detail}" for p in probs)
        try:
            dest = store.quarantine(key, reason, still_bad=lambda d, k=key: any(
                p.kind in BAD for p in check_entry(d, k)))
            action = f"quarantined to {dest}" if dest else "gone: rebuilt or removed meanwhile"
        except Busy:
            action = "busy: left as is"
        done[key] = action
    for p in report.problems:
        if p.key in done and p.kind in BAD | {"orphan"}:
            p.action = done[p.key]  # its whole entry went to quarantine
        elif p.kind == "orphan":
            p.action = _remove_orphan(store, p)
    store.sweep_tmp()
    for p in report.problems:
        if p.kind == "stale-tmp":
            p.action = "busy: left as is" if Path(p.path).exists() else "removed"


def _remove_orphan(store: Store, p: Problem) -> str:
    path = Path(p.path)
    try:
        if p.key and path.parent == store.entry_dir(p.key):  # a stray file in an entry
            with store.lock(p.key, timeout=0):
                path.unlink(missing_ok=True)
        elif p.key and path == store.entry_dir(p.key):  # an entry dir without meta.json
            with store.lock(p.key, timeout=0):
                if not (path / META).exists():
                    shutil.rmtree(path, ignore_errors=True)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # never follows a link inside
        else:
            path.unlink(missing_ok=True)  # a file, or a link itself (not its target)
    except filelock.Timeout:
        return "busy: left as is"
    except OSError as e:
        raise CuteccError(f"cannot remove: {e.strerror}", where=str(path), exit_code=1) from None
    return "removed"
