"""The on-disk cache: content-addressed entries, shared safely between processes.

Layout (format 2), under `$CUTECC_CACHE_DIR` or `v2/` in the user's cache directory (XDG):

    README               who owns this directory
    CACHEDIR.TAG         tells backup tools to skip it
    format               the store's format version
    entries/ab/<key>/    one published entry: meta.json + the kernel's shared library
                         (+ `used`, an empty file whose mtime records the last use)
    runtimes/ab/<key>/   one runtime library (meta.json + libcutecc_rt_<key16>.so + `used`),
                         keyed by the toolchain, shared by every kernel library linked to it
    by-kernel/<name>/<key>  a record per entry: the index. The loader lists it, so a
                         kernel's entries are found without reading any other's metadata;
                         a build reads a hit's record (its lock line, ~400 bytes) instead
                         of its meta.json
    tmp/<key>.<rand>/    an entry being built (or removed); published by one rename
    locks/<key>.lock     held while an entry is built, removed or quarantined
    quarantine/<key>.<time>/  entries `cutecc verify --fix` set aside (with why.json)
    stats.json           hit/miss counters of builds (locks/stats.lock guards it)
    generations/<kernel>@<arch>.json   the keys the newest build planned for that kernel
                         and arch: a plain `cutecc.load` offers only these (older entries
                         stay callable by lock until gc)
    manifests/<sha>.json the keys the newest build of a manifest (by path) planned, with
                         the manifest's SHA-256: what `cutecc.load(manifest=)` loads
    filehashes.json      remembered SHA-256s of installed files, by stamp (a cache)
    planfacts.json       remembered distribution digests and parsed sources, by their
                         files' stamps: what a no-op build plans from (a cache, `cutecc.dists`)

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
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from cutecc import environ, trust
from cutecc.atomic import TMP_NAME, atomic_write, fsync_dir
from cutecc.entry import (
    ENTRY_FORMAT,
    MAX_INDEX_BYTES,
    MAX_META_BYTES,
    META,
    RUNTIME_ENTRY_FORMAT,
    STORE_FORMAT,
    USED,
    file_record,
    index_bytes,
    index_facts,
    is_kernel_name,
    is_key,
    meta_stamp,
    parse_json,
    read_index_facts,
)
from cutecc.errors import CuteccError
from cutecc.locks import Busy, held, is_held
from cutecc.units import now_iso

DIR_MODE = 0o755  # what the cache's directories get, whatever the umask
FILE_MODE = 0o644  # and its files

INDEX = "by-kernel"  # by-kernel/<kernel>/<key>: which entries serve a kernel
STATS = "stats.json"
HASH_CACHE = "filehashes.json"  # file digests by stamp; planfacts.json beside it: `cutecc.dists`
STATS_FORMAT = 1
QUARANTINE_FORMAT = 1  # the layout of why.json in a quarantined entry
# Format 1 counters. Counters were added without a format change (remote_*: the remote
# cache); a reader takes the ones it knows, and a writer keeps the numbers it does not.
_COUNTERS = ("hits", "misses", "failures", "seconds_saved",
             "remote_hits", "remote_misses", "remote_refused", "remote_unavailable",
             "remote_uploads", "remote_requests", "remote_bytes_down", "remote_bytes_up",
             "remote_seconds", "remote_seconds_saved")
_SECONDS = ("seconds_saved", "remote_seconds", "remote_seconds_saved")

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


GENERATION_FORMAT = 1  # generations/*.json and manifests/*.json


def manifest_id(manifest: Path) -> str:
    """A manifest's name in `manifests/`: the SHA-256 of its absolute path."""
    return hashlib.sha256(str(Path(manifest).absolute()).encode()).hexdigest()


