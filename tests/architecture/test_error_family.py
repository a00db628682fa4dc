"""One road to an exit code: a failure at work raises `WorkError` (exit 1), bad input
`InputError` or `CuteccError` (exit 2); no module passes `exit_code=` to `CuteccError`
itself (`cutecc/errors.py`). Read from the source, never by importing it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"


def _calls_with_exit_code(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "CuteccError"
            and any(k.arg == "exit_code" for k in n.keywords)]


def test_no_cuteccerror_is_given_an_exit_code() -> None:
    found = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = str(f.relative_to(ROOT.parent))
        found += [f"{rel}:{n}" for n in _calls_with_exit_code(ast.parse(f.read_text(), rel))]
    assert found == [], f"CuteccError(..., exit_code=...): raise WorkError (exit 1) instead: {found}"


def test_the_check_sees_one() -> None:
    src = "raise CuteccError('x', where='y', exit_code=1)\nraise WorkError('x')\nraise CuteccError('z')\n"
    assert _calls_with_exit_code(ast.parse(src)) == [1]
