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
own (`cutecc.composite_line`), kept only where every launch is a kernel the lock pins.
The file is JSON with one entry per line, sorted, with a format version and no
timestamps, so it is byte-identical until an artifact changes and its diffs read one line
per changed artifact. Importing this imports neither the DSL nor JAX, nor the runtime:
the runtime reads these records.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.atomic import atomic_write
from cutecc.buckets import RULES, parse_bucket
from cutecc.composite_line import CompositeLine
from cutecc.entry import acted_on, bad_pin_field, is_key, label, parse_json, platform_of
from cutecc.errors import CuteccError
from cutecc.fallbacks import FallbackRef, refs_from_json, refs_to_json
from cutecc.platforms import BUILD_PLATFORM, PLATFORMS
from cutecc.store.view import Entry, StoreView

LOCK_FORMAT = 3  # 3: each line names its host platform
LOCK_NAME = "kernels.lock"
MAX_LOCK_BYTES = 16 << 20  # 10,000 entry lines (~600 bytes) and as many tuning lines (~800)
MAX_LOCK_DEPTH = 4
MAX_TUNING_LINES = 20_000  # tuning lines in one lock or record: buckets x variants x devices
# The optional "tuning" list (`cutecc tune`'s winners) is absent until something is tuned,
# so untuned locks keep their bytes; readers that predate it ignore it and serve the
# default configurations. So is the optional "composites" list (`cutecc.composite_line`):
# one line per composite kernel whose launches the lock pins.
MAX_COMPOSITES = 10_000
# The optional "environment" object (`Environment`): the key-deciding distributions the
# lock's keys were planned with, so a build or verify elsewhere names what differs before
# it compiles. Versioned on its own: readers that predate it ignore it.
ENVIRONMENT_FORMAT = 1
MAX_ENV_DISTRIBUTIONS = 5_000


