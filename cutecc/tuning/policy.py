"""The measurement policy: how a tuning record's times were taken, and where.

Two parts. The method (`Policy.method`, the `policy` of a lock's tuning line): launches
(`eager`: each call dispatched on its own, in chains of K; no CUDA graph), the clock (`device`:
kernel durations from a CUPTI trace; `host`: the fallback), the warm-up rounds, the rounds
(at least `rounds`, more until the medians settle, at most `max_rounds`) and the noise rule
(`cutecc.tuning.decide.RULE`). Winners measured by different methods are not comparable, so
`cutecc tune` refuses to mix methods in one lock. The setting (device name and driver, the
SM clock seen while timing where it can be read, the DSL that built the candidates) is kept
in the record beside the method (`TuningResult.measurement`): what a reader needs to judge the
numbers, not what decides comparability (the device kind and toolchain are rechecked at
load, `cutecc.runtime.tuning.line_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cutecc.tuning.decide import RULE

LAUNCH = "eager"  # the only launch mode the measuring child has


@dataclass(frozen=True)
class Policy:
    """How one record was measured (see the module docstring)."""

    launch: str
    clock: str
    warmup: int
    rounds: int
    max_rounds: int
    rule: str = RULE

    @property
    def method(self) -> str:
        """The method as one line of text: what a lock's tuning lines must share."""
        return (f"{self.launch} launches, {self.clock} clock, warmup {self.warmup}, "
                f"rounds {self.rounds}..{self.max_rounds}, {self.rule}")

    def record(self, device: str | None, driver: str | None, toolchain: str | None,
               sm_clock_mhz: Sequence[float] | None) -> dict[str, Any]:
        """The policy as a record keeps it: the method's fields and the setting's."""
        return {"launch": self.launch, "clock": self.clock, "warmup": self.warmup, "rounds": self.rounds,
                "max_rounds": self.max_rounds, "rule": self.rule, "method": self.method, "device": device,
                "driver": driver, "toolchain": toolchain,
                "sm_clock_mhz": None if not sm_clock_mhz else [min(sm_clock_mhz), max(sm_clock_mhz)]}


def mixed(methods: Mapping[str | None, int]) -> str | None:
    """What is wrong with a lock whose tuning lines count `methods` (method -> lines; None:
    lines recorded before lines named one), or None when they share one."""
    if len(methods) <= 1:
        return None
    parts = [f"{n} line(s) {'with no recorded policy' if m is None else f'measured by {m!r}'}"
             for m, n in sorted(methods.items(), key=lambda x: (x[0] is not None, x[0] or ""))]
    return "tuning lines measured under different policies would share one lock: " + "; ".join(parts)
