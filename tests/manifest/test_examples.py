"""examples/kernels.toml: the published kernels are declared with no adapter
module, and the manifest is valid on its own (no DSL or kernel library needed to read it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cutecc.contract.args import NoneArg, ScalarArg, StreamArg, StructArg, TensorArg
from cutecc.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_examples_hold_no_adapter_python() -> None:
    """Every kernel is a published launcher; the Python files are the model that uses them
    and FA4's fallback (a jnp attention), and neither imports the DSL or the kernel
    libraries. gemm/ (quack's GEMM and its tuning space) is a manifest and its lock only.
    first_kernel/ is docs/first-kernel.md's own project, a kernel written for it
    (tests/commands/test_first_kernel.py)."""
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.name != "__pycache__") == [
        "README.md", "fa4_reference.py", "first_kernel", "gemm", "kernels.aarch64.lock", "kernels.lock",
        "kernels.toml", "llama_block.py", "quack_reference.py"]
    assert sorted(p.name for p in (EXAMPLES / "gemm").iterdir()) == ["kernels.lock", "kernels.toml"]
    for name in ("llama_block.py", "fa4_reference.py", "quack_reference.py"):
        src = (EXAMPLES / name).read_text()
        assert not re.search(r"^\s*(import|from)\s+(cutlass|quack|flash_attn|torch)\b", src, re.M), name


@pytest.mark.parametrize("causal", [False, True])
def test_fa4s_fallback_is_attention(causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/fa4_reference.py, fa4_fwd's declared fallback, against attention written out
    (bottom-right causal mask, s_q != s_k) on fresh random inputs, in bf16 as FA4 is called."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    monkeypatch.syspath_prepend(str(EXAMPLES))
    from fa4_reference import fa4_fwd

    rng = np.random.default_rng()
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, 3, 64)), jnp.bfloat16) for n in (37, 50, 50))
    qf, kf, vf = (a.astype(jnp.float32) for a in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf) * 0.125
    if causal:
        s = jnp.where(jnp.arange(50)[None, :] <= jnp.arange(37)[:, None] + 13, s, -jnp.inf)
    want = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), vf)
    got = fa4_fwd(q, k, v, softmax_scale=0.125, causal=causal)
    assert got.dtype == jnp.bfloat16 and got.shape == (2, 37, 3, 64)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=2e-2, rtol=2e-2)
    declared = {k.name: k.fallback for k in load_manifest(EXAMPLES / "kernels.toml").kernels if k.fallback}
    assert declared == {"fa4_fwd": "fa4_reference:fa4_fwd", "quack_rmsnorm": "quack_reference:quack_rmsnorm",
                        "quack_cross_entropy": "quack_reference:quack_cross_entropy"}


def test_examples_manifest_declares_the_published_launchers() -> None:
    m = load_manifest(EXAMPLES / "kernels.toml")
    entries = {k.name: k.entry for k in m.kernels}
    assert entries == {
        "quack_rmsnorm": "quack.rmsnorm:RMSNorm",
        "quack_rmsnorm_bwd": "quack.rmsnorm:RMSNormBackward",
        "quack_cross_entropy": "quack.cross_entropy:CrossEntropy",
        "quack_cross_entropy_bwd": "quack.cross_entropy:CrossEntropyBackward",
        "quack_cross_entropy_bwd_bcast": "quack.cross_entropy:CrossEntropyBackward",
        "fa4_fwd": "flash_attn.cute.flash_fwd_sm90:FlashAttentionForwardSm90",
        "fa4_bwd_pre": "flash_attn.cute.flash_bwd_preprocess:FlashAttentionBackwardPreprocess",
        "fa4_bwd_main": "flash_attn.cute.flash_bwd_sm90:FlashAttentionBackwardSm90",
        "fa4_bwd_post": "flash_attn.cute.flash_bwd_postprocess:FlashAttentionBackwardPostprocess",
    }
    assert [(c.name, c.launches) for c in m.composites] == [
        ("fa4_bwd", ("fa4_bwd_pre", "fa4_bwd_main", "fa4_bwd_post"))]
    assert all(k.archs == ("sm_90a",) for k in m.kernels)
    assert m.env_for("sm_90a") == {"QUACK_ARCH": "sm_90a"}  # quack's launch config on a CPU host


def test_rmsnorm_and_xent_list_every_launcher_parameter_in_order() -> None:
    m = load_manifest(EXAMPLES / "kernels.toml")
    kinds = {k.name: [type(a) for a in k.variants[0].args] for k in m.kernels}
    T, N, S, St = TensorArg, NoneArg, ScalarArg, StreamArg
    assert kinds["quack_rmsnorm"] == [T, T, N, N, T, N, T, N, S, St]
    assert kinds["quack_rmsnorm_bwd"] == [T, T, T, N, T, N, T, T, N, N, S, St]
    assert kinds["quack_cross_entropy"] == [T, T, N, T, T, N, N, S, St]
    assert kinds["quack_cross_entropy_bwd"] == [T, T, T, T, T, N, S, St]


def test_forwards_pair_with_their_backwards_through_saved_residuals() -> None:
    """rstd and lse are residuals (saved, not returned); each backward takes them by name."""
    m = load_manifest(EXAMPLES / "kernels.toml")
    pairs = {k.name: (k.backward, k.grad_args, k.grad_returns) for k in m.kernels if k.backward}
    assert pairs == {
        "quack_rmsnorm": ("quack_rmsnorm_bwd", ("x", "w", "cotangent.out", "rstd"), ("x", "w")),
        "quack_cross_entropy": ("quack_cross_entropy_bwd",
                                ("logits", "target", "cotangent.loss", "lse"), ("logits",)),
        "fa4_fwd": ("fa4_bwd", ("q", "k", "v", "out", "lse", "cotangent.out"), ("q", "k", "v")),
    }
    for name, res in (("quack_rmsnorm", "rstd"), ("quack_cross_entropy", "lse"), ("fa4_fwd", "lse")):
        conv = m.kernel(name).variants[0].convention
        assert [t.name for t in conv.results if t.saved] == [res]


def test_backward_sizes_are_derived_from_the_hardware_profile_and_the_query_length() -> None:
    """quack's per-SM dw partials (2 x SMs rows for N = 4096 on Hopper) and their count as a
    scalar agree by construction; FA4's fp32 statistics and accumulators are rounded up to
    its backward tile, which follows `causal` as FA4 picks it (80 rows, or 64 when causal)."""
    m = load_manifest(EXAMPLES / "kernels.toml")
    rms = m.kernel("quack_rmsnorm_bwd").variants[0].convention
    dw = next(t for t in rms.results if t.name == "dw")
    # 264 rows, compiled as a runtime value (`runtime = [0]`) as quack's own build has them
    assert dw.shape == (264, 4096) and dw.runtime == (0,) and dw.reduce == "sum" and dw.dtype == "float32"
    assert [(s.name, s.value) for s in rms.scalars] == [("sm_count", 264)]
    for launch in ("fa4_bwd_pre", "fa4_bwd_main", "fa4_bwd_post"):
        tiles = {v.call: dict(v.factory_args)["tile_m"] for v in m.kernel(launch).variants}
        assert tiles == {(("causal", False),): 80, (("causal", True),): 64}, launch
    swaps = {v.call: dict(v.factory_args)["dQ_swapAB"] for v in m.kernel("fa4_bwd_main").variants}
    assert swaps == {(("causal", False),): True, (("causal", True),): False}
    for v in m.kernel("fa4_bwd_pre").variants:
        r = f"round_up(s_q, {dict(v.factory_args)['tile_m']})"
        assert {t.name: t.shape for t in v.convention.results} == {
            "dpsum": ("b", "h", r), "lse_log2": ("b", "h", r), "dq_accum": ("b", "h", f"{r} * 128")}
    main = m.kernel("fa4_bwd_main").variants[0].convention
    assert main.aliases and main.inputs[main.aliases[0][0]].name == "dq_accum"
    bcast = m.kernel("quack_cross_entropy_bwd_bcast").variants[0].convention.inputs[2]
    assert (bcast.name, bcast.broadcast, bcast.buffer) == ("dloss", (0,), (1,))


def test_fa4_causal_variants_share_one_contract_and_symbolic_lengths() -> None:
    fa4 = load_manifest(EXAMPLES / "kernels.toml").kernel("fa4_fwd")
    assert sorted(v.id for v in fa4.variants) == ["dtype=bfloat16,d=128,causal=False",
                                                  "dtype=bfloat16,d=128,causal=True"]
    a, b = (v.args for v in fa4.variants)
    assert a == b  # only the factory's is_causal differs: `causal` must be a call keyword
    assert {dict(v.factory_args)["is_causal"] for v in fa4.variants} == {False, True}
    q = a[0]
    assert isinstance(q, TensorArg) and q.shape == ("b", "s_q", "h", 128)
    aux = next(x for x in a if isinstance(x, StructArg))
    assert aux.param == "aux_data" and aux.type == "flash_attn.cute.utils:AuxData"


def test_fa4_declares_a_tuning_space_of_its_own_knobs_over_four_sequence_buckets() -> None:
    """FA4's Hopper knobs per bucket of s_k: the default is what FA4's interface picks for
    head_dim 128 on sm_90 (and what `cutecc build` builds), queries as long as keys."""
    fa4 = load_manifest(EXAMPLES / "kernels.toml").kernel("fa4_fwd")
    spec = fa4.tuning
    assert spec is not None and [b.extent for b in spec.buckets] == ["s_k"]
    assert len(spec.buckets[0].edges) >= 4
    assert dict(spec.sizes) == {"b": 4, "h": 16, "s_q": "s_k"}
    assert dict(spec.scalars) == {"softmax_scale": 0.08838834764831845}
    for v in fa4.variants:
        fa = dict(v.factory_args)
        assert (fa["tile_m"], fa["tile_n"], fa["num_stages"], fa["intra_wg_overlap"], fa["mma_pv_is_rs"]) == (
            128, 128, 2, True, True)
    cands = dict(fa4.candidates)
    assert sorted(cands) == sorted(v.id for v in fa4.variants)
    for cs in cands.values():
        assert len(cs) == 11 and all(dict(c.factory_args)["tile_n"] % 16 == 0 for c in cs)
        fas = [dict(c.factory_args) for c in cs]
        assert all(fa["intra_wg_overlap"] or fa["mma_pv_is_rs"] for fa in fas)


@pytest.mark.usefixtures("examples_extra")
def test_tune_dry_run_prints_the_examples_plan_with_no_gpu() -> None:
    """Planning keys each candidate, so it finds the kernel libraries' modules (without
    importing them): it needs the `examples` extra installed, as CI has it."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "cutecc.cli", "tune", str(EXAMPLES / "kernels.toml"), "--dry-run"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "fa4_fwd[dtype=bfloat16,d=128,causal=True]@sm_90a: 12 candidates x 4 buckets" in r.stdout
    assert "2 tuned variant(s), 24 candidates" in r.stdout
    r = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300)
    doc = json.loads(r.stdout)
    assert list(doc["kernels"]) == ["fa4_fwd"] and len(doc["kernels"]["fa4_fwd"]) == 24 and doc["built"] == 0


