"""Shared by the groups: statistics, fresh-process runs, result rows, the environment."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
ARCH = "sm_90a"


def summary(xs: list[float]) -> dict[str, float]:
    """Median, min, max and quartiles of a sample (n = 1 gives all equal)."""
    s = sorted(xs)
    q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else (s[0],) * 3
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "q1": q1, "q3": q3,
            "n": len(s)}


def run_child(args: list[str], env: dict[str, str] | None = None,
              timeout: float = 1200) -> tuple[float, dict[str, Any]]:
    """Run `python ARGS` from the repository root in a fresh process.

    Returns (wall seconds measured here, the last JSON object the child printed).
    """
    full_env = {**os.environ, **(env or {})}
    t0 = time.perf_counter()
    r = subprocess.run([PY, *args], capture_output=True, text=True, env=full_env, cwd=REPO,
                       timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    try:
        return wall, json.loads(r.stdout)  # one JSON document (`cutecc build --json`)
    except ValueError:
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        return wall, (json.loads(lines[-1]) if lines else {})


def dsl_available() -> bool:
    """Whether the CuTe DSL is installed (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("cutlass") is not None


def version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def machine() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(), "nproc": os.cpu_count(), "cpu": cpu,
        "python": platform.python_version(),
        "packages": {p: version(p) for p in ("jax", "jaxlib", "nvidia-cutlass-dsl", "apache-tvm-ffi",
                                             "jax-tvm-ffi")},
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(PY).name, "-m", "benchmarks", *sys.argv[1:]]),
    }


@dataclass
class Row:
    """One line of the table: a measured sample (stats) or a derived figure (value)."""

    group: str
    name: str
    unit: str  # "s", "ms", "MiB", "x"
    stats: dict[str, float] | None = None
    value: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "unit": self.unit, "stats": self.stats,
                "value": self.value, "note": self.note}


def sample_row(group: str, name: str, xs: list[float], unit: str = "s", note: str = "") -> Row:
    scale = {"s": 1.0, "ms": 1e3, "MiB": 1.0, "KiB": 1 / 1024, "x": 1.0}[unit]
    return Row(group, name, unit, stats=summary([x * scale for x in xs]), note=note)


