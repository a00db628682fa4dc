"""`cutecc pack` / `unpack`: reproducible wheels and tarballs, installed and loaded without the DSL."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sysconfig
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import PY, REPO, Toy, run_cli

from cutecc.commands.pack import pack
from cutecc.commands.unpack import unpack
from cutecc.entry.rules import STORE_FORMAT
from cutecc.errors import CuteccError
from cutecc.lock.lockfile import read_lock
from cutecc.runtime.package import package_root
from cutecc.ship.archive import tar_bytes
from cutecc.store import Store

pytestmark = pytest.mark.usefixtures("dsl")
ARCHS = ("sm_90a", "sm_100a")


@pytest.fixture(scope="module")
def toy(toy_builds: Callable[..., Toy], tmp_path_factory: pytest.TempPathFactory) -> Toy:
    """The toy project (threads=64 and 128) built for two archs, copied for this module."""
    return toy_builds(archs=ARCHS).copy(tmp_path_factory.mktemp("pack"))


# What the libraries need: glibc symbol versions up to 2.17 (zig links for glibc 2.28)
TAG = "py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64"


@pytest.fixture(scope="module")
def wheel(toy: Toy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sm_90a wheel of the toy kernels."""
    out = tmp_path_factory.mktemp("wheel")
    return pack(name="Toy-Kernels", version="1.2.0", lock=toy.lock, archs=("sm_90a",), out=out,
                cache_dir=toy.cache).path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_packing_twice_gives_identical_bytes(toy: Toy, wheel: Path, tmp_path: Path) -> None:
    kw = {"name": "Toy-Kernels", "version": "1.2.0", "archs": ("sm_90a",), "cache_dir": toy.cache}
    again = pack(lock=toy.lock, out=tmp_path / "a", **kw)
    from_manifest = pack(manifest=toy.manifest, out=tmp_path / "b", **kw)
    assert again.path.name == wheel.name == "toy_kernels-1.2.0-" + TAG + ".whl"
    # digests, not bytes: a failing comparison of two wheels would have pytest diff them for hours
    assert _sha(again.path) == _sha(wheel) == _sha(from_manifest.path)
    t1 = pack(lock=toy.lock, out=tmp_path / "t1", fmt="tar", **kw)
    t2 = pack(manifest=toy.manifest, out=tmp_path / "t2", fmt="tar", **kw)
    assert t1.path.name.endswith(".tar.gz") and _sha(t1.path) == _sha(t2.path)
    assert t1.path.read_bytes()[4:8] == b"\0\0\0\0"  # gzip mtime 0


def test_wheel_layout_metadata_and_record(toy: Toy, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
        files = {i.filename: zf.read(i) for i in infos}
    names = [i.filename for i in infos]
    info = "toy_kernels-1.2.0.dist-info"
    body = [n for n in names if not n.startswith(info)]
    assert body == sorted(body) and names[-1] == f"{info}/RECORD"
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr >> 16 for i in infos} == {0o100644}
    lock = read_lock(toy.lock).select(archs=("sm_90a",)).with_environment(None)  # build-side: not packed
    assert files["toy_kernels/_cutecc/kernels.lock"] == lock.dumps()
    assert files["toy_kernels/_cutecc/format"] == f"{STORE_FORMAT}\n".encode()
    runtimes = set()
    for key in lock.distinct_keys():
        base = f"toy_kernels/_cutecc/entries/{key[:2]}/{key}"
        meta = json.loads(files[f"{base}/meta.json"])
        assert meta["arch"] == "sm_90a"
        assert hashlib.sha256(files[f"{base}/kernel.so"]).hexdigest() == meta["files"]["kernel.so"]["sha256"]
        runtimes.add((meta["runtime"]["key"], meta["runtime"]["library"], meta["runtime"]["sha256"]))
    [(rkey, soname, sha)] = runtimes  # every entry links against one runtime library, packed once
    packed = [n for n in names if "/_cutecc/runtimes/" in n]
    base = f"toy_kernels/_cutecc/runtimes/{rkey[:2]}/{rkey}"
    assert packed == [f"{base}/{soname}", f"{base}/meta.json"]
    assert hashlib.sha256(files[f"{base}/{soname}"]).hexdigest() == sha
    assert not any("sm_100a" in json.loads(d).get("arch", "") for n, d in files.items()
                   if n.endswith("meta.json"))
    metadata = files[f"{info}/METADATA"].decode()
    assert "Name: Toy-Kernels\nVersion: 1.2.0\n" in metadata and "Requires-Dist: cutecc>=" in metadata
    assert "[build]" not in metadata and "cutlass" not in metadata
    assert f"Tag: {TAG}\n" in files[f"{info}/WHEEL"].decode()
    rows = [line.split(",") for line in files[f"{info}/RECORD"].decode().splitlines()]
    assert [r[0] for r in rows] == names and rows[-1] == [f"{info}/RECORD", "", ""]
    for name, digest, size in rows[:-1]:
        data = files[name]
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={want}", len(data))


