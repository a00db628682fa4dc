"""The cache read-only: what the runtime, `list`, `show`, `explain` and every reader need.

Nothing here creates, moves or deletes anything in the cache, except `touch_used` (a use
mark on an entry, never one of its hashed files, best-effort): the runtime imports this
module and `layout`, never `cutecc.store.writer`. Every path comes from
`cutecc.store.layout`. Metadata is read bounded, without following links, and typed on
demand (`Entry.meta`: `cutecc.entry.meta.EntryMeta`); the store's own records are read
(`read_record`) into their typed records (`IndexRecord`, `GenerationRecord`,
`ManifestRecord`, `CompositeRecord`, `Stats`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import functools
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cutecc import trust
from cutecc.archs import is_arch
from cutecc.entry.meta import EntryMeta, RuntimeMeta
from cutecc.entry.rules import (
    MAX_INDEX_BYTES,
    MAX_JSON_DEPTH,
    MAX_META_BYTES,
    META,
    STORE_FORMAT,
    USED,
    Recorded,
    is_kernel_name,
    is_key,
    meta_stamp,
    parse_json,
)
from cutecc.errors import CuteccError, WorkError
from cutecc.store.build_records import (
    COMPOSITE_DEPTH,
    FALLBACKS_DEPTH,
    CompositeRecord,
    GenerationRecord,
    ManifestRecord,
)
from cutecc.store.index_record import IndexRecord
from cutecc.store.layout import MAX_PLAN_BYTES, Layout
from cutecc.store.stats import MAX_STATS_BYTES, STATS_DEPTH, Stats
from cutecc.store.tuning_records import MAX_RECORD_BYTES, TuningPlan, TuningResults

_S = TypeVar("_S", bound="StoreView")


def read_record(path: str | Path, limit: int = MAX_META_BYTES, depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON record of the cache (stats.json, an index record, a build record, a composite),
    opened as meta.json is: through directories only this user or root could have written,
    following no link, only if a regular file (a FIFO never blocks the read) that no one
    else could have written (group write included, `cutecc.trust`), and bounded in size
    (never more than `limit` bytes read) and in nesting (`depth`).

    Raises FileNotFoundError when absent, trust.Untrusted when it is not a regular file
    or someone else could have written it, ValueError when over `limit`, deeper than
    `depth` or not JSON, OSError when unreadable."""
    try:
        data = trust.read_path(path, limit)
    except OSError as e:
        if e.errno == errno.EFBIG:
            raise ValueError(f"over the {limit}-byte limit of this record") from None
        raise
    return parse_json(data, limit, depth)


def record_problem(path: str | Path, limit: int = MAX_META_BYTES,
                   depth: int = MAX_JSON_DEPTH) -> tuple[Any, str | None]:
    """(`read_record`'s value, None), or (None, why it cannot be read as a record);
    (None, None) when absent."""
    try:
        return read_record(path, limit, depth), None
    except FileNotFoundError:
        return None, None
    except trust.Untrusted as e:
        return None, e.why
    except ValueError as e:
        return None, f"unreadable: {e}"
    except OSError as e:
        return None, f"unreadable: {e.strerror}"


def read_small_json(path: Path, limit: int = MAX_META_BYTES, depth: int = MAX_JSON_DEPTH) -> Any:
    """A small JSON record of the cache (`read_record`), None when absent, unreadable,
    untrusted, larger, deeper or not JSON."""
    return record_problem(path, limit, depth)[0]


def default_cache_dir() -> Path:
    """`$CUTECC_CACHE_DIR`, else `v<STORE_FORMAT>` in the platform's user cache directory
    (XDG on Linux; `cutecc.store.homes.cache`): a cutecc of another store format keeps its
    own default cache beside this one, so an upgrade (or two versions on one machine) never
    finds the other's."""
    from cutecc.store import homes

    return homes.cache()


def touch_used(entry_dir: str | Path) -> None:
    """Record a use of the entry by setting its `used` file's mtime to now.

    Best-effort (a read-only cache or a concurrently removed entry is fine): errors are
    ignored. It never changes the entry's hashed files, so it is safe beside readers.
    """
    used = os.path.join(entry_dir, USED)
    try:
        os.utime(used)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            os.close(os.open(used, os.O_WRONLY | os.O_CREAT, 0o644))
    except OSError:
        pass


