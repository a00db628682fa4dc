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


# Test folders that mirror no package folder, each with why.
APART = {
    "architecture": "the package's shape: layers, homes, writes, errors, docs",
    "faults": "the fault suite: concurrency, kills, damage, full disk, bad input",
    "gpu": "the GPU suite (tests/gpu/run.sh)",
    "distributed": "what needs an S3 or a Ray server the session starts",
    "archs": "cutecc/archs.py, a top-level module",
    "platforms": "cutecc/platforms.py, a top-level module, and builds for another platform",
    "from_torch": "the PyTorch face (cutecc/torch.py, cutecc/runtime/torch/), named to hide no torch",
}


def test_test_folders_mirror_the_package_folders() -> None:
    """Every folder of cutecc/ that is a package has its test folder, and every test folder
    is a package folder's or one of APART."""
    package = {p.name for p in (REPO / "cutecc").iterdir() if (p / "__init__.py").is_file()}
    tests = {p.name for p in (REPO / "tests").iterdir()
             if p.is_dir() and not p.name.startswith((".", "_")) and any(p.rglob("test_*.py"))}
    assert sorted(package - tests) == [], "package folders without a test folder"
    assert sorted(tests - package - set(APART)) == [], "test folders that mirror no package folder"
    assert not set(APART) & package, "a folder in APART mirrors a package folder: drop it from APART"


def test_pytest_recurses_into_every_test_folder() -> None:
    """pytest's default `norecursedirs` holds `build`: pyproject.toml sets its own, which
    skips no test folder (tests/build/ among them)."""
    import fnmatch

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    skipped = [str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*")
               if p.is_dir() and any(fnmatch.fnmatch(p.name, pattern) for pattern in options["norecursedirs"])
               and any(p.rglob("test_*.py"))]
    assert "norecursedirs" in options and skipped == [], skipped
