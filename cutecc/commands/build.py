"""`cutecc build`: plan every (kernel, variant, arch), compile the misses, publish them,
and write the lock file.

The manifest is parsed once and planned once (`cutecc.build.builder.target`), then run through
the build pipeline (`cutecc.build.builder.run`: probe the store, fetch from a remote cache,
compile on the chosen executor, publish, record the generations and the lock). This
module owns what the command adds: its arguments (the signing key read before any
compile), and the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.archs import parse_archs
from cutecc.build import builder
from cutecc.build.executors.local import LocalExecutor, discard_prestarted, prestart
from cutecc.build.outcome import Outcome, Progress, RemoteUse
from cutecc.build.timings import Timings, entry_line
from cutecc.commands.report import Report
from cutecc.errors import CuteccError
from cutecc.lock.environment import Drift, drift_line, pins_line
from cutecc.lock.lockfile import LOCK_NAME, Lock, previous, unsigned_line
from cutecc.lock.pins import installed_unlike, read_pins
from cutecc.manifest import Manifest, load_manifest
from cutecc.settings import NOTHING_GIVEN, BuildOptions
from cutecc.ship import planshare
from cutecc.store.writer import Store
from cutecc.toolchain.dists import HashCache


@dataclass
class BuildReport(Report):
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    cache_dir: Path | None = None
    lock_file: Path | None = None  # the lock this build wrote or confirmed (None: not written)
    lock_changed: bool = False
    signature: Path | None = None  # the lock's signature, when this build signed it
    signature_removed: Path | None = None  # a signature of the lock's old bytes, removed (no key given)
    dry_run: bool = False
    executor: str = "local"
    remote: RemoteUse | None = None
    runtimes_built: list[str] = field(default_factory=list)  # runtime libraries this build linked
    dropped_tuning: list[str] = field(default_factory=list)  # tuning lines the lock lost, and why
    drift: list[Drift] = field(default_factory=list)  # key-deciding distributions unlike the lock's
    drift_note: str | None = None  # the line that named them, before any compile
    drift_told: bool = False  # said then (by the progress), so not again with the warnings
    timings: Timings = field(default_factory=Timings)  # wall seconds per stage (`cutecc.build.timings`)
    show_timings: bool = False  # print them (`--timings`); the JSON report always has them

    @property
    def workers(self) -> str | None:
        """What compiled this build's entries ("fork", "spawn (why)", "ray"), if any did."""
        kinds = sorted({o.worker for o in self.outcomes if o.worker})
        return ", ".join(kinds) or None

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
            "signature_removed": str(self.signature_removed) if self.signature_removed else None,
            "executor": self.executor,
            "fetched": sum(o.fetched for o in self.outcomes),
            "remote": self.remote.to_json() if self.remote else None,
            "runtimes_built": self.runtimes_built,
            "dropped_tuning": self.dropped_tuning,
            "drift": [{"distribution": d.name, "locked": d.locked, "installed": d.installed}
                      for d in self.drift],
            "timings": self.timings.to_json(),
            "workers": self.workers,
            "entries": [o.to_json() for o in self.outcomes],
        }

    def warnings(self) -> list[str]:
        return ([f"warning: {self.drift_note}"] if self.drift_note and not self.drift_told else []) + (
                [f"FAILED {o.planned.label}: {o.error}" for o in self.outcomes if o.status == "failed"]
                + [f"warning: dropped the tuning line {d}" for d in self.dropped_tuning]
                + ([f"warning: {unsigned_line(self.signature_removed, self.lock_file)}"]
                   if self.signature_removed else [])
                + (self.remote.warnings() if self.remote else []))

    def lines(self, verbose: int = 0) -> list[str]:
        out = [f"would build {o.planned.label} {o.planned.key[:12]}"
               for o in self.outcomes if o.status == "planned"]
        if verbose > 0:
            out += [f"{o.status:7} {o.planned.label} {o.planned.key[:12]}"
                    for o in self.outcomes if o.status in ("built", "cached")]
            for o in self.outcomes:  # where each compile error came from, whole
                if o.status == "failed" and o.traceback:
                    out += [f"traceback of {o.planned.label}:", *o.traceback.split("\n")]
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
        if self.show_timings or verbose > 0:
            out.append(f"timings: {self.timings.line()}; total {self.seconds:.2f}s")
            if self.workers:
                out.append(f"workers: {self.workers}")
        if self.show_timings:
            out += [f"  {o.planned.label}: {entry_line(o.timings)}" for o in self.outcomes if o.timings]
        return out


