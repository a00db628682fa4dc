"""No module under `cutecc/` passes 600 lines: one that grows past it is split by concept
into modules of the same folder (the same layer), each named for what it holds, and each
named in docs/architecture.md's package tree."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"
MAX_LINES = 600


def test_no_module_passes_600_lines() -> None:
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert sizes, f"no module found under {ROOT}"
    over = sorted((n, path) for path, n in sizes.items() if n > MAX_LINES)
    assert over == [], (f"modules over {MAX_LINES} lines (split each by concept, in its folder): "
                        + ", ".join(f"{path} ({n})" for n, path in over))
