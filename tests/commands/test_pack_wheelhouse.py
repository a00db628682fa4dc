"""`cutecc pack --wheelhouse` (issue 47): the pack, cutecc's runtime wheel and the wheels of
every runtime dependency in one directory, so that `pip install --no-index --find-links DIR
NAME` works on a host with no index. Seen: that command, as the docs gave it, failed with
`No matching distribution found for click>=8.1`.

The dependency wheels come from pip's index as configured here (this host's mirror, CI's);
the installs below use no index and no pip configuration at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aarch64_python
import pytest
from helpers import Toy, opts, run_cli

from cutecc.toolchain.dists import normalize

# pip with no configuration: no index, no find-links but the wheelhouse's (the host's
# pip.conf and PIP_* variables name its mirror)
NO_INDEX = {**{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "CUTECC_", "PYTHON"))},
            "PIP_CONFIG_FILE": os.devnull}
RUNTIME = {"click", "filelock", "platformdirs", "apache-tvm-ffi", "jax-tvm-ffi", "typing-extensions"}
JAX = {"jax", "jaxlib", "numpy", "scipy", "ml-dtypes", "opt-einsum"}
PY = f"{sys.version_info.major}.{sys.version_info.minor}"

LOAD = r'''
import json, sys
import toy_kernels, cutecc
try:
    import cutlass  # noqa: F401
    dsl = True
except ImportError:
    dsl = False
try:
    toy_kernels.load()
    no_gpu = None
except cutecc.CuteccError as e:
    no_gpu = str(e)
ks = toy_kernels.load(arch="sm_90a", allow_unsigned=True)
print(json.dumps({"kernels": list(toy_kernels.KERNELS), "variants": sorted(ks.scale.variants),
                  "cutecc": cutecc.__file__, "dsl": dsl, "no_gpu": no_gpu}))
'''


def _pack(toy: Toy, out: Path, *args: str) -> dict[str, object]:
    r = run_cli("pack", "--lock", str(toy.lock), "--cache-dir", str(toy.cache), "--name", "toy-kernels",
                "--version", "1.0.0", "--out", str(out), "--wheelhouse", "--json", *args, timeout=1800)
    if r.returncode != 0 and "pip could not download" in r.stderr:
        pytest.skip(f"pip's index cannot be reached here: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _names(report: dict[str, object]) -> set[str]:
    return {normalize(Path(p).name.split("-")[0]) for p in report["wheelhouse"]}  # type: ignore[attr-defined]


@pytest.mark.usefixtures("dsl")
def test_a_wheelhouse_installs_a_fresh_venv_with_no_index(toy_cache: Toy, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    report = _pack(toy_cache, dist, "--with-jax")
    assert _names(report) >= RUNTIME | JAX, _names(report)
    assert not {"cutecc", "nvidia-cutlass-dsl", "cuda-python", "ziglang"} & _names(report)
    assert {p.name.split("-")[0] for p in dist.iterdir()} >= {"toy_kernels", "cutecc", "click", "jax"}

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=NO_INDEX)
    python = venv / "bin" / "python"
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(dist),
                        "toy-kernels"], capture_output=True, text=True, timeout=1200, env=NO_INDEX)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([str(python), "-I", "-c", LOAD], capture_output=True, text=True, timeout=600,
                       env=NO_INDEX, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["kernels"] == ["scale"] and got["variants"] == ["threads=128", "threads=64"], got
    assert got["cutecc"].startswith(str(venv)) and not got["dsl"], got
    assert "no GPU is visible to JAX: pass arch=" in (got["no_gpu"] or ""), got  # no GPU here: said
    # `python -m cutecc` (what a `pip install --target` host has) and the installed command
    for cmd in ([str(python), "-m", "cutecc", "--help"], [str(venv / "bin" / "cutecc"), "--help"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=NO_INDEX, cwd=tmp_path)
        assert r.returncode == 0 and "build" in r.stdout, r.stderr


@pytest.mark.usefixtures("dsl")
def test_a_wheelhouse_leaves_jax_to_the_deploy_host_unless_asked(toy_cache: Toy, tmp_path: Path) -> None:
    """By default the deploy host brings JAX: none of JAX's own wheels come, all the rest do,
    and with a JAX wheelhouse beside it the install needs no index either."""
    report = _pack(toy_cache, tmp_path / "dist")
    assert _names(report) >= RUNTIME and not JAX & _names(report), _names(report)
    jax = _pack(toy_cache, tmp_path / "jax", "--with-jax")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                        "--no-index", "--find-links", str(tmp_path / "dist"), "--find-links",
                        str(tmp_path / "jax"), "--report", str(tmp_path / "r.json"), "toy-kernels"],
                       capture_output=True, text=True, timeout=600, env=NO_INDEX)
    assert r.returncode == 0, r.stderr[-3000:]
    assert jax["wheelhouse"]


@pytest.fixture(scope="module")
def arm_packs(toy_cache: Toy, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, object]]:
    """`arm_packs(python)`: the toy built for aarch64 (once per module) and packed with
    `--platform aarch64 --wheelhouse --with-jax` for CPython `python` ("3.11"), once per
    version; returns `pack --json`'s report (its wheelhouse is the report's path's folder)."""
    from cutecc.commands.build import build

    base = tmp_path_factory.mktemp("arm")
    proj = toy_cache.copy(base, cache="c")
    lock = base / "arm.lock"
    built = build(proj.manifest, opts(cache_dir=proj.cache), platforms=("aarch64",), lock_file=lock)
    assert built.ok, [o.error for o in built.outcomes]
    made: dict[str, dict[str, object]] = {}

    def pack(python: str) -> dict[str, object]:
        if python not in made:
            r = run_cli("pack", "--lock", str(lock), "--cache-dir", str(proj.cache), "--name", "toy-kernels",
                        "--version", "1.0.0", "--out", str(base / f"dist-{python}"), "--wheelhouse",
                        "--with-jax", "--python-version", python, "--platform", "aarch64", "--json",
                        timeout=1800)
            if r.returncode != 0 and "pip could not download" in r.stderr:
                pytest.skip(f"pip's index cannot be reached here: {r.stderr[-300:]}")
            assert r.returncode == 0, r.stderr[-3000:]
            made[python] = json.loads(r.stdout)
        return made[python]

    return pack


