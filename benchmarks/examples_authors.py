"""The published examples (examples/kernels.toml) compiled through their authors' own compile
paths, and their cubins compared byte for byte with cutecc's entries.

    python -m benchmarks.examples_authors EXAMPLES_CACHE [--manifest examples/kernels.toml] [--out DIR]

For each sm_90a entry of EXAMPLES_CACHE that is a declared variant, builds what the kernel's
library compiles for the same call: quack's `_compile_rmsnorm_fwd` / `_compile_rmsnorm_bwd` /
`CrossEntropy.compile` / `CrossEntropyBackward.compile` (their `jit_cache` left out: the
function it wraps), and for flash-attn-4 the fake tensors its interface builds for sm_90 at
head_dim 128 (`AUTHORS` says which). Prints per entry whether the embedded cubins are
identical; exits 1 if any differs. With --out, writes each authors' object there as
`<kernel>.<variant>.o` (exported as `direct`), for `benchmarks.examples_parity build --authors`.
Needs the build extra and the examples extra; no GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARCH = "sm_90a"


def _dtype(v: Any) -> Any:
    import cutlass

    from cutecc.contract import dtypes

    return getattr(cutlass, dtypes.DTYPES[dict(v.params)["dtype"]].cutlass)


def _rmsnorm_fwd(v: Any) -> Any:
    """quack's `rmsnorm_fwd` for a weight, no bias or residual, rstd kept (what its autograd
    forward saves): out and weight in x's dtype."""
    from quack.rmsnorm import _compile_rmsnorm_fwd

    dt, n = _dtype(v), dict(v.params)["d"]
    return _compile_rmsnorm_fwd.__wrapped__(dt, dt, None, dt, None, None, n, True, False, False, False)


def _rmsnorm_bwd(v: Any) -> Any:
    """quack's `_rmsnorm_bwd` with a weight (dw partials), no bias, residual or per-head
    weight; T_hint 0 (torch.compile's; Hopper's heuristic reads no T_hint)."""
    from quack.rmsnorm import _compile_rmsnorm_bwd

    dt, n = _dtype(v), dict(v.params)["d"]
    return _compile_rmsnorm_bwd.__wrapped__(n, dt, dt, dt, dt, False, None, None, True)


def _cross_entropy(v: Any) -> Any:
    """quack's `cross_entropy_fwd_out` with int32 targets, lse kept, no dx, weight or target logit."""
    import cutlass
    from quack.cross_entropy import CrossEntropy

    return CrossEntropy.compile.__wrapped__(_dtype(v), cutlass.Int32, None, dict(v.params)["vocab"],
                                            True, False, None, None)


def _cross_entropy_bwd(v: Any) -> Any:
    """quack's `_cross_entropy_backward` with int32 targets and no class weight (dloss of any
    stride: the dense and the broadcast contract are one build)."""
    import cutlass
    from quack.cross_entropy import CrossEntropyBackward

    return CrossEntropyBackward.compile.__wrapped__(_dtype(v), cutlass.Int32, dict(v.params)["vocab"], None)


FA4_SIZES = {"b": 4, "s": 4096, "h": 16}  # benchmarks/examples_parity.py's; FA4's fakes are all dynamic
_fa4_builds: dict[tuple[str, bool, int], dict[str, Any]] = {}


