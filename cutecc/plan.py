"""Planning: every (kernel, variant, arch) a manifest asks for, with its cache key.

Reads source files to key them (never imports them), so planning needs neither the DSL
nor JAX: `build`, `explain` and `pack --manifest` all start here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.dists import DistIndex, HashCache, compile_env
from cutecc.entry import compute_key, label
from cutecc.errors import CuteccError
from cutecc.key import SourceIndex, key_inputs
from cutecc.manifest import Kernel, Manifest, Variant, split_entry


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


def plan(manifest: Manifest, archs: tuple[str, ...] = (), *,
         hash_cache: Path | None = None) -> list[Planned]:
    """Every artifact of the manifest with its key; `archs` overrides the manifest's.
    `hash_cache`: a file remembering installed files' digests across runs."""
    index = SourceIndex(manifest.python_path)
    cache = HashCache(hash_cache)
    installed = DistIndex(cache)
    envs: dict[str, dict[str, str]] = {}
    out = []
    try:
        _plan(manifest, archs, index, installed, envs, out)
    finally:
        cache.save()
    return out


def _plan(manifest: Manifest, archs: tuple[str, ...], index: SourceIndex, installed: DistIndex,
          envs: dict[str, dict[str, str]], out: list[Planned]) -> None:
    for k in manifest.kernels:
        try:
            digest, sources = index.digest(k.module)
        except CuteccError as e:
            if e.where:  # already names the file at fault (a syntax error in a dependency)
                raise
            raise CuteccError(e.message, where=str(manifest.path),
                              key_path=f'kernel "{k.name}", entry') from None
        attr = split_entry(k.entry)[0].split(":", 1)[1].split(".")[0]
        if index.lacks(k.module, attr):
            raise CuteccError(f'module "{k.module}" defines no "{attr}"', where=str(manifest.path),
                              key_path=f'kernel "{k.name}", entry')
        reached = installed.reached(index.reached_tops(k.module))
        seen: dict[str, str] = {}
        for v in k.variants:
            for arch in archs or k.archs:
                if arch not in envs:
                    envs[arch] = compile_env(manifest.env_for(arch))
                inputs = key_inputs(k, v, arch, digest, reached, envs[arch])
                p = Planned(k, v, arch, compute_key(inputs), inputs, sources)
                if p.key in seen:  # nothing tells them apart: no call could choose between them
                    raise CuteccError(f'variants "{seen[p.key]}" and "{v.id}" build the same artifact '
                                      "(their parameters change nothing the kernel is compiled with)",
                                      where=str(manifest.path), key_path=f'kernel "{k.name}", variants')
                seen[p.key] = v.id
                out.append(p)
