"""Link inputs for a platform other than the build host's, taken from pinned PyPI wheels.

An aarch64 kernel library links against the aarch64 builds of what an x86-64 one links
against: the DSL's static CUDA-dialect runtime (`nvidia-cutlass-dsl-libs-cu13`), the
static CUDA runtime (`nvidia-cuda-runtime`) and `libtvm_ffi.so` with its headers
(`apache-tvm-ffi`). cutecc pins each wheel (file name, size, SHA-256) and each file it
uses from it (SHA-256; the headers as one digest over their tree), per DSL version: those
pins are key inputs, so a key is known without fetching anything, and a file that is not
exactly the pinned one is never linked.

The wheels are fetched once by pip (`pip download`, with the pinned hash required) into
`$CUTECC_PLATFORM_LIBS` (default: `cutecc-platform-libs` in the user's cache directory),
or taken from there when already present (a host without network copies them in), and
the files used are extracted beside them. Every use checks the extracted files against
the pins again, extracting anew from the (checked) wheel when they differ.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from cutecc.errors import InputError, WorkError
from cutecc.locks import held
from cutecc.store import homes

CACHE_VAR = homes.PLATFORM_LIBS_VAR
MAX_TREE_FILES = 1000  # the header tree: ~60 files today
MAX_TREE_BYTES = 16 << 20
FETCH_TIMEOUT = 900  # seconds for pip to fetch one wheel (the DSL's is ~91 MB)


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel and the files cutecc uses from it: `files` as (role, path in the
    wheel, SHA-256), `tree` as (role, directory in the wheel, digest of `tree_digest`)."""

    project: str
    version: str
    filename: str
    sha256: str
    size: int
    files: tuple[tuple[str, str, str], ...] = ()
    tree: tuple[str, str, str] | None = None

    @property
    def tags(self) -> tuple[str, ...]:
        """The wheel's platform tags (for `pip download --platform`)."""
        return tuple(self.filename.removesuffix(".whl").split("-")[-1].split("."))


# Per platform, per nvidia-cutlass-dsl version: the wheels an aarch64 link needs. The DSL
# version must match the one that compiles (its objects call that dialect runtime).
PINNED: dict[str, dict[str, tuple[Wheel, ...]]] = {
    "aarch64": {
        "4.8.1": (
            Wheel("nvidia-cutlass-dsl-libs-cu13", "4.8.1",
                  "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_aarch64.whl",
                  "862378c0c51a3af2e053b363656501b06f9a54f777eee5be8c0046d780b66956", 90996248,
                  files=(("dialect_rt", "nvidia_cutlass_dsl/cu13/lib/libcuda_dialect_runtime_static.a",
                          "b23f920013ff1112311edc7a9f5f48f60d492483aafcea8e199c43393510716e"),)),
            Wheel("nvidia-cuda-runtime", "13.5.37",
                  "nvidia_cuda_runtime-13.5.37-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
                  "de2dc5a7367974228b0a69588a9acc9340d3768bef1bf38bf0801eb08497cd2d", 2520010,
                  files=(("cudart", "nvidia/cu13/lib/libcudart_static.a",
                          "3f360157013e4bcab6aebf29a27d282a378efe82cbcaaedf3c175c452ce34e86"),)),
            Wheel("apache-tvm-ffi", "0.1.15.post2",
                  "apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_aarch64.manylinux_2_28_aarch64.whl",
                  "5c807217f134272d6e08ffdeeb9f1b2c1f366e096712b4e47b88ee9103f80113", 3101802,
                  files=(("tvm_ffi_so", "tvm_ffi/lib/libtvm_ffi.so",
                          "c4c51b8793866b704dcefd12a2f127c691b905977962f0970a112b4df5f9ea07"),),
                  tree=("tvm_include", "tvm_ffi/include",
                        "fdd4c3bd8c86c966675fc89dc67e8136df32d760d759eb5474e7ab9298e6af57")),
        ),
    },
}


def _dsl_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def wheels(platform: str) -> tuple[Wheel, ...]:
    """The pinned wheels of `platform` for the installed DSL; an error when cutecc pins none."""
    by_version = PINNED.get(platform, {})
    version = _dsl_version()
    if version not in by_version:
        raise InputError(f"cutecc pins {platform} link inputs for nvidia-cutlass-dsl "
                         f"{', '.join(sorted(by_version)) or '(none)'}; this environment has "
                         f"{version}: build for {platform} with a pinned DSL version",
                         where="platforms")
    return by_version[version]


def pins(platform: str) -> dict[str, str]:
    """What the pins say, as key inputs: each wheel's version and SHA-256, and each used
    file's SHA-256 (or tree digest) by role."""
    out: dict[str, str] = {}
    for w in wheels(platform):
        out[w.project] = f"{w.version} sha256:{w.sha256}"
        for role, _, sha in w.files:
            out[role] = sha
        if w.tree is not None:
            out[w.tree[0]] = w.tree[2]
    return out


def tree_digest(root: Path) -> str:
    """SHA-256 over a directory tree's files: each relative path and its content's SHA-256."""
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    if len(files) > MAX_TREE_FILES:
        raise WorkError(f"{root}: more than {MAX_TREE_FILES} files", where="platforms")
    for f in files:
        rel = f.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0" + _sha(f).encode() + b"\0")
    return h.hexdigest()


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir() -> Path:
    """The platform link inputs' home (`$CUTECC_PLATFORM_LIBS`, else the user's cache
    directory: `cutecc.store.homes.platform_libs`), made if need be: a directory of this
    user's, never a link."""
    d, why = homes.make(homes.PLATFORM_LIBS)
    if d is None or why is not None:
        raise WorkError(f"{why}: not a directory of this user's", where=CACHE_VAR)
    return d


