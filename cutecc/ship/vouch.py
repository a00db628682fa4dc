"""What a build may write into, keep in or sign of a lock: every line checked against the cache.

A lock line vouches that its key's entry is exactly these bytes; a tuning line, that its
winner may serve the calls of its default. A build writes its own lines from what it just
built or found, but a partial build keeps the old file's other lines, and a tuning line
comes from `cutecc tune`, possibly on another host: neither was seen by this build. So:

- `entry_line_problem`: the entry a line names is in this cache, healthy, trusted and
  equal to the line in everything the runtime acts on; with `hashed`, its library and its
  runtime library are read through `cutecc.trust` and hashed (`ingest.check_stored`), as
  a signing build does for every line it signs;
- `tuning_line_problem`: the winner is a candidate the manifest (as it is now) plans for
  that default, and, when its entry is in the cache, matches the line and is a sibling of
  the default (`runtime.tuning.sibling_problem`: same kernel, contract and call keywords);
- `composite_line_problem`: every launch of a composite line is a kernel the lock pins
  (as `Lock.loads` insists) and its tensors flow through the contracts of those pinned
  entries (`composite_line.flow_problem`), read from this cache;
- `vouch`: all three over a lock about to be written, the one check `cutecc build` and
  `cutecc tune` both pass a lock through before `record_lock` writes (and signs) it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cutecc.contract.args import CallingConvention, args_from_json
from cutecc.contract.composite_line import CompositeLine, flow_problem
from cutecc.contract.pinned import Tuned
from cutecc.entry.meta import EntryMeta
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import Lock, LockEntry
from cutecc.runtime.tuning import line_problem, sibling_problem
from cutecc.ship.ingest import Refused, check_stored
from cutecc.store.view import StoreView, entry_trust_problem

# (kernel, variant, arch) -> (the default's key, {candidate key: candidate variant})
Candidates = Mapping[tuple[str, str, str], tuple[str, Mapping[str, str]]]


Found = tuple[EntryMeta | None, str | None]  # (the entry's record, None) or (None, why)
Checked = dict[tuple[str, bool], Found]


def _stored(store: StoreView, key: str, runtime: bool, memo: Checked | None) -> Found:
    """`ingest.check_stored` of an entry (or runtime library), once per lock: (the entry's
    record, None; None for a runtime library) or (None, why it is refused). A signing
    build's lines share one runtime library, and tuning lines share their defaults."""
    if memo is not None and (key, runtime) in memo:
        return memo[(key, runtime)]
    try:
        meta = check_stored(store, key, runtime=runtime)
        got: Found = (None if runtime else EntryMeta.parse(meta, key), None)
    except Refused as e:
        got = (None, e.why)
    if memo is not None:
        memo[(key, runtime)] = got
    return got


def _meta(store: StoreView, key: str, hashed: bool, memo: Checked | None = None) -> Found:
    """(the checked record, None) of a healthy, trusted entry (`hashed`: its files read back
    and hashed, `check_stored`), else (None, why)."""
    if hashed:
        return _stored(store, key, False, memo)
    try:
        found = store.get(key)
    except CuteccError as err:
        return None, err.message
    if found is None:
        return None, "not in the cache"
    try:
        rec = found.meta
    except ValueError as e:
        return None, str(e)
    why = entry_trust_problem(found.path, [f.name for f in rec.files])
    return (None, why) if why else (rec, None)


def entry_line_problem(store: StoreView, le: LockEntry, *, hashed: bool,
                       memo: Checked | None = None) -> str | None:
    """Why this cache does not back the lock line `le` (None: it does). `memo` keeps what
    was read and hashed across the lines of one build."""
    meta, why = _meta(store, le.key, hashed, memo)
    if meta is None:
        return why
    why = le.mismatch(meta)
    if why or not hashed:
        return why
    _, why = _stored(store, meta.runtime.key, True, memo)
    return None if why is None else f"its runtime library: {why}"


def tuning_line_problem(store: StoreView, t: Tuned, candidates: Candidates | None, *,
                        hashed: bool, present: bool, memo: Checked | None = None,
                        measured: bool = False) -> str | None:
    """Why the tuning line `t` must not be kept (None: keep it). `candidates` is the
    manifest's tuning plan ({} when it declares no tuning space; None: no manifest at hand,
    as for `cutecc pack --lock`, so only the cache's entries are checked). `present`: the
    winner's entry must be in this cache (a lock about to be signed or packed). `measured`:
    a line being recorded now, whose toolchain must also be its entries' (`line_problem`)."""
    if candidates is not None:
        base, cands = candidates.get((t.kernel, t.variant, t.arch), ("", {}))
        if base != t.base or cands.get(t.winner) != t.winner_variant:
            return (f"the winner {t.winner_variant} ({t.winner[:12]}) is not a candidate the "
                    f"manifest plans for {t.kernel}[{t.variant}]@{t.arch}")
    winner, why = _meta(store, t.winner, hashed, memo)
    if winner is None:
        return why if present or why != "not in the cache" else None
    why = t.mismatch(winner)
    if why:
        return why
    default, why = _meta(store, t.base, hashed, memo)
    if default is None:
        return f"its default configuration: {why}"
    return (line_problem(t, default, winner) if measured else None) or sibling_problem(default, winner)


