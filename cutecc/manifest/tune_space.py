"""A kernel's tuning space (`[kernel.NAME.tune]`), parsed and expanded.

    [kernel.mul.tune]
    params = { threads = [64, 128, 256, 512] }   # values of "$threads" in constants/factory_args
    default = { threads = 256 }                  # what `cutecc build` builds and untuned devices run
    constraints = ["threads * 4 <= 4096"]        # expressions over params and variant parameters
    buckets = { n = { pow2 = [4096, 16777216] } }  # or n = [edges...]; sizes of symbolic extents
    rule = "floor"                               # a size between edges: "floor" or "nearest"
    sizes = { m = 4096 }                         # benchmark extents of other symbolic dimensions
                                                 # (or a bucketed extent's name: the same size)
    scalars = { eps = 1e-5 }                     # benchmark values of runtime scalars
    inputs = { target = { low = 0, high = 1000 } }   # value ranges of benchmark inputs
    tolerance = { rtol = 1e-5, atol = 1e-6 }     # agreement with the default configuration

Parsing checks everything against the kernel's declared variants and contract; errors are
`CuteccError`s with the key path. Constraints are evaluated by a small interpreter over a
whitelist of expression forms (never `eval`). Imports neither the DSL nor JAX.
"""

from __future__ import annotations

import ast
import itertools
import keyword
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cutecc.contract.args import CallingConvention
from cutecc.contract.buckets import MAX_BUCKETS, MAX_EXTENT, RULES
from cutecc.errors import CuteccError

