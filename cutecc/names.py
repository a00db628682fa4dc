"""The names a manifest gives that become Python names at the runtime, and their rules.

A kernel name becomes an attribute of the loaded kernel set (`ks.rmsnorm`); a call keyword
(a variant parameter the arrays cannot tell apart) and a runtime scalar become keywords of
the kernel's call (`ks.fa(q, k, v, causal=True, softmax_scale=0.1)`). Such a name must be an
ASCII identifier of at most `MAX_NAME_CHARS` characters, not a Python keyword, not starting
with `_`, and not one of the names its object already has: `KernelSet`'s attributes for a
kernel, `KernelFn`'s attributes and the parameters of `KernelFn.__call__` for a keyword
(`self` there is "multiple values for argument 'self'"). The manifest refuses these names;
the runtime sets aside an entry read from disk that carries one.

The reserved sets are constants because the manifest side must not import JAX; a test
checks that they cover the runtime classes' real attributes and parameters. This module
imports nothing of cutecc, so both sides can use it.
"""

from __future__ import annotations

import keyword
import re

MAX_NAME_CHARS = 64
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# The public attributes of the loaded kernel set (cutecc.runtime.loader.KernelSet), and
# names kept free for it to grow mapping methods.
KERNEL_SET_RESERVED = frozenset({"arch", "disabled_safety_checks", "get", "items", "keys",
                                 "problems", "register_all", "root", "values"})
# The public attributes of a loaded kernel (cutecc.runtime.dispatch.KernelFn) and the
# parameters of its `__call__(self, *arrays, **scalars)`.
CALL_RESERVED = frozenset({"arch", "backward", "builds", "keywords", "name", "select", "tuning",
                           "unusable", "variants", "self", "arrays", "scalars", "grad", "input_names",
                           "scalar_names", "launches", "inputs", "outputs", "kw", "in_place"})


def _problem(name: object, reserved: frozenset[str], what: str) -> str | None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return (f"a {what} must be an identifier starting with a letter (names starting with _ "
                f"are reserved), not {str(name)[:40]!r}")
    if len(name) > MAX_NAME_CHARS:
        return f"{what} {name[:40]!r}... is {len(name)} characters, over the cap of {MAX_NAME_CHARS}"
    if keyword.iskeyword(name):
        return f"{what} {name!r} is a Python keyword"
    if name in reserved:
        return f"{what} {name!r} is taken by the runtime (reserved: {', '.join(sorted(reserved))})"
    return None


def kernel_name_problem(name: object) -> str | None:
    """Why `name` cannot name a kernel (an attribute of the kernel set), or None."""
    return _problem(name, KERNEL_SET_RESERVED, "kernel name")


def call_name_problem(name: object, what: str = "call keyword") -> str | None:
    """Why `name` cannot be a keyword of a kernel's call (a call keyword, a runtime
    scalar), or None."""
    return _problem(name, CALL_RESERVED, what)


RULE = (f"a name is letters, digits and _, starting with a letter, at most {MAX_NAME_CHARS} "
        "characters, not a Python keyword, and not one the runtime's objects already have")
