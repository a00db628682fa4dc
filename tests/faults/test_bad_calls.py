"""Bad calls at run time (CPU, the repository's example cache): each is a Python exception
whose message says what was expected.

tests/runtime/test_dispatch.py pins single cases; here hypothesis generates calls (counts,
dtypes, ranks, extents, near misses of each built contract) and an independent reading of
the entries' contracts predicts which variant must be chosen, or that none fits and why.
Also: runtime scalars of the wrong type or out of range, arrays on the CPU or spread over
devices, a GPU arch the cache has no build for, and what JAX guarantees about layout and
alignment (non-contiguous and misaligned NumPy views become dense row-major buffers; the
contracts' `align` is within what XLA guarantees).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutecc
from cutecc.archs import to_build as arch_to_build
from cutecc.errors import CuteccError
from cutecc.store import Store

from .conftest import soak

DTYPES = ["float32", "float16", "bfloat16", "int32", "int8", "uint8", "bool", "float64", "int64"]
SETTINGS = settings(max_examples=soak(60, 600), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def ks(example_cache: Path):
    return cutecc.load(example_cache, arch="sm_90a")


@pytest.fixture(scope="module")
def contracts(example_cache: Path) -> dict[str, list[dict[str, Any]]]:
    """Each kernel's built variants as the entries' meta.json states them (not via cutecc's
    contract classes): variant id and the inputs (tensors of role input/inout, flattened)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in Store(example_cache).entries():
        def leaves(args: list[dict]) -> list[dict]:
            return [x for a in args for x in (leaves(a["items"]) if a["kind"] == "tuple" else [a])]
        ins = [a for a in leaves(e.doc["args"]) if a["kind"] == "tensor" and a["role"] != "output"]
        outs = [a for a in leaves(e.doc["args"]) if a["kind"] == "tensor" and a["role"] != "input"]
        out.setdefault(e.doc["kernel"], []).append(
            {"variant": e.doc["variant"], "inputs": ins, "results": outs})
    return out


def _why_not(c: dict[str, Any], specs: list[jax.ShapeDtypeStruct]) -> tuple[str | None, dict]:
    """(None, bindings) if `specs` fit contract `c`, else (the first misfit's category, {})."""
    if len(specs) != len(c["inputs"]):
        return "count", {}
    env: dict[str, int] = {}
    for t, s in zip(c["inputs"], specs):
        if jnp.dtype(s.dtype).name != t["dtype"]:
            return "dtype", {}
        if len(s.shape) != len(t["shape"]):
            return "rank", {}
        for d, n in zip(t["shape"], s.shape):
            if n == 0:
                return "empty", {}
            if isinstance(d, int) and n != d:
                return "extent", {}
            if isinstance(d, str) and env.setdefault(d, n) != n:
                return "symbol", {}
    return None, env


PHRASE = {"count": r"takes \d+ array\(s\), got \d+", "dtype": r"dtype \w+, expected \w+",
          "rank": r"rank \d+, expected \d+", "empty": r"dimension \d+ is empty",
          "extent": r"dimension \d+ is \d+, expected \d+",
          "symbol": r'dimension \d+ is \d+, but "\w+" is \d+ from an earlier argument'}


@st.composite
def calls(draw: st.DrawFn, contracts: dict[str, list[dict[str, Any]]]) -> tuple[str, list]:
    """A kernel and argument specs: random, or a built contract's exact fit, perturbed or not."""
    name = draw(st.sampled_from(sorted(contracts)))
    dims = st.one_of(st.integers(1, 70), st.sampled_from([0, 1024, 4096, 512]))
    if draw(st.booleans()):
        n = draw(st.integers(0, 4))
        specs = [jax.ShapeDtypeStruct(tuple(draw(st.lists(dims, max_size=3))),
                                      jnp.dtype(draw(st.sampled_from(DTYPES)))) for _ in range(n)]
        return name, specs
    c = draw(st.sampled_from(contracts[name]))
    env = {s: draw(st.integers(1, 64)) for t in c["inputs"] for s in t["shape"] if isinstance(s, str)}
    shapes = [[d if isinstance(d, int) else env[d] for d in t["shape"]] for t in c["inputs"]]
    types = [t["dtype"] for t in c["inputs"]]
    how = draw(st.sampled_from(["exact"] * 3 + ["dtype", "rank", "extent", "count", "empty"]))
    i = draw(st.integers(0, len(shapes) - 1))
    if how == "dtype":
        types[i] = draw(st.sampled_from([d for d in DTYPES if d != types[i]]))
    elif how == "rank":
        shapes[i] = shapes[i] + [draw(st.integers(1, 8))] if draw(st.booleans()) or not shapes[i] \
            else shapes[i][:-1]
    elif how == "extent":
        j = draw(st.integers(0, len(shapes[i]) - 1))
        shapes[i][j] = draw(st.integers(1, 5000).filter(lambda v, old=shapes[i][j]: v != old))
    elif how == "empty":
        shapes[i][draw(st.integers(0, len(shapes[i]) - 1))] = 0
    specs = [jax.ShapeDtypeStruct(tuple(s), jnp.dtype(t)) for s, t in zip(shapes, types)]
    if how == "count":
        specs = specs[:-1] if draw(st.booleans()) else [*specs, specs[0]]
    return name, specs