Fail = Callable[[str, str], CuteccError]
_Value = int | float | bool | str
_Axes = tuple[tuple[str, tuple[_Value, ...]], ...]
_KEYS = {"params", "default", "constraints", "buckets", "rule", "sizes", "scalars", "inputs", "tolerance"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_EDGES = 64
MAX_CONSTRAINT = 500


@dataclass(frozen=True)
class Bucketing:
    """Edges of one symbolic extent: a call's size maps to one of them (`rule`)."""

    extent: str
    edges: tuple[int, ...]


@dataclass(frozen=True)
class TuneSpec:
    params: tuple[tuple[str, tuple[_Value, ...]], ...]
    default: tuple[tuple[str, _Value], ...]
    constraints: tuple[str, ...]
    buckets: tuple[Bucketing, ...]
    rule: str
    sizes: tuple[tuple[str, int | str], ...]
    inputs: tuple[tuple[str, tuple[float, float]], ...]
    rtol: float | None = None
    atol: float | None = None
    scalars: tuple[tuple[str, int | float | bool], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.params)

    def points(self, env: dict[str, _Value]) -> list[tuple[tuple[str, _Value], ...]]:
        """Every parameter combination that satisfies the constraints under `env` (the
        variant's parameters), in declaration order."""
        out = []
        for combo in itertools.product(*(v for _, v in self.params)):
            point = tuple(zip(self.names, combo))
            if all(_eval(c, {**env, **dict(point)}) for c in self.constraints):
                out.append(point)
        return out

    def bucket_points(self) -> list[dict[str, int]]:
        """Every bucket: one edge per bucketed extent (the product, in declaration order)."""
        names = [b.extent for b in self.buckets]
        return [dict(zip(names, combo)) for combo in itertools.product(*(b.edges for b in self.buckets))]

    def to_json(self) -> dict[str, Any]:
        return {"params": {k: list(v) for k, v in self.params}, "default": dict(self.default),
                "constraints": list(self.constraints), "rule": self.rule,
                "buckets": [{"extent": b.extent, "edges": list(b.edges)} for b in self.buckets],
                "sizes": dict(self.sizes), "inputs": {k: list(v) for k, v in self.inputs},
                "rtol": self.rtol, "atol": self.atol, "scalars": dict(self.scalars)}


def parse(fail: Fail, kp: str, doc: Any, variant_params: set[str]) -> TuneSpec:
    """The `tune` table of a kernel (`kp` is its key path)."""
    if not isinstance(doc, dict):
        raise fail(kp, "must be a table (params, default, constraints, buckets, rule, sizes, scalars, "
                   "inputs, tolerance)")
    for k in doc:
        if k not in _KEYS:
            raise fail(kp, f'unknown key "{k}" (allowed: {", ".join(sorted(_KEYS))})')
    params = _params(fail, f"{kp}.params", doc.get("params"), variant_params)
    default = _default(fail, f"{kp}.default", doc.get("default"), params)
    constraints = _constraints(fail, f"{kp}.constraints", doc.get("constraints", []),
                               {n for n, _ in params} | variant_params)
    buckets = _buckets(fail, f"{kp}.buckets", doc.get("buckets"))
    rule = doc.get("rule", "floor")
    if rule not in RULES:
        raise fail(f"{kp}.rule", f'must be one of {", ".join(RULES)}, got {rule!r}')
    sizes = doc.get("sizes", {})
    if not isinstance(sizes, dict):
        raise fail(f"{kp}.sizes", "must be a table of symbol = size")
    bucketed = [b.extent for b in buckets]
    for k, v in sizes.items():
        if isinstance(v, str):
            if v not in bucketed:
                raise fail(f"{kp}.sizes.{k}", f'"{v}" is not a bucketed extent (bucketed: '
                           f'{", ".join(bucketed)}); a size is an int or a bucketed extent\'s name')
        elif type(v) is not int or not 1 <= v <= MAX_EXTENT:
            raise fail(f"{kp}.sizes.{k}", f"must be an int in 1..2^31-1 or a bucketed extent's name, "
                       f"got {v!r}")
        if k in bucketed:
            raise fail(f"{kp}.sizes.{k}", "is bucketed already")
    scalars = doc.get("scalars", {})
    if not isinstance(scalars, dict):
        raise fail(f"{kp}.scalars", "must be a table of scalar = value")
    for k, v in scalars.items():
        if not isinstance(v, (int, float, bool)):
            raise fail(f"{kp}.scalars.{k}", f"must be a number or bool, got {type(v).__name__}")
    inputs = _inputs(fail, f"{kp}.inputs", doc.get("inputs", {}))
    tol = doc.get("tolerance", {})
    if not isinstance(tol, dict) or not set(tol) <= {"rtol", "atol"}:
        raise fail(f"{kp}.tolerance", "must be a table { rtol, atol }")
    for k, v in tol.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e6:
            raise fail(f"{kp}.tolerance.{k}", f"must be a non-negative number, got {v!r}")
    spec = TuneSpec(params, default, constraints, buckets, rule, tuple(sizes.items()), inputs,
                    _f(tol.get("rtol")), _f(tol.get("atol")), tuple(scalars.items()))
    n = len(spec.bucket_points())
    if n > MAX_BUCKETS:
        raise fail(f"{kp}.buckets", f"{n} buckets, over the limit of {MAX_BUCKETS}")
    return spec


def check(fail: Fail, kp: str, spec: TuneSpec, env: dict[str, _Value], conv: CallingConvention) -> None:
    """Check the space against one variant: its default satisfies the constraints, and the
    benchmark can size and fill every input."""
    if not all(_eval(c, {**env, **dict(spec.default)}) for c in spec.constraints):
        raise fail(f"{kp}.default", "does not satisfy the constraints"
                   + (f" for variant {_pid(env)}" if env else ""))
    symbols = {s for t in conv.inputs for s in t.symbols}
    for b in spec.buckets:
        if b.extent not in symbols:
            raise fail(f"{kp}.buckets.{b.extent}", "is not a symbolic extent of any input "
                       f"(symbols: {', '.join(sorted(symbols)) or 'none'})")
    sized = {b.extent for b in spec.buckets} | {k for k, _ in spec.sizes}
    for s in sorted(symbols - sized):
        raise fail(kp, f'the symbolic extent "{s}" needs a bucket or a benchmark size (sizes.{s})')
    for s in sorted({k for k, _ in spec.sizes} - symbols):
        raise fail(f"{kp}.sizes.{s}", "is not a symbolic extent of any input")
    # A derived scalar (`value`) is computed by the runtime and never passed by a call.
    declared = {sc.name: sc for sc in conv.given}
    derived = {sc.name for sc in conv.scalars} - set(declared)
    for k, _ in spec.scalars:
        if k in derived:
            raise fail(f"{kp}.scalars.{k}", "is a derived scalar: the runtime computes it, a call "
                       "never passes it")
        if k not in declared:
            raise fail(f"{kp}.scalars.{k}", "is not a runtime scalar of the kernel (scalars: "
                       f"{', '.join(sorted(declared)) or 'none'})")
    for sc in conv.given:
        if sc.default is None and sc.name not in dict(spec.scalars):
            raise fail(kp, f'the runtime scalar "{sc.name}" has no default: give its benchmark value '
                       f"(scalars.{sc.name})")
    names = {t.name for t in conv.inputs}
    for k, _ in spec.inputs:
        if k not in names:
            raise fail(f"{kp}.inputs.{k}", f"is not an input (inputs: {', '.join(sorted(names))})")
    padded = [t for t in conv.inputs if t.padded]
    for point in spec.bucket_points() if padded else ():
        ext = benchmark_extents(point, spec.sizes)
        for t in padded:
            for i in t.padded:
                buffer = t.buffer or t.shape  # a padded tensor has a buffer
                d, e = (x if isinstance(x, int) else ext.get(x) for x in (t.shape[i], buffer[i]))
                if d is not None and e is not None and e < d:
                    where = ",".join(f"{k}={v}" for k, v in point.items())
                    raise fail(f"{kp}.sizes", f'at the bucket {where}, input "{t.name}"\'s buffer extent '
                               f"{e} (dimension {i}) is smaller than the extent {d} the kernel views in it")


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _pid(env: dict[str, _Value]) -> str:
    return ",".join(f"{k}={v}" for k, v in env.items())


def _params(fail: Fail, kp: str, v: Any, variant_params: set[str]) -> _Axes:
    if not isinstance(v, dict) or not v:
        raise fail(kp, "must be a non-empty table of parameter = [values]")
    out = []
    for k, vals in v.items():
        if not _NAME.fullmatch(k) or keyword.iskeyword(k):
            raise fail(f"{kp}.{k}", "a parameter must be an identifier")
        if k in variant_params:
            raise fail(f"{kp}.{k}", "is a variant parameter already (a tuned parameter is not a variant)")
        if not isinstance(vals, list) or not vals:
            raise fail(f"{kp}.{k}", "must be a non-empty array of values")
        for i, x in enumerate(vals):
            if not isinstance(x, (int, float, str, bool)):
                raise fail(f"{kp}.{k}[{i}]", f"must be a number, string or bool, got {type(x).__name__}")
        if len(set(map(repr, vals))) != len(vals):
            raise fail(f"{kp}.{k}", "repeats a value")
        out.append((k, tuple(vals)))
    return tuple(out)


def _default(fail: Fail, kp: str, v: Any, params: tuple[tuple[str, tuple[_Value, ...]], ...]
             ) -> tuple[tuple[str, _Value], ...]:
    if not isinstance(v, dict):
        raise fail(kp, "must be a table giving every parameter's default value (what `cutecc build` "
                   "builds)")
    out = []
    for k, vals in params:
        if k not in v:
            raise fail(kp, f'no default for "{k}"')
        if not any(type(x) is type(v[k]) and x == v[k] for x in vals):
            raise fail(f"{kp}.{k}", f"{v[k]!r} is not one of params.{k}")
        out.append((k, v[k]))
    for k in v:
        if k not in dict(params):
            raise fail(f"{kp}.{k}", "is not a tuned parameter")
    return tuple(out)


def _buckets(fail: Fail, kp: str, v: Any) -> tuple[Bucketing, ...]:
    if not isinstance(v, dict) or not v:
        raise fail(kp, "must be a non-empty table: extent = [edges] or extent = { pow2 = [lo, hi] }")
    out = []
    for k, spec in v.items():
        bp = f"{kp}.{k}"
        if isinstance(spec, dict):
            if set(spec) != {"pow2"} or not isinstance(spec["pow2"], list) or len(spec["pow2"]) != 2:
                raise fail(bp, "a table here is { pow2 = [lo, hi] } (every power of two from lo to hi)")
            lo, hi = spec["pow2"]
            for x in (lo, hi):
                if type(x) is not int or x < 1 or x & (x - 1) or x > MAX_EXTENT:
                    raise fail(f"{bp}.pow2", f"bounds must be powers of two in 1..2^30, got {x!r}")
            if lo > hi:
                raise fail(f"{bp}.pow2", "lo is above hi")
            edges = tuple(1 << e for e in range(lo.bit_length() - 1, hi.bit_length()))
        elif isinstance(spec, list):
            if not spec or not all(type(x) is int and 1 <= x <= MAX_EXTENT for x in spec):
                raise fail(bp, "edges must be a non-empty array of ints in 1..2^31-1")
            if list(spec) != sorted(set(spec)):
                raise fail(bp, "edges must be strictly ascending")
            edges = tuple(spec)
        else:
            raise fail(bp, "must be an array of edges or { pow2 = [lo, hi] }")
        if len(edges) > MAX_EDGES:
            raise fail(bp, f"{len(edges)} edges, over the limit of {MAX_EDGES}")
        out.append(Bucketing(k, edges))
    return tuple(out)


def _inputs(fail: Fail, kp: str, v: Any) -> tuple[tuple[str, tuple[float, float]], ...]:
    if not isinstance(v, dict):
        raise fail(kp, "must be a table of input = { low, high }")
    out = []
    for k, r in v.items():
        if not isinstance(r, dict) or set(r) != {"low", "high"}:
            raise fail(f"{kp}.{k}", "must be { low = L, high = H } (values drawn from [L, H))")
        lo, hi = r["low"], r["high"]
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in (lo, hi)) or not lo < hi:
            raise fail(f"{kp}.{k}", f"low < high, both numbers; got {lo!r}, {hi!r}")
        out.append((k, (lo, hi)))
    return tuple(out)