def build(
    manifest_path: str | Path,
    options: BuildOptions = NOTHING_GIVEN,
    *,
    archs: tuple[str, ...] = (),
    platforms: tuple[str, ...] = (),
    kernels: tuple[str, ...] = (),
    dry_run: bool = False,
    progress: Progress | None = None,
    lock: bool = True,
    lock_file: str | Path | None = None,
    timings: bool = False,
) -> BuildReport:
    """Build a manifest into a cache; see the module docstring and `cutecc.build.builder`.

    `options` are the settings the caller was given (`cutecc.settings.BuildOptions`: the
    flags, else the environment, read at the edge); what they leave unset comes from the
    manifest's `[build]` table, else the defaults. This reads no environment variable.
    `options.read_only`: write nothing to the cache and make any miss an error (exit 1)
    instead of a compile, e.g. for a deploy that must only read.
    `lock`: after a fully successful build (not a dry run), write `kernels.lock` beside
    the manifest (or `lock_file`) if its content changed; see `cutecc.lock.lockfile`.
    `options.sign_key`: sign the lock written (`kernels.lock.sig`).
    `options.executor` (`local` or `ray`) compiles the misses; `options.ray_address` names a
    Ray cluster, else a local one is started. `options.remote` (`s3://bucket/prefix`) is a
    shared cache looked up for local misses; `options.remote_write` uploads what is built.
    `options.compile_timeout` (seconds) and `compile_memory` (bytes) bound each compile: one
    past a limit is stopped and fails alone.
    `platforms`: the host platforms to build for (`cutecc.platforms`), overriding the manifest's.
    `timings`: the text report says where the build spent its time (always in the JSON).
    """
    t0 = time.perf_counter()
    clock = Timings()
    sign_key = options.sign_key
    if sign_key and (not lock or dry_run):
        raise CuteccError("signing needs the lock this build writes (not --no-lock or --dry-run)",
                          where="--sign-key")
    key = None
    if sign_key:  # read it first: a bad key fails before any compile
        from cutecc.lock import signing

        key = signing.read_signing_key(sign_key)
    read_only = options.read_only
    archs = parse_archs(archs) if archs else ()
    with clock.stage("parse"):
        full = load_manifest(manifest_path)
    lock_path = Path(lock_file or Path(manifest_path).parent / LOCK_NAME)
    # The lock this build rewrites, read before any work: a bad one fails in a second, not
    # after every compile (a dry run only reads it for the drift line, and never fails on it).
    old_lock = None
    if lock:
        try:
            old_lock = previous(lock_path)
        except CuteccError:
            if not dry_run:
                raise
    how = builder.settings(full, options, dry_run=dry_run)
    store = Store(options.cache_dir)
    # What planning learns is kept in the store: in a new one, once the build has made it. A
    # dry run or a read-only build plans with what was remembered, and writes nothing back.
    hashes = HashCache(store.layout.hash_cache(), write=not (read_only or dry_run))
    # A cold plan (nothing remembered: a new cache) takes seconds, and its build most likely
    # compiles: the compile service imports meanwhile (`cutecc.build.executors.local.prestart`).
    early = not (dry_run or read_only or archs or platforms) and isinstance(how.executor, LocalExecutor) \
        and not any(p.exists() for p in (store.layout.hash_cache(), store.layout.plan_facts())) \
        and prestart(full.select(kernels) if kernels else full, how.executor.limits)
    try:
        return _build(full, manifest_path, store, how, hashes, clock, t0, archs=archs, kernels=kernels,
                      platforms=platforms, lock_to=builder.LockRequest(lock_path, key) if lock and not dry_run
                      else None, old_lock=old_lock, lock_path=lock_path, progress=progress,
                      dry_run=dry_run, timings=timings)
    finally:
        if early:
            discard_prestarted()


def _build(full: Manifest, manifest_path: str | Path, store: Store, how: builder.Settings, hashes: HashCache,
           clock: Timings, t0: float, *, archs: tuple[str, ...], kernels: tuple[str, ...],
           platforms: tuple[str, ...], lock_to: builder.LockRequest | None, old_lock: Lock | None,
           lock_path: Path, progress: Progress | None, dry_run: bool, timings: bool) -> BuildReport:
    """Plan and run the build (`build`'s second half)."""
    with clock.stage("plan"):
        # sources' parsed facts shared through the remote cache (`cutecc.ship.planshare`)
        tell = (progress or Progress()).note

        def warn(text: str) -> None:
            tell(f"warning: {text}")

        shared = None if how.remote is None else planshare.attach(how.remote, hashes, warn)
        target = builder.target(full, archs=archs, kernels=kernels, hashes=hashes,
                                platforms=platforms)
        if shared is not None and how.remote is not None and how.remote.write and not how.read_only:
            planshare.push(shared, hashes, warn)
    drift: list[Drift] = []
    note = None
    here = builder.environment_of(target.planned)
    if old_lock is not None and old_lock.environment is not None:
        drift = old_lock.environment.drift(here)
    pins = str(Path(manifest_path).parent / full.build.pins) if full.build.pins else None
    pinned = read_pins(pins) if pins else None
    if drift:
        note = drift_line(lock_path, drift, pins=pins, pinned=pinned)
    elif pinned is not None:  # no lock to compare with, or it agrees: the pins may not
        unlike = installed_unlike(pinned, dict(here.distributions))
        note = pins_line(pinned, unlike) if unlike else None
    told = bool(note) and (progress or Progress()).note(f"warning: {note}")  # before any compile
    done = builder.run(target, store, how, hashes=hashes, lock=lock_to, progress=progress,
                       timings=clock)
    said = done.remote is not None and bool(done.remote.down or done.remote.upload_errors)
    if (line := planshare.down_line(shared)) and not said:  # one line for a remote out of reach
        warn(line)
    return BuildReport(
        outcomes=done.outcomes, seconds=time.perf_counter() - t0, cache_dir=store.root,
        lock_file=done.lock_file, lock_changed=done.lock_changed, signature=done.signature,
        signature_removed=done.signature_removed,
        dry_run=dry_run, executor=how.executor.kind, remote=done.remote,
        runtimes_built=done.runtimes_built, dropped_tuning=done.dropped_tuning, drift=drift,
        drift_note=note, drift_told=told, timings=clock, show_timings=timings)
