"""`cutecc misses`: the calls kernels' fallbacks served (the cache's `misses.json`), and
with `--toml` the manifest changes that would let a build serve them.

A miss on a shape, dtype or call keyword is covered by a variant: the values the call
implies for the kernel's variant axes (an input's `dtype = "$dtype"`, a static extent
`"$d"`, a call keyword) are added to its `variants` table, the edited manifest is parsed
as a build would parse it, and the table is printed only when one of its new variants
takes the call's arrays and keywords. A miss no added value covers (a divisibility, a
rank, a dtype written literally) needs a contract change, said as such. A miss on an
arch (no build for this GPU) is covered by adding the arch to the kernel's `archs`.

What is printed is pasted (into a manifest, a terminal): the record's strings are held to
their grammar when read (`cutecc.store.misses`: a record off it is skipped, and said on
stderr), and every rendering escapes them anyway: TOML values and keys as TOML spells
them (`toml_value`, `toml_key`), text and comments on one line of printable characters.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.archs import to_build
from cutecc.commands.report import Report
from cutecc.errors import CuteccError
from cutecc.store.misses import Miss, escaped, load_misses
from cutecc.store.view import StoreView


@dataclass(frozen=True)
class Cover:
    """What would serve one kernel's misses: its edited `variants` and `archs` (None:
    unchanged), the variant ids added, and the misses nothing printed covers, with why."""

    kernel: str
    variants: dict[str, list[Any]] | None = None
    archs: list[str] | None = None
    added: list[str] = field(default_factory=list)
    uncovered: list[tuple[Miss, str]] = field(default_factory=list)

    def toml(self) -> list[str]:
        out = [f"[kernel.{toml_key(self.kernel)}]"]
        if self.archs is not None:
            out.append(f"archs = {toml_value(self.archs)}")
        if self.variants is not None:
            out.append(f"variants = {toml_value(self.variants)}")
            out.append(escaped(f"# adds {', '.join(self.added)}"))
        out += [escaped(f"# not covered: {self.kernel}{m.signature} on {m.arch}: {why}")
                for m, why in self.uncovered]
        return out


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
            out += c.toml()
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


def covers(path: Path, found: list[Miss]) -> list[Cover]:
    """Per kernel of `found`, what in the manifest at `path` would serve its misses."""
    from cutecc.manifest import load_manifest, parse_document

    manifest = load_manifest(path)
    doc, prefix = _document(path)
    kernels = doc.get("kernel", {})
    out = []
    for name in sorted({m.kernel for m in found}):
        mine = [m for m in found if m.kernel == name]
        kdoc = kernels.get(name) if isinstance(kernels, dict) else None
        if not isinstance(kdoc, dict) or "args" not in kdoc:
            why = f"no kernel {name!r} built from {path.name}"
            out.append(Cover(name, uncovered=[(m, why) for m in mine]))
            continue
        kernel = manifest.kernel(name)
        archs = [to_build(m.arch) for m in mine if m.reason.startswith("no build for")]
        new_archs = sorted(set(archs) - set(kernel.archs))
        axes: dict[str, list[Any]] = {k: list(v) for k, v in (kdoc.get("variants") or {}).items()}
        edited = copy.deepcopy(axes)
        uncovered: list[tuple[Miss, str]] = []
        shape_misses = [m for m in mine if not m.reason.startswith("no build for")]
        for m in shape_misses:
            for axis, value in _implied(kdoc, kernel, m).items():
                if axis in edited and not any(_same(value, v) for v in edited[axis]):
                    edited[axis].append(value)
        added: list[str] = []
        why = ""
        if shape_misses:
            trial = copy.deepcopy(doc)
            _kernels_of(trial, prefix)[name]["variants"] = edited
            try:
                tried = parse_document(_inner(trial, prefix), path, prefix).kernel(name)
            except CuteccError as e:
                tried = None
                why = f"the implied variants do not parse: {e.message}"
            old_ids = {v.id for v in kernel.variants}
            for m in shape_misses:
                hit = None if tried is None else _covering(tried.variants, m)
                if hit is None:
                    uncovered.append((m, why if tried is None else _why(kernel.variants, m)))
                elif hit.id in old_ids:
                    uncovered.append((m, f"variant {hit.id} takes it: build it for {m.arch}"))
                elif hit.id not in added:
                    added.append(hit.id)
        out.append(Cover(name, edited if added else None,
                         sorted({*kernel.archs, *new_archs}) if new_archs else None, added, uncovered))
    return out


def cover_call(path: Path, m: Miss) -> tuple[Any, Any] | str:
    """(manifest, variant) that serves the one call `m` describes: a variant the manifest at
    `path` declares, else one the values the call implies add to its `variants` (the manifest
    then is the edited one, parsed as a build parses it); or why none can (a contract change).
    `cutecc.load(jit=True)` builds it (`cutecc.develop.jit`); `covers` prints such edits."""
    from cutecc.manifest import load_manifest, parse_document

    manifest = load_manifest(path)
    doc, prefix = _document(path)
    kernels = doc.get("kernel", {})
    kdoc = kernels.get(m.kernel) if isinstance(kernels, dict) else None
    if not isinstance(kdoc, dict) or "args" not in kdoc:
        return f"no kernel {m.kernel!r} in {path}"
    kernel = manifest.kernel(m.kernel)
    hit = _covering(kernel.variants, m)
    if hit is not None:
        return manifest, hit
    edited: dict[str, list[Any]] = {k: list(v) for k, v in (kdoc.get("variants") or {}).items()}
    for axis, value in _implied(kdoc, kernel, m).items():
        if axis in edited and not any(_same(value, v) for v in edited[axis]):
            edited[axis].append(value)
    trial = copy.deepcopy(doc)
    _kernels_of(trial, prefix)[m.kernel]["variants"] = edited
    try:
        tried = parse_document(_inner(trial, prefix), path.resolve(), prefix)
    except CuteccError as e:
        return f"the implied variants do not parse: {e.message}"
    hit = _covering(tried.kernel(m.kernel).variants, m)
    return (tried, hit) if hit is not None else _why(kernel.variants, m)


def _document(path: Path) -> tuple[dict[str, Any], str]:
    """The manifest's TOML document, and the prefix of its cutecc table."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    if path.name == "pyproject.toml":
        return doc, "tool.cutecc."
    return doc, ""