@pytest.mark.usefixtures("dsl")
def test_generated_calls_pick_the_predicted_variant_or_say_what_was_expected(ks, contracts,
                                                                              tally) -> None:
    accepted = rejected = 0

    @SETTINGS
    @given(call=calls(contracts))
    def check(call: tuple[str, list]) -> None:
        nonlocal accepted, rejected
        name, specs = call
        verdicts = [(c, *_why_not(c, specs)) for c in contracts[name]]
        fits = [(c, env) for c, why, env in verdicts if why is None]
        if fits:
            b, env = ks[name].select(*specs)
            static = {c["variant"]: sum(isinstance(d, int) for t in c["inputs"] for d in t["shape"])
                      for c, _ in fits}
            assert b.variant in static and static[b.variant] == max(static.values())
            chosen = next(c for c, _ in fits if c["variant"] == b.variant)
            out = jax.eval_shape(lambda *a: ks[name](*a), *specs)
            out = out if isinstance(out, tuple) else (out,)
            bound = dict(next(e for c, e in fits if c is chosen))
            assert [(o.shape, jnp.dtype(o.dtype).name) for o in out] == [
                (tuple(d if isinstance(d, int) else bound[d] for d in t["shape"]), t["dtype"])
                for t in chosen["results"]]
            accepted += 1
            return
        with pytest.raises(CuteccError) as err:
            ks[name].select(*specs)
        msg = str(err.value)
        assert err.value.exit_code == 1 and f'kernel "{name}"' in msg
        assert "no built variant matches the call" in msg and "cutecc build" in msg
        for c, why, _ in verdicts:  # one line per built variant, saying what it expected
            line = next(ln for ln in msg.splitlines() if ln.strip().startswith(c["variant"] + "("))
            assert re.search(PHRASE[why], line), (why, line)
        rejected += 1

    check()
    assert accepted and rejected
    tally.add("calls", generated=accepted + rejected, accepted_as_predicted=accepted,
              rejected_as_predicted=rejected)


@pytest.mark.usefixtures("dsl")
@pytest.mark.parametrize(("value", "fragment"), [
    ("1e-5", "must be a number: got str '1e-5'"),
    ([1e-5], "must be a number: got list"),
    (None, "missing runtime scalar 'eps'"),
    (True, "must be a number: got bool True"),
    (1e40, "1e+40 is out of range for float32"),
    (complex(1, 2), "must be a number: got complex"),
    (np.float64(1e-5), None),
    (np.array(1e-5, np.float32), None),
    (2, None),
])
def test_runtime_scalars_are_checked_not_coerced(ks, value: Any, fragment: str | None,
                                                 tally) -> None:
    x, w = jax.ShapeDtypeStruct((2, 1024), jnp.float32), jax.ShapeDtypeStruct((1024,), jnp.float32)
    f = jax.jit(lambda x, w: ks.rmsnorm(x, w, eps=value))
    if fragment is None:
        text = f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
        assert "custom_call @cutecc_" in text
        return
    with pytest.raises(CuteccError) as err:
        f.trace(x, w)
    assert fragment in str(err.value) and 'kernel "rmsnorm"' in str(err.value)
    tally.add("calls", bad_scalars_refused=1)


