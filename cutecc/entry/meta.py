"""An entry's meta.json as one typed, frozen record, both ways: read (after
`cutecc.entry.rules`' checks on the parsed object) and written (a build, or an arrival, hands
the store an `EntryMeta` or a `RuntimeMeta`, which writes its `dumps()`). What acts on an
entry (the build's outcome, the lock line, the runtime's builds, pack) reads these
attributes; the JSON object itself is for `cutecc.entry.rules`' checks, what a damaged entry
records (`entry.rules.Recorded`) and the reports that print it. A module of its own beside
`cutecc.entry.rules` (which it builds on), in the base layer: nothing of the build side.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cutecc.entry.rules import (
    ENTRY_FORMAT,
    RUNTIME_ENTRY_FORMAT,
    ArtifactRec,
    artifact_of,
    call_keywords,
    contract_digest,
    label,
    meta_problem,
    platform_of,
    ptx_isa_of,
    runtime_meta_problem,
    runtime_record,
)


@dataclass(frozen=True)
class FileRec:
    """One recorded file of an entry: its name in the entry's directory, SHA-256 and size."""

    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class RuntimeLink:
    """An entry's record of the runtime library its kernel library links against."""

    key: str
    library: str  # its soname, `runtime_soname(key)`
    sha256: str
    size: int


def _files(meta: Mapping[str, Any]) -> tuple[FileRec, ...]:
    return tuple(FileRec(n, r["sha256"], r["size"]) for n, r in sorted(meta["files"].items()))


def _library(files: tuple[FileRec, ...], name: str) -> FileRec:
    for f in files:
        if f.name == name:
            return f
    raise ValueError(f"library {name!r} is not among the recorded files (a record not yet published?)")


def _seconds(secs: Any) -> float:
    return float(secs) if isinstance(secs, (int, float)) and not isinstance(secs, bool) else 0.0


def read_set_of(meta: Mapping[str, Any]) -> str | None:
    """The read-set digest a meta.json records (`cutecc.build.read_set`), if a well-formed one."""
    got = meta.get("read_set")
    if isinstance(got, str) and len(got) == 64 and all(c in "0123456789abcdef" for c in got):
        return got
    return None


def meta_bytes(doc: Mapping[str, Any]) -> bytes:
    """The bytes of a meta.json holding `doc`: sorted keys, one space of indent (the one
    format every entry and runtime library's meta.json is written in)."""
    return json.dumps(doc, indent=1, sort_keys=True).encode()


