"""Tuning results at run time: which built configuration serves a call's shape bucket.

`cutecc tune` records, per (kernel, variant, arch, device kind, bucket), the winner among a
kernel's candidate configurations (a `cutecc.lock.lockfile.Tuned` line, its bucket as
`cutecc.contract.buckets` names it), in `kernels.lock` and in the cache
(`tuning/results/<default key>.json`; `cutecc tune --results FILE` writes the same
format, `TuningResults`). Dispatch asks `TuningTable.pick` for the call's
build: a table lookup on the call's symbolic extents, nothing timed, so every rank and
process with the same lock and device kind makes the same choice. Results of one device
kind never apply to another: an untuned device runs the default configuration, and says
so once; a line whose winner's bytes or DSL differ from what was measured (`line_problem`)
serves nothing, with a note. Nothing here measures or draws: every process reading one
lock picks the same winners (one winner on every rank). Imports neither JAX (until a
device kind is asked for) nor the build side.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.contract.buckets import bucket_of, bucket_text
from cutecc.entry import call_keywords, contract_digest, is_key, parse_json
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Tuned, parse_tuning_lines
from cutecc.store.layout import TUNING_FORMAT, Layout

MAX_RECORD_BYTES = 4 << 20
_log = logging.getLogger("cutecc")


# What a tuned winner must share with the default it stands in for: a call that names the
# default must get the same function (same kernel, launcher and pairing, same contract, the
# same call keywords' values, e.g. FA4's `causal`), only compiled another way.
SAME_AS_DEFAULT = ("kernel", "arch", "entry", "backward")


def sibling_problem(base: Mapping[str, Any], winner: Mapping[str, Any]) -> str | None:
    """Why the entry `winner` (its metadata) cannot serve the calls of the default entry
    `base`, or None: one rule for `cutecc build`, `cutecc verify`, `cutecc tune` and the
    runtime. Both metadata are checked entries (`entry.meta_problem`), so the call keywords
    read from their key inputs are as trusted as their keys."""
    for name in SAME_AS_DEFAULT:
        if base.get(name) != winner.get(name):
            return f"its {name} {winner.get(name)!r} differs from the default's {base.get(name)!r}"
    if contract_digest(base.get("args")) != contract_digest(winner.get("args")):
        return "its contract differs from the default configuration's"
    got, want = call_keywords(dict(winner)), call_keywords(dict(base))
    if got != want:
        return (f"it was built for the call keywords {_kw(got)}, the default it would serve for "
                f"{_kw(want)}")
    return None


def _kw(d: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(d.items()))[:200] or "none"


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


def toolchain_of(meta: Mapping[str, Any]) -> str | None:
    """What a tuning line names as the toolchain of an entry (its metadata): the DSL's
    version that compiled it (`nvidia-cutlass-dsl 4.3.1`); None where the entry says none."""
    tc = meta.get("toolchain")
    v = tc.get("nvidia-cutlass-dsl") if isinstance(tc, dict) else None
    return f"nvidia-cutlass-dsl {v}" if isinstance(v, str) and v else None


def line_problem(line: Tuned, base: Mapping[str, Any], winner: Mapping[str, Any]) -> str | None:
    """Why a tuning line measured what is no longer here, or None: its winner's bytes differ
    from those it pins, or it names a toolchain other than its default's or its winner's
    (`toolchain_of`; a line without one, recorded before lines named it, is not checked).
    One rule for load (which ignores such a line with a note) and `cutecc verify` (which
    names it)."""
    if line.mismatch(winner):
        return f"{line.mismatch(winner)} (other kernel bytes than were measured)"
    if line.built_with is not None:
        for what, meta in (("default", base), ("winner", winner)):
            have = toolchain_of(meta)
            if have is not None and have != line.built_with:
                return f"recorded for {line.built_with}, its {what} was built by {have}"
    return None


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


def results_path(root: Path, base: str) -> Path:
    """The cache's record of the tuning results for one default entry."""
    return Layout(root).tuning_result(base)


def load_cached(root: Path, base: str) -> TuningResults:
    """The cache's record for `base` (`TuningResults`), read as the cache's metadata is:
    through directories that only this user or root could have written, following no link
    (`cutecc.trust`). Raises trust.Untrusted when someone else could have written it,
    OSError when absent or unreadable, CuteccError when malformed (naming the field)."""
    data = trust.read_file(root, Layout(root).tuning_result_parts(base), MAX_RECORD_BYTES)
    return TuningResults.loads(data, str(results_path(root, base)))


