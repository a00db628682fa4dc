"""The cache's tuning records, typed both ways, one parse per file: a default entry's
measured winners (`tuning/results/<default key>.json`, `TuningResults`; `cutecc tune
--results FILE` writes the same format) and a manifest's tuning plan
(`tuning/plans/<manifest sha256>.json`, `TuningPlan`). Here in the store, which owns the
files: `cutecc tune` writes them, the runtime (`cutecc.runtime.tuning`) and measuring
(`cutecc.plan.tuning_plan`) read them, and `cutecc gc` reads which keys they name
(`StoreView.recorded_keys`) through the same parse.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cutecc.contract.buckets import MAX_BUCKETS, MAX_EXTENT
from cutecc.contract.pinned import Tuned, parse_tuning_lines
from cutecc.entry.rules import is_key, parse_json
from cutecc.errors import CuteccError, WorkError
from cutecc.store.layout import MAX_PLAN_BYTES, PLAN_FORMAT, TUNING_FORMAT

MAX_RECORD_BYTES = 4 << 20  # a cache record (one default's); a `--results` file: MAX_RESULTS_BYTES


# A cache record's (and a results file's) measurements besides its tuning line, in the
# order `cutecc.tuning.measure` writes them; a record may lack any (only the line is
# required: what serves a call), and keeps exactly those it had.
MEASURED = ("k", "driver", "clock", "clock_note", "timing_notes", "toolchain", "times_us", "default_us",
            "winner_us", "dropped", "spread_us", "samples", "within_noise", "measurement")
MAX_NOTES = 10
MAX_POLICY_FIELDS = 32


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:  # bounded by the file's bound
    return isinstance(v, str)


# What each measured field must hold (a description for the error, a check).
_MEASURED_CHECKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "k": ("a count of calls", lambda v: type(v) is int and v >= 0),
    "driver": ("a string or null", lambda v: v is None or _text(v)),
    "clock": ("a string", _text),
    "clock_note": ("a string", _text),
    "timing_notes": (f"a list of at most {MAX_NOTES} strings",
                     lambda v: isinstance(v, list) and len(v) <= MAX_NOTES and all(map(_text, v))),
    "toolchain": ("a string", _text),
    "times_us": ("a table of variant -> [q1, median, q3] (finite numbers)",
                 lambda v: isinstance(v, dict) and all(
                     isinstance(t, list) and len(t) == 3 and all(map(_finite, t)) for t in v.values())),
    "default_us": ("a finite number", _finite),
    "winner_us": ("a finite number", _finite),
    "dropped": ("a table of variant -> reason",
                lambda v: isinstance(v, dict) and all(map(_text, v.values()))),
    "spread_us": ("a table of variant -> the median's spread (a finite number >= 0)",
                  lambda v: isinstance(v, dict) and all(_finite(t) and t >= 0 for t in v.values())),
    "samples": ("a table of variant -> a count of samples",
                lambda v: isinstance(v, dict) and all(type(t) is int and t >= 0 for t in v.values())),
    "within_noise": ("a list of variants", lambda v: isinstance(v, list) and all(map(_text, v))),
    "measurement": (f"a table of at most {MAX_POLICY_FIELDS} fields of strings, numbers, null or "
                    "lists of them",
                    lambda v: isinstance(v, dict) and len(v) <= MAX_POLICY_FIELDS and all(
                        _scalar(x) or (isinstance(x, list) and all(map(_scalar, x))) for x in v.values())),
}


def _scalar(v: Any) -> bool:
    return v is None or _text(v) or _finite(v)


@dataclass(frozen=True)
class TuningResult:
    """One measured winner, as a cache record (`tuning/results/<default key>.json`,
    TUNING_FORMAT) or a `cutecc tune` results file holds it: the tuning line (what serves
    the bucket) and what was measured: K calls per sample, the driver, the clock timed on
    and its notes, the DSL version, each candidate's quartiles in microseconds by variant,
    the default's and the winner's medians, the candidates dropped and why, each candidate's
    median spread and sample count, the candidates within the noise (`cutecc.tuning.decide`)
    and how it was measured (`measurement`: the policy's method and setting,
    `cutecc.tuning.policy`; the line's `policy` names the method). `present`
    names the measured fields the record holds (a record may lack some, or all: a bare
    line; its JSON keeps exactly those)."""

    line: Tuned
    k: int | None = None
    driver: str | None = None
    clock: str = "host"
    clock_note: str | None = None
    timing_notes: tuple[str, ...] = ()
    toolchain: str | None = None
    times_us: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    default_us: float = 0.0
    winner_us: float = 0.0
    dropped: Mapping[str, str] = field(default_factory=dict)
    spread_us: Mapping[str, float] = field(default_factory=dict)
    samples: Mapping[str, int] = field(default_factory=dict)
    within_noise: tuple[str, ...] = ()
    measurement: Mapping[str, Any] = field(default_factory=dict)
    present: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def base(self) -> str:
        return self.line.base

    @property
    def slot(self) -> tuple[str, str]:
        """(device, bucket): what one default's record holds once."""
        return self.line.device, self.line.bucket

    def to_json(self) -> dict[str, Any]:
        """The record as written: its line's fields, then the measured fields it has."""
        values = {"k": self.k, "driver": self.driver, "clock": self.clock, "clock_note": self.clock_note,
                  "timing_notes": list(self.timing_notes), "toolchain": self.toolchain,
                  "times_us": {v: list(t) for v, t in self.times_us.items()},
                  "default_us": self.default_us, "winner_us": self.winner_us,
                  "dropped": dict(self.dropped), "spread_us": dict(self.spread_us),
                  "samples": dict(self.samples), "within_noise": list(self.within_noise),
                  "measurement": dict(self.measurement)}
        return {**self.line.to_json(), **{n: values[n] for n in MEASURED if n in self.present}}

    @classmethod
    def parse(cls, doc: Any, where: str, key_path: str) -> TuningResult:
        """A record read from disk: its line checked as a lock's is (`Tuned.from_json`),
        each measured field it has checked and bounded; an error names `where` and the
        field's key path. Fields neither kind knows are not kept."""
        line = Tuned.from_json(doc, where, key_path)
        have = frozenset(n for n in MEASURED if n in doc)
        for name in sorted(have, key=MEASURED.index):
            what, ok = _MEASURED_CHECKS[name]
            if not ok(doc[name]):
                raise CuteccError(f"must be {what}", where=where, key_path=f"{key_path}.{name}")
        get = doc.get
        return cls(line, get("k"), get("driver"), get("clock", "host"), get("clock_note"),
                   tuple(get("timing_notes", ())), get("toolchain"),
                   {v: (t[0], t[1], t[2]) for v, t in get("times_us", {}).items()},
                   get("default_us", 0.0), get("winner_us", 0.0), dict(get("dropped", {})),
                   dict(get("spread_us", {})), dict(get("samples", {})), tuple(get("within_noise", ())),
                   dict(get("measurement", {})), have)


RESULTS_DEPTH = 8  # file > records > record > times_us > variant > quartiles, with room
MAX_RESULTS_BYTES = 64 << 20  # a `--results` file: a whole run (a cache record is one default's)


def _seconds(v: Any) -> bool:
    return _finite(v) and v >= 0


# A results file's run fields (what `--measure` says of the run; a cache record has none):
# name -> (what it must hold, check).
_RUN_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "device": ("a string or null", lambda v: v is None or _text(v)),
    "driver": ("a string or null", lambda v: v is None or _text(v)),
    "bench_seconds": ("a finite number >= 0 or null", lambda v: v is None or _seconds(v)),
}


