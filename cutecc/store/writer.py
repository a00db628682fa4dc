"""Writing the cache: publish, quarantine, remove, the index, build records, stats,
tuning plans and results, planning facts, sources a Ray node received, staging, pruning
and discarding what does not belong, sweeping. Every create and delete under a cache
root is here (`cutecc.store.misses`, which the runtime writes, aside); a test checks that no other
module that knows the store writes or deletes files.

An entry is visible only once complete: it is built in `tmp/`, every file fsynced,
then renamed into place. Builders take the key's lock and look again before
building (another process may have done the work), so nothing is built twice;
leftovers of killed builds are swept by the next build that can take their lock.

The index stays correct under concurrent publish, removal and unpack without a lock of
its own: under the key's lock, a publish creates the entry's record before the rename
that makes the entry visible, and a removal deletes it only after the rename that hides
the entry. So every visible entry has its record; a record without its entry (left by a
crash) is skipped by readers, and `cutecc verify --fix` removes it or restores a record
someone deleted.

A build record (`cutecc.store.build_records`: generations, manifests, composites) that already
holds what a build would write is not written again (a no-op build writes none): compared byte
for byte with what is on disk, read as readers read it (`current_bytes`), `built_at` aside where
only it would change (`record_generations`, `record_manifest`).

The runtime never imports this module (`cutecc.store.view` is what it reads through).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import filelock

from cutecc import trust
from cutecc.atomic import TMP_NAME, atomic_write, fsync_dir
from cutecc.entry.meta import EntryMeta, FileRec, RuntimeMeta
from cutecc.entry.rules import (
    MAX_META_BYTES,
    META,
    STORE_FORMAT,
    Recorded,
    file_record,
    is_kernel_name,
    meta_stamp,
    parse_json,
)
from cutecc.errors import WorkError
from cutecc.locks import Busy, held, is_held
from cutecc.store.build_records import CompositeRecord, GenerationRecord, ManifestRecord
from cutecc.store.index_record import IndexRecord
from cutecc.store.layout import (
    MISSES,
    STATS,
)
from cutecc.store.quarantine_note import QUARANTINE_NOTE, QuarantineNote
from cutecc.store.stats import MAX_STATS_BYTES, STATS_DEPTH, Stats
from cutecc.store.view import (
    Entry,
    StoreView,
    read_meta,
    read_record,
    read_small_json,
)
from cutecc.units import now_iso

DIR_MODE = 0o755  # what the cache's directories get, whatever the umask
FILE_MODE = 0o644  # and its files

_README = """\
This directory is a cache of CuTe DSL kernels built ahead of time by cutecc.
It is owned by cutecc: entries/ holds one directory per compiled artifact, named by
the SHA-256 key of everything that decided its bytes. Inspect it with `cutecc list`.
Deleting the whole directory is safe; the next `cutecc build` rebuilds what it needs.
"""
_CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file marks a cache directory created by cutecc.\n"
)


class Store(StoreView):
    """A cutecc cache directory, read and written."""

    # Creation --------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the store if needed, and refuse one of another format."""
        fmt = self.layout.format_file()
        if fmt.is_file():
            self._check_format(fmt)
            self.check_trust()
            self._check_writable()
            return
        try:
            for d in (self.root, self.entries_dir, self.runtimes_dir, self.index_dir, self.tmp_dir,
                      self.locks_dir):
                make_dir(d)
            self.check_trust()
            with filelock.FileLock(self.layout.store_lock(), timeout=60, mode=FILE_MODE):
                if not fmt.is_file():
                    atomic_write(self.layout.readme(), _README.encode())
                    atomic_write(self.layout.cachedir_tag(), _CACHEDIR_TAG.encode())
                    atomic_write(fmt, f"{STORE_FORMAT}\n".encode())
        except OSError as e:
            raise WorkError(f"cannot create the cache: {e.strerror}", where=str(self.root)) from None
        self._check_format(fmt)

    def _check_writable(self) -> None:
        """Refuse, before any compile starts, a cache where nothing can be published (a
        read-only mount, no permission): a probe file in locks/ (where nothing scans), and
        access(2) for entries/ and tmp/."""
        try:
            for d in (self.entries_dir, self.runtimes_dir, self.index_dir, self.tmp_dir,
                      self.locks_dir):
                make_dir(d)
                if not os.access(d, os.W_OK | os.X_OK):
                    ro = os.statvfs(d).f_flag & os.ST_RDONLY
                    code = errno.EROFS if ro else errno.EACCES
                    raise OSError(code, os.strerror(code), str(d))
            fd, probe = tempfile.mkstemp(prefix="probe.", dir=self.locks_dir)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise WorkError(f"cannot write to the cache: {e.strerror}; build into a writable "
                            "--cache-dir, or use --read-only to use only what it holds",
                            where=str(self.root)) from None


    # Tuning ------------------------------------------------------------------------

    def write_tuning_plan(self, digest: str, data: bytes) -> Path:
        """Store `cutecc tune`'s plan of a manifest (by its bytes' `digest`; `data`: a
        `TuningPlan`'s bytes): the measuring step reads it from the cache alone."""
        path = self.layout.tuning_plan(digest)
        make_dir(path.parent)
        atomic_write(path, data)
        return path

    def write_tuning_results(self, base: str, data: bytes) -> Path:
        """Replace the tuning record of default entry `base` with `data` (a document of
        `TUNING_FORMAT`, `cutecc.store.tuning_records.TuningResults.dumps`)."""
        path = self.layout.tuning_result(base)
        make_dir(path.parent)
        atomic_write(path, data)
        return path

    def remove_tuning_results(self, base: str) -> bool:
        """Delete the tuning record of default entry `base`; False when there was none."""
        try:
            self.layout.tuning_result(base).unlink()
        except FileNotFoundError:
            return False
        return True

    # Stats, removal, quarantine, the index, publishing, sweeping ---------------------

    def add_stats(self, **delta: float) -> None:
        """Add to the build counters in stats.json, under locks/stats.lock, atomically.

        A stats.json of another format is left alone (a newer cutecc owns it), and so is
        one that is not a regular file or that someone else could have written (`cutecc
        verify` names it, `--fix` removes it); one that is damaged, too large or too deep
        is started over. It is read as every record of the cache is (`read_record`).
        """
        path = self.layout.stats()
        with filelock.FileLock(self.layout.stats_lock(), timeout=10, mode=FILE_MODE):
            try:
                old = read_record(path, MAX_STATS_BYTES, STATS_DEPTH)
            except trust.Untrusted:
                return
            except (OSError, ValueError):
                old = None  # absent or unreadable: start over
            if Stats.of_another_format(old):
                return
            atomic_write(path, Stats.from_json(old).added(delta, now_iso()).dumps())

    def remove(self, key: str, *, timeout: float = 0, runtime: bool = False) -> bool:
        """Delete the entry (or with `runtime`, the runtime library entry) for `key`; False
        if there is none. Raises Busy.

        Under the key's lock (so it cannot interleave with a build of that key), the
        entry directory is first renamed out of entries/ into tmp/, so a reader sees it
        whole or not at all, then its index record goes, and only then is it deleted. A
        process that already loaded its library keeps running it (the runtime loads from
        a memfd copy).
        """
        with self._locked(key, timeout):
            src = self.layout.runtime(key) if runtime else self.layout.entry(key)
            moved = self._move_out(key, self.layout.staging(f"{key}.rm-{secrets.token_hex(6)}"), src)
            if moved is None:
                return False
            if not runtime:
                self._unindex(key, moved)
            # Still under the lock, so nobody mistakes it for a killed build's leftovers;
            # whatever survives (a failing disk) is swept like those.
            shutil.rmtree(moved, ignore_errors=True)
        return True

    def quarantine(self, key: str, reason: str, *, timeout: float = 0,
                   still_bad: Callable[[Path], bool] | None = None,
                   runtime: bool = False) -> Path | None:
        """Move the entry (or runtime library entry) for `key` to quarantine/<key>.<time>/
        so the next build rebuilds it.

        By rename under the key's lock; `still_bad(entry_dir)` is asked again under the
        lock, so an entry rebuilt meanwhile is left alone. Writes why.json beside the
        files. Returns the new place, or None if absent or no longer bad. Raises Busy.
        """
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        dest = self.layout.quarantined(key, stamp)
        src = self.layout.runtime(key) if runtime else self.layout.entry(key)
        with self._locked(key, timeout):
            if still_bad is not None and src.is_dir() and not still_bad(src):
                return None
            moved = self._move_out(key, dest, src)
            if moved is not None and not runtime:
                self._unindex(key, moved)
        if moved is not None:
            with contextlib.suppress(OSError):
                atomic_write(moved / QUARANTINE_NOTE, QuarantineNote(key, reason, now_iso()).dumps())
        return moved

    @contextlib.contextmanager
    def _locked(self, key: str, timeout: float) -> Iterator[None]:
        try:
            with self.lock(key, timeout=timeout):
                yield
        except filelock.Timeout:
            raise Busy(key) from None

    def _unindex(self, key: str, moved: Path) -> None:
        """Delete the index record of an entry just moved out to `moved` (under its lock):
        found through its metadata's kernel name, else by looking in every kernel's records."""
        try:  # what it says unchecked: a damaged entry is moved out too
            kernel = Recorded.of(read_meta(moved)).kernel
        except (OSError, ValueError):
            kernel = None
        names = [kernel] if is_kernel_name(kernel) else self.kernel_names()
        for name in names:
            self.unindex(name, key)

    def index(self, key: str, meta: EntryMeta, meta_file: Path) -> None:
        """Write the index record of the entry `key` with the checked record `meta`, read from
        `meta_file` (whose stamp it keeps), durably (the caller holds the key's lock).
        Written in place, not renamed in: a record is read only for a published entry, and
        a torn one (a crash, or a reader racing a rewrite) fails to parse, which readers
        take as "read meta.json"."""
        if not is_kernel_name(meta.kernel):
            raise WorkError(f"kernel name {meta.kernel!r} is not an identifier", where=str(self.root))
        d = self.layout.index_kernel(meta.kernel)
        data = IndexRecord.of_meta(key, meta, meta_stamp(os.stat(meta_file))).dumps()
        for _ in range(100):
            make_dir(d)
            try:
                fd = os.open(d / key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                             FILE_MODE)
            except FileNotFoundError:
                continue  # the kernel's last record went and its directory with it: again
            try:
                os.fchmod(fd, FILE_MODE)
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(d)
            return
        raise OSError(errno.ENOENT, "the index directory keeps disappearing", str(d))

    def unindex(self, kernel: str, key: str) -> None:
        """Delete the index record (absent is fine), and the kernel's directory if empty."""
        if not is_kernel_name(kernel):
            return
        d = self.layout.index_kernel(kernel)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(d / key)
        with contextlib.suppress(OSError):
            os.rmdir(d)  # only when no other record is left

    def _move_out(self, key: str, dest: Path, src: Path | None = None) -> Path | None:
        """Move the entry directory (`src`, by default the entry of `key`) to `dest` (caller
        holds the key's lock): one rename, so readers see it whole or gone. Across file
        systems it is first renamed aside within its shard (still one rename out of
        readers' sight), then copied to `dest`."""
        src = self.layout.entry(key) if src is None else src
        if not os.path.lexists(src):
            return None  # a symbolic link is moved itself, never what it points to
        make_dir(dest.parent)
        move_dir(src, dest, key, hide_first=True)
        fsync_dir(src.parent)
        fsync_dir(dest.parent)
        return dest

    # Areas kept by age, things that do not belong, received sources, staging ------

    def prune(self, area: Path, before: float, dry_run: bool = False) -> int:
        """Remove what the cache area `area` (tuning plans, received sources, quarantine)
        holds that was last changed before `before` (epoch seconds): files and directories
        alike, never following a link; returns how many (with `dry_run`, would remove)."""
        self._inside(area)
        n = 0
        try:
            items = sorted(area.iterdir())
        except OSError:
            return 0
        for d in items:
            try:
                if os.lstat(d).st_mtime >= before:
                    continue
                if not dry_run:
                    self.discard(d, ignore_errors=True)
                n += 1
            except OSError:
                continue
        return n

    def discard(self, path: Path, *, ignore_errors: bool = False) -> None:
        """Delete `path` under the cache root, something that does not belong there (or a
        damaged record): a directory with all it holds, never following a link inside; a
        file, or a link itself (never its target). Absent is fine; else raises OSError,
        for a directory only without `ignore_errors`. The caller holds what lock guards it."""
        self._inside(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=ignore_errors)
        else:
            path.unlink(missing_ok=True)

    def receive_sources(self, digest: str, files: Mapping[str, bytes]) -> Path:
        """`src/<digest>/`: the kernel sources a Ray worker on another node received (checked
        by the caller against the key), written once: beside it, then renamed into place."""
        final = self.layout.source_tree(digest)
        if final.is_dir():
            return final
        tmp = final.parent / f".{digest}.{secrets.token_hex(6)}.tmp"
        tmp.mkdir(parents=True)
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        try:
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not final.is_dir():
                raise
        return final

    @contextlib.contextmanager
    def staging_dir(self, name: str) -> Iterator[Path]:
        """`tmp/<name>`, a private directory (0700) for the caller's work, deleted on leaving
        (swept if the process dies: hold the lock of the key `name` starts with)."""
        path = self.layout.staging(name)
        path.mkdir(mode=0o700)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def _inside(self, path: Path) -> None:
        """Refuse a path outside this cache (a caller's bug, never the user's input)."""
        if not Path(os.path.abspath(path)).is_relative_to(os.path.abspath(self.root)) \
                or os.path.abspath(path) == os.path.abspath(self.root):
            raise ValueError(f"{path} is not inside the cache {self.root}")

    def is_busy(self, key: str) -> bool:
        """Whether another process holds the lock of `key` (a build of it under way)."""
        return is_held(self.layout.key_lock(key))

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float = -1) -> Iterator[None]:
        """Hold `locks/<key>.lock`. Raises filelock.Timeout, or CuteccError (exit 1) when the
        lock file cannot be created or opened (a read-only or full cache)."""
        with held(self.layout.key_lock(key), timeout):
            yield

    def publish(self, key: str, build: Callable[[Path], EntryMeta | RuntimeMeta], *,
                runtime: bool = False) -> tuple[Entry, bool]:
        """Return the entry for `key`, building it with `build(staging_dir)` if absent.

        `build` writes its files into the staging directory and returns the entry's record
        (`EntryMeta`; with `runtime`, a runtime library's `RuntimeMeta`, not indexed); the
        store records the files' hashes in it, writes meta.json from it, creates the index
        record and publishes by rename. (entry, built): built is False when another had it.
        """
        get = self.get_runtime if runtime else self.get
        found = get(key)
        if found is not None:
            return found, False
        with self.lock(key):
            found = get(key)
            if found is not None:
                return found, False
            self._sweep_key(key, runtime)
            staging = self.layout.staging(f"{key}.{secrets.token_hex(6)}")
            make_dir(staging)
            final = self.layout.runtime(key) if runtime else self.layout.entry(key)
            try:
                made = build(staging)
                if isinstance(made, RuntimeMeta) != runtime:
                    raise TypeError(f"publish(runtime={runtime}) was given a {type(made).__name__}")
                for f in staging.iterdir():  # the linker's output follows the umask
                    os.chmod(f, FILE_MODE, follow_symlinks=False)
                files = tuple(FileRec(p.name, **file_record(p)) for p in staging.iterdir())
                data = made.recorded(key, files).dumps()  # `recorded` sorts the files
                meta = json.loads(data)  # the entry as every reader reads it
                atomic_write(staging / META, data)
                fsync_dir(staging)
                if isinstance(made, EntryMeta):  # before the entry is visible: every one is indexed
                    self.index(key, made.recorded(key, files), staging / META)
                make_dir(final.parent)
                move_dir(staging, final, key, hide_first=False)
                fsync_dir(final.parent)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return Entry(key, final, meta), True

    def _sweep_key(self, key: str, runtime: bool = False) -> None:
        """Remove a killed build's leftovers for `key` (we hold its lock)."""
        final = self.layout.runtime(key) if runtime else self.layout.entry(key)
        for d in (*self.tmp_dir.glob(f"{key}.*"), *final.parent.glob(f".{key}.*.tmp")):
            if d.is_dir() and not d.is_symlink():
                self._drop_leftover(key, d)

    def _drop_leftover(self, key: str, d: Path) -> None:
        """Delete a killed build's or removal's directory (we hold the key's lock), and the
        index record it may have left (created before a publish's rename, deleted after a
        removal's) when the entry is not published."""
        if not os.path.lexists(self.layout.entry(key)):
            with contextlib.suppress(OSError, ValueError):
                kernel = read_meta(d).get("kernel")
                if is_kernel_name(kernel):
                    self.unindex(kernel, key)
        shutil.rmtree(d, ignore_errors=True)

    def sweep_tmp(self) -> int:
        """Remove leftovers of killed builds whose lock nobody holds; returns how many.

        Also removes the temporary files of an `atomic_write` killed in the root
        (`.stats.json.<hex>.tmp`, ...), under the lock that guards that file.
        """
        n = self._sweep_root()
        if not self.tmp_dir.is_dir():
            return n
        for d in list(self.tmp_dir.iterdir()):
            key = d.name.split(".", 1)[0]
            try:
                with self.lock(key, timeout=0):
                    if d.exists():
                        self._drop_leftover(key, d)
                        n += 1
            except filelock.Timeout:
                continue
        return n

    def _sweep_root(self) -> int:
        n = 0
        with contextlib.suppress(OSError):
            for f in list(self.root.iterdir()):
                m = TMP_NAME.fullmatch(f.name)
                if not m:
                    continue
                guard = {STATS: self.layout.stats_lock(), MISSES: self.layout.misses_lock()}.get(
                    m.group(1), self.layout.store_lock())
                try:
                    with filelock.FileLock(guard, timeout=0):
                        f.unlink(missing_ok=True)
                        n += 1
                except (filelock.Timeout, OSError):
                    continue
        return n

    # Build records ---------------------------------------------------------------

    def record_generation(self, kernel: str, arch: str, keys: list[str], manifest: str,
                          fallbacks: dict[str, dict[str, Any]] | None = None) -> None:
        """Record `keys` as the current entries of `kernel` for `arch` (the newest build),
        and the kernel's declared `fallbacks` (`cutecc.contract.fallbacks`; the fields only when set)."""
        self.record_generations(kernel, {arch: keys}, manifest, fallbacks)

    def record_generations(self, kernel: str, per_arch: Mapping[str, list[str]], manifest: str,
                           fallbacks: dict[str, dict[str, Any]] | None = None,
                           roots: tuple[str, ...] = ()) -> None:
        """`record_generation` for each arch of `per_arch`, one build's records of `kernel`.

        Nothing is written when every one of them already says this, but for `built_at`,
        and each is newer than every other record of the kernel: "the newest build" then
        still picks one of these, which name the same manifest and fallbacks (a no-op
        build writes no generation). `built_at` is when a build last changed the record."""
        self.generations_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        now = now_iso()
        recs = {arch: GenerationRecord.of_build(kernel, arch, keys, manifest, now, fallbacks, roots)
                for arch, keys in per_arch.items()}
        if not self._generations_current(kernel, recs):
            for arch, rec in recs.items():
                atomic_write(self.layout.generation(kernel, arch), rec.dumps(), FILE_MODE)

    def _generations_current(self, kernel: str, recs: Mapping[str, GenerationRecord]) -> bool:
        """Whether each of `recs` is on disk as written (`current_bytes`) with an older
        `built_at` alone, every one of those later than every other arch's record of
        `kernel` (strictly: a tie could pick another's)."""
        kept: list[str] = []
        for arch, rec in recs.items():
            path = self.layout.generation(kernel, arch)
            old = current_bytes(path, MAX_META_BYTES)
            doc = _json_or_none(old)
            was = GenerationRecord.from_json(doc)
            if old is None or was is None or dataclasses.replace(rec, built_at=was.built_at).dumps() != old:
                return False
            kept.append(was.built_at)
        try:
            names = [f.name for f in os.scandir(self.generations_dir)]
        except OSError:
            return False
        for name in names:
            arch = name.removeprefix(f"{kernel}@").removesuffix(".json")
            if name.startswith(f"{kernel}@") and name.endswith(".json") and arch not in recs:
                other = GenerationRecord.from_json(read_small_json(self.generations_dir / name))
                if other is not None and other.built_at >= min(kept):
                    return False
        return True

    def record_composite(self, rec: CompositeRecord) -> None:
        """Record a composite kernel (`CompositeRecord`): it has no entry of its own, its
        launches are kernels with theirs. Not written again when it holds these bytes."""
        if not is_kernel_name(rec.name):
            raise ValueError(f"composite name {rec.name!r} is not a kernel name")
        self.composites_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        path, data = self.layout.composite(rec.name), rec.dumps()
        if current_bytes(path, len(data)) != data:
            atomic_write(path, data, FILE_MODE)

    def record_manifest(self, manifest: Path, sha256: str, entries: dict[str, dict[str, list[str]]],
                        *, partial: bool, sources: dict[str, str] | None = None) -> None:
        """Record the keys a build of `manifest` (whose bytes hash to `sha256`) planned, per
        kernel and arch, and the SHA-256 of each project source file they read (`sources`);
        a `partial` build adds to the record of the same bytes. The record it replaces stays
        behind it as an earlier build (`ManifestRecord.after`). Not written when the record
        says this already (`built_at`: when a build last changed it)."""
        self.manifests_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        path = self.layout.manifest_record(manifest)
        data = current_bytes(path, MAX_META_BYTES)
        was = ManifestRecord.from_json(_json_or_none(data))
        if data is None and partial:
            was = self.manifest_entries(manifest, sha256)
        old = was if partial and was is not None and was.sha256 == sha256 else None
        now = now_iso()
        new = ManifestRecord(str(manifest), sha256, old.entries if old else {}, now,
                             old.sources if old else {}).merged(entries, now, sources)
        if was is not None and new.same_plan(was) and was.dumps() == data:
            return
        if old is not None and not old.superseded_by(new):
            new = dataclasses.replace(new, earlier=old.earlier)  # added to, nothing replaced
        else:
            new = new.after(was)
        data = new.dumps()
        while new.earlier and len(data) > MAX_META_BYTES // 2:  # the oldest builds go first:
            new = dataclasses.replace(new, earlier=new.earlier[:-1])  # readers stop at the limit
            data = new.dumps()
        atomic_write(path, data, FILE_MODE)

    def forget_build_records(self, manifest: Path, kernel_archs: list[tuple[str, str]]) -> None:
        """Delete the generation records of `kernel_archs` and the record of `manifest`
        (best-effort): a build that could not write them drops the old ones rather than
        leave them stale."""
        for kernel, arch in kernel_archs:
            with contextlib.suppress(OSError):
                self.layout.generation(kernel, arch).unlink()
        with contextlib.suppress(OSError):
            self.layout.manifest_record(manifest).unlink()


