"""`cutecc explain`: why a kernel's artifacts are (not) cached, like ccache's debug mode.

For each planned (variant, arch) of the kernel: cached, or a miss together with the key
inputs (`entry`, `source`, `factory_args`, `args`, `constants`, `arch`,
`compile_options`, `toolchain.<package>`, `distributions.<name>` (an installed library's
version and digest), `env.<NAME>` (a compile-affecting variable)) in which it differs from the closest cached
entry of the same kernel (fewest differing inputs, read from its stored `key_inputs`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cutecc.archs import parse_archs
from cutecc.commands.report import Report
from cutecc.entry.rules import label
from cutecc.errors import CuteccError
from cutecc.manifest import find_manifest, load_manifest
from cutecc.plan.build_plan import plan
from cutecc.store.view import Entry, StoreView


@dataclass(frozen=True)
class Difference:
    input: str  # e.g. "constants", "source", "toolchain.nvidia-cutlass-dsl"
    cached: Any  # the closest entry's value (None if it had none)
    planned: Any  # the manifest's value now


@dataclass(frozen=True)
class Explanation:
    kernel: str
    variant: str
    arch: str
    key: str
    cached: bool
    closest: str | None = None  # key of the closest cached entry, for a miss
    closest_label: str | None = None
    differences: tuple[Difference, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        head = f"{label(self.kernel, self.variant, self.arch)} {self.key[:12]}"
        if self.cached:
            return [f"{head}: cached"]
        if self.closest is None:
            return [f"{head}: miss; no cached entry of this kernel to compare with"]
        out = [f"{head}: miss; closest cached {self.closest_label} {self.closest[:12]} differs in "
               f"{', '.join(d.input for d in self.differences)}"]
        for d in self.differences:
            old, new = _short(d.cached), _short(d.planned)
            out.append(f"    {d.input}: {old} -> {new}" if old and new else f"    {d.input}")
        return out


@dataclass(frozen=True)
class ExplainReport(Report):
    cache_dir: str
    explanations: tuple[Explanation, ...]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.explanations)

    def __len__(self) -> int:
        return len(self.explanations)

    def __getitem__(self, i: int) -> Explanation:
        return self.explanations[i]

    def to_json(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "entries": [x.to_json() for x in self.explanations]}

    def lines(self, verbose: int = 0) -> list[str]:
        return [line for x in self.explanations for line in x.lines()]


def _short(value: Any, limit: int = 80) -> str | None:
    """A value as compact JSON (a 64-hex digest cut to 12), or None if too long to show."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= limit else None


_SPLIT = ("toolchain", "distributions", "env", "shadows")


def flatten(inputs: dict[str, Any]) -> dict[str, Any]:
    """Key inputs with the toolchain, the installed distributions and the environment
    split per name: `toolchain.<package>`, `distributions.<name>`, `env.<NAME>`,
    `shadows.<module>`."""
    out = {k: v for k, v in inputs.items() if k not in _SPLIT}
    for part in _SPLIT:
        sub = inputs.get(part)
        if isinstance(sub, dict):
            out.update({f"{part}.{k}": v for k, v in sub.items()})
        elif part in inputs:
            out[part] = sub
    return out


def differences(cached: dict[str, Any], planned: dict[str, Any]) -> tuple[Difference, ...]:
    a, b = flatten(cached), flatten(planned)
    return tuple(Difference(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
                 if a.get(k) != b.get(k))


def explain(kernel: str, manifest: str | Path | None = None, *, variant: str | None = None,
            arch: str | None = None, cache_dir: str | Path | None = None) -> ExplainReport:
    """One explanation per planned (variant, arch) of `kernel`, in plan order."""
    m = load_manifest(manifest or find_manifest(), kernels=(kernel,))
    store = StoreView(cache_dir).require()
    planned = [p for p in plan(m, parse_archs((arch,)) if arch else (), hash_cache=store.layout.hash_cache())
               if p.kernel.name == kernel]
    if variant is not None:
        ids = sorted({p.variant.id for p in planned})
        planned = [p for p in planned if p.variant.id == variant]
        if not planned:
            raise CuteccError(f'kernel "{kernel}" has no variant "{variant}" (variants: '
                              f"{', '.join(ids)})", where="--variant")
    same_kernel = [(e, e.recorded, e.recorded.key_inputs) for e in store.entries()
                   if e.recorded.kernel == kernel and e.recorded.key_inputs is not None]
    out = []
    for p in planned:
        if store.has(p.key):
            out.append(Explanation(kernel, p.variant.id, p.arch, p.key, True))
            continue
        best: tuple[tuple[Any, ...], Entry, tuple[Difference, ...]] | None = None
        for e, r, inputs in same_kernel:
            diff = differences(dict(inputs or {}), p.inputs)
            rank = (len(diff), r.variant != p.variant.id, r.arch != p.arch, -e.last_used())
            if best is None or rank < best[0]:
                best = (rank, e, diff)
        if best is None:
            out.append(Explanation(kernel, p.variant.id, p.arch, p.key, False))
        else:
            _, e, diff = best
            out.append(Explanation(kernel, p.variant.id, p.arch, p.key, False, e.key,
                                   e.recorded.label, diff))
    return ExplainReport(str(store.root), tuple(out))
