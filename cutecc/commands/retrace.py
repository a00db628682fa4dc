"""`cutecc verify --deep`: compile every entry a manifest plans that the cache holds once
more, in a throwaway cache, and report each whose compile differs from what its key promised.

A key promises that whoever compiles its inputs gets the same artifact. Each entry records
the digest of what the DSL compiled (`cutecc.build.artifact`); the manifest is planned anew here
(every source hashed again, nothing remembered), and every planned entry whose key the
cache holds is built again through the build pipeline (local workers, this host's DSL)
into a temporary directory that is removed afterwards. An entry whose digest comes out
otherwise is reported with what differs: the key missed an input the trace read (a data
file, an environment the key does not name), a source changed while it was built, or the
compile is not deterministic. So is one whose compile read other files than the recorded
one's (the read-set digests differ, `cutecc.build.read_set`), when both record one. An
entry built before digests were recorded is reported as
having none (not an error) and compared by its library's bytes. Entries the manifest does
not plan, and planned ones the cache lacks, are not compiled (they are counted). Nothing
in the cache is changed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.build import builder, outcome
from cutecc.build.artifact import difference
from cutecc.build.executors import LocalExecutor, compile_limits
from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import artifact_malformed
from cutecc.errors import CuteccError, WorkError
from cutecc.manifest import Manifest, load_manifest
from cutecc.plan.build_plan import Planned
from cutecc.store.writer import Store
from cutecc.toolchain.hashcache import HashCache

NO_DIGEST = "no artifact digest"
BAD_DIGEST = "malformed artifact digest"


@dataclass
class Retraced:
    """One entry compiled again: `status` "reproduced", "differs" or "failed" (the second
    compile failed: nothing to compare); `note` says when it was compared by its library's
    bytes for want of a digest (`NO_DIGEST`, `BAD_DIGEST`)."""

    label: str
    key: str
    status: str
    detail: str = ""
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class DeepReport:
    """What `--deep` found, entry by entry in plan order."""

    manifest: str
    results: list[Retraced] = field(default_factory=list)
    not_held: int = 0  # planned entries the cache does not hold: nothing to compare

    @property
    def ok(self) -> bool:
        return all(r.status == "reproduced" for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"manifest": self.manifest, "ok": self.ok, "not_held": self.not_held,
                "entries": [r.to_json() for r in self.results]}

    def lines(self, verbose: int = 0) -> list[str]:
        out = []
        for r in self.results:
            if r.status != "reproduced":
                out.append(f"{r.status:9}  {r.label} {r.key[:12]}: {r.detail}"
                           + (f" ({r.note})" if r.note else ""))
            elif r.note or verbose > 0:
                out.append(f"{r.status:9}  {r.label} {r.key[:12]}" + (f" ({r.note}: {r.detail})"
                                                                       if r.note else ""))
        count = {s: sum(r.status == s for r in self.results) for s in ("reproduced", "differs", "failed")}
        out.append(f"deep: {len(self.results)} entr{'y' if len(self.results) == 1 else 'ies'} compiled "
                   f"again: {count['reproduced']} reproduced, {count['differs']} differ, "
                   f"{count['failed']} failed; {self.not_held} planned not in the cache ({self.manifest})")
        return out


@dataclass(frozen=True)
class PlannedAgain:
    """A manifest planned anew for `retrace` (before the cache is read, so that a bad
    manifest or a host without the DSL fails at once)."""

    path: str
    target: builder.Target


def plan_again(manifest_path: str | Path) -> PlannedAgain:
    """`manifest_path` parsed and planned with every source and every installed file hashed
    again (no planning facts remembered; no installed file told by its stat against its
    RECORD: `cutecc.toolchain.recordstat`); an error when this host cannot compile (no
    build extra)."""
    if importlib.util.find_spec("cutlass") is None:
        raise WorkError("`verify --deep` compiles the entries again: it needs the build extra "
                        "(nvidia-cutlass-dsl) on this host", where="--deep")
    return PlannedAgain(str(manifest_path), builder.target(load_manifest(manifest_path),
                                                             hashes=HashCache(None, trust_records=False)))


def retrace(store: Store, planned: PlannedAgain, *, jobs: int | None = None,
            progress: outcome.Progress | None = None, limits: tuple[float | None, int | None] = (None, None)
            ) -> DeepReport:
    """Compile again each entry `planned` plans that `store` holds, and compare (see the
    module docstring); `progress` sees each compile finish. `limits`: the compile time and
    memory asked for (`BuildOptions.compile_timeout`, `compile_memory`), else the manifest's."""
    target = planned.target
    full = target.manifest
    report = DeepReport(planned.path)
    held: dict[str, tuple[Planned, EntryMeta, bool]] = {}  # and whether its digest is malformed
    seen: set[str] = set()  # variants that share a key are one entry
    for p in target.planned:
        if p.key in seen:
            continue
        seen.add(p.key)
        try:
            entry = store.get(p.key)
            if entry is None:
                report.not_held += 1
                continue
            held[p.key] = (p, entry.meta, artifact_malformed(entry.doc))  # raw: malformed, not absent
        except (CuteccError, ValueError):
            continue  # damaged: the plain checks report it
    if not held:
        return report
    again = _compile_again(target, [p for p, _, _ in held.values()], full, jobs, progress, limits)
    for key, (p, meta, malformed) in held.items():
        report.results.append(_compare(p, meta, again.get(key), malformed))
    return report


