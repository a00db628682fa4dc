"""The published examples compile to their authors' own cubins: quack's RMSNorm forward and
backward built by cutecc from examples/kernels.toml are byte-identical to what quack's own
compile helpers build (`benchmarks/examples_authors.py`), on this CPU host, for sm_90a."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import PY, REPO, run_cli

KERNELS = ("quack_rmsnorm", "quack_rmsnorm_bwd")


def test_rmsnorm_forward_and_backward_are_byte_identical_to_quacks_build(
        dsl: None, examples_extra: None, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sel = [a for k in KERNELS for a in ("--kernel", k)]
    r = run_cli("build", str(REPO / "examples" / "kernels.toml"), "--cache-dir", str(cache), "--no-lock",
                *sel)
    assert r.returncode == 0, r.stderr + r.stdout
    r = subprocess.run([PY, "-m", "benchmarks.examples_authors", str(cache), *sel], capture_output=True,
                       text=True, timeout=600, cwd=REPO)
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines() if line.strip())
    want = {f"{k}[dtype={dt},d=4096]" for k in KERNELS for dt in ("bfloat16", "float32")}
    assert set(lines) == want, r.stdout + r.stderr[-3000:]
    assert all(v.strip() == "identical" for v in lines.values()), r.stdout
    assert r.returncode == 0, r.stderr[-3000:]