def test_an_aarch64_wheelhouse_resolves_for_its_platform(arm_packs: Callable[[str], dict[str, object]],
                                                         tmp_path: Path) -> None:
    """A pack for Grace hosts: its wheelhouse holds aarch64 wheels, and pip, asked for that
    platform with no index, resolves the pack from it alone."""
    report = arm_packs(PY)
    dist = Path(str(report["path"])).parent
    assert str(report["path"]).endswith("_aarch64.whl")
    arch_wheels = [Path(p).name for p in report["wheelhouse"] if not Path(p).name.endswith("-any.whl")]  # type: ignore[attr-defined]
    assert arch_wheels and all("aarch64" in n for n in arch_wheels), arch_wheels
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                        "--no-index", "--find-links", str(dist), "--only-binary=:all:",
                        "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux_2_27_aarch64",
                        "--platform", "manylinux_2_17_aarch64", "--platform", "manylinux2014_aarch64",
                        "--python-version", PY, "--target", str(tmp_path / "t"),
                        "--report", str(tmp_path / "r.json"), "toy-kernels"],
                       capture_output=True, text=True, timeout=600, env=NO_INDEX)
    assert r.returncode == 0, r.stderr[-3000:]
    plan = json.loads((tmp_path / "r.json").read_text())["install"]
    installed = {normalize(i["metadata"]["name"]) for i in plan}
    assert {"toy-kernels", "cutecc", "jax", "jaxlib"} | RUNTIME <= installed, installed


@pytest.fixture(scope="session")
def arm_python(tmp_path_factory: pytest.TempPathFactory) -> aarch64_python.Arm:
    """Debian's aarch64 CPython, unpacked, to run under qemu-aarch64 (tests/aarch64_python.py)."""
    try:
        return aarch64_python.fetch(tmp_path_factory.mktemp("arm-python"))
    except aarch64_python.Unavailable as e:
        pytest.skip(str(e))


