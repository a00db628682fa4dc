"""Group distributed (issue 14): the Ray executor against the local pools, and the remote cache.

    python -m benchmarks.distributed [--variants 1000] [--noop-variants 10000]
                                     [--only cold,overhead,noop] [--json PATH]
    python -m benchmarks --only distributed        # the same, inside the suite

- cold: a generated manifest of N variants (the add_const kernel of noop_rebuild.py,
  threads x bias) built cold, `cutecc build -j nproc --no-lock --json` as a whole process,
  once with the local pools and once with `--executor ray` (a local Ray cluster started by
  the build, so its start is in the figure); the DSL's file cache is off for both. Per-task
  compile time is the median of the entries' own `seconds`.
- overhead: Ray's cost per task on this machine, apart from compiling: 1,000 empty tasks
  with one `runtime_env` (as a build's tasks of one arch), submitted and waited for
  through `ray.wait` one at a time, as the executor does, on a warm cluster.
- noop: a no-op build of M variants from an empty local cache against a warm remote
  cache (SeaweedFS `weed mini` on 127.0.0.1, started here): every entry is looked up,
  downloaded, checked and published locally. The remote is seeded outside the timing from
  one compiled entry: M entry objects (real meta.json, each under its own key) naming one
  library blob, so the bytes moved are those of M real entries. Then the same build again
  (everything local) for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import noop_rebuild
from benchmarks.common import PY, REPO, GroupResult, Row, dsl_available, machine, summary

G = "distributed"
BUCKET = "bench"


def project(root: Path, n: int) -> Path:
    (root / "bench_kernels").mkdir(parents=True, exist_ok=True)
    (root / "bench_kernels" / "__init__.py").write_text("")
    (root / "bench_kernels" / "ops.py").write_text(noop_rebuild.KERNEL)
    m = root / "kernels.toml"
    m.write_text(noop_rebuild.manifest(n))
    return m


def cutecc_build(*args: str, env: dict[str, str] | None = None, timeout: float = 7200) -> tuple[float, dict]:
    """`cutecc build ... --json` in a fresh process: (wall seconds, its report)."""
    t0 = time.perf_counter()
    r = subprocess.run([PY, "-m", "cutecc.cli", "build", *args, "--no-lock", "--json"], capture_output=True,
                       text=True, cwd=REPO, env={**os.environ, **(env or {})}, timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"cutecc build {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return wall, json.loads(r.stdout)


# cold ---------------------------------------------------------------------------------


def cold(n: int, root: Path, repeats: int = 1) -> dict[str, Any]:
    """Cold builds, local then ray, `repeats` times interleaved (each into a fresh cache);
    the 1-minute load average before each run says what else the machine was doing."""
    m = project(root / "cold", n)
    env = {"CUTE_DSL_DISABLE_FILE_CACHING": "1", "RAY_AUTH_MODE": "disabled"}
    jobs = str(os.cpu_count() or 1)
    out: dict[str, Any] = {"variants": n, "jobs": int(jobs), "repeats": repeats,
                           "runs": {"local": [], "ray": []}}
    for i in range(repeats):
        for executor in ("local", "ray"):
            print(f"  cold build of {n} variants, executor {executor} ({i + 1}/{repeats})", file=sys.stderr,
                  flush=True)
            cache = root / f"cold-{executor}-{i}"
            load = os.getloadavg()[0]
            wall, rep = cutecc_build(str(m), "--cache-dir", str(cache), "-j", jobs, "--executor", executor,
                                     env=env)
            assert rep["failed"] == 0 and rep["built"] == n, rep
            per = [e["seconds"] for e in rep["entries"]]
            out["runs"][executor].append({"wall_s": wall, "in_build_s": rep["seconds"],
                                          "task_s": summary(per), "load_before": load,
                                          "keys": sorted(p.name for p in (cache / "entries").glob("*/*"))})
            shutil.rmtree(cache)
    for executor in ("local", "ray"):
        runs = out["runs"][executor]
        out[executor] = {"wall_s": summary([r["wall_s"] for r in runs]),
                         "task_median_s": summary([r["task_s"]["median"] for r in runs])}
    out["same_keys"] = all(r["keys"] == out["runs"]["local"][0]["keys"]
                           for ex in ("local", "ray") for r in out["runs"][ex])
    for ex in ("local", "ray"):
        for r in out["runs"][ex]:
            del r["keys"]
    return out


# overhead -----------------------------------------------------------------------------


def _nothing() -> int:
    return 0


def overhead(tasks: int = 1000) -> dict[str, Any]:
    import logging

    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    init_s = time.perf_counter() - t0
    try:
        task = ray.remote(num_cpus=1)(_nothing).options(runtime_env={"env_vars": {"CUTE_DSL_ARCH": "sm_90a"}})
        ray.get([task.remote() for _ in range(2 * (os.cpu_count() or 1))])  # workers up
        workers_s = time.perf_counter() - t0 - init_s
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            pending = [task.remote() for _ in range(tasks)]
            while pending:
                _, pending = ray.wait(pending, num_returns=1, timeout=600)
            samples.append((time.perf_counter() - t0) / tasks)
    finally:
        ray.shutdown()
    return {"tasks": tasks, "per_task_s": summary(samples), "init_s": init_s, "first_tasks_s": workers_s}


# noop against a warm remote -----------------------------------------------------------


class Weed:
    """`weed mini` on free 127.0.0.1 ports (the benchmark's S3 server)."""

    PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
             "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
             "webdav.port", "s3.port.iceberg", "s3.port.lance")

    def __init__(self, directory: Path) -> None:
        binary = Path(PY).parent / "weed"
        if not binary.is_file():
            binary = Path(shutil.which("weed") or "weed")
        base = self._base()
        directory.mkdir(parents=True)
        self.log = open(directory.parent / "weed.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(binary), "mini", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={directory}",
             f"-bucket={BUCKET}", "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
             *[f"-{p}={base + i}" for i, p in enumerate(self.PORTS)]],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{base + self.PORTS.index('s3.port')}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "bench",
                    "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        deadline = time.monotonic() + 90
        import obstore

        while time.monotonic() < deadline:
            try:
                obstore.put(self.store(), "probe", b"ok")
                return
            except Exception:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("weed mini did not start")

    @staticmethod
    def _base() -> int:
        for base in range(30000, 40000, 50):
            ok = True
            for i in range(len(Weed.PORTS)):
                for p in (base + i, base + 10000 + i):
                    with socket.socket() as s:
                        try:
                            s.bind(("127.0.0.1", p))
                        except OSError:
                            ok = False
            if ok:
                return base
        raise RuntimeError("no free ports")

    def store(self, prefix: str | None = None) -> Any:
        from obstore.store import S3Store

        return S3Store(BUCKET, prefix=prefix, endpoint=self.endpoint, access_key_id="bench",
                       secret_access_key="bench", region="us-east-1",
                       client_options={"allow_http": True, "timeout": "60s"})

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def seed_remote(weed: Weed, prefix: str, m: Path, root: Path) -> tuple[int, int]:
    """Compile one variant, then put an entry object for every planned key naming its
    library blob. Returns (entries, library bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    import obstore

    from cutecc.manifest import load_manifest
    from cutecc.plan.build_plan import plan

    one = m.parent / "one.toml"
    one.write_text(noop_rebuild.manifest(1))  # 4 variants; one entry's metadata is the template
    _, rep = cutecc_build(str(one), "--cache-dir", str(root / "seed-cache"))
    assert rep["built"] >= 1, rep
    from cutecc.store import Store

    first = next(iter(Store(root / "seed-cache").entries()))
    lib = (first.path / first.doc["library"]).read_bytes()
    store = weed.store(prefix)
    obstore.put(store, f"v1/blobs/{first.doc['files']['kernel.so']['sha256']}", lib)

    def put(p: Any) -> None:
        meta = dict(first.doc, variant=p.variant.id, params=dict(p.variant.params), key_inputs=p.inputs,
                    key=p.key)
        obstore.put(store, f"v1/entries/{p.key}.json", json.dumps(meta, indent=1, sort_keys=True).encode())

    planned = plan(load_manifest(m))
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(put, planned))
    return len(planned), len(lib)


def noop(n: int, root: Path) -> dict[str, Any]:
    m = project(root / "noop", n)
    weed = Weed(root / "weed")
    try:
        prefix = "warm"
        t0 = time.perf_counter()
        entries, lib_bytes = seed_remote(weed, prefix, m, root)
        seed_s = time.perf_counter() - t0
        env = {**weed.env, "CUTECC_REMOTE": f"s3://{BUCKET}/{prefix}"}
        print(f"  no-op build of {n} variants from an empty cache against the remote", file=sys.stderr,
              flush=True)
        wall, rep = cutecc_build(str(m), "--cache-dir", str(root / "empty"), env=env)
        assert rep["built"] == 0 and rep["fetched"] == n, {k: rep[k] for k in ("built", "cached", "fetched")}
        wall_local, rep_local = cutecc_build(str(m), "--cache-dir", str(root / "empty"), env=env)
        assert rep_local["fetched"] == 0 and rep_local["cached"] == n
        r = rep["remote"]
        return {"variants": n, "seed_s": seed_s, "library_bytes": lib_bytes, "wall_s": wall,
                "in_build_s": rep["seconds"], "lookup_s": r["lookup_seconds"], "requests": r["requests"],
                "bytes_down": r["bytes_down"], "compile_s_saved": r["seconds_saved"],
                "again_local_wall_s": wall_local, "again_local_in_build_s": rep_local["seconds"],
                "remote_jobs": int(os.environ.get("CUTECC_REMOTE_JOBS", "16"))}
    finally:
        weed.stop()


# report -------------------------------------------------------------------------------


def rows(data: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    c = data.get("cold")
    if c:
        n = c["variants"]
        for ex in ("local", "ray"):
            loads = ", ".join(f"{r['load_before']:.1f}" for r in c["runs"][ex])
            out.append(Row(G, f"cold build, {n} variants, -j {c['jobs']}, {ex}", "s", stats=c[ex]["wall_s"],
                           note=f"task median {c[ex]['task_median_s']['median']:.2f} s; "
                                f"load before: {loads}"))
        lw, rw = c["local"]["wall_s"]["median"], c["ray"]["wall_s"]["median"]
        out.append(Row(G, "cold build, ray / local wall", "x", value=rw / lw,
                       note=f"same keys: {c['same_keys']}; (ray - local) / N = {1e3 * (rw - lw) / n:.1f} ms"))
    o = data.get("overhead")
    if o:
        out.append(Row(G, f"Ray overhead per task ({o['tasks']} empty tasks, ray.wait loop)", "ms",
                       value=1e3 * o["per_task_s"]["median"]))
        if "init_s" in o:
            out.append(Row(G, "Ray local start (ray.init), then first tasks (workers up)", "s",
                           value=o["init_s"], note=f"first tasks {o['first_tasks_s']:.2f} s"))
    z = data.get("noop")
    if z:
        out.append(Row(G, f"no-op build, {z['variants']} variants, empty local cache, warm remote", "s",
                       value=z["wall_s"], note=f"{z['requests']} requests, {z['bytes_down'] / 2**30:.2f} GiB "
                                               f"down; lookup {z['lookup_s']:.1f} s"))
        out.append(Row(G, f"the same again, all local ({z['variants']} variants)", "s",
                       value=z["again_local_wall_s"]))
    return out


def run(variants: int = 1000, noop_variants: int = 10000,
        only: tuple[str, ...] = ("cold", "overhead", "noop"),
        repeats: int = 1) -> GroupResult:
    res = GroupResult()
    missing = [m for m in ("ray", "obstore") if __import__("importlib").util.find_spec(m) is None]
    if not dsl_available() or missing:
        res.skipped = f"skipped: needs the DSL, ray and obstore (missing: {', '.join(missing) or 'the DSL'})"
        return res
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as d:
        root = Path(d)
        if "overhead" in only:
            res.data["overhead"] = overhead()
        if "cold" in only:
            res.data["cold"] = cold(variants, root, repeats)
        if "noop" in only:
            res.data["noop"] = noop(noop_variants, root)
    res.rows = rows(res.data)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.distributed")
    ap.add_argument("--variants", type=int, default=1000)
    ap.add_argument("--noop-variants", type=int, default=10000)
    ap.add_argument("--only", default="cold,overhead,noop")
    ap.add_argument("--repeats", type=int, default=1, help="cold builds per executor, interleaved")
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args()
    res = run(ns.variants, ns.noop_variants, tuple(ns.only.split(",")), ns.repeats)
    doc = {"machine": machine(), "skipped": res.skipped, "data": res.data,
           "rows": [r.to_json() for r in res.rows]}
    from benchmarks.common import table

    print(table(res.rows) if res.rows else res.skipped)
    if ns.json:
        ns.json.write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
