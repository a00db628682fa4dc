"""The manifest (`kernels.toml`, or `[tool.cutecc]` in `pyproject.toml`): read once, checked
whole, handed on as frozen records.

- `model`: the records (`Manifest`, `Kernel`, `Variant`, ...) the rest of cutecc trusts;
- `parse`: loading a manifest (`load_manifest`), its top level and `[build]`, and the
  file's documented schema; every check raises errors naming the file and the key path;
- `grammar`: names, limits, hardware profiles, each table's keys, the small validators;
- `values`: "$param" substitution, typed values, expressions; `arguments`: a kernel's
  `args`; `variants`: its variant matrix and call keywords; `kernel`: one `[kernel.NAME]`;
  `rules`: checks across kernels (composites, grad pairs);
- `tune_space`: a kernel's tuning space (`[kernel.NAME.tune]`), its grammar and expansion;
- `schema`: the JSON Schema of `kernels.toml` for editors (not imported here).

The package imports nothing of the build side, the store or the runtime (a test checks
the layers), and neither the DSL nor JAX.
"""

from cutecc.contract.cotangents import COTANGENT
from cutecc.manifest.grammar import (
    BUILTIN_PROFILES,
    ENTRY_RE,
    EXECUTORS,
    IMPORT_RE,
    MANIFEST_FORMAT,
    MANIFEST_NAMES,
    MAX_ALIGN,
    MAX_DIVISIBILITY,
    MAX_MANIFEST_BYTES,
    MAX_STATIC_EXTENT,
    MAX_TUPLE_DEPTH,
    MAX_VARIANTS_PER_KERNEL,
    NAME_RE,
    RESERVED_KERNEL_NAMES,
)
from cutecc.manifest.model import (
    BuildSettings,
    Composite,
    Kernel,
    Manifest,
    Value,
    Variant,
    split_entry,
)
from cutecc.manifest.parse import find_manifest, load_manifest, parse_document
from cutecc.manifest.tune_space import Bucketing, TuneSpec

__all__ = [
    "BUILTIN_PROFILES", "COTANGENT", "ENTRY_RE", "EXECUTORS", "IMPORT_RE", "MANIFEST_FORMAT",
    "MANIFEST_NAMES", "MAX_ALIGN", "MAX_DIVISIBILITY", "MAX_MANIFEST_BYTES", "MAX_STATIC_EXTENT",
    "MAX_TUPLE_DEPTH", "MAX_VARIANTS_PER_KERNEL", "NAME_RE", "RESERVED_KERNEL_NAMES",
    "BuildSettings", "Bucketing", "Composite", "Kernel", "Manifest", "TuneSpec", "Value", "Variant",
    "find_manifest", "load_manifest", "parse_document", "split_entry",
]