@dataclass(frozen=True)
class Entry:
    """A published cache entry: its directory and its meta.json, read (`read_meta`) but not
    yet checked. `meta` (`runtime_meta` for a runtime library) is the checked, typed record
    every reader acts on; `recorded` names and sizes an entry whose metadata may be damaged;
    `doc`, the parsed object itself, is for `cutecc.entry.rules`' checks and reports only."""

    key: str
    path: Path
    doc: dict[str, Any]

    @functools.cached_property
    def meta(self) -> EntryMeta:
        """The entry's metadata checked and typed (`EntryMeta.parse`), once; ValueError
        saying why it cannot be trusted as the entry of its key."""
        return EntryMeta.parse(self.doc, self.key)

    @functools.cached_property
    def runtime_meta(self) -> RuntimeMeta:
        """The same for a runtime library entry (`RuntimeMeta.parse`)."""
        return RuntimeMeta.parse(self.doc, self.key)

    @functools.cached_property
    def recorded(self) -> Recorded:
        """What its meta.json says, unchecked (`entry.rules.Recorded`): to name a damaged entry."""
        return Recorded.of(self.doc)

    @property
    def size(self) -> int:
        """Bytes the metadata records (damaged records count as 0; `cutecc verify` names them)."""
        return self.recorded.size

    def disk_bytes(self) -> int:
        """Bytes of every file in the entry's directory (what removing it frees)."""
        total = 0
        with contextlib.suppress(OSError):
            for f in os.scandir(self.path):
                with contextlib.suppress(OSError):
                    total += f.stat(follow_symlinks=False).st_size
        return total

    def last_used(self) -> float:
        """Epoch seconds of the last use: the later of the `used` mtime and `built_at`."""
        times = []
        with contextlib.suppress(OSError):
            times.append(os.stat(self.path / USED).st_mtime)
        try:
            times.append(dt.datetime.fromisoformat(str(self.recorded.built_at)).timestamp())
        except ValueError:
            with contextlib.suppress(OSError):
                times.append(os.stat(self.path / META).st_mtime)
        return max(times, default=0.0)


