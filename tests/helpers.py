"""Helpers shared by the tests (import them: `from helpers import ...`): the repository's
paths, a tiny real kernel project (the "toy") and its built cache, and the CLI in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cutecc.settings import BuildOptions
    from cutecc.store import Entry, Store

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable

TOY_KERNEL = '''\
import cutlass
import cutlass.cute as cute


@cute.kernel
def _scale_kernel(x: cute.Tensor, out: cute.Tensor, scale: cutlass.Float32, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        out[i] = x[i] * scale


@cute.jit
def scale(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream,
          threads: cutlass.Constexpr = 128):
    n = x.shape[0]
    _scale_kernel(x, out, factor, n).launch(
        grid=[(n + threads - 1) // threads, 1, 1], block=[threads, 1, 1], stream=stream)


@cute.jit
def broken(x: cute.Tensor, out: cute.Tensor, factor: cutlass.Float32, stream,
           threads: cutlass.Constexpr = 128):
    cute.no_such_dsl_function(x)  # exists for the planner, fails when the DSL traces it
'''


def toy_manifest(threads: tuple[int, ...] = (64, 128), kernels: tuple[str, ...] = ("scale",)) -> str:
    out = 'archs = ["sm_90a"]\n'
    for name in kernels:
        out += textwrap.dedent(f'''
        [kernel.{name}]
        entry = "toy.ops:scale"
        args = [
          {{ name = "x", dtype = "float32", shape = ["n"] }},
          {{ name = "out", role = "output", dtype = "float32", shape = ["n"] }},
          {{ kind = "scalar", name = "factor", dtype = "float32", default = 1.0 }},
          {{ kind = "stream" }},
        ]
        constants = {{ threads = "$threads" }}
        variants = {{ threads = {list(threads)} }}
        ''')
    return out


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cutecc` in a real subprocess."""
    return subprocess.run([PY, "-m", "cutecc.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


def script_json(script: str, *args: str, timeout: float = 600) -> Any:
    """Run a Python `script` in a fresh interpreter; the JSON its last line prints."""
    import json

    r = subprocess.run([PY, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def write_toy_project(root: Path, threads: tuple[int, ...] = (64, 128),
                      name: str = "kernels.toml") -> Path:
    """The toy kernel package under `root`, and a manifest `name` for `threads`."""
    pkg = root / "toy"
    if not pkg.is_dir():
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "ops.py").write_text(TOY_KERNEL)
    (root / name).write_text(toy_manifest(threads=threads))
    return root / name


@dataclass(frozen=True)
class Toy:
    """The toy project (one manifest beside its `toy` package) and a cache holding its build.

    Sources are keyed by their path relative to the manifest, so a copy keeps every key:
    tests copy a session's build (`copy`) rather than compile it again.
    """

    manifest: Path
    cache: Path

    @property
    def lock(self) -> Path:
        return self.manifest.parent / "kernels.lock"

    @property
    def store(self) -> Store:
        from cutecc.store import Store

        return Store(self.cache)

    def entries(self) -> dict[str, Entry]:
        """The cache's entries by variant id ("threads=64", ...)."""
        return {e.doc["variant"]: e for e in self.store.entries()}

    def copy(self, dest: Path, cache: str = "cache") -> Toy:
        """A private copy under `dest`: the project in dest/proj, the cache in dest/`cache`."""
        shutil.copytree(self.manifest.parent, dest / "proj")
        shutil.copytree(self.cache, dest / cache, symlinks=True)
        return Toy(dest / "proj" / self.manifest.name, dest / cache)


def opts(**flags: Any) -> BuildOptions:
    """What a build is told, as the command line tells it: these flags (`cache_dir=`,
    `jobs=`, `executor=`, ...), else the environment (`BuildOptions.from_environment`)."""
    from cutecc.settings import BuildOptions

    return BuildOptions.from_environment(**flags)


def build_toy(base: Path, threads: tuple[int, ...] = (64, 128), archs: tuple[str, ...] | None = None,
              lock: bool = True) -> Toy:
    """Write the toy project under base/proj and build it (all of `archs`, else the
    manifest's sm_90a) into base/cache, checking that every variant was built (and, with
    `lock`, that the build wrote the project's kernels.lock)."""
    from cutecc.commands.build import build

    manifest = write_toy_project(base / "proj", threads=threads)
    report = build(manifest, opts(cache_dir=base / "cache", jobs=2), archs=archs or (), lock=lock)
    assert report.ok and report.count("built") == len(threads) * len(archs or ("sm_90a",)), \
        report.warnings()
    if lock:
        assert report.lock_file == manifest.parent / "kernels.lock" and report.lock_changed
    return Toy(manifest, base / "cache")


FALLBACK_MANIFEST = """\
archs = {archs}

[kernel.scale]
entry = "toyfb.ops:scale"
args = [
  {{ name = "x", dtype = "float32", shape = ["m", "$d"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["m", "$d"] }},
  {{ kind = "scalar", name = "factor", dtype = "float32", default = 1.0 }},
  {{ kind = "stream" }},
]
variants = {{ d = {ds} }}
{fallback}

[kernel.plain]
entry = "toyfb.ops:scale"
args = [
  {{ name = "x", dtype = "float32", shape = ["m", "$d"] }},
  {{ name = "out", role = "output", dtype = "float32", shape = ["m", "$d"] }},
  {{ kind = "scalar", name = "factor", dtype = "float32", default = 1.0 }},
  {{ kind = "stream" }},
]
variants = {{ d = [64] }}
"""

FALLBACK = '''\
import jax.numpy as jnp


def scale(x, *, factor=1.0):
    """The kernel's calling convention: arrays positionally, scalars by keyword."""
    return jnp.sin(x) * factor
'''


FALLBACK_TORCH = '''\
import torch


def scale(x, *, factor=1.0):
    return torch.sin(x) * factor
'''


def fallback_manifest(ds: list[int] = [64], archs: list[str] = ["sm_90a"],  # noqa: B006
                      fallback: str | None = "toyfb.ref:scale", fallback_torch: str | None = None) -> str:
    lines = [f'{k} = "{v}"' for k, v in (("fallback", fallback), ("fallback_torch", fallback_torch)) if v]
    return FALLBACK_MANIFEST.format(ds=ds, archs=json.dumps(archs), fallback="\n".join(lines))


def write_fallback_project(root: Path) -> Path:
    """A project under `root` whose kernel `scale` declares the fallback `toyfb.ref:scale`
    (and `plain` none); its kernels are stand-ins for `fake_compile`. Returns its manifest."""
    pkg = root / "toyfb"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text("def scale(x, out, factor, stream, threads=128):\n    pass\n")
    (pkg / "ref.py").write_text(FALLBACK)
    (pkg / "ref_torch.py").write_text(FALLBACK_TORCH)
    (root / "kernels.toml").write_text(fallback_manifest())
    return root / "kernels.toml"


FAKE_PTX_ISA = "9.4"  # the PTX ISA of fake_compile's `compute_` libraries (nvidia-cutlass-dsl 4.8.1's)


def fake_compile(jobs: list[Any], store_root: Path, workers: int, on_result: Any) -> None:
    """Publish each job as a build worker would, with a stand-in library (no DSL)."""
    from meta_records import entry_record

    from cutecc.build.workers import Result
    from cutecc.contract.args import args_to_json
    from cutecc.store import Store
    from cutecc.units import now_iso

    store = Store(store_root)
    for job in jobs:
        rt = store.get_runtime(job.key_inputs["toolchain"]["runtime"])  # the build linked it first
        assert rt is not None
        lib = rt.doc["library"]
        runtime = {"key": rt.key, "library": lib, **rt.doc["files"][lib]}

        def produce(staging: Path, job: Any = job, runtime: dict = runtime) -> Any:
            ptx = job.arch.startswith("compute_")  # PTX as the DSL 4.8.1 writes it: ISA 9.4
            sm = job.arch.removeprefix("compute_")
            (staging / "kernel.so").write_bytes(job.key.encode() + (
                f"\n.version {FAKE_PTX_ISA}\n.target sm_{sm}\n".encode() if ptx else b""))
            isa = {"ptx_isa": FAKE_PTX_ISA} if ptx else {}
            return entry_record({
                "kernel": job.kernel, "variant": job.variant.id, "params": dict(job.variant.params),
                "arch": job.arch, "entry": job.entry, "args": args_to_json(job.variant.args),
                "backward": job.backward, "library": "kernel.so", "symbol": "cutecc_kernel",
                "runtime": runtime, "platform": job.platform, "key": job.key,
                "toolchain": job.key_inputs["toolchain"], "key_inputs": job.key_inputs,
                "sources": list(job.sources), "built_at": now_iso(), "build_seconds": 0.0, **isa})

        entry, _ = store.publish(job.key, produce)
        on_result(job, Result("built", 0.0, None, entry.meta))


def planted_cubin(sm: int, abi: int = 8, extra_flags: int = 0) -> bytes:
    """A minimal well-formed EM_CUDA ELF image recording `sm` as CUDA ELF ABI `abi` does:
    ABI 7 in e_flags' low byte, ABI 8 in its second byte."""
    head = bytearray(b"\x7fELF" + bytes(60))
    head[4], head[5], head[8] = 2, 1, abi  # ELF64, little-endian, EI_ABIVERSION
    head[18:20] = (190).to_bytes(2, "little")  # EM_CUDA
    flags = (sm if abi == 7 else sm << 8) | extra_flags
    head[0x30:0x34] = flags.to_bytes(4, "little")
    head[0x28:0x30] = (64).to_bytes(8, "little")  # one (null) section header right after
    head[0x3A:0x3C] = (0x40).to_bytes(2, "little")
    head[0x3C:0x3E] = (1).to_bytes(2, "little")
    return bytes(head) + bytes(64)


def unbuilt_kernels(manifest: Path, grads: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every kernel of `manifest` as the JAX runtime sees it, each variant's contract under a
    made-up key with nothing built behind it: calls trace and lower (to a custom call named
    `cutecc_<kernel>_<key prefix>`, see `unbuilt_target`) but never run. `grads` replaces a
    kernel's pairing by what an entry records (e.g. one built before a manifest rule)."""
    import hashlib

    from cutecc.manifest import load_manifest
    from cutecc.runtime.dispatch import Build, KernelFn

    class Unbuilt(Build):
        def register(self, kernel: str) -> str:
            return unbuilt_target(kernel, self.key)

    owner: dict[str, Any] = {}
    for k in load_manifest(manifest).kernels:
        builds = [Unbuilt(hashlib.sha256(f"{k.name}/{v.id}".encode()).hexdigest(), v.id, "sm_90a", v.args,
                          v.convention, manifest.parent / "none.so", "0" * 64, 0, "f", call=v.call)
                  for v in k.variants]
        pairing = (grads or {}).get(k.name, k.grad)
        owner[k.name] = KernelFn(k.name, builds, backward=k.backward, owner=owner, grad=pairing,
                                 arch="sm_90a")
    return owner


def unbuilt_target(kernel: str, key: str) -> str:
    """The FFI target an `unbuilt_kernels` build lowers to."""
    return f"cutecc_{kernel}_{key[:8]}"


def resident_services(run_dir: Path) -> list[int]:
    """The live resident compile services (cutecc/build/executors/service_process.py, started
    with the argument `resident`) started with `run_dir` as their $XDG_RUNTIME_DIR (not their
    forked workers, which are their children)."""
    marker, needle = b"cutecc.build.executors.service_process", f"XDG_RUNTIME_DIR={run_dir}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes()
            state, parent = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            pcmd = Path(f"/proc/{parent}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if marker in cmd and cmd.split(b"\0")[-2:-1] == [b"resident"] and needle in env.split(b"\0") \
                and state != "Z" and marker not in pcmd:
            out.append(int(d.name))
    return out


def stop_resident_services(run_dir: Path) -> None:
    """SIGKILL the resident services of `run_dir` (`resident_services`) and their workers."""
    import signal

    for pid in resident_services(run_dir):
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                        os.kill(int(d.name), signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