@pytest.mark.usefixtures("examples_extra")
def test_fa4s_tuning_default_is_the_builds_own_entry() -> None:
    """`tune` plans the tuned kernels only; their defaults must keep the whole build's keys,
    or recorded winners name a base the build never made and never apply."""
    from cutecc.plan.build_plan import plan
    from cutecc.plan.tuning_plan import items

    m = load_manifest(EXAMPLES / "kernels.toml")
    built = {(p.kernel.name, p.variant.id, p.arch): p.key for p in plan(m)}
    bases = {(it.kernel, it.variant, it.arch): it.base for it in items(m)}
    assert bases and all(built[k] == key for k, key in bases.items())


@pytest.mark.usefixtures("examples_extra")
def test_the_copy_benchmarks_old_form_differs_only_in_fa4s_postprocess(tmp_path: Path) -> None:
    """benchmarks/composite_copy.py times FA4's backward against its old form (dq written
    over dout), derived from this manifest: only the postprocess's two keys move, so the
    rest of what it times is the examples' own entries."""
    import shutil

    from benchmarks.composite_copy import old_manifest_text
    from cutecc.plan.build_plan import plan

    shutil.copytree(EXAMPLES, tmp_path / "examples")
    shutil.copytree(EXAMPLES.parent / "requirements", tmp_path / "requirements")
    old = tmp_path / "examples" / "kernels.toml"
    old.write_text(old_manifest_text(old.read_text()))

    def keys(path: Path) -> dict[tuple[str, str], str]:
        return {(p.kernel.name, p.variant.id): p.key for p in plan(load_manifest(path))}

    now, then = keys(EXAMPLES / "kernels.toml"), keys(old)
    assert set(now) == set(then)
    assert {k for k in now if now[k] != then[k]} == {("fa4_bwd_post", v) for v in (
        "dtype=bfloat16,d=128,causal=False", "dtype=bfloat16,d=128,causal=True")}
    m = load_manifest(old)
    (c,) = [c for c in m.composites if c.name == "fa4_bwd"]
    assert c.outputs == ("dout", "dk", "dv")
    conv = m.kernel("fa4_bwd_post").variants[0].convention
    assert [t.name for t in conv.inputs] == ["dq_accum", "dout"] and conv.aliases == ((1, 0),)


