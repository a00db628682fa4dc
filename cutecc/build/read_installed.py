"""Which installed distribution's file a compile read, and whether it is as the key saw it.

The read-set check (`cutecc.build.read_set`) asks this module about every file a compile
read from an installed distribution: `warm` indexes every RECORD on `sys.path` once per
process (a compile service before it forks, so its workers inherit it); `Dists` says how
the job's key covers a file (a distribution the key names, by its digest recomputed from
the store's hash cache or, keyed by RECORD alone, by the file's row; a toolchain package
at the keyed version; another distribution's file that matches its RECORD) and remembers
each file proven, under its stamp, for the process's later jobs.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import sys
import time
from pathlib import Path
from typing import Any

from cutecc.build.read_exempt import _under

_OWNERS: dict[str, tuple[str, str, str | None, int | None]] = {}  # file -> (dist, rel, hash, size)
# dist -> its RECORD's sys.path entry, stamp, INSTALLER's stamp and whether it held while read
# (what `cutecc.toolchain.recordstat.by_stat` judges a file's stat by)
_RECORDS: dict[str, tuple[str, list[int] | None, list[int] | None, bool]] = {}
OWNED_DIRS: set[str] = set()  # the directories holding installed distributions' files
_VERSIONS: dict[str, str] = {}  # dist -> its version (from its dist-info's name)
_HASH_CACHES: dict[str, Any] = {}  # store's hash cache file -> its HashCache, read once


def index_installed() -> None:
    """Index every installed distribution's RECORD (which files are whose, and their rows)
    on `sys.path`, once per process: a compile service does it before it forks, so its
    workers inherit it. Read as CSV directly (importlib.metadata's paths cost ~20x); the
    caller pauses the read-set hook (`cutecc.build.read_set.warm`)."""
    if _VERSIONS:
        return
    import csv

    from cutecc.toolchain.dists import normalize
    from cutecc.toolchain.hashcache import SETTLE_NS, path_stamp

    def settled_ns(ctime_ns: int) -> bool:
        return time.time_ns() - ctime_ns >= SETTLE_NS

    for entry in dict.fromkeys(os.path.abspath(p or ".") for p in sys.path):
        try:
            names = sorted(os.listdir(entry))
        except OSError:
            continue
        for info in names:
            if not info.endswith(".dist-info") or "-" not in info:
                continue
            dist, _, version = info[:-len(".dist-info")].partition("-")
            name = normalize(dist)
            if name in _VERSIONS:
                continue  # (the first on sys.path is the one imported)
            _VERSIONS[name] = version
            rec = os.path.join(entry, info, "RECORD")
            before = path_stamp(rec)
            try:
                with open(rec, newline="", encoding="utf-8") as f:
                    rows = list(csv.reader(f))
            except (OSError, UnicodeDecodeError, csv.Error):
                continue
            _RECORDS[name] = (entry, before, path_stamp(os.path.join(entry, info, "INSTALLER")),
                              before is not None and path_stamp(rec) == before and settled_ns(before[2]))
            for row in rows:
                if not row or not row[0]:
                    continue
                full = os.path.normpath(os.path.join(entry, row[0]))
                digest = row[1].partition("=")[2] if len(row) > 1 and row[1] else None
                size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
                _OWNERS.setdefault(full, (name, row[0], digest, size))
                parent = os.path.dirname(full)  # its folders below the sys.path entry
                while parent not in OWNED_DIRS and _under(parent, entry) and parent != entry:
                    OWNED_DIRS.add(parent)
                    parent = os.path.dirname(parent)


@functools.cache
def _version(name: str) -> str:
    """An installed distribution's version, read once per process."""
    return md.version(name)


class Dists:
    """The installed distributions' files, and whether each is as the key saw it."""

    def __init__(self, job: Any, store_root: str | None) -> None:
        from cutecc.toolchain.versions import TOOL_PACKAGES

        self.keyed: dict[str, str] = dict(job.key_inputs.get("distributions") or {})
        tools = job.key_inputs.get("toolchain") or {}
        self.tools = {n: str(tools.get("zig" if n == "ziglang" else n, "")).split()[0:1]
                      for n in TOOL_PACKAGES}
        self.store_root = store_root
        self._proven: dict[str, str | None] = {}
        self._index: Any = None
        self._hashes: Any = None

    def owner(self, path: str) -> tuple[str, str] | None:
        """(distribution, path in its RECORD) of an installed file its RECORD lists."""
        index_installed()
        got = _OWNERS.get(path)
        return None if got is None else (got[0], got[1])

    def line(self, name: str, rel: str) -> str:
        """How the key covers a file of `name` (a digest line)."""
        if name in self.keyed or name in self.tools:
            return f"dist {name} {rel}"
        return f"installed {name} {_VERSIONS.get(name, '?')} {rel}"

    def covers(self, name: str, rel: str, path: str, again: bool = True) -> tuple[str | None, str | None]:
        """(how the key covers `path`, file `rel` of distribution `name`, as a digest line;
        None and why when it does not). A file proven before in this process (a worker's
        earlier job: the DSL's and torch's files every job reads again) under the same key
        facts, and not changed since (its stamp; not even stat'ed unless read `again` in this
        job: what the process read of it before was proven then), is not proven again."""
        memo = (path, self.keyed.get(name), tuple(self.tools.get(name) or ()))
        hit = _PROVEN.get(memo)
        if hit is not None and not again:
            return hit[1], None
        stamp = _stamp(path)
        if hit is not None and stamp is not None and hit[0] == stamp:
            return hit[1], None
        why = self.problem(name, rel, path)
        if why is not None:
            return None, why
        line = self.line(name, rel)
        if stamp is not None:
            _PROVEN[memo] = (stamp, line)
        return line, None

    def problem(self, name: str, rel: str, path: str) -> str | None:
        """Why distribution `name`'s file `rel` may not be what the key saw (None: it is)."""
        if name in self.tools and name not in self.keyed:
            want = self.tools[name]
            have = _version(name)
            return None if want and have == want[0] else (
                f"the toolchain's {name} is {have}, but the key names {want[0] if want else 'none'}")
        if name in self.keyed:
            if name not in self._proven:
                self._proven[name] = self._digest_problem(name)
            why = self._proven[name]
            if why != "record":
                return why
        return self._record_problem(name, rel, path)

    def _hash_cache(self) -> Any:
        """The store's hash cache (files' SHA-256 under their stamps), read once per process."""
        from cutecc.toolchain.dists import HashCache

        if self._hashes is None:
            from cutecc.store.layout import Layout

            cache = Layout(Path(self.store_root)).hash_cache() if self.store_root else None
            if str(cache) not in _HASH_CACHES:  # (a stamp that moved is hashed again: never stale)
                _HASH_CACHES[str(cache)] = HashCache(cache, write=False)
            self._hashes = _HASH_CACHES[str(cache)]
        return self._hashes

    def _digest_problem(self, name: str) -> str | None:
        """None when the distribution's digest now is the key's; "record" when the key
        names it by RECORD alone (each file read is then checked against its row)."""
        from cutecc.toolchain.dists import DistIndex

        if self._index is None:
            self._index = DistIndex(self._hash_cache())
        version, _, digest = self.keyed[name].partition(" ")
        # (a digest the key's covers the METADATA naming the version: read only to say why not)
        if self._index.digest(name, full=False) == digest:
            return "record"
        if self._index.digest(name, full=True) == digest:
            return None
        if md.version(name) != version:
            return f"distribution {name} is {md.version(name)} now, the key names {version}"
        return f"distribution {name} changed since the build was planned; run the build again"

    def _record_problem(self, name: str, rel: str, path: str) -> str | None:
        """None when `path` (`rel` in its RECORD) is as its distribution's RECORD says: by
        its stat where the planner's rule (`cutecc.toolchain.recordstat.by_stat`) vouches for
        it, else by its hash."""
        import base64

        from cutecc.toolchain.recordstat import by_stat

        _, _, want, size = _OWNERS.get(path) or _OWNERS[os.path.realpath(path)]
        if want is None:
            return None  # RECORD's own row (and rows the installer wrote unhashed)
        try:
            st = os.lstat(path)
        except OSError as e:
            return f"{path} cannot be read: {e.strerror}"
        rec = _RECORDS.get(name)
        if rec is not None and size is not None:
            entry, stamp, installer, stable = rec
            if by_stat(stamp, installer, stable, {rel: (f"sha256={want}", str(size))},
                       [(rel, path, st)], set(), entry.rstrip("/") + "/"):
                return None
        got = bytes.fromhex(self._hash_cache().sha256(path))
        if base64.urlsafe_b64encode(got).rstrip(b"=").decode() == want:
            return None
        if name in self.keyed:
            return f"{path} of distribution {name} differs from its RECORD, by which alone the key names it"
        return (f"{path} of distribution {name} (which the key does not name) differs from its RECORD: "
                "reinstall it, or import it from the kernel's code so that the key names it")



def installed_byte_code(pyc: str, source: str, sha256: str) -> bool:
    """Whether byte code `pyc` is what the install of `source`'s distribution compiled from
    the bytes the key hashed (`sha256`, hex), told by stat alone: then the read-set check
    need not compile the source again to compare (`read_exempt._byte_code_is_source`: 74
    files, most of a worker's first check, for FA4's and quack's closures).

    pip byte-compiles what it installed before it writes the INSTALLER and then the RECORD,
    which lists each `.pyc` it wrote with no digest. So where one RECORD lists both files,
    the source's row names the key's SHA-256, and both pass `recordstat.by_stat`'s rule
    (the RECORD sealed by the install that wrote its INSTALLER; each file a regular file, not
    linked, on the RECORD's device, changed last before that INSTALLER: the pyc's size is
    not in its row and is not compared), the pyc was compiled by that install from the
    source as the key saw it. Anything else (a pyc Python wrote at an import, uv's
    `--compile-bytecode` after its RECORD, a pyc the wheel shipped with a digest, any later
    change) is compared by compiling, as before."""
    from cutecc.toolchain.recordstat import by_stat, record_hex

    index_installed()
    byte_code, src = _OWNERS.get(pyc), _OWNERS.get(source)
    if byte_code is None or src is None or byte_code[0] != src[0] or byte_code[2] is not None \
            or src[2] is None or src[3] is None:
        return False
    rec = _RECORDS.get(src[0])
    if rec is None:
        return False
    entry, stamp, installer, stable = rec
    prefix = entry.rstrip("/") + "/"
    digest = f"sha256={src[2]}"
    try:
        row_hex = record_hex(digest)
        stats = [(src[1], source, os.lstat(source)), (byte_code[1], pyc, os.lstat(pyc))]
    except (OSError, ValueError):
        return False
    if row_hex != sha256:
        return False
    rows = {src[1]: (digest, str(src[3])), byte_code[1]: (digest, str(stats[1][2].st_size))}
    return len(by_stat(stamp, installer, stable, rows, stats, set(), prefix)) == 2


# (path, the key's digest of its distribution, the toolchain's version) -> (its stamp when
# proven covered, its digest line): a process proves each installed file it read once
_PROVEN: dict[tuple[str, str | None, tuple[str, ...]], tuple[tuple[int, ...], str]] = {}


def _stamp(path: str) -> tuple[int, ...] | None:
    """What says a file is unchanged: device, inode, size, mtime and ctime (None: gone)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


