"""Child of the parity group (needs the DSL): is the GPU code in cutecc's artifacts the
code the DSL's own JIT paths produce for the same launcher?

    python -m benchmarks.paritychild CACHE_DIR

For each example variant, three cubins (the CUDA ELF images embedded in host objects):
  cutecc        from the entry's kernel.so in the cache
  dsl_direct    cute.compile(launcher, *fakes in the launcher's own order, **constants,
                options="--enable-tvm-ffi"), no cutecc wrapper, exported to an object here
  cutlass_call  what cutlass.jax.cutlass_call compiles while lowering (its
                get_or_compile_kernel result, captured), for concrete shapes
Prints one JSON object with, per variant, byte equality and the differing sections.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import peers
from benchmarks.calls import ALL, Call, chain, specs
from benchmarks.common import launcher_fake
from cutecc.contract.args import launched
from cutecc.cubin import cubins, sections


def launcher_fakes(args: tuple[Any, ...]) -> list[Any]:
    """Placeholders in the launcher's own order (same rules as cutecc's fakes)."""
    syms: dict[str, Any] = {}
    return [launcher_fake(a, syms) for a in launched(args)]


def dsl_direct(c: Call) -> bytes:
    import cutlass.cute as cute

    from cutecc.build.compiler import resolve_entry

    kernel, variant = peers.variant_of(c)
    launcher = resolve_entry(kernel.entry, variant.factory_args)
    compiled = cute.compile(launcher, *launcher_fakes(variant.args), **dict(variant.constants),
                            options="--enable-tvm-ffi")
    with tempfile.TemporaryDirectory() as d:
        compiled.export_to_c(f"{d}/k.o", function_name="k")
        return Path(f"{d}/k.o").read_bytes()


def cutlass_call_object(c: Call) -> bytes:
    import cutlass.jax.primitive as prim
    import jax

    seen: list[bytes] = []
    real = prim.get_or_compile_kernel

    def spy(*a: Any, **k: Any) -> Any:
        r = real(*a, **k)
        seen.append(r.module)
        return r

    prim.get_or_compile_kernel = spy
    try:
        jax.jit(chain((c,), [peers.cutlass_call_fn(c)])).trace(*specs((c,))).lower(
            lowering_platforms=("cuda",))
    finally:
        prim.get_or_compile_kernel = real
    return seen[-1]


def compare(a: bytes, b: bytes) -> dict[str, Any]:
    sa, sb = sections(a), sections(b)

    def by_kind(s: dict[str, bytes], prefix: str) -> list[bytes]:
        return sorted(v for k, v in s.items() if k.startswith(prefix))

    code = all(by_kind(sa, p) == by_kind(sb, p) for p in (".text.", ".nv.info.", ".nv.constant0."))
    diff = sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))
    return {"identical": a == b, "code_identical": code, "differing_sections": diff,
            "sizes": [len(a), len(b)], "kernel_names": sorted(k[6:] for k in sb if k.startswith(".text."))}


def main() -> None:
    from cutecc.store import Store

    store = Store(sys.argv[1])
    by_variant = {(e.doc["kernel"], e.doc["variant"]): e for e in store.entries()}
    out: dict[str, Any] = {}
    for c in ALL:
        vid = ",".join(f"{k}={v}" for k, v in c.params) or "default"
        e = by_variant[(c.kernel, vid)]
        ours = cubins((e.path / e.doc["library"]).read_bytes())
        direct = cubins(dsl_direct(c))
        cc = cubins(cutlass_call_object(c))
        assert len(ours) == len(direct) == len(cc) == 1, (len(ours), len(direct), len(cc))
        out[c.label] = {
            "cutecc_sha256": hashlib.sha256(ours[0]).hexdigest(),
            "dsl_direct": compare(ours[0], direct[0]),
            "cutlass_call": compare(ours[0], cc[0]),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