@dataclass(frozen=True)
class TuningResults:
    """A tuning results file, one format (TUNING_FORMAT) both ways: the cache's record of
    one default entry (`tuning/results/<default key>.json`, `cutecc tune --record` merges
    into it) and the file `cutecc tune --measure --results FILE` writes and `--record FILE`
    reads (measured on one host, recorded on another). Its records, and what the run says
    of itself where a run wrote it: the device, its driver, the seconds measuring took (a
    cache record, merged from runs, says none: each record names its own device and
    driver). `dumps` writes it, `loads` reads it back, bounded and checked field by field."""

    records: tuple[TuningResult, ...]
    device: str | None = None
    driver: str | None = None
    bench_seconds: float | None = None

    def dumps(self) -> bytes:
        """The file's bytes: deterministic, one record per line (a cache record's bytes as
        ever; the run's fields, where known, after the format)."""
        fields = (("device", self.device), ("driver", self.driver), ("bench_seconds", self.bench_seconds))
        run = "".join(f'\n "{n}": {json.dumps(v)},' for n, v in fields if v is not None)
        body = ",\n  ".join(json.dumps(r.to_json(), sort_keys=True) for r in self.records)
        records = f"[\n  {body}\n ]" if self.records else "[]"
        return f'{{\n "format": {TUNING_FORMAT},{run}\n "records": {records}\n}}\n'.encode()

    @classmethod
    def loads(cls, data: bytes, where: str, limit: int = MAX_RECORD_BYTES) -> TuningResults:
        """A results file read from `data` (at most `limit` bytes, RESULTS_DEPTH deep): its
        format, each run field and each record checked (`parse_results`); anything else is
        a CuteccError naming `where` and the field. Fields it does not know are not kept."""
        try:
            doc = parse_json(data, limit, RESULTS_DEPTH)
        except ValueError as e:
            raise CuteccError(f"not a results file: {e}", where=where) from None
        if not isinstance(doc, dict) or doc.get("format") != TUNING_FORMAT:
            raise CuteccError(f"not a `cutecc tune` results file of format {TUNING_FORMAT}", where=where)
        if not isinstance(doc.get("records"), list):
            raise CuteccError("must be a list of records", where=where, key_path="records")
        for name, (what, ok) in _RUN_FIELDS.items():
            if not ok(doc.get(name)):
                raise CuteccError(f"must be {what}", where=where, key_path=name)
        return cls(parse_results(doc["records"], where, "records"), doc.get("device"), doc.get("driver"),
                   doc.get("bench_seconds"))