def read_cached(root: Path, base: str) -> list[TuningResult]:
    """The cache's full records (lines plus times) for `base`; [] when none or unreadable
    (a damaged record loses the tuning, never the kernel). A record picks which build
    serves a call, so one that someone else could have written is refused
    (trust.Untrusted, `load_cached`), not skipped."""
    if not results_path(root, base).parent.is_dir():  # nothing recorded: nothing to believe
        return []
    try:
        return [r for r in load_cached(root, base).records if r.base == base]
    except trust.Untrusted:
        raise
    except (OSError, ValueError, CuteccError):
        return []


MAX_RESULT_FILES = 100_000


def winners_in(root: Path) -> dict[str, list[str]]:
    """What the cache's tuning records say each entry wins: key -> [`n=65536 on DEVICE`, ..]
    (for `cutecc list` and `show`)."""
    out: dict[str, list[str]] = {}
    d = Layout(root).tuning_results()
    try:
        names = sorted(p.name for p in d.iterdir() if p.name.endswith(".json"))[:MAX_RESULT_FILES]
    except OSError:
        return out
    for name in names:
        if not is_key(name[:-5]):
            continue
        try:
            records = read_cached(root, name[:-5])
        except trust.Untrusted:  # not believed, so not shown (load names it as unusable)
            continue
        for r in records:
            t = r.line
            out.setdefault(t.winner, []).append(f"{t.variant} {t.bucket} on {t.device}")
    return out


def device_kind() -> str | None:
    """This process's GPU kind as JAX names it (`NVIDIA H100 80GB HBM3`); without a GPU,
    `$CUTECC_DEVICE_KIND` (to lower or export on a CPU host for that device), else None."""
    import os

    import jax

    try:
        devs = jax.devices("gpu")
    except RuntimeError:
        devs = []
    return devs[0].device_kind if devs else os.environ.get("CUTECC_DEVICE_KIND") or None


class TuningTable:
    """One kernel's recorded winners, looked up per call (see the module docstring).

    `resolve(line)` turns a winner line into a build (None: unusable here, reason logged);
    `kind` says this process's device kind (a function, so tests can pin it).
    """

    def __init__(self, kernel: str, lines: Iterable[Tuned], resolve: Callable[[Tuned], Any],
                 kind: Callable[[], str | None] = device_kind) -> None:
        self.kernel = kernel
        self.lines = tuple(lines)
        self._resolve = resolve
        self._kind = kind
        self._device: str | None = None
        self._device_known = False
        self._builds: dict[tuple[Any, ...], Any] = {}
        self._noticed: set[str] = set()
        self._lock = threading.Lock()
        # (base key, device) -> (rule, extents' edges, bucket text -> line)
        self._by: dict[tuple[str, str], tuple[str, dict[str, tuple[int, ...]], dict[str, Tuned]]] = {}
        for t in self.lines:
            rule, edges, table = self._by.setdefault((t.base, t.device), (t.rule, {}, {}))
            table[t.bucket] = t
            for name, v in t.extents.items():
                edges[name] = tuple(sorted({*edges.get(name, ()), v}))

    def device(self) -> str | None:
        if not self._device_known:
            self._device, self._device_known = self._kind(), True
        return self._device

    def pick(self, build: Any, env: Mapping[str, int]) -> Any:
        """The build serving a call of `build`'s variant with symbol bindings `env`: the
        recorded winner of the call's bucket on this device kind, else `build` itself."""
        device = self.device()
        entry = self._by.get((build.key, device or ""))
        if entry is None:
            if any(t.base == build.key for t in self.lines):
                self._notice(f"kernel {self.kernel} [{build.variant}]: no tuning results for "
                             f"device kind {device or 'unknown (no GPU)'}; using the default "
                             "configuration")
            return build
        rule, edges, table = entry
        try:
            bucket = bucket_text({name: bucket_of(env[name], e, rule) for name, e in edges.items()})
        except KeyError:
            return build
        line = table.get(bucket)
        if line is None or line.winner == build.key:
            return build
        with self._lock:
            if line.order not in self._builds:
                self._builds[line.order] = self._resolve(line)
            got = self._builds[line.order]
        if got is None:
            self._notice(f"kernel {self.kernel} [{build.variant}] {bucket}: the recorded winner "
                         f"{line.winner[:12]} is unusable here; using the default configuration")
            return build
        return got

    def _notice(self, text: str) -> None:
        with self._lock:
            if text in self._noticed:
                return
            self._noticed.add(text)
        _log.warning("cutecc: %s", text)
