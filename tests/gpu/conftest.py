"""GPU tests: skipped cleanly on a machine where JAX sees no CUDA GPU."""

from __future__ import annotations

import pytest


def _has_gpu() -> bool:
    try:
        import jax

        return bool(jax.devices("gpu"))
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible to JAX")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