def parse_results(items: Any, where: str, key_path: str) -> tuple[TuningResult, ...]:
    """A list of records, in their order; one per (kernel, variant, arch, device, bucket)
    (`parse_tuning_lines` checks that and the bound on their number)."""
    parse_tuning_lines(items, where, key_path)
    return tuple(TuningResult.parse(d, where, f"{key_path}[{i}]") for i, d in enumerate(items))


# The tuning plan ----------------------------------------------------------------------

MAX_CANDIDATES = 100_000


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _extent(v: Any) -> bool:
    return type(v) is int and 0 < v <= MAX_EXTENT


@dataclass(frozen=True)
class Candidate:
    """One configuration of a plan item: its variant id, its cache key, and whether it is
    the default configuration (the one every other is measured against)."""

    variant: str
    key: str
    default: bool

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "key": self.key, "default": self.default}


@dataclass(frozen=True)
class BucketEdges:
    """One bucketed extent of a plan item and the edges its buckets are measured at."""

    extent: str
    edges: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"extent": self.extent, "edges": list(self.edges)}


@dataclass(frozen=True)
class PlanItem:
    """One tuned (kernel, variant, arch) of a tuning plan: its default's key (`base`), its
    candidates, and the space's benchmark settings, as the plan file
    (`tuning/plans/<manifest sha256>.json`, PLAN_FORMAT) and a measuring child's job hold
    it. `params` and `default` are carried as the manifest gave them (nothing measuring
    acts on); `dropped` (candidates that failed to compile, variant -> why) is None when
    none did, and then absent from the JSON."""

    kernel: str
    variant: str
    arch: str
    base: str
    candidates: tuple[Candidate, ...]
    rule: str
    buckets: tuple[BucketEdges, ...]
    sizes: Mapping[str, int | str]
    inputs: Mapping[str, tuple[float, float]]
    rtol: float | None
    atol: float | None
    params: Any
    default: Any
    scalars: Mapping[str, float | bool]
    dropped: Mapping[str, str] | None = None

    @property
    def label(self) -> str:
        return f"{self.kernel}[{self.variant}]@{self.arch}"

    def points(self) -> list[dict[str, int]]:
        """Every bucket to measure, as {extent: edge} in the extents' order (as
        `cutecc.contract.buckets.bucket_text` names it)."""
        names = [b.extent for b in self.buckets]
        return [dict(zip(names, c)) for c in itertools.product(*(b.edges for b in self.buckets))]

    def to_json(self) -> dict[str, Any]:
        """The item as the plan file holds it (the same keys, values and order as ever)."""
        out = {"kernel": self.kernel, "variant": self.variant, "arch": self.arch, "base": self.base,
               "candidates": [c.to_json() for c in self.candidates], "rule": self.rule,
               "buckets": [b.to_json() for b in self.buckets], "sizes": dict(self.sizes),
               "inputs": {k: list(v) for k, v in self.inputs.items()}, "rtol": self.rtol,
               "atol": self.atol, "params": self.params, "default": self.default,
               "scalars": dict(self.scalars)}
        if self.dropped is not None:
            out["dropped"] = dict(self.dropped)
        return out

    @classmethod
    def parse(cls, doc: Any, where: str, key_path: str) -> PlanItem:
        """A plan item read from disk (or a job), every field measuring acts on checked;
        an error names `where` and `key_path`."""
        bad = _bad_item(doc)
        if bad:
            raise WorkError(f"malformed plan item: {bad}", where=where, key_path=key_path)
        dropped = doc.get("dropped")
        return cls(doc["kernel"], doc["variant"], doc["arch"], doc["base"],
                   tuple(Candidate(c["variant"], c["key"], c["default"]) for c in doc["candidates"]),
                   doc["rule"], tuple(BucketEdges(b["extent"], tuple(b["edges"])) for b in doc["buckets"]),
                   dict(doc.get("sizes", {})), {k: (v[0], v[1]) for k, v in doc.get("inputs", {}).items()},
                   doc.get("rtol"), doc.get("atol"), doc.get("params"), doc.get("default"),
                   dict(doc.get("scalars", {})), None if dropped is None else dict(dropped))


