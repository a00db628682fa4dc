"""Planning: every (kernel, variant, arch, platform) a manifest asks for, with its cache key.

Reads source files to key them (never imports them), so planning needs neither the DSL
nor JAX: `build`, `explain` and `pack --manifest` all start here.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutecc.contract.args import Arg, ConstArg, StructArg, TupleArg
from cutecc.entry.rules import compute_key, label
from cutecc.errors import CuteccError
from cutecc.manifest import Kernel, Manifest, Variant, split_entry
from cutecc.plan.key import SourceIndex, key_inputs
from cutecc.plan.keyed_sources import KeyedFile
from cutecc.plan.shadows import Shadows, shadows
from cutecc.platforms import BUILD_PLATFORM
from cutecc.toolchain import devicequery
from cutecc.toolchain.dists import DistIndex, HashCache, compile_env


@dataclass(frozen=True)
class Planned:
    """One artifact the manifest asks for."""

    kernel: Kernel
    variant: Variant
    arch: str
    key: str
    inputs: dict[str, Any]
    sources: tuple[str, ...]
    platform: str = BUILD_PLATFORM  # the host platform of the library's host code
    # the source files the key read, which the build worker checks again after compiling
    keyed_files: tuple[KeyedFile, ...] = ()
    # the distributions the key reached, as the lock's environment names them
    # (`DistIndex.environment`: by their installed files, however the key took them)
    environment: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return label(self.kernel.name, self.variant.id, self.arch, self.platform)


def plan(manifest: Manifest, archs: tuple[str, ...] = (), *,
         hash_cache: Path | HashCache | None = None,
         platforms: tuple[str, ...] = ()) -> list[Planned]:
    """Every artifact of the manifest with its key; `archs` and `platforms` override the
    manifest's.
    `hash_cache`: a file remembering files' digests and parsed facts across runs, by their
    stamps (`cutecc.toolchain.hashcache.HashCache`), so that a no-op build reads no unchanged source; or
    such a cache, which the caller may save again (once the store exists)."""
    cache = hash_cache if isinstance(hash_cache, HashCache) else HashCache(hash_cache)
    index = SourceIndex(manifest.python_path, cache)
    installed = DistIndex(cache)
    envs: dict[str, dict[str, str]] = {}
    out: list[Planned] = []
    scans: dict[str, list[tuple[str, str]]] = {}  # `shadows`' memo for this pass
    paused = gc.isenabled()  # planning makes ~a million short-lived objects and few cycles:
    gc.disable()  # the collector's passes over all it holds cost more than they free
    try:
        declared = declared_inputs(manifest)
        _plan(manifest, archs, platforms or manifest.platforms, index, installed, envs, out, scans, declared)
    finally:
        if paused:
            gc.enable()
        cache.save()
    return out


def _plan(manifest: Manifest, archs: tuple[str, ...], platforms: tuple[str, ...], index: SourceIndex,
          installed: DistIndex, envs: dict[str, dict[str, str]], out: list[Planned],
          scans: dict[str, list[tuple[str, str]]], declared: tuple[KeyedFile, ...] = ()) -> None:
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
        modules = index.reached_modules(k.module)
        entry_files = index.files(k.module)
        reached: dict[frozenset[str], dict[str, str]] = {}
        environments: dict[frozenset[str], dict[str, str]] = {}
        shadowed: dict[frozenset[str], Shadows] = {}
        seen: dict[str, str] = {}
        for v in k.variants:
            imports, ref_modules = _imported(manifest, index, k, v, set(sources))
            keyed = entry_files + declared
            if imports:  # modules the variant's values name beyond the entry's closure
                more = {f.path: f for m in sorted(imports) for f in index.files(m)}
                more.update((f.path, f) for f in (*entry_files, *declared))
                keyed = tuple(more.values())
            key_modules = frozenset(modules | ref_modules)
            if key_modules not in reached:
                reached[key_modules] = installed.reached(key_modules)
                environments[key_modules] = installed.environment(reached[key_modules])
                # modules found ahead of what the reached distributions install
                shadowed[key_modules] = shadows(index, installed, reached[key_modules], key_modules,
                                                 scans)
            if shadowed[key_modules].files:
                more = {f.path: f for f in keyed}
                more.update((f.path, f) for f in shadowed[key_modules].files)
                keyed = tuple(more.values())
            for arch, platform in [(a, p) for a in archs or k.archs for p in platforms]:
                if arch not in envs:
                    envs[arch] = compile_env(manifest.env_for(arch))
                inputs = key_inputs(k, v, arch, digest, reached[key_modules], envs[arch], imports,
                                    platform, shadowed[key_modules].digests,
                                    devicequery.asks_hardware_info(key_modules))
                if declared:  # only when declared: projects without `[build] inputs` keep their keys
                    inputs["inputs"] = {f.rel.removeprefix(INPUTS): f.sha256 for f in declared}
                p = Planned(k, v, arch, compute_key(inputs), inputs, sources, platform, keyed,
                            environments[key_modules])
                if p.key in seen:  # nothing tells them apart: no call could choose between them
                    raise CuteccError(f'variants "{seen[p.key]}" and "{v.id}" build the same artifact '
                                      "(their parameters change nothing the kernel is compiled with)",
                                      where=str(manifest.path), key_path=f'kernel "{k.name}", variants')
                seen[p.key] = v.id
                out.append(p)


INPUTS = "inputs/"  # a declared input's name in the keyed files


def declared_inputs(manifest: Manifest) -> tuple[KeyedFile, ...]:
    """The files `[build] inputs` names (globs, relative to the manifest), hashed: each
    kernel's key covers them by content, and the worker re-hashes them after its compile
    (`cutecc.plan.keyed_sources`). A pattern that matches no file is an error."""
    from cutecc.plan.keyed_sources import file_sha256

    base = manifest.path.parent.resolve()
    found: dict[str, Path] = {}
    for pattern in manifest.build.inputs:
        hits = [p for p in sorted(base.glob(pattern)) if p.is_file()]
        if not hits:
            raise CuteccError(f'"{pattern}" matches no file under {base}', where=str(manifest.path),
                              key_path="build.inputs")
        for p in hits:
            if not p.resolve().is_relative_to(base):
                raise CuteccError(f"{p} is outside the manifest's directory", where=str(manifest.path),
                                  key_path="build.inputs")
            found[p.relative_to(base).as_posix()] = p
    return tuple(KeyedFile(str(p), "", INPUTS + rel, file_sha256(str(p))) for rel, p in sorted(found.items()))


def references(v: Variant) -> list[tuple[str, str]]:
    """(key path, "pkg.mod:attr") of every object a variant's build imports besides its
    entry: `{ import = .. }` and `{ call = .. }` values in factory_args, constants and const
    arguments (variant values included), and struct types."""
    out: list[tuple[str, str]] = []

    def value(where: str, x: Any) -> None:
        if isinstance(x, list):
            for i, item in enumerate(x):
                value(f"{where}[{i}]", item)
        elif isinstance(x, dict):
            for m in ("import", "call"):
                if m in x:
                    out.append((f"{where}.{m}", x[m]))
            for i, item in enumerate(x.get("args", ())):
                value(f"{where}.args[{i}]", item)
            for k, item in (x.get("kwargs") or {}).items():
                value(f"{where}.kwargs.{k}", item)
            if "value" in x:
                value(f"{where}.value", x["value"])

    def arg(where: str, a: Arg) -> None:
        if isinstance(a, ConstArg):
            value(f"{where}.value", a.value)
        elif isinstance(a, StructArg):
            out.append((f"{where}.type", a.type))
            for name, f in a.fields:
                arg(f"{where}.fields.{name}", f)
        elif isinstance(a, TupleArg):
            for i, item in enumerate(a.items):
                arg(f"{where}.items[{i}]", item)

    for k, x in v.factory_args or ():
        value(f"factory_args.{k}", x)
    for k, x in v.constants:
        value(f"constants.{k}", x)
    for i, a in enumerate(v.args):
        arg(f"args[{i}]", a)
    return out


def _imported(manifest: Manifest, index: SourceIndex, k: Kernel, v: Variant,
              entry_sources: set[str]) -> tuple[dict[str, str], set[str]]:
    """What a variant's references (`references`) add to its key: `{module: source digest}`
    for each project-local module (or one of the entry's own package) whose source the
    entry's closure does not already cover, and the names of all of them, whose installed
    distributions key the rest. A module not found, or surely lacking the name,
    is an error naming the manifest value."""
    imports: dict[str, str] = {}
    modules: set[str] = set()
    vid = f", variant {v.id}" if v.params else ""
    for where, target in references(v):
        module, _, attr = target.partition(":")
        top = module.split(".")[0]
        modules.add(module)
        key_path = f'kernel "{k.name}"{vid}, {where}'
        why = index.missing(module)
        if why is not None:
            raise CuteccError(f'cannot find module "{module}": {why}', where=str(manifest.path),
                              key_path=key_path)
        if index.lacks(module, attr.split(".")[0]):
            raise CuteccError(f'module "{module}" defines no "{attr.split(".")[0]}"',
                              where=str(manifest.path), key_path=key_path)
        if top != k.module.split(".")[0] and not index.is_local(top):
            continue  # installed: its distribution is keyed (`modules`)
        try:
            digest, rels = index.digest(module)
        except CuteccError as e:
            raise CuteccError(e.message, where=e.where or str(manifest.path), key_path=key_path) from None
        if not set(rels) <= entry_sources:
            imports[module] = digest
        modules |= index.reached_modules(module)  # what its own imports reach is keyed too
    return imports, modules
