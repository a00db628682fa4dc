"""Just-in-time builds for development: a call no built variant fits compiles the variant
that serves it, through the pipeline and key `cutecc build` uses, into the same cache.

The runtime imports nothing of the build side: it offers a miss hook
(`cutecc.runtime.jit_hook`) where a builder registers, and `cutecc.load` (the top-level
package) registers `JitBuilder`, this module imported at the first miss only, where the DSL
is installed and the user asked (`jit=True`, `$CUTECC_JIT=1`). For one miss: the manifest's
variant that takes the call, else the variant the call's values add to its `variants` table,
planned for the best arch of the kernel's `archs` that runs on this GPU, else the arch
`cutecc build --arch` would be told (`cutecc.plan.cover.plan_call`, what `cutecc misses
--toml` prints too), then probed, compiled, checked and published by
`cutecc.build.builder.run` as a one-entry build. Its key is the one a
`cutecc build` of a manifest declaring that variant computes, so that build finds it
cached. Its workers put the manifest's python_path first on `sys.path` (even where the calling
script has it further back) and prove what the compile read covered by the key
(`cutecc.build.read_set`), as `cutecc build`'s do. A JIT build records no generation and
writes no lock: `cutecc.load()` without `jit` offers the entry once a `cutecc build` of a
manifest declaring it records it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from cutecc.build import builder
from cutecc.errors import CuteccError
from cutecc.plan.build_plan import plan
from cutecc.plan.cover import plan_call
from cutecc.runtime.jit_hook import Built
from cutecc.settings import BuildOptions
from cutecc.store.misses import Miss
from cutecc.store.view import StoreView
from cutecc.store.writer import Store
from cutecc.toolchain.dists import HashCache


class JitBuilder:
    """Builds the variant serving a missed call into the cache at `cache_dir`, from the
    manifest at `manifest` (None: the one the kernel's newest build recorded, else the
    project's, found as `cutecc build` finds it)."""

    def __init__(self, cache_dir: Path, manifest: Path | None, options: BuildOptions) -> None:
        self.cache_dir = cache_dir
        self.manifest = manifest
        self.options = options  # how to build (one compile at a time)
        self._lock = threading.Lock()

    def manifest_of(self, kernel: str) -> Path:
        if self.manifest is not None:
            return self.manifest
        recorded = StoreView(self.cache_dir).generation_manifest(kernel)
        if recorded is not None and recorded.is_file():
            return recorded
        from cutecc.manifest import find_manifest

        return find_manifest()

    def build(self, m: Miss) -> Built:
        """Compile (or find cached) the entry serving the call `m` describes; a CuteccError
        says why none can (a contract change, a failed compile), naming the manifest."""
        with self._lock:  # one compile at a time per cache: two threads missing alike share it
            path = self.manifest_of(m.kernel)
            manifest, selected, variant, arch = plan_call(path, m)
            store = Store(self.cache_dir)
            hashes = HashCache(store.layout.hash_cache(), write=True)
            # `candidates`: recorded as no build's generation and no lock, as tuning candidates are
            target = builder.Target(manifest, selected,
                                    tuple(plan(selected, (arch,), hash_cache=hashes)),
                                    partial=True, candidates=True)
            how = builder.settings(manifest, self.options)
            done = builder.run(target, store, how, hashes=hashes)
            (o,) = done.outcomes
            if o.status not in ("built", "cached"):
                raise CuteccError(f"the just-in-time build of variant {variant.id} for {arch} failed: "
                                  f"{o.error}", where=str(path), key_path=f'kernel "{m.kernel}"')
            return Built(o.planned.key, variant.id, arch, o.status == "built", o.seconds)


def builder_for(cache_dir: Path, manifest: Path | None) -> JitBuilder:
    """A `JitBuilder` told how to build by the environment as `cutecc.load` found it (its
    edge: `cutecc.settings`): the factory `cutecc.load` registers with the runtime's miss
    hook (`cutecc.runtime.jit_hook.register_builder`)."""
    return JitBuilder(cache_dir, manifest, BuildOptions.from_environment(jobs=1))
