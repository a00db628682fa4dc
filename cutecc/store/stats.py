"""`stats.json` (`STATS_FORMAT`): the build counters, one typed, frozen record both ways.

Counters were added without a format change (remote_*: the remote cache): a reader takes
the ones it knows (zeros for the rest), and a writer keeps the numbers it does not know
(`kept`: a newer cutecc's counters). Written by `Store.add_stats` under locks/stats.lock,
read by `StoreView.read_stats` and `cutecc stats`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cutecc.store.layout import STATS_FORMAT

MAX_STATS_BYTES = 64 << 10  # stats.json holds a few counters; anything larger is not ours
STATS_DEPTH = 1  # one flat object
_SECONDS = ("seconds_saved", "remote_seconds", "remote_seconds_saved")  # rounded to the millisecond


@dataclass(frozen=True)
class Stats:
    """The counters builds record (each as written: an int, or a float of seconds), since
    when and last updated when (None until a build counted)."""

    hits: float = 0
    misses: float = 0
    failures: float = 0
    seconds_saved: float = 0
    remote_hits: float = 0
    remote_misses: float = 0
    remote_refused: float = 0
    remote_unavailable: float = 0
    remote_uploads: float = 0
    remote_requests: float = 0
    remote_bytes_down: float = 0
    remote_bytes_up: float = 0
    remote_seconds: float = 0
    remote_seconds_saved: float = 0
    since: str | None = None
    updated_at: str | None = None
    kept: Mapping[str, float] = field(default_factory=dict)  # numbers this cutecc does not know

    @classmethod
    def from_json(cls, doc: Any) -> Stats:
        """The counters of `doc` (zeros when it is not a stats record of this format); any
        object's other numbers are `kept`, so a counter update never drops them."""
        if not isinstance(doc, dict):
            return cls()
        kept = {k: v for k, v in doc.items() if k not in _OWN and isinstance(v, (int, float))
                and not isinstance(v, bool)}
        if doc.get("format") != STATS_FORMAT:
            return cls(kept=kept)
        counts = {k: doc[k] for k in COUNTERS if isinstance(doc.get(k), (int, float))}
        times = {k: doc[k] for k in ("since", "updated_at") if isinstance(doc.get(k), str)}
        return cls(**counts, **times, kept=kept)

    @staticmethod
    def of_another_format(doc: Any) -> bool:
        """Whether `doc` is a stats.json of another format (a newer cutecc owns it: left alone)."""
        return isinstance(doc, dict) and isinstance(doc.get("format"), int) and doc["format"] != STATS_FORMAT

    def added(self, delta: Mapping[str, float], now: str) -> Stats:
        """These counters with `delta` added (seconds rounded to the millisecond), updated `now`."""
        counts = {k: getattr(self, k) + delta.get(k, 0) for k in COUNTERS}
        counts.update({k: round(counts[k], 3) for k in _SECONDS})
        return dataclasses.replace(self, **counts, since=now if self.since is None else self.since,
                                   updated_at=now)

    def counters(self) -> dict[str, Any]:
        """The counters by name, with `since` and `updated_at` when recorded (`cutecc stats`)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in COUNTERS}
        out.update({k: v for k in ("since", "updated_at") if (v := getattr(self, k)) is not None})
        return out

    def to_json(self) -> dict[str, Any]:
        return {**self.kept, **self.counters(), "format": STATS_FORMAT}

    def dumps(self) -> bytes:
        """stats.json's bytes: sorted keys, one space of indent, no final newline."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode()


# Format 1's counters, in the order `cutecc stats` shows them.
COUNTERS = tuple(f.name for f in dataclasses.fields(Stats) if f.name not in ("since", "updated_at", "kept"))
_OWN = frozenset({*COUNTERS, "format", "since", "updated_at"})
