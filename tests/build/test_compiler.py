"""The object's bytes depend on the key alone: host code pinned to baseline x86-64 whatever
the build machine's CPU, and no process detail (PID, temporary names) in them, even with
line info on (the compile-affecting variables themselves are key inputs: tests/plan/test_key.py).

`pin_host_target` relies on a DSL internal (the compiled function's `ir_module`): these
tests fail loudly if a DSL upgrade takes it away or the pin stops reaching the object.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import PY, write_toy_project

from cutecc.build import compiler

COMPILE = r'''
import json, os, sys
from pathlib import Path
from cutecc.build.compiler import CompileJob, compile_to_object, set_target
from cutecc.manifest import load_manifest

set_target("sm_90a")
m = load_manifest(sys.argv[1])
k = m.kernels[0]
out = Path(sys.argv[2])
obj = compile_to_object(CompileJob(k.entry, k.variants[0], k.compile_options,
                                   tuple(str(p) for p in m.python_path)), out)
print(json.dumps({"env": sorted(n for n in os.environ if n.startswith("CUTE_DSL_")),
                  "object": str(obj), "pid": os.getpid()}))
'''


def _compile(manifest: Path, out: Path, env: dict[str, str]) -> dict:
    out.mkdir()
    r = subprocess.run([PY, "-c", COMPILE, str(manifest), str(out)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.usefixtures("dsl")
def test_host_code_is_baseline_x86_64_and_no_process_detail_reaches_the_object(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="compiling needs the DSL")
    manifest = write_toy_project(tmp_path / "proj", threads=(64,))
    plain = _compile(manifest, tmp_path / "a", {"CUTE_DSL_LOG_LEVEL": "10"})  # not compile-affecting
    again = _compile(manifest, tmp_path / "b", {})
    assert plain["env"] == ["CUTE_DSL_ARCH", "CUTE_DSL_DISABLE_FILE_CACHING", "CUTE_DSL_LOG_LEVEL"]
    a = Path(plain["object"]).read_bytes()
    assert a == Path(again["object"]).read_bytes() and str(tmp_path).encode() not in a
    # Line info records the generated wrapper's path: one per wrapper source, never per
    # process, so a build with line info on gives the same bytes again on its host.
    lines = [_compile(manifest, tmp_path / f"l{i}", {"CUTE_DSL_LINEINFO": "1"}) for i in range(2)]
    one, two = (Path(x["object"]).read_bytes() for x in lines)
    assert lines[0]["pid"] != lines[1]["pid"] and one == two != a
    assert b"cutecc_wrapper_" in one and f"cutecc_wrapper_{lines[0]['pid']}".encode() not in one
    if shutil.which("objdump") is None:
        pytest.skip("no objdump to read the instructions with")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", plain["object"]], capture_output=True,
                         text=True, check=True).stdout
    assert "cutecc_impl" in asm
    vex = [ln for ln in asm.splitlines() if re.search(r"\tv[a-z0-9]+\s|%[yz]mm", ln)]
    assert vex == [], vex[:5]  # no AVX/AVX-512: runs on any x86-64 host


def test_the_pin_refuses_a_dsl_without_the_module_it_needs() -> None:
    pytest.importorskip("cutlass", reason="the pin uses the DSL's MLIR bindings")

    class NoModule:
        pass

    with pytest.raises(RuntimeError, match="no `ir_module`"):
        compiler.pin_host_target(NoModule())


def test_set_target_refuses_another_arch_once_the_dsl_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cutlass", object())
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    compiler.set_target("sm_90a")  # same arch: nothing to do
    with pytest.raises(RuntimeError, match="imported for sm_90a, not sm_100a"):
        compiler.set_target("sm_100a")


ENGINES = r'''
import sys
from pathlib import Path
from cutecc.build.compiler import INNER_SYMBOL, compile_variant, pin_host_target, set_target
from cutecc.manifest import load_manifest

set_target("sm_90a")
m = load_manifest(sys.argv[1])
sys.path[:0] = [str(p) for p in m.python_path]
k = m.kernels[0]
for engine in (True, False):
    compiled = compile_variant(k.entry, k.variants[0], k.compile_options, engine=engine)
    assert (getattr(compiled, "engine", None) is not None) == engine, engine
    pin_host_target(compiled)
    compiled.export_to_c(str(Path(sys.argv[2]) / f"{engine}.o"), function_name=INNER_SYMBOL)
'''


@pytest.mark.usefixtures("dsl")
@pytest.mark.parametrize("lineinfo", ["0", "1"])
def test_a_compile_without_the_jit_engine_exports_the_same_object(tmp_path: Path, lineinfo: str) -> None:
    """Workers compile without the DSL's in-process JIT engine (nothing runs the kernel
    there): the exported object is byte for byte the one a compile with it exports."""
    pytest.importorskip("cutlass", reason="compiling needs the DSL")
    manifest = write_toy_project(tmp_path / "proj", threads=(64,))
    r = subprocess.run([PY, "-c", ENGINES, str(manifest), str(tmp_path)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "CUTE_DSL_LINEINFO": lineinfo})
    assert r.returncode == 0, r.stderr[-3000:]
    with_engine, without = (tmp_path / "True.o").read_bytes(), (tmp_path / "False.o").read_bytes()
    assert with_engine == without and len(without) > 1000
