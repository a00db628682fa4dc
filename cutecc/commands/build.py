"""`cutecc build`: plan every (kernel, variant, arch), compile the misses, publish them,
and write the lock file.

Planning computes each key without importing the DSL; entries already in the store are
reported cached and cost one read of their index record (their lock line), not of their
metadata. With a remote cache (`cutecc.remote`), local
misses are looked up there next, and what it has is checked and published into the local
store (reported cached, and fetched). What is left compiles on the chosen executor
(`cutecc.executors`: local worker processes, or Ray), whose workers upload what they
build when remote writing is on. The manifest is parsed once; the lock is written from
what this build saw and published, never by reading it back. Kernels link against this
toolchain's runtime library, linked first if the store lacks it; every entry's runtime
library is checked to be there at the end (and linked again if gc or rm took it, or the
entry came from the remote or a Ray worker).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc import environ
from cutecc import remote as remote_cache
from cutecc.archs import parse_archs
from cutecc.dists import HashCache
from cutecc.entry import runtime_record
from cutecc.errors import CuteccError
from cutecc.executors import Executor, choose, compile_limits
from cutecc.lockfile import LOCK_NAME, Lock, LockEntry, Merged, merge_build, write_lock
from cutecc.locks import is_held
from cutecc.manifest import load_manifest
from cutecc.plan import Planned, plan
from cutecc.platforms import check_platform
from cutecc.report import Report
from cutecc.store import HASH_CACHE, Store, entry_trust_problem, manifest_id, touch_used
from cutecc.units import human_size
from cutecc.workers import BuildJob, Result, ensure_runtime


@dataclass
class Outcome:
    planned: Planned
    status: str  # "built", "cached", "failed", "planned" (dry run)
    seconds: float = 0.0
    error: str | None = None
    meta: dict[str, Any] | None = None  # the entry's metadata, for the lock
    facts: dict[str, Any] | None = None  # or, for a hit, its index record (`entry.index_facts`)
    saved: float = 0.0  # for a hit: the compile seconds it saved (its recorded build time)
    fetched: bool = False  # a hit found on the remote cache (status "cached")

    def to_json(self) -> dict[str, Any]:
        p = self.planned
        return {"kernel": p.kernel.name, "variant": p.variant.id, "arch": p.arch,
                "platform": p.platform, "key": p.key,
                "status": self.status, "seconds": round(self.seconds, 3), "error": self.error,
                "fetched": self.fetched}


@dataclass
class RemoteUse:
    """What a build did with the remote cache."""

    url: str
    write: bool
    fetched: int = 0
    absent: int = 0  # looked up, not there (compiled)
    refused: dict[str, str] = field(default_factory=dict)  # "label key" -> why
    down: str | None = None  # why the remote stopped being used
    uploaded: int = 0
    upload_errors: list[str] = field(default_factory=list)
    traffic: remote_cache.Traffic = field(default_factory=remote_cache.Traffic)
    seconds: float = 0.0  # wall time of the lookup
    saved: float = 0.0  # compile seconds the fetched entries saved

    def to_json(self) -> dict[str, Any]:
        t = self.traffic
        return {"url": self.url, "write": self.write, "fetched": self.fetched, "absent": self.absent,
                "refused": [{"entry": k, "reason": v} for k, v in self.refused.items()],
                "unavailable": self.down, "uploaded": self.uploaded,
                "upload_errors": self.upload_errors, "requests": t.requests,
                "bytes_down": t.bytes_down, "bytes_up": t.bytes_up,
                "lookup_seconds": round(self.seconds, 3), "seconds_saved": round(self.saved, 3)}

    def warnings(self) -> list[str]:
        """At most one line for each kind of trouble; none of it fails the build."""
        out = []
        if self.down:
            out.append(f"warning: remote cache {self.url} unavailable ({self.down}); built locally")
        if self.refused:
            first = next(iter(self.refused.items()))
            out.append(f"warning: remote cache {self.url}: refused {len(self.refused)} "
                       f"entr{'y' if len(self.refused) == 1 else 'ies'} (first: {first[0]}: "
                       f"{first[1]}); built locally")
        if self.upload_errors and not self.down:
            out.append(f"warning: remote cache {self.url}: {len(self.upload_errors)} built "
                       f"entr{'y' if len(self.upload_errors) == 1 else 'ies'} not uploaded "
                       f"({self.upload_errors[0]})")
        return out

    def line(self) -> str:
        t = self.traffic
        return (f"remote {self.url}: {self.fetched} fetched, {self.absent} absent"
                + (f", {self.uploaded} uploaded" if self.write else ", read-only")
                + f"; {t.requests} requests, {human_size(t.bytes_down)} down, "
                  f"{human_size(t.bytes_up)} up")


class Progress:
    """What a build tells as it goes (the CLI draws a bar or prints lines); silent here."""

    def start(self, total: int) -> None:
        """`total` entries are about to be compiled."""

    def waiting(self, planned: Planned) -> None:
        """Another process holds `planned`'s lock: this build waits for it."""

    def done(self, outcome: Outcome) -> None:
        """One compile finished (built, cached meanwhile, or failed)."""

    def note(self, text: str) -> None:
        """A step worth a line (a remote lookup starting)."""


