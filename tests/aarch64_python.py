"""An aarch64 CPython for the tests, run under qemu-user on this x86-64 host.

Debian's arm64 packages of `python3-minimal`, `libpython3-stdlib`, `libstdc++6` and
`python3-pip-whl` (pip's own wheel), with every package they depend on, are fetched with
`apt-get download` from this host's apt sources into a private apt state (its own lists
and archive directories: no `dpkg --add-architecture`, nothing installed, no root needed)
and unpacked with `dpkg-deb -x` into one directory, ROOT.

Programs run through the unpacked aarch64 dynamic loader,
`qemu-aarch64 ROOT/lib/ld-linux-aarch64.so.1 --library-path ROOT's lib dirs PROGRAM ...`,
not through qemu's `-L ROOT`: with -L, qemu looks every absolute path up under ROOT
first, so `/` itself is ROOT there, and cutecc's checked opens (`cutecc.trust` walks from
`/` one directory at a time) find nothing. Without binfmt_misc, a process the emulated
one starts is run natively and fails (exec format error): so a venv is made with
`--without-pip` (no ensurepip subprocess), pip runs from its wheel file
(`python pip-X.whl/pip install ...`), and a console script runs through the interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("python3-minimal", "libpython3-stdlib", "libstdc++6", "python3-pip-whl")
TIMEOUT = 900


class Unavailable(Exception):
    """Why no aarch64 CPython can be had here (the tests that need one skip with it)."""


@dataclass(frozen=True)
class Arm:
    """An unpacked aarch64 CPython: `run(program, *args)` is its qemu command line."""

    root: Path
    loader: Path
    libs: tuple[Path, ...]
    python: Path
    pip_wheel: Path
    version: str  # "3.11"

    def run(self, program: str | os.PathLike[str], *args: str) -> list[str]:
        return [str(QEMU), str(self.loader), "--library-path", ":".join(map(str, self.libs)),
                str(program), *args]


QEMU = shutil.which("qemu-aarch64")


def env() -> dict[str, str]:
    """This environment less what would steer pip, Python, qemu or the aarch64 loader
    (pip.conf and PIP_* name this host's index: pip reads no configuration at all)."""
    drop = ("PIP_", "CUTECC_", "PYTHON", "QEMU_", "LD_")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, "PIP_CONFIG_FILE": os.devnull}


def fetch(dest: Path) -> Arm:
    """Fetch and unpack the aarch64 CPython into dest/root (Unavailable: why not)."""
    tools = (("qemu-aarch64 (Debian: qemu-user)", QEMU), ("apt-get", shutil.which("apt-get")),
             ("dpkg-deb", shutil.which("dpkg-deb")))
    missing = [t for t, p in tools if p is None]
    if missing:
        raise Unavailable(f"an aarch64 CPython under qemu needs {', '.join(missing)}")
    state = dest / "apt"
    for d in (state / "lists" / "partial", state / "cache" / "archives" / "partial", dest / "debs"):
        d.mkdir(parents=True, exist_ok=True)
    apt = ["-o", "APT::Architecture=arm64", "-o", "APT::Architectures::=arm64",
           "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::Cache={state / 'cache'}",
           "-o", "Dir::State::status=/dev/null", "-o", "Debug::NoLocking=1", "-qq"]
    _apt(["apt-get", *apt, "update"], dest, "apt-get update (arm64)")
    tree = _apt(["apt-cache", *apt, "depends", "--recurse", "--no-recommends", "--no-suggests",
                 "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *ROOTS], dest,
                "apt-cache depends")
    names = sorted({line for line in tree.splitlines() if line and not line.startswith((" ", "<"))})
    if not set(ROOTS) <= set(names):
        raise Unavailable(f"Debian's arm64 lists here lack {sorted(set(ROOTS) - set(names))}")
    _apt(["apt-get", *apt, "download", *names], dest / "debs", "apt-get download (arm64)")
    root = dest / "root"
    for deb in sorted((dest / "debs").glob("*.deb")):
        _apt(["dpkg-deb", "-x", str(deb), str(root)], dest, f"dpkg-deb -x {deb.name}")
    return _found(root)


def _apt(cmd: list[str], cwd: Path, what: str) -> str:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{what}: {e}") from None
    if r.returncode != 0:
        raise Unavailable(f"{what} failed (Debian's arm64 packages cannot be had here): {r.stderr[-600:]}")
    return r.stdout


def _found(root: Path) -> Arm:
    loaders = [d / "ld-linux-aarch64.so.1" for d in (root / "lib", root / "usr" / "lib")
               if (d / "ld-linux-aarch64.so.1").exists()]
    pythons = sorted(p for p in (root / "usr" / "bin").glob("python3.*")
                     if p.name[len("python3."):].isdigit())
    wheels = sorted((root / "usr" / "share" / "python-wheels").glob("pip-*.whl"))
    if not (loaders and len(pythons) == 1 and wheels):
        raise Unavailable(f"the unpacked arm64 packages in {root} lack the loader, one python3.X "
                          "or pip's wheel")
    libs = tuple(d for d in (root / "lib" / "aarch64-linux-gnu", root / "usr" / "lib" / "aarch64-linux-gnu")
                 if d.is_dir())
    return Arm(root, loaders[0], libs, pythons[0], wheels[-1], pythons[0].name[len("python"):])
