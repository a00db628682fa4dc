"""docs/architecture.md stays true: its package tree names every module under cutecc/ and
nothing that does not exist, and its cache layout is the one `cutecc/store/layout.py`
documents (and every area the layout knows appears in it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cutecc.store import layout

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"


def _block(heading: str) -> list[str]:
    """The lines of the first ```text block under `## heading`."""
    text = DOC.read_text()
    section = text[text.index(f"## {heading}\n"):]
    m = re.search(r"```text\n(.*?)\n```", section, re.S)
    assert m, f"no text block under {heading}"
    return m.group(1).split("\n")


def tree_paths() -> list[str]:
    """The paths the package tree names (two spaces of indent per level; a directory ends in /)."""
    stack: list[str] = []
    out = []
    for line in _block("Package tree"):
        if not line.strip():
            continue
        indent = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        del stack[indent:]
        path = "/".join([*stack, name.rstrip("/")])
        out.append(path)
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
    return out


def test_the_tree_names_every_module_and_only_what_exists() -> None:
    named = tree_paths()
    assert len(named) == len(set(named)), "a path is named twice"
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert missing == []
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "cutecc").rglob("*.py"))
    unnamed = sorted(set(modules) - set(named))
    assert unnamed == [], f"modules docs/architecture.md does not name: {unnamed}"
    packages = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "cutecc").rglob("__init__.py"))
    assert set(packages) <= set(named)


def test_every_line_of_the_tree_says_what_the_module_owns() -> None:
    lines = [x for x in _block("Package tree") if x.strip() and not x.strip().endswith("/")]
    assert all(len(x.split(None, 1)) == 2 for x in lines), [x for x in lines if len(x.split()) < 2]


def test_the_cache_layout_is_layout_pys() -> None:
    doc = ast.get_docstring(ast.parse((REPO / "cutecc" / "store" / "layout.py").read_text()))
    assert doc is not None
    block = _block("The cache layout")
    assert "\n".join(f"    {x}" for x in block) in doc
    tops = {x.split()[0].split("/")[0].rstrip(",") for x in block if x and not x.startswith(" ")}
    tops |= {"CACHEDIR.TAG"}  # named on README's line
    assert set(layout.AREAS) <= tops, sorted(set(layout.AREAS) - tops)