# jax.grad through the published backward kernels, lowered for sm_90a on this CPU ------

def _lower(fn, *specs) -> str:
    import jax

    return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()


def _called(ks, text: str) -> list[str]:
    """The kernels a lowered program calls, in order, by name."""
    by_target = {f"cutecc_{b.key[:40]}": name for name in ks for b in getattr(ks, name).builds}
    return [by_target.get(t, t) for t in re.findall(r"stablehlo\.custom_call @(\w+)", text)]


@pytest.fixture(scope="module")
def eks(examples_build: Path):
    import cutecc

    return cutecc.load(examples_build, arch="sm_90a")


def test_grad_of_rmsnorm_runs_quacks_backward_with_the_saved_rstd(eks) -> None:
    import jax
    import jax.numpy as jnp

    S, BF = jax.ShapeDtypeStruct, jnp.bfloat16
    f = jax.grad(lambda x, w: eks.quack_rmsnorm(x, w, eps=1e-5).astype(jnp.float32).sum(), argnums=(0, 1))
    gx, gw = jax.eval_shape(f, S((300, 4096), BF), S((4096,), BF))
    assert (gx.shape, gx.dtype, gw.shape, gw.dtype) == ((300, 4096), BF, (4096,), BF)  # dw cast from fp32
    text = _lower(f, S((300, 4096), BF), S((4096,), BF))
    assert _called(eks, text) == ["quack_rmsnorm", "quack_rmsnorm_bwd"]
    bwd = [ln for ln in text.splitlines() if "custom_call" in ln][1]
    # x, w, the cotangent and the forward's hidden rstd; dx and 264 rows of fp32 partials
    assert "(tensor<300x4096xbf16>, tensor<4096xbf16>, tensor<300x4096xbf16>, tensor<300xf32>) -> " \
           "(tensor<300x4096xbf16>, tensor<264x4096xf32>)" in bwd
    assert "sm_count = 264 : i32" in bwd and "stablehlo.reduce" in text


