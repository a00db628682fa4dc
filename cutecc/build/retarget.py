"""Retarget a kernel's host-side LLVM IR from the x86-64 build host to another platform.

The DSL compiles a kernel's host code (the TVM-FFI entry: argument checks, library load,
launch) for the machine it runs on, and refuses to cross-compile together with TVM-FFI.
Its host IR (`export_to_c` to a `.ll` file, the cubin embedded as a constant) is plain
enough to compile for aarch64 instead: no x86 intrinsics, external calls that pass only
pointers and integers, and the two platforms lay out every type it uses alike (LP64,
8-byte i64/double/pointers, 16-byte i128). `retarget` checks each of those facts on the
IR's text and refuses, naming the construct, any IR that breaks one, rather than emit a
library that would misbehave: x86 intrinsics, inline assembly, x86-only types and address
spaces, CPU attributes, and aggregates (or byval/sret/inalloca/inreg) across calls to
functions defined elsewhere, whose passing the C ABI of each platform decides differently.
"""

from __future__ import annotations

import re

from cutecc.platforms import Platform

_DATALAYOUT = re.compile(r'^target datalayout = "[^"\n]*"$', re.M)
_TRIPLE = re.compile(r'^target triple = "[^"\n]*"$', re.M)
# What the host IR must not hold, with what each is, for the error.
_REFUSED = (
    (re.compile(r"@llvm\.x86\.[\w.]+"), "an x86 intrinsic"),
    (re.compile(r"\bx86_fp80\b"), "the x86-only type x86_fp80"),
    (re.compile(r"\bx86_amx\b"), "the x86-only type x86_amx"),
    (re.compile(r"\bx86_\w+cc\b"), "an x86 calling convention"),
    (re.compile(r"\baddrspace\(27[012]\)"), "an x86-only address space"),
    (re.compile(r"\basm\s+(sideeffect\s+)?(alignstack\s+)?(inteldialect\s+)?\""), "inline assembly"),
    (re.compile(r"^module asm ", re.M), "module-level assembly"),
    (re.compile(r'"target-cpu"|"target-features"|"tune-cpu"'), "a CPU attribute"),
)
# A declared (external) function: `declare <ret> @name(<params>)`.
_DECLARE = re.compile(r"^declare\b([^@\n]*)@([\w.$]+|\"[^\"]+\")\((.*)\)", re.M)
_ABI_ATTRS = re.compile(r"\b(byval|sret|inalloca|inreg|preallocated)\b")


class RetargetError(ValueError):
    """Host IR that cannot be compiled for another platform: what and where."""


def retarget(ir: str, target: Platform, *, pinned_cpu: str | None = None,
             pinned_features: str | None = None) -> str:
    """`ir` (x86-64 host IR) for `target`: its data layout and triple replaced, after
    checking it holds nothing whose meaning differs between the platforms (RetargetError
    naming the construct and its line). `pinned_cpu` and `pinned_features`: the exact
    attribute texts the build itself set (the baseline x86-64 pin, which makes the DSL's
    optimiser the same on every build host); the CPU becomes the target's baseline one
    and the features go. Any other CPU attribute is refused."""
    pinned = [t for t in (pinned_cpu, pinned_features) if t]
    checked = ir
    for text in pinned:
        checked = checked.replace(text, "")
    for pattern, what in _REFUSED:
        m = pattern.search(checked)
        if m is not None:
            raise RetargetError(f"{what} ({_snippet(checked, m.start())})")
    for m in _DECLARE.finditer(checked):
        ret, name, params = m.group(1), m.group(2), m.group(3)
        if name.startswith("llvm."):
            continue  # intrinsics are lowered by the target, not called through the C ABI
        if _aggregate(ret) or _aggregate(params) or _ABI_ATTRS.search(ret + params):
            raise RetargetError("an aggregate passed by value to or from the external function "
                                f"@{name} ({_snippet(checked, m.start())})")
    if len(_DATALAYOUT.findall(ir)) != 1 or len(_TRIPLE.findall(ir)) != 1:
        raise RetargetError("the IR does not name exactly one data layout and target triple")
    if pinned_cpu:
        ir = ir.replace(pinned_cpu, f'"target-cpu"="{target.cpu}"')
    if pinned_features:
        ir = ir.replace(f" {pinned_features}", "").replace(pinned_features, "")
    ir = _DATALAYOUT.sub(f'target datalayout = "{target.datalayout}"', ir)
    return _TRIPLE.sub(f'target triple = "{target.triple}"', ir)


def _aggregate(text: str) -> bool:
    """Whether a declaration's types hold a struct (`{`, `%name` types) or an array (`[`)."""
    return bool(re.search(r"[{\[]|%[\w.]+\s*(?:[,)]|$)|%\"", text))


def _snippet(ir: str, at: int) -> str:
    line = ir.count("\n", 0, at) + 1
    start = ir.rfind("\n", 0, at) + 1
    end = ir.find("\n", at)
    text = ir[start: end if end >= 0 else len(ir)].strip()
    return f"line {line}: {text[:160]}"