@dataclass(frozen=True)
class Pin:
    """What a line pins of an entry besides its key: everything the runtime acts on
    (`entry.acted_on`). A lock line pins its entry, a tuning line its winner; an entry
    whose metadata says otherwise in any of these is refused."""

    library: str
    sha256: str
    size: int
    symbol: str
    backward: str | None
    contract: str
    runtime: str  # the SHA-256 of the runtime library the kernel library links against

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> Pin | None:
        """The pin of an entry from its metadata; None when it records no library, symbol
        or runtime library."""
        acted = acted_on(dict(meta))
        if acted is None or acted["symbol"] is None or acted["runtime"] is None:
            return None
        return cls(**acted)

    def difference(self, meta: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
        """The first field in which an entry's metadata differs from this pin, as (field,
        the entry's value, the pinned value); None when it matches."""
        acted = acted_on(dict(meta)) or {}
        for name in PIN_FIELDS:
            got, want = acted.get(name), getattr(self, name)
            if got != want:
                return name, got, want
        return None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PIN_FIELDS = tuple(f.name for f in dataclasses.fields(Pin))


def _check_fields(d: Any, names: tuple[str, ...], exact: bool, where: str, kp: str) -> None:
    """Refuse a line that is not an object of `names` (`exact`: and nothing else) with
    values a pinned line may hold (`entry.bad_pin_field`)."""
    if not isinstance(d, dict) or not (set(d) == set(names) if exact else set(names) <= set(d)):
        raise CuteccError(f"expected the fields {', '.join(names)}", where=where, key_path=kp)
    bad = bad_pin_field(d, list(names))
    if bad:
        raise CuteccError(f"{bad} is not a valid value", where=where, key_path=f"{kp}.{bad}")


@dataclass(frozen=True)
class LockEntry:
    """One artifact: which entry it is, and what the runtime may trust it to be."""

    kernel: str
    variant: str
    arch: str
    platform: str  # the host platform of the library's host code (`cutecc.platforms`)
    key: str
    pin: Pin
    # the kernel's declared fallbacks by field ("fallback", "fallback_torch"), only when
    # declared: what a call no entry fits runs (`cutecc.fallbacks`)
    fallbacks: tuple[tuple[str, FallbackRef], ...] = ()

    @property
    def label(self) -> str:
        return label(self.kernel, self.variant, self.arch, self.platform)

    @property
    def order(self) -> tuple[str, str, str, str, str]:
        return (self.kernel, self.variant, self.arch, self.platform, self.key)

    @classmethod
    def of(cls, kernel: str, variant: str, arch: str, key: str, meta: dict[str, Any]) -> LockEntry:
        """The lock line for an entry, from its metadata."""
        pin = Pin.of(meta)
        platform = platform_of(meta)
        if pin is None:
            raise CuteccError(f"{label(kernel, variant, arch, platform)} {key[:12]}: malformed metadata (no "
                              "library file record, symbol or runtime library record)",
                              where="kernels.lock", exit_code=1)
        return cls(kernel, variant, arch, platform, key, pin)

    @classmethod
    def from_facts(cls, kernel: str, variant: str, arch: str, key: str,
                   facts: dict[str, Any], platform: str = BUILD_PLATFORM) -> LockEntry:
        """The lock line for an entry of `platform`, from its index record (`entry.index_facts`)."""
        return cls(kernel, variant, arch, platform, key, Pin(**{f: facts[f] for f in PIN_FIELDS}))

    def mismatch(self, entry: Entry) -> str | None:
        """Why the entry differs from this line (in anything the runtime acts on), or None."""
        m = entry.meta
        for name in ("kernel", "variant", "arch"):
            if m.get(name) != getattr(self, name):
                return f"{name} {m.get(name)!r}, the lock says {getattr(self, name)!r}; refusing it"
        if platform_of(m) != self.platform:
            return f"platform {platform_of(m)!r}, the lock says {self.platform!r}; refusing it"
        diff = self.pin.difference(m)
        if diff is not None:
            name, got, want = diff
            what = {"sha256": "library SHA-256", "runtime": "runtime library SHA-256"}.get(name, name)
            return f"{what} {_short(got)} differs from the lock's {_short(want)}; refusing it"
        return None

    def to_json(self) -> dict[str, Any]:
        """The line as the file holds it: the entry's identity, then its pin, flat."""
        return {"kernel": self.kernel, "variant": self.variant, "arch": self.arch,
                "platform": self.platform, "key": self.key, **self.pin.to_json(),
                **refs_to_json(dict(self.fallbacks))}

    @classmethod
    def from_json(cls, e: Any, where: str, kp: str) -> LockEntry:
        """A line read from a lock: exactly its fields (the fallback fields optional), each checked."""
        refs = refs_from_json(e, where, f"{kp}.") if isinstance(e, dict) else {}
        if refs:
            e = {k: v for k, v in e.items() if k not in refs}
        _check_fields(e, LOCK_LINE_FIELDS, True, where, kp)
        if not is_key(e["key"]):
            raise CuteccError("key is not a cache key (64 hex digits)", where=where, key_path=f"{kp}.key")
        if not is_key(e["runtime"]):
            raise CuteccError("runtime is not a SHA-256 (64 hex digits)", where=where,
                              key_path=f"{kp}.runtime")
        if e["platform"] not in PLATFORMS:
            raise CuteccError(f"platform {e['platform']!r} is not one of {', '.join(sorted(PLATFORMS))}",
                              where=where, key_path=f"{kp}.platform")
        return cls(e["kernel"], e["variant"], e["arch"], e["platform"], e["key"],
                   Pin(**{f: e[f] for f in PIN_FIELDS}), tuple(sorted(refs.items())))


LOCK_LINE_FIELDS = ("kernel", "variant", "arch", "platform", "key", *PIN_FIELDS)


@dataclass(frozen=True)
class Tuned:
    """One recorded winner: what serves (kernel, variant, arch) on `device` for a bucket
    (`cutecc.buckets`). `base` is the default configuration's key; `pin` is what a lock
    line would pin of the winner (so the runtime refuses a winner whose bytes differ).

    `policy` (how it was measured: launches, clock, warm-up, rounds, the noise rule, as
    `cutecc.tuning.policy` names it) and `built_with` (the DSL that built the candidates,
    `cutecc.runtime.tuning.toolchain_of`) are optional: lines recorded before they existed
    lack both, keep their bytes and serve as before (a lock then holds no policy to mix)."""

    kernel: str
    variant: str
    arch: str
    device: str
    rule: str
    bucket: str
    base: str
    winner: str
    winner_variant: str
    pin: Pin
    policy: str | None = None
    built_with: str | None = None

    @property
    def order(self) -> tuple[Any, ...]:
        """Sort order: buckets by size, not by text (a lock lists n=4096 before n=65536)."""
        return (self.kernel, self.variant, self.arch, self.device, tuple(self.extents.items()))

    @property
    def extents(self) -> dict[str, int]:
        return parse_bucket(self.bucket)

    def to_json(self) -> dict[str, Any]:
        """The line as a lock or a record holds it: its own fields, then the winner's pin, flat,
        then the policy and the DSL where it has them (a line without keeps its bytes)."""
        extra = {n: getattr(self, n) for n in TUNED_OPTIONAL if getattr(self, n) is not None}
        return {n: getattr(self, n) for n in _TUNED_OWN} | self.pin.to_json() | extra

    @classmethod
    def from_json(cls, d: Any, where: str, kp: str) -> Tuned:
        """A line read from a lock, a results file or the cache: every field checked (a
        cache record carries more: its times)."""
        _check_fields(d, TUNED_FIELDS, False, where, kp)
        if not is_key(d["base"]) or not is_key(d["winner"]):
            raise CuteccError("base and winner must be cache keys", where=where, key_path=kp)
        if d["rule"] not in RULES:
            raise CuteccError(f"rule must be one of {', '.join(RULES)}", where=where, key_path=f"{kp}.rule")
        try:
            parse_bucket(d["bucket"])
        except ValueError as e:
            raise CuteccError(str(e), where=where, key_path=f"{kp}.bucket") from None
        for n in TUNED_OPTIONAL:
            v = d.get(n)
            if v is not None and not (isinstance(v, str) and 0 < len(v) <= MAX_TUNED_TEXT):
                raise CuteccError(f"must be a string of 1 to {MAX_TUNED_TEXT} characters or absent",
                                  where=where, key_path=f"{kp}.{n}")
        return cls(**{n: d[n] for n in _TUNED_OWN}, pin=Pin(**{f: d[f] for f in PIN_FIELDS}),
                   **{n: d.get(n) for n in TUNED_OPTIONAL})

    def mismatch(self, meta: Mapping[str, Any]) -> str | None:
        """Why the winner entry's metadata differs from this line, or None."""
        if meta.get("kernel") != self.kernel or meta.get("arch") != self.arch:
            return "kernel or arch differ from the tuning record"
        diff = self.pin.difference(meta)
        return None if diff is None else f"{diff[0]} differs from the tuning record"


TUNED_OPTIONAL = ("policy", "built_with")  # absent from lines recorded before them
MAX_TUNED_TEXT = 300
_TUNED_OWN = tuple(f.name for f in dataclasses.fields(Tuned) if f.name not in ("pin", *TUNED_OPTIONAL))
TUNED_FIELDS = (*_TUNED_OWN, *PIN_FIELDS)


def parse_tuning_lines(items: Any, where: str, kp: str) -> tuple[Tuned, ...]:
    """A list of tuning lines; one per (kernel, variant, arch, device, bucket)."""
    if not isinstance(items, list) or len(items) > MAX_TUNING_LINES:
        raise CuteccError(f"must be a list of at most {MAX_TUNING_LINES} tuning lines", where=where,
                          key_path=kp)
    out: dict[tuple[Any, ...], Tuned] = {}
    for i, d in enumerate(items):
        t = Tuned.from_json(d, where, f"{kp}[{i}]")
        if t.order in out:
            raise CuteccError(f"{t.kernel}[{t.variant}]@{t.arch} {t.bucket} on {t.device} is recorded "
                              "twice", where=where, key_path=f"{kp}[{i}]")
        out[t.order] = t
    return tuple(sorted(out.values(), key=lambda t: t.order))


@dataclass(frozen=True)
class Drift:
    """One key-deciding distribution that differs from the lock's environment."""

    name: str
    locked: str | None  # "version digest" as the lock records it (None: not in the lock)
    installed: str | None  # as planning reads it here (None: not installed)

    def __str__(self) -> str:
        def ver(v: str | None) -> str:
            return "absent" if v is None else v.split(" ")[0]

        same = (self.locked is not None and self.installed is not None
                and ver(self.locked) == ver(self.installed))
        return f"{self.name} {ver(self.locked)} -> {ver(self.installed)}" + (" (other files)" if same else "")


@dataclass(frozen=True)
class Environment:
    """The installed distributions that decided the lock's keys, as `{name: "version
    digest"}` (`cutecc.dists.DistIndex.reached`): what every locked key was planned with."""

    distributions: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, reached: Iterable[Mapping[str, str]]) -> Environment:
        """The environment of planned entries, from each one's keyed distributions."""
        out: dict[str, str] = {}
        for d in reached:
            out.update(d)
        return cls(tuple(sorted(out.items())))

    def merged(self, older: Environment) -> Environment:
        """This environment, with `older`'s distributions that this one does not name (a
        partial build keeps lines planned in the older one)."""
        return Environment(tuple(sorted({**dict(older.distributions), **dict(self.distributions)}.items())))

    def drift(self, here: Environment) -> list[Drift]:
        """What differs between this (the lock's) and the environment `here` planned in,
        over the distributions `here` names, and those this names that are gone."""
        mine, theirs = dict(self.distributions), dict(here.distributions)
        return [Drift(n, mine.get(n), theirs.get(n)) for n in sorted(set(mine) | set(theirs))
                if mine.get(n) != theirs.get(n) and (n in theirs or _gone(n))]

    def to_json(self) -> dict[str, Any]:
        return {"format": ENVIRONMENT_FORMAT, "distributions": dict(self.distributions)}

    @classmethod
    def from_json(cls, d: Any, where: str) -> Environment | None:
        """The lock's environment; None for one of a later format (it decides nothing)."""
        if not isinstance(d, dict) or not isinstance(d.get("format"), int):
            raise CuteccError("environment is not an object with a format", where=where,
                              key_path="environment")
        if d["format"] != ENVIRONMENT_FORMAT:
            return None
        dists = d.get("distributions")
        if not isinstance(dists, dict) or len(dists) > MAX_ENV_DISTRIBUTIONS or not all(
                isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 200 and 0 < len(v) <= 200
                for k, v in dists.items()):
            raise CuteccError(f"distributions must map at most {MAX_ENV_DISTRIBUTIONS} names to "
                              "\"version digest\" strings", where=where, key_path="environment.distributions")
        return cls(tuple(sorted(dists.items())))


