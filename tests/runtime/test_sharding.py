"""A declared sharding rule (`shard = ["m"]`): calls under `jax.jit` with several devices run on
each device's shard, never a wrong answer.

What the manifest refuses (a rule that could not be sound), what an entry read from disk must
say again, and, in a child process with eight CPU devices, the production partitioning code
compiled and run: with a jnp body (attention, independent along batch and heads) and through
the whole dispatch of a loaded kernel whose custom call alone is lowered for the CPU by a
stand-in computing what the kernel computes. Sharded along declared axes, the compiled HLO
holds no collective and each device's body sees its shard; sharded along others, the operands
are gathered and the numbers still equal the unsharded reference. Both partitioners (Shardy,
and GSPMD's callbacks) are checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import cutecc
from cutecc.contract.args import TensorArg, shard_factors
from cutecc.errors import CuteccError
from cutecc.manifest import load_manifest
from cutecc.runtime.calls import Build
from cutecc.runtime.library import target_name
from cutecc.store import Store

CHILD = Path(__file__).with_name("sharding_child.py")
REPO = Path(__file__).resolve().parents[2]


def manifest(tmp_path: Path, args: str, shard: str) -> Path:
    p = tmp_path / "kernels.toml"
    p.write_text(f'format = 1\narchs = ["sm_90a"]\n\n[kernel.k]\nentry = "kk.elem:f"\nargs = [\n{args}'
                 f'  {{ kind = "stream" }},\n]\nshard = {shard}\n')
    return p


X = '  { name = "x", dtype = "float32", shape = ["m", "n"] },\n'
W = '  { name = "w", dtype = "float32", shape = ["n"] },\n'
OUT = '  { name = "out", role = "output", dtype = "float32", shape = ["m", "n"] },\n'


def test_a_rule_is_stored_with_the_kernel(tmp_path: Path) -> None:
    (k,) = load_manifest(manifest(tmp_path, X + W + OUT, '["m"]')).kernels
    assert k.shard == ("m",)
    (k,) = load_manifest(manifest(tmp_path, X + OUT, "[]")).kernels
    assert k.shard == ()


@pytest.mark.parametrize(("args", "shard", "why"), [
    (X + OUT, '["q"]', '"q" is no extent of an input array'),
    (X + OUT, '["m", "m"]', "names a symbol twice"),
    (X + OUT, '["round_up(m, 2)"]', "is not a symbolic extent"),
    (X + W + '  { name = "s", role = "output", dtype = "float32", shape = ["n"] },\n', '["m"]',
     'result "s" has no dimension "m"'),
    (X + '  { name = "o", role = "output", dtype = "float32", shape = ["round_up(m, 32)", "n"] },\n',
     '["m"]', '"m" is read by a derived extent of "o"'),
    ('  { name = "x", dtype = "float32", shape = ["m", "m"] },\n'
     '  { name = "o", role = "output", dtype = "float32", shape = ["m", "m"] },\n', '["m"]',
     '"m" is the extent of two dimensions of "x"'),
    ('  { name = "x", dtype = "float32", shape = ["m", "n"], buffer = ["m", "ld"] },\n' + W + OUT, '["n"]',
     'a padded tensor'),
    (X + '  { name = "p", role = "output", reduce = "sum", dtype = "float32", '
         'shape = ["$hw.sm_count", "n"] },\n', '["m"]', 'result "p" has no dimension "m"'),
    (X + OUT, '"m"', "must be an array of symbolic extents"),
])
def test_a_rule_that_could_not_be_sound_is_refused(tmp_path: Path, args: str, shard: str, why: str) -> None:
    path = manifest(tmp_path, args, shard)
    with pytest.raises(CuteccError, match=why) as err:
        load_manifest(path)
    assert err.value.key_path == 'kernel "k", shard' and err.value.where == str(path)


def test_factors_follow_the_declared_symbols_not_broadcast_or_reduced_axes() -> None:
    x = TensorArg("x", "input", "float32", ("b", "s", "h", 64))
    assert shard_factors(x, ("b", "h")) == ("b", None, "h", None)
    bias = TensorArg("bias", "input", "float32", ("b", "s"), buffer=(1, "s"), broadcast=(0,))
    assert shard_factors(bias, ("b",)) == (None, None)
    part = TensorArg("p", "output", "float32", (132, "h"), reduce="sum")
    assert shard_factors(part, ("h",), result=True) == ("h",)


def test_an_entry_carries_its_rule_and_is_checked_again(train_cache: Path) -> None:
    store = Store(train_cache)
    ks = cutecc.load(train_cache, arch="sm_90a")
    (rows,) = ks.expw_rows.builds
    assert rows.shard == ("m",) and ks.expw.builds[0].shard == ()
    entry = store.get(rows.key)
    assert entry is not None and entry.doc["key_inputs"]["shard"] == ["m"]
    assert "shard" not in store.get(ks.expw.builds[0].key).doc["key_inputs"]  # others keep their keys
    bad = dataclasses.replace(entry.meta, key_inputs={**entry.meta.key_inputs, "shard": ["d", "zz"]})
    with pytest.raises(ValueError, match='shard: "zz" is no extent of an input array'):
        Build.of(bad, entry.path)


def test_with_one_device_the_call_lowers_to_the_kernel_itself(train_cache: Path) -> None:
    ks = cutecc.load(train_cache, arch="sm_90a")
    spec = (jax.ShapeDtypeStruct((300, 70), jnp.float32), jax.ShapeDtypeStruct((70,), jnp.float32))
    text = jax.jit(ks.expw_rows).trace(*spec).lower(lowering_platforms=("cuda",)).as_text()
    calls = [ln for ln in text.splitlines() if "stablehlo.custom_call" in ln]
    assert len(calls) == 1 and target_name(ks.expw_rows.builds[0].key) in calls[0]
    assert jax.eval_shape(ks.expw_rows, *spec).shape == (300, 70)


@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_eight_devices_run_their_shards_and_agree_with_the_reference(train_cache: Path,
                                                                      partitioner: str) -> None:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, str(CHILD), str(train_cache), partitioner], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-5000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    checks = {c["check"]: c for c in map(json.loads, lines)}
    assert len(checks) == 12, list(checks)
    for c in checks.values():
        assert c["ok"], c
        if "want_gather" in c:  # sharded on declared axes: no collective; else gathered first
            assert c["collectives"] == (["all-gather"] if c["want_gather"] else []), c
    local = {"attention P('a', None, 'c', None)": [4, 24, 2, 16],
             "attention P('c', None, 'a', None)": [2, 24, 4, 16],
             "attention P(('a', 'c'), None, None, None)": [1, 24, 8, 16],
             "attention P(None, 'a', None, None)": [8, 24, 8, 16],
             "expw_rows P('x',)": [8, 16], "expw_rows P(None, 'x')": [64, 16], "expw_rows eager": [8, 16]}
    for name, shape in local.items():  # what each device's call saw (the last trace: the shard's)
        assert checks[name]["shapes"][-1] == shape, checks[name]
    assert checks["expw_rows P('x',)"]["out_spec"] == "P('x',)"


def test_a_kernel_is_strict_unless_its_manifest_chooses_a_warning_or_allows_the_collective(
        tmp_path: Path) -> None:
    from cutecc.plan.key import key_inputs

    (k,) = load_manifest(manifest(tmp_path, X + W + OUT, '["m"]')).kernels
    assert k.reshard == "error" and "reshard" not in key_inputs(k, k.variants[0], "sm_90a", "0" * 64)
    for choice in ("warn", "allow"):
        path = manifest(tmp_path, X + W + OUT, f'["m"]\nreshard = "{choice}"')
        (k,) = load_manifest(path).kernels
        assert k.reshard == choice
        assert key_inputs(k, k.variants[0], "sm_90a", "0" * 64)["reshard"] == choice  # the runtime reads it
    path = manifest(tmp_path, X + OUT, '[]\nreshard = "gather"')
    with pytest.raises(CuteccError, match="must be one of 'error', 'warn', 'allow', not 'gather'") as err:
        load_manifest(path)
    assert err.value.key_path == 'kernel "k", reshard'


def test_an_entry_carries_its_reshard_choice_and_is_checked_again(train_cache: Path) -> None:
    store = Store(train_cache)
    ks = cutecc.load(train_cache, arch="sm_90a")
    (rows,) = ks.expw_rows.builds
    assert rows.reshard == "error"
    entry = store.get(rows.key)
    assert entry is not None
    rec = entry.meta
    warn = dataclasses.replace(rec, key_inputs={**rec.key_inputs, "reshard": "warn"})
    assert Build.of(warn, entry.path).reshard == "warn"
    bad = dataclasses.replace(rec, key_inputs={**rec.key_inputs, "reshard": "sometimes"})
    with pytest.raises(ValueError, match="reshard 'sometimes' is not one of error, warn, allow"):
        Build.of(bad, entry.path)
