"""The element types a contract may name, and their spellings on each side.

Kept free of imports of the DSL and of JAX: the manifest validator and the key use
the names only; the compiler maps them to `cutlass` types, the runtime to numpy dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str        # manifest spelling, also numpy/ml_dtypes name
    cutlass: str     # attribute of the `cutlass` module
    bits: int
    is_float: bool


_ALL = [
    DType("float64", "Float64", 64, True),
    DType("float32", "Float32", 32, True),
    DType("float16", "Float16", 16, True),
    DType("bfloat16", "BFloat16", 16, True),
    DType("float8_e4m3fn", "Float8E4M3FN", 8, True),
    DType("float8_e5m2", "Float8E5M2", 8, True),
    DType("int64", "Int64", 64, False),
    DType("int32", "Int32", 32, False),
    DType("int16", "Int16", 16, False),
    DType("int8", "Int8", 8, False),
    DType("uint64", "Uint64", 64, False),
    DType("uint32", "Uint32", 32, False),
    DType("uint16", "Uint16", 16, False),
    DType("uint8", "Uint8", 8, False),
    DType("bool", "Boolean", 8, False),
]

DTYPES: dict[str, DType] = {d.name: d for d in _ALL}
ALIASES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
           "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
           "u64": "uint64", "u32": "uint32", "u16": "uint16", "u8": "uint8"}

# Runtime scalars travel as XLA FFI attributes, which carry these types.
SCALAR_DTYPES = ("float32", "float64", "int32", "int64", "bool")


def canonical(name: str) -> str | None:
    """The canonical dtype name for a manifest spelling, or None if unknown."""
    name = ALIASES.get(name, name)
    return name if name in DTYPES else None
