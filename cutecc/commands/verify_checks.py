"""What `cutecc verify` finds: the problems it reports (`Problem`; `BAD`: an unusable
entry), one entry's check (`check_entry`), and the checks of each area: entries, the
index, tuning records, stats and what belongs in no area."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock

from cutecc import trust
from cutecc.atomic import TMP_NAME
from cutecc.commands.report import Report
from cutecc.entry.meta import EntryMeta, RuntimeMeta
from cutecc.entry.rules import (
    MAX_INDEX_BYTES,
    MAX_META_BYTES,
    RESERVED_FILES,
    file_record,
    is_kernel_name,
    is_key,
)
from cutecc.errors import CuteccError
from cutecc.platforms import machine_problem
from cutecc.runtime.tuning import line_problem, load_cached, sibling_problem
from cutecc.store import layout
from cutecc.store.index_record import record_differs
from cutecc.store.stats import MAX_STATS_BYTES, STATS_DEPTH
from cutecc.store.view import (
    StoreView,
    entry_trust_problem,
    read_meta,
    record_problem,
)
from cutecc.store.writer import Store

if TYPE_CHECKING:
    from cutecc.commands.retrace import DeepReport


BAD = frozenset({"missing", "truncated", "altered", "malformed", "untrusted"})  # the entry is unusable


@dataclass
class Problem:
    # one of BAD, or "orphan" (a file or dir nothing owns), "stale-tmp", "unindexed",
    # "stale-index", "no-runtime", "bad-tuning" (a tuning record load would refuse),
    # "bad-record" (a build record or tuning plan that is not one), "stale-tuning" (a lock's
    # tuning line load would ignore: record again with `cutecc tune`)
    kind: str
    path: str
    detail: str
    key: str | None = None
    action: str = ""  # after fix: "quarantined to ...", "removed", "indexed", "busy: left as is"

    @property
    def fixed(self) -> bool:
        return self.action.startswith(("quarantined", "removed", "gone", "indexed", "linked"))


@dataclass
class VerifyReport(Report):
    cache_dir: str
    entries: int = 0
    healthy: int = 0
    problems: list[Problem] = field(default_factory=list)
    fixed: bool = False
    drift_note: str | None = None  # `--lock`: its key-deciding distributions unlike these here
    tuning_notes: list[str] = field(default_factory=list)  # `--lock`: its tuning lines this device ignores
    deep: DeepReport | None = None  # `--deep`: the entries compiled again (`cutecc.commands.retrace`)

    @property
    def cache_ok(self) -> bool:
        """The cache clean, or (after a fix) nothing left wrong in it."""
        return all(p.fixed for p in self.problems) if self.fixed else not self.problems

    @property
    def ok(self) -> bool:
        """`cache_ok`, and with `--deep` every entry reproduced (what it finds is reported,
        never fixed)."""
        return self.cache_ok and (self.deep is None or self.deep.ok)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "entries": self.entries, "healthy": self.healthy,
                "ok": self.ok, "fixed": self.fixed, "problems": [asdict(p) for p in self.problems],
                "drift": self.drift_note, "tuning_notes": self.tuning_notes,
                **({"deep": self.deep.to_json()} if self.deep else {})}

    def lines(self, verbose: int = 0) -> list[str]:
        out = [f"warning: {self.drift_note}"] if self.drift_note else []
        out += [f"note: {n}" for n in self.tuning_notes]
        out += [f"{p.kind:9}  {p.path}: {p.detail}" + (f" -> {p.action}" if p.action else "")
                for p in self.problems]
        out.append(f"{self.entries} entries, {self.healthy} healthy, {len(self.problems)} problem(s)"
                   f"{' (fixed)' if self.fixed and self.cache_ok else ''} in {self.cache_dir}")
        return out + (self.deep.lines(verbose) if self.deep else [])


def check_entry(path: Path, key: str, runtime: bool = False) -> list[Problem]:
    """The problems of one entry (or `runtime` library entry) directory (empty when healthy)."""
    for link in (path, layout.meta_file(path)):
        if link.is_symlink():  # cutecc publishes real files; a link's target can change under it
            return [Problem("malformed", str(link), f"a symbolic link (to {os.readlink(link)}), "
                            "not what cutecc published", key)]
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as e:
        return [Problem("malformed", str(layout.meta_file(path)), f"unreadable metadata: {e}", key)]
    try:  # the records, the key inputs and the fields they decide
        parsed = RuntimeMeta.parse(meta, key) if runtime else EntryMeta.parse(meta, key)
    except ValueError as e:
        return [Problem("malformed", str(layout.meta_file(path)), str(e), key)]
    records = parsed.files
    files = {r.name: r for r in records}
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
        if got["size"] != rec.size:
            out.append(Problem("truncated", str(f), f"{got['size']} bytes, recorded {rec.size}", key))
        elif got["sha256"] != rec.sha256:
            out.append(Problem("altered", str(f), f"sha256 {got['sha256'][:16]}.., recorded "
                               f"{rec.sha256[:16]}..", key))
    if not out and isinstance(parsed, EntryMeta):  # whole: is it a library of its platform?
        why = _machine_problem(path / parsed.library.name, parsed.platform)
        if why:
            out.append(Problem("malformed", str(path / parsed.library.name), why, key))
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


def _machine_problem(library: Path, platform: str) -> str | None:
    """Why `library`'s ELF header says it cannot load on `platform`'s hosts (`platforms.
    machine_problem`): an aarch64 library under an x86-64 entry fails only at dlopen."""
    try:
        fd = os.open(library, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # the hash check said what it is
    try:
        head = os.read(fd, 64)
    except OSError:
        return None
    finally:
        os.close(fd)
    return machine_problem(head, platform)


def _check_area(store: StoreView, report: VerifyReport, runtime: bool) -> dict[str, Any]:
    """Check every entry of entries/ (or runtimes/); returns the healthy ones' checked
    records (`EntryMeta`; `RuntimeMeta` for runtime libraries)."""
    healthy: dict[str, Any] = {}
    for shard in _listdir(store.runtimes_dir if runtime else store.entries_dir):
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
            if not layout.meta_file(d).exists():
                if d.exists():
                    report.problems.append(Problem("orphan", str(d),
                                                   "entry directory without meta.json", key))
                continue
            found = check_entry(d, key, runtime)
            if found and not d.exists():
                continue  # removed (gc, rm) while we looked: not damage
            report.entries += not runtime
            good = not any(p.kind in BAD for p in found)
            report.healthy += good and not runtime
            report.problems += found
            if good:
                try:
                    doc = read_meta(d)
                    healthy[key] = RuntimeMeta.parse(doc, key) if runtime else EntryMeta.parse(doc, key)
                except (OSError, ValueError):
                    continue  # removed (or rewritten) since
    return healthy


def _unindexed_now(store: Store, key: str, record: Path) -> bool:
    """Whether entry `key` is there without its `record` with nobody changing it: the entries
    were listed before the index, and a removal in between (the entry, then its record) or
    under way (holding the key's lock) is in flight, not a problem."""
    def lacks() -> bool:
        return store.layout.entry(key).exists() and not os.path.lexists(record)

    if not store.created():  # no locks/ (a pack): nobody changes it, and a check creates none
        return lacks()
    try:
        with store.lock(key, timeout=0):
            return lacks()
    except filelock.Timeout:
        return False
    except CuteccError:  # a read-only cache: nobody changes it here
        return lacks()


def _check_index(store: Store, report: VerifyReport, kernels: dict[str, EntryMeta], *,
                 pack: bool = False) -> None:
    """Every healthy entry has its record in by-kernel/, and every record an entry of its
    kernel; a record in flight (its key locked by a publish or removal) is left alone. A
    pack (`pack`) has no index by design: it is loaded through its kernels.lock."""
    records: set[tuple[str, str]] = set()
    for kd in _listdir(store.index_dir):
        if kd.is_symlink() or not kd.is_dir() or not is_kernel_name(kd.name):
            if os.path.lexists(kd):  # else its last record went since we listed (a removal)
                report.problems.append(Problem("orphan", str(kd), "not a kernel's index directory"))
            continue
        for f in _listdir(kd):
            if f.is_symlink() or not f.is_file() or not is_key(f.name):
                if os.path.lexists(f):  # else removed since we listed
                    report.problems.append(Problem("orphan", str(f), "not an index record"))
            else:
                records.add((kd.name, f.name))
    for key, meta in kernels.items():
        path = store.layout.index_record(meta.kernel, key)
        if (meta.kernel, key) not in records:
            if not pack and _unindexed_now(store, key, path):
                report.problems.append(Problem("unindexed", str(path), "the entry has no index record: "
                                               "`cutecc.load` does not see it", key))
            continue
        try:  # as every record is read: a regular file of ours, bounded (`read_record`)
            data = trust.read_path(path, MAX_INDEX_BYTES)
        except FileNotFoundError:
            continue  # removed since we listed it
        except trust.Untrusted as e:
            report.problems.append(Problem("stale-index", str(path), e.why, key))
            continue
        except OSError as e:
            why = (f"over the {MAX_INDEX_BYTES}-byte limit of an index record" if e.errno == errno.EFBIG
                   else f"unreadable: {e.strerror}")
            report.problems.append(Problem("stale-index", str(path), why, key))
            continue
        if record_differs(data, key, meta):
            report.problems.append(Problem("stale-index", str(path), "the index record does not "
                                           "match the entry's metadata", key))
    damaged = {p.key for p in report.problems if p.kind in BAD}  # quarantine takes their records
    for kernel, key in sorted(records):
        healthy = kernels.get(key)
        if (healthy is not None and healthy.kernel == kernel) or key in damaged:
            continue
        entry = _meta_or_none(store, key)
        try:
            with store.lock(key, timeout=0):
                entry = _meta_or_none(store, key)
                if entry is not None and entry.get("kernel") == kernel:
                    continue  # published since we looked
        except filelock.Timeout:
            continue  # a publish or removal of that key is under way
        except CuteccError:
            pass  # a read-only cache: nobody is publishing into it here
        what = "of no entry" if entry is None else f"of an entry of kernel {entry.get('kernel')!r}"
        report.problems.append(Problem("stale-index", str(store.layout.index_record(kernel, key)),
                                       f"index record {what}", key))


def _check_tuning(store: StoreView, report: VerifyReport, kernels: dict[str, EntryMeta]) -> None:
    """Each tuning record (`tuning/results/<default key>.json`) read as `load` reads it, and
    each of its winners checked by the rule the runtime applies (`sibling_problem`: same
    kernel, contract and call keywords as its default, bytes as recorded): a record that
    would serve one variant's calls with another's library is `bad-tuning`."""
    root = store.layout.tuning_results()
    for f in _listdir(root):
        base = f.name[:-5] if f.name.endswith(".json") else ""
        if not is_key(base):
            report.problems.append(Problem("orphan", str(f), "not a tuning record"))
            continue
        try:
            lines = [r.line for r in load_cached(store.root, base).records]
        except trust.Untrusted as e:
            report.problems.append(Problem("bad-tuning", str(f), e.why, base))
            continue
        except (OSError, ValueError, CuteccError) as e:
            report.problems.append(Problem("bad-tuning", str(f), f"unreadable: {e}", base))
            continue
        for t in lines:
            winner, default = kernels.get(t.winner), kernels.get(t.base)
            why = ("its default configuration is not a healthy entry" if t.base != base or default is None
                   else "its winner is not a healthy entry" if winner is None
                   else line_problem(t, default, winner) or sibling_problem(default, winner))
            if why:
                report.problems.append(Problem(
                    "bad-tuning", str(f), f"{t.kernel}[{t.variant}]@{t.arch} {t.bucket} on {t.device}: "
                    f"winner {t.winner_variant} ({t.winner[:12]}): {why}", base))


def _check_lock_tuning(report: VerifyReport, kernels: dict[str, EntryMeta], lock: Path,
                       kind: str | None = None) -> None:
    """The lock's tuning lines that load would ignore here: one whose winner's bytes or
    toolchain differ from what was measured (`line_problem`) or that could not serve its
    default's calls is `stale-tuning` (record again: `cutecc tune`); lines of another device
    kind than this host's (`kind`, else the GPU's or $CUTECC_DEVICE_KIND, where one is known)
    are named as notes (a lock may serve several kinds). Lines whose default is not in this
    cache are another cache's business."""
    from cutecc.lock.lockfile import read_lock

    if kind is None:
        try:
            from cutecc import settings
            from cutecc.runtime.runtime_settings import RuntimeSettings
            from cutecc.runtime.tuning import device_kind

            kind = device_kind(RuntimeSettings(device_kind=settings.DEVICE_KIND.read() or None))
        except ImportError:  # no JAX here: no device kind to compare
            kind = None
    other: dict[str, int] = {}
    for t in read_lock(lock).tuning:
        what = f"{t.kernel}[{t.variant}]@{t.arch} {t.bucket} on {t.device}"
        if kind is not None and t.device != kind:
            other[t.device] = other.get(t.device, 0) + 1
        default, winner = kernels.get(t.base), kernels.get(t.winner)
        if default is None:
            continue
        why = ("its winner is not a healthy entry of this cache" if winner is None
               else line_problem(t, default, winner) or sibling_problem(default, winner))
        if why:
            report.problems.append(Problem("stale-tuning", str(lock), f"{what}: winner {t.winner_variant} "
                                           f"({t.winner[:12]}): {why}; ignored at load", t.base))
    for dev, n in sorted(other.items()):
        report.tuning_notes.append(f"{lock}: {n} tuning line(s) recorded for {dev}, not this device "
                                   f"({kind}): ignored here (the default configurations serve)")


def _name_ok(area: str, name: str) -> bool:
    """Whether `name` is what the layout names a file of `area`."""
    stem = name[:-5] if name.endswith(".json") else None
    if area == layout.GENERATIONS:
        kernel, _, arch = (stem or "").partition("@")
        return is_kernel_name(kernel) and bool(arch) and "/" not in arch
    if area == layout.COMPOSITES:
        return is_kernel_name(stem)
    return is_key(stem)  # manifests/, tuning/plans/


def _check_areas(store: StoreView, report: VerifyReport, own: tuple[str, ...] = ()) -> None:
    """What does not belong in the cache's other areas (see the module docstring); `own`:
    top-level names that belong too (a pack's). The temporary file of an atomic write under
    way (`.<name>.<hex>.tmp`) is left to it."""
    lay = store.layout
    for f in _listdir(store.root):
        if f.name not in layout.AREAS + own and not TMP_NAME.fullmatch(f.name):
            report.problems.append(Problem("orphan", str(f), "not part of a cutecc cache"))
    for f in _listdir(lay.tuning()):
        if f.name not in (layout.TUNING_PLANS[1], layout.TUNING_RESULTS[1]):
            report.problems.append(Problem("orphan", str(f), "not a tuning area"))
    for f in _listdir(lay.sources()):
        if not (is_key(f.name) and f.is_dir() and not f.is_symlink()) and not f.name.startswith("."):
            report.problems.append(Problem("orphan", str(f), "not a received source tree"))
    _check_stats(store, report)
    records = ((layout.GENERATIONS, lay.generations(), MAX_META_BYTES),
               (layout.MANIFESTS, lay.manifests(), MAX_META_BYTES),
               (layout.COMPOSITES, lay.composites(), MAX_META_BYTES),
               ("tuning/plans", lay.tuning_plans(), layout.MAX_PLAN_BYTES))
    for area, d, limit in records:
        for f in _listdir(d):
            if TMP_NAME.fullmatch(f.name):
                continue
            if f.is_symlink() or not f.is_file() or not _name_ok(area, f.name):
                report.problems.append(Problem("orphan", str(f), f"not a record of {area}/"))
                continue
            doc, why = record_problem(f, limit)
            if why is None and not (isinstance(doc, dict) and type(doc.get("format")) is int):
                why = "not a JSON object with a format: damaged"
            if why is not None and os.path.lexists(f):  # else removed since we listed it
                report.problems.append(Problem("bad-record", str(f), why))


def _check_stats(store: StoreView, report: VerifyReport) -> None:
    """stats.json read as the builds read it (`read_record`): what is not a regular file
    is an orphan (a build leaves it as it is; `--fix` removes it), a damaged or oversized
    one a bad record (the next build starts its counters over)."""
    path = store.layout.stats()
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "something else"
        report.problems.append(Problem("orphan", str(path), f"{what}, not a regular file of build "
                                       "counters (builds leave it as it is and count nothing)"))
        return
    doc, why = record_problem(path, MAX_STATS_BYTES, STATS_DEPTH)
    if why is None and not (isinstance(doc, dict) and type(doc.get("format")) is int):
        why = "not a JSON object with a format: damaged"
    if why is not None:
        report.problems.append(Problem("bad-record", str(path), why))


def _meta_or_none(store: StoreView, key: str) -> dict[str, Any] | None:
    try:
        return read_meta(store.layout.entry(key))
    except (OSError, ValueError):
        return None


def _record_or_none(store: StoreView, key: str) -> EntryMeta | None:
    """The entry's checked record; None when absent, unreadable or damaged."""
    try:
        return EntryMeta.parse(read_meta(store.layout.entry(key)), key)
    except (OSError, ValueError):
        return None


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []
