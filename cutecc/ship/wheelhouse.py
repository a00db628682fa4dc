"""A wheelhouse beside a pack: the wheels of every distribution cutecc's runtime needs, for
the deploy host's platform and Python, so that `pip install --no-index --find-links DIR NAME`
installs the pack, the runtime wheel and its dependencies on a host with no index.

The wheels come from pip (`pip download --only-binary=:all:` for the target's manylinux
platform and Python version), from whatever index pip is configured with here (its
`--index-url`, `--find-links`, `PIP_*` settings: a build host with no internet points them at
its mirror), constrained to the versions installed here where this environment has them
(the versions this build ran and its tests passed with). JAX is left out unless asked
for (`with_jax`): a deploy host has its own, built for its CUDA, and its wheels are large;
then only what the rest of the runtime needs stays (jaxlib, numpy and scipy go with JAX).

Every wheel pip wrote is read back (bounded) for its metadata; the wheelhouse holds
exactly the closure of cutecc's runtime requirements among them.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from cutecc.atomic import atomic_write
from cutecc.errors import CuteccError, WorkError
from cutecc.lock.pins import Found, installed, normalize, requirement_closure

# The glibc the deploy host has at least: jaxlib's and numpy's wheels need 2.27/2.28; cutecc's
# libraries need no more than 2.28. pip matches a `--platform` tag literally, so every tag a
# glibc 2.28 host takes is passed (the legacy aliases too).
GLIBC = 28
JAX = ("jax",)  # left out unless asked for: what the deploy host brings
MAX_WHEEL_METADATA = 1024 * 1024
MAX_WHEELS = 500
PIP_TIMEOUT = 1800.0
_PYTHON = re.compile(r"^3\.\d{1,2}$")


def pip_platforms(platform: str) -> list[str]:
    """The pip platform tags a glibc 2.28 host of platform `platform` (`x86_64`, `aarch64`) takes."""
    tags = [f"manylinux_2_{v}_{platform}" for v in range(GLIBC, 4, -1)] + [f"manylinux2014_{platform}"]
    return tags + ([f"manylinux2010_{platform}", f"manylinux1_{platform}"] if platform == "x86_64" else [])


def check_python(python: str) -> str:
    """`python` when it is a CPython version pip takes ("3.11"); bad input otherwise (exit 2)."""
    if not _PYTHON.match(python):
        raise CuteccError(f"{python!r} is not a Python version such as 3.11", where="--python-version")
    return python


def runtime_requirements(requires: list[str]) -> list[str]:
    """cutecc's own Requires-Dist lines less its extras' (what the runtime wheel requires)."""
    return [r for r in requires if "extra" not in r.partition(";")[2]]


def fill(out: Path, requires: list[str], *, platform: str, python: str, with_jax: bool) -> list[Path]:
    """Write into `out` the wheels of the closure of `requires` (cutecc's runtime
    Requires-Dist) for `platform` and CPython `python` ("3.11"); JAX's own closure only
    `with_jax`. Returns the wheels written, sorted. Fails (WorkError) naming pip's own
    last lines when pip cannot get them."""
    check_python(python)
    wanted = runtime_requirements(requires)
    skip = () if with_jax else JAX
    with tempfile.TemporaryDirectory(prefix="cutecc-wheelhouse-") as tmp:
        work = Path(tmp)
        (work / "requirements.txt").write_text("\n".join(wanted) + "\n")
        # the versions this environment runs, where it has them (jax's only when it ships)
        here = requirement_closure(wanted, installed, skip=("cutecc", *skip))
        (work / "constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in here.values()))
        dest = work / "wheels"
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
               "--only-binary=:all:", *(f"--platform={t}" for t in pip_platforms(platform)),
               "--python-version", python,
               "--implementation", "cp", "--dest", str(dest), "-r", str(work / "requirements.txt"),
               "-c", str(work / "constraints.txt")]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise WorkError(f"cannot run pip to download the runtime's dependencies: {e}",
                            where="--wheelhouse") from None
        if r.returncode != 0:
            tail = " / ".join(x.strip() for x in (r.stderr or r.stdout).splitlines()[-4:] if x.strip())
            raise WorkError(f"pip could not download the runtime's dependencies for {platform}, "
                            f"Python {python} (from the index pip is configured with here: PIP_INDEX_URL, "
                            f"PIP_FIND_LINKS): {_escaped(tail[-1200:])}", where="--wheelhouse")
        wheels = _read_wheels(dest)
        keep = requirement_closure(wanted, lambda n: wheels[n][1] if n in wheels else None, skip=skip)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name in sorted(keep):
            path = wheels[name][0]
            target = out / path.name
            atomic_write(target, path.read_bytes())
            written.append(target)
    return written


def _read_wheels(dest: Path) -> dict[str, tuple[Path, Found]]:
    """{normalized name: (wheel, (name, version, Requires-Dist))} of the wheels in `dest`."""
    out: dict[str, tuple[Path, Found]] = {}
    files = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if len(files) > MAX_WHEELS:
        raise WorkError(f"pip downloaded {len(files)} wheels, over {MAX_WHEELS}", where="--wheelhouse")
    for path in files:
        meta = _metadata(path)
        if meta is None:
            raise WorkError(f"{path.name}: not a wheel with readable metadata", where="--wheelhouse")
        out[normalize(meta[0])] = (path, meta)
    return out


def _metadata(wheel: Path) -> Found | None:
    try:
        with zipfile.ZipFile(wheel) as z:
            infos = [i for i in z.infolist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename)]
            if len(infos) != 1 or infos[0].file_size > MAX_WHEEL_METADATA:
                return None
            with z.open(infos[0]) as f:
                text = f.read(MAX_WHEEL_METADATA + 1).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile):
        return None
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    name, version = msg.get("Name"), msg.get("Version")
    if not name or not version:
        return None
    return str(name), str(version), [str(r) for r in msg.get_all("Requires-Dist") or []]


def _escaped(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
