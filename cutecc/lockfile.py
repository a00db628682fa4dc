"""`kernels.lock`: exactly which cache entry serves every (kernel, variant, arch).

`cutecc build` writes it beside the manifest for CI to commit; `cutecc pack` and
`cutecc.load(lock=...)` read it to use exactly those entries. A line pins the entry's key
and everything the runtime acts on besides it: the library's SHA-256 and size, the
exported symbol, the backward pairing, the contract's digest and the SHA-256 of the
runtime library it links against, so no edit of meta.json changes what runs without the
lock refusing it. One line per key; duplicates are refused.
The file is JSON with one entry per line, sorted, with a format version and no
timestamps, so it is byte-identical until an artifact changes and its diffs read one line
per changed artifact. Importing this imports neither the DSL nor JAX.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cutecc.atomic import atomic_write
from cutecc.entry import acted_on, bad_pin_field, is_key, label, parse_json, platform_of
from cutecc.errors import CuteccError
from cutecc.platforms import BUILD_PLATFORM, PLATFORMS
from cutecc.runtime.tuning import Tuned, parse_lines
from cutecc.store import Entry, Store

LOCK_FORMAT = 3  # 3: each line names its host platform
_ACTED = ("library", "sha256", "size", "symbol", "backward", "contract", "runtime")  # from acted_on
LOCK_NAME = "kernels.lock"
MAX_LOCK_BYTES = 16 << 20  # 10,000 entry lines (~600 bytes) and as many tuning lines (~800)
MAX_LOCK_DEPTH = 4
# The optional "tuning" list (`cutecc tune`'s winners, see cutecc.runtime.tuning) is absent
# until something is tuned, so untuned locks keep their bytes; readers that predate it
# ignore it and serve the default configurations.


@dataclass(frozen=True)
class LockEntry:
    """One artifact: which entry it is, and what the runtime may trust it to be."""

    kernel: str
    variant: str
    arch: str
    platform: str  # the host platform of the library's host code (`cutecc.platforms`)
    key: str
    library: str
    sha256: str
    size: int
    symbol: str
    backward: str | None
    contract: str
    runtime: str  # the SHA-256 of the runtime library the kernel library links against

    @property
    def label(self) -> str:
        return label(self.kernel, self.variant, self.arch, self.platform)

    @property
    def order(self) -> tuple[str, str, str, str, str]:
        return (self.kernel, self.variant, self.arch, self.platform, self.key)

    @classmethod
    def of(cls, kernel: str, variant: str, arch: str, key: str, meta: dict[str, Any]) -> LockEntry:
        """The lock line for an entry, from its metadata."""
        acted = acted_on(meta)
        platform = platform_of(meta)
        if acted is None or acted["symbol"] is None or acted["runtime"] is None:
            raise CuteccError(f"{label(kernel, variant, arch, platform)} {key[:12]}: malformed metadata (no "
                              "library file record, symbol or runtime library record)",
                              where="kernels.lock", exit_code=1)
        return cls(kernel, variant, arch, platform, key, **acted)

    @classmethod
    def from_facts(cls, kernel: str, variant: str, arch: str, key: str,
                   facts: dict[str, Any], platform: str = BUILD_PLATFORM) -> LockEntry:
        """The lock line for an entry of `platform`, from its index record (`entry.index_facts`)."""
        return cls(kernel, variant, arch, platform, key, **{f: facts[f] for f in _ACTED})

    def mismatch(self, entry: Entry) -> str | None:
        """Why the entry differs from this line (in anything the runtime acts on), or None."""
        m = entry.meta
        for name in ("kernel", "variant", "arch"):
            if m.get(name) != getattr(self, name):
                return f"{name} {m.get(name)!r}, the lock says {getattr(self, name)!r}; refusing it"
        if platform_of(m) != self.platform:
            return f"platform {platform_of(m)!r}, the lock says {self.platform!r}; refusing it"
        acted = acted_on(m) or {}
        for name in _ACTED:
            got, want = acted.get(name), getattr(self, name)
            if got != want:
                what = {"sha256": "library SHA-256", "runtime": "runtime library SHA-256"}.get(name, name)
                return f"{what} {_short(got)} differs from the lock's {_short(want)}; refusing it"
        return None


@dataclass(frozen=True)
class Lock:
    """A parsed lock file: its entries, sorted by kernel, variant, arch; one per key; and
    the tuning winners recorded for them (one line per kernel, variant, arch, device, bucket)."""

    entries: tuple[LockEntry, ...]
    tuning: tuple[Tuned, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(sorted(set(self.entries), key=lambda e: e.order)))
        object.__setattr__(self, "tuning", tuple(sorted(set(self.tuning), key=lambda t: t.order)))

    def dumps(self) -> bytes:
        """The file's bytes: deterministic, one entry (and one tuning result) per line."""
        names = [f.name for f in fields(LockEntry)]
        lines = [json.dumps({n: getattr(e, n) for n in names}, separators=(", ", ": "))
                 for e in self.entries]
        body = ",\n  ".join(lines)
        tuned = ""
        if self.tuning:
            tl = ",\n  ".join(json.dumps(t.to_json(), separators=(", ", ": ")) for t in self.tuning)
            tuned = f',\n "tuning": [\n  {tl}\n ]'
        return (f'{{\n "format": {LOCK_FORMAT},\n "entries": [\n  {body}\n ]{tuned}\n}}\n'
                if lines else f'{{\n "format": {LOCK_FORMAT},\n "entries": []{tuned}\n}}\n').encode()

    def with_tuning(self, tuning: Iterable[Tuned]) -> Lock:
        """This lock with `tuning` as its results, less those whose default configuration
        (`base`) it no longer locks under the same kernel, variant and arch (a rebuilt
        kernel's results are stale: `cutecc tune` measures it again)."""
        here = {(e.kernel, e.variant, e.arch, e.key) for e in self.entries}
        return Lock(self.entries, tuple(t for t in tuning
                                        if (t.kernel, t.variant, t.arch, t.base) in here))

    def winners(self) -> list[LockEntry]:
        """The lock lines of the tuned winners that are not default configurations."""
        defaults = {e.key: e.platform for e in self.entries}  # a winner's is its default's
        out = {t.winner: LockEntry(t.kernel, t.winner_variant, t.arch, defaults[t.base], t.winner,
                                   t.library, t.sha256, t.size, t.symbol, t.backward, t.contract,
                                   t.runtime)
               for t in self.tuning if t.winner not in defaults}
        return [out[k] for k in sorted(out)]

    @classmethod
    def loads(cls, data: bytes, where: str) -> Lock:
        try:
            doc = parse_json(data, MAX_LOCK_BYTES, MAX_LOCK_DEPTH)
        except ValueError as e:
            raise CuteccError(f"not a lock file: {e}", where=where) from None
        if not isinstance(doc, dict) or doc.get("format") != LOCK_FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else None
            hint = "; run `cutecc build` to write it anew" if got in (1, 2) else ""
            raise CuteccError(f"lock format {got!r}, this cutecc reads {LOCK_FORMAT}{hint}", where=where)
        items = doc.get("entries")
        if not isinstance(items, list):
            raise CuteccError("entries is not a list", where=where, key_path="entries")
        out: list[LockEntry] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(items):
            kp = f"entries[{i}]"
            le = _line(item, where, kp)
            if le.key in seen:
                raise CuteccError(f"key {le.key[:12]} is locked twice (also entries[{seen[le.key]}]); "
                                  "a lock names each entry once", where=where, key_path=kp)
            seen[le.key] = i
            out.append(le)
        tuning = parse_lines(doc["tuning"], where, "tuning") if "tuning" in doc else ()
        return cls(tuple(out)).with_tuning(tuning)

    def distinct_keys(self) -> list[str]:
        """The keys (tuned winners' too), sorted."""
        return sorted(self.by_key())

    def by_key(self) -> dict[str, LockEntry]:
        """The line of each key the lock vouches for: its entries and its tuned winners."""
        return {**{e.key: e for e in self.winners()}, **{e.key: e for e in self.entries}}

    def select(self, archs: Iterable[str] = (), kernels: Iterable[str] = (),
               platforms: Iterable[str] = ()) -> Lock:
        """Only the entries of these archs, kernels and platforms (all when empty)."""
        a, k, p = set(archs), set(kernels), set(platforms)
        return Lock(tuple(e for e in self.entries
                          if (not a or e.arch in a) and (not k or e.kernel in k)
                          and (not p or e.platform in p))).with_tuning(self.tuning)

    @property
    def platforms(self) -> tuple[str, ...]:
        """The host platforms the lock's entries are for, sorted."""
        return tuple(sorted({e.platform for e in self.entries}))

    def resolve(self, store: Store) -> Iterator[tuple[Entry, LockEntry]]:
        """Each locked entry of `store` with its lock line (not the tuned winners: see
        `resolve_all`); an error names any it lacks."""
        found, missing = [], []
        for key, le in sorted({e.key: e for e in self.entries}.items()):
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

    def resolve_all(self, store: Store) -> Iterator[tuple[Entry, LockEntry]]:
        """`resolve`, then each tuned winner's entry (what a pack ships besides defaults)."""
        yield from self.resolve(store)
        yield from Lock(tuple(self.winners())).resolve(store)


