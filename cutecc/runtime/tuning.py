"""Tuning results at run time: which built configuration serves a call's shape bucket.

`cutecc tune` records, per (kernel, variant, arch, device kind, bucket), the winner among a
kernel's candidate configurations (a `cutecc.contract.pinned.Tuned` line, its bucket as
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

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cutecc import trust
from cutecc.contract.buckets import bucket_of, bucket_text
from cutecc.contract.pinned import Tuned
from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import contract_digest, is_key
from cutecc.errors import CuteccError
from cutecc.runtime.runtime_settings import RuntimeSettings
from cutecc.store.layout import Layout
from cutecc.store.tuning_records import MAX_RECORD_BYTES, TuningResult, TuningResults

_log = logging.getLogger("cutecc")


# What a tuned winner must share with the default it stands in for: a call that names the
# default must get the same function (same kernel, launcher and pairing, same contract, the
# same call keywords' values, e.g. FA4's `causal`), only compiled another way.
SAME_AS_DEFAULT = ("kernel", "arch", "entry", "backward")


def sibling_problem(base: EntryMeta, winner: EntryMeta) -> str | None:
    """Why the entry `winner` cannot serve the calls of the default entry `base`, or None:
    one rule for `cutecc build`, `cutecc verify`, `cutecc tune` and the runtime. Both are
    checked records (`EntryMeta`), so the call keywords read from their key inputs are as
    trusted as their keys."""
    for name in SAME_AS_DEFAULT:
        if getattr(base, name) != getattr(winner, name):
            return (f"its {name} {getattr(winner, name)!r} differs from the default's "
                    f"{getattr(base, name)!r}")
    if contract_digest(base.args) != contract_digest(winner.args):
        return "its contract differs from the default configuration's"
    got, want = winner.call, base.call
    if got != want:
        return (f"it was built for the call keywords {_kw(got)}, the default it would serve for "
                f"{_kw(want)}")
    return None


def _kw(d: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(d.items()))[:200] or "none"


def toolchain_of(meta: EntryMeta) -> str | None:
    """What a tuning line names as the toolchain of an entry (its checked record): the DSL's
    version that compiled it (`nvidia-cutlass-dsl 4.3.1`); None where the entry says none."""
    v = meta.toolchain.get("nvidia-cutlass-dsl")
    return f"nvidia-cutlass-dsl {v}" if isinstance(v, str) and v else None


def line_problem(line: Tuned, base: EntryMeta, winner: EntryMeta) -> str | None:
    """Why a tuning line measured what is no longer here, or None: its winner's bytes differ
    from those it pins, or it names a toolchain other than its default's or its winner's
    (`toolchain_of`; a line without one, recorded before lines named it, is not checked).
    One rule for load (which ignores such a line with a note) and `cutecc verify` (which
    names it)."""
    why = line.mismatch(winner)
    if why:
        return f"{why} (other kernel bytes than were measured)"
    if line.built_with is not None:
        for what, meta in (("default", base), ("winner", winner)):
            have = toolchain_of(meta)
            if have is not None and have != line.built_with:
                return f"recorded for {line.built_with}, its {what} was built by {have}"
    return None


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


def device_kind(given: RuntimeSettings | None = None) -> str | None:
    """This process's GPU kind as JAX names it (`NVIDIA H100 80GB HBM3`); without a GPU,
    `$CUTECC_DEVICE_KIND` (to lower or export on a CPU host for that device; as `given`
    read it, None: read now), else None."""
    import jax

    try:
        devs = jax.devices("gpu")
    except RuntimeError:
        devs = []
    if devs:
        return str(devs[0].device_kind)
    return (RuntimeSettings.from_environment() if given is None else given).device_kind


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
