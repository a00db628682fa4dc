"""Planning: every (kernel, variant, arch) a manifest asks for, with its cache key.

Reads source files to key them (never imports them), so planning needs neither the DSL
nor JAX: `build`, `explain` and `pack --manifest` all start here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutecc.entry import compute_key, label
from cutecc.errors import CuteccError
from cutecc.key import SourceIndex, key_inputs
from cutecc.manifest import Kernel, Manifest, Variant


@dataclass(frozen=True)
class Planned:
    """One artifact the manifest asks for."""

    kernel: Kernel
    variant: Variant
    arch: str
    key: str
    inputs: dict[str, Any]
    sources: tuple[str, ...]

    @property
    def label(self) -> str:
        return label(self.kernel.name, self.variant.id, self.arch)


def plan(manifest: Manifest, archs: tuple[str, ...] = ()) -> list[Planned]:
    """Every artifact of the manifest with its key; `archs` overrides the manifest's."""
    index = SourceIndex(manifest.python_path)
    out = []
    for k in manifest.kernels:
        try:
            digest, sources = index.digest(k.module)
        except CuteccError as e:
            if e.where:  # already names the file at fault (a syntax error in a dependency)
                raise
            raise CuteccError(e.message, where=str(manifest.path),
                              key_path=f'kernel "{k.name}", entry') from None
        attr = k.entry.split(":", 1)[1].split(".")[0]
        if index.lacks(k.module, attr):
            raise CuteccError(f'module "{k.module}" defines no "{attr}"', where=str(manifest.path),
                              key_path=f'kernel "{k.name}", entry')
        seen: dict[str, str] = {}
        for v in k.variants:
            for arch in archs or k.archs:
                inputs = key_inputs(k, v, arch, digest)
                p = Planned(k, v, arch, compute_key(inputs), inputs, sources)
                if p.key in seen:  # nothing tells them apart: no call could choose between them
                    raise CuteccError(f'variants "{seen[p.key]}" and "{v.id}" build the same artifact '
                                      "(their parameters change nothing the kernel is compiled with)",
                                      where=str(manifest.path), key_path=f'kernel "{k.name}", variants')
                seen[p.key] = v.id
                out.append(p)
    return out
