"""Sizes, durations and times as people type and read them, and as JSON carries them.

Sizes are powers of 1024 (`500M`, `2G`, `1024K`); durations `30d`, `12h`, `90m`; every
time cutecc prints or writes is ISO 8601 in UTC with whole seconds.
"""

from __future__ import annotations

import datetime as dt
import re

from cutecc.errors import CuteccError

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str | int, where: str = "--max-size") -> int:
    """Bytes from `500M`, `2G`, `1024K`, `1.5GiB` or plain `1048576` (K/M/G/T are powers of 1024)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise CuteccError(f'"{text}" is not a size such as 500M, 2G, 1024K or a byte count',
                          where=where)
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_age(text: str | float) -> float:
    """Seconds from `30d`, `12h`, `90m`, `45s` or `2w`."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text, re.IGNORECASE)
    if not m:
        raise CuteccError(f'"{text}" is not an age such as 30d, 12h or 90m', where="--older-than")
    return float(m.group(1)) * _AGE_UNITS[m.group(2).lower()]


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def human_age(seconds: float) -> str:
    if seconds != seconds:  # NaN
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def now_iso() -> str:
    """Now, as cutecc writes every time: ISO 8601, UTC, whole seconds."""
    return iso(dt.datetime.now(dt.timezone.utc))


def iso(t: dt.datetime | float) -> str:
    """A datetime or epoch seconds as ISO 8601 UTC with whole seconds."""
    if not isinstance(t, dt.datetime):
        t = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
