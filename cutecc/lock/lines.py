"""The lines of kernels.lock: `LockEntry` (which entry serves a kernel, variant, arch and
platform), read back checked field by field, beside `Pin` (the bytes a line serves) and
`Tuned` (a tuning winner), which the cache's tuning records share (`cutecc.contract.pinned`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutecc.contract.fallbacks import FallbackRef, refs_from_json, refs_to_json
from cutecc.contract.pinned import PIN_FIELDS, Pin, check_fields
from cutecc.entry.meta import EntryMeta
from cutecc.entry.rules import is_key, label
from cutecc.errors import CuteccError, WorkError
from cutecc.platforms import BUILD_PLATFORM, PLATFORMS
from cutecc.store.index_record import IndexFacts
from cutecc.store.view import Entry

__all__ = ["LOCK_LINE_FIELDS", "LockEntry"]


@dataclass(frozen=True)
class LockEntry:
    """One artifact: which entry it is, and what the runtime may trust it to be."""

    kernel: str
    variant: str
    arch: str
    platform: str  # the host platform of the library's host code (`cutecc.platforms`)
    key: str
    pin: Pin
    # the kernel's declared fallbacks by field ("fallback", "fallback_torch"), only when
    # declared: what a call no entry fits runs (`cutecc.contract.fallbacks`)
    fallbacks: tuple[tuple[str, FallbackRef], ...] = ()

    @property
    def label(self) -> str:
        return label(self.kernel, self.variant, self.arch, self.platform)

    @property
    def order(self) -> tuple[str, str, str, str, str]:
        return (self.kernel, self.variant, self.arch, self.platform, self.key)

    @classmethod
    def of(cls, kernel: str, variant: str, arch: str, key: str, meta: EntryMeta | None,
           platform: str = BUILD_PLATFORM) -> LockEntry:
        """The lock line for an entry, from its checked record (None: its metadata could not
        be read or trusted, an error naming it; `platform` names it then)."""
        if meta is None:
            raise WorkError(f"{label(kernel, variant, arch, platform)} {key[:12]}: malformed metadata "
                            "(`cutecc verify` says why)", where="kernels.lock")
        pin = Pin.of(meta)
        assert pin is not None  # a checked record has them all
        return cls(kernel, variant, arch, meta.platform, key, pin)

    @classmethod
    def from_facts(cls, kernel: str, variant: str, arch: str, key: str,
                   facts: IndexFacts, platform: str = BUILD_PLATFORM) -> LockEntry:
        """The lock line for an entry of `platform`, from its index record's facts."""
        return cls(kernel, variant, arch, platform, key, facts.pin())

    def mismatch(self, entry: Entry | EntryMeta) -> str | None:
        """Why the entry (its checked record, or an `Entry` whose metadata may be damaged:
        then named by what differs) differs from this line in anything the runtime acts
        on, or None."""
        m = entry if isinstance(entry, EntryMeta) else entry.recorded
        for name, got in (("kernel", m.kernel), ("variant", m.variant), ("arch", m.arch)):
            if got != getattr(self, name):
                return f"{name} {got!r}, the lock says {getattr(self, name)!r}; refusing it"
        if m.platform != self.platform:
            return f"platform {m.platform!r}, the lock says {self.platform!r}; refusing it"
        diff = self.pin.difference(entry if isinstance(entry, EntryMeta) else entry.doc)
        if diff is not None:
            name, got, want = diff
            what = {"sha256": "library SHA-256", "runtime": "runtime library SHA-256"}.get(name, name)
            return f"{what} {_short(got)} differs from the lock's {_short(want)}; refusing it"
        return None

    def to_json(self) -> dict[str, Any]:
        """The line as the file holds it: the entry's identity, then its pin, flat."""
        return {"kernel": self.kernel, "variant": self.variant, "arch": self.arch,
                "platform": self.platform, "key": self.key, **self.pin.to_json(),
                **refs_to_json(dict(self.fallbacks))}

    @classmethod
    def from_json(cls, e: Any, where: str, kp: str) -> LockEntry:
        """A line read from a lock: exactly its fields (the fallback fields optional), each checked."""
        refs = refs_from_json(e, where, f"{kp}.") if isinstance(e, dict) else {}
        if refs:
            e = {k: v for k, v in e.items() if k not in refs}
        check_fields(e, LOCK_LINE_FIELDS, True, where, kp)
        if not is_key(e["key"]):
            raise CuteccError("key is not a cache key (64 hex digits)", where=where, key_path=f"{kp}.key")
        if not is_key(e["runtime"]):
            raise CuteccError("runtime is not a SHA-256 (64 hex digits)", where=where,
                              key_path=f"{kp}.runtime")
        if e["platform"] not in PLATFORMS:
            raise CuteccError(f"platform {e['platform']!r} is not one of {', '.join(sorted(PLATFORMS))}",
                              where=where, key_path=f"{kp}.platform")
        return cls(e["kernel"], e["variant"], e["arch"], e["platform"], e["key"],
                   Pin(**{f: e[f] for f in PIN_FIELDS}), tuple(sorted(refs.items())))


LOCK_LINE_FIELDS = ("kernel", "variant", "arch", "platform", "key", *PIN_FIELDS)


def _short(v: Any) -> str:
    return f"{v[:16]}..." if isinstance(v, str) and len(v) == 64 else repr(v)
