"""`kernels.lock`: the cache entry (key and library SHA-256) of every (kernel, variant, arch).

`cutecc build` writes it beside the manifest for CI to commit; `cutecc pack` and
`cutecc.load(lock=...)` read it to use exactly those entries, and refuse an entry whose
library hash differs. The file is JSON with one entry per line, sorted, with a format
version and no timestamps, so it is byte-identical until a key or a library changes
and its diffs read one line per changed artifact. Importing this imports neither the
DSL nor JAX.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from cutecc.atomic import atomic_write
from cutecc.entry import label, library_record
from cutecc.errors import CuteccError
from cutecc.store import Entry, Store

LOCK_FORMAT = 1
LOCK_NAME = "kernels.lock"
_FIELDS = ("kernel", "variant", "arch", "key", "library", "sha256", "size")


@dataclass(frozen=True, order=True)
class LockEntry:
    """One artifact: which entry it is and what its library's bytes must hash to."""

    kernel: str
    variant: str
    arch: str
    key: str
    library: str
    sha256: str
    size: int

    @property
    def label(self) -> str:
        return label(self.kernel, self.variant, self.arch)

    @classmethod
    def of(cls, kernel: str, variant: str, arch: str, entry: Entry) -> LockEntry:
        """The lock line for an entry of the store, from its meta.json file records."""
        rec = library_record(entry.meta)
        if rec is None:
            raise CuteccError("malformed metadata (no library file record)",
                              where=str(entry.path), exit_code=1)
        return cls(kernel, variant, arch, entry.key, *rec)

    def mismatch(self, entry: Entry) -> str | None:
        """Why the entry's recorded library differs from the lock's, or None if it matches."""
        rec = (entry.meta.get("files") or {}).get(self.library) or {}
        if entry.meta.get("library") != self.library or not rec:
            return f"library {entry.meta.get('library')!r}, the lock names {self.library!r}"
        if rec.get("sha256") != self.sha256 or rec.get("size") != self.size:
            return (f"library SHA-256 {str(rec.get('sha256'))[:16]}... differs from the lock's "
                    f"{self.sha256[:16]}...; refusing it")
        return None


@dataclass(frozen=True)
class Lock:
    """A parsed lock file: its entries, sorted by kernel, variant, arch."""

    entries: tuple[LockEntry, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(sorted(set(self.entries))))

    def dumps(self) -> bytes:
        """The file's bytes: deterministic, one entry per line."""
        lines = [json.dumps(asdict(e), separators=(", ", ": ")) for e in self.entries]
        body = ",\n  ".join(lines)
        return (f'{{\n "format": {LOCK_FORMAT},\n "entries": [\n  {body}\n ]\n}}\n'
                if lines else f'{{\n "format": {LOCK_FORMAT},\n "entries": []\n}}\n').encode()

    @classmethod
    def loads(cls, data: bytes, where: str) -> Lock:
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise CuteccError(f"not a lock file: {e}", where=where) from None
        if not isinstance(doc, dict) or doc.get("format") != LOCK_FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else None
            raise CuteccError(f"lock format {got!r}, this cutecc reads {LOCK_FORMAT}", where=where)
        out = []
        for i, e in enumerate(doc.get("entries") or []):
            if not isinstance(e, dict) or set(e) != set(_FIELDS):
                raise CuteccError(f"expected the fields {', '.join(_FIELDS)}", where=where,
                                  key_path=f"entries[{i}]")
            try:
                out.append(LockEntry(**{f: (int(e[f]) if f == "size" else str(e[f])) for f in _FIELDS}))
            except (TypeError, ValueError):
                raise CuteccError("size is not an integer", where=where,
                                  key_path=f"entries[{i}]") from None
        return cls(tuple(out))

    def distinct_keys(self) -> list[str]:
        """The distinct keys, sorted (variants that change nothing share one)."""
        return sorted({e.key for e in self.entries})

    def by_key(self) -> dict[str, LockEntry]:
        """One lock entry per key (the first in lock order)."""
        out: dict[str, LockEntry] = {}
        for e in self.entries:
            out.setdefault(e.key, e)
        return out

    def select(self, archs: Iterable[str] = (), kernels: Iterable[str] = ()) -> Lock:
        """Only the entries of these archs and kernels (all when empty)."""
        a, k = set(archs), set(kernels)
        return Lock(tuple(e for e in self.entries
                          if (not a or e.arch in a) and (not k or e.kernel in k)))

    def resolve(self, store: Store) -> Iterator[tuple[Entry, LockEntry]]:
        """Each locked entry of `store` with its lock line; an error names any it lacks."""
        found, missing = [], []
        for key, le in sorted(self.by_key().items()):
            e = store.get(key)
            if e is None:
                missing.append(f"{le.label} {key[:12]}")
            else:
                found.append((e, le))
        if missing:
            raise CuteccError(f"{len(missing)} locked entr{'y' if len(missing) == 1 else 'ies'} "
                              f"not in the cache: {', '.join(missing)}; run `cutecc build`",
                              where=str(store.root), exit_code=1)
        yield from found


def read_lock(path: str | Path) -> Lock:
    """Parse a lock file (bad or absent: CuteccError, exit 2)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CuteccError(f"cannot read the lock file: {e.strerror}", where=str(path)) from None
    return Lock.loads(data, str(path))


def write_lock(path: str | Path, lock: Lock) -> bool:
    """Write the lock atomically if its content changed; True when it was written."""
    path = Path(path)
    data = lock.dumps()
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    try:
        atomic_write(path, data)
    except OSError as e:
        raise CuteccError(f"cannot write the lock file: {e.strerror}", where=str(path),
                          exit_code=1) from None
    return True


def lock_for(items: Iterable[tuple[str, str, str, str]], store: Store) -> Lock:
    """The lock of (kernel, variant, arch, key) artifacts, hashes read from the store."""
    out = []
    for kernel, variant, arch, key in items:
        entry = store.get(key)
        if entry is None:
            raise CuteccError(f"{kernel}[{variant}]@{arch} {key[:12]} is not in the cache; run "
                              "`cutecc build`", where=str(store.root), exit_code=1)
        out.append(LockEntry.of(kernel, variant, arch, entry))
    return Lock(tuple(out))


def record_build(path: Path, lines: Iterable[LockEntry], *, partial: bool,
                 covered: set[tuple[str, str]], defined: set[str]) -> bool:
    """Write the lock of a successful build; True when its content changed.

    A full build locks exactly its `lines`. A `partial` one (restricted by --kernel or
    --arch) replaces only the (kernel, arch) pairs it `covered`, keeping the old file's
    other entries of kernels the manifest still `defined`.
    """
    new = Lock(tuple(lines))
    if partial and path.is_file():
        old = read_lock(path)
        kept = tuple(e for e in old.entries
                     if (e.kernel, e.arch) not in covered and e.kernel in defined)
        new = Lock(new.entries + kept)
    return write_lock(path, new)