def _fa4_interface(which: str, causal: bool, d: int) -> dict[str, Any]:
    """What FA4's interface compiles for sm_90 (`_flash_attn_fwd` or `_flash_attn_bwd`, as
    its autograd function calls them) when called on torch fake tensors (FlashAttention's
    own way to compile ahead of time, `flash_attn.cute.testing.maybe_fake_tensor_mode`),
    with torch's device queries answered from the manifest's profile as cutecc's build
    workers answer them. Per cache of the interface (`fwd`, `bwd_pre`, `bwd`, `bwd_post`),
    the function compiled."""
    key = (which, causal, d)
    if key in _fa4_builds:
        return _fa4_builds[key]
    import torch
    from flash_attn.cute import interface as fi
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cutecc.toolchain import devicequery

    caches = {"fwd": fi._flash_attn_fwd, "bwd_pre": fi._bwd_preprocess, "bwd": fi._flash_attn_bwd,
              "bwd_post": fi._bwd_postprocess_convert}
    for f in caches.values():
        f.compile_cache.clear()
    b, s, h = FA4_SIZES["b"], FA4_SIZES["s"], FA4_SIZES["h"]
    with devicequery.answering(_DEVICE), FakeTensorMode():
        q, k, v, out, dout = (torch.empty(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(5))
        lse = torch.empty(b, h, s, dtype=torch.float32, device="cuda")
        scale = 1 / math.sqrt(d)
        if which == "fwd":
            fi._flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
        else:
            fi._flash_attn_bwd(q, k, v, out, dout, lse, softmax_scale=scale, causal=causal)
    got = {}
    for name, f in caches.items():
        fns = list(f.compile_cache.cache.values())
        if fns:
            assert len(fns) == 1, f"FA4's {name} cache holds {len(fns)} functions, not one"
            got[name] = fns[0]
    _fa4_builds[key] = got
    return got


def _fa4(which: str, cache: str) -> Callable[[Any], Any]:
    def build(v: Any) -> Any:
        p = dict(v.params)
        return _fa4_interface(which, bool(p["causal"]), int(p["d"]))[cache]
    return build


# kernel name -> how its library compiles the same call
AUTHORS: dict[str, Callable[[Any], Any]] = {
    "quack_rmsnorm": _rmsnorm_fwd,
    "quack_rmsnorm_bwd": _rmsnorm_bwd,
    "quack_cross_entropy": _cross_entropy,
    "quack_cross_entropy_bwd": _cross_entropy_bwd,
    "quack_cross_entropy_bwd_bcast": _cross_entropy_bwd,
    "fa4_fwd": _fa4("fwd", "fwd"),
    "fa4_bwd_pre": _fa4("bwd", "bwd_pre"),
    "fa4_bwd_main": _fa4("bwd", "bwd"),
    "fa4_bwd_post": _fa4("bwd", "bwd_post"),
}
_DEVICE: dict[str, Any] | None = None  # torch's device answers for the manifest's profile (`setup`)


def setup(manifest_path: Path) -> Any:
    """Load the manifest and prepare this process as a build worker for sm_90a would be (the
    target arch and the manifest's [env] before the DSL or any library is imported)."""
    os.environ.setdefault("CUTE_DSL_DISABLE_FILE_CACHING", "1")
    from cutecc.manifest import load_manifest

    global _DEVICE
    from cutecc.toolchain import devicequery

    manifest = load_manifest(manifest_path)
    k = manifest.kernels[0]  # every kernel of the examples builds for one profile
    _DEVICE = devicequery.answers(dict(k.hardware), ARCH, k.profile)
    os.environ["CUTE_DSL_ARCH"] = ARCH
    os.environ.update(manifest.env_for(ARCH))
    for p in reversed(manifest.python_path):
        sys.path.insert(0, str(p))
    return manifest


def authors_compile(kernel: str, variant: Any) -> Any:
    """The authors' build of `variant` of `kernel` (a TVM-FFI compiled function)."""
    return AUTHORS[kernel](variant)


def authors_cubins(kernel: str, variant: Any, obj: Path | None = None) -> list[bytes]:
    """The cubins of the authors' build of `variant` of `kernel` (exported to `obj` if given)."""
    from cutecc.cubin import cubins

    compiled = authors_compile(kernel, variant)
    with tempfile.TemporaryDirectory() as d:
        path = obj or Path(d) / "k.o"
        compiled.export_to_c(str(path), function_name="direct")
        return cubins(path.read_bytes())


def compare(cache: Path, manifest_path: Path, out: Path | None = None,
            kernels: set[str] | None = None) -> dict[str, bool | None]:
    """Per sm_90a entry of `cache` (declared variants): True when its cubins are the
    authors' byte for byte, False when not, None when no authors' build is known."""
    from cutecc.cubin import cubins
    from cutecc.store import Store

    manifest = setup(manifest_path)
    res: dict[str, bool | None] = {}
    newest: dict[tuple[str, str], Any] = {}  # an older build of a variant is left out, as `cutecc.load` does
    for e in Store(cache).entries():
        at = (e.doc["kernel"], e.doc["variant"])
        if e.doc["arch"] == ARCH and (at not in newest or
                                       e.doc.get("built_at", "") > newest[at].doc.get("built_at", "")):
            newest[at] = e
    for _, e in sorted(newest.items()):
        name = e.doc["kernel"]
        if kernels is not None and name not in kernels:
            continue
        v = next((x for x in manifest.kernel(name).variants if x.id == e.doc["variant"]), None)
        if v is None:  # a tuning candidate
            continue
        lab = f"{name}[{v.id}]"
        if name not in AUTHORS:
            res[lab] = None
            continue
        obj = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            obj = out / (re.sub(r"[^A-Za-z0-9_.-]", "_", f"{name}.{v.id}") + ".o")
        theirs = authors_cubins(name, v, obj)
        ours = cubins((e.path / e.doc["library"]).read_bytes())
        res[lab] = bool(ours) and ours == theirs
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("--manifest", type=Path,
                    default=Path(__file__).resolve().parents[1] / "examples/kernels.toml")
    ap.add_argument("--out", type=Path, help="write the authors' objects here")
    ap.add_argument("--kernel", action="append", help="only these kernels (repeatable)")
    a = ap.parse_args()
    res = compare(a.cache, a.manifest, a.out, set(a.kernel) if a.kernel else None)
    for lab, same in res.items():
        print(f"{lab:62} {'identical' if same else 'DIFFERENT' if same is False else 'no authors build'}")
    return 0 if all(res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
