#!/usr/bin/env bash
# The GPU suite, on any machine with a CUDA GPU:
#   bash tests/gpu/run.sh [CACHES] [pytest args...]
# CACHES is what `bash tests/gpu/prepare.sh CACHES` made on a build host (the device needs
# no DSL): each of its directories that is there turns on the tests that need it, unless
# the variable is already set:
#   root/      kernels.toml                                CUTECC_TEST_CACHE
#   faults/    tests/gpu/faulty_kernels (+ tune candidates) CUTECC_FAULT_CACHE, CUTECC_FAULT_TUNE_CACHE
#   layouts/   tests/gpu/layout_kernels                     CUTECC_LAYOUT_CACHE
#   train/     tests/gpu/train_kernels (derived, scratch)   CUTECC_TRAIN_CACHE
#   forms/     tests/gpu/form_kernels (optional, from_shapes, HardwareInfo) CUTECC_FORMS_CACHE
#   first_kernel/ examples/first_kernel (docs/first-kernel.md) CUTECC_FIRST_KERNEL_CACHE
#   quickstart/cache/ the README's `cutecc init` project       CUTECC_QUICKSTART_CACHE
#   archs/     tests/gpu/arch_kernels (sm_100a only)        CUTECC_ARCH_CACHE
#   tune/      kernels.toml + its tuning candidates         CUTECC_TUNE_CACHE
#   projects/  tests/gpu/project_kernels/a and b            CUTECC_PROJECTS_CACHE
#   examples/  examples/kernels.toml (published kernels)    CUTECC_EXAMPLES_CACHE
#   gemm/      examples/gemm/kernels.toml (+ tune candidates) CUTECC_GEMM_CACHE
#   layout_ab/ benchmarks/layout_ab.py prepare: after the suite, old link layout against new
#   examples-direct/  benchmarks/examples_parity.py build: after the suite, cutecc against
#              the same launchers compiled directly (within 2%)
#   fa4_bwd_inout/  benchmarks/composite_copy.py build: after the suite (with examples/), FA4's
#              backward with a live dout against its old in-place form (composite_copy.json;
#              fails when the current form copies or its results differ)
# With layouts/, benchmarks/object_call.py times an op passed as the object against the same
# kernel reached by its import reference's text (object_call.json; a wrong result fails).
# With first_kernel/, benchmarks/first_kernel.py times docs/first-kernel.md's kernel against
# XLA's own formulation after the suite (first_kernel.json; a wrong result fails the run).
# With examples/, benchmarks/training_step.py also times a training step of
# examples/llama_block.py through cutecc against plain JAX (figures only, never a failure);
# with 2 or more GPUs, benchmarks/training_step_multi.py times it data-parallel and FSDP on
# 1, 2 and 4 GPUs (training_step_multi.json), failing when a step's loss or gradients
# differ from the one-GPU step's.
# A CACHES without root/ is taken as the root cache itself; with no CACHES, kernels.toml is
# built first (needs the build extra). OUT=DIR writes the logs there (gpu-suite.log, .xml,
# layout_ab.*, examples_parity.*). Where torch sees the GPU, benchmarks/torch_calls.py runs
# after the suite on the root cache (torch_calls.json, torch_calls.log in OUT). TUNE_BENCH=1
# also runs benchmarks/tune.py after the suite on tune/ and examples/ (tune.json, tune.md,
# tune.log in OUT; about 4-6 minutes on an H100).
# Exits non-zero when the suite or a comparison fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
# The tests start fresh interpreters (a packed wheel's, a second process): they import
# this checkout's cutecc whether or not it is installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOGS="${OUT:-}"
[ -z "$LOGS" ] || mkdir -p "$LOGS"
log() {  # stdin to the terminal, and to $OUT/$1 when OUT is set
  if [ -n "$LOGS" ]; then tee "$LOGS/$1"; else cat; fi
}
CACHES="${1:-}"
[ $# -eq 0 ] || shift
from() {  # VAR SUBDIR: VAR from CACHES/SUBDIR when it is there and VAR is not set
  if [ -z "${!1:-}" ] && [ -n "$CACHES" ] && [ -d "$CACHES/$2" ]; then export "$1=$(cd "$CACHES/$2" && pwd)"; fi
}
if [ -n "$CACHES" ] && [ ! -d "$CACHES/root" ]; then export CUTECC_TEST_CACHE="$CACHES"; CACHES=""; fi
from CUTECC_TEST_CACHE root
from CUTECC_FAULT_CACHE faults
from CUTECC_FAULT_TUNE_CACHE faults
from CUTECC_LAYOUT_CACHE layouts
from CUTECC_TRAIN_CACHE train
from CUTECC_FORMS_CACHE forms
from CUTECC_FIRST_KERNEL_CACHE first_kernel
from CUTECC_QUICKSTART_CACHE quickstart/cache
from CUTECC_ARCH_CACHE archs
from CUTECC_TUNE_CACHE tune
from CUTECC_PROJECTS_CACHE projects
from CUTECC_EXAMPLES_CACHE examples
from CUTECC_GEMM_CACHE gemm
if [ -z "${CUTECC_TEST_CACHE:-}" ]; then
  CUTECC_TEST_CACHE="$(mktemp -d)"
  export CUTECC_TEST_CACHE
  "$PY" -m cutecc.cli build kernels.toml --cache-dir "$CUTECC_TEST_CACHE" || exit 1
fi
for v in CUTECC_FAULT_CACHE CUTECC_LAYOUT_CACHE CUTECC_TRAIN_CACHE CUTECC_FORMS_CACHE CUTECC_TUNE_CACHE CUTECC_EXAMPLES_CACHE \
         CUTECC_GEMM_CACHE CUTECC_ARCH_CACHE CUTECC_FIRST_KERNEL_CACHE CUTECC_QUICKSTART_CACHE \
         CUTECC_PROJECTS_CACHE; do
  [ -n "${!v:-}" ] || echo "note: no $v: the tests that need it will skip" >&2
done
"$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | log jax.txt
junit=()
[ -z "$LOGS" ] || junit=(--junitxml "$LOGS/gpu-suite.xml")
"$PY" -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider "${junit[@]}" "$@" 2>&1 | log gpu-suite.log
rc=${PIPESTATUS[0]}
json() { [ -z "$LOGS" ] || echo --json "$LOGS/$1"; }
if [ -n "$CACHES" ] && [ -d "$CACHES/layout_ab" ]; then
  # shellcheck disable=SC2046
  "$PY" benchmarks/layout_ab.py run "$CACHES/layout_ab" $(json layout_ab.json) 2>&1 | log layout_ab.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ -n "$CACHES" ] && [ -d "$CACHES/examples-direct" ] && [ -n "${CUTECC_EXAMPLES_CACHE:-}" ]; then
  # shellcheck disable=SC2046
  "$PY" benchmarks/examples_parity.py device "$CUTECC_EXAMPLES_CACHE" "$CACHES/examples-direct" \
    $(json examples_parity.json) 2>&1 | log examples_parity.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ -n "$CACHES" ] && [ -d "$CACHES/fa4_bwd_inout" ] && [ -n "${CUTECC_EXAMPLES_CACHE:-}" ]; then
  # shellcheck disable=SC2046
  "$PY" benchmarks/composite_copy.py device "$CUTECC_EXAMPLES_CACHE" "$CACHES/fa4_bwd_inout" \
    $(json composite_copy.json) 2>&1 | log composite_copy.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ -n "${CUTECC_FIRST_KERNEL_CACHE:-}" ]; then
  # shellcheck disable=SC2046
  "$PY" benchmarks/first_kernel.py "$CUTECC_FIRST_KERNEL_CACHE" $(json first_kernel.json) 2>&1 \
    | log first_kernel.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ -n "${CUTECC_LAYOUT_CACHE:-}" ]; then
  # an op passed as the object against its import reference's text and XLA's x + y
  # shellcheck disable=SC2046
  "$PY" benchmarks/object_call.py "$CUTECC_LAYOUT_CACHE" $(json object_call.json) 2>&1 | log object_call.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ -n "${CUTECC_EXAMPLES_CACHE:-}" ]; then
  # shellcheck disable=SC2046
  "$PY" benchmarks/training_step.py "$CUTECC_EXAMPLES_CACHE" $(json training_step.json) 2>&1 \
    | log training_step.log
  if [ "$("$PY" -c 'import jax; print(len(jax.devices("gpu")))' 2>/dev/null || echo 0)" -ge 2 ]; then
    # the same step data-parallel and FSDP on 1, 2 and 4 GPUs, checked against one GPU's
    # shellcheck disable=SC2046
    "$PY" benchmarks/training_step_multi.py "$CUTECC_EXAMPLES_CACHE" $(json training_step_multi.json) \
      2>&1 | log training_step_multi.log
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  fi
fi
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  # cutecc.torch's call costs against torch's own ops and the JAX path (~1 minute)
  # shellcheck disable=SC2046
  "$PY" benchmarks/torch_calls.py "$CUTECC_TEST_CACHE" $(json torch_calls.json) 2>&1 | log torch_calls.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "${TUNE_BENCH:-}" = "1" ] && [ -n "${CUTECC_TUNE_CACHE:-}${CUTECC_EXAMPLES_CACHE:-}" ]; then
  targs=()
  [ -z "${CUTECC_TUNE_CACHE:-}" ] || targs+=(--cache-dir "$CUTECC_TUNE_CACHE")
  [ -z "${CUTECC_EXAMPLES_CACHE:-}" ] || targs+=(--examples-cache "$CUTECC_EXAMPLES_CACHE")
  [ -z "$LOGS" ] || targs+=(--json "$LOGS/tune.json" --markdown "$LOGS/tune.md")
  "$PY" -m benchmarks.tune "${targs[@]}" 2>&1 | log tune.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
exit "$rc"