def test_sizes_per_arch_and_filters(toy: Toy, tmp_path: Path) -> None:
    both = pack(name="k", version="1", lock=toy.lock, out=tmp_path, cache_dir=toy.cache)
    assert list(both.sizes) == [*sorted(ARCHS), "runtime"]
    # a kernel library holds its kernel: tens of KB; the runtime library is packed once
    assert all(s["entries"] == 2 and 10_000 < s["bytes"] < 100_000 for a, s in both.sizes.items()
               if a != "runtime")
    assert both.sizes["runtime"]["entries"] == 1 and both.sizes["runtime"]["bytes"] > 500_000
    assert both.total_bytes == sum(s["bytes"] for s in both.sizes.values())
    assert both.file_bytes == both.path.stat().st_size < both.total_bytes
    assert both.platform == "manylinux2014_x86_64.manylinux_2_17_x86_64"
    one = pack(name="k", version="1", lock=toy.lock, archs=("sm_100a",), out=tmp_path / "b",
               cache_dir=toy.cache)
    assert list(one.sizes) == ["sm_100a", "runtime"] and one.sizes["sm_100a"] == both.sizes["sm_100a"]
    with pytest.raises(CuteccError, match="nothing to pack"):
        pack(name="k", version="1", lock=toy.lock, kernels=("nope",), out=tmp_path, cache_dir=toy.cache)


def test_cli_pack_reports_sizes_and_rejects_bad_input(toy: Toy, tmp_path: Path) -> None:
    r = run_cli("pack", "--lock", str(toy.lock), "--name", "toy-kernels", "--version", "1.0",
                "--out", str(tmp_path), "--cache-dir", str(toy.cache))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("sm_100a") and lines[1].startswith("sm_90a") and "2 entries" in lines[0]
    assert lines[2].startswith("runtime") and "1 library" in lines[2]
    assert lines[3].startswith("total") and "4 entries" in lines[3]
    assert lines[4].startswith(f"wrote {tmp_path}/toy_kernels-1.0-{TAG}.whl")
    lock = ["--lock", str(toy.lock)]
    for args, msg in [
        ([*lock, "--manifest", str(toy.manifest), "--name", "ok", "--version", "1"],
         "exactly one of --manifest"),
        ([*lock, "--name", "-bad", "--version", "1"], "not a valid distribution name"),
        ([*lock, "--name", "ok", "--version", "one"], "not a version"),
        ([*lock, "--name", "class", "--version", "1"], "usable import name"),
    ]:
        r = run_cli("pack", *args, "--out", str(tmp_path), "--cache-dir", str(toy.cache))
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    # A manifest whose entries are not built: a failure at work, naming the cache.
    Store(tmp_path / "empty").ensure()
    r = run_cli("pack", "--manifest", str(toy.manifest), "--name", "k", "--version", "1",
                "--out", str(tmp_path), "--cache-dir", str(tmp_path / "empty"))
    assert r.returncode == 1 and "is not in the cache" in r.stderr


# Installing into a fresh environment without the DSL ----------------------------------