def test_grad_of_cross_entropy_runs_quacks_backward_with_the_saved_lse(eks) -> None:
    import jax
    import jax.numpy as jnp

    S = jax.ShapeDtypeStruct
    specs = (S((77, 32768), jnp.bfloat16), S((77,), jnp.int32))
    f = jax.grad(lambda x, t: eks.quack_cross_entropy(x, t, ignore_index=3).mean())
    g = jax.eval_shape(f, *specs)
    assert (g.shape, g.dtype) == ((77, 32768), jnp.bfloat16)
    text = _lower(f, *specs)
    assert _called(eks, text) == ["quack_cross_entropy", "quack_cross_entropy_bwd"]
    bwd = [ln for ln in text.splitlines() if "custom_call" in ln][1]
    assert "tensor<77xf32>, tensor<77xf32>) -> tensor<77x32768xbf16>" in bwd  # dloss, lse
    assert "ignore_index = 3 : i32" in bwd  # the forward's scalar reaches the backward


def test_the_broadcast_backward_takes_one_dloss_for_every_row(eks) -> None:
    import jax
    import jax.numpy as jnp

    S = jax.ShapeDtypeStruct
    specs = (S((77, 32768), jnp.bfloat16), S((77,), jnp.int32), S((1,), jnp.float32), S((77,), jnp.float32))
    assert jax.eval_shape(eks.quack_cross_entropy_bwd_bcast, *specs).shape == (77, 32768)
    assert "tensor<1xf32>, tensor<77xf32>) -> tensor<77x32768xbf16>" in _lower(
        eks.quack_cross_entropy_bwd_bcast, *specs)


