"""A build compiles exactly what it keyed: the sources a key was planned from are the ones
the worker compiled (an edit during the compile refuses to publish), whichever directory
or process plans (a `''` entry of `sys.path`, modules the planning process already holds),
whatever a path entry is (a zip on `PYTHONPATH` is refused by name, never a traceback
nor a stale closure), and however large a source is (a size cap naming the file)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from helpers import PY, REPO, write_toy_project

from cutecc.store import Store

from .conftest import assert_clean_failure, cli

# Stamps younger than this are not remembered (`cutecc.toolchain.hashcache.SETTLE_NS`, 2 s): a test
# that wants a closure remembered waits it out after writing the files.
SETTLED = 2.2


def _env(path: str = "") -> dict[str, str]:
    """This environment, with this checkout (and `path`, if given) on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), path) if p)}


def _json_of(r: subprocess.CompletedProcess[str]) -> dict:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return json.loads(r.stdout)


# 1. an edit during the compile -----------------------------------------------------------

RACE_MODULE = '''\
import os

from toy.ops import scale  # noqa: F401

_flag = os.environ.get("RACE_FLAG")
if _flag and not os.path.exists(_flag):  # the first compile edits this file as it runs
    open(_flag, "w").close()
    with open(__file__, "a") as f:
        f.write("\\nEDITED_WHILE_COMPILING = 1\\n")
'''

RACE_MANIFEST = '''\
archs = ["sm_90a"]

[kernel.race]
entry = "toy.race:scale"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
constants = { threads = 32 }
'''


def _keys(manifest: Path, cache: Path) -> list[str]:
    r = cli("build", str(manifest), "--cache-dir", str(cache), "--dry-run", "--json")
    return [e["key"] for e in _json_of(r)["entries"]]


@pytest.mark.usefixtures("dsl")
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_source_edited_during_its_compile_is_not_published_under_the_old_key(
        tmp_path: Path, executor: str) -> None:
    if executor == "ray":
        pytest.importorskip("ray", reason="the Ray executor needs Ray (pip install 'cutecc[ray]')")
    manifest = write_toy_project(tmp_path / "p")
    manifest.write_text(RACE_MANIFEST)
    (tmp_path / "p" / "toy" / "race.py").write_text(RACE_MODULE)
    cache = tmp_path / "c"
    [old] = _keys(manifest, cache)
    env = {"RACE_FLAG": str(tmp_path / "edited")}
    r = cli("build", str(manifest), "--cache-dir", str(cache), "--no-lock", "--json", "-j", "1",
            "--executor", executor, env=env, timeout=600)
    rep = _json_of(r)
    [e] = rep["entries"]
    assert r.returncode == 1 and e["status"] == "failed", rep
    assert "toy/race.py" in e["error"] and "changed" in e["error"], e
    assert (tmp_path / "edited").exists()  # the compile did edit it
    assert Store(cache).get(old) is None
    assert not [x for x in Store(cache).entries() if x.doc["kernel"] == "race"]
    # the next build plans anew, from the edited bytes, and builds them
    [new] = _keys(manifest, cache)
    assert new != old
    r = cli("build", str(manifest), "--cache-dir", str(cache), "--no-lock", "--json", "-j", "1",
            "--executor", executor, env=env, timeout=600)
    [e] = _json_of(r)["entries"]
    assert r.returncode == 0 and e["status"] == "built" and e["key"] == new, e
    assert Store(cache).get(old) is None and Store(cache).get(new) is not None


# 3. planning from a process whose sys.path holds '' --------------------------------------

PLAN_SCRIPT = '''\
import json, sys
from pathlib import Path
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import plan
m = load_manifest(Path(sys.argv[1]))
cache = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
print(json.dumps([p.key for p in plan(m, hash_cache=Path(cache) if cache else None)]))
'''


