"""The build pipeline `cutecc build` and `cutecc tune` both run: a target, parsed and
planned once by the caller (`target`), through five stages, each a function of typed
inputs and outputs.

  probe    which planned entries the store already holds: a hit costs one read of its
           index record (its lock line), not of its metadata; an entry someone else could
           have written is refused; the rest are misses
  fetch    the misses a remote cache (`cutecc.ship.remote`) has, checked and published here
           (reported cached, and fetched)
  compile  what is left, through an `Executor` (`cutecc.build.executors`: local pools or Ray),
           after the runtime library the kernels link against (linked first if missing);
           workers publish what they build, and upload it when remote writing is on
  publish  every entry's runtime library in the store (linked again if gc or rm took it,
           or the entry came from the remote or a Ray worker), stale index records
           rewritten, killed builds' leftovers swept
  record   what the build did: hits marked used, the cache's stats, what planning learned;
           for a build of the kernels themselves (not tuning candidates) the generations,
           composites and the lock (`cutecc.lock.lockfile`), vouched for (`cutecc.ship.vouch`),
           written from what this build saw and published (never read back), signed if asked

`run` chains them. A dry run stops after probing (misses are reported "planned"); a
read-only one (`$CUTECC_READ_ONLY`) refuses a miss instead of compiling it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutecc.build.executors import Executor, choose, compile_limits
from cutecc.build.outcome import Built, Outcome, Progress, RemoteUse
from cutecc.build.timings import Timings
from cutecc.build.workers import BuildJob, Result, ensure_runtime
from cutecc.contract.composite_line import CompositeLine
from cutecc.contract.fallbacks import FallbackRef, refs_to_json
from cutecc.entry.meta import EntryMeta
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import Environment, Lock, LockEntry, Merged, merge_build, record_lock
from cutecc.manifest import Manifest
from cutecc.plan.build_plan import Planned, plan
from cutecc.platforms import check_platform
from cutecc.settings import NOTHING_GIVEN, BuildOptions
from cutecc.ship import remote as remote_cache
from cutecc.store.build_records import CompositeRecord
from cutecc.store.layout import meta_file
from cutecc.store.view import StoreView, entry_trust_problem, touch_used
from cutecc.store.writer import Store
from cutecc.toolchain.dists import HashCache

if TYPE_CHECKING:
    from cutecc.ship.remote import RemoteConfig


# What to build, and how --------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What one build builds, parsed and planned once."""

    manifest: Manifest  # as parsed, whole: what generations, the lock and its tuning lines cover
    selected: Manifest  # what was planned: the --kernel selection, with tuning candidates for tune
    planned: tuple[Planned, ...]
    partial: bool  # a --kernel, --arch or --platform subset of the manifest
    candidates: bool  # tuning candidates: nothing recorded as the kernels' current build, no lock
    # per kernel that declares one, its fallbacks with their modules' digests (`cutecc.contract.fallbacks`)
    fallbacks: dict[str, dict[str, FallbackRef]] = field(default_factory=dict)


def target(manifest: Manifest, *, archs: tuple[str, ...] = (), kernels: tuple[str, ...] = (),
           candidates: bool = False, hashes: HashCache | None = None,
           platforms: tuple[str, ...] = ()) -> Target:
    """`manifest` restricted to `kernels` (and their backward kernels), with each tuned
    kernel's candidates as extra variants when `candidates`, planned for `archs` and host
    `platforms` (else the manifest's; `cutecc.platforms`) with `hashes` (what planning
    learned before; None: nothing kept)."""
    selected = manifest.select(kernels) if kernels else manifest
    if candidates:
        from cutecc.plan.tuning_plan import with_candidates

        selected = with_candidates(selected)
    platforms = tuple(check_platform(p, "--platform") for p in platforms)
    return Target(manifest, selected, tuple(plan(selected, archs, hash_cache=hashes, platforms=platforms)),
                  partial=bool(kernels or archs or platforms), candidates=candidates,
                  fallbacks=fallback_refs(selected, hashes))