@pytest.mark.parametrize(("causal", "rows"), [(False, 240), (True, 256)])
def test_grad_of_fa4_runs_its_three_launches_on_rounded_fp32_scratch(eks, causal: bool, rows: int) -> None:
    """s_q = 200 is rounded up to FA4's backward tile (80 rows, 64 when causal): `rows` of
    statistics and rows * 128 accumulators per (batch, head), made by the preprocess,
    accumulated in place by the main kernel, read by the postprocess, which writes a fresh
    dq sized by q (passed for its extents only): nothing is written over dout."""
    import jax
    import jax.numpy as jnp

    S, BF = jax.ShapeDtypeStruct, jnp.bfloat16
    q, kv = S((2, 200, 4, 128), BF), S((2, 300, 4, 128), BF)
    f = jax.grad(lambda q, k, v: eks.fa4_fwd(q, k, v, softmax_scale=0.1, causal=causal)
                 .astype(jnp.float32).sum(), argnums=(0, 1, 2))
    gq, gk, gv = jax.eval_shape(f, q, kv, kv)
    assert (gq.shape, gk.shape, gv.shape) == ((2, 200, 4, 128), (2, 300, 4, 128), (2, 300, 4, 128))
    text = _lower(f, q, kv, kv)
    assert _called(eks, text) == ["fa4_fwd", "fa4_bwd_pre", "fa4_bwd_main", "fa4_bwd_post"]
    fwd, pre, main, post = [ln for ln in text.splitlines() if "custom_call" in ln]
    assert "-> (tensor<2x200x4x128xbf16>, tensor<2x4x200xf32>)" in fwd  # out and the saved lse
    acc = f"tensor<2x4x{rows * 128}xf32>"
    assert f"-> (tensor<2x4x{rows}xf32>, tensor<2x4x{rows}xf32>, {acc})" in pre
    assert "output_tuple_indices = [0], operand_index = 6" in main  # dq_accum in place
    assert f"-> ({acc}, tensor<2x300x4x128xbf16>, tensor<2x300x4x128xbf16>)" in main
    assert f"({acc}, tensor<2x200x4x128xbf16>) -> tensor<2x200x4x128xbf16>" in post  # (dq_accum, q) -> dq
    assert "output_operand_aliases" not in post  # dq is fresh: no input written over
    assert all("softmax_scale = 1.000000e-01 : f32" in c for c in (fwd, pre, main, post))
    for launch, call in (("fa4_bwd_pre", pre), ("fa4_bwd_main", main), ("fa4_bwd_post", post)):
        (b,) = [b for b in getattr(eks, launch).builds if dict(b.call)["causal"] is causal]
        assert f"cutecc_{b.key[:40]}" in call  # the call keyword picks each launch's variant


def test_the_llama_block_differentiates_through_cutecc_kernels_only_where_published(eks) -> None:
    import jax

    from examples import llama_block as lb

    cfg = lb.Config()
    params = jax.eval_shape(lambda: lb.init_params(jax.random.key(0), cfg))
    x, t = jax.eval_shape(lambda: lb.init_batch(jax.random.key(1), 2, 256, cfg))
    f = jax.value_and_grad(lambda p, x, t: lb.loss_cutecc(p, x, t, eks, cfg), argnums=(0, 1))
    loss, (gp, gx) = jax.eval_shape(f, params, x, t)
    assert loss.shape == () and gx.shape == x.shape and gx.dtype == x.dtype
    like = lambda tree: {k: (v.shape, v.dtype) for k, v in tree.items()}  # noqa: E731
    assert like(gp) == like(params)
    assert _called(eks, _lower(f, params, x, t)) == [
        "quack_rmsnorm", "fa4_fwd", "quack_rmsnorm", "quack_cross_entropy",
        "quack_cross_entropy_bwd", "quack_rmsnorm_bwd", "fa4_bwd_pre", "fa4_bwd_main", "fa4_bwd_post",
        "quack_rmsnorm_bwd"]