@pytest.mark.usefixtures("dsl")
def test_an_eager_call_on_the_cpu_says_the_kernel_needs_a_cuda_gpu(ks, tally) -> None:
    if jax.default_backend() != "cpu":
        pytest.skip("checks the CPU-only message")
    a = jnp.arange(8, dtype=jnp.float32)
    with pytest.raises(NotImplementedError, match="cutecc kernel 'mul' runs on CUDA GPUs only; "
                                                  "this computation is being lowered for cpu"):
        ks.mul(a, a)
    with pytest.raises(NotImplementedError, match="runs on CUDA GPUs only"):
        jax.jit(ks.axpy)(a, a)
    tally.add("calls", wrong_device_refused=2)


MULTI = r'''
import json, sys, jax, jax.numpy as jnp, numpy as np
import cutecc
from jax.sharding import Mesh, PartitionSpec as P
ks = cutecc.load(sys.argv[1], arch="sm_90a")
d0, d1 = jax.devices()[:2]
x0 = jax.device_put(jnp.ones(8, jnp.float32), d0)
x1 = jax.device_put(jnp.ones(8, jnp.float32), d1)
out = {}
both = jax.device_put(jnp.ones(16, jnp.float32),
                      jax.sharding.NamedSharding(Mesh(np.array([d0, d1]), ("d",)), P("d")))
for case, f in {"spread": lambda: ks.mul(x0, x1),
                "one_device": lambda: ks.mul(x1, x1),
                "spanning": lambda: ks.mul(both, both),
                "inside_shard_map": lambda: jax.jit(jax.shard_map(
                    ks.mul, mesh=Mesh(np.array([d0, d1]), ("d",)), in_specs=(P("d"), P("d")),
                    out_specs=P("d")))(jnp.ones(16, jnp.float32), jnp.ones(16, jnp.float32))}.items():
    try:
        f()
        out[case] = "ran"
    except Exception as e:
        out[case] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
'''


