"""Which variant serves a missed call, and which manifest edit would (issue 46: what
`cutecc misses --toml` prints and what a just-in-time build compiles, `cutecc.build.jit`).

A miss on a shape, dtype or call keyword is covered by a variant: the values the call
implies for the kernel's variant axes (an input's `dtype = "$dtype"`, a static extent
`"$d"`, a call keyword) are added to its `variants` table, the edited manifest is parsed
as a build would parse it, and the edit counts only when one of its new variants takes the
call's arrays and keywords, by the runtime's own rule (`cutecc.runtime.contract_fit.conv_mismatch`).
A miss no added value covers (a divisibility, a rank, a dtype written literally) needs a
contract change, said as such. A miss on an arch (no build for this GPU) is covered by
adding the arch to the kernel's `archs`; `plan_call` picks the arch one call builds for.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.archs import runs_on, to_build
from cutecc.errors import CuteccError
from cutecc.store.misses import Miss


@dataclass(frozen=True)
class Cover:
    """What would serve one kernel's misses: its edited `variants` and `archs` (None:
    unchanged), the variant ids added, and the misses nothing printed covers, with why."""

    kernel: str
    variants: dict[str, list[Any]] | None = None
    archs: list[str] | None = None
    added: list[str] = field(default_factory=list)
    uncovered: list[tuple[Miss, str]] = field(default_factory=list)


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
    `cutecc.load(jit=True)` builds it (`cutecc.build.jit`); `covers` prints such edits."""
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
    from cutecc.runtime.contract_fit import conv_mismatch

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
    from cutecc.runtime.contract_fit import conv_mismatch

    reasons = {conv_mismatch(v.convention, [s for _, s in m.arrays], [d for d, _ in m.arrays])[1]
               for v in variants} - {""}
    return ("no value of the variant axes covers it; change the contract ("
            + "; ".join(sorted(reasons)[:3]) + ")") if reasons else "a call keyword no axis has"


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def plan_call(path: Path, m: Miss) -> tuple[Any, Any, Any, str]:
    """What a just-in-time build of the one call `m` compiles: (the manifest, it narrowed to
    the kernel with only the variant serving the call, that variant, the arch), the arch
    being the best of the kernel's `archs` that runs on the call's GPU, else the one
    `cutecc build --arch` would be told; a CuteccError names the manifest where no variant
    can serve it (a contract change)."""
    found = cover_call(path, m)
    if isinstance(found, str):
        raise CuteccError(f"no variant of the manifest serves the call: {found}", where=str(path),
                          key_path=f'kernel "{m.kernel}"')
    manifest, variant = found
    kernel = manifest.kernel(m.kernel)
    arch = max(kernel.archs, key=lambda a: runs_on(a, m.arch), default="")
    if not runs_on(arch, m.arch):
        arch = to_build(m.arch)
    one = dataclasses.replace(kernel, variants=(variant,), candidates=(), tuning=None)
    return manifest, dataclasses.replace(manifest, kernels=(one,), composites=()), variant, arch