def _gone(name: str) -> bool:
    """Whether distribution `name` is not installed here."""
    import importlib.metadata as md

    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return True
    return False


def drift_line(lock_path: str | Path, drift: list[Drift], *, pins: str | None = None) -> str:
    """The one line a build or verify says when the key-deciding distributions differ from
    the environment the lock at `lock_path` was made in."""
    shown = ", ".join(map(str, drift[:6])) + (f" and {len(drift) - 6} more" if len(drift) > 6 else "")
    back = (f"run `pip install --require-hashes -r {pins}`" if pins
            else "install the pinned environment it was made in")
    return (f"{lock_path} was made in another environment ({shown}): its keys will not match; "
            f"{back} to reproduce it, or build anyway to re-lock on purpose")


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
            raise CuteccError(f"{len(missing)} locked entr{'y' if len(missing) == 1 else 'ies'} "
                              f"not in the cache: {', '.join(missing)}; run `cutecc build`",
                              where=str(store.root), exit_code=1)
        yield from found

    def resolve_all(self, store: StoreView) -> Iterator[tuple[Entry, LockEntry]]:
        """`resolve`, then each tuned winner's entry (what a pack ships besides defaults)."""
        yield from self.resolve(store)
        yield from Lock(tuple(self.winners())).resolve(store)


def _short(v: Any) -> str:
    return f"{v[:16]}..." if isinstance(v, str) and len(v) == 64 else repr(v)


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


def lock_for(items: Iterable[tuple[str, str, str, str]], store: StoreView) -> Lock:
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
            raise CuteccError(
                f"{le.label} {le.key[:12]}: the cache holds other bytes under a key the lock "
                f"already names (library SHA-256 {le.pin.sha256[:16]}..., locked "
                f"{was.pin.sha256[:16]}...); the lock is not rewritten. Run `cutecc verify --fix` "
                f"or `cutecc rm {le.key[:12]}`, then build again", where=str(path), exit_code=1)
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
    """`merge_build`, written as it is (nothing checked against a cache); True when the
    file changed."""
    merged = merge_build(path, lines, partial=partial, covered=covered, defined=defined,
                         composites=composites, environment=environment)
    return False if merged.unchanged else write_lock(path, merged.lock)


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
    import stat

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