class StoreView:
    """A cutecc cache directory, read-only (`cutecc.store.writer.Store` adds the writing)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root).expanduser() if root else default_cache_dir()
        self.layout = Layout(self.root)
        lay = self.layout
        self.entries_dir = lay.entries()
        self.runtimes_dir = lay.runtimes()
        self.index_dir = lay.index()
        self.tmp_dir = lay.tmp()
        self.locks_dir = lay.locks()
        self.quarantine_dir = lay.quarantine()
        self.generations_dir = lay.generations()
        self.manifests_dir = lay.manifests()
        self.composites_dir = lay.composites()

    def check_trust(self) -> None:
        """Refuse (trust.Untrusted, exit 1) a cache that someone other than this user or
        root could have written: its directories from `/` down, and its own top-level
        directories, which must not be symbolic links."""
        trust.check_dir(self.root)
        for d in (self.entries_dir, self.runtimes_dir, self.index_dir, self.tmp_dir,
                  self.locks_dir, self.quarantine_dir):
            try:
                st = os.lstat(d)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise WorkError(f"cannot read: {e.strerror}", where=str(d)) from None
            if not stat.S_ISDIR(st.st_mode):
                what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
                raise trust.Untrusted(f"{d} is {what}", str(d))
            why = trust.stat_problem(st, str(d)) if trust.enforced() else None
            if why:
                raise trust.Untrusted(why, str(d))

    def _check_format(self, fmt: Path) -> None:
        try:  # one short line: read as a record is, no link followed, never blocking, bounded
            fd = os.open(fmt, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                raw = os.read(fd, 64) if stat.S_ISREG(os.fstat(fd).st_mode) else b"?"
            finally:
                os.close(fd)
        except OSError as e:
            raise WorkError(f"cannot read the cache's format file: {e.strerror}", where=str(fmt)) from None
        got = raw.decode(errors="replace").strip()
        if got != str(STORE_FORMAT):
            older = got.isdigit() and int(got) < STORE_FORMAT
            why = (" (an older cutecc's: its entries are of an older artifact format, which this "
                   "cutecc cannot run)" if older else "")
            raise WorkError(f"cache format {got!r} is not the format this cutecc uses "
                            f"({STORE_FORMAT}){why}; point --cache-dir elsewhere or remove it",
                            where=str(self.root))

    def require(self: _S) -> _S:
        """This store if it exists and is of this format, else a CuteccError (exit 1).

        For commands that inspect or prune a cache: a mistyped --cache-dir is an error,
        not an empty cache.
        """
        fmt = self.layout.format_file()
        if not fmt.is_file():
            raise WorkError("no cutecc cache here; run `cutecc build` first", where=str(self.root))
        self._check_format(fmt)
        return self

    def created(self) -> bool:
        """Whether the store's directories were created here (`Store.ensure`): a cache
        that does not exist yet gets no use marks, sweeps or counters."""
        return self.locks_dir.is_dir()

    # Entries ---------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """Whether the entry of `key` is published (its meta.json is there)."""
        return os.path.isfile(self.layout.entry_meta_str(key))

    def stamp(self, key: str) -> list[int] | None:
        """The stamp (`entry.rules.meta_stamp`) of the entry's meta.json, None when absent."""
        try:
            return meta_stamp(os.stat(self.layout.entry_meta_str(key)))
        except OSError:
            return None

    def get(self, key: str) -> Entry | None:
        return self._get(self.layout.entry(key), key)

    def get_runtime(self, key: str) -> Entry | None:
        """The runtime library entry of `key`, or None."""
        return self._get(self.layout.runtime(key), key)

    def kernel_names(self) -> list[str]:
        """The kernels the index names (one directory listing, no metadata read)."""
        try:
            return sorted(n for n in os.listdir(self.index_dir) if is_kernel_name(n))
        except OSError:
            return []

    def kernel_keys(self, kernel: str) -> list[str]:
        """The keys of the index's records for `kernel` (an entry may have gone since)."""
        if not is_kernel_name(kernel):
            return []
        d = self.layout.index_kernel(kernel)
        try:
            if stat.S_ISLNK(os.lstat(d).st_mode):
                return []
            return sorted(f.name for f in os.scandir(d) if is_key(f.name))
        except OSError:
            return []

    def indexed_facts(self, kernel: str, key: str) -> IndexRecord | None:
        """The index record of `kernel`/`key` (`IndexRecord`, its `facts` set) when it is
        there, whole, a regular file and trusted, else None."""
        if not is_kernel_name(kernel):
            return None
        try:  # strings, not Paths: a no-op build reads 10,000 of these
            fd = os.open(self.layout.index_record_str(kernel, key),
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (trust.enforced() and trust.stat_problem(st, "")):
                return None
            data = os.read(fd, MAX_INDEX_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        return IndexRecord.loads(data, kernel, key)

    def _get(self, path: Path, key: str) -> Entry | None:
        try:
            meta = read_meta(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise WorkError(f"unreadable metadata: {e}", where=str(path / META)) from None
        return Entry(key, path, meta)

    def entries(self) -> Iterator[Entry]:
        """Every published entry, in key order; unreadable ones, and shards or entries that
        are symbolic links, are skipped (`cutecc verify` reports them)."""
        return self._scan(self.entries_dir)

    def runtimes(self) -> Iterator[Entry]:
        """Every published runtime library entry, in key order (unreadable ones skipped)."""
        return self._scan(self.runtimes_dir)

    def _scan(self, area: Path) -> Iterator[Entry]:
        try:
            shards = sorted(os.scandir(area), key=lambda e: e.name)
        except OSError:
            return
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            try:
                dirs = sorted(os.scandir(shard.path), key=lambda e: e.name)
            except OSError:
                continue
            for d in dirs:
                if not d.is_dir(follow_symlinks=False):
                    continue
                try:
                    meta = read_meta(Path(d.path))
                except (OSError, ValueError):
                    continue
                yield Entry(d.name, Path(d.path), meta)

    # What builds recorded ------------------------------------------------------------

    def composite(self, name: str) -> CompositeRecord | None:
        """Composite `name`'s record, or None. It decides what a call runs, so it is read as
        the cache's metadata is: through directories only this user or root could have
        written, following no link (a record someone else could have written raises
        trust.Untrusted, and so does one that is not a regular file), bounded in size and
        nesting (`read_record`)."""
        if not is_kernel_name(name) or not self.composites_dir.is_dir():
            return None
        try:
            doc = read_record(self.layout.composite(name), MAX_META_BYTES, COMPOSITE_DEPTH)
        except (FileNotFoundError, ValueError):
            return None
        return CompositeRecord.from_json(doc)

    def composite_names(self) -> list[str]:
        try:
            return sorted(n[:-5] for n in os.listdir(self.composites_dir)
                          if n.endswith(".json") and is_kernel_name(n[:-5]))
        except OSError:
            return []

    def generation(self, kernel: str, arch: str) -> frozenset[str] | None:
        """The keys of `kernel`'s newest build for `arch`, or None when none was recorded
        (a cache from before generations: every entry counts)."""
        rec = GenerationRecord.from_json(read_small_json(self.layout.generation(kernel, arch)))
        return None if rec is None or rec.keys is None else frozenset(rec.keys)

    def generation_manifest(self, kernel: str) -> Path | None:
        """The manifest the newest recorded build of `kernel` (any arch) was built from, or
        None (no record, or none that says)."""
        best: tuple[str, str] | None = None
        try:
            names = sorted(f.name for f in os.scandir(self.generations_dir))
        except OSError:
            return None
        for name in names:
            arch = name.removeprefix(f"{kernel}@").removesuffix(".json")
            if not (name.startswith(f"{kernel}@") and is_arch(arch)):
                continue
            rec = GenerationRecord.from_json(read_small_json(self.layout.generation(kernel, arch)))
            if (rec is not None and rec.kernel == kernel and rec.manifest is not None
                    and (best is None or rec.built_at > best[0])):
                best = (rec.built_at, rec.manifest)
        return Path(best[1]) if best else None

    def generation_records(self, kernel: str) -> list[GenerationRecord]:
        """`kernel`'s generation records, every arch (those unreadable, untrusted or of
        another format or kernel left out)."""
        out = []
        try:
            names = sorted(f.name for f in os.scandir(self.generations_dir))
        except OSError:
            return []
        for name in names:
            arch = name.removeprefix(f"{kernel}@").removesuffix(".json")
            if name.startswith(f"{kernel}@") and is_arch(arch):
                rec = GenerationRecord.from_json(read_small_json(self.layout.generation(kernel, arch)))
                if rec is not None and rec.kernel == kernel:
                    out.append(rec)
        return out

    def generation_fallbacks(self, kernel: str, arch: str) -> GenerationRecord | None:
        """`kernel`'s newest build for `arch` when it records fallbacks (`fallbacks`,
        `GenerationRecord.fallback`), read as any record that decides what runs is
        (`read_record`: a file others could have written names no module to import, it
        raises trust.Untrusted); None when none is recorded or it cannot be read."""
        try:
            doc = read_record(self.layout.generation(kernel, arch), MAX_META_BYTES, FALLBACKS_DEPTH)
        except trust.Untrusted:
            raise
        except (OSError, ValueError):
            return None
        rec = GenerationRecord.from_json(doc)
        if rec is None or rec.kernel != kernel or rec.arch != arch or not rec.fallbacks:
            return None
        return rec

    def manifest_entries(self, manifest: Path, sha256: str) -> ManifestRecord | None:
        """The record of the newest build of these manifest bytes (`ManifestRecord.entries`:
        {kernel: {arch: keys}}), or None."""
        rec = ManifestRecord.from_json(read_small_json(self.layout.manifest_record(manifest)))
        return rec if rec is not None and rec.sha256 == sha256 else None

    def manifest_record(self, manifest: Path) -> ManifestRecord | None:
        """The record of `manifest`'s builds, whatever bytes it was built from, or None."""
        return ManifestRecord.from_json(read_small_json(self.layout.manifest_record(manifest)))

    def manifest_records(self) -> list[ManifestRecord]:
        """Every manifest's record (one directory listing; each read as `manifest_record`),
        in file-name order; those unreadable, untrusted or of another format left out."""
        try:
            names = sorted(n for n in os.listdir(self.manifests_dir) if n.endswith(".json"))
        except OSError:
            return []
        return [r for n in names
                if (r := ManifestRecord.from_json(read_small_json(self.manifests_dir / n))) is not None]

    def match(self, prefix: str) -> list[str]:
        """Keys of the entries (directories with a meta.json) that start with `prefix`."""
        prefix = prefix.lower()
        if not self.entries_dir.is_dir():
            return []
        shards = ([self.entries_dir / prefix[:2]] if len(prefix) >= 2
                  else [Path(d.path) for d in os.scandir(self.entries_dir) if d.name.startswith(prefix)])
        out = []
        for shard in shards:
            with contextlib.suppress(OSError):
                out += [d.name for d in os.scandir(shard)
                        if d.name.startswith(prefix) and os.path.isfile(os.path.join(d.path, META))]
        return sorted(out)

    def recorded_keys(self) -> frozenset[str]:
        """Every key a record in the cache names: the newest build of every kernel and arch
        (`generations/`) and of every manifest (`manifests/`), every candidate of a stored
        tuning plan (`tuning/plans/`), and every default and winner of a tuning record
        (`tuning/results/`). What `cutecc gc --unreachable` keeps. Each file is read as its
        readers read it (`GenerationRecord`, `ManifestRecord`, `TuningPlan`,
        `TuningResults`); one unreadable, malformed or of another format names nothing (no
        reader would act on it)."""
        keys: set[str] = set()
        areas = ((self.generations_dir, MAX_META_BYTES, _generation_keys),
                 (self.manifests_dir, MAX_META_BYTES, _manifest_keys),
                 (self.layout.tuning_plans(), MAX_PLAN_BYTES, _plan_keys),
                 (self.layout.tuning_results(), MAX_RECORD_BYTES, _result_keys))
        for d, limit, read in areas:
            try:
                names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
            except OSError:
                continue
            for n in names:
                try:
                    data = trust.read_path(d / n, limit)
                except (OSError, trust.Untrusted):  # absent, over the limit, someone else's
                    continue
                keys.update(k for k in read(data, str(d / n)) if is_key(k))
        return frozenset(keys)

    def read_stats(self) -> Stats:
        """The counters builds record (zeros when absent, unreadable or of another format)."""
        return Stats.from_json(read_small_json(self.layout.stats(), MAX_STATS_BYTES, STATS_DEPTH))


def _doc(data: bytes) -> Any:
    try:
        return parse_json(data, len(data), MAX_JSON_DEPTH)
    except ValueError:
        return None


def _generation_keys(data: bytes, where: str) -> Iterable[str]:
    rec = GenerationRecord.from_json(_doc(data))
    return () if rec is None or rec.keys is None else rec.keys


def _manifest_keys(data: bytes, where: str) -> Iterable[str]:
    rec = ManifestRecord.from_json(_doc(data))
    return () if rec is None else rec.named_keys()


def _plan_keys(data: bytes, where: str) -> Iterable[str]:
    try:
        plan = TuningPlan.loads(data, where)
    except CuteccError:
        return ()
    return [c.key for it in plan.items for c in it.candidates]


def _result_keys(data: bytes, where: str) -> Iterable[str]:
    try:
        records = TuningResults.loads(data, where).records
    except CuteccError:
        return ()
    return [k for r in records for k in (r.line.base, r.line.winner)]


def entry_trust_problem(entry_dir: str | Path, files: list[str]) -> str | None:
    """Why an entry (its shard, its directory, meta.json and `files`) could have been
    written by someone other than this user or root, or None (also when the rules are off).
    The cache above it is `Store.check_trust`'s."""
    if not trust.enforced():
        return None
    d = os.fspath(entry_dir)  # strings, not Paths: a no-op build checks 10,000 of these
    for p in (os.path.dirname(d), d, os.path.join(d, META), *(os.path.join(d, f) for f in files)):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            return f"{p} is a symbolic link"
        why = trust.stat_problem(st, str(p))
        if why:
            return why
    return None


def read_meta(entry_dir: Path) -> dict[str, Any]:
    """An entry's parsed meta.json: opened without following a link (nor a linked shard or
    entry directory), bounded in size and nesting. Raises OSError or ValueError."""
    for d in (entry_dir.parent, entry_dir):  # the shard and the entry: real directories
        if stat.S_ISLNK(os.lstat(d).st_mode):
            raise ValueError(f"{d} is a symbolic link")
    fd = os.open(entry_dir / META, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("meta.json is not a regular file")
        data = os.read(fd, MAX_META_BYTES + 1)
    finally:
        os.close(fd)
    meta = parse_json(data)
    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    return meta
