"""The lines of kernels.lock: `Pin` (the bytes a line serves), `LockEntry` (which entry
serves a kernel, variant, arch and platform) and `Tuned` (a tuning winner), each read back
checked field by field."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutecc.contract.buckets import RULES, parse_bucket
from cutecc.contract.fallbacks import FallbackRef, refs_from_json, refs_to_json
from cutecc.entry import acted_on, bad_pin_field, is_key, label
from cutecc.entry_meta import EntryMeta
from cutecc.errors import CuteccError, WorkError
from cutecc.platforms import BUILD_PLATFORM, PLATFORMS
from cutecc.store.index_record import IndexFacts
from cutecc.store.view import Entry

MAX_TUNING_LINES = 20_000  # tuning lines in one lock or record: buckets x variants x devices


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
    def of(cls, meta: Mapping[str, Any] | EntryMeta) -> Pin | None:
        """The pin of an entry from its metadata (its meta.json's object, or its checked
        record); None when it records no library, symbol or runtime library."""
        acted = meta.acted_on if isinstance(meta, EntryMeta) else acted_on(dict(meta))
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
    # declared: what a call no entry fits runs (`cutecc.contract.fallbacks`)
    fallbacks: tuple[tuple[str, FallbackRef], ...] = ()

    @property
    def label(self) -> str:
        return label(self.kernel, self.variant, self.arch, self.platform)

    @property
    def order(self) -> tuple[str, str, str, str, str]:
        return (self.kernel, self.variant, self.arch, self.platform, self.key)

    @classmethod
    def of(cls, kernel: str, variant: str, arch: str, key: str, meta: EntryMeta | None,
           platform: str = BUILD_PLATFORM) -> LockEntry:
        """The lock line for an entry, from its checked record (None: its metadata could not
        be read or trusted, an error naming it; `platform` names it then)."""
        if meta is None:
            raise WorkError(f"{label(kernel, variant, arch, platform)} {key[:12]}: malformed metadata "
                            "(`cutecc verify` says why)", where="kernels.lock")
        pin = Pin.of(meta)
        assert pin is not None  # a checked record has them all
        return cls(kernel, variant, arch, meta.platform, key, pin)

    @classmethod
    def from_facts(cls, kernel: str, variant: str, arch: str, key: str,
                   facts: IndexFacts, platform: str = BUILD_PLATFORM) -> LockEntry:
        """The lock line for an entry of `platform`, from its index record's facts."""
        return cls(kernel, variant, arch, platform, key, Pin(facts.library, facts.sha256, facts.size,
                                                             facts.symbol, facts.backward, facts.contract,
                                                             facts.runtime))

    def mismatch(self, entry: Entry) -> str | None:
        """Why the entry differs from this line (in anything the runtime acts on), or None."""
        m = entry.recorded  # unchecked: a damaged entry is named by what differs
        for name, got in (("kernel", m.kernel), ("variant", m.variant), ("arch", m.arch)):
            if got != getattr(self, name):
                return f"{name} {got!r}, the lock says {getattr(self, name)!r}; refusing it"
        if m.platform != self.platform:
            return f"platform {m.platform!r}, the lock says {self.platform!r}; refusing it"
        diff = self.pin.difference(entry.doc)
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
    (`cutecc.contract.buckets`). `base` is the default configuration's key; `pin` is what a lock
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


def _short(v: Any) -> str:
    return f"{v[:16]}..." if isinstance(v, str) and len(v) == 64 else repr(v)
