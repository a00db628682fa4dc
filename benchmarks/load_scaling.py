"""Group load_scaling: does `cutecc.load` + one call cost grow with unused cache entries?

Caches of N entries are synthesized from one real built entry (mul float32): it is
copied as is, and N-1 fillers are put under their own keys, each with
`key_inputs.constants.bench_filler = i` (so its key is the SHA-256 of its own inputs,
as `cutecc verify` and the loader check) and its own kernel name `filler_NNNNN`: every
filler is a kernel of its own, the worst case for listing names. A filler's library is
a hard link to the real one (`common.plant`). Each measurement is a fresh process
(benchmarks/loadchild.py).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import GroupResult, Row, plant, run_child, sample_row, summary

G = "load_scaling"
SIZES = (1, 100, 1000, 10000)
TARGET_S = 0.100


def real_entry(cache: Path, kernel: str = "mul", variant: str = "dtype=float32") -> Any:
    from cutecc.store import Store

    for e in Store(cache).entries():
        if e.doc.get("kernel") == kernel and e.doc.get("variant") == variant:
            return e
    raise LookupError(f"{kernel}[{variant}] is not in {cache}")


def synthesize(src: Any, dst: Path, n: int) -> None:
    """A cache at `dst` holding `src` and n-1 distinct valid filler entries (and the runtime
    library they link against)."""
    from cutecc.entry.rules import compute_key
    from cutecc.store import Store

    store = Store(dst)
    store.ensure()
    base = {k: v for k, v in src.doc.items() if k not in ("files", "key", "format")}
    items = [(src.key, base)]
    for i in range(n - 1):
        meta = copy.deepcopy(base)
        meta["key_inputs"]["constants"]["bench_filler"] = i
        meta["kernel"] = meta["key_inputs"]["kernel"] = f"filler_{i:05d}"
        items.append((compute_key(meta["key_inputs"]), meta))
    plant(store, src, items)


def run(cache: Path, repeats: int) -> GroupResult:
    res = GroupResult()
    src = real_entry(cache)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as d:
        caches = {}
        for n in SIZES:
            caches[n] = Path(d) / f"cache-{n}"
            synthesize(src, caches[n], n)
        walls: dict[int, list[float]] = {n: [] for n in SIZES}
        kids: dict[int, list[dict[str, Any]]] = {n: [] for n in SIZES}
        for _ in range(repeats):
            for n in SIZES:
                wall, out = run_child(["-m", "benchmarks.loadchild", str(caches[n])])
                assert out["kernels"] == n, out
                walls[n].append(wall)
                kids[n].append(out)
    res.data = {"walls": walls, "children": kids}
    for n in SIZES:
        k = kids[n]
        res.rows.append(sample_row(G, f"{n} entries: load + first lower (excl. import jax)",
                                   [x["load_plus_lower"] for x in k], "ms",
                                   note="import cutecc + load + trace/register/lower of 1 call"))
        res.rows.append(sample_row(G, f"{n} entries: load only", [x["load"] for x in k], "ms"))
        res.rows.append(sample_row(G, f"{n} entries: whole process", walls[n], "s",
                                   note="python start, import jax, load, lower, exit"))
        res.rows.append(sample_row(G, f"{n} entries: peak RSS", [x["rss_end"] for x in k], "MiB"))
        from_start = summary([x["rss_end"] - x["rss_start"] for x in k])["median"]
        res.rows.append(sample_row(G, f"{n} entries: RSS growth after import jax",
                                   [x["rss_end"] - x["rss_after_jax"] for x in k], "MiB",
                                   note=f"from process start: {from_start:.0f} MiB"))
    lo, hi = SIZES[1], SIZES[-1]
    m = {n: summary([x["load_plus_lower"] for x in kids[n]])["median"] for n in SIZES}
    res.rows.append(Row(G, f"load + first lower, {hi} / {lo} entries", "x", value=m[hi] / m[lo],
                        note="1.0 = flat in unused entries"))
    res.rows.append(Row(G, f"{hi} entries: load + first lower vs 100 ms", "ms", value=m[hi] * 1e3,
                        note=f"target < {TARGET_S * 1e3:.0f} ms (excl. import jax): "
                             f"{'met' if m[hi] < TARGET_S else 'missed'}"))
    return res