def fallback_refs(manifest: Manifest, hashes: HashCache | None = None) -> dict[str, dict[str, FallbackRef]]:
    """Each kernel's declared fallbacks, each with its closure: its module and every project
    module it imports, found and hashed as a kernel's key finds its sources
    (`cutecc.plan.key.SourceIndex`: read, never imported; a fallback may need a framework
    the build host lacks). A module that cannot be found, or a closure file that lies in no
    directory of the python_path or `sys.path`, fails the build before any compile."""
    from cutecc.contract.fallbacks import ClosureFile, module_path
    from cutecc.plan.key import SourceIndex

    out: dict[str, dict[str, FallbackRef]] = {}
    index: SourceIndex | None = None
    for k in manifest.kernels:
        for fld, ref in (("fallback", k.fallback), ("fallback_torch", k.fallback_torch)):
            if ref is None:
                continue
            where = dict(where=str(manifest.path), key_path=f'kernel "{k.name}", {fld}')
            index = index or SourceIndex(manifest.python_path, hashes)
            module = ref.split(":", 1)[0]
            why = index.missing(module)
            if why is not None:
                raise CuteccError(f"cannot find the fallback's module: {module!r}: {why}", **where)
            try:
                files = index.files(module)
            except CuteccError as e:
                raise CuteccError(f"cannot read the fallback's closure: {e}", **where) from None
            closure = []
            for f in files:
                if f.rel not in (module_path(f.module, False), module_path(f.module, True)):
                    raise CuteccError(f"the fallback's closure holds {f.path} (module {f.module}), which "
                                      "lies in no directory of the python_path or sys.path as its "
                                      "name says", **where)
                closure.append(ClosureFile(f.module, f.rel, f.sha256))
            if module not in {c.module for c in closure}:
                raise CuteccError(f"cannot find the fallback's module: {module!r} has no source file "
                                  "(a namespace package or a compiled module)", **where)
            out.setdefault(k.name, {})[fld] = FallbackRef.of(ref, closure)
    return out


@dataclass(frozen=True)
class Settings:
    """How to build: who compiles, how many at a time, which remote cache, which mode."""

    executor: Executor
    jobs: int
    remote: RemoteConfig | None = None
    dry_run: bool = False  # probe only: misses are reported "planned"
    read_only: bool = False  # write nothing to the cache; a miss is an error (exit 1)


def settings(manifest: Manifest, options: BuildOptions = NOTHING_GIVEN, *,
             dry_run: bool = False) -> Settings:
    """How to build: what `options` ask (the flags, else the environment, read at the edge:
    `cutecc.settings`), else the manifest's `[build]` table (`cutecc.build.executors.choose`,
    `compile_limits`, `cutecc.ship.remote.config`); `jobs` defaults to this machine's CPUs."""
    b = manifest.build
    o = options
    runner = dataclasses.replace(
        choose(o.executor, o.ray_address, default_kind=b.executor, default_address=b.ray_address),
        limits=compile_limits(o.compile_timeout, o.compile_memory, default_seconds=b.compile_timeout,
                              default_memory=b.compile_memory))
    return Settings(runner, o.jobs or os.cpu_count() or 1, remote_cache.config(o, default=b.remote),
                    dry_run, o.read_only)


@dataclass(frozen=True)
class LockRequest:
    """Where the lock goes, and the key that signs it (None: unsigned)."""

    path: Path
    signing_key: Any = None  # a private key read by `cutecc.lock.signing.read_private_key`


def run(t: Target, store: Store, s: Settings, *, hashes: HashCache | None = None,
        lock: LockRequest | None = None, progress: Progress | None = None,
        timings: Timings | None = None) -> Built:
    """Probe, fetch, compile, publish and record `t` into `store` (see the module docstring);
    `lock`: write the lock there after a fully successful build (not for candidates).
    Each stage's wall time is added to `timings` (the caller's, holding its own stages)."""
    progress = progress or Progress()
    clock = timings if timings is not None else Timings()
    with clock.stage("probe"):
        probed = probe(store, t.planned, dry_run=s.dry_run)
        if s.read_only:
            refuse_misses(store, probed)
    fetched = None
    if s.remote is not None and not s.dry_run and not s.read_only:
        with clock.stage("fetch"):
            fetched = fetch(store, probed.misses, s.remote, progress)
    misses = fetched.left if fetched is not None else probed.misses
    use = fetched.use if fetched is not None else None
    push = s.remote if s.remote is not None and s.remote.write and use is not None and not use.down else None
    if misses and hashes is not None and not s.dry_run and not s.read_only:
        # what planning learned, written before the workers start: their read-set checks
        # recompute the keyed distributions' digests from it (`read_installed.Dists`), as a
        # no-op build's planning does, rather than parse torch's RECORD again in each worker
        store.ensure()
        hashes.save()
    with clock.stage("compile"):
        compiled = compile_misses(store, misses, t.selected, s, progress, push, use)
    outcomes = probed.outcomes + (fetched.outcomes if fetched else []) + compiled.outcomes
    with clock.stage("publish"):
        linked = publish(store, outcomes, stale=probed.stale, swept=bool(misses), dry_run=s.dry_run,
                         read_only=s.read_only)
    order = {p.key + p.label: i for i, p in enumerate(t.planned)}
    outcomes.sort(key=lambda o: order[o.planned.key + o.planned.label])
    built = Built(outcomes, use, compiled.runtimes_built + linked, timings=clock)
    with clock.stage("lock"):
        record(store, t, built, hashes=hashes, lock=None if t.candidates else lock, dry_run=s.dry_run,
               read_only=s.read_only)
    return built


