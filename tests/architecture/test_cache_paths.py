"""An entry's `meta.json` path has one road: `cutecc/store/layout.py` (`Layout.entry_meta`,
`Layout.runtime_meta`, `meta_file`, `meta_parts`).

Read from the source (never by importing it): no module outside `cutecc/store/` joins
`META` (or "meta.json") onto a path by hand, with `/`, `os.path.join` or as the last of a
tuple of parts (`(*parts, META)`, what `cutecc.trust.read_file` takes). Comparing a file
name with `META`, or naming it in a message, is no path and stays allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"
EXEMPT = ("cutecc/store/",)


def _is_meta(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "META") or (
        isinstance(node, ast.Attribute) and node.attr == "META") or (
        isinstance(node, ast.Constant) and node.value == "meta.json")


def _joins(tree: ast.AST) -> list[int]:
    """The lines where `META` is joined onto a path or appended to a tuple of parts."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_meta(node.right):
            out.append(node.lineno)
        elif isinstance(node, ast.Call) and any(_is_meta(a) for a in node.args[1:]):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "join" and isinstance(f.value, ast.Attribute) \
                    and f.value.attr == "path":
                out.append(node.lineno)
        elif isinstance(node, ast.Tuple) and len(node.elts) > 1 and _is_meta(node.elts[-1]):
            out.append(node.lineno)
    return out


def test_no_meta_json_path_is_joined_outside_the_store() -> None:
    found = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = str(f.relative_to(ROOT.parent))
        if rel.startswith(EXEMPT):
            continue
        found += [f"{rel}:{n}" for n in _joins(ast.parse(f.read_text(), rel))]
    assert found == [], ("meta.json paths joined by hand (use cutecc/store/layout.py: "
                         f"Layout.entry_meta, Layout.runtime_meta, meta_file, meta_parts): {found}")


def test_the_check_sees_each_way_of_joining() -> None:
    src = ("a = d / META\nb = (*parts, META)\nc = os.path.join(d, 'meta.json')\n"
           "ok = name == META\nalso = f'{d}: no {META}'\n")
    assert sorted(_joins(ast.parse(src))) == [1, 2, 3]