@dataclass
class BuildReport(Report):
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    cache_dir: Path | None = None
    lock_file: Path | None = None  # the lock this build wrote or confirmed (None: not written)
    lock_changed: bool = False
    signature: Path | None = None  # the lock's signature, when this build signed it
    dry_run: bool = False
    executor: str = "local"
    remote: RemoteUse | None = None
    runtimes_built: list[str] = field(default_factory=list)  # runtime libraries this build linked
    dropped_tuning: list[str] = field(default_factory=list)  # tuning lines the lock lost, and why

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    @property
    def ok(self) -> bool:
        return self.count("failed") == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "cache_dir": str(self.cache_dir),
            "seconds": round(self.seconds, 3),
            "built": self.count("built"), "cached": self.count("cached"),
            "failed": self.count("failed"), "planned": self.count("planned"),
            "lock_file": str(self.lock_file) if self.lock_file else None,
            "lock_changed": self.lock_changed,
            "signature": str(self.signature) if self.signature else None,
            "executor": self.executor,
            "fetched": sum(o.fetched for o in self.outcomes),
            "remote": self.remote.to_json() if self.remote else None,
            "runtimes_built": self.runtimes_built,
            "dropped_tuning": self.dropped_tuning,
            "entries": [o.to_json() for o in self.outcomes],
        }

    def warnings(self) -> list[str]:
        return ([f"FAILED {o.planned.label}: {o.error}" for o in self.outcomes if o.status == "failed"]
                + [f"warning: dropped the tuning line {d}" for d in self.dropped_tuning]
                + (self.remote.warnings() if self.remote else []))

    def lines(self, verbose: int = 0) -> list[str]:
        out = [f"would build {o.planned.label} {o.planned.key[:12]}"
               for o in self.outcomes if o.status == "planned"]
        if verbose > 0:
            out += [f"{o.status:7} {o.planned.label} {o.planned.key[:12]}"
                    for o in self.outcomes if o.status in ("built", "cached")]
        out += [f"linked runtime library {name}" for name in self.runtimes_built]
        fetched = sum(o.fetched for o in self.outcomes)
        out.append(f"{self.count('built')} built, {self.count('cached')} cached"
                   + (f" ({fetched} fetched)" if self.remote else "") + ", "
                   f"{self.count('failed')} failed"
                   + (f", {self.count('planned')} to build" if self.dry_run else "")
                   + f" in {self.seconds:.2f}s ({self.cache_dir})")
        if self.remote and verbose >= 0:
            out.append(self.remote.line())
        if self.lock_changed:
            out.append(f"wrote {self.lock_file}")
        if self.signature:
            out.append(f"signed {self.lock_file} ({self.signature})")
        return out