# probe -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probed:
    """What the store holds of a plan."""

    outcomes: list[Outcome]  # hits ("cached"), refused entries ("failed"), dry-run misses ("planned")
    misses: list[Planned]  # not in the store: to fetch or compile
    stale: list[str]  # keys of hits whose index record is older than their meta.json


def probe(store: StoreView, planned: Sequence[Planned], *, dry_run: bool = False) -> Probed:
    """Which planned entries `store` holds: a hit is told by its ~400-byte index record when
    that was taken from its meta.json as it is now (its stamp), else by reading meta.json;
    an entry someone else could have written is refused (`entry_trust_problem`), as is a
    cache another user owns (`Store.check_trust`). Reads only."""
    if store.entries_dir.is_dir():
        store.check_trust()  # another user's cache never vouches for anything here
    out: list[Outcome] = []
    misses: list[Planned] = []
    stale: list[str] = []
    for p in planned:
        rec = store.indexed_facts(p.kernel.name, p.key)
        facts = rec.facts if rec is not None else None
        stamp = store.stamp(p.key) if facts is not None else None
        if rec is not None and facts is not None and rec.taken_from(stamp):
            # a hit, told by its index record, taken from this very meta.json
            why = entry_trust_problem(store.layout.entry_str(p.key), [facts.library])
            out.append(Outcome(p, "failed", error=f"cached entry {p.key[:12]} refused: {why}; run "
                               "`cutecc verify --fix`") if why else
                       Outcome(p, "cached", facts=facts, saved=facts.build_seconds))
            continue
        try:
            entry = store.get(p.key)
        except CuteccError:  # unreadable metadata: a hit the lock cannot record
            out.append(Outcome(p, "cached"))
            continue
        bad = entry_trust_problem(entry.path, list(entry.recorded.files)) if entry else None
        if bad:
            out.append(Outcome(p, "failed", error=f"cached entry {p.key[:12]} refused: "
                               f"{bad}; run `cutecc verify --fix`"))
        elif entry is not None:
            try:
                meta: EntryMeta | None = entry.meta
            except ValueError:  # damaged metadata: a hit the lock cannot record, as unreadable
                meta = None
            out.append(Outcome(p, "cached", meta=meta, saved=meta.build_seconds if meta else 0.0))
            if stamp is not None:  # meta.json rewritten or copied since its record was taken
                stale.append(p.key)
        elif dry_run:
            out.append(Outcome(p, "planned"))
        else:
            misses.append(p)
    return Probed(out, misses, stale)


def refuse_misses(store: StoreView, probed: Probed) -> None:
    """A read-only build's misses are an error (exit 1) naming them."""
    missing = probed.misses or [o.planned for o in probed.outcomes if o.status == "planned"]
    if missing:
        raise WorkError(f"read-only mode: {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} "
                        "not in the cache: " + ", ".join(f"{p.label} {p.key[:12]}" for p in missing),
                        where=str(store.root))


# fetch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetched:
    """What the remote cache gave."""

    outcomes: list[Outcome]  # the misses it had, published here ("cached", fetched)
    left: list[Planned]  # the misses left to compile
    use: RemoteUse


