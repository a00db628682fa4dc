"""The executor seam: the local pools and a real local Ray cluster build the same
keys and bytes; each Ray task gets its arch from its runtime environment; a task whose
key is published does no work; a failing task fails only itself; results stream."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import opts, run_cli, toy_manifest, write_toy_project

from cutecc.build.executors import LocalExecutor, RayExecutor, choose
from cutecc.build.workers import BuildJob, Result
from cutecc.commands.build import build
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan
from cutecc.store import Store

# Ray starts its processes with fork+exec, which JAX (imported by earlier tests) warns about.
pytestmark = [pytest.mark.usefixtures("dsl"), pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")]


def _libraries(cache: Path) -> dict[str, bytes]:
    return {e.key: (e.path / e.doc["library"]).read_bytes() for e in Store(cache).entries()}


def _cubin_arch(library: bytes) -> int:
    """The SM version of the CUDA ELF embedded in a library (e_flags bits 8-15)."""
    i = library.find(b"\x7fELF", 1)
    while i >= 0:
        if int.from_bytes(library[i + 18:i + 20], "little") == 190:  # EM_CUDA
            return (int.from_bytes(library[i + 0x30:i + 0x34], "little") >> 8) & 0xFF
        i = library.find(b"\x7fELF", i + 1)
    raise AssertionError("no cubin")


def _chosen(**flags: str) -> LocalExecutor | RayExecutor:
    """The executor a build is given: its flags, else the environment, read at the edge
    (`BuildOptions.from_environment`), as `cutecc build` reads them."""
    o = opts(**flags)
    return choose(o.executor, o.ray_address)


def test_choosing_an_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTECC_EXECUTOR", raising=False)
    monkeypatch.delenv("CUTECC_RAY_ADDRESS", raising=False)
    assert choose().kind == "local" and _chosen().kind == "local"
    monkeypatch.setenv("CUTECC_EXECUTOR", "ray")
    assert _chosen() == choose("ray") and _chosen(executor="local").kind == "local"
    assert choose().kind == "local"  # the library reads no environment: the edge does
    monkeypatch.setenv("CUTECC_RAY_ADDRESS", "10.0.0.1:6379")
    assert _chosen().ray_address == "10.0.0.1:6379"
    with pytest.raises(CuteccError) as e:
        choose("dask")
    assert e.value.exit_code == 2
    with pytest.raises(CuteccError):
        choose("local", "10.0.0.1:6379")
    r = run_cli("build", "--executor", "dask", "-m", "nowhere.toml")
    assert r.returncode == 2 and "dask" in r.stderr


def test_the_manifests_build_table_is_the_default_below_flags_and_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTECC_EXECUTOR", raising=False)
    monkeypatch.delenv("CUTECC_RAY_ADDRESS", raising=False)

    def chosen(**flags: str) -> LocalExecutor | RayExecutor:
        o = opts(**flags)
        return choose(o.executor, o.ray_address, default_kind="ray", default_address="h:1")

    assert chosen() == choose("ray", "h:1")
    assert chosen(executor="local").kind == "local"  # flag wins
    monkeypatch.setenv("CUTECC_EXECUTOR", "local")
    assert chosen().kind == "local"  # environment wins
    monkeypatch.setenv("CUTECC_EXECUTOR", "ray")
    monkeypatch.setenv("CUTECC_RAY_ADDRESS", "env:2")
    assert chosen().ray_address == "env:2"


def test_ray_builds_the_same_keys_and_bytes_as_local_with_per_arch_environments(
        ray_cluster, toy_cache, tmp_path: Path) -> None:
    copy = toy_cache.copy(tmp_path / "p")
    rep = build(copy.manifest, opts(cache_dir=tmp_path / "ray", executor="ray"), lock=False,
                archs=("sm_90a", "sm_80"))
    assert rep.ok and rep.count("built") == 4 and rep.executor == "ray", rep.warnings()
    assert rep.workers == "ray" and all(o.timings["compile"] > 0 for o in rep.outcomes)
    libs = _libraries(tmp_path / "ray")
    local = _libraries(toy_cache.cache)  # built by the local pools
    assert {k: libs[k] for k in local} == local  # the same keys, byte for byte
    for e in Store(tmp_path / "ray").entries():
        assert _cubin_arch(libs[e.key]) == int(e.doc["arch"][3:5]), e.doc["arch"]
    assert len({_cubin_arch(b) for b in libs.values()}) == 2
    # build --json keeps its shape whatever the executor
    r = run_cli("build", str(copy.manifest), "--cache-dir", str(tmp_path / "ray"), "--executor", "ray",
                "--arch", "sm_90a", "--arch", "sm_80", "--no-lock", "--json")
    r2 = run_cli("build", str(copy.manifest), "--cache-dir", str(tmp_path / "ray"), "--no-lock",
                 "--arch", "sm_90a", "--arch", "sm_80", "--json")
    a, b = json.loads(r.stdout), json.loads(r2.stdout)
    assert set(a) == set(b) and a["cached"] == b["cached"] == 4
    assert [set(e) for e in a["entries"]] == [set(e) for e in b["entries"]]


def _jobs(manifest: Path) -> list[BuildJob]:
    m = load_manifest(manifest)
    return [BuildJob.of(p, m) for p in plan(m)]


def test_a_task_whose_key_is_published_does_no_work(ray_cluster, toy_cache, tmp_path: Path) -> None:
    from cutecc.build.executors import ray as ray_executor

    copy = toy_cache.copy(tmp_path / "p")
    seen: list[tuple[str, Result]] = []
    ray_executor.compile_all(_jobs(copy.manifest), copy.cache, 2, lambda j, r: seen.append((j.key, r)))
    assert sorted(r.status for _, r in seen) == ["cached", "cached"]
    assert all(r.seconds < 5 and r.meta is not None for _, r in seen)


def test_a_task_on_another_node_sends_its_entry_back_checked(ray_cluster, toy_cache, tmp_path: Path) -> None:
    """`ship`: each task acts as if it ran on another node: it builds into that node's
    cache from the sources sent with it, and the driver checks what comes back."""
    from cutecc.build.executors import ray as ray_executor

    manifest = write_toy_project(tmp_path / "p")
    store = Store(tmp_path / "driver")
    store.ensure()
    seen: list[Result] = []
    ray_executor.compile_all(_jobs(manifest), store.root, 2, lambda j, r: seen.append(r), ship=True)
    assert sorted(r.status for r in seen) in (["built", "built"], ["cached", "cached"]), \
        [r.error for r in seen]
    assert _libraries(store.root) == _libraries(toy_cache.cache)
    node = Store(ray_cluster)
    assert {e.key for e in node.entries()} >= set(_libraries(toy_cache.cache))
    assert list((ray_cluster / "src").iterdir())  # the sources, by digest
    r = run_cli("verify", "--cache-dir", str(store.root))
    assert r.returncode == 0, r.stdout


def test_a_failing_ray_task_fails_only_itself(ray_cluster, toy_cache, tmp_path: Path) -> None:
    copy = toy_cache.copy(tmp_path / "p")
    text = copy.manifest.read_text() + toy_manifest(threads=(32,), kernels=("broken",)).split("\n", 1)[1]
    copy.manifest.write_text(text.replace('[kernel.broken]\nentry = "toy.ops:scale"',
                                          '[kernel.broken]\nentry = "toy.ops:broken"'))
    rep = build(copy.manifest, opts(cache_dir=copy.cache, executor="ray"), lock=False,
                kernels=("broken", "scale"), archs=("sm_90a",))
    assert (rep.count("failed"), rep.count("cached"), rep.exit_code) == (1, 2, 1)
    (line,) = [w for w in rep.warnings() if w.startswith("FAILED")]
    assert "broken[threads=32]@sm_90a" in line and "no_such_dsl_function" in line


def test_ray_workers_upload_to_the_remote(ray_cluster, s3, tmp_path: Path) -> None:
    url = f"s3://{s3.bucket}/ray-{os.getpid()}"
    manifest = write_toy_project(tmp_path / "p", threads=(256,))
    rep = build(manifest, opts(cache_dir=tmp_path / "c", executor="ray", remote=url, remote_write=True),
                lock=False)
    assert rep.ok and rep.count("built") == 1 and rep.remote is not None, rep.warnings()
    assert rep.remote.uploaded == 1 and rep.warnings() == []
    second = build(manifest, opts(cache_dir=tmp_path / "c2", executor="ray", remote=url), lock=False)
    assert second.count("built") == 0 and second.remote is not None and second.remote.fetched == 1
    assert _libraries(tmp_path / "c2") == _libraries(tmp_path / "c")


def test_tasks_that_never_finish_fail_by_name_within_the_timeout(ray_cluster, tmp_path: Path) -> None:
    from cutecc.build.executors import ray as ray_executor

    manifest = write_toy_project(tmp_path / "p", threads=(512,))
    store = Store(tmp_path / "c")
    store.ensure()
    seen: list[Result] = []
    ray_executor.compile_all(_jobs(manifest), store.root, 2, lambda j, r: seen.append(r), task_timeout=0.05)
    assert [r.status for r in seen] == ["failed"] and "no Ray task finished within" in (seen[0].error or "")
