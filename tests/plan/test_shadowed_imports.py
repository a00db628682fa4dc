"""A module found ahead of the one installed code imports is keyed (issue 44, seen 2).

Installed `dep/ew.py` does `import util`, a top-level module of its own distribution. A
directory ahead on the path that gains a `util.py` changes what that import runs, so it
changes the key (the shadow's closure is keyed by content and carried as keyed files, which
the worker checks again); without a shadow nothing is added and keys are what they were.
A development checkout of the dependency on the path over its installed release is the
same shape.

Pure Python: a distribution installed into a temporary site directory (dist-info, METADATA,
top_level.txt and a RECORD naming each file's SHA-256), no DSL import, no compile.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

import cutecc.toolchain.dists
import cutecc.toolchain.hashcache
from cutecc.commands.explain import differences
from cutecc.manifest import load_manifest
from cutecc.plan.build_plan import Planned, plan
from cutecc.plan.keyed_sources import problem

DEP = {
    "dep/__init__.py": "",
    "dep/ew.py": "import util\n\n\ndef kern(x, out, stream):\n    return util.WIDTH\n",
    "util.py": "WIDTH = 4\n",
}
MANIFEST = '''format = 1
archs = ["sm_90a"]

[kernel.ew]
entry = "kp.uses_dep:kern"
args = [{ name = "x", dtype = "float32", shape = ["n"] },
        { name = "out", role = "output", dtype = "float32", shape = ["n"] }, { kind = "stream" }]
'''


def install(site: Path, name: str, files: dict[str, str], top: str) -> None:
    """Install distribution `name` 1.0 into `site` as pip would: its files, METADATA,
    top_level.txt and a RECORD naming every file's SHA-256 and size."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    rows = []
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{len(text.encode())}\n")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(top)
    (info / "RECORD").write_text("".join(rows) + f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def forget() -> None:
    """Drop what this process remembers of installed distributions and directory listings."""
    importlib.invalidate_caches()
    for f in vars(cutecc.toolchain.dists).values():
        if callable(getattr(f, "cache_clear", None)):
            f.cache_clear()


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(site directory holding `dep`, an empty directory ahead of it on sys.path, the manifest)."""
    site = tmp_path / "env/lib/site-packages"
    install(site, "dep", DEP, "dep\nutil\n")
    ahead = tmp_path / "ahead"
    ahead.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(ahead))  # as $PYTHONPATH puts it ahead of site-packages
    monkeypatch.setattr(cutecc.toolchain.hashcache, "SETTLE_NS", 0)
    root = tmp_path / "proj"
    (root / "kp").mkdir(parents=True)
    (root / "kp/__init__.py").write_text("")
    (root / "kp/uses_dep.py").write_text("import dep.ew\n\n\ndef kern(x, out, stream):\n    pass\n")
    (root / "kernels.toml").write_text(MANIFEST)
    forget()
    yield site, ahead, root / "kernels.toml"
    forget()


def planned(manifest: Path, cache: Path | None = None) -> Planned:
    forget()
    (p,) = plan(load_manifest(manifest), hash_cache=cache)
    return p


def test_a_module_shadowing_an_installed_import_rekeys(dirs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Seen: with `util.py` ahead of the installed one, the build said "cached"."""
    site, ahead, manifest = dirs
    cache = tmp_path / "cache/filehashes.json"
    cache.parent.mkdir()
    plain = planned(manifest, cache)
    assert "shadows" not in plain.inputs
    assert [f.module for f in plain.keyed_files] == ["kp", "kp.uses_dep"]
    assert planned(manifest, cache).key == plain.key  # remembered: the same answer

    (ahead / "util.py").write_text("WIDTH = 8\n")
    shadowed = planned(manifest, cache)
    assert shadowed.key != plain.key
    assert set(shadowed.inputs["shadows"]) == {"util"}
    assert [d.input for d in differences(plain.inputs, shadowed.inputs)] == ["shadows.util"]
    mine = [f for f in shadowed.keyed_files if f.module == "util"]
    assert [(f.path, f.rel) for f in mine] == [(str(ahead / "util.py"), "util.py")]
    assert planned(manifest, cache).key == shadowed.key  # remembered, still shadowed

    (ahead / "util.py").write_text("WIDTH = 16\n")  # editing the shadow re-keys
    edited = planned(manifest, cache)
    assert edited.key not in (plain.key, shadowed.key)
    assert planned(manifest).key == edited.key  # a fresh cache plans the same key

    (ahead / "util.py").unlink()
    assert planned(manifest, cache).key == plain.key


def test_the_worker_check_refuses_a_shadow_edited_after_planning(dirs: tuple[Path, Path, Path]) -> None:
    """The shadow is a keyed file: the worker's pre-publish check re-hashes it."""
    _, ahead, manifest = dirs
    (ahead / "util.py").write_text("WIDTH = 8\n")
    p = planned(manifest)
    assert problem(p.keyed_files) is None
    (ahead / "util.py").write_text("WIDTH = 9\n")
    why = problem(p.keyed_files)
    assert why is not None and "util.py" in why and "changed since the build was planned" in why


def test_what_the_shadow_imports_is_keyed_too(dirs: tuple[Path, Path, Path]) -> None:
    """The shadow's own project-local imports (source beside it that no distribution owns)."""
    _, ahead, manifest = dirs
    (ahead / "util.py").write_text("from helper_mod import WIDTH\n")
    (ahead / "helper_mod.py").write_text("WIDTH = 8\n")
    first = planned(manifest)
    assert {f.module for f in first.keyed_files} >= {"util", "helper_mod"}
    (ahead / "helper_mod.py").write_text("WIDTH = 32\n")
    assert planned(manifest).key != first.key


def test_a_development_checkout_over_the_installed_release_rekeys(dirs: tuple[Path, Path, Path]) -> None:
    """A checkout of the dependency ahead on the path: its sources, not the release, compile."""
    site, ahead, manifest = dirs
    plain = planned(manifest)
    (ahead / "dep").mkdir()
    (ahead / "dep/__init__.py").write_text("")
    (ahead / "dep/ew.py").write_text((site / "dep/ew.py").read_text())  # same bytes, other file
    checkout = planned(manifest)
    assert checkout.key != plain.key
    assert set(checkout.inputs["shadows"]) == {"dep"}
    assert str(ahead / "dep/ew.py") in {f.path for f in checkout.keyed_files}
    (ahead / "dep/ew.py").write_text("import util\n\n\ndef kern(x, out, stream):\n    return 2\n")
    assert planned(manifest).key != checkout.key


def test_installed_code_found_where_it_was_installed_adds_nothing(dirs: tuple[Path, Path, Path]) -> None:
    """No shadow: the key's inputs and keyed files are those of a key before shadows existed
    (the committed locks reproduce: tests/toolchain/test_reproducible.py)."""
    _, ahead, manifest = dirs
    (ahead / "unrelated.py").write_text("X = 1\n")  # a module no reached distribution installs
    p = planned(manifest)
    assert "shadows" not in p.inputs
    assert {f.module for f in p.keyed_files} == {"kp", "kp.uses_dep"}


def test_the_cli_keys_a_pythonpath_shadow(dirs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The real search order of a fresh process: $PYTHONPATH ahead of the site directory."""
    site, ahead, manifest = dirs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ahead), str(site), str(REPO)])}
    cache = tmp_path / "clicache"

    def keys() -> list[str]:
        r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(manifest), "--dry-run",
                            "--json", "--cache-dir", str(cache)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return sorted(_keys(json.loads(r.stdout)))

    before = keys()
    (ahead / "util.py").write_text("WIDTH = 8\n")
    assert keys() != before


def _keys(report: object) -> list[str]:
    """Every 64-hex-digit string under a JSON report."""
    if isinstance(report, dict):
        return [k for v in report.values() for k in _keys(v)]
    if isinstance(report, list):
        return [k for v in report for k in _keys(v)]
    if isinstance(report, str) and len(report) == 64 and all(c in "0123456789abcdef" for c in report):
        return [report]
    return []


SCALE_DEP = '''\
import cutlass
import cutlass.cute as cute

import util


@cute.kernel
def _scale_kernel(x: cute.Tensor, out: cute.Tensor, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] * util.FACTOR


@cute.jit
def scale(x: cute.Tensor, out: cute.Tensor, stream):
    n = x.shape[0]
    _scale_kernel(x, out, n).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)
'''


@pytest.mark.usefixtures("dsl")
def test_a_build_compiles_the_shadow_under_its_own_key(tmp_path: Path) -> None:
    """Seen: the build said "cached" with a shadow ahead on $PYTHONPATH, and a fresh cache
    built the same key with other bytes. Now the shadow's build is a miss, the worker checks
    it imported the keyed shadow, and a fresh cache builds that key with the same bytes."""
    site, ahead, root = tmp_path / "env/lib/site-packages", tmp_path / "ahead", tmp_path / "proj"
    install(site, "dep", {"dep/__init__.py": "", "dep/ew.py": SCALE_DEP, "util.py": "FACTOR = 2.0\n"},
            "dep\nutil\n")
    ahead.mkdir()
    (root / "kp").mkdir(parents=True)
    (root / "kp/__init__.py").write_text("")
    (root / "kp/uses_dep.py").write_text("from dep.ew import scale\n")
    (root / "kernels.toml").write_text(MANIFEST.replace("kp.uses_dep:kern", "kp.uses_dep:scale"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ahead), str(site), str(REPO)])}

    def build(cache: str) -> dict:
        r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(root / "kernels.toml"),
                            "--json", "--no-lock", "--cache-dir", str(tmp_path / cache)],
                           capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        (entry,) = json.loads(r.stdout)["entries"]
        lib = next((tmp_path / cache).rglob(f"{entry['key']}/kernel.so"))
        return {**entry, "sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}

    first = build("cache")
    assert first["status"] == "built"
    (ahead / "util.py").write_text("FACTOR = 3.0\n")
    shadowed = build("cache")
    assert shadowed["status"] == "built" and shadowed["key"] != first["key"]
    assert shadowed["sha256"] != first["sha256"]  # the shadow's factor was compiled
    fresh = build("fresh")
    assert (fresh["key"], fresh["sha256"]) == (shadowed["key"], shadowed["sha256"])