# Constraints: a whitelist interpreter over Python expression syntax ----------------------

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge}


def _constraints(fail: Fail, kp: str, v: Any, names: set[str]) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise fail(kp, "must be an array of expressions")
    for i, c in enumerate(v):
        if not isinstance(c, str) or not 0 < len(c) <= MAX_CONSTRAINT:
            raise fail(f"{kp}[{i}]", f"must be an expression string of at most {MAX_CONSTRAINT} characters")
        try:
            tree = ast.parse(c, mode="eval")
        except SyntaxError:
            raise fail(f"{kp}[{i}]", f"not an expression: {c!r}") from None
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in names:
                raise fail(f"{kp}[{i}]", f'"{node.id}" is neither a tuned nor a variant parameter')
            if not isinstance(node, _ALLOWED):
                raise fail(f"{kp}[{i}]", f"{type(node).__name__} is not allowed (use numbers, parameters, "
                           "+ - * / // %, comparisons, and/or/not)")
    return tuple(v)


_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.BinOp,
            ast.Compare, ast.Name, ast.Load, ast.Constant, *_BIN, *_CMP)


def _eval(text: str, env: dict[str, Any]) -> bool:
    try:
        return bool(_node(ast.parse(text, mode="eval").body, env))
    except (ZeroDivisionError, TypeError, OverflowError) as e:
        raise CuteccError(f"constraint {text!r} cannot be evaluated for {_pid(env)}: {e}") from None