def _bad_item(it: Any) -> str | None:
    """What is wrong with one plan item (None: nothing), field by field as measuring reads it."""
    if not isinstance(it, dict):
        return "not a table"
    for f in ("kernel", "variant", "arch"):
        if not isinstance(it.get(f), str):
            return f"{f} is not a string"
    if not is_key(it.get("base")) or it.get("rule") not in ("floor", "nearest"):
        return "base or rule"
    cands = it.get("candidates")
    if not isinstance(cands, list) or len(cands) > MAX_CANDIDATES or not all(
            isinstance(c, dict) and is_key(c.get("key")) and isinstance(c.get("variant"), str)
            and isinstance(c.get("default"), bool) for c in cands):
        return "candidates"
    buckets = it.get("buckets")
    if not isinstance(buckets, list) or not all(
            isinstance(b, dict) and isinstance(b.get("extent"), str) and isinstance(b.get("edges"), list)
            and all(map(_extent, b["edges"])) for b in buckets):
        return "buckets"
    if math.prod(len(b["edges"]) for b in buckets) > MAX_BUCKETS:
        return f"buckets: over {MAX_BUCKETS}"
    sizes, scalars, inputs = it.get("sizes", {}), it.get("scalars", {}), it.get("inputs", {})
    if not isinstance(sizes, dict) or not all(_extent(v) or isinstance(v, str) for v in sizes.values()):
        return "sizes"
    if not isinstance(scalars, dict) or not all(_number(v) or isinstance(v, bool) for v in scalars.values()):
        return "scalars"
    if not isinstance(inputs, dict) or not all(isinstance(v, list) and len(v) == 2 and all(map(_number, v))
                                               for v in inputs.values()):
        return "inputs"
    dropped = it.get("dropped", {})
    if not isinstance(dropped, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in dropped.items()):
        return "dropped"
    if any(it.get(f) is not None and not (_number(it.get(f)) and it[f] >= 0) for f in ("rtol", "atol")):
        return "rtol or atol"
    return None


PLAN_DEPTH = 8  # file > items > item > inputs > name > range, with room (params: the manifest's)


@dataclass(frozen=True)
class TuningPlan:
    """The plan file (`tuning/plans/<manifest sha256>.json`, PLAN_FORMAT), both ways: the
    digest of the manifest's bytes it was planned from, and its items. `--compile-only`
    writes it (`dumps`: the same bytes as ever), `--measure` reads it back (`loads`)."""

    manifest_sha256: str
    items: tuple[PlanItem, ...]

    def dumps(self) -> bytes:
        return json.dumps({"format": PLAN_FORMAT, "manifest_sha256": self.manifest_sha256,
                           "items": [it.to_json() for it in self.items]}, sort_keys=True, indent=1).encode()

    @classmethod
    def loads(cls, data: bytes, where: str, digest: str | None = None) -> TuningPlan:
        """A plan read from `data` (at most MAX_PLAN_BYTES, PLAN_DEPTH deep), every field
        measuring acts on checked; `digest`: the manifest digest it must name (the one it is
        stored under). Anything else is a WorkError naming `where` and the field."""
        try:
            doc = parse_json(data, MAX_PLAN_BYTES, PLAN_DEPTH)
        except ValueError as e:
            raise WorkError(f"not a tuning plan: {e}", where=where) from None
        if (not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT
                or not isinstance(doc.get("items"), list)):
            raise WorkError(f"not a tuning plan of format {PLAN_FORMAT}", where=where)
        named = doc.get("manifest_sha256")
        if not is_key(named) or (digest is not None and named != digest):
            raise WorkError(f"must be the SHA-256 of the manifest it plans{f' ({digest})' if digest else ''}",
                            where=where, key_path="manifest_sha256")
        items = doc["items"]
        return cls(named, tuple(PlanItem.parse(it, where, f"items[{i}]") for i, it in enumerate(items)))
