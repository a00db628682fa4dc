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
  entries (`composite_line.flow_problem`), read from this cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cutecc.contract.args import CallingConvention, args_from_json
from cutecc.contract.composite_line import CompositeLine, flow_problem
from cutecc.entry import meta_problem
from cutecc.entry_meta import EntryMeta
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import Lock, LockEntry, Tuned
from cutecc.runtime.tuning import sibling_problem
from cutecc.ship.ingest import Refused, check_stored
from cutecc.store.view import Entry, StoreView, entry_trust_problem

# (kernel, variant, arch) -> (the default's key, {candidate key: candidate variant})
Candidates = Mapping[tuple[str, str, str], tuple[str, Mapping[str, str]]]


Found = tuple[dict[str, Any] | None, str | None]  # (metadata, None) or (None, why)
Checked = dict[tuple[str, bool], Found]


def _stored(store: StoreView, key: str, runtime: bool, memo: Checked | None) -> Found:
    """`ingest.check_stored` of an entry (or runtime library), once per build: a signing
    build's lines share one runtime library, and tuning lines share their defaults."""
    if memo is not None and (key, runtime) in memo:
        return memo[(key, runtime)]
    try:
        got: Found = (check_stored(store, key, runtime=runtime), None)
    except Refused as e:
        got = (None, e.why)
    if memo is not None:
        memo[(key, runtime)] = got
    return got


def _meta(store: StoreView, key: str, hashed: bool, memo: Checked | None = None) -> Found:
    """(metadata, None) of a healthy, trusted entry, else (None, why)."""
    if hashed:
        return _stored(store, key, False, memo)
    try:
        found = store.get(key)
    except CuteccError as err:
        return None, err.message
    if found is None:
        return None, "not in the cache"
    why = meta_problem(found.doc, key) or entry_trust_problem(found.path, list(found.recorded.files))
    return (None, why) if why else (found.doc, None)


def entry_line_problem(store: StoreView, le: LockEntry, *, hashed: bool,
                       memo: Checked | None = None) -> str | None:
    """Why this cache does not back the lock line `le` (None: it does). `memo` keeps what
    was read and hashed across the lines of one build."""
    meta, why = _meta(store, le.key, hashed, memo)
    if meta is None:
        return why
    why = le.mismatch(Entry(le.key, store.layout.entry(le.key), meta))
    if why or not hashed:
        return why
    _, why = _stored(store, EntryMeta.parse(meta, le.key).runtime.key, True, memo)
    return None if why is None else f"its runtime library: {why}"


def tuning_line_problem(store: StoreView, t: Tuned, candidates: Candidates | None, *,
                        hashed: bool, present: bool, memo: Checked | None = None) -> str | None:
    """Why the tuning line `t` must not be kept (None: keep it). `candidates` is the
    manifest's tuning plan ({} when it declares no tuning space; None: no manifest at hand,
    as for `cutecc pack --lock`, so only the cache's entries are checked). `present`: the
    winner's entry must be in this cache (a lock about to be signed or packed)."""
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
    return sibling_problem(default, winner)


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
            why = le.mismatch(Entry(le.key, store.layout.entry(le.key), meta))
            if why:
                return f'launch "{ln}" ({le.label} {le.key[:12]}): {why}'
            try:
                conv = CallingConvention.of(args_from_json(EntryMeta.parse(meta, le.key).args))
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
