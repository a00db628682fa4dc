"""A kernel that does not compile is reported at its own file and line (issue 47): the two
errors a newcomer met (a misspelt `cute.math` function, a store of the wrong dtype) name
`file.py:LINE` of the kernel, the DSL's frames below it counted; the whole traceback is in
`--json` and `-v`; a launcher whose stream the manifest leaves out gets a hint naming the
key to set; text from the kernel's file is escaped. Real builds through the DSL (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_cli

OPS = '''\
import cutlass
import cutlass.cute as cute


@cute.kernel
def _exp(x: cute.Tensor, out: cute.Tensor, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < n:
        out[i] = cute.math.expp(x[i])  # HOSTILE


@cute.kernel
def _widen(x: cute.Tensor, out: cute.Tensor, n: cutlass.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 128 + tidx
    if i < n:
        out[i] = x[i].to(cutlass.Float32)


@cute.jit
def misspelt(x: cute.Tensor, out: cute.Tensor, stream):
    n = x.shape[0]
    _exp(x, out, n).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)


@cute.jit
def wrong_dtype(x: cute.Tensor, out: cute.Tensor, stream):
    n = x.shape[0]
    _widen(x, out, n).launch(grid=[(n + 127) // 128, 1, 1], block=[128, 1, 1], stream=stream)
'''.replace("HOSTILE", "\x1b]0;title\x07\x1b[2J")

TENSORS = '''  {{ name = "x", dtype = "{d}", shape = ["n"] }},
  {{ name = "out", role = "output", dtype = "{d}", shape = ["n"] }},
'''
MANIFEST = f'''archs = ["sm_90a"]

[kernel.misspelt]
entry = "mykernels.ops:misspelt"
args = [
{TENSORS.format(d="float32")}  {{ kind = "stream" }},
]

[kernel.wrong_dtype]
entry = "mykernels.ops:wrong_dtype"
args = [
{TENSORS.format(d="bfloat16")}  {{ kind = "stream" }},
]

[kernel.no_stream]
entry = "mykernels.ops:wrong_dtype"
args = [
{TENSORS.format(d="bfloat16")}]
'''


def line_of(text: str) -> int:
    """The 1-based line of OPS that holds `text`."""
    return next(i for i, line in enumerate(OPS.splitlines(), 1) if text in line)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "mykernels").mkdir(parents=True)
    (root / "mykernels/__init__.py").write_text("")
    (root / "mykernels/ops.py").write_text(OPS)
    (root / "kernels.toml").write_text(MANIFEST)
    return root


@pytest.mark.usefixtures("dsl")
def test_compile_errors_name_the_kernels_file_and_line(project: Path) -> None:
    r = run_cli("build", "--json", "--no-lock", "--cache-dir", str(project / "cache"), cwd=project)
    assert r.returncode == 1, r.stderr[-3000:]
    entries = {e["kernel"]: e for e in json.loads(r.stdout)["entries"]}
    assert {e["status"] for e in entries.values()} == {"failed"}

    exp, widen = line_of("cute.math.expp"), line_of(".to(cutlass.Float32)")
    misspelt = entries["misspelt"]["error"]
    assert (f"mykernels/ops.py:{exp}: AttributeError: module 'cutlass.cute.math' has no attribute "
            "'expp'") in misspelt, misspelt
    wrong = entries["wrong_dtype"]["error"]
    assert f"mykernels/ops.py:{widen}: ValueError: Type mismatch, store Float32" in wrong, wrong
    # the kernel's own line shown, and the DSL's frames below it counted, not listed
    assert f"mykernels/ops.py:{widen}: out[i] = x[i].to(cutlass.Float32)  (+" in wrong, wrong
    assert "frames in cutlass)" in wrong and "base_dsl" not in wrong, wrong
    # the same lines on stderr, as the build prints them
    assert "FAILED misspelt" in r.stderr and f"mykernels/ops.py:{exp}: AttributeError" in r.stderr

    # the whole traceback in --json: the DSL's frames and the kernel's
    tb = entries["wrong_dtype"]["traceback"]
    assert tb.startswith("Traceback (most recent call last):"), tb[:200]
    assert "cutlass" in tb and f'ops.py", line {widen}' in tb and "Type mismatch" in tb

    # text from the kernel's file reaches the terminal escaped
    for text in (r.stdout, r.stderr):
        assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;title\\x07\\x1b[2J" in misspelt, misspelt

    stream = entries["no_stream"]["error"]
    assert "missing 1 required positional argument: 'stream'" in stream, stream
    assert 'hint: the launcher takes a stream: add { kind = "stream" } to kernel.no_stream.args' \
        in stream, stream


@pytest.mark.usefixtures("dsl")
def test_verbose_prints_the_whole_traceback(project: Path) -> None:
    r = run_cli("build", "-v", "--no-lock", "--cache-dir", str(project / "cache"), "--kernel", "wrong_dtype",
                cwd=project)
    assert r.returncode == 1, r.stderr[-3000:]
    widen = line_of(".to(cutlass.Float32)")
    assert "traceback of wrong_dtype" in r.stdout, r.stdout[-3000:]
    assert "Traceback (most recent call last):" in r.stdout and f'ops.py", line {widen}' in r.stdout
    q = run_cli("build", "--no-lock", "--cache-dir", str(project / "cache"), "--kernel", "wrong_dtype",
                cwd=project)
    assert q.returncode == 1 and "Traceback" not in q.stdout + q.stderr
    assert f"mykernels/ops.py:{widen}: ValueError" in q.stderr, q.stderr[-3000:]