# Run by the aarch64 CPython under qemu, in the venv the wheelhouse installed: the pack's
# kernels listed, its libraries loaded (each verified, dlopened through tvm-ffi after its
# runtime library, and registered with JAX as the FFI target a CUDA lowering calls).
ARM_LOAD = r'''
import json, platform, re
import cutecc, toy_kernels
from cutecc.runtime.library import target_name
try:
    import cutlass  # noqa: F401
    dsl = True
except ImportError:
    dsl = False
try:
    toy_kernels.load()
    no_gpu = None
except cutecc.CuteccError as e:
    no_gpu = str(e)
import jax, jax.numpy as jnp
ks = toy_kernels.load(arch="sm_90a", allow_unsigned=True)
spec = jax.ShapeDtypeStruct((256,), jnp.float32)
called, wanted = {}, {}
for b in ks.scale.builds:
    t = dict(b.call)["threads"]
    fn = jax.jit(lambda x: ks.scale(x, factor=2.0, threads=t))
    text = fn.trace(spec).lower(lowering_platforms=("cuda",)).as_text()
    called[b.variant] = sorted(set(re.findall(r"custom_call @(cutecc_[0-9a-f]+)", text)))
    wanted[b.variant] = [target_name(b.key)]
print(json.dumps({"machine": platform.machine(), "kernels": list(toy_kernels.KERNELS),
                  "variants": sorted(ks.scale.variants), "cutecc": cutecc.__file__, "dsl": dsl,
                  "no_gpu": no_gpu, "called": called, "wanted": wanted}))
'''


def test_an_aarch64_wheelhouse_installs_and_loads_under_qemu(arm_python: aarch64_python.Arm,
                                                               arm_packs: Callable[[str], dict[str, object]],
                                                               tmp_path: Path) -> None:
    """The aarch64 wheelhouse installed by Debian's aarch64 CPython under qemu-aarch64, into a
    fresh venv, with pip's `--no-index --find-links DIR` and no pip configuration: the pack's
    kernels are listed and its aarch64 libraries loaded (no GPU: lowered for CUDA), and
    `python -m cutecc --help` and the `cutecc` script run. No binfmt_misc here: the venv is
    made `--without-pip`, pip runs from its own wheel, the script through the interpreter
    (tests/aarch64_python.py); `--no-compile` spares compiling JAX's .pyc files under
    emulation (what is installed is the same)."""
    arm = arm_python
    dist = Path(str(arm_packs(arm.version)["path"])).parent
    env = aarch64_python.env()
    venv = tmp_path / "venv"
    subprocess.run(arm.run(arm.python, "-m", "venv", "--without-pip", str(venv)), check=True, env=env,
                   timeout=600)
    python = venv / "bin" / "python"
    r = subprocess.run(arm.run(python, f"{arm.pip_wheel}/pip", "install", "-q", "--no-cache-dir",
                               "--disable-pip-version-check", "--no-compile", "--no-index",
                               "--find-links", str(dist), "toy-kernels"),
                       capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run(arm.run(python, "-I", "-c", ARM_LOAD), capture_output=True, text=True, timeout=1200,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["machine"] == "aarch64", got
    assert got["kernels"] == ["scale"] and got["variants"] == ["threads=128", "threads=64"], got
    assert got["cutecc"].startswith(str(venv)) and not got["dsl"], got
    assert "no GPU is visible to JAX: pass arch=" in (got["no_gpu"] or ""), got
    assert got["called"] == got["wanted"] and len(got["called"]) == 2, got
    for cmd in (arm.run(python, "-I", "-m", "cutecc", "--help"),
                arm.run(python, "-I", str(venv / "bin" / "cutecc"), "--help")):  # the console script
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert r.returncode == 0 and "build" in r.stdout and "pack" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("args, where", [
    (("--with-jax",), "--with-jax: --with-jax and --python-version choose a wheelhouse's wheels"),
    (("--python-version", "3.12"), "--python-version: --with-jax and --python-version choose"),
    (("--wheelhouse", "--format", "tar"), "--wheelhouse: a wheelhouse is for a wheel"),
    (("--wheelhouse", "--no-runtime-wheel"), "--wheelhouse: a wheelhouse is for a wheel"),
])
def test_wheelhouse_options_out_of_place_are_refused_before_anything(tmp_path: Path, args: tuple[str, ...],
                                                                     where: str) -> None:
    r = run_cli("pack", "--lock", str(tmp_path / "kernels.lock"), "--cache-dir", str(tmp_path / "c"),
                "--name", "k", "--version", "1.0", "--out", str(tmp_path / "dist"), *args)
    assert r.returncode == 2 and where in r.stderr, r.stderr
    assert not (tmp_path / "dist").exists()


def test_a_python_version_that_is_none_is_refused_escaped(tmp_path: Path) -> None:
    r = run_cli("pack", "--lock", str(tmp_path / "kernels.lock"), "--cache-dir", str(tmp_path / "c"),
                "--name", "k", "--version", "1.0", "--out", str(tmp_path / "dist"), "--wheelhouse",
                "--python-version", "3.x\x1b")
    assert r.returncode == 2 and "--python-version: '3.x\\x1b' is not a Python version" in r.stderr, r.stderr
    assert not (tmp_path / "dist").exists()
