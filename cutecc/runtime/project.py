"""Which project a plain `cutecc.load()` serves, and which build of a manifest is its
current plan, read from the cache's records without planning (no build side).

The cache is per user, so one kernel name may have been built by several projects. A load
given no `lock=`, `manifest=` or `package=` finds the project it is called from as git and
uv find theirs: the nearest directory, walking up from the working directory, holding a
`kernels.lock` or a `kernels.toml`. When the cache knows that project (it holds a record of
a build of that manifest, or an entry its lock names), the load is that project's, as
`load(manifest=)` is; otherwise each kernel is served from the one manifest that built it,
and a name that several manifests built with other keys is an error naming them. A plain
load of the user's own cache in a project it never built refuses the names that project
declares (its lock's or its manifest's `[kernel.NAME]` tables): another project's build of
one is never served in its place.

A manifest's load serves what its lock (`kernels.lock` beside it) names; without one, the
recorded build whose manifest bytes and source files (`ManifestRecord.sources`) are the
files as they are now: never simply the newest build, which an edit built and then
reverted would leave behind.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import LOCK_NAME, Lock, read_lock
from cutecc.store.build_records import ManifestRecord
from cutecc.store.view import StoreView

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MANIFEST_NAME = "kernels.toml"  # the manifest a project directory holds (`cutecc.manifest.grammar`)
CHUNK = 1 << 20
MAX_SOURCE_BYTES = 1 << 28  # a keyed source file larger than this reads as changed
MAX_MANIFEST_BYTES = 1 << 24  # a project's kernels.toml read for the names it declares


@dataclass(frozen=True)
class Project:
    """A project directory: its `kernels.toml` and `kernels.lock`, each None when absent."""

    root: Path
    manifest: Path | None
    lock: Path | None

    @functools.cached_property
    def declared(self) -> frozenset[str]:
        """The kernel names this project declares: those its lock names and its manifest's
        `[kernel.NAME]` tables (read bounded, without the build side; a manifest that does not
        read as TOML declares nothing here: its own build says why)."""
        names: set[str] = set()
        if self.lock is not None:
            with contextlib.suppress(CuteccError):  # (a malformed lock: the manifest's names)
                names.update(le.kernel for le in read_lock(self.lock).entries)
        if self.manifest is not None:
            try:
                with open(self.manifest, "rb") as f:
                    data = f.read(MAX_MANIFEST_BYTES + 1)
                table = tomllib.loads(data.decode()) if len(data) <= MAX_MANIFEST_BYTES else {}
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
                table = {}
            kernels = table.get("kernel")
            if isinstance(kernels, dict):
                names.update(k for k in kernels if isinstance(k, str))
        return frozenset(names)

    def known_to(self, store: StoreView) -> bool:
        """Whether `store` holds a build of this project: a record of its manifest, or an
        entry its lock names (a project checked out or copied elsewhere than where its
        cache was built, whose records name the other path, is found by its lock)."""
        if self.manifest is not None and store.manifest_record(self.manifest) is not None:
            return True
        return self.lock is not None and any(store.has(k) for k in read_lock(self.lock).distinct_keys())


def find_project(start: Path | None = None) -> Project | None:
    """The project `start` (the working directory) is in: the nearest directory, `start`
    itself or one above it, holding a `kernels.lock` or a `kernels.toml`; None if none does
    (or the working directory was removed since)."""
    try:
        here = (start or Path.cwd()).resolve()
    except OSError:
        return None
    for d in (here, *here.parents):
        lock, manifest = d / LOCK_NAME, d / MANIFEST_NAME
        has_lock, has_manifest = lock.is_file(), manifest.is_file()
        if has_lock or has_manifest:
            return Project(d, manifest if has_manifest else None, lock if has_lock else None)
    return None


def lock_beside(manifest: Path) -> Path | None:
    """The manifest's own lock (`kernels.lock` in its directory), None when there is none."""
    p = manifest.parent / LOCK_NAME
    return p if p.is_file() else None


def read_selection(path: Path) -> Lock:
    """A project's lock, read to pick which of the cache's entries serve (bounded and
    checked as every lock is, `Lock.loads`). Its signature is not asked for: it names keys
    of this user's cache, whose entries are checked against their own SHA-256 and the
    lock's pins before anything is opened, and nothing of it is imported."""
    return read_lock(path)


