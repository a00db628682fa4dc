"""A project is served its own kernels: two projects with one kernel name in one cache,
`load()` from each project's directory, from neither, `load(manifest=)` after an edit built
and reverted without a rebuild, and `cutecc list`'s manifest column and filter."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import FALLBACK, opts, run_cli, write_toy_project

import cutecc
from cutecc.errors import FallbackWarning, NoBuildFits
from cutecc.runtime.library import target_name

# the second project's copy of the toy kernel: one line changed
EDIT = ("        out[i] = x[i] * scale\n", "        out[i] = x[i] * scale + x[i]\n")


def _build(manifest: Path, cache: Path, lock: bool = True) -> None:
    from cutecc.commands.build import build

    report = build(manifest, opts(cache_dir=cache, jobs=1), lock=lock)
    assert report.ok, report.warnings()


def _edit(project: Path, undo: bool = False) -> None:
    ops = project / "toy" / "ops.py"
    old, new = EDIT[::-1] if undo else EDIT
    text = ops.read_text()
    assert old in text
    ops.write_text(text.replace(old, new))


def _lowered(ks: cutecc.runtime.loader.KernelSet) -> str:
    spec = jax.ShapeDtypeStruct((256,), jnp.float32)
    return jax.jit(ks.scale).trace(spec).lower(lowering_platforms=("cuda",)).as_text()


def _keys(ks: cutecc.runtime.loader.KernelSet) -> list[str]:
    return [b.key for b in ks.scale.builds]


@pytest.fixture(scope="module")
def two(dsl: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Projects a and b, each with kernel `scale` (b's a copy with one line changed, built
    last), built into one cache."""
    base = tmp_path_factory.mktemp("two")
    a = write_toy_project(base / "a", threads=(64,))
    b = write_toy_project(base / "b", threads=(64,))
    _edit(b.parent)
    (b.parent / "toy" / "ref.py").write_text(FALLBACK)  # b alone declares a fallback
    b.write_text(b.read_text().replace('entry = "toy.ops:scale"',
                                       'entry = "toy.ops:scale"\nfallback = "toy.ref:scale"'))
    (base / "elsewhere").mkdir()
    _build(a, base / "cache")
    _build(b, base / "cache")
    return {"a": a, "b": b, "cache": base / "cache", "elsewhere": base / "elsewhere"}


def _lock_keys(manifest: Path) -> list[str]:
    return [e["key"] for e in json.loads((manifest.parent / "kernels.lock").read_text())["entries"]]


