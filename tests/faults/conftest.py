"""Fixtures of the fault suite.

- `tally`: counts of what the suite did (processes, kills, planted damage, manifests, calls),
  written as JSON to `$CUTECC_FAULT_REPORT` at the end of the session (docs/faults.md's table).
- `SOAK` (`CUTECC_SOAK=1`): more rounds, processes and examples; `soak(default, long)` picks.
- `fake_entries(n)`: entries with real, self-consistent metadata and small fake libraries, for
  the store-level rounds (see store_worker.py).
- `toy8`: the toy project with eight variants of its kernel, built once per session
  (through tests/conftest.py's `toy_builds`).
- `in_mount_namespace`: whether this process may mount a tmpfs or a read-only bind in a
  private mount namespace (root, or CAP_SYS_ADMIN), for the full-disk and read-only cases.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import PY, Toy, write_toy_project

HERE = Path(__file__).resolve().parent
WORKER = HERE / "store_worker.py"
SOAK = os.environ.get("CUTECC_SOAK", "").strip().lower() not in ("", "0", "false", "no", "off")
# The random choices of the kill and damage rounds; a failing test prints it (captured stdout).
SEED = int(os.environ.get("CUTECC_FAULT_SEED", "0")) or random.randrange(1 << 30)
TOY_THREADS = (32, 64, 96, 128, 160, 192, 224, 256)


def soak(default: int, long: int) -> int:
    """`default` in CI, `long` under CUTECC_SOAK=1."""
    return long if SOAK else default


@dataclass
class Tally:
    """What the suite did, by section; every count is something a test asserted on."""

    sections: dict[str, Counter] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def add(self, section: str, **counts: int) -> None:
        self.sections.setdefault(section, Counter()).update(counts)

    def peak(self, section: str, name: str, value: int) -> None:
        c = self.sections.setdefault(section, Counter())
        c[name] = max(c[name], value)

    def to_json(self) -> dict[str, Any]:
        return {"format": 1, "soak": SOAK, "seed": SEED, "seconds": round(time.time() - self.started, 1),
                "sections": {k: dict(sorted(v.items())) for k, v in sorted(self.sections.items())}}


@pytest.fixture(scope="session")
def tally() -> Iterator[Tally]:
    t = Tally()
    yield t
    path = os.environ.get("CUTECC_FAULT_REPORT")
    if path:
        Path(path).write_text(json.dumps(t.to_json(), indent=1) + "\n")


@functools.lru_cache(maxsize=1)
def _toolchain() -> dict[str, str]:
    from cutecc.plan.key import toolchain

    return toolchain()


def fake_entries(n: int, tag: str = "") -> list[dict[str, Any]]:
    """`n` entries whose key is the SHA-256 of their key inputs, as a real build's are."""
    from cutecc.entry.rules import compute_key

    args = [{"kind": "tensor", "name": "x", "role": "input", "dtype": "float32", "shape": ["n"],
             "layout": "row-major", "align": 16},
            {"kind": "tensor", "name": "out", "role": "output", "dtype": "float32", "shape": ["n"],
             "layout": "row-major", "align": 16}]
    out = []
    for i in range(n):
        inputs = {"entry": "fake.mod:kernel", "source": f"{tag}{i}", "factory_args": None,
                  "args": args, "constants": {"i": i}, "arch": "sm_90a", "compile_options": "",
                  "toolchain": _toolchain()}
        out.append({"key": compute_key(inputs), "inputs": inputs, "variant": f"i={i}"})
    return out


