"""What a build worker imports before its first job (`Preload`), forked or spawned alike.

A compile service imports it once and forks its workers from that state; a spawned worker
imports the same before it says ready, so both kinds compile from the same state: the DSL,
cutecc's compile side, torch when the pool's kernels reach it, and the kernels' entry
modules that installed libraries provide (`preloads`). A cold build guesses it before it
plans (`guess`), so the service's imports overlap planning; `covers` tells whether the
guess held.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Preload:
    """What a worker imports before it says ready, forked or spawned alike (so both kinds
    of worker compile from the same state): the DSL, cutecc's compile side, torch when the
    pool's kernels reach it, then the kernels' entry modules that come from installed
    libraries (quack, FA4: seconds of imports), with the manifest's python_path ahead on
    sys.path and the pool's device answers given, as a compile imports them. The project's
    own modules are left to the compiles: one that hangs, crashes or starts processes at
    import fails its entry alone, within its compile's bounds."""

    modules: tuple[str, ...] = ()
    entries: tuple[str, ...] = ()
    python_path: tuple[str, ...] = ()
    device: dict[str, Any] | None = None


NOTHING = Preload()


def _installed_module(entry: str, python_path: tuple[str, ...]) -> str | None:
    """The module of `entry` when an installed library provides it (not the project's)."""
    from cutecc.manifest import split_entry

    module = split_entry(entry)[0].partition(":")[0]
    top = module.split(".")[0]
    local = any((Path(r) / top).exists() or (Path(r) / f"{top}.py").exists() for r in python_path)
    return None if local else module


def _modules(torch: bool) -> tuple[str, ...]:
    return ("cutlass", "cutlass.cute", *(("torch",) if torch else ()), "cutecc.build.compiler",
            "cutecc.build.linker")


def preloads(jobs: list[Any]) -> Preload:
    """The `Preload` of a pool's `jobs` (`cutecc.build.workers.BuildJob`s of one worker kind)."""
    torch = any(j.device is not None or "torch" in (j.key_inputs.get("distributions") or {}) for j in jobs)
    entries: list[str] = []
    for j in jobs:
        module = _installed_module(j.entry, j.python_path)
        if module is not None and module not in entries:
            entries.append(module)
    return Preload(_modules(torch), tuple(entries), jobs[0].python_path if jobs else (),
                   jobs[0].device if jobs else None)


def guess(manifest: Any) -> tuple[str, dict[str, str], Preload] | None:
    """Before planning: the arch, [env] and `Preload` of the first pool planning will most
    likely give `manifest` (`preloads` of its jobs): a kernel from an installed library
    reaches torch when torch is installed, a project's own kernel does not. Its service can
    then import while the build plans (`cutecc.build.executors.local.prestart`); `covers` tells
    whether the guess held. None for a manifest without kernels."""
    from cutecc.toolchain import devicequery

    if not manifest.kernels:
        return None
    first = manifest.kernels[0]
    if not first.archs:
        return None
    arch = first.archs[0]
    path = tuple(str(p) for p in manifest.python_path)
    torch = importlib.util.find_spec("torch") is not None

    def device(k: Any) -> dict[str, Any] | None:
        if not torch or _installed_module(k.entry, path) is None:
            return None
        return devicequery.answers(dict(k.hardware), arch, k.profile)

    dev = device(first)
    entries: list[str] = []
    for k in manifest.kernels:
        module = _installed_module(k.entry, path)
        if arch in k.archs and device(k) == dev and module is not None and module not in entries:
            entries.append(module)
    return arch, manifest.env_for(arch), Preload(_modules(dev is not None), tuple(entries), path, dev)


def covers(final: Preload, guessed: Preload) -> bool:
    """Whether a service that imported `guessed` can serve a pool of `final`: the same path
    and device answers, nothing imported that `final` does not name (the rest it imports
    before it says ready)."""
    return (guessed.python_path == final.python_path and guessed.device == final.device
            and set(guessed.modules) <= set(final.modules) and set(guessed.entries) <= set(final.entries))


def preload(what: Preload) -> None:
    """Import what `what` names; a module that fails is left for the compile that needs it
    to report. What the imports made then leaves the cyclic collector's care (`gc.freeze`):
    it lives as long as the worker, and each full collection during a compile would walk
    it all (~440,000 objects with torch and quack; ~5% of a compile's CPU)."""
    for m in what.modules:
        with contextlib.suppress(Exception):
            importlib.import_module(m)
    from cutecc.build import read_set

    if what.entries:
        from cutecc.plan.keyed_sources import front
        from cutecc.toolchain import devicequery

        front(what.python_path)  # as `cutecc.build.compiler.compile_to_object` puts them
        # what each import records is charged to the jobs whose key reaches the modules
        # that recorded it, not to every job of the pool (`read_set.preloading`)
        with devicequery.answering(what.device, probe=False), read_set.preloading():
            for m in what.entries:
                with contextlib.suppress(Exception):
                    importlib.import_module(m)
    read_set.prepare()  # which installed file is whose, what is exempt: forked workers inherit it
    gc.collect()
    gc.freeze()