def build(
    manifest_path: str | Path,
    *,
    archs: tuple[str, ...] = (),
    platforms: tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
    jobs: int | None = None,
    kernels: tuple[str, ...] = (),
    dry_run: bool = False,
    progress: Progress | None = None,
    read_only: bool = False,
    lock: bool = True,
    lock_file: str | Path | None = None,
    sign_key: str | Path | None = None,
    executor: str | None = None,
    ray_address: str | None = None,
    remote: str | None = None,
    remote_write: bool | None = None,
    candidates: bool = False,
    compile_timeout: str | float | None = None,
    compile_memory: str | int | None = None,
) -> BuildReport:
    """Build a manifest into a cache; see the module docstring.

    `read_only` (or `$CUTECC_READ_ONLY`): write nothing to the cache and make any miss
    an error (exit 1) instead of a compile, e.g. for a deploy that must only read.
    `lock`: after a fully successful build (not a dry run), write `kernels.lock` beside
    the manifest (or `lock_file`) if its content changed; see `cutecc.lockfile`.
    `sign_key` (or `$CUTECC_SIGNING_KEY`): sign the lock written (`kernels.lock.sig`).
    `executor` (`local` or `ray`, else `$CUTECC_EXECUTOR`, else the manifest's `[build]`)
    compiles the misses; `ray_address` (else `$CUTECC_RAY_ADDRESS`, else `[build]`) names a
    Ray cluster, else a local one is started. `remote` (`s3://bucket/prefix`, else
    `$CUTECC_REMOTE`, else `[build]`) is a shared cache looked up for local misses;
    `remote_write` (else `$CUTECC_REMOTE_WRITE`; never the manifest) uploads what is built.
    `platforms`: the host platforms to build for, overriding the manifest's.
    `candidates`: build the tuning candidates of kernels with a tuning space too (for
    `cutecc tune`; same keys, nothing recorded as the kernels' current build, no lock).
    `compile_timeout` (seconds) and `compile_memory` (a size; else `$CUTECC_COMPILE_*`, else
    `[build]`) bound each compile: one past a limit is stopped and fails alone.
    """
    t0 = time.perf_counter()
    progress = progress or Progress()
    sign_key = sign_key or os.environ.get(environ.SIGNING_KEY) or None
    if sign_key and (not lock or dry_run):
        raise CuteccError("signing needs the lock this build writes (not --no-lock or --dry-run)",
                          where="--sign-key")
    key = None
    if sign_key:  # read it first: a bad key fails before any compile
        from cutecc import signing

        try:
            key = signing.read_private_key(sign_key)
        except OSError as e:
            raise CuteccError(f"cannot read the signing key: {e.strerror}", where=str(sign_key)) from None
    read_only = read_only or environ.read_only()
    archs = parse_archs(archs) if archs else ()
    full = load_manifest(manifest_path)
    settings = full.build  # the manifest's [build] table: below flags and environment
    runner = dataclasses.replace(
        choose(executor, ray_address, default_kind=settings.executor, default_address=settings.ray_address),
        limits=compile_limits(compile_timeout, compile_memory, default_seconds=settings.compile_timeout,
                              default_memory=settings.compile_memory))
    remote_cfg = remote_cache.config(remote, remote_write, default=settings.remote)
    manifest = full.select(kernels) if kernels else full
    if candidates:
        from cutecc.tuning.plan import with_candidates

        manifest, lock = with_candidates(manifest), False
    store = Store(cache_dir)
    report = BuildReport(cache_dir=store.root, dry_run=dry_run, executor=runner.kind)
    # What planning learns is kept in the store: in a new one, once the build has made it.
    hashes = None if read_only or dry_run else HashCache(store.root / HASH_CACHE)
    planned = plan(manifest, archs, hash_cache=hashes,
                   platforms=tuple(check_platform(p, "--platform") for p in platforms))
    if store.entries_dir.is_dir():
        store.check_trust()  # another user's cache never vouches for anything here
    misses: list[Planned] = []
    for p in planned:
        facts = store.indexed_facts(p.kernel.name, p.key)
        stamp = store.stamp(p.key) if facts is not None else None
        if stamp is not None and facts is not None and facts.get("meta_stat") == stamp:
            # a hit, told by its ~400-byte index record, taken from this very meta.json
            why = entry_trust_problem(store.entry_path(p.key), [facts["library"]])
            report.outcomes.append(
                Outcome(p, "failed", error=f"cached entry {p.key[:12]} refused: {why}; run "
                        "`cutecc verify --fix`") if why else
                Outcome(p, "cached", facts=facts, saved=facts["build_seconds"]))
            continue
        stale_record = stamp is not None  # meta.json rewritten or copied since: read it
        try:
            entry = store.get(p.key)
        except CuteccError:  # unreadable metadata: a hit the lock cannot record
            report.outcomes.append(Outcome(p, "cached"))
            continue
        why = entry and entry_trust_problem(entry.path, list(entry.meta.get("files") or []))
        if why:
            report.outcomes.append(Outcome(p, "failed", error=f"cached entry {p.key[:12]} refused: "
                                           f"{why}; run `cutecc verify --fix`"))
            continue
        if entry is not None:
            report.outcomes.append(Outcome(p, "cached", meta=entry.meta,
                                           saved=_build_seconds(entry.meta)))
            if stale_record and not read_only and not dry_run:
                _refresh_record(store, p.key)
        elif dry_run:
            report.outcomes.append(Outcome(p, "planned"))
        else:
            misses.append(p)
    if read_only and (misses or report.count("planned")):
        missing = misses or [o.planned for o in report.outcomes if o.status == "planned"]
        raise CuteccError(f"read-only mode: {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} "
                          "not in the cache: " + ", ".join(f"{p.label} {p.key[:12]}" for p in missing),
                          where=str(store.root), exit_code=1)
    push: remote_cache.RemoteConfig | None = None
    if remote_cfg is not None and not dry_run and not read_only:
        report.remote = RemoteUse(remote_cfg.url, remote_cfg.write)
        if misses:
            store.ensure()
            misses = _fetch(misses, store, remote_cfg, report, report.remote, progress)
        push = remote_cfg if remote_cfg.write and not report.remote.down else None
    if misses:
        store.ensure()
        store.sweep_tmp()
        _ensure_runtimes(store, {p.inputs["toolchain"]["runtime"] for p in misses}, report)
        _compile(misses, manifest, store, jobs or os.cpu_count() or 1, report, progress, runner, push)
    if not dry_run:  # every entry's runtime library is there (gc or rm may have taken one)
        needed = {o.facts["runtime_key"] for o in report.outcomes if o.facts}
        needed |= {rec["key"] for o in report.outcomes if o.status in ("built", "cached") and o.meta
                   for rec in [runtime_record(o.meta)] if rec is not None}
        missing = sorted(k for k in needed if store.get_runtime(k) is None)
        if missing and read_only:
            raise CuteccError(f"read-only mode: runtime librar{'y' if len(missing) == 1 else 'ies'} "
                              f"{', '.join(k[:12] for k in missing)} not in the cache",
                              where=str(store.root), exit_code=1)
        if missing:
            store.ensure()
            _ensure_runtimes(store, set(missing), report)
    order = {p.key + p.label: i for i, p in enumerate(planned)}
    report.outcomes.sort(key=lambda o: order[o.planned.key + o.planned.label])
    if not dry_run and not read_only:
        if not misses:  # leftovers of killed builds go even when everything is cached
            with contextlib.suppress(CuteccError, OSError):
                if store.locks_dir.is_dir():
                    store.sweep_tmp()
        _record_use(store, report)
        if hashes is not None and store.root.is_dir():
            hashes.save()  # a no-op if planning saved it already (an existing store)
    if not dry_run and not read_only and report.ok and not candidates:
        _record_generations(store, full.path, planned, partial=bool(kernels or archs or platforms))
        for c in manifest.composites:  # best-effort, like the generations
            with contextlib.suppress(OSError):
                store.record_composite(c.name, c.to_json(), str(full.path))
    if lock and not dry_run and report.ok:
        path = Path(lock_file or Path(manifest_path).parent / LOCK_NAME)
        merged = merge_build(
            path, [_lock_line(o) for o in report.outcomes],
            partial=bool(kernels or archs or platforms),
            covered={(p.kernel.name, p.arch, p.platform) for p in planned},
            defined={k.name for k in full.kernels})
        new_lock = _vouched(store, full, hashes, merged, report, signing=key is not None, where=path)
        report.lock_changed = write_lock(path, new_lock)
        report.lock_file = path
        if key is not None:
            from cutecc import signing

            report.signature = signing.sign_file(path, key, "lock", data=new_lock.dumps())
    report.seconds = time.perf_counter() - t0
    return report


