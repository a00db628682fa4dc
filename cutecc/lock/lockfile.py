"""`kernels.lock`: exactly which cache entry serves every (kernel, variant, arch), and the
tuning lines that say which built configuration serves a call's shape bucket.

`cutecc build` writes it beside the manifest for CI to commit; `cutecc pack` and
`cutecc.load(lock=...)` read it to use exactly those entries. A line pins the entry's key
and everything the runtime acts on besides it (`Pin`): the library's SHA-256 and size, the
exported symbol, the backward pairing, the contract's digest and the SHA-256 of the
runtime library it links against, so no edit of meta.json changes what runs without the
lock refusing it. One line per key; duplicates are refused. A tuning line (`Tuned`, from
`cutecc tune`) pins its winner the same way; the cache's tuning records hold the same lines.
A composite kernel (launches of other kernels, sharing tensors by name) is one line of its
own (`cutecc.contract.composite_line`), kept only where every launch is a kernel the lock pins.
The file is JSON with one entry per line, sorted, with a format version and no
timestamps, so it is byte-identical until an artifact changes and its diffs read one line
per changed artifact. Importing this imports neither the DSL nor JAX, nor the runtime:
the runtime reads these records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutecc import settings
from cutecc.atomic import atomic_write
from cutecc.contract.composite_line import CompositeLine
from cutecc.contract.pinned import Tuned, parse_tuning_lines
from cutecc.entry.rules import label, parse_json
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.environment import ENVIRONMENT_FORMAT, Environment
from cutecc.lock.lines import LockEntry
from cutecc.store.view import Entry, StoreView

if TYPE_CHECKING:
    from cutecc.lock.signing import PrivateKey

LOCK_FORMAT = 3  # 3: each line names its host platform
LOCK_NAME = "kernels.lock"
MAX_LOCK_BYTES = 16 << 20  # 10,000 entry lines (~600 bytes) and as many tuning lines (~800)
MAX_LOCK_DEPTH = 6  # a line's fallback closure: {entries: [{fallback: {files: [[...]]}}]}
# The optional "tuning" list (`cutecc tune`'s winners) is absent until something is tuned,
# so untuned locks keep their bytes; readers that predate it ignore it and serve the
# default configurations. So is the optional "composites" list (`cutecc.contract.composite_line`):
# one line per composite kernel whose launches the lock pins.
MAX_COMPOSITES = 10_000


@dataclass(frozen=True)
class Lock:
    """A parsed lock file: its entries, sorted by kernel, variant, arch; one per key; the
    tuning winners recorded for them (one line per kernel, variant, arch, device, bucket);
    and the composite kernels whose launches they are (one line per composite, by name)."""

    entries: tuple[LockEntry, ...]
    tuning: tuple[Tuned, ...] = ()
    composites: tuple[CompositeLine, ...] = ()
    environment: Environment | None = None  # what its keys were planned with (absent: unknown)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(sorted(set(self.entries), key=lambda e: e.order)))
        object.__setattr__(self, "tuning", tuple(sorted(set(self.tuning), key=lambda t: t.order)))
        object.__setattr__(self, "composites", tuple(sorted(set(self.composites), key=lambda c: c.name)))

    def dumps(self) -> bytes:
        """The file's bytes: deterministic, one entry (and one tuning result) per line."""
        lines = [json.dumps(e.to_json(), separators=(", ", ": ")) for e in self.entries]
        body = ",\n  ".join(lines)
        comps = ""
        if self.composites:
            cl = ",\n  ".join(json.dumps(c.to_json(), separators=(", ", ": ")) for c in self.composites)
            comps = f',\n "composites": [\n  {cl}\n ]'
        tuned = ""
        if self.tuning:
            tl = ",\n  ".join(json.dumps(t.to_json(), separators=(", ", ": ")) for t in self.tuning)
            tuned = f',\n "tuning": [\n  {tl}\n ]'
        env = ""
        if self.environment is not None:  # one distribution per line: a drift diffs as one line
            dl = ",\n   ".join(f"{json.dumps(n)}: {json.dumps(v)}"
                               for n, v in self.environment.distributions)
            env = (f',\n "environment": {{\n  "format": {ENVIRONMENT_FORMAT},\n  "distributions": {{'
                   + (f"\n   {dl}\n  }}" if dl else "}") + "\n }")
        entries = f"[\n  {body}\n ]" if lines else "[]"
        return f'{{\n "format": {LOCK_FORMAT},\n "entries": {entries}{comps}{tuned}{env}\n}}\n'.encode()

    def with_environment(self, environment: Environment | None) -> Lock:
        """This lock, recording `environment` as what its keys were planned with."""
        return dataclasses.replace(self, environment=environment)

    def with_tuning(self, tuning: Iterable[Tuned]) -> Lock:
        """This lock with `tuning` as its results, less those whose default configuration
        (`base`) it no longer locks under the same kernel, variant and arch (a rebuilt
        kernel's results are stale: `cutecc tune` measures it again)."""
        here = {(e.kernel, e.variant, e.arch, e.key) for e in self.entries}
        return Lock(self.entries, tuple(t for t in tuning
                                        if (t.kernel, t.variant, t.arch, t.base) in here),
                    self.composites, self.environment)

    def with_composites(self, composites: Iterable[CompositeLine]) -> Lock:
        """This lock with `composites` as its composite lines, less those it cannot serve:
        one with a launch whose kernel the lock pins no entry of, or named like a kernel
        it pins (a partial selection, `--kernel`/`--arch`, drops them)."""
        pinned = {e.kernel for e in self.entries}
        return Lock(self.entries, self.tuning,
                    tuple(c for c in composites if c.name not in pinned and set(c.launches) <= pinned),
                    self.environment)

    def composite(self, name: str) -> CompositeLine | None:
        """The composite line named `name`, or None."""
        return next((c for c in self.composites if c.name == name), None)

    def winners(self) -> list[LockEntry]:
        """The lock lines of the tuned winners that are not default configurations."""
        defaults = {e.key: e.platform for e in self.entries}  # a winner's is its default's
        out = {t.winner: LockEntry(t.kernel, t.winner_variant, t.arch, defaults[t.base], t.winner, t.pin)
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
            le = LockEntry.from_json(item, where, kp)
            if le.key in seen:
                raise CuteccError(f"key {le.key[:12]} is locked twice (also entries[{seen[le.key]}]); "
                                  "a lock names each entry once", where=where, key_path=kp)
            seen[le.key] = i
            out.append(le)
        tuning = parse_tuning_lines(doc["tuning"], where, "tuning") if "tuning" in doc else ()
        env = Environment.from_json(doc["environment"], where) if "environment" in doc else None
        lock = cls(tuple(out), environment=env).with_tuning(tuning)
        return lock.with_composites(_composites(doc.get("composites", []), lock, where))

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
                          and (not p or e.platform in p)), environment=self.environment
                    ).with_tuning(self.tuning).with_composites(
                        c for c in self.composites if not k or c.name in k)

    @property
    def platforms(self) -> tuple[str, ...]:
        """The host platforms the lock's entries are for, sorted."""
        return tuple(sorted({e.platform for e in self.entries}))

    def resolve(self, store: StoreView) -> Iterator[tuple[Entry, LockEntry]]:
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
            raise WorkError(f"{len(missing)} locked entr{'y' if len(missing) == 1 else 'ies'} "
                            f"not in the cache: {', '.join(missing)}; run `cutecc build`",
                            where=str(store.root))
        yield from found

    def resolve_all(self, store: StoreView) -> Iterator[tuple[Entry, LockEntry]]:
        """`resolve`, then each tuned winner's entry (what a pack ships besides defaults)."""
        yield from self.resolve(store)
        yield from Lock(tuple(self.winners())).resolve(store)