def _compile_again(target: builder.Target, planned: list[Planned], manifest: Manifest,
                   jobs: int | None, progress: outcome.Progress | None,
                   asked: tuple[float | None, int | None] = (None, None)) -> dict[str, outcome.Outcome]:
    """Build `planned` into a throwaway cache with local workers (each compile bounded as
    the manifest's builds are); their outcomes by key."""
    b = manifest.build
    limits = compile_limits(*asked, default_seconds=b.compile_timeout, default_memory=b.compile_memory)
    how = builder.Settings(LocalExecutor(limits), jobs or os.cpu_count() or 1)
    only = dataclasses.replace(target, planned=tuple(planned), partial=True, candidates=True)
    scratch = Path(tempfile.mkdtemp(prefix="cutecc-retrace-"))
    try:
        done = builder.run(only, Store(scratch / "cache"), how, progress=progress)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {o.planned.key: o for o in done.outcomes}


def _compare(p: Planned, held: EntryMeta, o: outcome.Outcome | None, malformed: bool = False) -> Retraced:
    """What the second compile `o` of `held`'s key says of it."""
    if o is None or o.status != "built" or o.meta is None:
        why = (o.error if o is not None else None) or "no outcome"
        return Retraced(p.label, p.key, "failed", f"compiled again: {why.splitlines()[0]}")
    note = None
    if held.artifact is not None:
        got = o.meta.artifact
        if got is None:
            return Retraced(p.label, p.key, "failed", "the second compile recorded no artifact digest")
        differs = difference(held.artifact, got)
        if differs:
            return Retraced(p.label, p.key, "differs", differs + "; a key input the trace read is missed, "
                            "a source changed while it was built, or the compile is not deterministic")
    else:
        note = BAD_DIGEST if malformed else NO_DIGEST
    if held.read_set is not None and o.meta.read_set is not None and held.read_set != o.meta.read_set:
        return Retraced(p.label, p.key, "differs",
                        "its compile read other files than this one's (read-set digest "
                        f"{o.meta.read_set[:16]}.., recorded {held.read_set[:16]}..): an import resolved "
                        "elsewhere or a data file came or went", note)
    lib = o.meta.library
    if lib.sha256 != held.library.sha256:  # the digests agree: the link differs
        got_lib = f"{lib.sha256[:16]}.. ({lib.size} bytes)"
        return Retraced(p.label, p.key, "differs", f"library {held.library.name} sha256 {got_lib}, recorded "
                        f"{held.library.sha256[:16]}.. ({held.library.size} bytes)"
                        + ("" if note else "; the compile gave the same artifact: the link differs"), note)
    return Retraced(p.label, p.key, "reproduced", "library bytes the same" if note else "", note)