def _vouched(store: Store, manifest: Any, hashes: Any, merged: Merged,
             report: BuildReport, *, signing: bool, where: Path) -> Lock:
    """The lock this build may write: `merged` with every line it did not see itself
    checked against the cache (`cutecc.vouch`), and, when it is about to be signed, every
    line read back and hashed. A tuning line that fails is dropped with a warning (the
    default serves its bucket); an entry line that fails is an error naming it, and
    nothing is written or signed."""
    from cutecc.vouch import entry_line_problem, tuning_line_problem

    bad: list[str] = []
    memo: dict[Any, Any] = {}  # each library and runtime library read and hashed once
    for le in merged.lock.entries if signing else merged.kept:
        why = entry_line_problem(store, le, hashed=signing, memo=memo)
        if why and (signing or why != "not in the cache"):
            bad.append(f"{le.label} {le.key[:12]}: {why}")
    if bad:
        raise CuteccError(f"{'refusing to sign: ' if signing else ''}{len(bad)} lock line(s) this build "
                          f"cannot vouch for: {'; '.join(bad[:5])}"
                          + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
                          + ". Build those kernels (or `cutecc verify --fix`, then build) first",
                          where=str(where), exit_code=1)
    if not merged.lock.tuning:
        return merged.lock
    candidates = _tuning_candidates(manifest, hashes)
    keep = []
    for t in merged.lock.tuning:
        why = tuning_line_problem(store, t, candidates, hashed=signing, present=signing, memo=memo)
        if why:
            report.dropped_tuning.append(f"{t.kernel}[{t.variant}]@{t.arch} {t.bucket} on {t.device}: {why}")
        else:
            keep.append(t)
    return merged.lock.with_tuning(keep)