def _json_bytes(doc: Any) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _read_small_json(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return parse_json(f.read(MAX_META_BYTES + 1))
    except (OSError, ValueError):
        return None


def default_cache_dir() -> Path:
    """`$CUTECC_CACHE_DIR`, else `v<STORE_FORMAT>` in the platform's user cache directory
    (XDG on Linux): a cutecc of another store format keeps its own default cache beside
    this one, so an upgrade (or two versions on one machine) never finds the other's."""
    env = os.environ.get(environ.CACHE_DIR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("cutecc", appauthor=False)) / f"v{STORE_FORMAT}"


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
    """A published cache entry: its directory and its parsed metadata."""

    key: str
    path: Path
    meta: dict[str, Any]

    @property
    def size(self) -> int:
        """Bytes the metadata records (damaged records count as 0; `cutecc verify` names them)."""
        files = self.meta.get("files")
        recs = files.values() if isinstance(files, dict) else ()
        return sum(r["size"] for r in recs
                   if isinstance(r, dict) and type(r.get("size")) is int and r["size"] > 0)

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
            times.append(dt.datetime.fromisoformat(str(self.meta.get("built_at"))).timestamp())
        except ValueError:
            with contextlib.suppress(OSError):
                times.append(os.stat(self.path / META).st_mtime)
        return max(times, default=0.0)


class Store:
    """A cutecc cache directory."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root).expanduser() if root else default_cache_dir()
        self.entries_dir = self.root / "entries"
        self.runtimes_dir = self.root / "runtimes"
        self.index_dir = self.root / INDEX
        self._entries, self._index = str(self.entries_dir), str(self.index_dir)
        self.tmp_dir = self.root / "tmp"
        self.locks_dir = self.root / "locks"
        self.quarantine_dir = self.root / "quarantine"
        self.generations_dir = self.root / "generations"
        self.manifests_dir = self.root / "manifests"
        self.composites_dir = self.root / "composites"

    # Creation --------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the store if needed, and refuse one of another format."""
        fmt = self.root / "format"
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
            with filelock.FileLock(self.locks_dir / "store.lock", timeout=60, mode=FILE_MODE):
                if not fmt.is_file():
                    atomic_write(self.root / "README", _README.encode())
                    atomic_write(self.root / "CACHEDIR.TAG", _CACHEDIR_TAG.encode())
                    atomic_write(fmt, f"{STORE_FORMAT}\n".encode())
        except OSError as e:
            raise CuteccError(f"cannot create the cache: {e.strerror}", where=str(self.root),
                              exit_code=1) from None
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
            raise CuteccError(f"cannot write to the cache: {e.strerror}; build into a writable "
                              "--cache-dir, or use --read-only to use only what it holds",
                              where=str(self.root), exit_code=1) from None

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
                raise CuteccError(f"cannot read: {e.strerror}", where=str(d), exit_code=1) from None
            if not stat.S_ISDIR(st.st_mode):
                what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
                raise trust.Untrusted(f"{d} is {what}", str(d))
            why = trust.stat_problem(st, str(d)) if trust.enforced() else None
            if why:
                raise trust.Untrusted(why, str(d))

    def _check_format(self, fmt: Path) -> None:
        got = fmt.read_text().strip()
        if got != str(STORE_FORMAT):
            older = got.isdigit() and int(got) < STORE_FORMAT
            why = (" (an older cutecc's: its entries are of an older artifact format, which this "
                   "cutecc cannot run)" if older else "")
            raise CuteccError(f"cache format {got!r} is not the format this cutecc uses "
                              f"({STORE_FORMAT}){why}; point --cache-dir elsewhere or remove it",
                              where=str(self.root), exit_code=1)

    # Reading ---------------------------------------------------------------------

    def entry_dir(self, key: str) -> Path:
        return self.entries_dir / key[:2] / key

    def entry_path(self, key: str) -> str:
        """`entry_dir` as a string (cheaper where a build handles 10,000 keys)."""
        return os.path.join(self._entries, key[:2], key)

    def runtime_dir(self, key: str) -> Path:
        return self.runtimes_dir / key[:2] / key

    def has(self, key: str) -> bool:
        return os.path.isfile(os.path.join(self._entries, key[:2], key, META))

    def stamp(self, key: str) -> list[int] | None:
        """The stamp (`entry.meta_stamp`) of the entry's meta.json, None when absent."""
        try:
            return meta_stamp(os.stat(os.path.join(self._entries, key[:2], key, META)))
        except OSError:
            return None

    def get(self, key: str) -> Entry | None:
        return self._get(self.entry_dir(key), key)

    def get_runtime(self, key: str) -> Entry | None:
        """The runtime library entry of `key`, or None."""
        return self._get(self.runtime_dir(key), key)

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
        d = self.index_dir / kernel
        try:
            if stat.S_ISLNK(os.lstat(d).st_mode):
                return []
            return sorted(f.name for f in os.scandir(d) if is_key(f.name))
        except OSError:
            return []

    def index_record(self, kernel: str, key: str) -> Path:
        return self.index_dir / kernel / key

    def indexed_facts(self, kernel: str, key: str) -> dict[str, Any] | None:
        """The facts the index records for `kernel`/`key` (see `entry.index_facts`) when
        its record is there, whole, a regular file and trusted, else None."""
        if not is_kernel_name(kernel):
            return None
        try:  # strings, not Paths: a no-op build reads 10,000 of these
            fd = os.open(os.path.join(self._index, kernel, key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
        return read_index_facts(data, kernel, key)

    def _get(self, path: Path, key: str) -> Entry | None:
        try:
            meta = read_meta(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise CuteccError(f"unreadable metadata: {e}", where=str(path / META), exit_code=1) from None
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

    def exists(self) -> bool:
        """Whether the store was created (its locks area is there): where a build may keep
        its bookkeeping (stats, `used` marks) and sweep its leftovers."""
        return self.locks_dir.is_dir()

    def is_held(self, key: str) -> bool:
        """Whether another process holds `key`'s lock right now (a look, not a promise)."""
        return is_held(self.locks_dir / f"{key}.lock")

    # Build generations ---------------------------------------------------------------

    def record_generation(self, kernel: str, arch: str, keys: list[str], manifest: str) -> None:
        """Record `keys` as the current entries of `kernel` for `arch` (the newest build)."""
        self.generations_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        doc = {"format": GENERATION_FORMAT, "kernel": kernel, "arch": arch, "keys": sorted(set(keys)),
               "manifest": manifest, "built_at": now_iso()}
        atomic_write(self.generations_dir / f"{kernel}@{arch}.json", _json_bytes(doc), FILE_MODE)

    def forget_generation(self, kernel: str, arch: str) -> None:
        """Drop the record of `kernel`'s newest build for `arch` (best-effort): every entry
        of it counts again, as before records existed."""
        with contextlib.suppress(OSError):
            (self.generations_dir / f"{kernel}@{arch}.json").unlink()

    def forget_manifest(self, manifest: Path) -> None:
        """Drop the record of the keys the newest build of `manifest` planned (best-effort)."""
        with contextlib.suppress(OSError):
            (self.manifests_dir / f"{manifest_id(manifest)}.json").unlink()

    def record_composite(self, name: str, doc: dict[str, Any], manifest: str) -> None:
        """Record composite kernel `name` (its launches, inputs and outputs by name): it has
        no entry of its own, its launches are kernels with theirs."""
        self.composites_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        atomic_write(self.composites_dir / f"{name}.json", _json_bytes(
            {"format": GENERATION_FORMAT, "name": name, **doc, "manifest": manifest}), FILE_MODE)

    def composite(self, name: str) -> dict[str, Any] | None:
        """Composite `name`'s record, or None. It decides what a call runs, so it is read as
        the cache's metadata is: through directories only this user or root could have
        written, following no link (a record someone else could have written raises
        trust.Untrusted), bounded in size and nesting."""
        if not is_kernel_name(name) or not self.composites_dir.is_dir():
            return None
        try:
            doc = parse_json(trust.read_file(self.root, ("composites", f"{name}.json"), MAX_META_BYTES),
                             MAX_META_BYTES, 3)
        except (FileNotFoundError, ValueError):
            return None
        except OSError as e:
            if e.errno == 27:  # over the cap: not a record of ours
                return None
            raise
        if not isinstance(doc, dict) or doc.get("format") != GENERATION_FORMAT:
            return None
        ok = all(isinstance(doc.get(k), list) and all(isinstance(x, str) for x in doc[k])
                 for k in ("launches", "inputs", "outputs"))
        return doc if ok else None

    def composite_names(self) -> list[str]:
        try:
            return sorted(n[:-5] for n in os.listdir(self.composites_dir)
                          if n.endswith(".json") and is_kernel_name(n[:-5]))
        except OSError:
            return []

    def generation(self, kernel: str, arch: str) -> frozenset[str] | None:
        """The keys of `kernel`'s newest build for `arch`, or None when none was recorded
        (a cache from before generations: every entry counts)."""
        doc = _read_small_json(self.generations_dir / f"{kernel}@{arch}.json")
        keys = doc.get("keys") if isinstance(doc, dict) and doc.get("format") == GENERATION_FORMAT else None
        return frozenset(k for k in keys if isinstance(k, str)) if isinstance(keys, list) else None

    def record_manifest(self, manifest: Path, sha256: str, entries: dict[str, dict[str, list[str]]],
                        *, partial: bool) -> None:
        """Record the keys a build of `manifest` (whose bytes hash to `sha256`) planned, per
        kernel and arch; a `partial` build adds to the record of the same bytes."""
        self.manifests_dir.mkdir(mode=DIR_MODE, exist_ok=True)
        path = self.manifests_dir / f"{manifest_id(manifest)}.json"
        merged: dict[str, dict[str, list[str]]] = {}
        old = self.manifest_entries(manifest, sha256) if partial else None
        for k, per_arch in (old or {}).items():
            merged[k] = {a: list(v) for a, v in per_arch.items()}
        for k, per_arch in entries.items():
            merged.setdefault(k, {}).update({a: sorted(set(v)) for a, v in per_arch.items()})
        doc = {"format": GENERATION_FORMAT, "manifest": str(manifest), "sha256": sha256,
               "entries": merged, "built_at": now_iso()}
        atomic_write(path, _json_bytes(doc), FILE_MODE)

    def manifest_entries(self, manifest: Path, sha256: str) -> dict[str, dict[str, list[str]]] | None:
        """{kernel: {arch: [keys]}} of the newest build of these manifest bytes, or None."""
        doc = _read_small_json(self.manifests_dir / f"{manifest_id(manifest)}.json")
        if not (isinstance(doc, dict) and doc.get("format") == GENERATION_FORMAT
                and doc.get("sha256") == sha256 and isinstance(doc.get("entries"), dict)):
            return None
        out: dict[str, dict[str, list[str]]] = {}
        for k, per_arch in doc["entries"].items():
            if isinstance(per_arch, dict):
                out[k] = {a: [x for x in v if isinstance(x, str)] for a, v in per_arch.items()
                          if isinstance(v, list)}
        return out

    def require(self) -> Store:
        """This store if it exists and is of this format, else a CuteccError (exit 1).

        For commands that inspect or prune a cache: a mistyped --cache-dir is an error,
        not an empty cache.
        """
        fmt = self.root / "format"
        if not fmt.is_file():
            raise CuteccError("no cutecc cache here; run `cutecc build` first", where=str(self.root),
                              exit_code=1)
        self._check_format(fmt)
        return self

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

    def read_stats(self) -> dict[str, Any]:
        """The counters builds record (zeros when absent, unreadable or of another format)."""
        out: dict[str, Any] = dict.fromkeys(_COUNTERS, 0)
        try:
            doc = parse_json((self.root / STATS).read_bytes())
        except (OSError, ValueError):
            return out
        if isinstance(doc, dict) and doc.get("format") == STATS_FORMAT:
            out.update({k: doc[k] for k in _COUNTERS if isinstance(doc.get(k), (int, float))})
            out.update({k: doc[k] for k in ("since", "updated_at") if isinstance(doc.get(k), str)})
        return out

    # Writing ---------------------------------------------------------------------

    def add_stats(self, **delta: float) -> None:
        """Add to the build counters in stats.json, under locks/stats.lock, atomically.

        A stats.json of another format is left alone (a newer cutecc owns it).
        """
        path = self.root / STATS
        with filelock.FileLock(self.locks_dir / "stats.lock", timeout=10, mode=FILE_MODE):
            try:
                old = parse_json(path.read_bytes())
            except (OSError, ValueError):
                old = None  # absent or unreadable: start over
            if isinstance(old, dict) and isinstance(old.get("format"), int) \
                    and old["format"] != STATS_FORMAT:
                return
            cur = self.read_stats()
            now = now_iso()
            doc: dict[str, Any] = {
                k: v for k, v in old.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            } if isinstance(old, dict) else {}  # a newer cutecc's counters stay
            doc.update({"format": STATS_FORMAT, "since": cur.get("since", now), "updated_at": now})
            for k in _COUNTERS:
                doc[k] = cur[k] + delta.get(k, 0)
            for k in _SECONDS:
                doc[k] = round(doc[k], 3)
            atomic_write(path, json.dumps(doc, indent=1, sort_keys=True).encode())

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
            src = self.runtime_dir(key) if runtime else self.entry_dir(key)
            moved = self._move_out(key, self.tmp_dir / f"{key}.rm-{secrets.token_hex(6)}", src)
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
        dest = self.quarantine_dir / f"{key}.{stamp}"
        src = self.runtime_dir(key) if runtime else self.entry_dir(key)
        with self._locked(key, timeout):
            if still_bad is not None and src.is_dir() and not still_bad(src):
                return None
            moved = self._move_out(key, dest, src)
            if moved is not None and not runtime:
                self._unindex(key, moved)
        if moved is not None:
            with contextlib.suppress(OSError):
                why = {"format": QUARANTINE_FORMAT, "key": key, "reason": reason, "at": now_iso()}
                atomic_write(moved / "why.json", json.dumps(why, indent=1).encode())
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
        try:
            kernel = read_meta(moved).get("kernel")
        except (OSError, ValueError):
            kernel = None
        names = [kernel] if is_kernel_name(kernel) else self.kernel_names()
        for name in names:
            self.unindex(name, key)

    def index(self, key: str, meta: dict[str, Any], meta_file: Path) -> None:
        """Write the index record of the entry `key` with metadata `meta`, read from
        `meta_file` (whose stamp it keeps), durably (the caller holds the key's lock).
        Written in place, not renamed in: a record is read only for a published entry, and
        a torn one (a crash, or a reader racing a rewrite) fails to parse, which readers
        take as "read meta.json"."""
        kernel = meta.get("kernel")
        if not is_kernel_name(kernel):
            raise CuteccError(f"kernel name {kernel!r} is not an identifier", where=str(self.root),
                              exit_code=1)
        d = self.index_dir / kernel
        data = index_bytes(index_facts(key, meta, meta_stamp(os.stat(meta_file))))
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
        d = self.index_dir / kernel
        with contextlib.suppress(FileNotFoundError):
            os.unlink(d / key)
        with contextlib.suppress(OSError):
            os.rmdir(d)  # only when no other record is left

    def _move_out(self, key: str, dest: Path, src: Path | None = None) -> Path | None:
        """Move the entry directory (`src`, by default the entry of `key`) to `dest` (caller
        holds the key's lock): one rename, so readers see it whole or gone. Across file
        systems it is first renamed aside within its shard (still one rename out of
        readers' sight), then copied to `dest`."""
        src = self.entry_dir(key) if src is None else src
        if not os.path.lexists(src):
            return None  # a symbolic link is moved itself, never what it points to
        make_dir(dest.parent)
        try:
            os.rename(src, dest)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            aside = src.parent / f".{key}.{secrets.token_hex(6)}.tmp"
            os.rename(src, aside)
            fsync_dir(src.parent)
            _copy_tree(aside, dest)
            shutil.rmtree(aside, ignore_errors=True)
        fsync_dir(src.parent)
        fsync_dir(dest.parent)
        return dest

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float = -1) -> Iterator[None]:
        """Hold `locks/<key>.lock`. Raises filelock.Timeout, or CuteccError (exit 1) when the
        lock file cannot be created or opened (a read-only or full cache)."""
        with held(self.locks_dir / f"{key}.lock", timeout):
            yield

    def publish(self, key: str, build: Callable[[Path], dict[str, Any]], *,
                runtime: bool = False) -> tuple[Entry, bool]:
        """Return the entry for `key`, building it with `build(staging_dir)` if absent.

        `build` writes its files into the staging directory and returns the metadata;
        the store adds file hashes, writes meta.json, creates the entry's index record
        and publishes by rename. With `runtime`, a runtime library entry (no index record).
        Returns (entry, built): built is False when another process had it.
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
            staging = self.tmp_dir / f"{key}.{secrets.token_hex(6)}"
            make_dir(staging)
            final = self.runtime_dir(key) if runtime else self.entry_dir(key)
            try:
                meta = build(staging)
                for f in staging.iterdir():  # the linker's output follows the umask
                    os.chmod(f, FILE_MODE, follow_symlinks=False)
                meta["files"] = {p.name: file_record(p) for p in sorted(staging.iterdir())}
                meta["format"] = RUNTIME_ENTRY_FORMAT if runtime else ENTRY_FORMAT
                meta["key"] = key
                atomic_write(staging / META, json.dumps(meta, indent=1, sort_keys=True).encode())
                fsync_dir(staging)
                if not runtime:  # before the entry is visible: every visible entry is indexed
                    self.index(key, meta, staging / META)
                make_dir(final.parent)
                try:
                    os.rename(staging, final)
                except OSError as e:
                    if e.errno != errno.EXDEV:
                        raise
                    # entries/ is on another file system than tmp/: copy the staged entry
                    # next to its place first, so that the publishing rename stays atomic.
                    near = final.parent / f".{key}.{secrets.token_hex(6)}.tmp"
                    _copy_tree(staging, near)
                    os.rename(near, final)
                    shutil.rmtree(staging, ignore_errors=True)
                fsync_dir(final.parent)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return Entry(key, final, meta), True

    def _sweep_key(self, key: str, runtime: bool = False) -> None:
        """Remove a killed build's leftovers for `key` (we hold its lock)."""
        final = self.runtime_dir(key) if runtime else self.entry_dir(key)
        for d in (*self.tmp_dir.glob(f"{key}.*"), *final.parent.glob(f".{key}.*.tmp")):
            if d.is_dir() and not d.is_symlink():
                self._drop_leftover(key, d)

    def _drop_leftover(self, key: str, d: Path) -> None:
        """Delete a killed build's or removal's directory (we hold the key's lock), and the
        index record it may have left (created before a publish's rename, deleted after a
        removal's) when the entry is not published."""
        if not os.path.lexists(self.entry_dir(key)):
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
                guard = "stats.lock" if m.group(1) == STATS else "store.lock"
                try:
                    with filelock.FileLock(self.locks_dir / guard, timeout=0):
                        f.unlink(missing_ok=True)
                        n += 1
                except (filelock.Timeout, OSError):
                    continue
        return n


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
    fd = os.open(entry_dir / META, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
