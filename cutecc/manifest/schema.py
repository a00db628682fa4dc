"""The JSON Schema of `kernels.toml`, for editors (taplo, SchemaStore) to complete and check.

The schema is a guide; `cutecc.manifest.parse` (with the modules it calls) stays the one validator (it
also checks what a schema cannot say: shared symbolic extents, backward pairings, `$param` references).
"""

from __future__ import annotations

import json
import keyword
from typing import Any

from cutecc.archs import PATTERN as ARCH_PATTERN
from cutecc.contract import dtypes
from cutecc.contract.args import LAYOUTS, ROLES
from cutecc.manifest.grammar import (
    BUILTIN_PROFILES,
    ENTRY_RE,
    IMPORT_RE,
    MANIFEST_FORMAT,
    MAX_ALIGN,
    MAX_DIVISIBILITY,
    RESERVED_KERNEL_NAMES,
)
from cutecc.names import CALL_RESERVED, MAX_NAME_CHARS
from cutecc.platforms import PLATFORMS

SCHEMA_ID = "https://cutecc.dev/schemas/kernels.schema.json"
_PARAM = {"type": "string", "pattern": r"^\$[A-Za-z_][A-Za-z0-9_.]*$",
          "description": "A variant parameter ($p) or hardware profile fact ($hw.sm_count)."}
_VALUE = {"oneOf": [{"type": ["integer", "number", "boolean", "string", "array"]},
                    {"type": "object", "description": "A typed value: one of dtype, dsl (+value), "
                     "import, call (+args, kwargs), none.",
                     "minProperties": 1}]}
_KW = {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$",
       "description": "Pass this argument by keyword; parameters not declared keep their defaults."}


def _runtime_name(reserved: frozenset[str], what: str) -> dict[str, Any]:
    """A name the runtime exposes (cutecc.names): a kernel set's attribute, a call's keyword."""
    return {"type": "string", "pattern": r"^[A-Za-z][A-Za-z0-9_]*$", "maxLength": MAX_NAME_CHARS,
            "not": {"enum": sorted(reserved | set(keyword.kwlist))},
            "description": f"{what}: starts with a letter, at most {MAX_NAME_CHARS} characters, not "
                           "a Python keyword nor a name the runtime's object already has."}


def _dtype() -> dict[str, Any]:
    names = sorted([*dtypes.DTYPES, *dtypes.ALIASES])
    return {"anyOf": [{"enum": names}, _PARAM]}