def _short(v: Any) -> str:
    return f"{v[:16]}..." if isinstance(v, str) and len(v) == 64 else repr(v)


def _line(e: Any, where: str, kp: str) -> LockEntry:
    names = [f.name for f in fields(LockEntry)]
    if not isinstance(e, dict) or set(e) != set(names):
        raise CuteccError(f"expected the fields {', '.join(names)}", where=where, key_path=kp)
    bad = bad_pin_field(e, names)
    if bad:
        raise CuteccError(f"{bad} is not a valid value", where=where, key_path=f"{kp}.{bad}")
    if not is_key(e["key"]):
        raise CuteccError("key is not a cache key (64 hex digits)", where=where, key_path=f"{kp}.key")
    if not is_key(e["runtime"]):
        raise CuteccError("runtime is not a SHA-256 (64 hex digits)", where=where,
                          key_path=f"{kp}.runtime")
    if e["platform"] not in PLATFORMS:
        raise CuteccError(f"platform {e['platform']!r} is not one of {', '.join(sorted(PLATFORMS))}",
                          where=where, key_path=f"{kp}.platform")
    return LockEntry(**e)


def read_lock_bytes(path: str | Path) -> bytes:
    """A lock file's bytes, bounded (unreadable: CuteccError, exit 2)."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_LOCK_BYTES + 1)
    except OSError as e:
        raise CuteccError(f"cannot read the lock file: {e.strerror}", where=str(path)) from None


def read_trusted_lock(path: str | Path, *, trusted_keys: list[str | Path] | None = None,
                      allow_unsigned: bool = False) -> Lock:
    """A lock file parsed from exactly the bytes whose signature (`PATH.sig`) was checked
    against the deployer's keys (`cutecc.signing.check_lock`): for `load(lock=)` and `fetch`."""
    from cutecc.signing import MAX_SIG_BYTES, SIG_SUFFIX, check_lock

    data, sig = read_lock_bytes(path), None
    try:
        with open(f"{path}{SIG_SUFFIX}", "rb") as f:
            sig = f.read(MAX_SIG_BYTES + 1)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CuteccError(f"cannot read the lock's signature: {e.strerror}", where=f"{path}{SIG_SUFFIX}",
                          exit_code=1) from None
    check_lock(data, sig, str(path), trusted_keys=trusted_keys, allow_unsigned=allow_unsigned)
    return Lock.loads(data, str(path))


