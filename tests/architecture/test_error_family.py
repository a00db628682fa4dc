"""One road to an exit code: the error's class decides it (`CuteccError.exit_code`: 2 for
bad input, 1 for failures at work and for kernel calls), so no raise in the package passes
`exit_code=` by hand, to any class of the family. The source is read for that; the
classes are imported for their codes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cutecc.errors import CallError, CallTypeError, CuteccError, InputError, NoBuildFits, WorkError
from cutecc.lock.signing import SignatureError
from cutecc.trust import Untrusted

ROOT = Path(__file__).resolve().parents[2] / "cutecc"


def _calls_with_exit_code(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and any(k.arg == "exit_code" for k in n.keywords)]


def test_no_error_is_given_an_exit_code() -> None:
    found = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = str(f.relative_to(ROOT.parent))
        found += [f"{rel}:{n}" for n in _calls_with_exit_code(ast.parse(f.read_text(), rel))]
    assert found == [], f"an error given exit_code=...: raise the class of that code instead: {found}"


def test_the_check_sees_one() -> None:
    src = ("raise CuteccError('x', where='y', exit_code=1)\nraise WorkError('x')\n"
           "raise errors.CallError('z', exit_code=1)\n")
    assert _calls_with_exit_code(ast.parse(src)) == [1, 3]


@pytest.mark.parametrize(("cls", "code"), [
    (CuteccError, 2), (InputError, 2), (WorkError, 1), (CallError, 1), (NoBuildFits, 1),
    (CallTypeError, 1), (Untrusted, 1), (SignatureError, 1)])
def test_the_class_decides_the_code(cls: type[CuteccError], code: int) -> None:
    err = cls("why", "where") if cls is Untrusted else cls("why", where="where")
    assert err.exit_code == code
    with pytest.raises(TypeError):
        cls("why", where="w", exit_code=code)  # type: ignore[call-arg]