@pytest.mark.usefixtures("dsl")
def test_arrays_on_several_devices_are_refused_and_one_device_is_accepted(example_cache: Path,
                                                                          tally) -> None:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([PY, "-c", MULTI, str(example_cache)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["spread"].startswith("CallError") and "committed to different devices (device 0, device 1)" \
        in out["spread"]
    assert out["spanning"].startswith("CallError") and "computation over 2 devices" in out["spanning"] \
        and "jax.shard_map" in out["spanning"] and "jax.device_put" in out["spanning"]
    # On one device of two, and inside shard_map, the placement is accepted; what stops
    # them is the CPU, said plainly.
    for case in ("one_device", "inside_shard_map"):
        assert out[case].startswith("NotImplementedError") and "CUDA GPUs only" in out[case], out
    tally.add("calls", placement_refused=2, shard_map_placement_accepted=1, one_device_placement_accepted=1)


@pytest.mark.usefixtures("dsl")
@pytest.mark.parametrize("arch", ["sm_100a", "sm_89", "sm_91a", "sm_80", "sm_120"])
@pytest.mark.parametrize("how", ["eager", "jit", "grad", "vmap", "scalar"])
def test_a_gpu_arch_without_a_build_says_which_build_to_run(example_cache: Path, arch: str,
                                                            how: str, tally) -> None:
    ks = cutecc.load(example_cache, arch=arch)
    assert ks.problems and all(f"cannot run on {arch}" in p for p in ks.problems)
    x = jnp.ones(8, jnp.float32)
    kernel = "rmsnorm" if how == "scalar" else "mul"
    calls = {
        "eager": lambda: ks.mul(x, x),
        "jit": lambda: jax.jit(ks.mul).trace(x, x),
        "grad": lambda: jax.grad(lambda a: ks.mul(a, a).sum())(x),
        "vmap": lambda: jax.vmap(ks.mul)(jnp.ones((2, 8)), jnp.ones((2, 8))),
        "scalar": lambda: ks.rmsnorm(jnp.ones((2, 1024)), jnp.ones(1024), eps=1e-5),
    }
    with pytest.raises(CuteccError) as err:
        calls[how]()
    msg = str(err.value)
    assert f'kernel "{kernel}": no usable build for arch {arch}' in msg
    assert f"built for sm_90a, cannot run on {arch}" in msg
    assert f"cutecc build --arch {arch_to_build(arch)} --kernel {kernel}" in msg
    tally.add("calls", wrong_arch_refused=1)


def test_the_device_arch_of_an_h100_uses_the_sm_90a_builds(example_cache: Path) -> None:
    """A device reports a plain arch (compute capability 9.0 is `sm_90`); arch-specific
    `sm_90a` code is exactly for it, so nothing is set aside."""
    ks = cutecc.load(example_cache, arch="sm_90")
    assert ks.problems == [] and {b.arch for b in ks.mul.builds} == {"sm_90a"}


def test_an_arch_that_is_not_one_is_refused_at_load(example_cache: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("sm90a", "gfx90a", "sm_9", "90"):
        with pytest.raises(CuteccError, match=f'"{bad}" is not a GPU architecture'):
            cutecc.load(example_cache, arch=bad)
    monkeypatch.setenv("CUTECC_ARCH", "hopper")
    with pytest.raises(CuteccError, match='"hopper" is not a GPU architecture'):
        cutecc.load(example_cache)


@SETTINGS
@given(value=st.one_of(st.none(), st.text(max_size=5), st.lists(st.floats(), max_size=3),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
def test_a_non_array_argument_is_named_by_position(ks, value: Any) -> None:
    x = jnp.ones(4, jnp.float32)
    # (None where no variant was built with None in that slot: `present = "$p"` would declare one)
    said = "is None, not an array" if value is None else f"is a {type(value).__name__}, not an array"
    with pytest.raises(CuteccError, match=f"argument 1 {said}"):
        ks.mul(x, value)


# Layout and alignment: what JAX guarantees, checked where it can be -------------------


@pytest.mark.usefixtures("dsl")
def test_non_contiguous_and_misaligned_numpy_inputs_reach_the_kernel_dense_and_row_major(ks) -> None:
    """A kernel never sees strides: a JAX array is dense and row-major, and XLA passes the
    custom call row-major buffers (operand_layouts). NumPy views that are transposed,
    strided or misaligned are copied into such buffers at the call boundary."""
    base = np.arange(2 * 1024 * 2, dtype=np.float32).reshape(2, 2048)
    strided = base[:, ::2]  # (2, 1024), not contiguous
    assert not strided.flags.c_contiguous
    raw = np.zeros(1024 * 4 + 1, np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.float32, count=1024, offset=1)
    assert not misaligned.flags.aligned
    fortran = np.asfortranarray(np.ones((2, 1024), np.float32))
    for x, w in ((strided, misaligned), (fortran, misaligned)):
        a = jnp.asarray(x)
        assert a.shape == x.shape and np.array_equal(np.asarray(a), x)
        assert a.unsafe_buffer_pointer() % 16 == 0  # XLA's own buffers are aligned
        text = jax.jit(ks.rmsnorm).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
        call = next(ln for ln in text.splitlines() if "custom_call @cutecc_" in ln)
        layouts = re.search(r"operand_layouts = \[([^\]]*\][^\]]*)\]", call)
        assert layouts and "dense<[1, 0]>" in layouts.group(1) and "dense<0>" in layouts.group(1)


def test_contract_alignment_is_within_what_xla_guarantees(example_cache: Path, tally) -> None:
    """XLA:GPU hands entry parameters over 16-byte aligned (kEntryParameterAlignBytes) and
    allocates its own buffers 128-byte aligned; a contract's `align` promises the kernel a
    pointer alignment, so it must not exceed 16. And where the row extent is static, each
    row starts as aligned as the first (row pitch a multiple of `align`)."""
    n = 0
    for e in Store(example_cache).entries():
        for a in e.doc["key_inputs"]["args"]:
            for t in (a["items"] if a["kind"] == "tuple" else [a]):
                if t["kind"] != "tensor":
                    continue
                align = t["align"]
                assert align & (align - 1) == 0 and 1 <= align <= 16, (e.doc["kernel"], t)
                last = t["shape"][-1]
                if len(t["shape"]) > 1 and isinstance(last, int):
                    itemsize = jnp.dtype(t["dtype"]).itemsize
                    assert (last * itemsize) % align == 0, (e.doc["kernel"], t)
                n += 1
    assert n >= 30
    tally.add("calls", contract_tensors_checked_for_alignment=n)