def test_the_plain_jax_block_runs_on_cpu_and_ignores_rows() -> None:
    """With a zero vocabulary projection every logit is 0: each counted row's loss is
    log(vocab), each ignored row's 0."""
    import math

    import jax
    import jax.numpy as jnp

    from examples import llama_block as lb

    cfg = lb.Config(d_model=64, n_heads=2, d_ff=96, vocab=50)
    p = lb.init_params(jax.random.key(0), cfg, jnp.float32)
    x, t = lb.init_batch(jax.random.key(1), 2, 16, cfg, jnp.float32, ignored=0.25)
    counted = float(jnp.mean(t != lb.IGNORE_INDEX))
    assert 0 < counted < 1
    loss = lb.loss_jax({**p, "w_out": jnp.zeros_like(p["w_out"])}, x, t, cfg)
    assert abs(float(loss) - counted * math.log(cfg.vocab)) < 1e-5
    g = jax.grad(lb.loss_jax)(p, x, t, cfg)
    assert all(bool(jnp.isfinite(v).all()) and float(jnp.abs(v).max()) > 0 for v in g.values())


def test_the_training_step_benchmark_lowers_its_cutecc_side_with_no_gpu(examples_build: Path) -> None:
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "training_step.py"
    r = subprocess.run([sys.executable, str(script), str(examples_build), "--dry-run", "--batch", "1",
                        "--seq", "128"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)["dry_run"]
    assert doc["cutecc"] == {"custom_calls": 10} and doc["jax_xla"] == {"custom_calls": 0}


def test_the_multi_gpu_training_step_runs_every_kernel_on_each_devices_shard(examples_build: Path) -> None:
    """benchmarks/training_step_multi.py on four CPU devices: the cutecc step, data-parallel
    and FSDP on 2 and 4 devices, lowers for sm_90a with every kernel inside the shard_map on
    the device's rows (never gathered), and the same sharding of the plain-JAX block gives
    the one-device loss and gradients (by shard_map and by jax.jit with shardings alone),
    FSDP's gradients left sharded."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "training_step_multi.py"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, str(script), str(examples_build), "--dry-run", "--batch", "1",
                        "--seq", "128"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)["dry_run"]
    assert doc["devices"] == 4
    assert set(doc["lowered"]) == {f"{n} {m}" for n in (1, 2, 4) for m in ("dp", "fsdp")}
    for n in (2, 4):
        for mode in ("dp", "fsdp"):
            low = doc["lowered"][f"{n} {mode}"]
            assert low["calls"] == low["inside_shard_map"] == 10, low
            # the global batch is n sequences of 128: each device's norms see its 128 rows
            assert low["first_operands"].count("tensor<128x4096xbf16>") == 4, low
            assert f"tensor<{n * 128}x4096xbf16>" not in low["first_operands"], low
            # one all-reduce for the loss; per weight, one all-reduce of its gradient (dp: no
            # gradient summed twice, the norms' by cutecc's backward included) or a gather
            # and a reduce-scatter (fsdp)
            assert low["collectives"] == ({"all_reduce": 11} if mode == "dp" else
                                          {"all_gather": 10, "all_reduce": 1, "reduce_scatter": 10}), low
            # the examples declare no shard rule: jax.jit with shardings alone is refused
            assert f"computation over {n} devices" in low["under_jit"], low
    assert set(doc["checked"]) == {f"{n} {m}{how}" for n in (1, 2, 4) for m in ("dp", "fsdp")
                                   for how in ("", " jit")}
    for name, c in doc["checked"].items():
        assert c["ok"] and c["rel_err"]["loss"] < 1e-5 and max(c["rel_err"].values()) < 1e-5, (name, c)
        assert len(c["rel_err"]) == 12  # loss, ten weights, dx
        if name in ("2 fsdp", "4 fsdp", "2 fsdp jit", "4 fsdp jit"):
            assert set(c["grad_specs"].values()) == {"P('data',)"}, c
        if name.split()[1] == "dp":
            assert set(c["grad_specs"].values()) == {"P()"}, c


def test_tuning_measures_fa4_by_what_a_call_returns(eks) -> None:
    """The tuning bench loops a kernel feeding each call's results back as a carry: the
    carry is what a call returns (out), not the lse FA4 saves for its backward."""
    from cutecc.tuning.bench import returned

    (build,) = [b for b in eks.fa4_fwd.builds if dict(b.call)["causal"]]
    assert [t.name for t in build.conv.results] == ["out", "lse"]
    assert returned(build, {"b": 4, "s_q": 512, "s_k": 512, "h": 16}) == [((4, 512, 16, 128), "bfloat16")]
