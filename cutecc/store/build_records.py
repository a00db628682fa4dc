"""What a build records beside its entries (`GENERATION_FORMAT`), one typed, frozen record
per file, used both ways: the store writes `dumps()` and reads `from_json` (after
`read_record`'s bounds), and nothing outside this module looks inside the JSON.

    generations/<kernel>@<arch>.json  `GenerationRecord`: the keys of the newest build of a
                                      kernel for an arch, and its declared fallbacks
    manifests/<sha>.json              `ManifestRecord`: the keys the newest build of a
                                      manifest planned, per kernel and arch
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
    changed the record (a no-op build leaves it: `cutecc.store.record_writer`); `fallbacks` holds
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


@dataclass(frozen=True)
class ManifestRecord:
    """`manifests/<sha of its path>.json`: the keys a build of `manifest` (whose bytes hash
    to `sha256`) planned, `{kernel: {arch: keys}}` (each list sorted, once each), as of
    `built_at` (the build that last changed it); a partial build adds to the record of the
    same bytes (`merged`)."""

    manifest: str | None
    sha256: str | None
    entries: Mapping[str, Mapping[str, tuple[str, ...]]]
    built_at: str

    @classmethod
    def from_json(cls, doc: Any) -> ManifestRecord | None:
        """The record of `doc`, None when it is not a manifest record of this format (or
        holds no `entries` object); an arch's keys that are not a list are left out."""
        if not (_ours(doc) and isinstance(doc.get("entries"), dict)):
            return None
        entries: dict[str, dict[str, tuple[str, ...]]] = {}
        for k, per_arch in doc["entries"].items():
            if isinstance(per_arch, dict):
                entries[k] = {a: keys for a, v in per_arch.items() if (keys := _strs(v)) is not None}
        return cls(_str(doc.get("manifest")), _str(doc.get("sha256")), entries,
                   str(doc.get("built_at", "")))

    def merged(self, entries: Mapping[str, Mapping[str, list[str]]], built_at: str) -> ManifestRecord:
        """This record with `entries` added (an arch's keys replaced, sorted and once each)."""
        out: dict[str, dict[str, tuple[str, ...]]] = {k: dict(v) for k, v in self.entries.items()}
        for k, per_arch in entries.items():
            out.setdefault(k, {}).update({a: tuple(sorted(set(v))) for a, v in per_arch.items()})
        return ManifestRecord(self.manifest, self.sha256, out, built_at)

    def to_json(self) -> dict[str, Any]:
        return {"format": GENERATION_FORMAT, "manifest": self.manifest, "sha256": self.sha256,
                "entries": {k: {a: list(v) for a, v in per_arch.items()}
                            for k, per_arch in self.entries.items()},
                "built_at": self.built_at}

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
