"""The planning caches: what planning learned about files, remembered in the store by the
files' stamps (`HashCache`): installed files' SHA-256s, distributions' digests, source
files' parsed facts and import closures, so that a no-op build reads no installed code.
The files' records are `planfacts`'; written through the store's writer (`write_planning`)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cutecc.errors import CuteccError
from cutecc.store.layout import PLAN_FACTS
from cutecc.toolchain import modfind, planmemory
from cutecc.toolchain.planfacts import (
    DIGEST,
    FACTS_FORMAT,
    ClosureBody,
    ClosureRef,
    DistRecord,
    Fact,
    FileHash,
    HashesFile,
    Member,
    P,
    PlanFacts,
    Searched,
    Sourced,
    T,
)
from cutecc.toolchain.planmemory import PlanMemory

HASH_CACHE_FORMAT = FACTS_FORMAT  # 2: stamps with ctime and device; planfacts.json beside it (`planfacts`)
FACTS = PLAN_FACTS  # beside the hash cache: what a no-op build reads (`HashCache`)
MAX_FACTS_BYTES = 64 << 20
MAX_HASHES_BYTES = 256 << 20
HASH_THREADS = min(8, os.cpu_count() or 1)  # `HashCache.prefetch`'s
CLOSURE_CONTEXTS = 4  # closures remembered per module and python_path (`HashCache.closure`)
SETTLE_NS = 2_000_000_000  # stamps younger than this are not remembered (`settled`)
# The largest source file planning reads (`HashCache.source`): parsing Python costs about
# 200 times its size in memory (a 4 MiB literal-dense module: ~0.9 GB, ~6 s, once per
# change of its stamp), so bigger ones are refused by name. The largest real one known, a
# generated MLIR ops module of the DSL, is 1.1 MB.
MAX_SOURCE_FILE_BYTES = 4 << 20


def stamp(st: os.stat_result) -> list[int]:
    """What tells a file unchanged without reading it: size, mtime, ctime, inode and device.
    An edit that keeps the size and puts the mtime back still moves the ctime, which only
    the clock sets; a reinstall makes a new inode."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def path_stamp(p: str) -> list[int] | None:
    """`stamp` of path `p`, a file's or a directory's (whose mtime and ctime move with every
    entry added, removed or renamed in it); None when there is nothing there."""
    try:
        return stamp(os.stat(p))
    except OSError:
        return None


def settled(st: os.stat_result) -> bool:
    """Whether a stamp may be remembered: its ctime is SETTLE_NS old, so an edit within the
    same tick of the file system's clock (which could leave every field as it was) is over."""
    return time.time_ns() - st.st_ctime_ns >= SETTLE_NS


def _hash_file(f: str) -> tuple[os.stat_result, str, bool] | None:
    """(`f`'s stat after reading it, its SHA-256, whether its stamp held while it was read),
    None when unreadable."""
    h = hashlib.sha256()
    try:
        with open(f, "rb") as fh:
            before = os.fstat(fh.fileno())
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
            after = os.fstat(fh.fileno())
    except OSError:
        return None
    return after, h.hexdigest(), stamp(before) == stamp(after)


def _read_stamped(f: str) -> tuple[bytes, str, os.stat_result | None]:
    """A source file's bytes, their SHA-256 (hashed as read, in chunks), and its stat if
    nothing changed it while it was read (else None); over MAX_SOURCE_FILE_BYTES, a
    CuteccError naming it (without reading it)."""
    with open(f, "rb") as fh:
        before = os.fstat(fh.fileno())
        _check_size(f, before.st_size)
        h, buf = hashlib.sha256(), bytearray()
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            buf += chunk
            _check_size(f, len(buf))  # it grew while read
        after = os.fstat(fh.fileno())
    return bytes(buf), h.hexdigest(), (after if stamp(before) == stamp(after) else None)


def _check_size(f: str, size: int) -> None:
    if size > MAX_SOURCE_FILE_BYTES:
        raise CuteccError(f"source file of {size / (1 << 20):.1f} MiB, over the "
                          f"{MAX_SOURCE_FILE_BYTES >> 20} MiB a source file in a kernel's closure may "
                          "have (planning parses each); keep large data out of Python source (a "
                          "file the kernel reads at build time)", where=f)


