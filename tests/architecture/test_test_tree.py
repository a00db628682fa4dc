"""The test tree hides no real package: pytest puts `tests/` on `sys.path` (its folders
are packages of a rootless tree), so a folder there named like an installed top-level
module (`tests/torch/`) would be what `import torch` finds, in the tests and in every
build worker they start, and a test that should skip without torch would run against it."""

from __future__ import annotations

import importlib.metadata as md
import sys

from helpers import REPO

# What the suite imports or skips on, installed or not on this machine.
KNOWN = {"torch", "jax", "jaxlib", "cutlass", "quack", "flash_attn", "triton", "ray", "obstore",
         "cryptography", "numpy", "tvm_ffi", "jax_tvm_ffi", "cuda", "click", "filelock",
         "platformdirs", "pytest", "hypothesis", "cutecc", "kernels", "examples", "benchmarks"}


def test_no_test_folder_is_named_like_an_importable_package() -> None:
    folders = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    installed = set(md.packages_distributions())
    clash = folders & (KNOWN | installed | set(sys.stdlib_module_names))
    assert not clash, f"tests/ folders that shadow a real module on sys.path: {sorted(clash)}"


def test_every_test_folder_is_a_package() -> None:
    """A folder without `__init__.py` is a namespace package under its bare name."""
    for p in (REPO / "tests").iterdir():
        if p.is_dir() and any(p.glob("test_*.py")):
            assert (p / "__init__.py").is_file(), f"{p.relative_to(REPO)} has no __init__.py"