def fetch(store: Store, misses: list[Planned], cfg: RemoteConfig, progress: Progress) -> Fetched:
    """Fetch from the remote what it has of the misses, each checked before it is published
    into `store`; a remote that is down or refuses an entry fails nothing (the entry is
    compiled)."""
    use = RemoteUse(cfg.url, cfg.write)
    if not misses:
        return Fetched([], [], use)
    store.ensure()
    t0 = time.perf_counter()
    keys = list(dict.fromkeys(p.key for p in misses))
    progress.note(f"looking up {len(keys)} entr{'y' if len(keys) == 1 else 'ies'} in {cfg.url}")
    conn = remote_cache.Remote(cfg)
    before = conn.traffic
    found = conn.lookup(keys, store)
    label = {p.key: p.label for p in misses}
    use.fetched, use.absent, use.down = len(found.fetched), len(found.absent), found.down
    use.refused = {f"{label[k]} {k[:12]}": why for k, why in found.refused.items()}
    after = conn.traffic
    use.traffic = remote_cache.Traffic(after.requests - before.requests,
                                       after.bytes_down - before.bytes_down,
                                       after.bytes_up - before.bytes_up, after.seconds - before.seconds)
    use.seconds = time.perf_counter() - t0
    use.saved = sum(f.saved for f in found.fetched.values())
    out, left = [], []
    for p in misses:
        got = found.fetched.get(p.key)
        if got is None:
            left.append(p)
        else:
            # checked on arrival (`ship.ingest`): typed here
            out.append(Outcome(p, "cached", meta=got.entry.meta, saved=got.saved, fetched=True))
    return Fetched(out, left, use)


# compile -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Compiled:
    """What the executor did."""

    outcomes: list[Outcome] = field(default_factory=list)  # one per miss, in finishing order
    runtimes_built: list[str] = field(default_factory=list)  # runtime libraries linked first


def compile_misses(store: Store, misses: list[Planned], manifest: Manifest, s: Settings,
                   progress: Progress, push: RemoteConfig | None = None,
                   use: RemoteUse | None = None) -> Compiled:
    """Compile the misses on `s.executor`, after linking the runtime library they link
    against if the store lacks it. Several variants can share a key (a variant parameter
    that changes nothing): each key is built once, and reported for each of them. With
    `push`, workers upload what they build; what that did is added to `use`."""
    if not misses:
        return Compiled()
    store.ensure()
    store.sweep_tmp()
    linked = _ensure_runtimes(store, {p.inputs["toolchain"]["runtime"] for p in misses})
    unique = {p.key: p for p in misses}
    progress.start(len(misses))
    for p in unique.values():
        if store.is_busy(p.key):
            progress.waiting(p)
    out: list[Outcome] = []

    def on_result(job: BuildJob, r: Result) -> None:
        if r.pushed is not None and use is not None:
            use.traffic = use.traffic + r.pushed.traffic
            use.uploaded += r.pushed.created
            if r.pushed.error:
                use.upload_errors.append(f"{job.kernel}[{job.variant.id}]@{job.arch}: {r.pushed.error}")
        for q in misses:
            if q.key == job.key:
                o = Outcome(q, r.status, r.seconds, r.error, r.meta, timings=dict(r.timings),
                            worker=r.worker, traceback=r.traceback)
                out.append(o)
                progress.done(o)

    s.executor.compile_all([BuildJob.of(p, manifest) for p in unique.values()], store.root, s.jobs,
                           on_result, push)
    return Compiled(out, linked)


# publish -----------------------------------------------------------------------------


def publish(store: Store, outcomes: list[Outcome], *, stale: Sequence[str] = (), swept: bool = False,
            dry_run: bool = False, read_only: bool = False) -> list[str]:
    """Make the store whole for what the build reports: every built or cached entry's
    runtime library there (gc or rm may have taken one; a fetched entry or a Ray worker's
    brings none), linked if missing (a read-only build: an error); hits' `stale` index
    records rewritten; leftovers of killed builds swept unless the compile stage did
    (`swept`). Returns the runtime libraries it linked."""
    if dry_run:
        return []
    needed = {o.facts.runtime_key for o in outcomes if o.facts is not None}
    needed |= {o.meta.runtime.key for o in outcomes if o.status in ("built", "cached") and o.meta}
    missing = sorted(k for k in needed if store.get_runtime(k) is None)
    if missing and read_only:
        raise WorkError(f"read-only mode: runtime librar{'y' if len(missing) == 1 else 'ies'} "
                        f"{', '.join(k[:12] for k in missing)} not in the cache", where=str(store.root))
    linked = []
    if missing:
        store.ensure()
        linked = _ensure_runtimes(store, set(missing))
    if read_only:
        return linked
    for key in stale:
        _refresh_record(store, key)
    if not swept:  # leftovers of killed builds go even when everything is cached
        with contextlib.suppress(CuteccError, OSError):
            if store.created():
                store.sweep_tmp()
    return linked


