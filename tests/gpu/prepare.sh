#!/usr/bin/env bash
# Build, on a host with the build extra (no GPU needed), every cache the GPU suite uses,
# into CACHES (see tests/gpu/run.sh), ready to carry to a GPU machine without the DSL:
#   bash tests/gpu/prepare.sh CACHES [--examples]
# --examples also builds examples/kernels.toml (forward and backward kernels: what
# test_examples_gpu.py, test_training_gpu.py and benchmarks/training_step.py call), compiles
# its tuning candidates (FA4's space:
# `cutecc tune --compile-only`, into the same cache) and its direct-build comparison (needs
# the examples extra: quack-kernels, flash-attn-4, torch). Each entry's metadata keeps its
# compile seconds: benchmarks/tune.py reports them as the tuning's CPU cost. It also builds
# examples/gemm/kernels.toml (quack's Hopper GEMM) and its tuning candidates into CACHES/gemm,
# and FA4's backward in its old in-place form into CACHES/fa4_bwd_inout
# (benchmarks/composite_copy.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUTDIR="${1:?usage: prepare.sh CACHES [--examples]}"
PY="${PYTHON:-python3}"
cc() { "$PY" -m cutecc.cli -q "$@"; }
mkdir -p "$OUTDIR"
cc build kernels.toml --cache-dir "$OUTDIR/root" --no-lock
cc build tests/gpu/faulty_kernels/kernels.toml --cache-dir "$OUTDIR/faults" --no-lock
cc tune tests/gpu/faulty_kernels/kernels.toml --compile-only --cache-dir "$OUTDIR/faults"
cc build tests/gpu/layout_kernels/kernels.toml --cache-dir "$OUTDIR/layouts" --no-lock
cc build tests/gpu/train_kernels/kernels.toml --cache-dir "$OUTDIR/train" --no-lock
cc build tests/gpu/form_kernels/kernels.toml --cache-dir "$OUTDIR/forms" --no-lock
# the README's first project, made as the README makes it (test_readme_gpu.py)
rm -rf "$OUTDIR/quickstart" && mkdir -p "$OUTDIR/quickstart"
"$PY" -m cutecc.cli -q init "$OUTDIR/quickstart/myproject"
cc build "$OUTDIR/quickstart/myproject/kernels.toml" --cache-dir "$OUTDIR/quickstart/cache" --no-lock
# docs/first-kernel.md's kernel (test_first_kernel_gpu.py, benchmarks/first_kernel.py)
cc build examples/first_kernel/kernels.toml --cache-dir "$OUTDIR/first_kernel" --no-lock
# two projects, one kernel name, one cache (test_projects_gpu.py); each writes its kernels.lock
cc build tests/gpu/project_kernels/a/kernels.toml --cache-dir "$OUTDIR/projects"
cc build tests/gpu/project_kernels/b/kernels.toml --cache-dir "$OUTDIR/projects"
# a kernel built only for sm_100a (its fallback serves on Hopper: test_fallback_gpu.py)
cc build tests/gpu/arch_kernels/kernels.toml --cache-dir "$OUTDIR/archs" --no-lock
cc build kernels.toml --cache-dir "$OUTDIR/tune" --no-lock
cc tune kernels.toml --compile-only --cache-dir "$OUTDIR/tune"
rm -rf "$OUTDIR/layout_ab"  # its prepare step builds into fresh directories
"$PY" benchmarks/layout_ab.py prepare "$OUTDIR/layout_ab"
if [ "${2:-}" = "--examples" ]; then
  cc build examples/kernels.toml --cache-dir "$OUTDIR/examples" --no-lock
  cc tune examples/kernels.toml --compile-only --cache-dir "$OUTDIR/examples"
  "$PY" -m benchmarks.examples_parity build "$OUTDIR/examples" "$OUTDIR/examples-direct"
  # FA4's backward in its old form (dq written over dout), for benchmarks/composite_copy.py
  rm -rf "$OUTDIR/fa4_bwd_inout"
  "$PY" -m benchmarks.composite_copy build "$OUTDIR/fa4_bwd_inout"
  # quack's Hopper GEMM and its 24 tuning candidates (test_gemm_gpu.py, benchmarks/gemm_tune.py)
  cc build examples/gemm/kernels.toml --cache-dir "$OUTDIR/gemm" --no-lock
  cc tune examples/gemm/kernels.toml --compile-only --cache-dir "$OUTDIR/gemm"
fi
du -sh "$OUTDIR"/*
