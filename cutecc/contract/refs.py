"""Import references a call passes as the objects they name.

A variant axis of import references (`op = [{ import = "operator:add" }, ..]`) is built,
recorded and keyed by the reference's text; a caller holds the object (`op=operator.add`,
as NVIDIA's elementwise-apply example passes its op). These functions tell the two apart
without importing anything: a reference is resolved only in a module the process has
already imported (`sys.modules`), so a call can never make the runtime run code; an object
whose module is not loaded names no reference.
"""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

# "package.module:attr[.attr]", as the manifest spells a reference (`grammar.IMPORT_RE`)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = re.compile(rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*")
_MAX_DEPTH = 32  # how deep `reference_keywords` looks into an entry's key inputs
_MISSING = object()


def loaded_target(ref: str) -> Any:
    """The object reference `ref` ("pkg.mod:attr") names, looked up in an already imported
    module only (never importing); None when it cannot be found so."""
    if not _REF.fullmatch(ref):
        return None
    module, attr = ref.split(":", 1)
    obj: Any = sys.modules.get(module)
    if obj is None:
        return None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part, _MISSING)
        except Exception:  # a module's __getattr__ may raise anything: no such target
            return None
        if obj is _MISSING:
            return None
    return obj


def names(ref: str, obj: Any) -> bool:
    """Whether `obj` is the object `ref` names (identity, among loaded modules)."""
    target = loaded_target(ref)
    return target is not None and target is obj


def ref_of(obj: Any) -> str | None:
    """The import reference that names `obj` (a function, class or enum member of a loaded
    module), checked by resolving it back; a public module's name is preferred to the private
    one that defines it (`operator:add`, not `_operator:add`). None: no reference names it."""
    module: Any
    qual: Any
    if isinstance(obj, enum.Enum):
        owner = type(obj)
        module, qual = getattr(owner, "__module__", None), f"{owner.__qualname__}.{obj.name}"
    else:
        module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qual, str) or "<" in qual:
        return None
    tried = [f"{module.lstrip('_')}:{qual}"] if module.startswith("_") else []
    for ref in (*tried, f"{module}:{qual}"):
        if names(ref, obj):
            return ref
    return None


def is_import_value(v: Any) -> bool:
    """Whether `v` is `{"import": "pkg.mod:attr"}` (a reference as a record spells it)."""
    return isinstance(v, dict) and set(v) == {"import"} and isinstance(v["import"], str) \
        and len(v["import"]) <= 200 and _REF.fullmatch(v["import"]) is not None


def _texts(v: Any, depth: int = 0) -> Iterator[str]:
    """The texts of every `{"import": ..}` (or `{"call": ..}`) value in a JSON value."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(v, Mapping):
        for m in ("import", "call"):
            if isinstance(v.get(m), str):
                yield v[m]
        for x in v.values():
            yield from _texts(x, depth + 1)
    elif isinstance(v, list):
        for x in v:
            yield from _texts(x, depth + 1)


def reference_keywords(call: Mapping[str, Any], key_inputs: Any) -> tuple[str, ...]:
    """The call keywords of an entry whose values are import references: those whose text
    its key inputs pass as `{ import = .. }` (a variant axis of references puts it there)."""
    texts = set(_texts({k: key_inputs.get(k) for k in ("factory_args", "constants", "args")}
                       if isinstance(key_inputs, Mapping) else {}))
    return tuple(k for k, v in call.items() if isinstance(v, str) and v in texts and _REF.fullmatch(v))
