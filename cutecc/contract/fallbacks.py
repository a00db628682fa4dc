"""A kernel's declared fallback as builds record it: which function serves a call no build
fits, and the SHA-256 of the module that holds it.

`fallback = "pkg.mod:fn"` in `[kernel.NAME]` (JAX) and `fallback_torch` (PyTorch) name
plain functions with the kernel's calling convention. `cutecc build` records them, with
their module file's digest, in the kernel's generation records and on its lock lines
(only when declared: a kernel without one keeps its lines byte for byte), so a lock says
what a miss will run; the runtime imports the module only at the first miss.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutecc.errors import CuteccError

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
REF_RE = re.compile(rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*")  # "pkg.mod:fn[.attr]"
_SHA_RE = re.compile(r"[0-9a-f]{64}")
FIELDS = ("fallback", "fallback_torch")  # the manifest's keys, the lock line's fields
FRONT_ENDS = {"JAX": "fallback", "PyTorch": "fallback_torch"}  # which field each front end serves


@dataclass(frozen=True)
class FallbackRef:
    """`ref` ("pkg.mod:fn") and the SHA-256 of its module's file when it was built."""

    ref: str
    sha256: str

    @property
    def module(self) -> str:
        return self.ref.split(":", 1)[0]

    @property
    def attr(self) -> str:
        return self.ref.split(":", 1)[1]

    def to_json(self) -> dict[str, str]:
        return {"ref": self.ref, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: Any, where: str, kp: str) -> FallbackRef:
        """A recorded fallback, each field checked (a lock's or a record's)."""
        if not (isinstance(d, dict) and set(d) == {"ref", "sha256"}):
            raise CuteccError('expected { "ref": "pkg.mod:fn", "sha256": "<64 hex>" }', where=where,
                              key_path=kp)
        if not isinstance(d["ref"], str) or not REF_RE.fullmatch(d["ref"]):
            raise CuteccError(f'ref {str(d["ref"])[:80]!r} is not "pkg.mod:fn"', where=where,
                              key_path=f"{kp}.ref")
        if not isinstance(d["sha256"], str) or not _SHA_RE.fullmatch(d["sha256"]):
            raise CuteccError("sha256 is not a SHA-256 (64 hex digits)", where=where, key_path=f"{kp}.sha256")
        return cls(d["ref"], d["sha256"])


def refs_from_json(doc: Mapping[str, Any], where: str, kp: str = "") -> dict[str, FallbackRef]:
    """The fallbacks a record or lock line carries, by field (absent fields: none)."""
    return {f: FallbackRef.from_json(doc[f], where, f"{kp}{f}") for f in FIELDS if f in doc}


def refs_to_json(refs: Mapping[str, FallbackRef]) -> dict[str, dict[str, str]]:
    """The fields a record or lock line gains for `refs` (nothing when none is declared)."""
    return {f: refs[f].to_json() for f in FIELDS if f in refs}