def selected_lines(lock: Lock, path: Path, wanted: set[str] | None,
                   store: StoreView) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The keys a project's `lock` (read from `path`) names per kernel (of `wanted`, None:
    all), and per kernel why each key this cache lacks is set aside; an error naming the
    kernels none of whose keys is in the cache (`run cutecc build`)."""
    lines: dict[str, list[str]] = {}
    absent: dict[str, list[str]] = {}
    for le in lock.entries:
        if wanted is None or le.kernel in wanted:
            lines.setdefault(le.kernel, []).append(le.key)
            if not store.has(le.key):
                absent.setdefault(le.kernel, []).append(
                    f"{le.label} ({le.key[:12]}): named by {path} but not in this cache; run `cutecc build`")
    empty = sorted(n for n, keys in lines.items() if len(absent.get(n, ())) == len(keys))
    if empty:
        raise WorkError(f"no entry {path} names for kernel(s) {', '.join(empty)} is in this cache; "
                        "run `cutecc build`", where=str(store.root))
    return lines, absent


def _sha256(path: str) -> str | None:
    """SHA-256 of a source file a record names, None when it is not a regular file (a
    FIFO is never waited on, a device never read), is over `MAX_SOURCE_BYTES` or unreadable."""
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE_BYTES:
                return None
            for chunk in iter(lambda: f.read(CHUNK), b""):
                h.update(chunk)
        except OSError:
            return None
    return h.hexdigest()


def current_build(store: StoreView, manifest: Path) -> ManifestRecord:
    """The recorded build of `manifest` that is its current plan: the newest whose manifest
    bytes and keyed source files hash as they do now (a record from before sources were
    recorded matches on its bytes alone). An error saying what changed when none does:
    the keys `cutecc explain` names for it now were never built into this cache."""
    try:
        digest = hashlib.sha256(manifest.read_bytes()).hexdigest()
    except OSError as e:
        raise WorkError(f"cannot read the manifest: {e.strerror}", where=str(manifest)) from None
    rec = store.manifest_record(manifest)
    where = f"{manifest} (cache {store.root})"
    if rec is None:
        raise WorkError("this manifest was never built into this cache; run `cutecc build`",
                        where=where)
    seen: dict[str, str | None] = {}
    changed: str | None = None
    for b in rec.builds():
        if b.sha256 != digest:
            continue
        for path, want in sorted(b.sources.items()):
            if path not in seen:
                seen[path] = _sha256(path)
            if seen[path] != want:
                changed = changed or path
                break
        else:
            return b
    if changed is not None:
        raise WorkError(f"{changed} is not as any build of this manifest recorded here read it: "
                        "the keys `cutecc explain` names for it now were never built into this "
                        "cache; run `cutecc build`", where=where)
    raise WorkError("this manifest, as it is now, was never built into this cache; run "
                    "`cutecc build`", where=where)


def several_builders(records: list[ManifestRecord], kernel: str) -> list[str]:
    """The manifests whose newest builds planned `kernel` with different keys (sorted),
    or [] when at most one set of keys was built for it: nothing to choose between."""
    by: dict[str, frozenset[str]] = {}
    for r in records:
        if r.manifest and kernel in r.entries:
            by[r.manifest] = r.keys_of(kernel)
    return sorted(by) if len(set(by.values())) > 1 else []


def ambiguous(kernel: str, manifests: list[str], store: StoreView) -> WorkError:
    """The error for a kernel name several manifests built, nothing deciding between them."""
    return WorkError(
        f"kernel {kernel!r} was built into this cache by {len(manifests)} manifests with other "
        f"keys ({', '.join(repr(m) for m in manifests)}), and nothing says which this program "
        "is: pass manifest= (or lock=, or package=) to cutecc.load, or call it from the "
        "project's directory (a kernels.lock or kernels.toml in it or above it)",
        where=str(store.root))


def not_this_project(kernel: str, project: Project, records: list[ManifestRecord],
                     store: StoreView) -> WorkError:
    """The error for a kernel a plain load's project declares but this cache holds no build
    of that project: the cache's build of that name is another project's."""
    builders = sorted({r.manifest for r in records if r.manifest and kernel in r.entries})
    whose = ", ".join(repr(m) for m in builders) if builders else "another project"
    return WorkError(
        f"kernel {kernel!r} is declared by this project ({project.manifest or project.lock}), but "
        f"this cache holds no build of it: the cache's {kernel!r} was built by {whose}; run "
        "`cutecc build` in this project, or pass manifest= (or lock=) to cutecc.load to serve "
        "that build", where=str(store.root))


def same_path(recorded: object, path: Path) -> bool:
    """Whether a record's path (a string a build wrote) names `path`: never one that names
    no file (a NUL in it, a symbolic link that loops)."""
    if not isinstance(recorded, str) or not recorded:
        return False
    try:
        return Path(recorded).resolve() == path
    except (OSError, ValueError, RuntimeError):
        return False