def _ensure_runtimes(store: Store, keys: set[str]) -> list[str]:
    """Link and publish the runtime libraries of `keys` the store lacks (this toolchain's);
    the names of those linked."""
    out = []
    for key in sorted(keys):
        entry, built = ensure_runtime(store, key)
        if built:
            out.append(entry.runtime_meta.library_name)  # ensure_runtime checked it
    return out


def _refresh_record(store: Store, key: str) -> None:
    """Rewrite an index record whose meta.json was rewritten or copied since (a copied
    cache, verify's repair), from that meta.json read again under the key's lock, so the
    next build reads the record only. Best-effort: busy, damaged or read-only, it waits."""
    with contextlib.suppress(Exception), store.lock(key, timeout=0):
        entry = store.get(key)
        if entry is not None:  # damaged (`entry.meta` raises): left to `cutecc verify`
            store.index(key, entry.meta, meta_file(entry.path))


# record ------------------------------------------------------------------------------


def record(store: Store, t: Target, built: Built, *, hashes: HashCache | None = None,
           lock: LockRequest | None = None, dry_run: bool = False, read_only: bool = False) -> None:
    """Record what the build did: hits marked used and the cache's stats, what planning
    learned (`hashes`), and after a fully successful build the generations and composites
    (not for candidates) and the lock at `lock` (filling `built`'s lock fields)."""
    if not dry_run and not read_only:
        _record_use(store, built)
        if hashes is not None and store.root.is_dir():
            hashes.save()  # a no-op if planning saved it already (an existing store)
    if dry_run or not built.ok:
        return
    if not read_only and not t.candidates:
        _record_generations(store, t.manifest.path, t.planned, partial=t.partial, fallbacks=t.fallbacks,
                            roots=tuple(str(p) for p in t.manifest.python_path))
        for c in t.selected.composites:  # best-effort, like the generations
            with contextlib.suppress(OSError):
                store.record_composite(CompositeRecord(c.name, c.launches, c.inputs, c.outputs,
                                                       str(t.manifest.path)))
    if lock is not None:
        _write_lock(store, t, built, hashes, lock)


def _write_lock(store: Store, t: Target, built: Built, hashes: HashCache | None, req: LockRequest) -> None:
    merged = merge_build(
        req.path, [_lock_line(o, t.fallbacks) for o in built.outcomes], partial=t.partial,
        covered={(p.kernel.name, p.arch, p.platform) for p in t.planned},
        defined={k.name for k in t.manifest.kernels},
        composites=[CompositeLine(c.name, c.launches, c.inputs, c.outputs) for c in t.manifest.composites],
        environment=environment_of(t.planned))
    signing = req.signing_key is not None
    new_lock = _vouched(store, t.manifest, hashes, merged, built, signing=signing, where=req.path)
    recorded = record_lock(req.path, new_lock, req.signing_key)
    built.lock_changed, built.lock_file, built.signature = recorded.changed, req.path, recorded.signature
    built.signature_removed = recorded.removed


def environment_of(planned: Sequence[Planned]) -> Environment:
    """The key-deciding distributions `planned` was keyed with (what the lock records), each
    named by its installed files whichever entries reached it (`Planned.environment`)."""
    return Environment.of(p.environment for p in planned)


def _lock_line(o: Outcome, fallbacks: dict[str, dict[str, FallbackRef]]) -> LockEntry:
    p = o.planned
    if o.facts is not None:
        le = LockEntry.from_facts(p.kernel.name, p.variant.id, p.arch, p.key, o.facts, p.platform)
    else:
        le = LockEntry.of(p.kernel.name, p.variant.id, p.arch, p.key, o.meta, p.platform)
    refs = fallbacks.get(p.kernel.name)
    return dataclasses.replace(le, fallbacks=tuple(sorted(refs.items()))) if refs else le


