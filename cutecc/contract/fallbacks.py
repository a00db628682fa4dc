"""A kernel's declared fallback as builds record it: which function serves a call no build
fits, and the pinned closure of the code that serves it.

`fallback = "pkg.mod:fn"` in `[kernel.NAME]` (JAX) and `fallback_torch` (PyTorch) name
plain functions with the kernel's calling convention. `cutecc build` records them in the
kernel's generation records and on its lock lines (only when declared: a kernel without one
keeps its lines byte for byte), each with its closure: the function's module and every
project module it imports, walked as a kernel's key walks its sources
(`cutecc.plan.key.SourceIndex`), as (module, path relative to its python_path root,
SHA-256) triples, and `sha256` the digest over them (the key's own form). So a lock says
what a miss will run, byte for byte; the runtime checks every file of the closure before
any of it runs (`cutecc.runtime.fallback_code`).

A line written before closures were pinned carries `sha256` of the module file alone and
no `files`: it still reads (the lock's other lines serve), and the runtime refuses to serve
such a fallback, saying to rebuild (`FallbackRef.legacy`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cutecc.errors import CuteccError

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
REF_RE = re.compile(rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*")  # "pkg.mod:fn[.attr]"
MODULE_RE = re.compile(rf"{_IDENT}(\.{_IDENT})*")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
FIELDS = ("fallback", "fallback_torch")  # the manifest's keys, the lock line's fields
FRONT_ENDS = {"JAX": "fallback", "PyTorch": "fallback_torch"}  # which field each front end serves
MAX_CLOSURE_FILES = 4096  # a fallback's project closure; a published library's is ~1,000


@dataclass(frozen=True)
class ClosureFile:
    """One source file of a fallback's closure: its module, its path relative to the root
    holding it (`pkg/mod.py`, `pkg/__init__.py`: what the module's name says) and SHA-256."""

    module: str
    path: str
    sha256: str

    @property
    def is_package(self) -> bool:
        return self.path.endswith("/__init__.py")

    def to_json(self) -> list[str]:
        return [self.module, self.path, self.sha256]


def module_path(module: str, package: bool) -> str:
    """Where module `module`'s source lies below its root (`a/b.py`, `a/b/__init__.py`)."""
    return module.replace(".", "/") + ("/__init__.py" if package else ".py")


def closure_digest(files: Iterable[ClosureFile]) -> str:
    """SHA-256 over the closure's files, sorted by path: path, NUL, SHA-256, NUL each (the
    form of a kernel's source digest, `cutecc.plan.key.SourceIndex.digest`)."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f.path.encode() + b"\0" + f.sha256.encode() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class FallbackRef:
    """`ref` ("pkg.mod:fn"), the digest of its closure (`sha256`) and the closure's `files`.
    With no `files`: a line from before closures were pinned (`sha256` is then the module
    file's own), which the runtime refuses to serve (`legacy`)."""

    ref: str
    sha256: str
    files: tuple[ClosureFile, ...] = ()

    @property
    def module(self) -> str:
        return self.ref.split(":", 1)[0]

    @property
    def attr(self) -> str:
        return self.ref.split(":", 1)[1]

    @property
    def legacy(self) -> bool:
        """Whether this pins the module file only (a lock written before closures were pinned)."""
        return not self.files

    @classmethod
    def of(cls, ref: str, files: Iterable[ClosureFile]) -> FallbackRef:
        fs = tuple(sorted(files, key=lambda f: f.path))
        return cls(ref, closure_digest(fs), fs)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ref": self.ref, "sha256": self.sha256}
        if self.files:
            out["files"] = [f.to_json() for f in self.files]
        return out

    @classmethod
    def from_json(cls, d: Any, where: str, kp: str) -> FallbackRef:
        """A recorded fallback, each field checked (a lock's or a record's)."""
        if not (isinstance(d, dict) and set(d) in ({"ref", "sha256"}, {"ref", "sha256", "files"})):
            raise CuteccError('expected { "ref": "pkg.mod:fn", "sha256": "<64 hex>", "files": '
                              "[[module, path, sha256], ...] }", where=where, key_path=kp)
        if not isinstance(d["ref"], str) or not REF_RE.fullmatch(d["ref"]):
            raise CuteccError(f'ref {str(d["ref"])[:80]!r} is not "pkg.mod:fn"', where=where,
                              key_path=f"{kp}.ref")
        if not isinstance(d["sha256"], str) or not _SHA_RE.fullmatch(d["sha256"]):
            raise CuteccError("sha256 is not a SHA-256 (64 hex digits)", where=where, key_path=f"{kp}.sha256")
        if "files" not in d:
            return cls(d["ref"], d["sha256"])
        files = _files_from_json(d["files"], where, f"{kp}.files")
        ref = cls(d["ref"], d["sha256"], files)
        if ref.module not in {f.module for f in files}:
            raise CuteccError(f"the closure holds no file of module {ref.module}", where=where,
                              key_path=f"{kp}.files")
        if closure_digest(files) != ref.sha256:
            raise CuteccError("sha256 is not the digest of the closure's files", where=where,
                              key_path=f"{kp}.sha256")
        return ref


def _files_from_json(raw: Any, where: str, kp: str) -> tuple[ClosureFile, ...]:
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_CLOSURE_FILES:
        raise CuteccError(f"expected a list of 1 to {MAX_CLOSURE_FILES} [module, path, sha256]",
                          where=where, key_path=kp)
    out: list[ClosureFile] = []
    for i, item in enumerate(raw):
        at = f"{kp}[{i}]"
        if not (isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item)):
            raise CuteccError("expected [module, path, sha256]", where=where, key_path=at)
        module, path, sha = item
        if len(module) > 256 or not MODULE_RE.fullmatch(module):
            raise CuteccError(f"{module[:80]!r} is not a module name", where=where, key_path=at)
        if path not in (module_path(module, False), module_path(module, True)):
            raise CuteccError(f"path {path[:80]!r} is not module {module}'s", where=where, key_path=at)
        if not _SHA_RE.fullmatch(sha):
            raise CuteccError("not a SHA-256 (64 hex digits)", where=where, key_path=at)
        out.append(ClosureFile(module, path, sha))
    if [f.path for f in out] != sorted({f.path for f in out}):
        raise CuteccError("the files are not sorted by path, once each", where=where, key_path=kp)
    if len({f.module for f in out}) != len(out):
        raise CuteccError("a module appears twice", where=where, key_path=kp)
    return tuple(out)


def refs_from_json(doc: Mapping[str, Any], where: str, kp: str = "") -> dict[str, FallbackRef]:
    """The fallbacks a record or lock line carries, by field (absent fields: none)."""
    return {f: FallbackRef.from_json(doc[f], where, f"{kp}{f}") for f in FIELDS if f in doc}


def refs_to_json(refs: Mapping[str, FallbackRef]) -> dict[str, dict[str, Any]]:
    """The fields a record or lock line gains for `refs` (nothing when none is declared)."""
    return {f: refs[f].to_json() for f in FIELDS if f in refs}