def _plan_keys(manifest: Path, cwd: Path, hash_cache: Path | None, prelude: str = "",
               path: str = "") -> list[str]:
    """The keys `cutecc.plan.build_plan.plan` gives in a `python -c` process in `cwd` (sys.path[0] is
    ''), after running `prelude` there."""
    r = subprocess.run([PY, "-c", prelude + "\n" + PLAN_SCRIPT, str(manifest), str(hash_cache or "")],
                       capture_output=True, text=True, cwd=cwd, env=_env(path=path), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def _helper_project(root: Path) -> Path:
    """The toy project whose kernel module imports a top-level `helper` it does not hold:
    found through `sys.path` (here, the planning process's current directory)."""
    manifest = write_toy_project(root, threads=(64,))
    ops = root / "toy" / "ops.py"
    ops.write_text("import helper  # noqa: F401\n" + ops.read_text())
    return manifest


def test_a_closure_remembered_in_one_directory_is_not_served_in_another(tmp_path: Path) -> None:
    manifest = _helper_project(tmp_path / "p")
    a, b = tmp_path / "a", tmp_path / "b"
    for d, text in ((a, "A = 1\n"), (b, "B = 2\n")):
        d.mkdir()
        (d / "helper.py").write_text(text)
    time.sleep(SETTLED)  # so the closure planned in a is remembered
    facts = tmp_path / "cache" / "hashes.json"
    facts.parent.mkdir()
    in_a = _plan_keys(manifest, a, facts)
    assert _plan_keys(manifest, a, facts) == in_a
    in_b = _plan_keys(manifest, b, facts)
    assert in_b == _plan_keys(manifest, b, None) != in_a  # b's helper, as a fresh plan keys it


def test_a_module_the_planning_process_already_imported_does_not_decide_the_key(tmp_path: Path) -> None:
    manifest = _helper_project(tmp_path / "p")
    (tmp_path / "p" / "helper.py").write_text("P = 1\n")  # what a build worker imports
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "helper.py").write_text("ELSEWHERE = 1\n")
    (elsewhere / "toy").mkdir()
    (elsewhere / "toy" / "__init__.py").write_text("")
    (elsewhere / "toy" / "ops.py").write_text("def scale(): pass\n")
    fresh = _plan_keys(manifest, tmp_path, None)
    prelude = (f"import sys; sys.path.insert(0, {str(elsewhere)!r}); import helper, toy.ops; "
               "sys.path.pop(0)")
    assert _plan_keys(manifest, tmp_path, None, prelude) == fresh


# 4. a zip on PYTHONPATH -----------------------------------------------------------------


def _zip(path: Path, files: dict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    os.replace(tmp, path)


def test_a_zip_on_the_path_is_refused_by_name_never_a_traceback(tmp_path: Path) -> None:
    manifest = _helper_project(tmp_path / "p")
    archive = tmp_path / "deps.zip"
    _zip(archive, {"helper.py": "Z = 1\n"})
    r = cli("build", str(manifest), "--cache-dir", str(tmp_path / "c"), "--dry-run",
            env={"PYTHONPATH": _env(path=str(archive))["PYTHONPATH"]})
    assert_clean_failure(r, 2, "helper", str(archive), "zip")


def test_a_zip_that_gains_a_module_is_not_served_the_old_closure(tmp_path: Path) -> None:
    manifest = _helper_project(tmp_path / "p")
    archive = tmp_path / "deps.zip"
    _zip(archive, {"other.py": "O = 1\n"})  # no helper yet: the import finds nothing
    facts = tmp_path / "cache" / "hashes.json"
    facts.parent.mkdir()
    time.sleep(SETTLED)  # so the closure is remembered (its directories settled)
    first = _plan_keys(manifest, tmp_path, facts, path=str(archive))
    assert _plan_keys(manifest, tmp_path, facts, path=str(archive)) == first
    _zip(archive, {"other.py": "O = 1\n", "helper.py": "Z = 1\n"})
    time.sleep(SETTLED)
    r = subprocess.run([PY, "-c", PLAN_SCRIPT, str(manifest), str(facts)], capture_output=True,
                       text=True, cwd=tmp_path, env=_env(path=str(archive)), timeout=300)
    # the remembered closure is not served: walked again, the zip is refused by name
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and last.startswith("cutecc.errors.CuteccError"), r.stderr[-3000:]
    assert str(archive) in last and '"helper"' in last and "zip" in last, last


# 7. a huge source file ----------------------------------------------------------------


def test_a_source_over_the_size_cap_is_refused_by_name_in_bounded_memory(tmp_path: Path) -> None:
    from cutecc.toolchain.hashcache import MAX_SOURCE_FILE_BYTES

    manifest = _helper_project(tmp_path / "p")
    helper = tmp_path / "p" / "helper.py"
    row = "".join(f"{i % 997}, " for i in range(2000)) + "\n"
    with open(helper, "w") as f:  # a literal-dense module just over the cap
        f.write("DATA = [\n")
        while f.tell() <= MAX_SOURCE_FILE_BYTES:
            f.write(row)
        f.write("]\n")
    # Started from a small interpreter that reports its child's peak: a child forked from
    # this (large) test process would count the test's pages until its exec.
    measure = ("import resource, subprocess, sys\n"
               "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "sys.stderr.write(r.stderr)\n"
               "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    t0 = time.monotonic()
    p = subprocess.run([PY, "-c", measure, PY, "-m", "cutecc.cli", "build", str(manifest), "--cache-dir",
                        str(tmp_path / "c"), "--dry-run"], capture_output=True, text=True,
                       cwd=tmp_path / "p", env=_env(), timeout=600)
    seconds = time.monotonic() - t0
    code, maxrss = (int(v) for v in p.stdout.split())
    err = p.stderr
    assert code == 2 and "Traceback" not in err, (code, err[-3000:])
    assert "helper.py" in err and "MiB" in err, err[-3000:]
    peak = maxrss * 1024  # KiB on Linux
    assert peak < 400 << 20, f"planning peaked at {peak >> 20} MiB"
    assert seconds < 60, seconds