def _composites(items: Any, lock: Lock, where: str) -> list[CompositeLine]:
    """The "composites" lines: each well formed, named once and not like a kernel the lock
    pins, and each launch a kernel whose entries the lock pins (a line that asks for
    anything else decides nothing: the lock is refused)."""
    if not isinstance(items, list) or len(items) > MAX_COMPOSITES:
        raise CuteccError(f"composites is not a list of at most {MAX_COMPOSITES} lines", where=where,
                          key_path="composites")
    pinned = {e.kernel for e in lock.entries}
    out: dict[str, CompositeLine] = {}
    for i, item in enumerate(items):
        kp = f"composites[{i}]"
        c = CompositeLine.from_json(item, where, kp)
        if c.name in out or c.name in pinned:
            raise CuteccError(f"composite {c.name!r} is named twice (a composite, or a kernel the lock "
                              "pins)", where=where, key_path=f"{kp}.name")
        for j, ln in enumerate(c.launches):
            if ln not in pinned:
                raise CuteccError(f"composite {c.name!r} launches {ln!r}, a kernel this lock pins no "
                                  "entry of; a composite runs only entries its lock vouches for",
                                  where=where, key_path=f"{kp}.launches[{j}]")
        out[c.name] = c
    return list(out.values())


def read_lock_bytes(path: str | Path) -> bytes:
    """A lock file's bytes, bounded (unreadable: CuteccError, exit 2)."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_LOCK_BYTES + 1)
    except OSError as e:
        raise CuteccError(f"cannot read the lock file: {e.strerror}", where=str(path)) from None


def read_trusted_lock(path: str | Path, *,
                      trusted_keys: Sequence[str | os.PathLike[str]] | None = None,
                      allow_unsigned: bool | None = None) -> Lock:
    """A lock file parsed from exactly the bytes whose signature (`PATH.sig`) was checked
    against the deployer's keys (`cutecc.lock.signing.check_lock`): for `load(lock=)` and `fetch`."""
    from cutecc.lock.signing import MAX_SIG_BYTES, SIG_SUFFIX, check_lock

    data, sig = read_lock_bytes(path), None
    try:
        with open(f"{path}{SIG_SUFFIX}", "rb") as f:
            sig = f.read(MAX_SIG_BYTES + 1)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise WorkError(f"cannot read the lock's signature: {e.strerror}",
                        where=f"{path}{SIG_SUFFIX}") from None
    check_lock(data, sig, str(path), trusted_keys=trusted_keys, allow_unsigned=allow_unsigned)
    return Lock.loads(data, str(path))


