"""What a build reports: each planned entry's `Outcome`, what it did with the remote
cache (`RemoteUse`), what it tells as it goes (`Progress`), and the whole of it (`Built`),
which `cutecc.build.builder.run` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.build.timings import Timings
from cutecc.entry.meta import EntryMeta
from cutecc.plan.build_plan import Planned
from cutecc.ship import remote as remote_cache
from cutecc.store.index_record import IndexFacts
from cutecc.units import human_size


@dataclass
class Outcome:
    planned: Planned
    status: str  # "built", "cached", "failed", "planned" (dry run)
    seconds: float = 0.0
    error: str | None = None
    meta: EntryMeta | None = None  # the entry's checked metadata, for the lock
    facts: IndexFacts | None = None  # or, for a hit, what its index record holds
    saved: float = 0.0  # for a hit: the compile seconds it saved (its recorded build time)
    fetched: bool = False  # a hit found on the remote cache (status "cached")
    timings: dict[str, float] = field(default_factory=dict)  # a compile's parts (`cutecc.build.timings`)
    worker: str | None = None  # what compiled it: "fork", "spawn" or "ray"
    traceback: str | None = None  # a compile error's whole traceback, escaped

    def to_json(self) -> dict[str, Any]:
        p = self.planned
        return {"kernel": p.kernel.name, "variant": p.variant.id, "arch": p.arch,
                "platform": p.platform, "key": p.key, "status": self.status,
                "seconds": round(self.seconds, 3), "error": self.error, "fetched": self.fetched,
                "worker": self.worker, "traceback": self.traceback,
                "timings": {k: round(v, 4) for k, v in self.timings.items()}}


@dataclass
class RemoteUse:
    """What a build did with the remote cache."""

    url: str
    write: bool
    fetched: int = 0
    absent: int = 0  # looked up, not there (compiled)
    refused: dict[str, str] = field(default_factory=dict)  # "label key" -> why
    down: str | None = None  # why the remote stopped being used
    uploaded: int = 0
    upload_errors: list[str] = field(default_factory=list)
    traffic: remote_cache.Traffic = field(default_factory=remote_cache.Traffic)
    seconds: float = 0.0  # wall time of the lookup
    saved: float = 0.0  # compile seconds the fetched entries saved

    def to_json(self) -> dict[str, Any]:
        t = self.traffic
        return {"url": self.url, "write": self.write, "fetched": self.fetched, "absent": self.absent,
                "refused": [{"entry": k, "reason": v} for k, v in self.refused.items()],
                "unavailable": self.down, "uploaded": self.uploaded,
                "upload_errors": self.upload_errors, "requests": t.requests,
                "bytes_down": t.bytes_down, "bytes_up": t.bytes_up,
                "lookup_seconds": round(self.seconds, 3), "seconds_saved": round(self.saved, 3)}

    def warnings(self) -> list[str]:
        """At most one line for each kind of trouble; none of it fails the build."""
        out = []
        if self.down:
            out.append(f"warning: remote cache {self.url} unavailable ({self.down}); built locally")
        if self.refused:
            first = next(iter(self.refused.items()))
            out.append(f"warning: remote cache {self.url}: refused {len(self.refused)} "
                       f"entr{'y' if len(self.refused) == 1 else 'ies'} (first: {first[0]}: "
                       f"{first[1]}); built locally")
        if self.upload_errors and not self.down:
            out.append(f"warning: remote cache {self.url}: {len(self.upload_errors)} built "
                       f"entr{'y' if len(self.upload_errors) == 1 else 'ies'} not uploaded "
                       f"({self.upload_errors[0]})")
        return out

    def line(self) -> str:
        t = self.traffic
        return (f"remote {self.url}: {self.fetched} fetched, {self.absent} absent"
                + (f", {self.uploaded} uploaded" if self.write else ", read-only")
                + f"; {t.requests} requests, {human_size(t.bytes_down)} down, "
                  f"{human_size(t.bytes_up)} up")


class Progress:
    """What a build tells as it goes (the CLI draws a bar or prints lines); silent here."""

    def start(self, total: int) -> None:
        """`total` entries are about to be compiled."""

    def waiting(self, planned: Planned) -> None:
        """Another process holds `planned`'s lock: this build waits for it."""

    def done(self, outcome: Outcome) -> None:
        """One compile finished (built, cached meanwhile, or failed)."""

    def note(self, text: str) -> bool:
        """A step worth a line (a remote lookup starting); whether it was shown."""
        return False


@dataclass
class Built:
    """What `run` did: every planned entry's outcome in plan order, and the rest."""

    outcomes: list[Outcome] = field(default_factory=list)
    remote: RemoteUse | None = None
    runtimes_built: list[str] = field(default_factory=list)  # runtime libraries linked
    lock_file: Path | None = None  # the lock written or confirmed (None: not written)
    lock_changed: bool = False
    signature: Path | None = None  # the lock's signature, when signed
    signature_removed: Path | None = None  # a signature of the lock's old bytes, removed (no key)
    dropped_tuning: list[str] = field(default_factory=list)  # tuning lines the lock lost, and why
    timings: Timings = field(default_factory=Timings)  # wall seconds per stage

    @property
    def ok(self) -> bool:
        return not any(o.status == "failed" for o in self.outcomes)