def schema() -> dict[str, Any]:
    """The schema as a JSON-able dict (draft 2020-12)."""
    archs = {"type": "array", "minItems": 1, "uniqueItems": True,
             "items": {"type": "string", "pattern": f"^({ARCH_PATTERN})$", "not": {"pattern": r"\s"}},
             "description": "Target GPU architectures, e.g. [\"sm_90a\"]; \"compute_80\" is portable PTX."}
    extent = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                        {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"}, _PARAM]}
    derived = {"type": "string", "minLength": 1, "maxLength": 256,
               "description": "A derived extent (outputs and scratch): an expression over symbols, "
                              "$param and $hw.fact: ints, + - * // %, ceil_div, round_up, min, max."}
    tensor = {
        "type": "object", "additionalProperties": False, "required": ["name", "dtype", "shape"],
        "properties": {
            "kind": {"const": "tensor"},
            "name": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
            "role": {"enum": list(ROLES), "default": "input"},
            "dtype": _dtype(),
            "shape": {"type": "array", "items": {"anyOf": [extent, derived]},
                      "description": "Ints are static extents, names symbolic (shared name: equal); "
                                     "an output's or scratch's extent may be an expression."},
            "zero": {"type": "boolean", "description": "A scratch tensor the runtime hands over zeroed."},
            "saved": {"type": "boolean", "description": "An output saved for the backward (a residual), "
                                                        "not returned to the caller."},
            "broadcast": {"type": "array", "items": {"type": "integer", "minimum": 0},
                          "description": "Input dimensions the kernel sees with stride 0; the array "
                                         "passed has extent 1 there."},
            "reduce": {"enum": ["sum"], "description": "The call returns this output summed over its "
                                                       "leading axis (per-SM partials)."},
            "may_alias": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$",
                          "description": "An output the kernel may write in the memory of this input "
                                         "(same dtype, shape, layout): it reads each element before "
                                         "writing it. `kernel.in_place(...)` then lets XLA reuse the "
                                         "input's buffer where it is dead."},
            "extents_only": {"type": "boolean",
                             "description": "An input the call passes only so that its extents bind an "
                                            "output's shape; the launcher never receives it (FA4's "
                                            "backward postprocess sizes dq by q). Top level, no param, "
                                            "buffer, broadcast or present."},
            "buffer": {"type": "array", "items": extent,
                       "description": "A padded input/inout: the shape of the array passed (same rank, "
                                      "logical order); the kernel sees `shape` at its origin with the "
                                      "buffer's strides (a leading dimension, as BLAS's lda)."},
            "layout": {"anyOf": [{"enum": list(LAYOUTS)},
                                 {"type": "array", "items": {"type": "integer", "minimum": 0}}],
                       "description": "The buffer the kernel sees: row-major (default), column-major, "
                                      "or a stride order per dimension (0 = stride 1)."},
            "mode": {"type": "array", "items": {"type": "integer", "minimum": 0},
                     "description": "cutlass_call's mode (instead of layout): the kernel's dimension i "
                                    "is dimension mode[i] of the row-major array the caller holds, a "
                                    "view with no copy; the call takes and returns arrays as held."},
            "stride": {"type": "array", "items": {"anyOf": [{"type": "integer", "minimum": 0},
                                                            {"type": "string"}]},
                       "description": "The stride the kernel is compiled with, per dimension: an int "
                                      "(static) or a symbol (a runtime value; facts in symbols)."},
            "runtime": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1,
                        "description": "Dimensions (of an output or scratch) whose derived extent is "
                                       "compiled as a runtime value even where it reads no symbol."},
            "align": {"oneOf": [{"enum": [1 << i for i in range(MAX_ALIGN.bit_length())]},
                                {"type": "string", "pattern": r"^\$[A-Za-z_][A-Za-z0-9_]*$"}],
                      "description": "Pointer alignment in bytes (or a \"$param\")."},
            "present": {"anyOf": [{"type": "boolean"}, _PARAM],
                        "description": "An optional input: a bool variant axis (\"$varlen\") whose "
                                       "false variants are built with None in its slot; a call "
                                       "passes None there, or leaves it out, to reach them."},
            "param": _KW,
        },
    }
    scalar = {
        "type": "object", "additionalProperties": False, "required": ["kind", "name", "dtype"],
        "properties": {"kind": {"const": "scalar"},
                       "name": _runtime_name(CALL_RESERVED, "A keyword of the kernel's call"),
                       "dtype": {"anyOf": [{"enum": list(dtypes.SCALAR_DTYPES)}, _PARAM]},
                       "default": {"type": ["integer", "number", "boolean"]}, "param": _KW,
                       "value": {"type": ["integer", "string"],
                                 "description": "A derived scalar (int32/int64): an int, $hw.fact or an "
                                                "expression over symbols; the runtime computes and passes "
                                                "it, the call does not."}},
    }
    none = {"type": "object", "additionalProperties": False, "required": ["kind"],
            "properties": {"kind": {"const": "none"}, "param": _KW}}
    stream = {"type": "object", "additionalProperties": False, "required": ["kind"],
              "properties": {"kind": {"const": "stream"}, "param": _KW}}
    tup = {"type": "object", "additionalProperties": False, "required": ["kind", "items"],
           "properties": {"kind": {"const": "tuple"}, "param": _KW,
                          "items": {"type": "array", "items": {"$ref": "#/$defs/arg"}}}}
    const = {"type": "object", "additionalProperties": False, "required": ["kind", "value"],
             "properties": {"kind": {"const": "const"}, "value": _VALUE, "param": _KW}}
    struct = {"type": "object", "additionalProperties": False, "required": ["kind", "type"],
              "properties": {"kind": {"const": "struct"}, "param": _KW,
                             "type": {"type": "string", "pattern": f"^{IMPORT_RE.pattern}$"},
                             "fields": {"type": "object", "additionalProperties": {"$ref": "#/$defs/arg"}}}}
    table = {"type": "object", "additionalProperties": _VALUE}
    names = {"type": "array", "minItems": 1, "uniqueItems": True,
             "items": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"}}
    composite = {
        "type": "object", "additionalProperties": False, "required": ["launches", "inputs", "outputs"],
        "description": "A kernel made of launches of other kernels, sharing tensors by name.",
        "properties": {"launches": {**names, "description": "Kernels of this manifest, run in order."},
                       "inputs": {**names, "description": "The call's arrays, by name."},
                       "outputs": {**names, "description": "What the call returns, by name."},
                       "description": {"type": "string"}},
    }
    kernel = {
        "type": "object", "additionalProperties": False, "required": ["entry", "args"],
        "properties": {
            "entry": {"type": "string", "pattern": f"^{ENTRY_RE.pattern}$", "not": {"pattern": r"\s"},
                      "description": "A @cute.jit launcher, or a factory with factory_args: "
                                     "\"package.module:attr\"; \"package.module:attr[1]\" takes "
                                     "one item of the tuple it names or its factory returns."},
            "description": {"type": "string"},
            "factory_args": table,
            "args": {"type": "array", "items": {"$ref": "#/$defs/arg"},
                     "description": "The launcher's arguments in its own order."},
            "constants": table,
            "variants": {"type": "object",
                         "additionalProperties": {"type": "array", "minItems": 1, "items": _VALUE},
                         "description": "A matrix of parameters; those the input tensors cannot "
                                        "tell apart are call keywords (named as a runtime "
                                        "scalar is: cutecc.names)."},
            "derive": {"type": "object", "additionalProperties": {
                "type": "object", "minProperties": 1, "maxProperties": 1,
                "additionalProperties": {"type": "object", "additionalProperties": {
                    "type": ["integer", "number", "boolean", "string"]}}},
                       "description": "Parameters that follow a variant axis: tile_m = { causal = "
                                      "{ false = 80, true = 64 } }; \"$tile_m\" then stands where "
                                      "\"$param\" may. Not an axis: no variant of its own, no call "
                                      "keyword."},
            "from_shapes": {"type": "object", "additionalProperties": {
                "type": "string", "minLength": 1, "maxLength": 256},
                            "description": "Variant axes a call's shapes choose: vec = \"gcd(n, 4)\" "
                                           "(an expression over input extents); each variant is built "
                                           "for its value of the axis, and a call reaches the one whose "
                                           "value the expression gives for its arrays. No call keyword."},
            "symbols": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": False,
                "properties": {"divisibility": {"oneOf": [
                    {"type": "integer", "minimum": 1, "maximum": MAX_DIVISIBILITY,
                     "description": "up to 2^30, or 2^62 with bits = 64"},
                    {"type": "string", "pattern": r"^\$[A-Za-z_][A-Za-z0-9_]*$",
                     "description": "a variant or derived parameter (\"$div\")"}]},
                               "bits": {"enum": [32, 64], "description": "64: compiled as a 64-bit "
                                                                         "integer (extents >= 2^31)."}}},
                        "description": "Facts about symbolic extents, e.g. n = { divisibility = 8 }."},
            "archs": archs,
            "profile": {"type": "string"},
            "compile_options": {"type": "string"},
            "shard": {"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                      "description": "Symbolic extents the kernel is independent along (rows, "
                                     "batch, heads): under jax.jit with several devices each "
                                     "device calls it on its shard of those axes."},
            "relations": {"type": "array", "maxItems": 16,
                          "items": {"type": "string", "pattern": "^[^=]*==[^=]*$"},
                          "description": "Equalities between the input arrays' extents every call "
                                         "must hold, each two expressions joined by == over "
                                         "symbols, $params and $hw facts (\"ls == l * $split_k\"): "
                                         "a call that breaks one is refused naming it."},
            "reshard": {"enum": ["error", "warn", "allow"],
                        "description": "Under an explicit mesh, a call whose inputs are split "
                                       "where the shard rule does not allow (XLA would insert a "
                                       "collective before it): an error (default), one warning, "
                                       "or allowed."},
            "fallback": {"type": "string", "pattern": f"^{IMPORT_RE.pattern}$",
                         "description": "\"pkg.mod:fn\": a plain JAX function with the kernel's "
                                        "calling convention (arrays positionally, runtime scalars "
                                        "and call keywords by keyword, same results), served where "
                                        "no build fits a call or this GPU has none."},
            "fallback_torch": {"type": "string", "pattern": f"^{IMPORT_RE.pattern}$",
                               "description": "The same for cutecc.torch: a plain PyTorch function."},
            "grad": {"type": "object", "additionalProperties": False, "required": ["backward"],
                     "properties": {
                         "backward": {"type": "string"},
                         "args": {"type": "array", "items": {"type": "string"},
                                  "description": "The backward's inputs by name: forward inputs, "
                                                 "forward outputs (saved ones too), cotangent.<output>."},
                         "returns": {"type": "array", "items": {"type": "string"},
                                     "description": "The forward input each backward result is the "
                                                    "gradient of (default: all, in order)."},
                         "nondiff": {"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                                     "description": "Returned outputs whose cotangent the backward does "
                                                    "not take: a gradient through one is an error."},
                         "stop_gradient": {"type": "array", "items": {"type": "string"},
                                           "uniqueItems": True,
                                           "description": "Returned outputs whose cotangent the "
                                                          "backward does not take, dropped as "
                                                          "lax.stop_gradient would."}}},
            "tune": {
                "type": "object", "additionalProperties": False,
                "required": ["params", "default", "buckets"],
                "description": "A tuning space for `cutecc tune` (README: Build-time tuning).",
                "properties": {
                    "params": {"type": "object", "minProperties": 1, "additionalProperties": {
                        "type": "array", "minItems": 1, "items": _VALUE}},
                    "default": {"type": "object", "additionalProperties": _VALUE},
                    "constraints": {"type": "array", "items": {"type": "string"}},
                    "buckets": {"type": "object", "minProperties": 1, "additionalProperties": {"oneOf": [
                        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
                        {"type": "object", "additionalProperties": False, "required": ["pow2"],
                         "properties": {"pow2": {"type": "array", "minItems": 2, "maxItems": 2,
                                                 "items": {"type": "integer", "minimum": 1}}}}]}},
                    "rule": {"enum": ["floor", "nearest"]},
                    "sizes": {"type": "object", "additionalProperties": {"oneOf": [
                        {"type": "integer", "minimum": 1}, {"type": "string"}]},
                              "description": "Benchmark extents of symbols not bucketed: a size, or a "
                                             "bucketed extent's name (the same size)."},
                    "scalars": {"type": "object", "additionalProperties": {"type": ["number", "boolean"]},
                                "description": "Benchmark values of runtime scalars."},
                    "inputs": {"type": "object", "additionalProperties": {
                        "type": "object", "additionalProperties": False, "required": ["low", "high"],
                        "properties": {"low": {"type": "number"}, "high": {"type": "number"}}}},
                    "tolerance": {"type": "object", "additionalProperties": False, "properties": {
                        "rtol": {"type": "number", "minimum": 0}, "atol": {"type": "number", "minimum": 0}}},
                },
            },
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "cutecc kernels.toml",
        "description": "CuTe DSL kernels that `cutecc build` compiles ahead of time.",
        "type": "object", "additionalProperties": False, "required": ["kernel"],
        "properties": {
            "format": {"const": MANIFEST_FORMAT},
            "archs": archs,
            "platforms": {"type": "array", "minItems": 1, "uniqueItems": True,
                          "items": {"enum": sorted(PLATFORMS)},
                          "description": "Host platforms of the libraries' host code; default "
                                         "[\"x86_64\"], the build host's. \"aarch64\": Grace hosts."},
            "profile": {"type": "string", "examples": sorted(BUILTIN_PROFILES)},
            "python_path": {"type": "array", "items": {"type": "string"}},
            "compile_options": {"type": "string"},
            "env": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "Set in build workers before any import; keyed. $arch: the target."},
            "build": {"type": "object", "additionalProperties": False,
                      "description": "Where this project builds; flags and $CUTECC_* override. "
                                     "Remote writing is never set here (--remote-write).",
                      "properties": {"executor": {"enum": ["local", "ray"]},
                                     "ray_address": {"type": "string"},
                                     "remote": {"type": "string", "pattern": "^s3://"},
                                     "compile_timeout": {
                                         "type": "number", "minimum": 0,
                                         "description": "Seconds one compile may run before it is "
                                                        "stopped and fails (default 3600; 0: none)."},
                                     "compile_memory": {
                                         "type": ["string", "integer"],
                                         "description": "Data memory one compile may use, e.g. "
                                                        "\"16G\" (RLIMIT_DATA; default: none)."},
                                     "pins": {
                                         "type": "string", "minLength": 1,
                                         "description": "The requirements file (relative to the "
                                                        "manifest) pinning the build environment, "
                                                        "named when a build finds other "
                                                        "key-deciding distributions than its lock's."},
                                     "inputs": {
                                         "type": "array", "maxItems": 1000,
                                         "items": {"type": "string", "minLength": 1, "maxLength": 500},
                                         "description": "Files (globs, relative to the manifest) a "
                                                        "compile reads besides modules: keyed by "
                                                        "content; a compile reading a file no key "
                                                        "covers fails."}}},
            "hardware": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": {"type": ["integer", "number", "string"]}}},
            "kernel": {"type": "object", "minProperties": 1,
                       "propertyNames": _runtime_name(RESERVED_KERNEL_NAMES, "An attribute of the "
                                                      "loaded kernel set"),
                       "additionalProperties": {"oneOf": [{"$ref": "#/$defs/kernel"},
                                                          {"$ref": "#/$defs/composite"}]}},
        },
        "$defs": {"kernel": kernel, "composite": composite,
                  "arg": {"oneOf": [tensor, scalar, none, stream, tup, const, struct]}},
    }


def schema_json() -> str:
    """The schema as the bytes committed in `kernels.schema.json` (sorted, indented)."""
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"