@dataclass(frozen=True)
class EntryMeta:
    """A kernel entry's meta.json, typed both ways: read (`parse`, after `meta_problem`'s
    checks) and written (a build makes one with `files=()`, the store records the files it
    published (`recorded`) and writes `dumps()`). The JSON values (`params`, `args`,
    `toolchain`, `key_inputs`) are held as read; `to_json` is the file's object."""

    key: str
    kernel: str
    variant: str
    arch: str
    platform: str  # the host platform of the library's host code (`platform_of`)
    symbol: str
    library_name: str  # the file name of its library, one of `files` (`library`)
    files: tuple[FileRec, ...]  # sorted by name; () until the store records them
    runtime: RuntimeLink
    backward: str | None
    built_at: str | None
    build_seconds: float
    artifact: ArtifactRec | None  # what the DSL compiled (`artifact_of`); None: not recorded
    # the PTX ISA of a `compute_` entry's PTX ("9.4", its `.version`), which the CUDA driver
    # must know to JIT-compile it; None: machine code, or built before cutecc recorded it
    ptx_isa: str | None
    entry: str  # the kernel's entry point (`module:function`), as keyed
    params: Mapping[str, Any]  # the variant's parameters
    args: Any  # the contract (JSON, `cutecc.contract.args.args_from_json` reads it)
    toolchain: Mapping[str, Any]
    key_inputs: Mapping[str, Any]
    sources: tuple[str, ...]  # the kernel's source files the key read
    # SHA-256 of how its key covered every file its compile read (`cutecc.build.read_set`);
    # None: built before cutecc recorded it, or with the check off (`$CUTECC_INTERNAL_AUDIT=off`)
    read_set: str | None = None

    @classmethod
    def parse(cls, meta: Any, key: str) -> EntryMeta:
        """The record of `meta` as the entry of `key`; ValueError (the `meta_problem`) when
        it cannot be trusted as that."""
        why = meta_problem(meta, key)
        if why:
            raise ValueError(why)
        rt = runtime_record(meta)
        assert rt is not None  # meta_problem checked it
        backward, built = meta.get("backward"), meta.get("built_at")
        params, sources, tc = meta.get("params"), meta.get("sources"), meta.get("toolchain")
        return cls(key, meta["kernel"], meta["variant"], str(meta["arch"]), platform_of(meta),
                   meta["symbol"], meta["library"], _files(meta),
                   RuntimeLink(rt["key"], rt["library"], rt["sha256"], rt["size"]),
                   backward if isinstance(backward, str) else None,
                   built if isinstance(built, str) else None,
                   _seconds(meta.get("build_seconds")),
                   artifact_of(meta), ptx_isa_of(meta), str(meta.get("entry")),
                   params if isinstance(params, dict) else {}, meta.get("args"),
                   tc if isinstance(tc, dict) else {}, meta["key_inputs"],
                   tuple(s for s in sources if isinstance(s, str)) if isinstance(sources, list) else (),
                   read_set_of(meta))

    def recorded(self, key: str, files: tuple[FileRec, ...]) -> EntryMeta:
        """This record as the entry `key` holding `files` (the store's part of a publish)."""
        return replace(self, key=key, files=tuple(sorted(files, key=lambda f: f.name)))

    def to_json(self) -> dict[str, Any]:
        """meta.json's object (`artifact` and `ptx_isa` only when recorded)."""
        doc: dict[str, Any] = {
            "kernel": self.kernel, "variant": self.variant, "params": copy.deepcopy(dict(self.params)),
            "arch": self.arch, "platform": self.platform, "entry": self.entry,
            "args": copy.deepcopy(self.args), "backward": self.backward, "library": self.library_name,
            "symbol": self.symbol,
            "runtime": {"key": self.runtime.key, "library": self.runtime.library,
                        "sha256": self.runtime.sha256, "size": self.runtime.size},
            "toolchain": copy.deepcopy(dict(self.toolchain)),
            "key_inputs": copy.deepcopy(dict(self.key_inputs)), "sources": list(self.sources)}
        if self.artifact is not None:
            doc["artifact"] = self.artifact.to_json()
        if self.ptx_isa is not None:
            doc["ptx_isa"] = self.ptx_isa
        if self.read_set is not None:
            doc["read_set"] = self.read_set
        doc.update(built_at=self.built_at, build_seconds=self.build_seconds,
                   files={f.name: {"sha256": f.sha256, "size": f.size} for f in self.files},
                   format=ENTRY_FORMAT, key=self.key)
        return doc

    def dumps(self) -> bytes:
        """The bytes of its meta.json (`meta_bytes`)."""
        return meta_bytes(self.to_json())

    @property
    def library(self) -> FileRec:
        """The record of its library among `files`."""
        return _library(self.files, self.library_name)

    @property
    def call(self) -> dict[str, Any]:
        """The call keywords that reach this entry (`call_keywords`)."""
        return call_keywords({"key_inputs": self.key_inputs})

    @property
    def label(self) -> str:
        return label(self.kernel, self.variant, self.arch, self.platform)

    @property
    def acted_on(self) -> dict[str, Any]:
        """What the runtime acts on besides the key (`entry.rules.acted_on` of its meta.json):
        what a lock line pins."""
        lib = self.library
        return {"library": lib.name, "sha256": lib.sha256, "size": lib.size, "symbol": self.symbol,
                "backward": self.backward, "contract": contract_digest(self.args),
                "runtime": self.runtime.sha256}


RUNTIME_KIND = "runtime"  # a runtime library meta.json's `kind`


@dataclass(frozen=True)
class RuntimeMeta:
    """A runtime library entry's meta.json, typed both ways like `EntryMeta`: read after
    `runtime_meta_problem`'s checks, written by the store from a record with `files=()`."""

    key: str
    library_name: str  # its soname, `runtime_soname(key)`
    files: tuple[FileRec, ...]
    built_at: str | None
    build_seconds: float
    key_inputs: Mapping[str, Any]

    @classmethod
    def parse(cls, meta: Any, key: str) -> RuntimeMeta:
        """The record of `meta` as the runtime library of `key`; ValueError when it cannot
        be trusted as that."""
        why = runtime_meta_problem(meta, key)
        if why:
            raise ValueError(why)
        built = meta.get("built_at")
        return cls(key, meta["library"], _files(meta), built if isinstance(built, str) else None,
                   _seconds(meta.get("build_seconds")), meta["key_inputs"])

    def recorded(self, key: str, files: tuple[FileRec, ...]) -> RuntimeMeta:
        """This record as the runtime library `key` holding `files`."""
        return replace(self, key=key, files=tuple(sorted(files, key=lambda f: f.name)))

    def to_json(self) -> dict[str, Any]:
        return {"kind": RUNTIME_KIND, "key_inputs": copy.deepcopy(dict(self.key_inputs)),
                "library": self.library_name, "built_at": self.built_at,
                "build_seconds": self.build_seconds,
                "files": {f.name: {"sha256": f.sha256, "size": f.size} for f in self.files},
                "format": RUNTIME_ENTRY_FORMAT, "key": self.key}

    def dumps(self) -> bytes:
        return meta_bytes(self.to_json())

    @property
    def library(self) -> FileRec:
        return _library(self.files, self.library_name)
