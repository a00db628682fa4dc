"""What a build records beside its entries (`GENERATION_FORMAT`), one typed, frozen record
per file, used both ways: the store writes `dumps()` and reads `from_json` (after
`read_record`'s bounds), and nothing outside this module looks inside the JSON.

    generations/<kernel>@<arch>.json  `GenerationRecord`: the keys of the newest build of a
                                      kernel for an arch, and its declared fallbacks
    manifests/<sha>.json              `ManifestRecord`: the keys the newest build of a
                                      manifest planned, per kernel and arch, with the
                                      sources they read and a few earlier builds
    composites/<name>.json            `CompositeRecord`: a composite kernel's launches

Reading is as lenient, field by field, as the readers always were: a record of another
format (or not an object) is None, a field of the wrong type reads as None (or is left
out), so each reader refuses exactly what it refused before, and a record someone damaged
names no key it does not hold (`gc --unreachable` keeps what any record names).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cutecc.contract.composite_line import CompositeLine
from cutecc.contract.fallbacks import FIELDS as FALLBACK_FIELDS
from cutecc.contract.fallbacks import FallbackRef
from cutecc.store.layout import GENERATION_FORMAT

COMPOSITE_DEPTH = 3  # one object of lists
FALLBACKS_DEPTH = 4  # what the runtime reads of a generation: objects of closures ([[module, path, sha]])


def dumps(doc: Mapping[str, Any]) -> bytes:
    """A build record's bytes: sorted keys, one space of indent, a final newline."""
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _strs(v: Any) -> tuple[str, ...] | None:
    """The strings of a list (others dropped), None when it is not a list."""
    return tuple(x for x in v if isinstance(x, str)) if isinstance(v, list) else None


