"""The object's bytes depend on the key alone: host code pinned to baseline x86-64 whatever
the build machine's CPU, and the DSL's compile-affecting variables kept out of the worker.

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

from cutecc import compiler

COMPILE = r'''
import json, os, sys
from pathlib import Path
from cutecc.compiler import CompileJob, compile_to_object, set_target
from cutecc.manifest import load_manifest

set_target("sm_90a")
m = load_manifest(sys.argv[1])
k = m.kernels[0]
out = Path(sys.argv[2])
obj = compile_to_object(CompileJob(k.entry, k.variants[0], k.compile_options,
                                   tuple(str(p) for p in m.python_path)), out)
print(json.dumps({"env": sorted(n for n in os.environ if n.startswith("CUTE_DSL_")),
                  "object": str(obj)}))
'''


def _compile(manifest: Path, out: Path, env: dict[str, str]) -> dict:
    out.mkdir()
    r = subprocess.run([PY, "-c", COMPILE, str(manifest), str(out)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.slow
def test_host_code_is_baseline_x86_64_and_the_dsl_environment_is_scrubbed(tmp_path: Path) -> None:
    pytest.importorskip("cutlass", reason="compiling needs the DSL")
    manifest = write_toy_project(tmp_path / "proj", threads=(64,))
    plain = _compile(manifest, tmp_path / "a", {})
    noisy = _compile(manifest, tmp_path / "b", {"CUTE_DSL_LINEINFO": "1", "CUTE_DSL_DEBUG": "1",
                                                "CUTE_DSL_COMPILER_OPT": "0"})
    assert plain["env"] == noisy["env"] == ["CUTE_DSL_ARCH", "CUTE_DSL_DISABLE_FILE_CACHING"]
    a, b = Path(plain["object"]).read_bytes(), Path(noisy["object"]).read_bytes()
    assert a == b  # line info, debug and -O0 from the environment reach no byte
    assert str(tmp_path).encode() not in a
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
