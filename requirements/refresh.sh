#!/usr/bin/env bash
# Refresh, on purpose, the pinned build environments and the kernel locks they decide.
#
# requirements/build.txt (the README's install: cutecc[build,test]) and
# requirements/examples.txt (the same plus the examples extra) pin every distribution of
# the build and test environments, with hashes. Every installed distribution a kernel's
# code reaches is a key input (cutecc/dists.py), so the committed locks reproduce only in
# exactly these environments; this script re-resolves them with uv (`uv pip compile`:
# one resolver for both files, hashes for every wheel of each pinned version), installs
# each into a fresh venv, and rebuilds the four committed locks there. Review and commit
# the pins and the locks together.
#
#   bash requirements/refresh.sh            # newest releases allowed by pyproject.toml
#   bash requirements/refresh.sh --pins-only
set -euo pipefail
cd "$(dirname "$0")/.."

UV="${UV:-}"
if [ -z "$UV" ]; then
  if [ -x .venv/bin/uv ]; then UV=.venv/bin/uv; elif command -v uv >/dev/null; then UV=uv; else
    python3 -m venv .venv-uv && .venv-uv/bin/pip install -q uv && UV=.venv-uv/bin/uv
  fi
fi
# The build hosts run CPython 3.11 on x86-64 (manylinux_2_28); torch's CPU wheel comes
# from the local find-links directory pip is configured with, where there is one.
FIND_LINKS=()
[ -d /opt/wheels ] && FIND_LINKS=(--find-links /opt/wheels)
COMMON=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header
        --upgrade)
"$UV" pip compile pyproject.toml requirements/install.in --extra build --extra test "${COMMON[@]}" \
  -o requirements/build.txt
"$UV" pip compile pyproject.toml requirements/install.in --extra build --extra test --extra examples \
  -c requirements/build.txt "${FIND_LINKS[@]}" "${COMMON[@]}" -o requirements/examples.txt
[ "${1:-}" = "--pins-only" ] && exit 0

rm -rf .venv
python3 -m venv .venv
.venv/bin/pip install --require-hashes -r requirements/build.txt
.venv/bin/pip install --no-deps --no-build-isolation -e .
CACHE="$(mktemp -d)"
trap 'rm -rf "$CACHE"' EXIT
.venv/bin/cutecc build --cache-dir "$CACHE"
.venv/bin/cutecc -q build kernels.toml --platform aarch64 --cache-dir "$CACHE" --lock-file kernels.aarch64.lock
.venv/bin/pip install --require-hashes -r requirements/examples.txt
.venv/bin/cutecc build examples/kernels.toml --cache-dir "$CACHE"
.venv/bin/cutecc build examples/gemm/kernels.toml --cache-dir "$CACHE"
.venv/bin/cutecc -q build examples/kernels.toml --platform aarch64 --cache-dir "$CACHE" \
  --lock-file examples/kernels.aarch64.lock
git status --short requirements kernels.lock kernels.aarch64.lock examples/kernels.lock \
  examples/kernels.aarch64.lock examples/gemm/kernels.lock
