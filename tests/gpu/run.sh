#!/usr/bin/env bash
# The GPU suite, on any machine with a CUDA GPU:
#   bash tests/gpu/run.sh [CACHE_DIR [EXAMPLES_CACHE_DIR]] [pytest args...]
# With no CACHE_DIR it builds kernels.toml first (needs the build extra); on a deploy-like
# machine without the DSL, build elsewhere and pass the cache directory.
# EXAMPLES_CACHE_DIR (or $CUTECC_EXAMPLES_CACHE): examples/kernels.toml built elsewhere
# (needs the examples extra); without it tests/gpu/test_examples_gpu.py skips.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
# The tests start fresh interpreters (a packed wheel's, a second process): they import
# this checkout's cutecc whether or not it is installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
CACHE="${1:-${CUTECC_TEST_CACHE:-}}"
shift || true
EXAMPLES="${CUTECC_EXAMPLES_CACHE:-}"
if [ $# -gt 0 ] && [ -d "$1" ]; then
  EXAMPLES="$1"
  shift
fi
if [ -z "$CACHE" ]; then
  CACHE="$(mktemp -d)"
  "$PY" -m cutecc.cli build kernels.toml --cache-dir "$CACHE"
fi
"$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
CUTECC_TEST_CACHE="$CACHE" CUTECC_EXAMPLES_CACHE="$EXAMPLES" exec "$PY" -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider "$@"