def _node(n: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(n, ast.Constant):
        return n.value
    if isinstance(n, ast.Name):
        return env[n.id]
    if isinstance(n, ast.BoolOp):
        vals = (_node(x, env) for x in n.values)
        return all(vals) if isinstance(n.op, ast.And) else any(vals)
    if isinstance(n, ast.UnaryOp):
        v = _node(n.operand, env)
        return (not v) if isinstance(n.op, ast.Not) else -v
    if isinstance(n, ast.BinOp):
        return _BIN[type(n.op)](_node(n.left, env), _node(n.right, env))
    if isinstance(n, ast.Compare):
        left = _node(n.left, env)
        for op, right in zip(n.ops, n.comparators):
            r = _node(right, env)
            if not _CMP[type(op)](left, r):
                return False
            left = r
        return True
    raise TypeError(f"{type(n).__name__} is not allowed")


def iter_points(spec: TuneSpec, env: dict[str, _Value]) -> Iterator[tuple[tuple[str, _Value], ...]]:
    """The non-default points of the space for one variant (the default is the variant)."""
    for p in spec.points(env):
        if p != spec.default:
            yield p


def benchmark_extents(point: Mapping[str, int], sizes: Iterable[tuple[str, int | str]]) -> dict[str, int]:
    """Every symbolic extent's benchmark size at a bucket point: the point's, and `sizes`
    (an int, or the name of a bucketed extent whose size it takes)."""
    return {**point, **{n: point[v] if isinstance(v, str) else v for n, v in sizes}}
