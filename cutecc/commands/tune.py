"""`cutecc tune`: compile a manifest's tuning candidates, measure them on a GPU, record winners.

Steps (all by default; each alone with a flag, so a CPU host and a GPU host can split them):
  --dry-run        the candidate plan and counts; compiles nothing, needs no GPU
  --compile-only   compile every candidate through the cache (same keys as `cutecc build`,
                   so a rerun compiles nothing) and store the plan in the cache
  --measure        time the plan's candidates on this GPU from the cache alone (no DSL);
                   write `--results FILE`, and record winners into the lock and the cache
  --record FILE    record a results file (measured elsewhere) into the lock and the cache
  --check          measure again and report recorded winners whose time drifted beyond
                   `--threshold`, that no longer beat the default beyond the noise, or that
                   another candidate now beats (`cutecc.tuning.drift`)

Recording (`--measure`, `--record`, the default run) refuses a lock whose tuning lines would
be measured under different policies (`cutecc.tuning.policy`); `--replace-tuning` drops the
lock's lines of other policies instead (old lines without a policy among them). The lock
then passes the check `cutecc build`'s does (`cutecc.ship.vouch.vouch`) before
`record_lock` writes and signs it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cutecc.commands.report import Report
from cutecc.contract.buckets import bucket_text
from cutecc.contract.pinned import Tuned
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.lockfile import Lock, unsigned_line
from cutecc.plan.tuning_plan import PlanItem
from cutecc.runtime.tuning import read_cached
from cutecc.settings import NOTHING_GIVEN, BuildOptions
from cutecc.store.tuning_records import MAX_RESULTS_BYTES, TuningResult, TuningResults

if TYPE_CHECKING:
    from cutecc.lock.signing import PrivateKey
    from cutecc.store.writer import Store


@dataclass
class TuneReport(Report):
    mode: str
    plan: list[PlanItem] = field(default_factory=list)
    built: int = 0
    cached: int = 0
    failed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # candidates that failed to compile
    dropped_tuning: list[str] = field(default_factory=list)  # the lock's lines it lost, and why
    compile_seconds: float = 0.0
    records: list[TuningResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    lock_file: Path | None = None
    lock_changed: bool = False
    signature_removed: Path | None = None  # a signature of the lock's old bytes, removed (no key given)
    results_file: Path | None = None
    drift: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or self.drift else 0

    def warnings(self) -> list[str]:
        return ([f"FAILED {f}" for f in self.failed] + [f"DROPPED {d}" for d in self.dropped]
                + [f"DRIFT {d}" for d in self.drift]
                + [f"dropped the tuning line {d}" for d in self.dropped_tuning]
                + ([f"warning: {unsigned_line(self.signature_removed, self.lock_file)}"]
                   if self.signature_removed else []))

    def within_noise(self) -> list[str]:
        """The buckets whose decision was inside the noise (`decide.Decision.close`): where
        two runs may record different winners; every other bucket's decision was clear."""
        return [f"{r.line.kernel}[{r.line.variant}]@{r.line.arch} {r.line.bucket}" for r in self.records
                if r.within_noise]

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "within_noise": self.within_noise(),
                "compile_seconds": round(self.compile_seconds, 3),
                "built": self.built, "cached": self.cached, "failed": self.failed, "dropped": self.dropped,
                "candidates": sum(len(i.candidates) for i in self.plan),
                "kernels": _by_kernel(self.plan), "records": [r.to_json() for r in self.records], **self.info,
                "lock_file": str(self.lock_file) if self.lock_file else None,
                "lock_changed": self.lock_changed, "dropped_tuning": self.dropped_tuning,
                "signature_removed": str(self.signature_removed) if self.signature_removed else None,
                "results_file": str(self.results_file) if self.results_file else None,
                "drift": self.drift}

    def lines(self, verbose: int = 0) -> list[str]:
        out = []
        for it in self.plan if self.mode in ("dry-run", "compile") else []:
            out.append(f"{it.label}: {len(it.candidates)} candidates x {len(it.points())} buckets")
            if verbose > 0:
                out += [f"  {c.variant} {c.key[:12]}{' (default)' if c.default else ''}"
                        for c in it.candidates]
        for r in self.records:
            t = r.line
            gain = r.default_us / r.winner_us if r.winner_us else 0.0
            out.append(f"{t.kernel}[{t.variant}] {t.bucket}: default {r.default_us:.2f} us, "
                       f"winner {t.winner_variant} {r.winner_us:.2f} us ({gain:.2f}x)"
                       + (f", dropped {len(r.dropped)}" if r.dropped else "")
                       + (f", within the noise: {', '.join(r.within_noise)}" if r.within_noise else ""))
        close = self.within_noise()
        if close:
            out.append(f"{len(close)} bucket(s) decided within the noise (a rerun may pick otherwise): "
                       + "; ".join(close))
        if self.mode in ("dry-run", "compile", "all"):
            n = sum(len(i.candidates) for i in self.plan)
            out.append(f"{len(self.plan)} tuned variant(s), {n} candidates"
                       + (f": {self.built} built, {self.cached} cached in {self.compile_seconds:.2f}s"
                          if self.mode != "dry-run" else "")
                       + (f", {len(self.dropped)} dropped (failed to compile)" if self.dropped else ""))
        if self.info.get("device"):
            out.append(f"measured on {self.info['device']} in {self.info.get('bench_seconds', 0):.1f}s")
        if self.results_file:
            out.append(f"wrote {self.results_file}")
        if self.lock_changed:
            out.append(f"wrote {self.lock_file}")
        return out


