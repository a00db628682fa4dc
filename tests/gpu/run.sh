#!/usr/bin/env bash
# The GPU suite, on any machine with a CUDA GPU:
#   bash tests/gpu/run.sh [CACHE_DIR] [pytest args...]
# With no CACHE_DIR it builds kernels.toml first (needs the build extra); on a deploy-like
# machine without the DSL, build elsewhere and pass the cache directory.
# Optional, each prepared on a build host when the DSL is not here:
#   CUTECC_FAULT_CACHE=DIR  tests/gpu/faulty_kernels/kernels.toml built into DIR (the fault tests)
#   CUTECC_LAYOUT_AB=DIR    `python benchmarks/layout_ab.py prepare DIR` done: after the suite, a
#                           kernel's time in the old layout against the new, in one process
#   OUT=DIR                 logs written there: gpu-suite.log, gpu-suite.xml (JUnit),
#                           layout_ab.log, layout_ab.json
# Exits non-zero when the suite or the layout comparison fails.
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
CACHE="${1:-${CUTECC_TEST_CACHE:-}}"
shift || true
if [ -z "$CACHE" ]; then
  CACHE="$(mktemp -d)"
  "$PY" -m cutecc.cli build kernels.toml --cache-dir "$CACHE" || exit 1
fi
if [ -z "${CUTECC_FAULT_CACHE:-}" ] && ! "$PY" -c 'import cutlass' 2>/dev/null; then
  echo "note: no CUTECC_FAULT_CACHE and no DSL here: the fault tests will skip" >&2
fi
"$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | log jax.txt
junit=() ab_json=()
[ -z "$LOGS" ] || { junit=(--junitxml "$LOGS/gpu-suite.xml"); ab_json=(--json "$LOGS/layout_ab.json"); }
CUTECC_TEST_CACHE="$CACHE" "$PY" -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider \
  "${junit[@]}" "$@" 2>&1 | log gpu-suite.log
rc=${PIPESTATUS[0]}
if [ -n "${CUTECC_LAYOUT_AB:-}" ]; then
  "$PY" benchmarks/layout_ab.py run "$CUTECC_LAYOUT_AB" "${ab_json[@]}" 2>&1 | log layout_ab.log
  ab=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] || rc=$ab
fi
exit "$rc"
