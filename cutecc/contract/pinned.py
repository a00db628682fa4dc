"""What a line pins of an entry (`Pin`: everything the runtime acts on) and a tuning
winner line (`Tuned`), each read back checked field by field. Shared by kernels.lock
(`cutecc.lock.lines`), the cache's tuning records (`cutecc.store.tuning_records`) and the
runtime, so in the base layer: nothing here reads a file.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutecc.contract.buckets import RULES, parse_bucket
from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import acted_on, bad_pin_field, is_key
from cutecc.errors import CuteccError

MAX_TUNING_LINES = 20_000  # tuning lines in one lock or record: buckets x variants x devices


@dataclass(frozen=True)
class Pin:
    """What a line pins of an entry besides its key: everything the runtime acts on
    (`entry.rules.acted_on`). A lock line pins its entry, a tuning line its winner; an entry
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

    def difference(self, meta: Mapping[str, Any] | EntryMeta) -> tuple[str, Any, Any] | None:
        """The first field in which an entry's metadata (its checked record, or the object
        of a meta.json that may be damaged) differs from this pin, as (field, the entry's
        value, the pinned value); None when it matches."""
        acted = meta.acted_on if isinstance(meta, EntryMeta) else acted_on(dict(meta)) or {}
        for name in PIN_FIELDS:
            got, want = acted.get(name), getattr(self, name)
            if got != want:
                return name, got, want
        return None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PIN_FIELDS = tuple(f.name for f in dataclasses.fields(Pin))


def check_fields(d: Any, names: tuple[str, ...], exact: bool, where: str, kp: str) -> None:
    """Refuse a line that is not an object of `names` (`exact`: and nothing else) with
    values a pinned line may hold (`entry.rules.bad_pin_field`)."""
    if not isinstance(d, dict) or not (set(d) == set(names) if exact else set(names) <= set(d)):
        raise CuteccError(f"expected the fields {', '.join(names)}", where=where, key_path=kp)
    bad = bad_pin_field(d, list(names))
    if bad:
        raise CuteccError(f"{bad} is not a valid value", where=where, key_path=f"{kp}.{bad}")


@dataclass(frozen=True)
class TunedTiming:
    """What a tuning line's decision rests on (microseconds, as measured under its
    `policy`): the winner's median and its spread (the half-width of the median's ~95%
    interval, `cutecc.tuning.decide.Timing`) and the default's. With them a reader of the
    lock checks that the winner beats the default by more than the noise (the spreads plus
    the rule's minimum gain of the default's median), or that the default won."""

    winner_us: float
    winner_spread_us: float
    default_us: float
    default_spread_us: float

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any, where: str, kp: str) -> TunedTiming:
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(d, dict) or set(d) != set(names) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in d.values()):
            raise CuteccError(f"must be a table of {', '.join(names)} (finite numbers >= 0, microseconds)",
                              where=where, key_path=kp)
        return cls(*(float(d[n]) for n in names))


@dataclass(frozen=True)
class Tuned:
    """One recorded winner: what serves (kernel, variant, arch) on `device` for a bucket
    (`cutecc.contract.buckets`). `base` is the default configuration's key; `pin` is what a lock
    line would pin of the winner (so the runtime refuses a winner whose bytes differ).

    `policy` (how it was measured: launches, clock, warm-up, rounds, the noise rule, as
    `cutecc.tuning.policy` names it) and `built_with` (the DSL that built the candidates,
    `cutecc.runtime.tuning.toolchain_of`) are optional: lines recorded before they existed
    lack both, keep their bytes and serve as before (a lock then holds no policy to mix).
    `timing` (the winner's median and spread and the default's, `TunedTiming`) is optional
    likewise: lines recorded before it keep their bytes."""

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
    timing: TunedTiming | None = None

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
        timed = {} if self.timing is None else {"timing": self.timing.to_json()}
        return {n: getattr(self, n) for n in _TUNED_OWN} | self.pin.to_json() | extra | timed

    @classmethod
    def from_json(cls, d: Any, where: str, kp: str) -> Tuned:
        """A line read from a lock, a results file or the cache: every field checked (a
        cache record carries more: its times)."""
        check_fields(d, TUNED_FIELDS, False, where, kp)
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
        timed = d.get("timing")
        timing = None if timed is None else TunedTiming.from_json(timed, where, f"{kp}.timing")
        return cls(**{n: d[n] for n in _TUNED_OWN}, pin=Pin(**{f: d[f] for f in PIN_FIELDS}),
                   **{n: d.get(n) for n in TUNED_OPTIONAL}, timing=timing)

    def mismatch(self, meta: EntryMeta) -> str | None:
        """Why the winner entry (its checked record) differs from this line, or None."""
        if meta.kernel != self.kernel or meta.arch != self.arch:
            return "kernel or arch differ from the tuning record"
        diff = self.pin.difference(meta)
        return None if diff is None else f"{diff[0]} differs from the tuning record"


TUNED_OPTIONAL = ("policy", "built_with")  # absent from lines recorded before them
MAX_TUNED_TEXT = 300
_TUNED_OWN = tuple(f.name for f in dataclasses.fields(Tuned)
                   if f.name not in ("pin", "timing", *TUNED_OPTIONAL))
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
