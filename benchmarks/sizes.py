"""Group sizes: bytes per variant against its object, link seconds per kernel, pack sizes.

Root manifest: every variant's object is compiled again in a child
(benchmarks/objchild.py, exactly as a worker compiles it) and compared with its
`kernel.so` in the example cache; the root manifest is packed into a wheel
(`cutecc pack`). Generated manifest: the kernel of benchmarks/noop_rebuild.py with N
variants (default 1,000: 4 block sizes x N/4 compile-time constants), built for real into
a fresh cache (`cutecc build -j nproc`, timed) and packed; objects are compiled for an
evenly spaced sample of its variants. Link seconds: `linker.link` of each compiled object
against the runtime library (zig's cache warm), and the runtime library's own link.
Shipped per variant = what a pack holds for it: its `kernel.so` and `meta.json`, plus
its share of the runtime library.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks import noop_rebuild
from benchmarks.common import REPO, GroupResult, Row, run_child, sample_row, summary

G = "sizes"
RATIO_GOAL = 2.0
PACK_GOAL_MB = 2.0


def _objects(manifest: Path, out: Path, variants: list[str] | None = None) -> dict[str, Any]:
    run_child(["-m", "benchmarks.objchild", str(manifest), str(out), *(variants or [])])
    return json.loads(out.read_text())


def _cache_sizes(cache: Path) -> dict[str, dict[str, int]]:
    """Per entry label: kernel.so and meta.json bytes."""
    from cutecc.store import Store

    out = {}
    for e in Store(cache).entries():
        out[f"{e.doc['kernel']}[{e.doc['variant']}]"] = {
            "library": (e.path / e.doc["library"]).stat().st_size,
            "meta": (e.path / "meta.json").stat().st_size}
    return out


def _pack(manifest: Path, cache: Path, out: Path) -> dict[str, Any]:
    _, rep = run_child(["-m", "cutecc.cli", "pack", "--manifest", str(manifest), "--name", "bench",
                        "--version", "1.0", "--cache-dir", str(cache), "--out", str(out), "--json"])
    return rep


def _rows(res: GroupResult, what: str, objs: dict[str, Any], sizes: dict[str, dict[str, int]],
          runtime: int, n: int) -> None:
    labels = [k for k in objs["variants"] if k in sizes]
    obj = [objs["variants"][k]["object"] for k in labels]
    lib = [sizes[k]["library"] for k in labels]
    meta = [sizes[k]["meta"] for k in labels]
    res.rows.append(sample_row(G, f"{what}: the DSL's object per variant", obj, "KiB",
                               note=f"{len(labels)} variants compiled"))
    res.rows.append(sample_row(G, f"{what}: kernel.so per variant", lib, "KiB"))
    ratio = [b / a for a, b in zip(obj, lib)]
    res.rows.append(sample_row(G, f"{what}: kernel.so / object", ratio, "x",
                               note=f"goal <= {RATIO_GOAL:.0f}x: "
                                    f"{'met' if max(ratio) <= RATIO_GOAL else 'missed'} (max)"))
    res.rows.append(sample_row(G, f"{what}: kernel.so + meta.json / object",
                               [(b + m) / a for a, b, m in zip(obj, lib, meta)], "x",
                               note="what a pack holds per variant"))
    res.rows.append(sample_row(G, f"{what}: kernel.so + meta.json + runtime/{n} / object",
                               [(b + m + runtime / n) / a for a, b, m in zip(obj, lib, meta)], "x",
                               note="the runtime library's share"))


def run(cache: Path, root: Path, variants: int = 1000, sample: int = 20) -> GroupResult:
    res = GroupResult()
    from cutecc.store import Store

    # The root manifest ------------------------------------------------------------------
    manifest = REPO / "kernels.toml"
    objs = _objects(manifest, root / "root-objects.json")
    sizes = _cache_sizes(cache)
    [rt] = list(Store(cache).runtimes())
    runtime = (rt.path / rt.doc["library"]).stat().st_size
    n_root = len(sizes)
    _rows(res, f"root kernels.toml ({n_root} variants)", objs, sizes, runtime, n_root)
    res.rows.append(Row(G, "runtime library (once per toolchain)", "KiB", value=runtime / 1024,
                        note=f"link {objs['runtime']['link_s']:.3f} s"))
    pack = _pack(manifest, cache, root / "dist-root")
    mb = pack["file_bytes"] / 1e6
    verdict = "met" if mb < PACK_GOAL_MB else "missed"
    res.rows.append(Row(G, f"root kernels.toml pack (wheel, {n_root} variants + runtime)", "MB",
                        value=mb, note=f"{pack['total_bytes'] / 1e6:.2f} MB uncompressed; "
                                       f"goal < {PACK_GOAL_MB:.0f} MB: {verdict}"))
    links = [v["link_s"] for v in objs["variants"].values()]

    # A generated manifest ---------------------------------------------------------------
    d = root / f"gen-{variants}"
    (d / "bench_kernels").mkdir(parents=True)
    (d / "bench_kernels" / "__init__.py").write_text("")
    (d / "bench_kernels" / "ops.py").write_text(noop_rebuild.KERNEL)
    gen = d / "kernels.toml"
    gen.write_text(noop_rebuild.manifest(variants))
    jobs = str(os.cpu_count() or 1)
    wall, rep = run_child(["-m", "cutecc.cli", "build", str(gen), "--cache-dir", str(d / "cache"),
                           "-j", jobs, "--no-lock", "--json"], timeout=7200)
    assert rep["failed"] == 0 and rep["built"] == variants, {k: rep[k] for k in ("built", "failed")}
    res.rows.append(Row(G, f"generated manifest: cold build of {variants} variants, -j {jobs}", "s",
                        value=wall, note=f"{wall / variants:.3f} s per variant"))
    from cutecc.manifest import load_manifest

    ids = [v.id for v in load_manifest(gen).kernels[0].variants]
    step = max(1, len(ids) // sample)
    objs = _objects(gen, d / "objects.json", ids[::step][:sample])
    sizes = _cache_sizes(d / "cache")
    _rows(res, f"generated manifest ({variants} variants)", objs, sizes, runtime, variants)
    libs = [s["library"] for s in sizes.values()]
    res.rows.append(sample_row(G, f"generated manifest: kernel.so, all {variants} variants", libs, "KiB"))
    pack = _pack(gen, d / "cache", d / "dist")
    res.rows.append(Row(G, f"generated manifest pack (wheel, {variants} variants + runtime)", "MB",
                        value=pack["file_bytes"] / 1e6,
                        note=f"{pack['total_bytes'] / 1e6:.1f} MB uncompressed; "
                             f"{pack['file_bytes'] / variants / 1024:.1f} KiB per variant"))
    links += [v["link_s"] for v in objs["variants"].values()]
    res.rows.append(sample_row(G, "link per kernel (zig, against the runtime library)", links, "ms",
                               note=f"{len(links)} kernels"))
    res.data = {"links_s": links, "runtime_bytes": runtime, "generated_pack": pack,
                "median_link_s": statistics.median(links), "libs": summary([float(x) for x in libs])}
    return res
