"""A composite kernel's definition as a lock pins it: its launches, inputs and outputs by name.

A composite (`[kernel.NAME] launches = [..]`) has no entry of its own: its launches are
kernels with theirs. What it adds is how their tensors flow (which names each launch
takes, which it writes, which the call returns), and that decides what a call runs, so a
lock that serves a composite carries it as a line (`CompositeLine`, versioned, signed
with the rest of the lock) and the runtime under a lock believes only that line, never the
cache's own record. A line is refused unless each launch is a kernel whose entries the
same lock pins (`Lock.loads`), and before a build or a pack vouches for it, unless its
tensors flow through the launches' contracts (`flow_problem`). Imports neither JAX nor
the build side.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cutecc.entry.rules import is_kernel_name
from cutecc.errors import CuteccError

COMPOSITE_FORMAT = 1
MAX_LAUNCHES = 64  # FA4's backward has three
MAX_TENSORS = 256
_TENSOR = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_FIELDS = ("format", "name", "launches", "inputs", "outputs")


@dataclass(frozen=True)
class CompositeLine:
    """One composite: `launches` run in order, each taking its arrays by name from the
    call's `inputs` and the results of earlier launches; `outputs` are returned."""

    name: str
    launches: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"format": COMPOSITE_FORMAT, "name": self.name, "launches": list(self.launches),
                "inputs": list(self.inputs), "outputs": list(self.outputs)}

    @classmethod
    def from_json(cls, d: Any, where: str, kp: str) -> CompositeLine:
        """A line read from a lock or a cache record: every field checked (CuteccError)."""
        if not isinstance(d, dict) or set(d) != set(_FIELDS):
            raise CuteccError(f"expected the fields {', '.join(_FIELDS)}", where=where, key_path=kp)
        if d["format"] != COMPOSITE_FORMAT:
            raise CuteccError(f"composite format {d['format']!r}, this cutecc reads {COMPOSITE_FORMAT}",
                              where=where, key_path=f"{kp}.format")
        if not is_kernel_name(d["name"]):
            raise CuteccError("name is not a kernel name", where=where, key_path=f"{kp}.name")
        out = {}
        for field, cap, ok in (("launches", MAX_LAUNCHES, is_kernel_name),
                               ("inputs", MAX_TENSORS, _is_tensor),
                               ("outputs", MAX_TENSORS, _is_tensor)):
            v = d[field]
            if not isinstance(v, list) or not 0 < len(v) <= cap or not all(ok(x) for x in v):
                raise CuteccError(f"{field} must be a non-empty list of at most {cap} names",
                                  where=where, key_path=f"{kp}.{field}")
            if len(set(v)) != len(v):
                raise CuteccError(f"{field} names something twice", where=where, key_path=f"{kp}.{field}")
            out[field] = tuple(v)
        if d["name"] in out["launches"]:
            raise CuteccError("a composite cannot launch itself", where=where, key_path=f"{kp}.launches")
        return cls(d["name"], out["launches"], out["inputs"], out["outputs"])

    @classmethod
    def from_record(cls, doc: Mapping[str, Any], where: str) -> CompositeLine:
        """The line of a cache record (`composites/NAME.json`: these fields and others)."""
        return cls.from_json({"format": COMPOSITE_FORMAT, **{k: doc.get(k) for k in _FIELDS[1:]}},
                             where, "composite")


def _is_tensor(x: object) -> bool:
    return isinstance(x, str) and _TENSOR.fullmatch(x) is not None


def flow_problem(c: CompositeLine, launches: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
                 ) -> str | None:
    """Why `c`'s tensors do not flow through its launches, or None: `launches` gives each
    launch kernel's (input names, result names) from its contract. Each launch input must
    be a composite input or an earlier launch's result, each composite input taken by some
    launch, and each output some launch's result (a composite input too, once a launch has
    written it in place)."""
    have = set(c.inputs)
    taken: set[str] = set()
    written: set[str] = set()
    for ln in c.launches:
        if ln not in launches:
            return f'launch "{ln}" has no contract here'
        ins, results = launches[ln]
        for n in ins:
            if n not in have:
                return (f'launch "{ln}" takes "{n}", which is no input of the composite and no '
                        "result of an earlier launch")
            taken.add(n)
        have |= set(results)
        written |= set(results)
    unused = [n for n in c.inputs if n not in taken]
    if unused:
        return f'input "{unused[0]}" is taken by no launch'
    missing = [n for n in c.outputs if n not in written]
    return f'output "{missing[0]}" is no launch result' if missing else None
