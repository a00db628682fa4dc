"""What a cold `cutecc build` costs over the compiles inside it (issue 35).

    python -m benchmarks.build_overhead [--manifest examples root] [--jobs 1 2]
                                        [--modes fork spawn resident] [--plan-memory off warm]
                                        [--audit on off] [--noop] [--before REV] [--repeats N]
                                        [--json PATH]

Per manifest, in one run on one machine:
- direct: one fresh process (`direct` below) imports the DSL, torch and the kernels'
  modules untimed, then per planned entry times what its author's script does: construct
  the launcher (factory call), make the DSL's fake arguments in the launcher's own order,
  `cute.compile(launcher, ..., options="--enable-tvm-ffi")` and `export_to_c` to an object,
  with device queries answered from the manifest's hardware profile as cutecc's workers
  answer them. The sum of those seconds is the floor a build is measured against; the
  process's own wall (imports included) is reported beside it.
- cutecc: `cutecc build MANIFEST --no-lock --json` into an empty cache (cold: planning, the
  runtime library's link, every compile, link and publish), whole process: wall clock here,
  CPU as the children's user + system time (`RUSAGE_CHILDREN`, every worker included), for
  each `-j` and worker mode (`$CUTECC_WORKERS`: fork from the build's own compile service, or
  spawn; or `resident`: forked from a resident compile service that one untimed build of the
  manifest with the same environment left, cutecc/build/executors/service_process.py, whose CPU,
  its workers' included, is added: they are its children, not the build's),
  with the build's own `--timings` (its JSON `timings` and per-entry parts), and for each
  `--plan-memory`: the user's planning memory (cutecc/toolchain/planmemory.py) `off` (a
  user's very first build: nothing remembered anywhere), or `warm` (a copy, per build, of
  the memory one untimed `--dry-run` of the manifest filled: a user who planned it before,
  building into a new cache). Every build and the dry run run in one working directory,
  made settled first (`python -m` puts it first on `sys.path`, which closures depend on). With
  `--before REV`, that revision's `cutecc/` (extracted, byte-compiled) builds too, each
  measurement alternating between the versions.
- `--audit on off` (issue 44): each build with the read-set check (`cutecc/build/read_set.py`)
  on, and off (`$CUTECC_INTERNAL_AUDIT=off`, a switch that exists for this comparison only); `--noop`
  times a second, no-op build into each cold build's cache too (`noop` in each build's record):
  the check runs only where an entry is compiled, so a no-op build should cost the same.
An entry whose launcher cannot be compiled from fakes in its own order (the manifest's
views give alignment or strides the bare fakes lack: FA4's backward pre-processing) is
compiled as cutecc's wrapper calls it, in the same process (`how` says which). Each entry's
wall and CPU seconds (`time.process_time`) are summed. The load average (1 min) is read
before and after every measurement: the build host is shared, and a figure taken under
load says so (wall clocks there mostly measure the neighbours; CPU seconds less so).
The ratios are cutecc's wall over the direct wall sum and cutecc's CPU over the direct CPU
sum; at `-j 2` the floor is still the sum (the direct compiles ran one at a time). With
`--repeats N`, the direct process and the builds run N rounds in turn, each build's ratios
against its own round's direct sums (`directs` lists every round's; `round` numbers a build
of a later round): on a shared host the load moves between a direct run and a build.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, code_versions, machine

MANIFESTS = {"examples": REPO / "examples" / "kernels.toml", "root": REPO / "kernels.toml",
             "published": REPO / "benchmarks" / "manifests" / "published.toml"}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


SERVICE = b"cutecc.build.executors.service_process"  # in a compile service's command line


def _residents(run: Path) -> list[Path]:
    """/proc entries of the resident compile services (and their workers) started with `run`
    as $XDG_RUNTIME_DIR."""
    needle, out = f"XDG_RUNTIME_DIR={run}".encode(), []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if d.name.isdigit() and SERVICE in (d / "cmdline").read_bytes() \
                    and needle in (d / "environ").read_bytes().split(b"\0"):
                out.append(d)
    return out


def _resident_cpu(run: Path | None) -> float:
    """CPU seconds of the resident compile services started with `run` as $XDG_RUNTIME_DIR,
    their reaped workers' included (utime, stime, cutime, cstime; a live worker's own CPU
    counts once it is reaped, which every timed build waits for)."""
    total = 0
    for d in _residents(run) if run else []:
        with contextlib.suppress(OSError, ValueError):
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == 1 or b"resident" not in Path(f"/proc/{fields[1]}/cmdline").read_bytes():
                total += sum(int(x) for x in fields[11:15])  # a service, not one of its workers
    return total / os.sysconf("SC_CLK_TCK")


def _timed(cmd: list[str], env: dict[str, str], cwd: Path = REPO, run: Path | None = None) -> dict[str, Any]:
    """Run `cmd`; its wall, CPU (it and its waited-for descendants, and the resident services
    of `run`), load before and after, and the JSON it printed last."""
    before, cpu0, t0 = _load(), _cpu_children() + _resident_cpu(run), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, cwd=cwd,
                       timeout=3600)
    wall, cpu = time.perf_counter() - t0, _cpu_children() + _resident_cpu(run) - cpu0
    out: dict[str, Any] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_before": before,
                           "load_after": _load(), "returncode": r.returncode}
    try:
        out["report"] = json.loads(r.stdout)
    except json.JSONDecodeError:
        out["stderr"] = r.stderr[-2000:]
    if r.returncode != 0:
        out["stderr"] = r.stderr[-2000:]
    return out


def direct(manifest_path: Path) -> dict[str, Any]:
    """In this (fresh) process: every planned entry of the manifest compiled directly, timed
    one by one (imports untimed, first)."""
    from cutecc.manifest import load_manifest, split_entry
    from cutecc.plan.build_plan import plan

    manifest = load_manifest(manifest_path)
    planned = [p for p in plan(manifest) if p.platform == "x86_64"]
    archs = sorted({p.arch for p in planned})
    arch = archs[0]  # one arch per process: the DSL reads it once
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["CUTE_DSL_DISABLE_FILE_CACHING"] = "1"
    os.environ.update(manifest.env_for(arch))
    for p in reversed(manifest.python_path):
        sys.path.insert(0, str(p))
    t0 = time.perf_counter()
    import importlib

    import cutlass.cute as cute

    from benchmarks.common import launcher_fake
    from cutecc.build.compiler import compile_variant, resolve_entry, resolve_value
    from cutecc.contract.args import launched
    from cutecc.toolchain import devicequery

    for p in planned:
        if p.inputs.get("device") is not None:
            import torch  # noqa: F401
        with devicequery.answering(p.inputs.get("device")), contextlib.suppress(Exception):
            importlib.import_module(split_entry(p.kernel.entry)[0].partition(":")[0])  # its compile says why
    imports = time.perf_counter() - t0
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(q for q in planned if q.arch == arch):
            v = p.variant
            t1, c1 = time.perf_counter(), time.process_time()
            row: dict[str, Any] = {"entry": p.label, "how": "direct"}
            try:
                with devicequery.answering(p.inputs.get("device")):
                    launcher = resolve_entry(p.kernel.entry, v.factory_args)
                    syms: dict[str, Any] = {}
                    pos = [launcher_fake(a, syms) for a in launched(v.args) if not a.param]
                    kw = {a.param: launcher_fake(a, syms) for a in launched(v.args) if a.param}
                    kw.update({k: resolve_value(x) for k, x in v.constants})
                    compiled = cute.compile(launcher, *pos, **kw, options="--enable-tvm-ffi")
            except Exception as e:
                # fakes in the launcher's own order cannot say what the manifest's views
                # do (alignment, strides): this one is compiled as cutecc's wrapper calls it
                row.update(how="cutecc wrapper, in process", direct_error=f"{type(e).__name__}: {e}"[:300])
                t1, c1 = time.perf_counter(), time.process_time()
                with devicequery.answering(p.inputs.get("device")):
                    compiled = compile_variant(p.kernel.entry, v, p.kernel.compile_options, engine=True)
            compiled.export_to_c(str(Path(tmp) / f"{i}.o"), function_name="direct")
            row.update(seconds=round(time.perf_counter() - t1, 3), cpu_s=round(time.process_time() - c1, 3))
            out.append(row)
    return {"arch": arch, "archs": archs, "imports_s": round(imports, 2), "entries": out}


def _memory(mem: str, scratch: Path, n: int) -> str:
    """`$CUTECC_PLAN_MEMORY` for one build: `off`, or a fresh copy of the warmed memory."""
    if mem == "off":
        return "off"
    copy = scratch / f"memory-{n}"
    shutil.rmtree(copy, ignore_errors=True)  # (a number used again: another revision's or audit's run)
    shutil.copytree(scratch / "memory", copy)
    return str(copy)


def measure(name: str, jobs: list[int], modes: list[str], versions: dict[str, Path],
            memories: list[str], scratch: Path, audits: tuple[str, ...] = ("on",),
            noop: bool = False, repeats: int = 1) -> dict[str, Any]:
    """One manifest's direct compiles and builds, `repeats` rounds of them in turn (each
    build's ratios against its own round's direct sums: the host's load moves between rounds)."""
    rounds = [_round(name, jobs, modes, versions, memories, scratch, audits, noop) for _ in range(repeats)]
    res = rounds[0]
    for n, r in enumerate(rounds[1:], 1):  # later rounds' direct runs and builds, numbered
        res.setdefault("directs", [{k: res[k] for k in ("direct", "direct_sum_s", "direct_cpu_sum_s")}])
        res["directs"].append({k: r[k] for k in ("direct", "direct_sum_s", "direct_cpu_sum_s")})
        res["builds"] += [{**b, "round": n} for b in r["builds"]]
    return res


