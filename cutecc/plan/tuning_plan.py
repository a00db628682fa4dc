"""The tuning plan: every candidate of every tuned (kernel, variant, arch), with its key.

Candidates are planned exactly as `cutecc build` plans variants (`cutecc.plan.build_plan`), so the
default configuration has the key `build` gave it and a rerun compiles nothing. The plan
is also written into the cache (`tuning/plans/<manifest sha256>.json`), so the measuring
step runs from the cache alone on a GPU host with no DSL and no CUDA toolkit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.entry import is_key, parse_json
from cutecc.errors import CuteccError, WorkError
from cutecc.manifest import Manifest
from cutecc.manifest.tune_space import MAX_BUCKETS, MAX_EXTENT
from cutecc.plan.build_plan import Planned, plan
from cutecc.store.layout import MAX_PLAN_BYTES, PLAN_FORMAT, Layout


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


MAX_CANDIDATES = 100_000


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _extent(v: Any) -> bool:
    return type(v) is int and 0 < v <= MAX_EXTENT


@dataclass(frozen=True)
class Candidate:
    """One configuration of a plan item: its variant id, its cache key, and whether it is
    the default configuration (the one every other is measured against)."""

    variant: str
    key: str
    default: bool

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "key": self.key, "default": self.default}


@dataclass(frozen=True)
class BucketEdges:
    """One bucketed extent of a plan item and the edges its buckets are measured at."""

    extent: str
    edges: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"extent": self.extent, "edges": list(self.edges)}


@dataclass(frozen=True)
class PlanItem:
    """One tuned (kernel, variant, arch) of a tuning plan: its default's key (`base`), its
    candidates, and the space's benchmark settings, as the plan file
    (`tuning/plans/<manifest sha256>.json`, PLAN_FORMAT) and a measuring child's job hold
    it. `params` and `default` are carried as the manifest gave them (nothing measuring
    acts on); `dropped` (candidates that failed to compile, variant -> why) is None when
    none did, and then absent from the JSON."""

    kernel: str
    variant: str
    arch: str
    base: str
    candidates: tuple[Candidate, ...]
    rule: str
    buckets: tuple[BucketEdges, ...]
    sizes: Mapping[str, int | str]
    inputs: Mapping[str, tuple[float, float]]
    rtol: float | None
    atol: float | None
    params: Any
    default: Any
    scalars: Mapping[str, float | bool]
    dropped: Mapping[str, str] | None = None

    @property
    def label(self) -> str:
        return f"{self.kernel}[{self.variant}]@{self.arch}"

    def points(self) -> list[dict[str, int]]:
        """Every bucket to measure, as {extent: edge} in the extents' order (as
        `cutecc.contract.buckets.bucket_text` names it)."""
        names = [b.extent for b in self.buckets]
        return [dict(zip(names, c)) for c in itertools.product(*(b.edges for b in self.buckets))]

    def to_json(self) -> dict[str, Any]:
        """The item as the plan file holds it (the same keys, values and order as ever)."""
        out = {"kernel": self.kernel, "variant": self.variant, "arch": self.arch, "base": self.base,
               "candidates": [c.to_json() for c in self.candidates], "rule": self.rule,
               "buckets": [b.to_json() for b in self.buckets], "sizes": dict(self.sizes),
               "inputs": {k: list(v) for k, v in self.inputs.items()}, "rtol": self.rtol,
               "atol": self.atol, "params": self.params, "default": self.default,
               "scalars": dict(self.scalars)}
        if self.dropped is not None:
            out["dropped"] = dict(self.dropped)
        return out

    @classmethod
    def parse(cls, doc: Any, where: str, key_path: str) -> PlanItem:
        """A plan item read from disk (or a job), every field measuring acts on checked;
        an error names `where` and `key_path`."""
        bad = _bad_item(doc)
        if bad:
            raise WorkError(f"malformed plan item: {bad}", where=where, key_path=key_path)
        dropped = doc.get("dropped")
        return cls(doc["kernel"], doc["variant"], doc["arch"], doc["base"],
                   tuple(Candidate(c["variant"], c["key"], c["default"]) for c in doc["candidates"]),
                   doc["rule"], tuple(BucketEdges(b["extent"], tuple(b["edges"])) for b in doc["buckets"]),
                   dict(doc.get("sizes", {})), {k: (v[0], v[1]) for k, v in doc.get("inputs", {}).items()},
                   doc.get("rtol"), doc.get("atol"), doc.get("params"), doc.get("default"),
                   dict(doc.get("scalars", {})), None if dropped is None else dict(dropped))


def _bad_item(it: Any) -> str | None:
    """What is wrong with one plan item (None: nothing), field by field as measuring reads it."""
    if not isinstance(it, dict):
        return "not a table"
    for f in ("kernel", "variant", "arch"):
        if not isinstance(it.get(f), str):
            return f"{f} is not a string"
    if not is_key(it.get("base")) or it.get("rule") not in ("floor", "nearest"):
        return "base or rule"
    cands = it.get("candidates")
    if not isinstance(cands, list) or len(cands) > MAX_CANDIDATES or not all(
            isinstance(c, dict) and is_key(c.get("key")) and isinstance(c.get("variant"), str)
            and isinstance(c.get("default"), bool) for c in cands):
        return "candidates"
    buckets = it.get("buckets")
    if not isinstance(buckets, list) or not all(
            isinstance(b, dict) and isinstance(b.get("extent"), str) and isinstance(b.get("edges"), list)
            and all(map(_extent, b["edges"])) for b in buckets):
        return "buckets"
    if math.prod(len(b["edges"]) for b in buckets) > MAX_BUCKETS:
        return f"buckets: over {MAX_BUCKETS}"
    sizes, scalars, inputs = it.get("sizes", {}), it.get("scalars", {}), it.get("inputs", {})
    if not isinstance(sizes, dict) or not all(_extent(v) or isinstance(v, str) for v in sizes.values()):
        return "sizes"
    if not isinstance(scalars, dict) or not all(_number(v) or isinstance(v, bool) for v in scalars.values()):
        return "scalars"
    if not isinstance(inputs, dict) or not all(isinstance(v, list) and len(v) == 2 and all(map(_number, v))
                                               for v in inputs.values()):
        return "inputs"
    dropped = it.get("dropped", {})
    if not isinstance(dropped, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in dropped.items()):
        return "dropped"
    if any(it.get(f) is not None and not (_number(it.get(f)) and it[f] >= 0) for f in ("rtol", "atol")):
        return "rtol or atol"
    return None


PLAN_DEPTH = 8  # file > items > item > inputs > name > range, with room (params: the manifest's)


@dataclass(frozen=True)
class TuningPlan:
    """The plan file (`tuning/plans/<manifest sha256>.json`, PLAN_FORMAT), both ways: the
    digest of the manifest's bytes it was planned from, and its items. `--compile-only`
    writes it (`dumps`: the same bytes as ever), `--measure` reads it back (`loads`)."""

    manifest_sha256: str
    items: tuple[PlanItem, ...]

    def dumps(self) -> bytes:
        return json.dumps({"format": PLAN_FORMAT, "manifest_sha256": self.manifest_sha256,
                           "items": [it.to_json() for it in self.items]}, sort_keys=True, indent=1).encode()

    @classmethod
    def loads(cls, data: bytes, where: str, digest: str | None = None) -> TuningPlan:
        """A plan read from `data` (at most MAX_PLAN_BYTES, PLAN_DEPTH deep), every field
        measuring acts on checked; `digest`: the manifest digest it must name (the one it is
        stored under). Anything else is a WorkError naming `where` and the field."""
        try:
            doc = parse_json(data, MAX_PLAN_BYTES, PLAN_DEPTH)
        except ValueError as e:
            raise WorkError(f"not a tuning plan: {e}", where=where) from None
        if (not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT
                or not isinstance(doc.get("items"), list)):
            raise WorkError(f"not a tuning plan of format {PLAN_FORMAT}", where=where)
        named = doc.get("manifest_sha256")
        if not is_key(named) or (digest is not None and named != digest):
            raise WorkError(f"must be the SHA-256 of the manifest it plans{f' ({digest})' if digest else ''}",
                            where=where, key_path="manifest_sha256")
        items = doc["items"]
        return cls(named, tuple(PlanItem.parse(it, where, f"items[{i}]") for i, it in enumerate(items)))
