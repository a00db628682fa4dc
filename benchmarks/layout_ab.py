"""A kernel's time in the old layout against the new one, in the same process on a GPU.

    python benchmarks/layout_ab.py prepare OUT      # on the build host (needs cutecc[build])
    python benchmarks/layout_ab.py run OUT [--json PATH] [--rounds N] [--dry-run]   # on a GPU

`prepare` builds the root kernels.toml into OUT/cache (the new layout: each kernel
library linked against the toolchain's runtime library) and, from the very same DSL
objects, links the old layout into OUT/fat: one self-contained library per kernel holding
the object, the wrapper, cutecc's runtime code, the DSL's dialect runtime and the static
CUDA runtime behind a version script that exports the kernel's symbol alone (what every
kernel.so was before the runtime library; same flags, zig, same sources otherwise).
`run` loads both (the fat libraries through the same verified load and registration, under
other target names), checks each variant of both against its jax.numpy reference, and
times them alternately, round after round, under jax.jit: the ratio is new / old.
Needs only what benchmarks/device.py needs. --dry-run lowers both for sm_90a without a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # cutecc's source, when it is not installed


def prepare(out: Path) -> None:
    from benchmarks.common import link_fat
    from cutecc.build.compiler import SYMBOL
    from cutecc.store import Store

    cache, objs = out / "cache", out / "objects"
    subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(REPO / "kernels.toml"),
                    "--cache-dir", str(cache), "--no-lock"], check=True, cwd=REPO)
    subprocess.run([sys.executable, "-m", "benchmarks.objchild", str(REPO / "kernels.toml"),
                    str(out / "objects.json"), "--keep", str(objs)], check=True, cwd=REPO)
    fat: dict[str, Any] = {}
    for e in Store(cache).entries():
        label = f"{e.doc['kernel']}[{e.doc['variant']}]"
        fake = hashlib.sha256(b"fat" + e.key.encode()).hexdigest()  # its own target name
        d = out / "fat" / "entries" / fake[:2] / fake
        d.mkdir(parents=True)
        link_fat(objs / f"{label}.o", d / "kernel.so", SYMBOL, entry=e.doc["entry"],
                 arch=e.doc["arch"], key=e.key)
        shutil.copyfile(e.path / "meta.json", d / "meta.json")  # read (not parsed) by the loader
        data = (d / "kernel.so").read_bytes()
        fat[e.key] = {"key": fake, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                      "label": label, "new_size": e.doc["files"]["kernel.so"]["size"]}
    (out / "fat.json").write_text(json.dumps(fat, indent=1))
    print(f"prepared {len(fat)} variants in {out}: new layout in cache/, old layout in fat/")


class _Fat:
    """The old-layout libraries as a kernel set: the new set's kernels, each build pointing
    at its fat library (and no runtime library)."""

    def __init__(self, ks: Any, out: Path) -> None:
        import dataclasses

        from cutecc.runtime.dispatch import KernelFn

        fat = json.loads((out / "fat.json").read_text())
        self._fns = {}
        for name in ks:
            builds = []
            for b in ks[name].builds:
                f = fat[b.key]
                lib = out / "fat" / "entries" / f["key"][:2] / f["key"] / "kernel.so"
                builds.append(dataclasses.replace(b, key=f["key"], library=lib, sha256=f["sha256"],
                                                  size=f["size"], runtime=None, record_use=False))
            self._fns[name] = KernelFn(name, builds, arch=ks.arch)

    def __iter__(self) -> Any:
        return iter(sorted(self._fns))

    def __getitem__(self, name: str) -> Any:
        return self._fns[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._fns[name]


def run(out: Path, rounds: int, dry: bool) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import cutecc
    from benchmarks import device

    ks = cutecc.load(out / "cache", arch="sm_90a" if dry else None)
    old = _Fat(ks, out)
    new_cases, old_cases = device.cases(ks, big=not dry), device.cases(old, big=not dry)
    res: dict[str, Any] = {"device": "dry run (lowered for sm_90a)" if dry else jax.devices()[0].device_kind,
                           "kernels": {}}
    key = jax.random.key(0)
    for cn, co in zip(new_cases, old_cases):
        assert cn["name"] == co["name"]
        keys = jax.random.split(key, len(cn["shapes"]) + 1)
        key = keys[0]
        if dry:
            specs = [jax.ShapeDtypeStruct(s, jnp.dtype(cn["dtype"])) for s in cn["shapes"]]
            for c in (cn, co):
                jax.jit(c["ours"]).trace(*specs).lower(lowering_platforms=("cuda",))
            res["kernels"][cn["name"]] = "lowered"
            continue
        args = [jax.random.normal(k, s, jnp.float32).astype(jnp.dtype(cn["dtype"]))
                for k, s in zip(keys[1:], cn["shapes"])]
        donate = cn.get("donate")
        fns = {w: jax.jit(c["ours"], donate_argnums=() if donate is None else donate)
               for w, c in (("new", cn), ("old", co))}
        want = jax.tree.leaves(jax.jit(cn["ref"])(*args))
        for w, c in (("new", cn), ("old", co)):  # both correct before either is timed
            got = jax.tree.leaves(jax.jit(c["ours"])(*args))
            err = max(device._close(g, r, cn["dtype"]) for g, r in zip(got, want))
            assert err <= device.TOL[cn["dtype"]], f"{cn['name']} ({w} layout): relative error {err:.3g}"
        times: dict[str, list[float]] = {"new": [], "old": []}
        for _ in range(rounds):  # alternating, so drifts of clock or temperature hit both
            for w in ("new", "old"):
                t = (device.timeit(fns[w], *args, runs=10, inner=5) if donate is None
                     else device.timeit_inplace(fns[w], args, donate, 10))
                times[w] += t
        med = {w: statistics.median(t) for w, t in times.items()}
        res["kernels"][cn["name"]] = {"new_ms": device.stats(times["new"], 1e3),
                                      "old_ms": device.stats(times["old"], 1e3),
                                      "new_over_old": med["new"] / med["old"]}
        del args
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("prepare", "run"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dry-run", action="store_true")
    ns = ap.parse_args()
    if ns.mode == "prepare":
        prepare(ns.out)
        return 0
    import jax

    if not ns.dry_run and not any(d.platform == "gpu" for d in jax.devices()):
        print("skipped: no GPU visible to JAX (use --dry-run to lower without one)")
        return 0
    res = run(ns.out, ns.rounds, ns.dry_run)
    for name, r in res["kernels"].items():
        if isinstance(r, str):
            print(f"{name:34} {r}")
        else:
            print(f"{name:34} new {r['new_ms']['median']:.4f} ms  old {r['old_ms']['median']:.4f} ms  "
                  f"new/old {r['new_over_old']:.3f}")
    if ns.json:
        ns.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