def composite_line_problem(store: StoreView, lock: Lock, c: CompositeLine, *, hashed: bool,
                           present: bool, memo: Checked | None = None) -> str | None:
    """Why the composite line `c` of `lock` must not be kept (None: keep it): a launch whose
    kernel `lock` pins no entry of, variants of a launch that name their tensors unlike
    each other, or tensors that do not flow through the launches' contracts. Each pinned
    entry of a launch is read from this cache (`present`: it must be there)."""
    flows: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for ln in c.launches:
        lines = [le for le in lock.entries if le.kernel == ln]
        if not lines:
            return f'launch "{ln}" is a kernel this lock pins no entry of'
        seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
        for le in lines:
            meta, why = _meta(store, le.key, hashed, memo)
            if meta is None:
                if present or why != "not in the cache":
                    return f'launch "{ln}" ({le.label} {le.key[:12]}): {why}'
                continue
            why = le.mismatch(meta)
            if why:
                return f'launch "{ln}" ({le.label} {le.key[:12]}): {why}'
            try:
                conv = CallingConvention.of(args_from_json(meta.args))
            except (KeyError, TypeError, ValueError) as e:
                return f'launch "{ln}" ({le.key[:12]}): malformed contract ({e!r})'
            seen.add((tuple(t.name for t in conv.inputs), tuple(t.name for t in conv.results)))
        if len(seen) > 1:
            return f'the variants of launch "{ln}" name their tensors differently'
        if seen:
            flows[ln] = seen.pop()
    if len(flows) < len(c.launches):  # some launch's entries are elsewhere: nothing to check here
        return None
    return flow_problem(c, flows)


@dataclass(frozen=True)
class Vouched:
    """What `vouch` lets be written: the lock, less the tuning lines that failed (`dropped`,
    each with why: their defaults serve their buckets)."""

    lock: Lock
    dropped: tuple[str, ...] = ()


def vouch(store: StoreView, lock: Lock, *, kept: Iterable[LockEntry],
          candidates: Callable[[], Candidates | None], signing: bool, where: Path,
          who: str = "this build", memo: Checked | None = None) -> Vouched:
    """The lock `lock` as it may be written: every entry line the writer did not see itself
    (`kept`) checked against the cache, and, when it is about to be signed, every line read
    back and hashed; composite and tuning lines checked as `composite_line_problem` and
    `tuning_line_problem` say (`candidates()`: the manifest's tuning plan, asked for only
    when the lock has tuning lines). A tuning line that fails is dropped (`Vouched.dropped`);
    an entry or composite line that fails is an error naming it (`who` could not vouch for
    it), and nothing may be written or signed. `memo` keeps what was read and hashed (a
    writer that checked lines of its own first passes its memo on)."""
    bad: list[str] = []
    memo = {} if memo is None else memo  # each library and runtime library read and hashed once
    for le in lock.entries if signing else kept:
        why = entry_line_problem(store, le, hashed=signing, memo=memo)
        if why and (signing or why != "not in the cache"):
            bad.append(f"{le.label} {le.key[:12]}: {why}")
    for c in lock.composites:
        why = composite_line_problem(store, lock, c, hashed=signing, present=signing, memo=memo)
        if why:
            bad.append(f"composite {c.name}: {why}")
    if bad:
        raise WorkError(f"{'refusing to sign: ' if signing else ''}{len(bad)} lock line(s) {who} "
                        f"cannot vouch for: {'; '.join(bad[:5])}"
                        + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
                        + ". Build those kernels (or `cutecc verify --fix`, then build) first",
                        where=str(where))
    if not lock.tuning:
        return Vouched(lock)
    plan = candidates()
    keep, dropped = [], []
    for tl in lock.tuning:
        why = tuning_line_problem(store, tl, plan, hashed=signing, present=signing, memo=memo)
        if why:
            dropped.append(f"{tl.kernel}[{tl.variant}]@{tl.arch} {tl.bucket} on {tl.device}: {why}")
        else:
            keep.append(tl)
    return Vouched(lock.with_tuning(keep), tuple(dropped))