BLOCK_DSL = '''\
import importlib.abc, sys

class _NoDSL(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cutlass", "cuda", "nvidia_cutlass_dsl"):
            raise ImportError(f"blocked: {name} (this environment has no DSL)")
        return None

sys.meta_path.insert(0, _NoDSL())
'''


def bare_venv(where: Path) -> tuple[Path, Path]:
    """A new venv without pip: its python and its site-packages directory."""
    subprocess.run([PY, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    return python, site


def fresh_venv(where: Path) -> Path:
    """A new venv that sees this venv's runtime dependencies and cutecc, never the DSL.

    No pip, no downloads: a .pth lists this venv's site-packages (whose own .pth files,
    the DSL's included, are not processed) and a directory holding only `cutecc`, and a
    meta-path finder blocks the DSL's packages should anything reach for them.
    """
    python, site = bare_venv(where)
    only_cutecc = where / "cutecc-src"
    only_cutecc.mkdir()
    (only_cutecc / "cutecc").symlink_to(REPO / "cutecc")
    (site / "_no_dsl.py").write_text(BLOCK_DSL)
    (site / "_0_no_dsl.pth").write_text("import _no_dsl\n")
    (site / "_1_deps.pth").write_text(f"{only_cutecc}\n{sysconfig.get_paths()['purelib']}\n")
    return python


def pip_install(python: Path, wheel: Path) -> Path:
    """Install the wheel with this venv's pip (no index, no dependencies); its site dir."""
    subprocess.run([PY, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
                    "--no-deps", "--disable-pip-version-check", str(wheel)], check=True)
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def run_in(python: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` isolated (-I: no PYTHON* variables, no current directory on sys.path)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CUTECC_")}
    return subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                          timeout=600, env={**clean, **env}, cwd=python.parent)


LOAD_AND_LOWER = r'''
import json, sys
try:
    import cutlass  # noqa: F401
    raise SystemExit("the DSL is importable here")
except ImportError:
    pass
import jax, jax.numpy as jnp
import toy_kernels

ks = toy_kernels.load(arch="sm_90a", allow_unsigned=True)
targets = ks.register_all()
spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
lower = lambda f: jax.jit(f).trace(spec).lower(lowering_platforms=("cuda",)).as_text()
text = lower(lambda x: ks.scale(x, factor=2.0, threads=128))
lazy = lower(lambda x: toy_kernels.scale(x, threads=64))  # module attribute, loaded for $CUTECC_ARCH
print(json.dumps({
    "file": toy_kernels.__file__, "cutecc": __import__("cutecc").__file__,
    "variants": sorted(ks.scale.variants), "targets": targets, "root": str(ks.root),
    "custom_call": "stablehlo.custom_call @cutecc_" in text,
    "lazy": "stablehlo.custom_call @cutecc_" in lazy,
    "dsl": sorted(m for m in sys.modules if m.startswith(("cutlass", "nvidia_cutlass"))),
}))
'''


def test_the_wheel_installs_and_lowers_without_the_dsl(wheel: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    site = pip_install(python, wheel)
    pkg = site / "toy_kernels"
    before = sorted(p.relative_to(pkg) for p in pkg.rglob("*"))
    r = run_in(python, LOAD_AND_LOWER, CUTECC_ARCH="sm_90a", CUTECC_ALLOW_UNSIGNED="1")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["file"] == str(pkg / "__init__.py") and got["cutecc"].startswith(str(tmp_path))
    assert got["root"] == str(pkg / "_cutecc")
    assert got["variants"] == ["threads=128", "threads=64"] and len(got["targets"]) == 2
    assert got["custom_call"] and got["lazy"] and got["dsl"] == []
    # Nothing was written into the installed package (no `used` marks, no caches).
    assert sorted(p.relative_to(pkg) for p in pkg.rglob("*") if "__pycache__" not in p.parts) == [
        p for p in before if "__pycache__" not in p.parts]


TAMPERED = r'''
import hashlib, json, pathlib
import cutecc, toy_kernels
root = pathlib.Path(toy_kernels.__file__).parent / "_cutecc"
meta_path = sorted(root.glob("entries/*/*/meta.json"))[0]
lib = meta_path.parent / "kernel.so"
data = bytearray(lib.read_bytes()); data[8192] ^= 0xFF; lib.write_bytes(bytes(data))
out = {}
ks = toy_kernels.load(arch="sm_90a", allow_unsigned=True)
try:
    ks.register_all()
except cutecc.CuteccError as e:
    out["library"] = str(e)
meta = json.loads(meta_path.read_text())
meta["files"]["kernel.so"]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
meta_path.write_text(json.dumps(meta))
ks = toy_kernels.load(arch="sm_90a", allow_unsigned=True)
out["builds"] = len(ks.scale.builds)
out["problems"] = ks.problems
out["key"] = meta_path.parent.name
print(json.dumps(out))
'''


def test_a_tampered_installed_file_is_refused(wheel: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    pip_install(python, wheel)
    r = run_in(python, TAMPERED)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert "does not match its recorded SHA-256" in got["library"] and got["key"][:12] in got["library"]
    assert got["builds"] == 0 and "differs from the lock" in got["problems"][0]


def test_package_root_errors() -> None:
    with pytest.raises(CuteccError, match="no installed package 'no_such_pack_xyz'"):
        package_root("no_such_pack_xyz")
    with pytest.raises(CuteccError, match="not a cutecc pack"):
        package_root("cutecc")
    import cutecc

    with pytest.raises(CuteccError, match="excludes cache_dir"):
        cutecc.load("/tmp", package="x", arch="sm_90a")


# Unpacking ---------------------------------------------------------------------------


def _keys(cache: Path) -> list[str]:
    r = run_cli("list", "--cache-dir", str(cache), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    return sorted(e["key"] for e in doc["entries"])


def test_unpack_round_trip_into_an_empty_cache(toy: Toy, tmp_path: Path) -> None:
    tar = pack(name="k", version="1", lock=toy.lock, out=tmp_path, cache_dir=toy.cache, fmt="tar")
    cache = tmp_path / "fresh"
    r = run_cli("unpack", str(tar.path), "--cache-dir", str(cache), "--allow-unsigned")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("4 imported, 0 already present, 0 refused")
    assert _keys(cache) == _keys(toy.cache) == read_lock(toy.lock).distinct_keys()
    for key in _keys(cache):  # meta.json and the library arrive byte for byte
        for name in ("meta.json", "kernel.so"):
            sub = f"entries/{key[:2]}/{key}/{name}"
            assert (cache / sub).read_bytes() == (toy.cache / sub).read_bytes()
    [rt] = list(Store(toy.cache).runtimes())  # and the runtime library, once
    [got] = list(Store(cache).runtimes())
    assert got.key == rt.key and got.doc["files"] == rt.doc["files"]
    assert run_cli("verify", "--cache-dir", str(cache)).returncode == 0
    again = unpack(tar.path, cache, allow_unsigned=True)
    assert (len(again.imported), len(again.present), again.runtimes) == (0, 4, [])
    # A wheel unpacks the same way.
    whl = pack(name="k", version="1", lock=toy.lock, out=tmp_path / "w", cache_dir=toy.cache)
    report = unpack(whl.path, tmp_path / "from-wheel", allow_unsigned=True)
    assert report.ok and len(report.imported) == 4


def test_unpack_refuses_a_corrupted_member_and_keeps_the_rest(toy: Toy, tmp_path: Path) -> None:
    tar = pack(name="k", version="1", lock=toy.lock, out=tmp_path, cache_dir=toy.cache, fmt="tar")
    with tarfile.open(tar.path) as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    bad = sorted(n for n in files if n.endswith("kernel.so"))[0]
    data = bytearray(files[bad])
    data[100] ^= 0xFF
    files[bad] = bytes(data)
    evil = tmp_path / "evil.tar.gz"
    evil.write_bytes(tar_bytes(files))
    cache = tmp_path / "fresh"
    r = run_cli("unpack", str(evil), "--cache-dir", str(cache), "--allow-unsigned")
    assert r.returncode == 1
    key = bad.split("/")[3]
    assert "error: refused scale[" in r.stderr and key[:12] in r.stderr and "SHA-256" in r.stderr
    assert r.stdout.startswith("3 imported, 0 already present, 1 refused")
    assert key not in _keys(cache) and len(_keys(cache)) == 3


@pytest.mark.parametrize("damage", ["flip", "drop"])
def test_unpack_refuses_entries_whose_runtime_library_is_bad_or_absent(toy: Toy, tmp_path: Path,
                                                                       damage: str) -> None:
    tar = pack(name="k", version="1", lock=toy.lock, out=tmp_path, cache_dir=toy.cache, fmt="tar")
    with tarfile.open(tar.path) as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    [lib] = [n for n in files if "/runtimes/" in n and n.endswith(".so")]
    if damage == "flip":
        data = bytearray(files[lib])
        data[1000] ^= 0xFF
        files[lib] = bytes(data)
    else:
        del files[lib], files[lib.rsplit("/", 1)[0] + "/meta.json"]
    evil = tmp_path / "evil.tar.gz"
    evil.write_bytes(tar_bytes(files))
    report = unpack(evil, tmp_path / "fresh", allow_unsigned=True)
    assert report.imported == [] and report.runtimes == [] and not report.ok
    why = dict(report.refused)
    assert ("SHA-256" if damage == "flip" else "missing from the archive") in why.pop(next(
        k for k in why if k.startswith("runtime")))
    assert len(why) == 4 and all("runtime library is not in the pack" in w for w in why.values())
    assert list(Store(tmp_path / "fresh").entries()) == []


def test_unpack_lands_no_runtime_library_the_lock_does_not_vouch_for(toy: Toy, tmp_path: Path) -> None:
    """Other runtime library bytes, with its meta.json and every entry's record rewritten
    to match them: the entries are refused by their lock lines, and the runtime library
    is not published either (entries are checked one at a time, after the runtimes)."""
    tar = pack(name="k", version="1", lock=toy.lock, out=tmp_path, cache_dir=toy.cache, fmt="tar")
    with tarfile.open(tar.path) as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    [lib] = [n for n in files if "/runtimes/" in n and n.endswith(".so")]
    data = bytearray(files[lib])
    data[1000] ^= 0xFF
    files[lib] = bytes(data)
    rec = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    rmeta_name = lib.rsplit("/", 1)[0] + "/meta.json"
    rmeta = json.loads(files[rmeta_name])
    rmeta["files"][lib.rsplit("/", 1)[1]].update(rec)
    files[rmeta_name] = json.dumps(rmeta).encode()
    for n in [n for n in files if "/entries/" in n and n.endswith("/meta.json")]:
        meta = json.loads(files[n])
        meta["runtime"].update(rec)
        files[n] = json.dumps(meta).encode()
    evil = tmp_path / "evil.tar.gz"
    evil.write_bytes(tar_bytes(files))
    report = unpack(evil, tmp_path / "fresh", allow_unsigned=True)
    assert report.imported == [] and report.runtimes == [] and not report.ok
    why = dict(report.refused)
    assert "no entry of the pack links against it" in why.pop(next(k for k in why if k.startswith("runtime")))
    assert len(why) == 4 and all("runtime library SHA-256" in w for w in why.values()), why
    assert list(Store(tmp_path / "fresh").runtimes()) == [] == list(Store(tmp_path / "fresh").entries())


def test_unpack_rejects_what_is_not_a_pack(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(CuteccError, match="cannot read the archive") as e:
        unpack(junk, tmp_path / "c", allow_unsigned=True)
    assert e.value.exit_code == 2
    other = tmp_path / "other.tar.gz"
    other.write_bytes(tar_bytes({"README": b"hi"}))
    with pytest.raises(CuteccError, match="not a cutecc pack"):
        unpack(other, tmp_path / "c", allow_unsigned=True)
    other.write_bytes(tar_bytes({"_cutecc/kernels.lock": b"{}", "_cutecc/format": b"9\n"}))
    with pytest.raises(CuteccError, match="pack format"):
        unpack(other, tmp_path / "c", allow_unsigned=True)


# Never seen by the deploy venv: cutecc itself (it must come from the runtime wheel), the
# DSL, and every .pth (an editable install's finder, the DSL's path entry).
_NOT_DEPLOYED = ("cutecc", "_cutecc", "__editable__", "nvidia_cutlass_dsl", "cutlass", "_no_dsl")


def runtime_only_venv(where: Path) -> Path:
    """A new venv as a deploy host has it: jax, tvm-ffi and the runtime's other dependencies
    installed (this environment's, linked in through a .pth), and no cutecc, no DSL, no index."""
    python, site = bare_venv(where)
    deps = where / "deps"
    deps.mkdir()
    for p in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not p.name.startswith(_NOT_DEPLOYED) and p.suffix != ".pth":
            (deps / p.name).symlink_to(p)
    (site / "_no_dsl.py").write_text(BLOCK_DSL)
    (site / "_0_no_dsl.pth").write_text("import _no_dsl\n")
    (site / "_1_deps.pth").write_text(f"{deps}\n")
    return python


def test_a_pack_and_its_runtime_wheel_install_with_no_index_and_load_without_the_dsl(
        toy: Toy, tmp_path: Path) -> None:
    """docs/shipping.md's deploy: `cutecc pack` writes the kernels' wheel and cutecc's own beside it;
    `pip install --no-index --find-links dist NAME` on a host with no cutecc and no DSL
    installs both, and the kernels load and lower from the installed runtime."""
    dist = tmp_path / "dist"
    report = pack(name="Toy-Kernels", version="1.2.0", lock=toy.lock, archs=("sm_90a",), out=dist,
                  cache_dir=toy.cache)
    assert report.runtime is not None and report.runtime.name == "cutecc-0.1.0-py3-none-any.whl"
    again = pack(name="Toy-Kernels", version="1.2.0", lock=toy.lock, archs=("sm_90a",),
                 out=tmp_path / "again", cache_dir=toy.cache)
    assert again.runtime is not None and _sha(again.runtime) == _sha(report.runtime)
    python = runtime_only_venv(tmp_path / "venv")
    assert run_in(python, "import cutecc").returncode != 0  # nothing to import before the install
    r = subprocess.run([PY, "-m", "pip", "--python", str(python), "install", "--no-index",
                        "--find-links", str(dist), "toy-kernels"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_in(python, LOAD_AND_LOWER, CUTECC_ARCH="sm_90a", CUTECC_ALLOW_UNSIGNED="1")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["cutecc"].startswith(str(tmp_path / "venv" / "lib"))  # the runtime wheel's
    assert got["custom_call"] and got["dsl"] == []
    # the command it installed runs too
    r = subprocess.run([str(tmp_path / "venv/bin/cutecc"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "build" in r.stdout


def test_the_runtime_wheel_of_an_uninstalled_checkout_declares_what_an_installed_one_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a source tree that was never installed (a GPU host's PYTHONPATH checkout),
    cutecc's own wheel takes its dependencies from the checkout's pyproject.toml: the same
    requirements, extras included, as the installed distribution declares."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    from cutecc.ship.archive import runtime_wheel

    def metadata_of(whl: bytes) -> list[str]:
        with zipfile.ZipFile(__import__("io").BytesIO(whl)) as z:
            text = z.read("cutecc-0.1.0.dist-info/METADATA").decode()
        return [ln for ln in text.splitlines() if ln.startswith(("Requires-Dist:", "Provides-Extra:"))]

    def normal(lines: list[str]) -> set[str]:
        out = set()
        for ln in lines:
            key, _, value = ln.partition(": ")
            out.add(f"{key} {Requirement(value)}" if key == "Requires-Dist" else ln)
        return out

    installed = metadata_of(runtime_wheel()[1])
    real = md.metadata

    def not_installed(name: str):  # type: ignore[no-untyped-def]
        if name == "cutecc":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "metadata", not_installed)
    checkout = metadata_of(runtime_wheel()[1])
    assert any("extra == \"build\"" in ln for ln in checkout)
    assert normal(checkout) == normal(installed)