def read_lock(path: str | Path) -> Lock:
    """Parse a lock file (bad or absent: CuteccError, exit 2)."""
    return Lock.loads(read_lock_bytes(path), str(path))


def write_lock(path: str | Path, lock: Lock) -> bool:
    """Write the lock atomically if its content changed; True when it was written. Only
    `record_lock` calls it in cutecc (tests/architecture/test_lock_road.py): a command
    records a lock through that one road, so what it writes is also what gets signed."""
    path = Path(path)
    data = lock.dumps()
    try:  # compared only as a regular file of this size, and bounded: a FIFO never blocks it
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size == len(data):
            with open(path, "rb") as f:
                if f.read(len(data) + 1) == data:
                    return False
    except OSError:
        pass
    try:
        atomic_write(path, data)
    except OSError as e:
        raise WorkError(f"cannot write the lock file: {e.strerror}", where=str(path)) from None
    return True


@dataclass(frozen=True)
class Recorded:
    """What `record_lock` did: whether the file's bytes changed, the signature file
    (`PATH.sig`) when a key signed it, and the one it `removed` (unsigned, a signature of
    other bytes)."""

    changed: bool
    signature: Path | None = None
    removed: Path | None = None


def unsigned_line(removed: Path, lock_file: Path | None) -> str:
    """What a command says when `record_lock` removed a stale signature (`Recorded.removed`)."""
    return (f"removed {removed}: it signed {lock_file or 'the lock'} as it was before, and no "
            f"signing key was given; a deployer's load refuses the lock until it is signed again "
            f"(`cutecc build --sign-key KEY`, or {settings.SIGNING_KEY.where})")


def record_lock(path: str | Path, lock: Lock, signing_key: PrivateKey | None = None) -> Recorded:
    """The one road by which a command writes kernels.lock (`cutecc build`, `cutecc tune`):
    `lock` written atomically if its bytes changed, then, given `signing_key` (a key read by
    `cutecc.lock.signing.read_private_key`), signed: exactly the bytes written, so a file
    rewritten meanwhile by another process is never what gets signed. A signature that
    already holds this key's signature of these bytes is left as it is (`sign_file`), so
    an unchanged, signed lock is not rewritten; an unchanged lock this key has not signed
    yet gets its signature. Without a key, a signature beside the lock that is not of the
    bytes written is removed (`Recorded.removed`, said by the command): it would vouch for
    nothing, and a deployer's load says how to sign again."""
    from cutecc.lock import signing

    path = Path(path)
    changed = write_lock(path, lock)
    if signing_key is None:
        return Recorded(changed, removed=signing.drop_stale_signature(path, lock.dumps(), "lock"))
    return Recorded(changed, signing.sign_file(path, signing_key, "lock", data=lock.dumps()))


