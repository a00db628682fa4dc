"""Kernel faults and arch mismatch on a real GPU.

A kernel that reads far out of bounds, or executes PTX `trap`, must end in a Python
exception (from the call or from the next synchronisation), never in a crash or a silent
wrong answer; with CUTECC_SYNC_CHECK=1 the error names the kernel. A library built for
another GPU is set aside at load with what to build, and forcing it onto this GPU fails
with an error naming both archs while the process stays usable.

Each fault runs in a fresh process (a faulted CUDA context is dead), which prints what it
saw and leaves with os._exit(0) right after catching the error: a return code other than
0 means the fault killed the process before Python could handle it.

The kernels are tests/gpu/faulty_kernels (their own manifest). Set CUTECC_FAULT_CACHE to
a cache built from it (the device machine has no DSL); with the DSL installed and no
CUTECC_FAULT_CACHE, it is built here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cutecc
from cutecc.archs import device_arch
from cutecc.errors import CuteccError
from cutecc.store import Store

from .conftest import prepared_cache

pytestmark = pytest.mark.gpu

MANIFEST = Path(__file__).with_name("faulty_kernels") / "kernels.toml"
ENV_CACHE = "CUTECC_FAULT_CACHE"
FAR = 1 << 40  # elements: 4 TiB past the array, outside anything XLA has mapped

FAULT = r'''
import json, os, sys
import numpy as np, jax, jax.numpy as jnp
import cutecc

cache, kernel, scalar, bad, factor, mode, seed = sys.argv[1:8]
bad, factor = int(bad), float(factor)
ks = cutecc.load(cache, kernels=[kernel])
f = ks[kernel]

def fn(value):
    if mode == "eager":
        return lambda a: f(a, **{scalar: value})
    return jax.jit(lambda a: f(a, **{scalar: value}) + 1.0)

x = jnp.asarray(np.random.default_rng(int(seed)).standard_normal(100_003, dtype=np.float32))
want = np.asarray(x) * factor + (1.0 if mode == "jit" else 0.0)
out = {"good": bool(np.array_equal(np.asarray(fn(0)(x)), want)), "raised": None}
stage = "call"
try:
    y = fn(bad)(x)
    stage = "block_until_ready"
    y.block_until_ready()
    stage = "read"
    out["values"] = np.asarray(y)[:4].tolist()  # reaching here is a silent wrong answer
except Exception as e:
    out["raised"] = {"stage": stage, "type": type(e).__name__, "message": str(e)}
print(json.dumps(out), flush=True)
os._exit(0)  # the CUDA context is dead: skip the teardown that would report it again
'''

FORCED = r'''
import json, os, sys
import numpy as np, jax, jax.numpy as jnp
import cutecc

cache, built = sys.argv[1:3]
x = jnp.asarray(np.random.default_rng(5).standard_normal(4099, dtype=np.float32))
out = {"raised": None}
try:
    elsewhere = cutecc.load(cache, arch=built, kernels=["copy_elsewhere"])  # this GPU is not `built`
    elsewhere.copy_elsewhere(x).block_until_ready()
except Exception as e:
    out["raised"] = {"type": type(e).__name__, "message": str(e)}
ks = cutecc.load(cache, kernels=["shifted_copy"])  # the GPU still works in this process
out["after"] = bool(np.array_equal(np.asarray(ks.shifted_copy(x)), np.asarray(x)))
print(json.dumps(out), flush=True)
os._exit(0)
'''


@pytest.fixture(scope="module")
def fault_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_cache(tmp_path_factory, MANIFEST, ENV_CACHE)


def who(cache: Path, kernel: str, arch: str) -> str:
    """How the native wrapper names, in its errors, the entry that `cutecc.load` picks for
    (kernel, arch)."""
    (build,) = cutecc.load(cache, arch=arch, kernels=[kernel])[kernel].builds
    entry = Store(cache).get(build.key)
    assert entry is not None
    return f"cutecc kernel {entry.doc['entry']} (built for {arch}, cache key {build.key[:12]})"


def run_child(script: str, *args: str, check: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUTECC_SYNC_CHECK"}
    if check:
        env["CUTECC_SYNC_CHECK"] = "1"
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, (f"the process died (return code {r.returncode}) instead of raising a "
                               f"Python error:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


FAULTS = {
    # kernel: (scalar, faulting value, result factor for 0, what CUDA calls the fault)
    "shifted_copy": ("shift", FAR, 1.0, r"cudaErrorIllegalAddress"),
    "doubled_or_trap": ("trap", 1, 2.0, r"cudaError\w+"),
}
XLA_SAYS = {  # what XLA's own error at the next synchronisation contains, without check mode
    "shifted_copy": r"(?i)illegal (memory )?(access|address)",
    "doubled_or_trap": r"(?i)cuda|launch",
}


@pytest.mark.parametrize("check", [False, True], ids=["default", "check-mode"])
@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("kernel", sorted(FAULTS))
def test_a_fault_is_a_python_error_never_a_wrong_answer(fault_cache: Path, kernel: str, mode: str,
                                                       check: bool) -> None:
    scalar, bad, factor, cuda_name = FAULTS[kernel]
    got = run_child(FAULT, str(fault_cache), kernel, scalar, str(bad), str(factor), mode, "11",
                    check=check)
    assert got["good"], "the call that should not fault gave a wrong result"
    raised = got["raised"]
    assert raised is not None, f"the fault went unnoticed: the call returned {got.get('values')}"
    message = raised["message"]
    if check:
        assert who(fault_cache, kernel, "sm_90a") in message, message
        assert re.search(rf"CUDA error \d+ \({cuda_name}\)", message), message
        assert "CUTECC_SYNC_CHECK" in message and "restart the process" in message, message
    else:
        assert re.search(XLA_SAYS[kernel], message), message


def test_a_build_for_another_gpu_is_set_aside_with_what_to_build(fault_cache: Path) -> None:
    ks = cutecc.load(fault_cache)  # for this GPU
    here = ks.arch
    assert here == device_arch() and here.startswith("sm_9"), here
    assert "shifted_copy" in ks and "copy_elsewhere" in ks
    for built in ("sm_100a", "sm_80"):
        assert any(re.match(rf"copy_elsewhere: default@{built} \([0-9a-f]{{12}}\): "
                            rf"built for {built}, cannot run on {here}$", p)
                   for p in ks.problems), ks.problems
    with pytest.raises(CuteccError) as err:
        ks.copy_elsewhere(jnp.ones(8, jnp.float32))
    text = str(err.value)
    assert f"no usable build for arch {here}" in text
    for built in ("sm_100a", "sm_80"):
        assert f"built for {built}, cannot run on {here}" in text
    assert f"cutecc build --arch {here}a --kernel copy_elsewhere" in text
    x = jnp.arange(1000, dtype=jnp.float32)
    assert np.array_equal(np.asarray(ks.shifted_copy(x)), np.asarray(x))  # the rest still runs


@pytest.mark.parametrize("built", ["sm_100a", "sm_80"])
def test_forcing_a_build_for_another_gpu_fails_cleanly_naming_both(fault_cache: Path, built: str) -> None:
    got = run_child(FORCED, str(fault_cache), built)
    raised = got["raised"]
    assert raised is not None, f"code built for {built} ran on this GPU"
    message = raised["message"]
    cc = str(jax.devices("gpu")[0].compute_capability)
    major, minor = cc.split(".")
    assert who(fault_cache, "copy_elsewhere", built) in message, message
    assert f"holds code for {built} only, and GPU 0 is sm_{major}{minor} (compute capability {cc})" \
        in message, message
    assert f"cutecc build --arch sm_{major}{minor}a" in message, message
    assert got["after"], "after the refused call, a good kernel no longer ran correctly"