@dataclass
class GroupResult:
    rows: list[Row] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def table(rows: list[Row]) -> str:
    out = ["| group | measurement | median | min - max | n | note |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.stats is not None:
            s = r.stats
            med, spread, n = (f"{_fmt(s['median'])} {r.unit}",
                              f"{_fmt(s['min'])} - {_fmt(s['max'])}", str(s["n"]))
        else:
            med, spread, n = (f"{_fmt(r.value)} {r.unit}" if r.value is not None else "-"), "", ""
        out.append(f"| {r.group} | {r.name} | {med} | {spread} | {n} | {r.note} |")
    return "\n".join(out)


def plant(store: Any, src: Any, items: list[tuple[str, dict[str, Any]]]) -> None:
    """Copies of the entry `src` under other keys, put straight into `store`: for each (key,
    metadata without files/key/format), the files `Store.publish` would write (meta.json
    with the same file records, the library as a hard link, the index record), without its
    per-entry locks and fsyncs, so a cache of 10,000 entries takes seconds to make. Only for
    setting up benchmarks; the runtime library `src` links against is copied along."""
    import json
    import shutil

    from cutecc.entry.meta import EntryMeta
    from cutecc.entry.rules import ENTRY_FORMAT, META, meta_stamp, runtime_record
    from cutecc.store.index_record import IndexRecord

    rec = runtime_record(src.doc)
    if rec is not None and store.get_runtime(rec["key"]) is None:
        shutil.copytree(src.path.parents[2] / "runtimes" / rec["key"][:2] / rec["key"],
                        store.layout.runtime(rec["key"]))
    lib = src.doc["library"]
    for key, meta in items:
        d = store.layout.entry(key)
        d.mkdir(parents=True, exist_ok=True)
        if not (d / lib).exists():
            try:
                os.link(src.path / lib, d / lib)
            except OSError:
                shutil.copyfile(src.path / lib, d / lib)
        full = {**meta, "files": src.doc["files"], "format": ENTRY_FORMAT, "key": key}
        (d / META).write_text(json.dumps(full, indent=1, sort_keys=True))
        (store.index_dir / meta["kernel"]).mkdir(parents=True, exist_ok=True)
        stamp = meta_stamp(os.stat(d / META))
        record = IndexRecord.of_meta(key, EntryMeta.parse(full, key), stamp)
        (store.index_dir / meta["kernel"] / key).write_bytes(record.dumps())


def link_fat(obj: Path, out: Path, symbol: str, *, entry: str, arch: str, key: str) -> None:
    """Link a DSL object into one self-contained library (the object, cutecc's wrapper and
    runtime code, the dialect runtime and the static CUDA runtime, exporting `symbol` alone):
    what every kernel.so was before the runtime library, and what a direct build of a
    launcher loads as, with nothing beside it."""
    from cutecc.build import linker
    from cutecc.build.compiler import INNER_SYMBOL

    p = linker.toolchain_paths()
    vs = out.with_name(out.name + ".map")
    vs.write_text(f"{{ global: __tvm_ffi_{symbol}; local: *; }};\n")
    try:
        linker._zig_cc(p, [
            "-shared", "-o", str(out), str(obj), str(linker.WRAPPER_SOURCE), str(linker.RUNTIME_SOURCE),
            f"-DCUTECC_EXPORT=__tvm_ffi_{symbol}", f"-DCUTECC_INNER=__tvm_ffi_{INNER_SYMBOL}",
            f"-DCUTECC_ENTRY={linker.c_string(entry)}", f"-DCUTECC_ARCH={linker.c_string(arch)}",
            f"-DCUTECC_KEY={linker.c_string(key[:12])}", '-DCUTECC_RT_LABEL="fat"',
            f"-I{p['tvm_include']}", "-Wl,--whole-archive", str(p["dialect_rt"]),
            "-Wl,--no-whole-archive", str(p["cudart"]), f"-L{p['tvm_lib']}", "-ltvm_ffi", "-ldl",
            "-lpthread", "-lrt", f"-Wl,--version-script={vs}"], out)
    finally:
        vs.unlink(missing_ok=True)


def launcher_fake(a: Any, syms: dict[str, Any]) -> Any:
    """The DSL placeholder of one manifest argument as the launcher itself takes it (a
    compact row-major tensor, a scalar of its default, None, the tvm-ffi stream, a const,
    a struct of its fields); `syms` shares symbolic extents between tensors."""
    import cutlass
    import cutlass.cute as cute

    from cutecc.build.compiler import import_path, resolve_value
    from cutecc.contract import dtypes
    from cutecc.contract.args import ConstArg, NoneArg, ScalarArg, StreamArg, StructArg, TensorArg

    if isinstance(a, TensorArg):
        dims = tuple(d if isinstance(d, int) else syms.setdefault(d, cute.sym_int()) for d in a.shape)
        return cute.runtime.make_fake_compact_tensor(
            getattr(cutlass, dtypes.DTYPES[a.dtype].cutlass), dims,
            stride_order=tuple(range(len(dims) - 1, -1, -1)), assumed_align=a.align)
    if isinstance(a, ScalarArg):
        return getattr(cutlass, dtypes.DTYPES[a.dtype].cutlass)(a.default or 0)
    if isinstance(a, NoneArg):
        return None
    if isinstance(a, StreamArg):
        return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    if isinstance(a, ConstArg):
        return resolve_value(a.value)
    if isinstance(a, StructArg):
        return import_path(a.type)(**{k: launcher_fake(f, syms) for k, f in a.fields})
    return tuple(launcher_fake(i, syms) for i in a.items)


def code_versions(before: str | None, scratch: Path) -> dict[str, Path]:
    """The cutecc trees a before/after benchmark runs, by name: this checkout ("after") and,
    with `before`, that git revision checked out under `scratch`; each byte-compiled, as an
    installed package is."""
    import subprocess
    import sys

    versions = {"after": REPO}
    if before:
        from benchmarks.noop_installed import checkout

        versions = {"before": checkout(before, scratch / "before"), **versions}
    for code in versions.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "cutecc")], check=True,
                       capture_output=True)
    return versions

