"""The runtime stays thin: loading a cache and lowering a call imports no build-side module
of cutecc and nothing of the DSL. The import graph read from the source (no cycles, lazy
imports included; no import up the layers) is tests/architecture's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import PY

# Modules of cutecc that only building, planning or packing need.
BUILD_SIDE = ("cutecc.manifest", "cutecc.plan", "cutecc.build", "cutecc.commands",
              "cutecc.ship.archive",
              "cutecc.cli", "cutecc.cli.progress", "cutecc.toolchain.versions", "cutecc.tuning")
DSL = ("cutlass", "nvidia_cutlass_dsl")

SCRIPT = r'''
import sys
before = set(sys.modules)  # what the interpreter's start-up (.pth files) imported
import jax, jax.numpy as jnp
import cutecc
ks = cutecc.load(sys.argv[1], arch="sm_90a")
fn = ks.rmsnorm
b = fn.builds[0]
specs = [jax.ShapeDtypeStruct(tuple(d if isinstance(d, int) else 8 for d in t.shape), jnp.dtype(t.dtype))
         for t in b.conv.inputs]
text = jax.jit(lambda *a: fn(*a)).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
assert "custom_call @cutecc_" in text
print("\n".join(sorted(set(sys.modules) - before)))
'''


def test_load_and_lower_import_no_build_side_module_and_no_dsl(example_cache: Path) -> None:
    r = subprocess.run([PY, "-c", SCRIPT, str(example_cache)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    modules = r.stdout.split()
    assert "cutecc.runtime.loader" in modules and "cutecc.runtime.library" in modules
    build_side = [m for m in modules if m.startswith(BUILD_SIDE)]
    dsl = [m for m in modules if m.split(".")[0] in DSL or m.startswith(DSL)]
    assert build_side == [] and dsl == [], (build_side, dsl)


def test_import_cutecc_imports_neither_jax_nor_the_build_side() -> None:
    code = ("import sys; before = set(sys.modules); import cutecc; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    modules = r.stdout.split()
    assert not [m for m in modules if m.startswith(("jax", *BUILD_SIDE)) or m.split(".")[0] in DSL]