def pinned_files() -> frozenset[str]:
    """What `cache_dir()` holds that this cutecc pins (for any DSL version), as paths relative to it
    (each platform's extracted trees and the wheels): what `cutecc gc` keeps (`cutecc.store.homes.prune`)."""
    return frozenset(p for platform, by_version in PINNED.items() for ws in by_version.values()
                     for w in ws for p in (f"{platform}/{w.sha256[:16]}", f"wheels/{w.filename}"))


@functools.lru_cache(maxsize=4)
def paths(platform: str) -> dict[str, Path]:
    """The checked link inputs of `platform` by role (`dialect_rt`, `cudart`, `tvm_ffi_so`,
    `tvm_include`, and `tvm_lib`, the directory of `libtvm_ffi.so`), fetched and
    extracted first where missing, under a lock that build workers share. Checked once
    per process."""
    root = cache_dir()
    out: dict[str, Path] = {}
    for w in wheels(platform):
        where = root / platform / w.sha256[:16]
        with held(root / f".{w.sha256[:16]}.lock"):  # build workers check and extract one at a time
            if not _extracted_ok(w, where):
                _extract(w, _wheel_file(w, root), where)
                if not _extracted_ok(w, where):
                    raise WorkError(f"{w.filename}: the extracted files are not the pinned ones",
                                    where=str(where))
        for role, member, _ in w.files:
            out[role] = where / member
        if w.tree is not None:
            out[w.tree[0]] = where / w.tree[1]
    out["tvm_lib"] = out["tvm_ffi_so"].parent
    return out


def _extracted_ok(w: Wheel, where: Path) -> bool:
    try:
        if any(_sha(where / member) != sha for _, member, sha in w.files):
            return False
        return w.tree is None or tree_digest(where / w.tree[1]) == w.tree[2]
    except OSError:
        return False


def _is_pinned(path: Path, w: Wheel) -> bool:
    """Whether `path` is a regular file (not a link) with the pinned wheel's size and digest."""
    return path.is_file() and not path.is_symlink() and path.stat().st_size == w.size \
        and _sha(path) == w.sha256


def _wheel_file(w: Wheel, root: Path) -> Path:
    """The pinned wheel, checked: the cache's copy, else an older cutecc's (`homes.legacy`),
    else fetched by pip with its hash."""
    path = root / "wheels" / w.filename
    if _is_pinned(path, w):
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    older = homes.legacy().get(homes.PLATFORM_LIBS)  # an older cutecc's home: read, never changed
    if older is not None and homes.why_not_mine(older) is None \
            and _is_pinned(older / "wheels" / w.filename, w):
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            shutil.copyfile(older / "wheels" / w.filename, Path(tmp) / w.filename)
            if _is_pinned(Path(tmp) / w.filename, w):
                os.replace(Path(tmp) / w.filename, path)
                return path
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{w.project}=={w.version} --hash=sha256:{w.sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--require-hashes", "--python-version", "3.12", "--implementation", "cp",
               "--abi", "cp312", "--abi", "none", "--quiet", "-d", tmp, "-r", str(req)]
        for tag in w.tags:
            cmd += ["--platform", tag]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise WorkError(f"cannot fetch {w.filename} with pip: {e}", where="platforms") from None
        got = Path(tmp) / w.filename
        if r.returncode != 0 or not got.is_file():
            said = (r.stderr or r.stdout).strip()[-1500:]
            raise WorkError(f"pip could not fetch {w.filename} (exit {r.returncode}): {said}; "
                            f"or copy the file into {path.parent}", where="platforms")
        if got.stat().st_size != w.size or _sha(got) != w.sha256:
            raise WorkError(f"{w.filename}: fetched bytes are not the pinned ones", where="platforms")
        os.replace(got, path)
    return path


def _extract(w: Wheel, wheel: Path, where: Path) -> None:
    """Extract the used files of `wheel` into `where` (replacing it whole), bounded: only
    the pinned members, no member over the wheel's own size, no path out of the tree."""
    where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(dir=where.parent, prefix=".extract-"))
    try:
        with zipfile.ZipFile(wheel) as z:
            wanted = [m for _, m, _ in w.files]
            if w.tree is not None:
                prefix = w.tree[1].rstrip("/") + "/"
                tree = [i.filename for i in z.infolist()
                        if i.filename.startswith(prefix) and not i.is_dir()]
                if len(tree) > MAX_TREE_FILES or sum(z.getinfo(n).file_size for n in tree) > MAX_TREE_BYTES:
                    raise WorkError(f"{w.filename}: {prefix} is larger than expected", where="platforms")
                wanted += tree
            for name in wanted:
                info = z.getinfo(name)
                parts = Path(name).parts
                if Path(name).is_absolute() or ".." in parts or info.file_size > w.size * 8:
                    raise WorkError(f"{w.filename}: unsafe member {name!r}", where="platforms")
                out = tmp.joinpath(*parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        if where.exists():
            shutil.rmtree(where)
        os.replace(tmp, where)
    except KeyError as e:
        raise WorkError(f"{w.filename} lacks {e}", where="platforms") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
