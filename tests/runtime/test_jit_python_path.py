"""A just-in-time build compiles what `cutecc build` keys: the manifest's python_path comes
first on the worker's `sys.path` even where the calling script already has it further back,
so a same-named module beside the script is never compiled (`cutecc.build.compiler.front`),
and the build goes through the same read-set check (`cutecc.build.read_set`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import PY, REPO, TOY_KERNEL, opts

from cutecc.commands.build import build
from cutecc.store import Store

pytest.importorskip("ziglang", reason="building needs the build extra (zig links the runtime library)")

MANIFEST = """\
archs = ["sm_90a"]

[kernel.scale]
entry = "toy.ops:scale"
args = [
  { name = "x", dtype = "float32", shape = ["$n"] },
  { name = "out", role = "output", dtype = "float32", shape = ["$n"] },
  { kind = "scalar", name = "factor", dtype = "float32", default = 1.0 },
  { kind = "stream" },
]
variants = { n = [NS] }
"""


def _libraries(cache: Path) -> dict[str, str]:
    return {e.key: hashlib.sha256((e.path / e.doc["library"]).read_bytes()).hexdigest()
            for e in Store(cache).entries()}


def test_a_jit_build_compiles_the_projects_module_not_the_scripts_same_named_one(
        dsl: None, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "toy").mkdir(parents=True)
    (proj / "toy" / "__init__.py").write_text("")
    (proj / "toy" / "ops.py").write_text(
        TOY_KERNEL.replace("import cutlass\n", "import cutlass\nfrom helper import THREADS\n", 1)
        .replace("threads: cutlass.Constexpr = 128", "threads: cutlass.Constexpr = THREADS", 1))
    (proj / "helper.py").write_text("THREADS = 64\n")
    manifest = proj / "kernels.toml"
    manifest.write_text(MANIFEST.replace("NS", "64"))
    cache = tmp_path / "cache"
    assert build(manifest, opts(cache_dir=cache)).ok
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "helper.py").write_text("THREADS = 128\n")  # the script's own helper, same name
    (scripts / "run.py").write_text(textwrap.dedent(f"""
        import json, sys, warnings
        sys.path.append({str(proj)!r})  # the project root on the path, behind the script's directory
        if __name__ == "__main__":
            import jax, jax.numpy as jnp
            import cutecc
            ks = cutecc.load({str(cache)!r}, arch="sm_90a", jit=True, manifest={str(manifest)!r})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                jax.jit(lambda x: ks.scale(x)).trace(jax.ShapeDtypeStruct((32,), jnp.float32)).lower(
                    lowering_platforms=("cuda",))
            print(json.dumps([b.key for b in ks.scale.builds if b.variant == "n=32"]))
    """))
    r = subprocess.run([PY, str(scripts / "run.py")], capture_output=True, text=True, timeout=600,
                       cwd=scripts, env={**os.environ, "PYTHONPATH": str(REPO), "CUTECC_SERVICE_IDLE": "0"})
    assert r.returncode == 0, r.stderr[-3000:]
    [key] = json.loads(r.stdout.strip().splitlines()[-1])
    # `cutecc build` of the manifest declaring that variant plans the same key and finds it cached
    manifest.write_text(MANIFEST.replace("NS", "64, 32"))
    again = build(manifest, opts(cache_dir=cache))
    assert again.ok and again.count("built") == 0, [(o.planned.label, o.status) for o in again.outcomes]
    assert key in {o.planned.key for o in again.outcomes}
    # and a fresh build of it gives the same bytes: the project's helper (64 threads) was compiled
    fresh = tmp_path / "fresh"
    assert build(manifest, opts(cache_dir=fresh)).ok
    assert _libraries(fresh)[key] == _libraries(cache)[key]