def _round(name: str, jobs: list[int], modes: list[str], versions: dict[str, Path],
           memories: list[str], scratch: Path, audits: tuple[str, ...], noop: bool) -> dict[str, Any]:
    path = MANIFESTS[name]
    cwd = scratch / "cwd"  # one working directory (settled in main) for the dry run and every build
    res_warm = None
    if "warm" in memories:  # untimed in the ratios: it fills the memory the warm builds copy
        shutil.rmtree(scratch / "memory", ignore_errors=True)
        code = os.pathsep.join([str(versions["after"]), os.environ.get("PYTHONPATH", "")])
        res_warm = _timed([sys.executable, "-m", "cutecc.cli", "build", str(path), "--cache-dir",
                           tempfile.mkdtemp(dir=scratch), "--dry-run", "--json"],
                          {"CUTECC_PLAN_MEMORY": str(scratch / "memory"), "PYTHONPATH": code}, cwd)
        res_warm["plan_s"] = (res_warm.pop("report", None) or {}).get("timings", {}).get("plan")
    res: dict[str, Any] = {"manifest": str(path.relative_to(REPO)), "memory_fill": res_warm}
    d = _timed([sys.executable, "-m", "benchmarks.build_overhead", "direct", str(path)], {})
    res["direct"] = d
    rep = d.get("report") or {}
    ok = rep.get("entries", [])
    res["direct_sum_s"] = round(sum(e["seconds"] for e in ok), 2)
    res["direct_cpu_sum_s"] = round(sum(e["cpu_s"] for e in ok), 2)
    res["builds"] = []
    runs = [(j, m, mem, v, audit) for j in jobs for m in modes for mem in memories for v in versions.items()
            for audit in audits
            if mem == "off" or v[0] == "after"]  # `warm`: this tree only (`--before` may have no memory)
    warmed: set[str] = set()
    for n, (j, mode, mem, (version, code), audit) in enumerate(runs):
        run = scratch / "run" if mode == "resident" else None
        # the hook's name, and its name before issue 46 (for a --before revision)
        env = {"CUTECC_WORKERS": "spawn" if mode == "spawn" else "fork", "CUTECC_INTERNAL_AUDIT": audit,
               "CUTECC_AUDIT": audit,
               "CUTECC_SERVICE_IDLE": "900" if run else "0", "XDG_RUNTIME_DIR": str(run or scratch),
               "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
        if run and version not in warmed:  # untimed: the build that leaves the resident service
            warmed.add(version)
            with tempfile.TemporaryDirectory(prefix="cutecc-overhead-") as cache:
                w = _timed([sys.executable, "-m", "cutecc.cli", "build", str(path), "--cache-dir", cache,
                            "--no-lock", "--json"], {**env, "CUTECC_PLAN_MEMORY": "off"}, cwd)
            res.setdefault("resident_warmup", {})[version] = {k: w[k] for k in ("wall_s", "returncode")}
        with tempfile.TemporaryDirectory(prefix="cutecc-overhead-") as cache:
            b = _timed([sys.executable, "-m", "cutecc.cli", "build", str(path), "--cache-dir", cache,
                        "--no-lock", "--json", "-j", str(j)],
                       {**env, "CUTECC_PLAN_MEMORY": _memory(mem, scratch, n)},
                       cwd, run)  # not the repository: `-m` puts the working directory first
            if noop:  # the same build again: nothing to compile
                nb = _timed([sys.executable, "-m", "cutecc.cli", "build", str(path), "--cache-dir", cache,
                             "--no-lock", "--json", "-j", str(j)],
                            {**env, "CUTECC_PLAN_MEMORY": _memory(mem, scratch, n + len(runs))}, cwd, run)
                b["noop"] = {k: nb.get(k) for k in ("wall_s", "cpu_s", "returncode", "load_before",
                                                     "load_after")}
                b["noop"]["built"] = (nb.get("report") or {}).get("built")
        b.update({"jobs": j, "mode": mode, "plan_memory": mem, "version": version, "audit": audit})
        r = b.get("report") or {}
        b["built"] = r.get("built")
        b["ratio_to_direct_sum"] = (round(b["wall_s"] / res["direct_sum_s"], 2)
                                    if res["direct_sum_s"] else None)
        b["cpu_ratio_to_direct_cpu_sum"] = (round(b["cpu_s"] / res["direct_cpu_sum_s"], 2)
                                            if res["direct_cpu_sum_s"] else None)
        res["builds"].append(b)
        print(f"{name} {version} -j {j} {mode} memory {mem} audit {audit}: {b['wall_s']} s wall, "
              f"{b['cpu_s']} s CPU; "
              "direct sum "
              f"{res['direct_sum_s']} s wall, {res['direct_cpu_sum_s']} s CPU "
              f"(load {b['load_before']} -> {b['load_after']})", file=sys.stderr)
    return res


def _stop_residents(run: Path) -> None:
    """Kill the resident services this run started, and their workers."""
    import signal

    for d in _residents(run):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(d.name), signal.SIGKILL)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "direct":
        print(json.dumps(direct(Path(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", nargs="+", default=["examples", "root"], choices=sorted(MANIFESTS))
    ap.add_argument("--jobs", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--modes", nargs="+", default=["fork", "spawn", "resident"],
                    choices=["fork", "spawn", "resident"])
    ap.add_argument("--plan-memory", nargs="+", default=["off", "warm"], choices=["off", "warm"],
                    help="the user's planning memory: off, or warmed by one dry run of the manifest")
    ap.add_argument("--before", default=None, help="a git revision whose cutecc/ builds too, alternating")
    ap.add_argument("--audit", nargs="+", default=["on"], choices=["on", "off"],
                    help="the read-set check on, and/or off ($CUTECC_INTERNAL_AUDIT=off: for this "
                         "comparison only)")
    ap.add_argument("--noop", action="store_true",
                    help="also time a no-op build into each cold build's cache")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of the direct compiles and the builds, in turn (each build's ratio "
                         "against its own round's direct sums)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cutecc-overhead-code-") as d:
        scratch = Path(d)
        (scratch / "cwd").mkdir()
        versions = code_versions(a.before, scratch)
        # a closure is remembered only under settled stamps (over 2 s old): the working directory's
        time.sleep(max(0.0, 2.5 - (time.time() - (scratch / "cwd").stat().st_ctime)))
        (scratch / "run").mkdir(mode=0o700)
        try:
            doc = {"benchmark": "build_overhead", "machine": machine(), "command": sys.argv,
                   "before": a.before, "pythonpath": os.environ.get("PYTHONPATH"),
                   "note": "shared 2-core host, other engineers' builds and tests running: loads vary",
                   "manifests": {m: measure(m, a.jobs, a.modes, versions, a.plan_memory, scratch,
                                            tuple(a.audit), a.noop, a.repeats)
                                 for m in a.manifest}}
        finally:
            _stop_residents(scratch / "run")
    text = json.dumps(doc, indent=1)
    if a.json:
        a.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
