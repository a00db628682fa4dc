"""Shape buckets: how a call's size maps to the bucket a tuning result was measured for.

A tuning space (`cutecc.manifest.tune_space`) names the edges of each bucketed extent and
a rule; a tuning line (`cutecc.contract.pinned.Tuned`) records its bucket as text (`n=65536`);
dispatch (`cutecc.runtime.tuning`) maps a call's extents to that text. The three share
these rules. Imports nothing of cutecc, so the manifest, the lock and the runtime all can.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

RULES = ("floor", "nearest")  # how a size between two edges is bucketed
MAX_BUCKETS = 1024  # buckets in one tuning space (the product of its extents' edges)
MAX_EXTENT = 2**31 - 1  # the largest edge (or benchmark size) of a bucketed extent


def bucket_of(value: int, edges: tuple[int, ...], rule: str) -> int:
    """The bucket edge a size falls in. `floor`: the largest edge <= value (the first edge
    below it); `nearest`: the edge nearest in log scale (ties go to the lower edge).
    `edges` is sorted ascending and non-empty."""
    if rule == "nearest":
        best = edges[0]
        for e in edges:
            if abs(_log2(value) - _log2(e)) < abs(_log2(value) - _log2(best)):
                best = e
        return best
    out = edges[0]
    for e in edges:
        if e <= value:
            out = e
    return out


def _log2(x: int) -> float:
    return math.log2(max(x, 1))


def bucket_text(bucket: Mapping[str, int]) -> str:
    """`n=65536` (several extents: `m=1024,n=8`, in the tuning space's order)."""
    return ",".join(f"{k}={v}" for k, v in bucket.items())


def parse_bucket(text: str) -> dict[str, int]:
    """The inverse of `bucket_text`; ValueError for anything else."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, num = part.partition("=")
        if not name.isidentifier() or not num.isdigit() or len(num) > 12 or name in out:
            raise ValueError(f"bad bucket {text!r}")
        out[name] = int(num)
    return out
