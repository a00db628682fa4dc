"""The tuning plan: every candidate of every tuned (kernel, variant, arch), with its key.

Candidates are planned exactly as `cutecc build` plans variants (`cutecc.plan.build_plan`), so the
default configuration has the key `build` gave it and a rerun compiles nothing. The plan
is also written into the cache (`tuning/plans/<manifest sha256>.json`), so the measuring
step runs from the cache alone on a GPU host with no DSL and no CUDA toolkit.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError, WorkError
from cutecc.manifest import Manifest
from cutecc.plan.build_plan import Planned, plan
from cutecc.store.layout import MAX_PLAN_BYTES, Layout
from cutecc.store.tuning_records import (
    MAX_CANDIDATES,
    PLAN_DEPTH,
    BucketEdges,
    Candidate,
    PlanItem,
    TuningPlan,
)

# The plan's records are the store's (`cutecc.store.tuning_records`: one parse per file),
# named here too.
__all__ = ["MAX_CANDIDATES", "PLAN_DEPTH", "BucketEdges", "Candidate", "PlanItem", "TuningPlan", "items",
           "items_of", "manifest_digest", "plan_path", "read_plan", "tuned", "with_candidates", "write_plan"]


def with_candidates(manifest: Manifest) -> Manifest:
    """The manifest with each tuned kernel's candidates as extra variants."""
    kernels = []
    for k in manifest.kernels:
        extra = tuple(c for _, cands in k.candidates for c in cands)
        kernels.append(dataclasses.replace(k, variants=k.variants + extra) if extra else k)
    return dataclasses.replace(manifest, kernels=tuple(kernels))


def items(manifest: Manifest, archs: tuple[str, ...] = (), kernels: tuple[str, ...] = (), *,
          hash_cache: Any = None) -> list[PlanItem]:
    """One plan item per tuned (kernel, variant, arch): its default key, its candidates'
    keys and the space's benchmark settings."""
    names = tuned(manifest, kernels)
    sub = Manifest(manifest.path, manifest.python_path,
                   tuple(k for k in manifest.kernels if k.name in names), manifest.env)
    return items_of(manifest, names, plan(with_candidates(sub), archs, hash_cache=hash_cache), archs)


def tuned(manifest: Manifest, kernels: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The kernels of `manifest` (of `kernels`, if given) that declare a tuning space; an
    error names a kernel asked for without one, or a manifest with none."""
    names = tuple(k.name for k in manifest.kernels if k.tuning is not None
                  and (not kernels or k.name in kernels))
    if kernels:
        for name in kernels:
            if manifest.kernel(name).tuning is None:
                raise CuteccError(f'kernel "{name}" declares no tuning space ([kernel.{name}.tune])',
                                  where=str(manifest.path))
    if not names:
        raise CuteccError("no kernel declares a tuning space ([kernel.NAME.tune])",
                          where=str(manifest.path))
    return names


def items_of(manifest: Manifest, names: tuple[str, ...], planned: Sequence[Planned],
             archs: tuple[str, ...] = ()) -> list[PlanItem]:
    """The plan items of the tuned kernels `names`, from a plan of (at least) their
    candidates (`plan(with_candidates(...), archs)`): a build that plans them once reads
    both its jobs and the tuning plan from it."""
    by: dict[tuple[str, str, str], Planned] = {(p.kernel.name, p.variant.id, p.arch): p for p in planned}
    out: list[PlanItem] = []
    for k in manifest.kernels:
        if k.name not in names:
            continue
        spec = k.tuning
        assert spec is not None
        for vid, cands in k.candidates:
            for arch in archs or k.archs:
                base = by[(k.name, vid, arch)]
                s = spec.to_json()
                out.append(PlanItem(
                    k.name, vid, arch, base.key,
                    (Candidate(vid, base.key, True),) + tuple(
                        Candidate(c.id, by[(k.name, c.id, arch)].key, False) for c in cands),
                    s["rule"], tuple(BucketEdges(b["extent"], tuple(b["edges"])) for b in s["buckets"]),
                    s["sizes"], {n: (r[0], r[1]) for n, r in s["inputs"].items()}, s["rtol"], s["atol"],
                    s["params"], s["default"], s["scalars"]))
    return out


def manifest_digest(path: Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise CuteccError(f"cannot read the manifest: {e.strerror}", where=str(path)) from None


def plan_path(root: Path, digest: str) -> Path:
    """The cache's stored plan of the manifest whose bytes hash to `digest`."""
    return Layout(root).tuning_plan(digest)


def write_plan(root: Path, digest: str, plan_items: Sequence[PlanItem]) -> Path:
    """Store the plan of a manifest (by its bytes' digest) in the cache (`TuningPlan`)."""
    from cutecc.store.writer import Store

    return Store(root).write_tuning_plan(digest, TuningPlan(digest, tuple(plan_items)).dumps())


def read_plan(root: Path, digest: str, where: str) -> list[PlanItem]:
    """The stored plan of a manifest; an error says to compile first when there is none (the
    manifest changed since, or was never compiled for tuning into this cache). Read as the
    cache's metadata is (`cutecc.trust`: no link followed, nothing someone else could have
    written) and checked (`TuningPlan.loads`), under the digest it is stored by."""
    from cutecc import trust

    path = plan_path(root, digest)
    try:
        data = trust.read_file(root, Layout(root).tuning_plan_parts(digest), MAX_PLAN_BYTES)
    except FileNotFoundError:
        raise WorkError("this cache holds no tuning plan for the manifest as it is now; run "
                        "`cutecc tune --compile-only` (on a host with the build extra) first",
                        where=where) from None
    except OSError as e:
        raise WorkError(f"cannot read the tuning plan: {e.strerror}", where=str(path)) from None
    return list(TuningPlan.loads(data, str(path), digest).items)