def read_lock(path: str | Path) -> Lock:
    """Parse a lock file (bad or absent: CuteccError, exit 2)."""
    return Lock.loads(read_lock_bytes(path), str(path))


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
    """The lock of (kernel, variant, arch, key) artifacts, read from the store's metadata."""
    out = []
    for kernel, variant, arch, key in items:
        entry = store.get(key)
        if entry is None:
            raise CuteccError(f"{label(kernel, variant, arch)} {key[:12]} is not in the cache; run "
                              "`cutecc build`", where=str(store.root), exit_code=1)
        out.append(LockEntry.of(kernel, variant, arch, key, entry.meta))
    return Lock(tuple(out))


@dataclass(frozen=True)
class Merged:
    """The lock a successful build would write: `lock`, and which of its lines this build
    did not see itself (`kept` entry lines of a partial build, and every tuning line), for
    the build to check against its cache (`cutecc.vouch`) before it writes or signs."""

    lock: Lock
    kept: tuple[LockEntry, ...] = ()
    unchanged: bool = False  # the file already says exactly this


def merge_build(path: Path, lines: Iterable[LockEntry], *, partial: bool,
                covered: set[tuple[str, str, str]], defined: set[str]) -> Merged:
    """The lock of a successful build, not written yet.

    A full build locks exactly its `lines`. A `partial` one (restricted by --kernel,
    --arch or --platform) replaces only the (kernel, arch, platform) it `covered`, keeping
    the old file's other entries of kernels the manifest still `defined`. Tuning lines stay while their
    defaults do. Never does it vouch for other bytes under a key the old lock already
    names: an entry whose key is unchanged but whose library (or anything else the runtime
    acts on) differs is an error (exit 1).
    """
    new = Lock(tuple(lines))
    if not partial:  # the usual no-op build: the file says exactly this already
        try:
            if path.read_bytes() == new.dumps():
                return Merged(new, unchanged=True)
        except OSError:
            pass
    old = _previous(path)
    if old is None:
        return Merged(new)
    before = old.by_key()
    for le in new.entries:
        was = before.get(le.key)
        if was is not None and (was.sha256, was.size, was.symbol, was.backward, was.contract,
                                was.runtime) != (le.sha256, le.size, le.symbol, le.backward,
                                                 le.contract, le.runtime):
            raise CuteccError(
                f"{le.label} {le.key[:12]}: the cache holds other bytes under a key the lock "
                f"already names (library SHA-256 {le.sha256[:16]}..., locked "
                f"{was.sha256[:16]}...); the lock is not rewritten. Run `cutecc verify --fix` "
                f"or `cutecc rm {le.key[:12]}`, then build again", where=str(path), exit_code=1)
    kept: tuple[LockEntry, ...] = ()
    if partial:
        ours = {le.key for le in new.entries}
        kept = tuple(e for e in old.entries if (e.kernel, e.arch, e.platform) not in covered
                     and e.kernel in defined and e.key not in ours)
        new = Lock(new.entries + kept)
    return Merged(new.with_tuning(old.tuning), kept)


def record_build(path: Path, lines: Iterable[LockEntry], *, partial: bool,
                 covered: set[tuple[str, str, str]], defined: set[str]) -> bool:
    """`merge_build`, written as it is (nothing checked against a cache); True when the
    file changed."""
    merged = merge_build(path, lines, partial=partial, covered=covered, defined=defined)
    return False if merged.unchanged else write_lock(path, merged.lock)


def _previous(path: Path) -> Lock | None:
    """The lock file as it is, or None when there is none or it is of an older format."""
    if not path.is_file():
        return None
    try:
        return read_lock(path)
    except CuteccError:
        data = path.read_bytes()
        if b'"format": 1' in data[:64] or b'"format": 2' in data[:64]:
            return None  # an older format (before the runtime or platform fields): written anew
        raise