def test_each_project_directory_loads_its_own_kernel(two: dict[str, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ka, kb = _lock_keys(two["a"]), _lock_keys(two["b"])
    assert len(ka) == len(kb) == 1 and ka != kb
    for name, keys in (("a", ka), ("b", kb)):
        monkeypatch.chdir(two[name].parent / "toy")  # a directory below the project's root
        ks = cutecc.load(two["cache"], arch="sm_90a")
        assert _keys(ks) == keys, name
        assert f"@{target_name(keys[0])}" in _lowered(ks), name


def test_a_name_several_manifests_built_is_an_error_naming_them(two: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(two["elsewhere"])
    ks = cutecc.load(two["cache"], arch="sm_90a")
    with pytest.raises(cutecc.CuteccError) as err:
        ks.scale  # noqa: B018
    msg = str(err.value)
    assert str(two["a"]) in msg and str(two["b"]) in msg and "manifest=" in msg
    # the argument that picks: each manifest serves its own from anywhere
    for name in ("a", "b"):
        ks = cutecc.load(two["cache"], arch="sm_90a", manifest=two[name])
        assert _keys(ks) == _lock_keys(two[name])
        ks = cutecc.load(two["cache"], arch="sm_90a", lock=two[name].parent / "kernels.lock",
                         allow_unsigned=True)
        assert _keys(ks) == _lock_keys(two[name])


def test_list_names_each_entry_s_manifest_and_filters_by_it(two: dict[str, Path]) -> None:
    r = run_cli("list", "--cache-dir", str(two["cache"]), "--json")
    assert r.returncode == 0, r.stderr
    rows = {e["key"]: e["manifests"] for e in json.loads(r.stdout)["entries"]}
    assert rows == {_lock_keys(two["a"])[0]: [str(two["a"])], _lock_keys(two["b"])[0]: [str(two["b"])]}
    r = run_cli("list", "--cache-dir", str(two["cache"]), "--manifest", str(two["b"]), "--json")
    assert r.returncode == 0, r.stderr
    assert [e["key"] for e in json.loads(r.stdout)["entries"]] == _lock_keys(two["b"])
    r = run_cli("list", "--cache-dir", str(two["cache"]), "--manifest", "kernels.toml",
                cwd=two["a"].parent)
    assert r.returncode == 0, r.stderr
    head, row = r.stdout.splitlines()[:2]
    assert "MANIFEST" in head.split() and "kernels.toml" in row.split()
    assert _lock_keys(two["a"])[0][:12] in row and len(r.stdout.splitlines()) == 3


def _explained(manifest: Path, cache: Path) -> str:
    r = run_cli("explain", "scale", "-m", str(manifest), "--cache-dir", str(cache), "--json")
    assert r.returncode == 0, r.stderr
    entries = json.loads(r.stdout)["entries"]
    assert len(entries) == 1 and entries[0]["cached"], entries
    return str(entries[0]["key"])


def test_a_manifest_load_after_an_edit_built_and_reverted_serves_the_current_key(
        dsl: None, tmp_path: Path) -> None:
    manifest = write_toy_project(tmp_path / "p", threads=(64,))
    cache = tmp_path / "cache"
    _build(manifest, cache)
    first = _lock_keys(manifest)
    _edit(manifest.parent)
    _build(manifest, cache, lock=False)  # the edit built (its lock not written), then reverted
    _edit(manifest.parent, undo=True)
    assert _explained(manifest, cache) == first[0]
    ks = cutecc.load(cache, arch="sm_90a", manifest=manifest)  # through its lock
    assert _keys(ks) == first and f"@{target_name(first[0])}" in _lowered(ks)
    (manifest.parent / "kernels.lock").unlink()  # without a lock: the build that is its current plan
    ks = cutecc.load(cache, arch="sm_90a", manifest=manifest)
    assert _keys(ks) == first and f"@{target_name(first[0])}" in _lowered(ks)
    # an edit never built: its key is not in the cache, and the load says which file changed
    ops = manifest.parent / "toy" / "ops.py"
    ops.write_text(ops.read_text().replace(EDIT[0], "        out[i] = x[i] * scale - x[i]\n"))
    with pytest.raises(cutecc.CuteccError) as err:
        cutecc.load(cache, arch="sm_90a", manifest=manifest)
    assert str(ops) in str(err.value) and "cutecc build" in str(err.value)


def test_a_project_directory_no_build_of_knows_keeps_the_cache_s_rule(
        two: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory whose manifest this cache never built (a test run from a repository's
    root, a GPU suite's prepared caches) loads as before: each kernel from its one manifest."""
    cache = tmp_path / "cache"
    shutil.copytree(two["cache"], cache, symlinks=True)
    shutil.rmtree(cache / "manifests")  # as a cache from before manifest records
    other = write_toy_project(tmp_path / "other", threads=(64,))
    monkeypatch.chdir(other.parent)
    ks = cutecc.load(cache, arch="sm_90a")
    assert _keys(ks) == _lock_keys(two["b"])  # the newest build, as before: no record says otherwise


def test_a_project_copied_elsewhere_is_found_through_its_lock(two: dict[str, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout at another path than the one its cache was built from (a CI runner, a
    deploy host): no record names its manifest's path, its lock names the entries."""
    moved = shutil.copytree(two["a"].parent, tmp_path / "checkout")
    monkeypatch.chdir(moved / "toy")
    ks = cutecc.load(two["cache"], arch="sm_90a")
    assert _keys(ks) == _lock_keys(two["a"])
    (moved / "kernels.lock").unlink()  # neither its record nor its lock: the cache's own rule
    with pytest.raises(cutecc.CuteccError, match="2 manifests"):
        cutecc.load(two["cache"], arch="sm_90a").scale  # noqa: B018


def test_list_escapes_a_recorded_manifest_path(two: dict[str, Path], tmp_path: Path) -> None:
    cache = shutil.copytree(two["cache"], tmp_path / "cache", symlinks=True)
    rec = next((cache / "manifests").glob("*.json"))
    doc = json.loads(rec.read_text())
    doc["manifest"] = "/x/\x1b[2J\n[kernel.evil]\r.toml"
    rec.write_text(json.dumps(doc))
    r = run_cli("list", "--cache-dir", str(cache))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\r" not in r.stdout and "\n[kernel.evil]" not in r.stdout
    assert "/x/\\x1b[2J\\n[kernel.evil]\\r.toml" in r.stdout


def test_a_project_is_never_served_another_project_s_fallback(two: dict[str, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """b's build of `scale`, recorded last, declares a fallback; a's does not: a call no
    build of a's fits is an error in a's directory, and b's fallback serves it in b's."""
    monkeypatch.syspath_prepend(str(two["b"].parent))  # b's fallback is importable from both
    for mod in ("toy", "toy.ref", "toy.ops"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    misses = jax.ShapeDtypeStruct((256,), jnp.float16)  # no variant takes float16
    monkeypatch.chdir(two["a"].parent)
    ks = cutecc.load(two["cache"], arch="sm_90a")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        with pytest.raises(NoBuildFits):
            jax.jit(lambda x: ks.scale(x, factor=2.0)).trace(misses).lower(lowering_platforms=("cuda",))
    assert "toy.ref" not in sys.modules
    monkeypatch.chdir(two["b"].parent)
    ks = cutecc.load(two["cache"], arch="sm_90a")
    with pytest.warns(FallbackWarning):
        jax.jit(lambda x: ks.scale(x, factor=2.0)).trace(misses).lower(lowering_platforms=("cuda",))


def test_a_lock_only_project_is_never_served_another_project_s_fallback(
        two: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy directory holding a's lock alone (no kernels.toml): its load is a's entries,
    and b's fallback (b's build of `scale` is the newest, and declares one) never serves them."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    shutil.copy(two["a"].parent / "kernels.lock", deploy / "kernels.lock")
    monkeypatch.syspath_prepend(str(two["b"].parent))  # b's fallback is importable from here
    for mod in ("toy", "toy.ref", "toy.ops"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.chdir(deploy)
    ks = cutecc.load(two["cache"], arch="sm_90a")
    assert _keys(ks) == _lock_keys(two["a"])
    assert ks.scale._fallback is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        with pytest.raises(NoBuildFits):
            jax.jit(lambda x: ks.scale(x, factor=2.0)).trace(
                jax.ShapeDtypeStruct((256,), jnp.float16)).lower(lowering_platforms=("cuda",))


def test_a_working_directory_removed_since_is_no_project(two: dict[str, Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process whose working directory was deleted (a test's temporary folder, a release
    directory swapped away) loads as one in no project: the cache's rule, no OSError."""
    from cutecc.runtime.project import find_project

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert find_project() is None  # (was: FileNotFoundError from the working directory)
    with contextlib.suppress(cutecc.CuteccError):  # what the cache serves, or its own error:
        _keys(cutecc.load(two["cache"], arch="sm_90a"))  # never an OSError


@pytest.mark.parametrize("recorded", ["/x/\0y", "LOOP"])
def test_a_recorded_manifest_path_that_names_no_file_is_another_project_s(
        two: dict[str, Path], tmp_path: Path, recorded: str) -> None:
    """A generation record's manifest path (a string someone's build wrote) holding a NUL, or
    a symbolic link that loops: it names no manifest of this load, and the kernel loads."""
    cache = shutil.copytree(two["cache"], tmp_path / "cache", symlinks=True)
    if recorded == "LOOP":
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        recorded = str(tmp_path / "loop" / "kernels.toml")
    rec = cache / "generations" / "scale@sm_90a.json"
    doc = json.loads(rec.read_text())
    doc["manifest"] = recorded
    rec.write_text(json.dumps(doc))
    ks = cutecc.load(cache, arch="sm_90a", manifest=two["a"])
    assert _keys(ks) == _lock_keys(two["a"])


def test_a_plain_load_in_a_project_never_built_here_refuses_its_names_built_elsewhere(
        two: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile user's case: project c declares `scale` but never built it into the user's
    cache, where only b's `scale` is (a's record removed): a plain `load()` in c is an error
    naming b's manifest (it served b's kernel before); a project that declares no `scale`
    gets b's as before, and `manifest=` picks b's from c too."""
    cache = Path(shutil.copytree(two["cache"], tmp_path / "cache", symlinks=True))
    for rec in (cache / "manifests").glob("*.json"):
        if json.loads(rec.read_text()).get("manifest") == str(two["a"]):
            rec.unlink()
    c = write_toy_project(tmp_path / "c", threads=(64,))
    monkeypatch.setenv("CUTECC_CACHE_DIR", str(cache))
    monkeypatch.chdir(c.parent / "toy")
    with pytest.raises(cutecc.CuteccError) as err:
        cutecc.load(arch="sm_90a").scale  # noqa: B018
    assert str(two["b"]) in str(err.value) and "cutecc build" in str(err.value)
    assert _keys(cutecc.load(arch="sm_90a", manifest=two["b"])) == _lock_keys(two["b"])
    other = tmp_path / "d"
    other.mkdir()
    (other / "kernels.toml").write_text(c.read_text().replace("[kernel.scale]", "[kernel.other]"))
    monkeypatch.chdir(other)
    assert _keys(cutecc.load(arch="sm_90a")) == _lock_keys(two["b"])