@dataclass
class Swarm:
    """Worker processes of store_worker.py sharing one spec; started together on `go`."""

    base: Path
    spec: dict[str, Any]
    procs: list[tuple[str, subprocess.Popen, Path]] = field(default_factory=list)

    @classmethod
    def create(cls, base: Path, root: Path, entries: list[dict[str, Any]], **extra: Any) -> Swarm:
        base.mkdir(parents=True, exist_ok=True)
        spec = {"root": str(root), "entries": entries, "go": str(base / "go"),
                "stop": str(base / "stop"), "log": str(base / "log"), **extra}
        (base / "spec.json").write_text(json.dumps(spec))
        return cls(base, spec)

    def start(self, role: str, n: int = 1) -> None:
        for _ in range(n):
            out = self.base / f"out.{role}.{len(self.procs)}.json"
            p = subprocess.Popen([PY, str(WORKER), role, str(self.base / "spec.json"), str(out)],
                                 stderr=subprocess.PIPE, text=True)
            self.procs.append((role, p, out))

    def go(self, timeout: float = 300) -> None:
        """Start them all at once, when every one has imported what it needs."""
        deadline = time.monotonic() + timeout
        while len(list(self.base.glob("ready.*"))) < len(self.procs):
            dead = [p for _, p, _ in self.procs if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, [p.communicate()[1] for p in dead]
            time.sleep(0.01)
        (self.base / "go").write_text("")

    def stop(self) -> None:
        (self.base / "stop").write_text("")

    def wait(self, role: str, timeout: float = 300) -> None:
        """Wait for every process of `role`; each must exit 0."""
        deadline = time.monotonic() + timeout
        for r, p, _ in self.procs:
            if r == role:
                err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[1]
                assert p.returncode == 0, f"{role} worker failed:\n{err}"

    def results(self, timeout: float = 120) -> list[dict[str, Any]]:
        """Every process's report, after `stop`; each must exit 0."""
        for role in dict.fromkeys(r for r, _, _ in self.procs):
            self.wait(role, timeout)
        return [json.loads(out.read_text()) for _, _, out in self.procs]

    def log(self) -> list[tuple[str, str]]:
        path = Path(self.spec["log"])
        lines = path.read_text().splitlines() if path.exists() else []
        return [(w[0], w[1]) for w in (line.split() for line in lines)]


def max_overlap(results: list[dict[str, Any]]) -> int:
    """The most processes that were running at one instant (from their start/end times)."""
    events = sorted([(r["start"], 1) for r in results] + [(r["end"], -1) for r in results])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


@pytest.fixture(scope="session")
def toy8(toy_builds: Callable[..., Toy]) -> Toy:
    """The toy project with eight variants (threads=TOY_THREADS), no lock, built once."""
    return toy_builds(threads=TOY_THREADS, lock=False)


@functools.lru_cache(maxsize=1)
def in_mount_namespace() -> bool:
    """Whether `unshare -m` and a tmpfs mount work here (as root in most sandboxes)."""
    if not shutil.which("unshare") or not shutil.which("mount"):
        return False
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
                        "mount -t tmpfs -o size=64k tmpfs /tmp"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
        prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`cutecc ARGS` in a subprocess (optionally under `prefix`, e.g. setpriv)."""
    return subprocess.run([*prefix, PY, "-m", "cutecc.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_clean_failure(r: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    """Exit `code`, no traceback, and every fragment in the output."""
    out = r.stdout + r.stderr
    assert r.returncode == code, out
    assert "Traceback" not in out, out
    for f in fragments:
        assert f in out, (f, out)


# A kernel whose compile never ends (Ray failures, bounded compiles) ---------------

HANG_MODULE = '''\
import mmap
import os
import time

_marker = os.environ.get("HANG_MARKER")
if _marker:  # say that this compile started (and in which process)
    with open(_marker, "a") as f:
        f.write(f"{os.getpid()}\\n")
if os.environ.get("HANG_CHILDREN"):  # a compile that starts processes: a plain and a detached one
    import subprocess
    import sys
    _sleep = [sys.executable, "-c", "import time; time.sleep(3600)"]
    _quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    _kids = [subprocess.Popen(_sleep, **_quiet), subprocess.Popen(_sleep, start_new_session=True, **_quiet)]
    with open(os.environ["HANG_CHILDREN"], "a") as f:
        f.write("".join(f"{k.pid}\\n" for k in _kids))
if os.environ.get("HANG_MAP_BYTES"):  # a compile that asks for more memory than it may have
    _area = mmap.mmap(-1, int(os.environ["HANG_MAP_BYTES"]), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
time.sleep(float(os.environ.get("HANG_SECONDS", "3600")))
from toy.ops import scale  # noqa: E402,F401
'''

HANG_KERNEL = '''
[kernel.hang]
entry = "toy.hang:scale"
args = [
  { name = "x", dtype = "float32", shape = ["n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
constants = { threads = 32 }
'''


def write_hang_project(root: Path, threads: tuple[int, ...] = (64, 128)) -> Path:
    """The toy project plus a kernel `hang` (declared first, so it compiles first) whose
    module, imported by its compile, appends its pid to $HANG_MARKER, starts two sleeping
    processes (a plain child and a detached one, in a session of its own) and appends their
    pids to $HANG_CHILDREN if set, maps $HANG_MAP_BYTES of memory if set, then sleeps
    $HANG_SECONDS (default an hour)."""
    manifest = write_toy_project(root, threads=threads)
    (root / "toy" / "hang.py").write_text(HANG_MODULE)
    head, _, rest = manifest.read_text().partition("\n")
    manifest.write_text(head + "\n" + HANG_KERNEL + rest)
    return manifest


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...)."""
    by_parent: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            by_parent.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in by_parent.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def run_bounded(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in its own session; past `timeout` s kill its whole group and fail the test
    saying so (a build that should have stopped a compile but did not)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **env}, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        pytest.fail(f"still running after {timeout:.0f} s (killed):\n{out[-1500:]}\n{err[-1500:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)