def _ours(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("format") == GENERATION_FORMAT


@dataclass(frozen=True)
class GenerationRecord:
    """`generations/<kernel>@<arch>.json`: `keys` (sorted, once each) are the current
    entries of `kernel` for `arch`, built from `manifest`; `built_at` is when a build last
    changed the record (a no-op build leaves it: `cutecc.store.writer`); `fallbacks` holds
    the kernel's declared fallback fields (`cutecc.contract.fallbacks.FIELDS`) as recorded,
    only those set (`fallback` checks one), and `roots`, the build's python_path, where the
    runtime looks for their pinned closures first. Read back, a field of the wrong type is None."""

    kernel: str | None
    arch: str | None
    keys: tuple[str, ...] | None  # None: not a list (a cache from before generations: every entry counts)
    manifest: str | None
    built_at: str  # as recorded, read as text ("" when absent)
    fallbacks: Mapping[str, Any] = field(default_factory=dict)
    roots: tuple[str, ...] = ()  # only with fallbacks: the python_path they were found in

    @classmethod
    def of_build(cls, kernel: str, arch: str, keys: list[str], manifest: str, built_at: str,
                 fallbacks: Mapping[str, Mapping[str, Any]] | None = None,
                 roots: tuple[str, ...] = ()) -> GenerationRecord:
        """The record a build writes (`keys` sorted and deduplicated)."""
        return cls(kernel, arch, tuple(sorted(set(keys))), manifest, built_at, dict(fallbacks or {}),
                   roots if fallbacks else ())

    @classmethod
    def from_json(cls, doc: Any) -> GenerationRecord | None:
        """The record of `doc`, None when it is not a generation record of this format."""
        if not _ours(doc):
            return None
        return cls(_str(doc.get("kernel")), _str(doc.get("arch")), _strs(doc.get("keys")),
                   _str(doc.get("manifest")), str(doc.get("built_at", "")),
                   {f: doc[f] for f in FALLBACK_FIELDS if f in doc},
                   _strs(doc.get("fallback_roots")) or ())

    def to_json(self) -> dict[str, Any]:
        return {"format": GENERATION_FORMAT, "kernel": self.kernel, "arch": self.arch,
                "keys": None if self.keys is None else list(self.keys), "manifest": self.manifest,
                "built_at": self.built_at, **self.fallbacks,
                **({"fallback_roots": list(self.roots)} if self.roots else {})}

    def dumps(self) -> bytes:
        return dumps(self.to_json())

    def fallback(self, name: str) -> FallbackRef | None:
        """The recorded fallback of field `name` (`fallback`, `fallback_torch`), None when
        none; CuteccError when it is malformed (`FallbackRef.from_json`)."""
        if name not in self.fallbacks:
            return None
        return FallbackRef.from_json(self.fallbacks[name], "generations", name)


EARLIER_BUILDS = 7  # earlier builds a manifest record keeps: a revert without a rebuild finds its keys


def _sources(v: Any) -> dict[str, str]:
    """A record's `{path: sha256}` of keyed source files (pairs that are not strings dropped)."""
    if not isinstance(v, dict):
        return {}
    return {p: d for p, d in v.items() if isinstance(p, str) and isinstance(d, str)}


def _entries(v: Any) -> dict[str, dict[str, tuple[str, ...]]] | None:
    """A record's `{kernel: {arch: keys}}`, None when it is not an object; an arch's keys
    that are not a list are left out."""
    if not isinstance(v, dict):
        return None
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for k, per_arch in v.items():
        if isinstance(per_arch, dict):
            out[k] = {a: keys for a, x in per_arch.items() if (keys := _strs(x)) is not None}
    return out


@dataclass(frozen=True)
class ManifestRecord:
    """`manifests/<sha of its path>.json`: the keys a build of `manifest` (whose bytes hash
    to `sha256`) planned, `{kernel: {arch: keys}}` (each list sorted, once each), as of
    `built_at` (the build that last changed it); a partial build adds to the record of the
    same bytes (`merged`). `sources` holds the SHA-256 of every project source file those
    keys read, as the build read it (`{path: sha256}`), so a reader can tell whether the
    keys are still the manifest's current plan without planning; `earlier` keeps the
    manifest's last `EARLIER_BUILDS` other builds (newest first, each without its own
    `earlier`), so an edit built and then reverted without a rebuild finds its keys again."""

    manifest: str | None
    sha256: str | None
    entries: Mapping[str, Mapping[str, tuple[str, ...]]]
    built_at: str
    sources: Mapping[str, str] = field(default_factory=dict)
    earlier: tuple[ManifestRecord, ...] = ()

    @classmethod
    def from_json(cls, doc: Any) -> ManifestRecord | None:
        """The record of `doc`, None when it is not a manifest record of this format (or
        holds no `entries` object); an arch's keys that are not a list are left out, and so
        is an earlier build that is not an object with `entries`."""
        if not _ours(doc):
            return None
        rec = cls._one(doc)
        if rec is None:
            return None
        earlier = doc.get("earlier")
        olds = [o for d in (earlier if isinstance(earlier, list) else [])[:EARLIER_BUILDS]
                if (o := cls._one(d, rec.manifest)) is not None]
        return ManifestRecord(rec.manifest, rec.sha256, rec.entries, rec.built_at, rec.sources,
                              tuple(olds))

    @classmethod
    def _one(cls, doc: Any, manifest: str | None = None) -> ManifestRecord | None:
        entries = _entries(doc.get("entries")) if isinstance(doc, dict) else None
        if entries is None:
            return None
        return cls(_str(doc.get("manifest")) if manifest is None else manifest, _str(doc.get("sha256")),
                   entries, str(doc.get("built_at", "")), _sources(doc.get("sources")))

    def merged(self, entries: Mapping[str, Mapping[str, list[str]]], built_at: str,
               sources: Mapping[str, str] | None = None) -> ManifestRecord:
        """This record with `entries` added (an arch's keys replaced, sorted and once each)
        and `sources` (the digests that build read) over its own."""
        out: dict[str, dict[str, tuple[str, ...]]] = {k: dict(v) for k, v in self.entries.items()}
        for k, per_arch in entries.items():
            out.setdefault(k, {}).update({a: tuple(sorted(set(v))) for a, v in per_arch.items()})
        return ManifestRecord(self.manifest, self.sha256, out, built_at,
                              {**self.sources, **(sources or {})}, self.earlier)

    def after(self, was: ManifestRecord | None) -> ManifestRecord:
        """This record as the newest build, with `was` (the record it replaces) and its
        earlier builds kept behind it: newest first, none that plans what this one plans
        from the same bytes and sources, at most `EARLIER_BUILDS`."""
        if was is None:
            return self
        olds: list[ManifestRecord] = []
        for o in (was._alone(), *was.earlier):
            if not (o.same_plan(self) or any(o.same_plan(x) for x in olds)):
                olds.append(o)
        return ManifestRecord(self.manifest, self.sha256, self.entries, self.built_at, self.sources,
                              tuple(olds[:EARLIER_BUILDS]))

    def superseded_by(self, new: ManifestRecord) -> bool:
        """Whether `new` (a build of the same bytes) plans other keys for a kernel and arch
        this record plans, or read a source file this one read with other bytes: then this
        one is an earlier build worth keeping; else `new` only adds to it."""
        if new.sha256 != self.sha256:
            return True
        for k, per_arch in self.entries.items():
            for a, keys in per_arch.items():
                if a in new.entries.get(k, {}) and new.entries[k][a] != keys:
                    return True
        return any(new.sources.get(p, d) != d for p, d in self.sources.items())

    def _alone(self) -> ManifestRecord:
        return ManifestRecord(self.manifest, self.sha256, self.entries, self.built_at, self.sources)

    def same_plan(self, other: ManifestRecord) -> bool:
        """Whether both record the same manifest bytes, sources and keys."""
        return (self.sha256, dict(self.sources), self._json_entries()) == (
            other.sha256, dict(other.sources), other._json_entries())

    def builds(self) -> tuple[ManifestRecord, ...]:
        """This build and the earlier ones, newest first."""
        return (self._alone(), *self.earlier)

    def _json_entries(self) -> dict[str, dict[str, list[str]]]:
        return {k: {a: list(v) for a, v in per_arch.items()} for k, per_arch in self.entries.items()}

    def _one_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"sha256": self.sha256, "entries": self._json_entries(),
                               "built_at": self.built_at}
        if self.sources:
            doc["sources"] = dict(sorted(self.sources.items()))
        return doc

    def to_json(self) -> dict[str, Any]:
        doc = {"format": GENERATION_FORMAT, "manifest": self.manifest, **self._one_json()}
        if self.earlier:
            doc["earlier"] = [o._one_json() for o in self.earlier]
        return doc

    def dumps(self) -> bytes:
        return dumps(self.to_json())

    def kernels(self) -> frozenset[str]:
        """The kernels the build planned."""
        return frozenset(self.entries)

    def keys_of(self, kernel: str) -> frozenset[str]:
        """The keys planned for `kernel`, every arch."""
        return frozenset(k for keys in self.entries.get(kernel, {}).values() for k in keys)

    def all_keys(self) -> frozenset[str]:
        """Every key the build planned."""
        return frozenset(k for kernel in self.entries for k in self.keys_of(kernel))

    def named_keys(self) -> frozenset[str]:
        """Every key the record names: this build's and the earlier builds' it keeps."""
        return frozenset(k for b in self.builds() for k in b.all_keys())