def _inner(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    return doc["tool"]["cutecc"] if prefix else doc


def _kernels_of(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    return _inner(doc, prefix)["kernel"]  # type: ignore[no-any-return]


def _implied(kdoc: dict[str, Any], kernel: Any, m: Miss) -> dict[str, Any]:
    """The variant axis values the call implies: an input written `dtype = "$p"` or with
    `"$p"` as an extent takes the call's, a call keyword its value."""
    names = [t.name for t in kernel.variants[0].convention.inputs]
    templates = {a.get("name"): a for a in kdoc["args"] if isinstance(a, dict)}
    out: dict[str, Any] = dict(m.keywords)
    for name, (dtype, shape) in zip(names, m.arrays):
        t = templates.get(name) or {}
        if isinstance(t.get("dtype"), str) and t["dtype"].startswith("$"):
            out.setdefault(t["dtype"][1:], dtype)
        tshape = t.get("shape")
        if isinstance(tshape, list) and len(tshape) == len(shape):
            for d, n in zip(tshape, shape):
                if isinstance(d, str) and d.startswith("$") and d[1:].isidentifier() and isinstance(n, int):
                    out.setdefault(d[1:], n)
    return out


def _covering(variants: Any, m: Miss) -> Any:
    """The first variant that takes the call's arrays and keywords, or None."""
    from cutecc.runtime.calls import conv_mismatch

    for v in variants:
        call = dict(v.call)
        # an object recorded as `{"import": ref}`: a variant of references records the text
        if any(k not in call or not _same(call[k], val["import"] if isinstance(val, dict) else val)
               for k, val in m.keywords):
            continue
        env, _ = conv_mismatch(v.convention, [s for _, s in m.arrays], [d for d, _ in m.arrays])
        if env is not None:
            return v
    return None


def _why(variants: Any, m: Miss) -> str:
    """Why no variant of the present contract takes the call: a contract change is needed."""
    from cutecc.runtime.calls import conv_mismatch

    reasons = {conv_mismatch(v.convention, [s for _, s in m.arrays], [d for d, _ in m.arrays])[1]
               for v in variants} - {""}
    return ("no value of the variant axes covers it; change the contract ("
            + "; ".join(sorted(reasons)[:3]) + ")") if reasons else "a call keyword no axis has"


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and a == b


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
