"""Derived extents and scalars: small integer expressions over a contract's symbols.

A manifest may size an output or scratch tensor, or set a runtime scalar, by an
expression such as `round_up(s, 128) * d` or `min($hw.sm_count, ceil_div(m, 4))`. The
manifest substitutes variant parameters and hardware facts (numbers fixed at build time)
and stores the expression's canonical text in the contract; the runtime evaluates it at
call time from the call's symbol bindings. Parsing uses Python's `ast` restricted to a
few node types (never `eval`), with bounded length and size; evaluation is exact
integer arithmetic. Shared by the build and the runtime: imports neither DSL nor JAX.
"""

from __future__ import annotations

import ast
import functools
import math
import numbers
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

MAX_TEXT = 256  # characters
MAX_NODES = 64
FUNCTIONS = ("ceil_div", "round_up", "min", "max", "gcd")
_SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


class ExprError(ValueError):
    """An expression outside the grammar, or one that cannot be evaluated."""


def is_symbol(d: Any) -> bool:
    """Whether an extent names a plain symbol (bound by an input array)."""
    return isinstance(d, str) and _SYMBOL_RE.fullmatch(d) is not None


def is_derived(d: Any) -> TypeGuard[str]:
    """Whether an extent is an expression (a string that is not a plain symbol)."""
    return isinstance(d, str) and not is_symbol(d)


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> ast.expr:
    """`text` as a checked expression tree: ints, names, `+ - * // %`, unary minus,
    parentheses and calls of `ceil_div(a, b)`, `round_up(a, b)`, `min(..)`, `max(..)`,
    `gcd(..)`."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("an expression must be a non-empty string")
    if len(text) > MAX_TEXT:
        raise ExprError(f"an expression is at most {MAX_TEXT} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ExprError(f"not an expression: {text!r}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExprError(f"an expression has at most {MAX_NODES} parts")
    callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    for n in nodes:
        if id(n) not in callees:
            _check_node(n)
    return tree


def _check_node(n: ast.AST) -> None:
    if isinstance(n, ast.Constant):
        if type(n.value) is not int or n.value < 0:
            raise ExprError(f"only non-negative integer literals, got {n.value!r}")
    elif isinstance(n, ast.Name):
        if n.id in FUNCTIONS:
            raise ExprError(f'"{n.id}" is a function: call it')
    elif isinstance(n, ast.BinOp):
        if type(n.op) not in _OPS:
            raise ExprError(f"operator {type(n.op).__name__} is not allowed (+ - * // % only)")
    elif isinstance(n, ast.UnaryOp):
        if not isinstance(n.op, ast.USub):
            raise ExprError("only unary minus is allowed")
    elif isinstance(n, ast.Call):
        f = n.func.id if isinstance(n.func, ast.Name) else None  # the callee is checked here
        if f not in FUNCTIONS or n.keywords:
            raise ExprError(f"only calls of {', '.join(FUNCTIONS)} are allowed, with positional "
                            "arguments")
        want = 2 if f in ("ceil_div", "round_up") else None
        if (want and len(n.args) != want) or len(n.args) < 2:
            raise ExprError(f"{f} takes {want or 'at least 2'} arguments, got {len(n.args)}")
    elif not isinstance(n, (ast.operator, ast.unaryop, ast.Load)):
        raise ExprError(f"{type(n).__name__} is not allowed in an expression")


def names(text: str) -> tuple[str, ...]:
    """The symbols an expression reads, in order of first use."""
    return tuple(dict.fromkeys(n.id for n in ast.walk(parse(text))
                               if isinstance(n, ast.Name) and n.id not in FUNCTIONS))


def canonical(text: str) -> str:
    """One text per expression (spacing and redundant parentheses normalised): what the
    contract stores, so equal expressions key equally."""
    return ast.unparse(parse(text))


def evaluate(text: str, env: Mapping[str, Any], *, minimum: Callable[..., Any] = min,
             maximum: Callable[..., Any] = max) -> Any:
    """The expression's value with `env` binding its symbols (ints, or values that support
    the same arithmetic, e.g. JAX's symbolic dimensions with `minimum`/`maximum` given)."""
    def ev(n: ast.expr) -> Any:
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in env:
                raise ExprError(f'symbol "{n.id}" is not bound')
            return env[n.id]
        if isinstance(n, ast.UnaryOp):
            return -ev(n.operand)
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, (ast.FloorDiv, ast.Mod)) and isinstance(b, int) and b == 0:
                raise ExprError(f"division by zero in {ast.unparse(n)}")
            return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                    ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}[type(n.op)]()
        assert isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        xs = [ev(x) for x in n.args]
        f = n.func.id
        if f == "gcd":  # of numbers only: a symbolic extent (jax.export) has no gcd
            if not all(isinstance(x, numbers.Integral) for x in xs):
                raise ExprError(f"{ast.unparse(n)} needs concrete extents")
            return math.gcd(*(int(x) for x in xs))
        if f in ("ceil_div", "round_up"):
            a, b = xs
            if isinstance(b, int) and b == 0:
                raise ExprError(f"division by zero in {ast.unparse(n)}")
            q = -((-a) // b)
            return q if f == "ceil_div" else q * b
        return functools.reduce(minimum if f == "min" else maximum, xs)
    return ev(parse(text))


def substitute(text: str, ref: Callable[[str], Any]) -> str:
    """`text` with each `$name` / `$hw.fact` replaced by `ref(name)` (an int), as the
    manifest resolves variant parameters and hardware facts before storing it."""
    def sub(m: re.Match[str]) -> str:
        v = ref(m.group(1))
        if type(v) is not int:
            raise ExprError(f'"${m.group(1)}" is {v!r}, not an integer')
        return f"({v})" if v < 0 else str(v)
    return re.sub(r"\$((?:hw\.)?[A-Za-z_][A-Za-z0-9_]*)", sub, text)


def multiple_of(text: str, divisibility: Mapping[str, int]) -> int:
    """What the expression's value is always a multiple of, from its symbols' declared
    divisibility (compiled into the kernel like a symbol's: `round_up(s, 128)` is a
    multiple of 128). 1 when nothing is known."""
    def m(n: ast.expr) -> int:
        if isinstance(n, ast.Constant) and isinstance(n.value, int):  # parsing allows no other
            return n.value or 1
        if isinstance(n, ast.Name):
            return divisibility.get(n.id, 1)
        if isinstance(n, ast.UnaryOp):
            return m(n.operand)
        if isinstance(n, ast.BinOp):
            if isinstance(n.op, ast.Mult):
                return m(n.left) * m(n.right)
            if isinstance(n.op, (ast.Add, ast.Sub)):
                return math.gcd(m(n.left), m(n.right))
            return 1
        assert isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        if n.func.id == "round_up":
            b = n.args[1]
            return b.value if isinstance(b, ast.Constant) and isinstance(b.value, int) and b.value else 1
        if n.func.id in ("min", "max", "gcd"):  # gcd(8k, 4) is a multiple of gcd(8, 4)
            return functools.reduce(math.gcd, (m(x) for x in n.args))
        return 1
    return max(1, m(parse(text)))


MAX_RELATIONS = 16  # relations of one kernel's contract


def relation(text: str) -> tuple[str, str]:
    """A relation between extents, `"lhs == rhs"` (each side an expression of this grammar:
    `ls == l * 4`), as its two sides' canonical texts."""
    if not isinstance(text, str) or text.count("==") != 1:
        raise ExprError(f"a relation is two expressions joined by ==, not {text!r}")
    lhs, rhs = text.split("==")
    return canonical(lhs), canonical(rhs)


def relation_text(text: str) -> str:
    """A relation's canonical text (what the contract stores, so equal relations key equally)."""
    lhs, rhs = relation(text)
    return f"{lhs} == {rhs}"