def _tuning_candidates(manifest: Any, hashes: Any) -> dict[tuple[str, str, str], Any]:
    """The manifest's tuning plan, every arch (a build restricted by --arch keeps the other
    archs' tuning lines), as (kernel, variant, arch) -> (default key, {candidate key:
    variant}); {} when it declares no tuning space. Planned with the build's own hash cache,
    so a no-op build reads no unchanged file for it."""
    from cutecc.tuning.plan import items

    if not any(k.tuning is not None for k in manifest.kernels):
        return {}
    return {(it["kernel"], it["variant"], it["arch"]): (it["base"], {c["key"]: c["variant"]
                                                                      for c in it["candidates"]})
            for it in items(manifest, hash_cache=hashes)}


def _record_generations(store: Store, manifest: Path, planned: list[Planned], *, partial: bool) -> None:
    """Record what this build planned as each (kernel, arch)'s current entries, and as the
    manifest's: `cutecc.load` then offers only these (older entries stay for locks).
    Best-effort: where they cannot be written, the old records go (load then offers every
    entry of those kernels, as before records existed)."""
    by: dict[str, dict[str, list[str]]] = {}
    for p in planned:
        by.setdefault(p.kernel.name, {}).setdefault(p.arch, []).append(p.key)
    try:
        for kernel, per_arch in by.items():
            for arch, keys in per_arch.items():
                store.record_generation(kernel, arch, keys, str(manifest))
        store.record_manifest(manifest, hashlib.sha256(manifest.read_bytes()).hexdigest(), by,
                              partial=partial)
    except OSError:  # a full or read-only cache: drop the records rather than keep stale ones
        for kernel, per_arch in by.items():
            for arch in per_arch:
                with contextlib.suppress(OSError):
                    (store.generations_dir / f"{kernel}@{arch}.json").unlink()
        with contextlib.suppress(OSError):
            (store.manifests_dir / f"{manifest_id(manifest)}.json").unlink()


def _ensure_runtimes(store: Store, keys: set[str], report: BuildReport) -> None:
    """Link and publish the runtime libraries of `keys` the store lacks (this toolchain's)."""
    for key in sorted(keys):
        entry, built = ensure_runtime(store, key)
        if built:
            report.runtimes_built.append(str(entry.meta.get("library")))