@dataclass(frozen=True)
class CompositeRecord:
    """`composites/<name>.json`: composite kernel `name` (its launches, inputs and outputs
    by name), recorded by a build of `manifest` (or an unpack of a pack): it has no entry
    of its own, its launches are kernels with theirs. `line` checks it as a lock's line is
    checked; read back, a name or manifest that is not a string is None."""

    name: str | None
    launches: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    manifest: str | None

    @classmethod
    def from_json(cls, doc: Any) -> CompositeRecord | None:
        """The record of `doc`, None when it is not a composite record of this format or
        its launches, inputs or outputs are not lists of strings."""
        if not _ours(doc):
            return None
        launches, inputs, outputs = (doc.get(k) for k in ("launches", "inputs", "outputs"))
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                   for v in (launches, inputs, outputs)):
            return None
        return cls(_str(doc.get("name")), tuple(launches), tuple(inputs), tuple(outputs),
                   _str(doc.get("manifest")))

    def to_json(self) -> dict[str, Any]:
        return {"format": GENERATION_FORMAT, "name": self.name, "launches": list(self.launches),
                "inputs": list(self.inputs), "outputs": list(self.outputs), "manifest": self.manifest}

    def dumps(self) -> bytes:
        return dumps(self.to_json())

    def line(self, where: str) -> CompositeLine:
        """The composite as a lock line (`CompositeLine.from_json`: every field checked,
        CuteccError naming `where` when one is not what a line may hold)."""
        return CompositeLine.from_record(self.to_json(), where)