def move_dir(src: Path, dest: Path, tag: str, *, hide_first: bool) -> None:
    """Rename the directory `src` to `dest`: one rename, so readers see it whole or not at
    all. Across file systems (EXDEV) the one rename stays on the side readers look at:
    with `hide_first` (moving an entry out of their sight), `src` is first renamed aside
    in its own directory, then copied to `dest`; else (publishing) it is copied next to
    `dest` first, then renamed into place; the copy's source is deleted after. `tag` starts
    the name aside (`.<tag>.<hex>.tmp`, swept with the key's leftovers). Flat directories."""
    try:
        os.rename(src, dest)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    if hide_first:
        aside = src.parent / f".{tag}.{secrets.token_hex(6)}.tmp"
        os.rename(src, aside)
        fsync_dir(src.parent)
        _copy_tree(aside, dest)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        near = dest.parent / f".{tag}.{secrets.token_hex(6)}.tmp"
        _copy_tree(src, near)
        os.rename(near, dest)
        shutil.rmtree(src, ignore_errors=True)


def write_planning(path: Path, data: bytes) -> None:
    """Write one of the planning caches beside the cache's root files (`filehashes.json`,
    `planfacts.json`: `cutecc.toolchain.hashcache.HashCache`), atomically, with the cache's file mode."""
    atomic_write(path, data, FILE_MODE)


def _copy_tree(src: Path, dest: Path) -> None:
    """Copy an entry directory (regular files only), fsynced, with the cache's modes."""
    make_dir(dest)
    for f in src.iterdir():
        if f.is_file() and not f.is_symlink():
            with open(f, "rb") as r, open(dest / f.name, "wb") as w:
                shutil.copyfileobj(r, w)
                w.flush()
                os.fsync(w.fileno())
            os.chmod(dest / f.name, FILE_MODE)
    fsync_dir(dest)


def make_dir(path: Path) -> None:
    """`mkdir -p` with DIR_MODE for what it creates, whatever the umask."""
    if path.is_dir():
        return
    make_dir(path.parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)


def current_bytes(path: Path, limit: int) -> bytes | None:
    """The bytes of the cache's record `path` when writing it again could only rewrite them:
    a regular file of the cache's mode that readers trust (`trust.read_path`), at most
    `limit` bytes; else None (absent, a link, another mode, untrusted, larger, unreadable)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != FILE_MODE or st.st_size > limit:
            return None
        return trust.read_path(path, limit)
    except (OSError, trust.Untrusted):
        return None


def _json_or_none(data: bytes | None) -> Any:
    try:
        return None if data is None else parse_json(data)
    except ValueError:
        return None