def _vouched(store: StoreView, manifest: Manifest, hashes: HashCache | None, merged: Merged,
             built: Built, *, signing: bool, where: Path) -> Lock:
    """The lock this build may write: `merged` with every line it did not see itself
    checked against the cache, and, when it is about to be signed, every line read back
    and hashed (`cutecc.ship.vouch.vouch`, the check `cutecc tune` passes its lock through
    too). A tuning line that fails is dropped with a warning (the default serves its
    bucket); an entry line that fails is an error naming it, and nothing is written or
    signed."""
    from cutecc.ship.vouch import vouch

    got = vouch(store, merged.lock, kept=merged.kept, candidates=lambda: _tuning_candidates(manifest, hashes),
                signing=signing, where=where)
    built.dropped_tuning += got.dropped
    return got.lock


def _tuning_candidates(manifest: Manifest, hashes: HashCache | None) -> dict[tuple[str, str, str], Any]:
    """The manifest's tuning plan, every arch (a build restricted by --arch keeps the other
    archs' tuning lines), as (kernel, variant, arch) -> (default key, {candidate key:
    variant}); {} when it declares no tuning space. Planned with the build's own hash cache,
    so a no-op build reads no unchanged file for it."""
    from cutecc.plan.tuning_plan import items

    if not any(k.tuning is not None for k in manifest.kernels):
        return {}
    return {(it.kernel, it.variant, it.arch): (it.base, {c.key: c.variant for c in it.candidates})
            for it in items(manifest, hash_cache=hashes)}


def _record_generations(store: Store, manifest: Path, planned: tuple[Planned, ...], *, partial: bool,
                        fallbacks: dict[str, dict[str, FallbackRef]] | None = None,
                        roots: tuple[str, ...] = ()) -> None:
    """Record what this build planned as each (kernel, arch)'s current entries, and as the
    manifest's with the source files its keys read (`cutecc.load(manifest=)` serves the
    build whose sources are the files as they are then): `cutecc.load` then offers only
    these (older entries stay for locks).
    Best-effort: where they cannot be written, the old records go (load then offers every
    entry of those kernels, as before records existed)."""
    by: dict[str, dict[str, list[str]]] = {}
    for p in planned:
        by.setdefault(p.kernel.name, {}).setdefault(p.arch, []).append(p.key)
    try:
        for kernel, per_arch in by.items():
            store.record_generations(kernel, per_arch, str(manifest),
                                     refs_to_json((fallbacks or {}).get(kernel, {})), roots)
        store.record_manifest(manifest, hashlib.sha256(manifest.read_bytes()).hexdigest(), by,
                              partial=partial,
                              sources={f.path: f.sha256 for p in planned for f in p.keyed_files})
    except OSError:  # a full or read-only cache: drop the records rather than keep stale ones
        store.forget_build_records(manifest, [(k, a) for k, per_arch in by.items() for a in per_arch])


def _record_use(store: Store, built: Built) -> None:
    """Mark each hit used (for `cutecc gc`) and add this build's counts to stats.json.

    Best-effort: a cache on a read-only mount still serves its hits.
    """
    if not store.created():
        return
    for o in built.outcomes:
        if o.status == "cached":
            touch_used(store.layout.entry_str(o.planned.key))
    local_hits = [o for o in built.outcomes if o.status == "cached" and not o.fetched]
    remote: dict[str, float] = {}
    if built.remote is not None:
        use, t = built.remote, built.remote.traffic
        remote = {"remote_hits": use.fetched, "remote_misses": use.absent,
                  "remote_refused": len(use.refused), "remote_unavailable": int(use.down is not None),
                  "remote_uploads": use.uploaded, "remote_requests": t.requests,
                  "remote_bytes_down": t.bytes_down, "remote_bytes_up": t.bytes_up,
                  "remote_seconds": use.seconds, "remote_seconds_saved": use.saved}
    with contextlib.suppress(OSError):  # filelock.Timeout is an OSError too
        store.add_stats(hits=len(local_hits), misses=sum(o.status == "built" for o in built.outcomes),
                        failures=sum(o.status == "failed" for o in built.outcomes),
                        seconds_saved=sum(o.saved for o in local_hits), **remote)
