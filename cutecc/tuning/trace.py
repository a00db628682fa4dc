"""Per-call kernel times from a profiler trace's GPU events (device clock), as pure functions.

The measuring child runs candidates' call chains one after another with an idle gap between
chains, inside one profiler trace; the GPU plane's events, as `Event`s, are parsed here:
split at idle gaps into chains, matched to the order the chains ran in, and each chain's
time is the sum of the durations of the candidate's own kernels divided by its number of
calls. A candidate's own kernels are the kernel functions its library's cubin defines
(`cutecc.cubin.kernel_names`), counted per call from a trace of one call per candidate;
XLA's work around a call (a transpose for a column-major operand, the copy of an in-place
buffer), copies and fills (`Memcpy*`, `Memset*`) never count. Imports neither JAX nor the
DSL, so it is tested on CPU with synthetic events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MEMORY_OPS = ("memcpy", "memset")  # CUPTI's names of copies and fills: no call's own kernel


@dataclass(frozen=True)
class Event:
    """One GPU activity of a trace: its name (a kernel's, or `Memset 3`), start and duration."""

    name: str
    start_ns: float
    duration_ns: float

    @property
    def end_ns(self) -> float:
        return self.start_ns + self.duration_ns


class TraceMismatch(ValueError):
    """The trace's runs cannot be laid onto the chains in the order they ran (a lost gap,
    runs left over or missing)."""


def is_memory_op(name: str) -> bool:
    return name.lower().startswith(MEMORY_OPS)


def split(events: Iterable[Event], gap_ns: float) -> list[list[Event]]:
    """Events in start order, split wherever the GPU idled for more than `gap_ns`."""
    out: list[list[Event]] = []
    end = None
    for e in sorted(events, key=lambda e: (e.start_ns, e.duration_ns)):
        if end is None or e.start_ns - end > gap_ns:
            out.append([])
            end = e.end_ns
        out[-1].append(e)
        end = max(end, e.end_ns)
    return out


def learn(events: Iterable[Event], order: Sequence[str], gap_ns: float,
          names: Mapping[str, frozenset[str]]) -> dict[str, Counter[str]]:
    """Each candidate's own kernels (name -> launches per call) from a trace of one call per
    candidate, run in `order` with idle gaps between: the launches in its chain of the
    kernels its cubin defines (`names[key]`). Raises `TraceMismatch` when the chains do not
    number the candidates, or when a candidate's chain launched none of its kernels (the
    profiler names kernels otherwise than the cubin: nothing would be timed)."""
    chains = [c for c in split(events, gap_ns) if any(not is_memory_op(e.name) for e in c)]
    if len(chains) != len(order):
        raise TraceMismatch(f"{len(chains)} separate runs of kernels in the trace of one call per "
                            f"candidate, expected {len(order)}")
    own = {}
    for key, c in zip(order, chains):
        mine = Counter(e.name for e in c if e.name in names.get(key, ()))
        if not mine:
            raise TraceMismatch(f"the trace of {key[:12]}'s call launched none of the kernels its "
                                f"library defines ({', '.join(sorted(names.get(key, ()))) or 'none found'})")
        own[key] = mine
    return own


def chain_times(events: Iterable[Event], order: Sequence[str], own: dict[str, Counter[str]], calls: int,
                gap_ns: float) -> tuple[list[float | None], list[str], int]:
    """(per-call times in nanoseconds, notes, chains joined) for the chains run in `order`,
    `calls` calls each. A chain's time is the sum of its candidate's own kernel durations over
    `calls`; None (with a note) where its launches are not `calls` times its own count per
    call (a lost or extra record).

    Runs made only of foreign work (no candidate's kernel) are skipped. A host stall inside a
    chain idles the GPU too and splits the chain into consecutive runs: a run is joined to the
    chain before it while it launches only that chain's own kernels and the launches still fit
    the chain's count (durations are summed, so the stall itself is never timed). Where
    candidates share kernel names, a chain short of a lost record could take the first part of
    the next chain; that leaves a deficit that moves forward until some chain comes up short,
    so every joined chain just before a void chain is voided too: a lost sample, never a wrong
    one. Raises `TraceMismatch` when the runs cannot be laid onto the chains in order."""
    names = set().union(*own.values()) if own else set()
    runs = [c for c in split(events, gap_ns) if any(e.name in names for e in c)]

    def launches(run: list[Event]) -> int:
        return sum(e.name in names for e in run)

    times: list[float | None] = []
    joins: list[int] = []
    notes: list[str] = []
    at = 0
    for i, key in enumerate(order):
        if at >= len(runs):
            raise TraceMismatch(f"{len(runs)} separate runs of the candidates' kernels in the trace "
                                f"end at chain {i} of {len(order)}")
        mine = own[key]
        want = calls * sum(mine.values())
        chain, n = list(runs[at]), launches(runs[at])
        joined = 1
        at += 1
        while at < len(runs) and n < want:
            more = launches(runs[at])
            if n + more > want or not all(e.name in mine for e in runs[at] if e.name in names):
                break
            chain += runs[at]
            n += more
            joined += 1
            at += 1
        got = [e for e in chain if e.name in mine]
        joins.append(joined)
        if len(got) != want or n != want:
            times.append(None)
            notes.append(f"chain {i} ({key[:12]}): {len(got)} kernel launches of its own "
                         f"({n} of any candidate's) in {joined} run(s), expected {want}")
            continue
        times.append(sum(e.duration_ns for e in got) / calls)
    if at != len(runs):
        raise TraceMismatch(f"{len(runs) - at} runs of the candidates' kernels in the trace after "
                            f"the last of {len(order)} chains")
    for i in range(len(order) - 1, 0, -1):  # a void chain voids the joined chains before it
        if times[i] is None and joins[i - 1] > 1 and times[i - 1] is not None:
            times[i - 1] = None
            notes.append(f"chain {i - 1} ({order[i - 1][:12]}): joined from {joins[i - 1]} runs just "
                         f"before void chain {i}, so it may hold that chain's launches: voided")
    return times, notes, sum(j > 1 for j in joins)
