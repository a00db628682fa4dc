"""Where a build spent its time: wall seconds per stage, measured always (a clock read per
stage), printed by `cutecc build --timings` and carried by its JSON report.

A build's stages are `STAGES` (parse, plan, probe, fetch, compile, publish, lock); an
entry's compile splits into `ENTRY_PARTS`: the worker's start (its process and imports,
counted on the first entry it took; for a service started before planning, what was left
of its start once planning was done), the compile, the link, the audit (the read-set check,
`cutecc.build.read_set`), and the publish (the key's lock, the source re-check, the move into
the store). The JSON adds `audit_cpu`, the check's CPU seconds (its thread's): what it costs
on a shared host, where the wall clock measures the neighbours.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

STAGES = ("parse", "plan", "probe", "fetch", "compile", "publish", "lock")
ENTRY_PARTS = ("startup", "compile", "link", "audit", "publish")


@dataclass
class Timings:
    """Seconds per stage, in the order they ran (a stage run twice adds up)."""

    stages: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage `name`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.stages[name] = self.stages.get(name, 0.0) + seconds

    def to_json(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.stages.items()}

    def line(self) -> str:
        """`plan 0.41s, probe 0.01s, ...` in stage order."""
        order = [s for s in STAGES if s in self.stages] + [s for s in self.stages if s not in STAGES]
        return ", ".join(f"{s} {self.stages[s]:.2f}s" for s in order)


def entry_line(parts: dict[str, float]) -> str:
    """One entry's `startup 0.10s, compile 3.20s, ...` (the parts it has)."""
    return ", ".join(f"{p} {parts[p]:.2f}s" for p in ENTRY_PARTS if p in parts)