def lock_for(items: Iterable[tuple[str, str, str, str]], store: StoreView) -> Lock:
    """The lock of (kernel, variant, arch, key) artifacts, read from the store's metadata."""
    out = []
    for kernel, variant, arch, key in items:
        entry = store.get(key)
        if entry is None:
            raise WorkError(f"{label(kernel, variant, arch)} {key[:12]} is not in the cache; run "
                            "`cutecc build`", where=str(store.root))
        try:
            rec = entry.meta
        except ValueError as e:
            raise WorkError(f"{label(kernel, variant, arch)} {key[:12]}: {e}; run `cutecc verify --fix`",
                            where=str(entry.path)) from None
        out.append(LockEntry.of(kernel, variant, arch, key, rec))
    return Lock(tuple(out))


@dataclass(frozen=True)
class Merged:
    """The lock a successful build would write: `lock`, and which of its lines this build
    did not see itself (`kept` entry lines of a partial build, and every tuning line), for
    the build to check against its cache (`cutecc.ship.vouch`) before it writes or signs."""

    lock: Lock
    kept: tuple[LockEntry, ...] = ()
    unchanged: bool = False  # the file already says exactly this


def merge_build(path: Path, lines: Iterable[LockEntry], *, partial: bool,
                covered: set[tuple[str, str, str]], defined: set[str],
                composites: Iterable[CompositeLine] = (),
                environment: Environment | None = None) -> Merged:
    """The lock of a successful build, not written yet.

    A full build locks exactly its `lines`. A `partial` one (restricted by --kernel,
    --arch or --platform) replaces only the (kernel, arch, platform) it `covered`, keeping
    the old file's other entries of kernels the manifest still `defined`. Tuning lines stay while their
    defaults do. Never does it vouch for other bytes under a key the old lock already
    names: an entry whose key is unchanged but whose library (or anything else the runtime
    acts on) differs is an error (exit 1). The manifest's `composites` are locked where
    the lock pins every launch's kernel. `environment`: what this build's keys were planned
    with (a partial build keeps the old file's record of the distributions it did not reach).
    """
    composites = tuple(composites)
    new = Lock(tuple(lines), environment=environment).with_composites(composites)
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
        if was is not None and dataclasses.replace(was.pin, library=le.pin.library) != le.pin:
            raise WorkError(
                f"{le.label} {le.key[:12]}: the cache holds other bytes under a key the lock "
                f"already names (library SHA-256 {le.pin.sha256[:16]}..., locked "
                f"{was.pin.sha256[:16]}...); the lock is not rewritten. Run `cutecc verify --fix` "
                f"or `cutecc rm {le.key[:12]}`, then build again", where=str(path))
    kept: tuple[LockEntry, ...] = ()
    if partial:
        ours = {le.key for le in new.entries}
        kept = tuple(e for e in old.entries if (e.kernel, e.arch, e.platform) not in covered
                     and e.kernel in defined and e.key not in ours)
        env = (environment.merged(old.environment) if environment is not None and old.environment
               else environment)
        new = Lock(new.entries + kept, environment=env).with_composites(composites)
    return Merged(new.with_tuning(old.tuning), kept)


def record_build(path: Path, lines: Iterable[LockEntry], *, partial: bool,
                 covered: set[tuple[str, str, str]], defined: set[str],
                 composites: Iterable[CompositeLine] = (),
                 environment: Environment | None = None) -> bool:
    """`merge_build`, recorded as it is (`record_lock`; nothing checked against a cache,
    nothing signed); True when the file changed."""
    merged = merge_build(path, lines, partial=partial, covered=covered, defined=defined,
                         composites=composites, environment=environment)
    return False if merged.unchanged else record_lock(path, merged.lock).changed


def previous(path: Path) -> Lock | None:
    """The lock file a build is about to rewrite, as it is: None when there is none or it
    is of an older format (written anew); an unreadable or malformed one is an error, which
    a build raises before its first compile."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CuteccError(f"cannot read the lock file: {e.strerror}", where=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise CuteccError("is not a regular file; the build would have to replace it", where=str(path))
    return _previous(path)


def _previous(path: Path) -> Lock | None:
    """The lock file as it is, or None when there is none or it is of an older format."""
    if not path.is_file():
        return None
    try:
        return read_lock(path)
    except CuteccError:
        try:
            doc = parse_json(read_lock_bytes(path), MAX_LOCK_BYTES, MAX_LOCK_DEPTH)
        except (ValueError, CuteccError):
            doc = None
        if isinstance(doc, dict) and doc.get("format") in (1, 2):
            return None  # an older format (before the runtime or platform fields): written anew
        raise
