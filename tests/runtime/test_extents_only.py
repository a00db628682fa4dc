"""A composite whose last launch allocates its output from an input's extents
(`extents_only`, issue 48 item 8), lowered on a CPU for the GPU: the input the call still
holds is an operand of that launch (a pointer), never aliased to a result, so XLA has
nothing to copy; the older form, which writes over it in place, is aliased and warned of.

The kernels are tests/gpu/form_kernels' pad_crop (pad_rows -> crop_rows, x passed to the
last launch for its extents) and pad_crop_inout (the same launches, y written over x),
built here or taken from CUTECC_FORMS_CACHE.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import cutecc
from cutecc.runtime.library import target_name

MANIFEST = Path(__file__).resolve().parents[1] / "gpu" / "form_kernels" / "kernels.toml"
X = jax.ShapeDtypeStruct((300, 70), jnp.float32)


@pytest.fixture(scope="module")
def ks(tmp_path_factory: pytest.TempPathFactory):
    pre = os.environ.get("CUTECC_FORMS_CACHE")
    if pre:
        cache = Path(pre)
    else:
        pytest.importorskip("cutlass", reason="building needs the build extra (nvidia-cutlass-dsl)")
        cache = tmp_path_factory.mktemp("forms-cache")
        r = subprocess.run([sys.executable, "-m", "cutecc.cli", "build", str(MANIFEST), "--cache-dir",
                            str(cache), "--no-lock", "--kernel", "pad_crop", "--kernel", "pad_crop_inout"],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr + r.stdout
    return cutecc.load(cache, arch="sm_90a", manifest=MANIFEST)


def lowered(ks, name: str) -> tuple[list[str], list[warnings.WarningMessage]]:
    """The custom calls of `(f(x), x + 1)` (x live after the call) lowered for the GPU, and
    the warnings the lowering gave."""
    f = getattr(ks, name)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        text = jax.jit(lambda x: (f(x), x + 1)).trace(X).lower(lowering_platforms=("cuda",)).as_text()
    return [ln for ln in text.splitlines() if "stablehlo.custom_call" in ln], list(seen)


def test_the_output_is_allocated_and_the_live_input_is_neither_written_nor_copied(dsl, ks) -> None:
    assert ks.pad_crop.outputs == ("y",)
    assert jax.eval_shape(ks.pad_crop, X) == X  # sized by x, which crop_rows' launcher never sees
    calls, seen = lowered(ks, "pad_crop")
    assert len(calls) == 2
    last = calls[1]
    assert target_name(ks.crop_rows.builds[0].key) in last
    # x goes to the last launch as an operand (for its extents) beside the padded p, and
    # the result is a fresh array: no alias, so nothing for XLA to copy.
    assert "(%0, %arg0)" in last and "-> tensor<300x70xf32>" in last
    assert not any("output_operand_aliases" in c for c in calls)
    assert not [w for w in seen if issubclass(w.category, cutecc.CopyWarning)]


def test_the_old_form_writes_over_the_live_input_so_xla_copies_it(dsl, ks) -> None:
    """What the new form removes, seen the same way (so the test above can fail)."""
    calls, seen = lowered(ks, "pad_crop_inout")
    assert "output_operand_aliases" in calls[1]
    assert [w for w in seen if issubclass(w.category, cutecc.CopyWarning)]


def test_a_call_of_the_last_launch_alone_passes_the_extents_array_and_sizes_by_it(dsl, ks) -> None:
    p = jax.ShapeDtypeStruct((320, 70), jnp.float32)
    assert jax.eval_shape(ks.crop_rows, p, X) == X
    with pytest.raises(cutecc.CuteccError):  # its extents must still fit the contract
        jax.eval_shape(ks.crop_rows, p, jax.ShapeDtypeStruct((300, 71), jnp.float32))