def _by_kernel(plan: list[PlanItem]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for it in plan:
        out.setdefault(it.kernel, []).extend(
            {"variant": c.variant, "base": it.variant, "arch": it.arch, "key": c.key,
             "default": c.default} for c in it.candidates)
    return out


def tune(manifest_path: str | Path, options: BuildOptions = NOTHING_GIVEN, *,
         kernels: tuple[str, ...] = (), buckets: tuple[str, ...] = (), archs: tuple[str, ...] = (),
         dry_run: bool = False, compile_only: bool = False, measure: bool = False,
         record: str | Path | None = None, check: bool = False, results: str | Path | None = None,
         lock_file: str | Path | None = None, lock: bool = True, repeats: int = 30, warmup: int = 3,
         threshold: float = 0.05, seed: int = 0,
         max_rounds: int | None = None, replace_tuning: bool = False) -> TuneReport:
    """Run the steps of `cutecc tune` (see the module docstring). `options` are the settings
    the caller was given (`cutecc.settings.BuildOptions`, as `cutecc.commands.build.build`
    takes them): the cache, the compile workers, the executor, and `options.sign_key` (read
    before any work), which signs the lock recording writes, by the build's road
    (`cutecc.lock.lockfile.record_lock`)."""
    from cutecc.lock.lockfile import LOCK_NAME
    from cutecc.plan import tuning_plan as tplan
    from cutecc.store.writer import Store

    if sum(map(bool, (dry_run, compile_only, measure, record, check))) > 1:
        raise CuteccError("choose one of --dry-run, --compile-only, --measure, --record, --check",
                          where="cutecc tune")
    manifest_path = Path(manifest_path)
    store = Store(options.cache_dir)
    sign_key = options.sign_key
    key = None
    if sign_key and lock and not (dry_run or compile_only or check):  # read first: a bad key fails early
        from cutecc.lock.signing import read_signing_key

        key = read_signing_key(sign_key)
    lock_path = Path(lock_file or manifest_path.parent / LOCK_NAME)
    if record is not None:
        report = TuneReport("record")
        report.records = read_results(record)
        from cutecc.manifest import load_manifest

        _record(report, tplan.items(load_manifest(manifest_path)), store.root, lock_path, lock, key,
                replace_tuning)
        return report
    mode = ("dry-run" if dry_run else "compile" if compile_only else "measure" if measure
            else "check" if check else "all")
    report = TuneReport(mode)
    digest = tplan.manifest_digest(manifest_path)
    if mode in ("measure", "check"):
        report.plan = [it for it in tplan.read_plan(store.root, digest, str(manifest_path))
                       if (not kernels or it.kernel in kernels) and (not archs or it.arch in archs)]
    elif mode == "dry-run":
        from cutecc.manifest import load_manifest

        report.plan = tplan.items(load_manifest(manifest_path), archs, kernels)
    else:
        _compile(report, manifest_path, store, archs, kernels, options)
        if report.failed:
            return report
        tplan.write_plan(store.root, digest, report.plan)
    if mode in ("measure", "all", "check"):
        from cutecc.tuning.measure import measure as run

        known = {bucket_text(p) for it in report.plan for p in it.points()}
        for b in buckets:
            if b not in known:
                raise CuteccError(f"no bucket {b!r} in the tuning spaces (buckets: "
                                  f"{', '.join(sorted(known))})", where="--bucket")

        report.records, report.info = run(store.root, report.plan, buckets=buckets, repeats=repeats,
                                          warmup=warmup, seed=seed, max_rounds=max_rounds)
        report.failed += report.info.pop("failed", [])
        if results is not None:
            from cutecc.atomic import atomic_write

            report.results_file = Path(results)
            atomic_write(report.results_file, TuningResults(
                tuple(report.records), report.info.get("device"), report.info.get("driver"),
                report.info.get("bench_seconds")).dumps())
        if mode == "check":
            report.drift = _drift(store.root, report.records, threshold)
        elif report.records:
            _record(report, report.plan, store.root, lock_path, lock, key, replace_tuning)
    return report


def _compile(report: TuneReport, manifest_path: Path, store: Store, archs: tuple[str, ...],
             kernels: tuple[str, ...], options: BuildOptions) -> None:
    """Compile every candidate of the tuned kernels (and what `cutecc build` would build
    with them: their backward kernels) through the build pipeline, under the keys `build`
    gives them; the manifest parsed once, and planned once for both the jobs and the tuning
    plan. Nothing is recorded as the kernels' current build, and no lock is written.
    Candidates that fail to compile are dropped from `report.plan`."""
    from cutecc.archs import parse_archs
    from cutecc.build import builder
    from cutecc.manifest import load_manifest
    from cutecc.plan import tuning_plan as tplan
    from cutecc.toolchain.dists import HashCache

    t0 = time.perf_counter()
    full = load_manifest(manifest_path)
    names = tplan.tuned(full, kernels)
    read_only = options.read_only
    archs = parse_archs(archs) if archs else ()
    how = builder.settings(full, options)
    hashes = HashCache(store.layout.hash_cache(), write=not read_only)  # read-only: read, never written
    target = builder.target(full, archs=archs, kernels=names, candidates=True, hashes=hashes)
    report.plan = tplan.items_of(full, names, target.planned, archs)
    done = builder.run(target, store, how, hashes=hashes)
    report.compile_seconds = time.perf_counter() - t0
    report.built = sum(o.status == "built" for o in done.outcomes)
    report.cached = sum(o.status == "cached" for o in done.outcomes)
    errors = {o.planned.key: o.error or "?" for o in done.outcomes if o.status == "failed"}
    report.plan, report.failed, report.dropped = _drop_failed(report.plan, errors)


def _drop_failed(plan: list[PlanItem], errors: dict[str, str]
                 ) -> tuple[list[PlanItem], list[str], list[str]]:
    """Take candidates that failed to compile out of the plan (each item keeps them under
    `dropped`, so measured records name them too): a space may hold configurations the
    kernel's own code refuses. A default that failed is a failure: its variant has nothing
    to measure against. Returns (the plan, failures, dropped)."""
    import dataclasses

    kept: list[PlanItem] = []
    failed, dropped = [], []
    for it in plan:
        if it.base in errors:
            failed.append(f"{it.label}: the default configuration failed to compile: {errors[it.base]}")
            kept.append(it)
            continue
        gone = {c.variant: f"failed to compile: {errors[c.key]}"[:1000]
                for c in it.candidates if c.key in errors}
        if gone:
            it = dataclasses.replace(it, candidates=tuple(c for c in it.candidates if c.key not in errors),
                                     dropped=dict(sorted(gone.items())))
            dropped += [f"{it.kernel}[{v}]@{it.arch}: {why}" for v, why in sorted(gone.items())]
        kept.append(it)
    return kept, failed, dropped


def read_results(path: str | Path) -> list[TuningResult]:
    """A results file's records (`TuningResults`, read bounded), every line checked: it
    may come from another host."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RESULTS_BYTES + 1)
    except OSError as e:
        raise CuteccError(f"cannot read the results: {e.strerror}", where=str(path)) from None
    return list(TuningResults.loads(data, str(path), MAX_RESULTS_BYTES).records)


def _record(report: TuneReport, plan_items: list[PlanItem], root: Path, lock_path: Path,
            lock: bool, signing_key: PrivateKey | None = None, replace_tuning: bool = False) -> None:
    """Merge records into the cache (full records) and the lock (winner lines). A winner is
    recorded only if it is a candidate the plan (the manifest's, as it is now) has for that
    default, and its entry and its default's in this cache are the bytes measured: read back
    and hashed (`cutecc.ship.vouch.tuning_line_problem`); and only into a lock whose tuning
    lines then share one measurement policy (`replace_tuning`: the lock's lines of other
    policies are dropped instead). The lock then passes the check a build's does
    (`cutecc.ship.vouch.vouch`: signed, every line read back and hashed; the lock's other
    tuning lines that fail are dropped, `report.dropped_tuning`). Nothing is written when
    anything is refused. The lock is written and signed (`signing_key`) by the build's road,
    `record_lock`."""
    from cutecc.lock.lockfile import record_lock
    from cutecc.ship.vouch import tuning_line_problem, vouch
    from cutecc.store.writer import Store

    store = Store(root)
    plan = {(it.kernel, it.variant, it.arch): (it.base, {c.key: c.variant for c in it.candidates})
            for it in plan_items}
    memo: dict[Any, Any] = {}  # each entry read and hashed once, here and in `vouch`
    lines: list[Tuned] = []
    for r in report.records:
        t = r.line
        base, cands = plan.get((t.kernel, t.variant, t.arch), ("", {}))
        if base != t.base or cands.get(t.winner) != t.winner_variant:
            raise WorkError(f"{t.kernel}[{t.variant}]@{t.arch} {t.bucket}: the winner {t.winner[:12]} is "
                            "not a candidate of the manifest as it is now (stale results?)",
                            where=str(lock_path))
        why = tuning_line_problem(store, t, None, hashed=True, present=True, memo=memo, measured=True)
        if why:
            raise WorkError(f"{t.kernel}[{t.winner_variant}] {t.winner[:12]}: {why}; run "
                            "`cutecc tune --compile-only`", where=str(root))
        lines.append(t)
    new_lock = None
    if lock:
        # The lock's other tuning lines are checked against the cache alone: a plan measured
        # for some kernels or archs does not name the candidates of the rest.
        merged = _merged_lock(lines, lock_path, replace_tuning)
        got = vouch(store, merged, kept=merged.entries, candidates=lambda: None,
                    signing=signing_key is not None, where=lock_path, who="this tune", memo=memo)
        new_lock, report.dropped_tuning = got.lock, list(got.dropped)
    by_base: dict[str, list[TuningResult]] = {}
    for r in report.records:
        by_base.setdefault(r.base, []).append(r)
    for key, recs in by_base.items():
        new = {r.slot: r for r in read_cached(root, key)}
        new.update({r.slot: r for r in recs})
        store.write_tuning_results(key, TuningResults(tuple(new[k] for k in sorted(new))).dumps())
    if new_lock is not None:
        recorded = record_lock(lock_path, new_lock, signing_key)
        report.lock_changed, report.signature_removed = recorded.changed, recorded.removed
        report.lock_file = lock_path


def _merged_lock(lines: list[Tuned], lock_path: Path, replace_tuning: bool) -> Lock:
    """The lock at `lock_path` with `lines` recorded into it (each replacing the line of its
    slot); refused when a line names a default the lock does not lock, or when the lines
    would not share one measurement policy (unless `replace_tuning`: the others go)."""
    from collections import Counter

    from cutecc.lock.lockfile import read_lock
    from cutecc.tuning.policy import mixed

    old = read_lock(lock_path)
    keep = {t.order: t for t in old.tuning}
    keep.update({t.order: t for t in lines})
    new_lock = old.with_tuning(keep.values())
    dropped = len(keep) - len(new_lock.tuning)
    if dropped:
        raise WorkError(f"{dropped} result(s) name default configurations the lock does not "
                        "lock; run `cutecc build` first", where=str(lock_path))
    ours = {t.policy for t in lines}
    if replace_tuning and len(ours) == 1:
        new_lock = new_lock.with_tuning(t for t in new_lock.tuning if t.policy in ours)
    why = mixed(Counter(t.policy for t in new_lock.tuning))
    if why:
        raise WorkError(f"{why}; measure every bucket again under one policy, or pass --replace-tuning "
                        "to drop the lock's lines of the other policies", where=str(lock_path))
    return new_lock


def _drift(root: Path, records: list[TuningResult], threshold: float) -> list[str]:
    """`cutecc.tuning.drift.report` of `records` (measured now) against the cache's records
    of the same buckets."""
    from cutecc.tuning import drift

    recorded = {drift.key(c): c for r in records for c in read_cached(root, r.base)}
    return drift.report(recorded, records, threshold)
