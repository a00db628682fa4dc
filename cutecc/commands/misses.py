"""`cutecc misses`: the calls kernels' fallbacks served (the cache's `misses.json`), and
with `--toml` the manifest changes that would let a build serve them.

What covers a miss (a variant the call's values add to the kernel's `variants`, an arch
added to its `archs`, or a contract change, said as such) is `cutecc.plan.cover`'s; a
`variants` table is printed only when one of its new variants takes the call.

What is printed is pasted (into a manifest, a terminal): the record's strings are held to
their grammar when read (`cutecc.store.misses`: a record off it is skipped, and said on
stderr), and every rendering escapes them anyway: TOML values and keys as TOML spells
them (`toml_value`, `toml_key`), text and comments on one line of printable characters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.commands.report import Report
from cutecc.plan.cover import Cover, covers
from cutecc.store.misses import Miss, escaped, load_misses
from cutecc.store.view import StoreView


@dataclass(frozen=True)
class MissesReport(Report):
    cache_dir: Path
    misses: list[Miss]
    covers: list[Cover] | None = None  # with --toml
    manifest: Path | None = None
    skipped: int = 0  # records of misses.json read and set aside (malformed, off their grammar)

    def warnings(self) -> list[str]:
        if not self.skipped:
            return []
        return [escaped(f"warning: skipped {self.skipped} record(s) of {self.cache_dir / 'misses.json'} "
                        "that break its grammar (a field no cutecc writes); the next miss recorded "
                        "rewrites the file without them")]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cache_dir": str(self.cache_dir), "skipped": self.skipped,
                               "misses": [{**m.to_json(), "signature": m.signature} for m in self.misses]}
        if self.covers is not None:
            out["manifest"] = str(self.manifest)
            out["toml"] = "\n".join(self.toml_lines())
            out["uncovered"] = [{"kernel": c.kernel, "signature": m.signature, "arch": m.arch, "why": why}
                                for c in self.covers for m, why in c.uncovered]
        return out

    def toml_lines(self) -> list[str]:
        out: list[str] = []
        for c in self.covers or []:
            if out:
                out.append("")
            out += _toml(c)
        return out

    def lines(self, verbose: int = 0) -> list[str]:
        if self.covers is not None:
            return self.toml_lines() or ["# no misses recorded"]
        if not self.misses:
            return [escaped(f"no misses recorded in {self.cache_dir}")]
        return [escaped(f"{m.kernel}{m.signature} on {m.arch}: {m.reason}, {m.count} time(s), last {m.last}")
                for m in self.misses]


def misses(cache_dir: str | Path | None = None, *, toml: bool = False,
           manifest: str | Path | None = None) -> MissesReport:
    """The misses recorded in the cache; with `toml`, the changes to `manifest` (else the
    project's, found as `cutecc build` finds it) that would cover them."""
    store = StoreView(cache_dir).require()
    record = load_misses(store.root)
    found = list(record.misses)
    if not toml:
        return MissesReport(store.root, found, skipped=record.skipped)
    from cutecc.manifest import find_manifest

    path = Path(manifest) if manifest is not None else find_manifest()
    return MissesReport(store.root, found, covers(path, found), path.resolve(), record.skipped)


def _toml(c: Cover) -> list[str]:
    """What would serve one kernel's misses, as the manifest lines to paste."""
    out = [f"[kernel.{toml_key(c.kernel)}]"]
    if c.archs is not None:
        out.append(f"archs = {toml_value(c.archs)}")
    if c.variants is not None:
        out.append(f"variants = {toml_value(c.variants)}")
        out.append(escaped(f"# adds {', '.join(c.added)}"))
    out += [escaped(f"# not covered: {c.kernel}{m.signature} on {m.arch}: {why}") for m, why in c.uncovered]
    return out


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_value(v: Any) -> str:
    """`v` (a string, bool, int, float, array or table) spelled as a one-line TOML value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else "-inf" if v < 0 else "inf")
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML value for a {type(v).__name__}")


def toml_key(k: str) -> str:
    """`k` as a TOML key: bare when it can be, else a quoted string."""
    return k if _BARE_KEY.fullmatch(k) else _toml_string(k)


def _toml_string(s: str) -> str:
    """A TOML basic string holding exactly `s`: quote, backslash and every character that is
    not printable escaped (a lone surrogate, which no TOML holds, as U+FFFD)."""
    out = []
    for c in s:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif 0xD800 <= ord(c) <= 0xDFFF:
            out.append("\\uFFFD")
        else:
            out.append(f"\\u{ord(c):04X}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08X}")
    return '"' + "".join(out) + '"'