class HashCache:
    """What planning learned about files, remembered across runs by their stamps (`stamp`),
    so that a no-op build reads no installed code, only stats it. Two files in the store
    (their records: `planfacts`): `path` holds the SHA-256 of installed files (large:
    torch's 14,000; loaded only when a distribution's stamps changed), and `planfacts.json`
    beside it what the no-op path reads: each distribution's digest under a fingerprint of
    its RECORD and its files' stamps, and each source file's SHA-256 and parsed facts
    (imports, top-level names). Only settled stamps are remembered. Read through
    `cutecc.trust` (refused: planning starts from nothing and writes nothing back);
    `path=None` remembers within the run; `write=False` (a dry run, a read-only build) reads
    what was remembered and writes nothing into the cache. Behind the cache's own facts, the
    user's planning memory (`planmemory`: parsed facts by content, distributions' and
    closures' by the same stamps) answers what the cache does not, and learns what the run
    computed (a dry run's too: it is no cache)."""

    def __init__(self, path: Path | None, write: bool = True, memory: PlanMemory | None = None, *,
                 trust_records: bool = True) -> None:
        self.path = path
        # whether an installed file may be told by its stat against its RECORD instead of
        # hashed (`cutecc.toolchain.recordstat`); off: every file is read (`verify --deep`)
        self.trust_records = trust_records
        self.hashed_bytes = 0  # read and hashed by this cache this pass (`sha256`, `prefetch`)
        # the user's planning memory (`planmemory`), behind this cache's own facts: a cache
        # (not an in-run one) gets the default one; written even by a dry run (it is no cache)
        self.memory = memory if memory is not None or path is None else PlanMemory(
            planmemory.directory, parser_id())
        self.write = write
        self.facts_path = None if path is None else path.with_name(FACTS)
        self._hashes: HashesFile | None = None if path is not None else HashesFile.of()
        self._refused = False
        self._dirty: set[str] = set()
        data = self._read(self.facts_path, MAX_FACTS_BYTES)
        self._facts = (data is not None and PlanFacts.loads(data, MAX_FACTS_BYTES, parser_id())
                       or PlanFacts.of(parser_id()))
        # What the cache knew when loaded: the user's memory (`planmemory`) is asked and told
        # only of what it did not know (a new cache, a new file), never of what an edit or a
        # reinstall changed (the edit-and-rebuild loop reads and writes no memory).
        f = self._facts
        self._known = (set(f.dists.names()), set(f.sources.names()), set(f.closures.names()))
        self._stamps: dict[str, str | None] = {}  # this pass's (`_stamp`)
        # the stamps `remember_closure` took for the walks of the index born at `_remembered_since`
        self._remembered: dict[str, tuple[list[int] | None, str | None]] = {}  # path: stamp, as text
        self._remembered_since: int | None = None
        self._hashed: dict[str, tuple[os.stat_result, str, bool]] = {}  # `prefetch`: for `sha256`
        self._valid: dict[str, bool] = {}  # body digest -> `_holds`, this pass

    def _read(self, path: Path | None, limit: int) -> bytes | None:
        """The bytes of planning file `path`, None when absent, unreadable or refused."""
        if path is None:
            return None
        data, refused = planmemory.read_bounded(path, limit)
        self._refused = self._refused or refused
        return data

    def _file_hashes(self) -> HashesFile:
        if self._hashes is None:
            data = self._read(self.path, MAX_HASHES_BYTES)
            self._hashes = data is not None and HashesFile.loads(data, MAX_HASHES_BYTES) or HashesFile.of()
        return self._hashes

    def sha256(self, f: str) -> str:
        """SHA-256 of installed file `f` ("missing" when it cannot be read)."""
        hashes = self._file_hashes()
        try:
            st = os.stat(f)
        except OSError:
            return "missing"
        rec = hashes.files.get(f)
        if rec is not None and rec.stamp == stamp(st):
            return rec.sha256
        got = self._hashed.pop(f, None)
        if got is None or stamp(got[0]) != stamp(st):
            got = _hash_file(f)
            self.hashed_bytes += got[0].st_size if got is not None else 0
        if got is None:
            return "missing"
        after, digest, held = got
        if held and settled(after):
            hashes.files.put(f, FileHash(stamp(after), digest))
            self._dirty.add("files")
        return digest

    def prefetch(self, files: list[tuple[str, os.stat_result]]) -> None:
        """Hash those of `files` (path, its stat) not known under their stamps, on up to
        `HASH_THREADS` threads (reading and SHA-256 let go of the interpreter's lock, and a
        first planning hashes thousands of installed files: torch's 14,000, the DSL's
        libraries, over a GB). `sha256` takes what this hashed while the stamp holds."""
        hashes = self._file_hashes()
        todo = [f for f, st in files if (rec := hashes.files.get(f)) is None or rec.stamp != stamp(st)]
        threads = min(HASH_THREADS, len(todo) // 16)
        if threads < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        chunks = [todo[i::threads * 8] for i in range(threads * 8)]  # interleaved: sizes even out
        with ThreadPoolExecutor(threads) as pool:
            for chunk, got in zip(chunks, pool.map(lambda c: [_hash_file(f) for f in c], chunks)):
                for f, one in zip(chunk, got):
                    self.hashed_bytes += one[0].st_size if one is not None else 0
                    if one is not None and one[2]:
                        self._hashed[f] = one

    def source(self, f: str, kind: type[P], parse: Callable[[bytes], P]) -> Sourced[P]:
        """Facts of source file `f`: its SHA-256 and `parse(its bytes)` (of `kind`), from the
        cache while its stamp holds. `parse` raising (a syntax error) is not remembered; a
        file over MAX_SOURCE_FILE_BYTES is refused by name."""
        key = f"{kind.kind()}:{f}"
        rec = self._facts.sources.get(key)
        if rec is not None and isinstance(rec.parsed, kind):
            with contextlib.suppress(OSError):
                if rec.stamp == stamp(os.stat(f)):
                    return rec
        data, sha256, st = _read_stamped(f)
        memory = self.memory if key not in self._known[1] else None
        known = memory.parsed(kind, sha256) if memory is not None else None
        if known is None:
            known = parse(data)
            if memory is not None:
                memory.remember_parsed(sha256, known)
        del data
        if st is not None and settled(st):
            got = Sourced(stamp(st), sha256, known)
            self._facts.sources.put(key, got)
            self._dirty.add("facts")
            return got
        return Sourced(None, sha256, known)

    def closure(self, key: str, context: str) -> list[tuple[str, str, bool]] | None:
        """The import closure remembered under `key` (`cutecc.plan.key.SourceIndex._closure`):
        `(file, module, is a package)` per member, while the context is the same and every
        member file and every path its lookups read has the stamp it had then. None otherwise."""
        where = f"{key}\0{context}"
        ref = self._facts.closures.get(where)
        if ref is None and self.memory is not None and where not in self._known[2] \
                and (got := self.memory.closure(where)) and got[1].digest() == got[0]:
            ref = ClosureRef(key, got[0])  # the user's memory: checked as this cache's own, then kept here
            self._facts.closures.put(where, ref)
            self._facts.bodies.put(got[0], got[1])
            self._dirty.add("facts")
        body = self._facts.bodies.get(ref.digest) if ref is not None and ref.key == key else None
        if ref is None or body is None:
            return None
        if ref.digest not in self._valid:
            self._valid[ref.digest] = self._holds(body)
        if not self._valid[ref.digest]:
            return None
        return [(m.file, m.module, m.is_pkg) for m in body.members]

    def _holds(self, body: ClosureBody) -> bool:
        """Whether nothing a remembered closure depends on has changed: its member files'
        stamps, and for each directory searched either its stamp (the same listing) or, when
        it changed (a lock written beside the manifest), the stamps of the paths in it that
        decided the lookups (`modfind.candidates`: present as they were, absent still absent).
        A file read for its effect on `__path__` has no candidates, nor a path entry that is not
        a directory (a zip archive): any change counts."""
        for m in body.members:
            if self._stamp(m.file) != m.stamp:
                return False
        for d in body.dirs:
            if self._stamp(d.path) == d.stamp:
                continue
            # a zip archive (or other file) on the path: its candidates have no stamps
            # of their own (a module added inside leaves them all absent), so any change counts
            if not d.tails or not os.path.isdir(d.path) or any(
                    self._stamp(c) != d.present.get(c) for t in d.tails
                    for c in modfind.candidates(d.path, t)):
                return False
        return True

    def _stamp(self, p: str) -> str | None:
        """`path_stamp` as text, once per path and planning pass."""
        if p not in self._stamps:
            st = path_stamp(p)
            self._stamps[p] = None if st is None else ":".join(map(str, st))
        return self._stamps[p]

    def remember_closure(self, key: str, context: str, members: list[tuple[str, str, bool]],
                         consulted: Iterable[tuple[str, str]], since_ns: int) -> None:
        """Remember a closure whose lookups and reads all happened from `since_ns` on, under
        the stamps of its member files, of the directories its lookups searched with the
        paths in them that decided each (`modfind.candidates`; only those present are
        written), and of the `__init__` files read for their effect on `__path__` (`(file, "")`
        in `consulted`); only when none of them changed within SETTLE_NS before `since_ns`,
        so no stamp taken now can belong to content the walk did not see. Closures alike
        (modules of one package) share one record."""
        tails: dict[str, set[str]] = {}
        for p, tail in consulted:
            tails.setdefault(p, set())
            if tail:
                tails[p].add(tail)
        times: list[list[int] | None] = []
        # Closures of one walk's index share most paths (a package's modules: 16,000 paths
        # for 75,000 stamps over the published manifest's 13): each stamped once for them. A
        # stamp older than what a later walk read can only fail to match next time (walked
        # again), never vouch for bytes no walk saw.
        if self._remembered_since != since_ns:
            self._remembered_since, self._remembered = since_ns, {}
        seen = self._remembered

        def text(p: str) -> str | None:
            got = seen.get(p)
            if got is None:
                st = path_stamp(p)
                got = seen[p] = (st, None if st is None else ":".join(map(str, st)))
            times.append(got[0])
            return got[1]

        rows = [(f, name, is_pkg, text(f)) for f, name, is_pkg in sorted(members)]
        dirs = []
        for p, ts in sorted(tails.items()):
            present = {c: got for t in sorted(ts) for c in modfind.candidates(p, t)
                       if (got := text(c)) is not None}
            dirs.append(Searched(p, text(p), sorted(ts), present))
        if any(r[3] is None for r in rows) or any(
                st is not None and st[2] > since_ns - SETTLE_NS for st in times):
            return
        body = ClosureBody(tuple(Member(f, n, k, st) for f, n, k, st in rows if st is not None), tuple(dirs))
        digest = body.digest()
        # One record per context (`python -m cutecc` and the `cutecc` script search from
        # different first entries of sys.path): the newest CLOSURE_CONTEXTS of each key.
        closures = self._facts.closures
        mine = [k for k in closures.names() if (r := closures.get(k)) is not None and r.key == key]
        for k in mine[: max(0, len(mine) + 1 - CLOSURE_CONTEXTS)]:
            closures.drop(k)
        closures.put(f"{key}\0{context}", ClosureRef(key, digest), last=True)
        self._facts.bodies.put(digest, body)
        self._valid[digest] = True
        self._dirty.add("facts")
        if self.memory is not None and f"{key}\0{context}" not in self._known[2]:
            self.memory.remember_closure(f"{key}\0{context}", ClosureRef(key, digest), body)

    def dist_digest(self, where: str, fingerprint: str) -> str | None:
        """The digest remembered for the distribution at `where` under `fingerprint`."""
        return self.recall(where, fingerprint, DIGEST)

    def remember_dist(self, where: str, fingerprint: str, digest: str) -> None:
        self.remember(where, fingerprint, DIGEST, digest)

    def recall(self, where: str, fingerprint: str, kind: Fact[T]) -> T | None:
        """What was remembered of an installed distribution under `where` (a path and what
        was computed from it, a `kind` of fact) while `fingerprint` (the stamps it was
        computed under) holds; None otherwise, or when of another shape."""
        rec = self._facts.dists.get(where)
        if rec is not None and rec.fingerprint == fingerprint:
            return kind.load(rec.value)
        if self.memory is not None and where not in self._known[0] and (
                got := self.memory.recall(where, fingerprint)) is not None \
                and (value := kind.load(got.value)) is not None:
            self._facts.dists.put(where, got)  # this cache remembers it too
            self._dirty.add("facts")
            return value
        return None

    def remember(self, where: str, fingerprint: str, kind: Fact[T], value: T) -> None:
        rec = DistRecord(fingerprint, kind.dump(value))
        self._facts.dists.put(where, rec)
        self._dirty.add("facts")
        if self.memory is not None and where not in self._known[0]:
            self.memory.remember(where, rec)

    def save(self) -> None:
        """Write what was learned (best-effort: a read-only cache is fine), and add it to the
        user's planning memory."""
        if self.memory is not None:
            self.memory.save()
        if self.path is None or self._refused or not self.write:
            return
        from cutecc.store.writer import write_planning

        with contextlib.suppress(OSError):
            if "files" in self._dirty and self._hashes is not None:
                write_planning(self.path, self._hashes.dumps())
            if "facts" in self._dirty and self.facts_path is not None:
                write_planning(self.facts_path, self._facts.dumps())
            self._dirty.clear()


@functools.lru_cache(maxsize=1)
def parser_id() -> str:
    """Which cutecc's parsing produced remembered facts: a digest of the modules that
    compute them (imports and names of sources, path effects, distribution digests) and of
    the interpreter whose `ast` parsed (a file another Python parses differently, or not at
    all, is parsed afresh), so facts from another version of either are never served as
    this one's."""
    root = Path(__file__).resolve().parent.parent  # cutecc/
    h = hashlib.sha256(f"{sys.implementation.cache_tag}\0{sys.version}\0".encode())
    for name in ("toolchain/dists.py", "toolchain/hashcache.py", "plan/key.py", "plan/sourcefacts.py",
                 "toolchain/modfind.py",
                 "toolchain/planmemory.py", "toolchain/planfacts.py", "plan/shadows.py"):
        with contextlib.suppress(OSError):
            h.update(name.encode() + b"\0" + (root / name).read_bytes())
    return h.hexdigest()[:16]