def _refresh_record(store: Store, key: str) -> None:
    """Rewrite an index record whose meta.json was rewritten or copied since (a copied
    cache, verify's repair), from that meta.json read again under the key's lock, so the
    next build reads the record only. Best-effort: busy, damaged or read-only, it waits."""
    from cutecc.entry import META, meta_problem

    with contextlib.suppress(Exception), store.lock(key, timeout=0):
        entry = store.get(key)
        if entry is not None and meta_problem(entry.meta, key) is None:
            store.index(key, entry.meta, entry.path / META)


def _build_seconds(meta: dict[str, Any]) -> float:
    try:
        return float(meta.get("build_seconds", 0))
    except (TypeError, ValueError):
        return 0.0


def _lock_line(o: Outcome) -> LockEntry:
    p = o.planned
    if o.facts is not None:
        return LockEntry.from_facts(p.kernel.name, p.variant.id, p.arch, p.key, o.facts, p.platform)
    return LockEntry.of(p.kernel.name, p.variant.id, p.arch, p.key, o.meta or {})


def _fetch(misses: list[Planned], store: Store, cfg: remote_cache.RemoteConfig, report: BuildReport,
           use: RemoteUse, progress: Progress) -> list[Planned]:
    """Fetch from the remote what it has of the misses; returns the misses left to build."""
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
    left = []
    for p in misses:
        got = found.fetched.get(p.key)
        if got is None:
            left.append(p)
        else:
            report.outcomes.append(Outcome(p, "cached", meta=got.entry.meta, saved=got.saved,
                                           fetched=True))
    return left


def _compile(misses: list[Planned], manifest: Any, store: Store, workers: int,
             report: BuildReport, progress: Progress, runner: Executor,
             push: remote_cache.RemoteConfig | None) -> None:
    # Several variants can share a key (a variant parameter that changes nothing);
    # build each key once, and report it for each of them.
    unique = {p.key: p for p in misses}
    progress.start(len(misses))
    for p in unique.values():
        if is_held(store.locks_dir / f"{p.key}.lock"):
            progress.waiting(p)

    def on_result(job: BuildJob, r: Result) -> None:
        if r.pushed is not None and report.remote is not None:
            use = report.remote
            use.traffic = use.traffic + r.pushed.traffic
            use.uploaded += r.pushed.created
            if r.pushed.error:
                use.upload_errors.append(f"{job.kernel}[{job.variant.id}]@{job.arch}: {r.pushed.error}")
        for q in misses:
            if q.key == job.key:
                o = Outcome(q, r.status, r.seconds, r.error, r.meta)
                report.outcomes.append(o)
                progress.done(o)

    runner.compile_all([BuildJob.of(p, manifest) for p in unique.values()], store.root, workers,
                       on_result, push)


def _record_use(store: Store, report: BuildReport) -> None:
    """Mark each hit used (for `cutecc gc`) and add this build's counts to stats.json.

    Best-effort: a cache on a read-only mount still serves its hits.
    """
    if not store.locks_dir.is_dir():
        return
    for o in report.outcomes:
        if o.status == "cached":
            touch_used(store.entry_path(o.planned.key))
    local_hits = [o for o in report.outcomes if o.status == "cached" and not o.fetched]
    remote: dict[str, float] = {}
    if report.remote is not None:
        use, t = report.remote, report.remote.traffic
        remote = {"remote_hits": use.fetched, "remote_misses": use.absent,
                  "remote_refused": len(use.refused), "remote_unavailable": int(use.down is not None),
                  "remote_uploads": use.uploaded, "remote_requests": t.requests,
                  "remote_bytes_down": t.bytes_down, "remote_bytes_up": t.bytes_up,
                  "remote_seconds": use.seconds, "remote_seconds_saved": use.saved}
    with contextlib.suppress(OSError):  # filelock.Timeout is an OSError too
        store.add_stats(hits=len(local_hits), misses=report.count("built"),
                        failures=report.count("failed"),
                        seconds_saved=sum(o.saved for o in local_hits), **remote)
