"""`cutecc show`: everything one entry's metadata holds, found by its key or a unique prefix."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.commands.list import call_text
from cutecc.commands.report import Report
from cutecc.contract.args import CallingConvention, TensorArg, args_from_json, flat_leaves, stride_text
from cutecc.contract.cotangents import Cotangents
from cutecc.entry.rules import call_keywords
from cutecc.errors import CuteccError, WorkError
from cutecc.store.view import Entry, StoreView
from cutecc.units import human_size, iso


@dataclass(frozen=True)
class ShowReport(Report):
    info: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.info[name]

    def to_json(self) -> dict[str, Any]:
        return self.info

    def lines(self, verbose: int = 0) -> list[str]:
        info = self.info
        out = [f"key        {info['key']}", f"entry      {info['label']}", f"path       {info['path']}",
               f"last used  {info['last_used']}", f"on disk    {human_size(info['disk_bytes'])}"]
        if "on_gpu" in info:
            out.append(f"on {info['on_gpu']['gpu']:<7} {info['on_gpu']['runs']}")
        call = call_text(call_keywords(info["meta"]))
        if call:
            out.append(f"call with  {call}")
        out += [f"in place   {note}" for note in info.get("in_place", [])]
        out += [f"optional   {name}: built with None (a call passes None there, or leaves it out)"
                for name in info.get("none_slots", [])]
        out += [f"chosen by  {name} = {text} (this build: {name} = {value})"
                for name, text, value in info.get("from_shapes", [])]
        for name, st in (info.get("strides") or {}).items():
            dyn = [x for x, static in zip(st["strides"], st["static"]) if not static]
            out.append(f"strides    {name}: ({', '.join(st['strides'])}) "
                       + ("all static" if not dyn else f"runtime: {', '.join(dyn)}")
                       + "".join(f"; extent {i} ({st['shape'][i]}) compiled as a runtime value"
                                 for i in st.get("runtime", ())))
        sh = info.get("sharding")
        if sh:
            out.append(f"sharding   {sharding_text(sh)}")
        grad = info.get("gradient")
        if grad:
            out += [f"gradient   {line}" for line in Cotangents(grad["backward"], tuple(grad["taken"]),
                                                                tuple(grad["nondiff"]),
                                                                tuple(grad["stop_gradient"])).lines()]
        out.append("files")
        out += [f"  {f['name']}  {f['size']} B  sha256 {f['sha256']}" for f in info["files"]]
        out += [f"tuned winner for {w}" for w in info.get("winner_for", [])]
        out.append("metadata")
        for k, v in sorted(info["meta"].items()):
            if k == "key_inputs" and isinstance(v, dict):
                out += [f"  key_inputs.{ik}: {json.dumps(iv, sort_keys=True)}"
                        for ik, iv in sorted(v.items())]
            elif k != "files":
                out.append(f"  {k}: {v if isinstance(v, str) else json.dumps(v, sort_keys=True)}")
        return out


def in_place_notes(meta: dict[str, Any]) -> list[str]:
    """What the entry's contract lets a caller do about copies: an `inout` tensor is written
    in its input's buffer on every call (XLA copies that input first unless it is dead:
    donate it), an output declared `may_alias` is written in its input's buffer when the
    call asks (`kernel.in_place`); an input passed for its extents only is never written nor
    copied. Nothing for a contract that cannot be read."""
    try:
        tensors = [a for a in flat_leaves(args_from_json(meta["args"])) if isinstance(a, TensorArg)]
    except (KeyError, TypeError, ValueError, AttributeError):
        return []
    kernel = meta.get("kernel", "k")
    notes = [f"{t.name} is inout: written in the caller's array, which XLA copies first unless "
             f"it is dead; under jit donate it (jax.jit(f, donate_argnums=...)) or pass an "
             f"intermediate used once" for t in tensors if t.role == "inout"]
    notes += [f"{t.name} may be written in {t.may_alias}'s memory: ks.{kernel}.in_place(...) under "
              f"jit reuses {t.may_alias}'s buffer where it is dead (a loop carry, a donated "
              f"argument); where {t.may_alias} stays live XLA copies it first, so call plainly there"
              for t in tensors if t.role == "output" and t.may_alias]
    notes += [f"{t.name} is passed for its extents only (they size an output): the launcher never "
              f"receives it, and nothing of it is written or copied" for t in tensors if t.extents_only]
    return notes


def none_slots(meta: dict[str, Any]) -> list[str]:
    """The optional input slots this build was compiled with None in (`present = "$p"`)."""
    try:
        return list(CallingConvention.of(args_from_json(meta["args"])).absent)
    except (KeyError, TypeError, ValueError, AttributeError):
        return []  # damaged metadata: shown as it is, `cutecc verify` says how


def from_shapes(meta: dict[str, Any]) -> list[list[Any]]:
    """The variant axes a call's shapes choose (`from_shapes`): [axis, expression, this build's value]."""
    from cutecc.runtime.variant_choice import from_shapes_of

    try:
        params = meta.get("params") or {}
        return [list(x) for x in from_shapes_of(meta.get("key_inputs"), params)]
    except (TypeError, ValueError, AttributeError):
        return []  # damaged metadata: shown as it is, `cutecc verify` says how


def strides(meta: dict[str, Any]) -> dict[str, Any]:
    """Per tensor a call passes or gets, the strides the kernel was compiled with, logical
    dimension by dimension, and which are static (compiled in) rather than runtime values
    (declared `stride` symbols, or read from symbolic extents). Empty for a contract that
    cannot be read."""
    try:
        tensors = [a for a in flat_leaves(args_from_json(meta["args"]))
                   if isinstance(a, TensorArg) and a.role != "scratch"]
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}
    out = {}
    for t in tensors:
        text = stride_text(t)
        out[t.name] = {"strides": text, "static": [x.isdigit() for x in text],
                       **({"runtime": list(t.runtime), "shape": list(t.shape)} if t.runtime else {})}
    return out


def sharding(meta: dict[str, Any]) -> dict[str, Any]:
    """The entry's sharding choices, as the runtime reads them from its key inputs: the
    `shard` rule (None: none declared) and `reshard` ("error" when not declared)."""
    from cutecc.runtime.calls import _reshard_of, _shard_of

    inputs = meta.get("key_inputs")
    shard = _shard_of(inputs)
    return {"shard": list(shard) if isinstance(shard, (list, tuple)) else None,
            "reshard": _reshard_of(inputs)}


_RESHARD_MEANS = {
    "error": "a call split elsewhere under an explicit mesh is an error",
    "warn": "a call split elsewhere under an explicit mesh warns once, then is gathered",
    "allow": "a call split elsewhere is gathered silently",
}


def sharding_text(sh: dict[str, Any]) -> str:
    """One line: `shard = [..]` (or no rule) and `reshard = ...` with what it means."""
    rule = (f"shard = [{', '.join(map(str, sh['shard']))}]" if sh.get("shard")
            else "no shard rule (one device per call)")
    r = sh.get("reshard")
    return f"{rule}; reshard = {r}" + (f": {_RESHARD_MEANS[r]}" if r in _RESHARD_MEANS else "")


def gradient(meta: dict[str, Any]) -> dict[str, Any] | None:
    """For a forward paired with a backward: which returned outputs' cotangents the
    backward takes, and which it does not (non-differentiable, or stop-gradient by
    declaration). None for an unpaired entry or a contract that cannot be read."""
    backward = meta.get("backward")
    if not isinstance(backward, str):
        return None
    try:
        conv = CallingConvention.of(args_from_json(meta["args"]))
        key_inputs = meta.get("key_inputs")
        pairing = key_inputs.get("grad") if isinstance(key_inputs, dict) else None
        return Cotangents.of_pairing(backward, [t.name for t in conv.visible], pairing).to_json()
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def resolve(store: StoreView, prefix: str) -> str:
    """The one key that starts with `prefix`.

    A prefix that is not hex, or that matches several entries (the error lists them),
    is bad input (exit 2); one that matches nothing is exit 1.
    """
    p = prefix.strip().lower()
    if not p or len(p) > 64 or any(c not in string.hexdigits for c in p):
        raise CuteccError(f'"{prefix}" is not a key or key prefix (hex digits)', where="KEY")
    keys = store.match(p)
    if not keys:
        raise WorkError(f'no entry matches "{prefix}" (see `cutecc list`)', where=str(store.root))
    if len(keys) > 1:
        shown = [f"{k[:16]} {_label_of(store, k)}" for k in keys[:20]]
        more = f" (and {len(keys) - 20} more)" if len(keys) > 20 else ""
        raise CuteccError(f'"{prefix}" is ambiguous, it matches {len(keys)} entries: '
                          + "; ".join(shown) + more, where=str(store.root))
    return keys[0]


def _label_of(store: StoreView, key: str) -> str:
    try:
        entry = store.get(key)
    except CuteccError:
        return "(unreadable metadata)"
    return entry.recorded.label if entry else "(removed)"


def get_entry(store: StoreView, prefix: str) -> Entry:
    """The entry for KEY|PREFIX (see `resolve`); unreadable metadata is an error naming it."""
    entry = store.get(resolve(store, prefix))
    if entry is None:  # removed between the two looks
        raise WorkError(f'no entry matches "{prefix}"', where=str(store.root))
    return entry


def show(key: str, cache_dir: str | Path | None = None, gpu: str | None = None) -> ShowReport:
    """The entry for KEY|PREFIX: its metadata, its files (name, size, sha256), its last use;
    with `gpu` (a device arch, `sm_90`), whether and how that GPU runs it (`archs.how_runs`)."""
    from cutecc.archs import check_device_arch
    from cutecc.runtime.tuning import winners_in

    store = StoreView(cache_dir).require()
    entry = get_entry(store, key)
    recs = entry.recorded.files  # damaged metadata is shown as it is: `cutecc verify` says how
    files = [{"name": n, "size": r.get("size"), "sha256": r.get("sha256")} if isinstance(r, dict)
             else {"name": n, "size": None, "sha256": None} for n, r in sorted(recs.items())]
    return ShowReport({
        "key": entry.key,
        "path": str(entry.path),
        "label": entry.recorded.label,
        "disk_bytes": entry.disk_bytes(),
        "last_used": iso(entry.last_used()),
        "files": files,
        "meta": entry.doc,
        "in_place": in_place_notes(entry.doc),
        "none_slots": none_slots(entry.doc),
        "from_shapes": from_shapes(entry.doc),
        "gradient": gradient(entry.doc),
        "sharding": sharding(entry.doc),
        "strides": strides(entry.doc),
        "winner_for": winners_in(store.root).get(entry.key, []),
        **({"on_gpu": _on_gpu(entry, gpu)}
           if (gpu := None if gpu is None else check_device_arch(gpu, "--gpu")) else {}),
    })


def _on_gpu(entry: Any, gpu: str) -> dict[str, Any]:
    """How a GPU of arch `gpu` runs the entry (`archs.how_runs`); for PTX, the PTX ISA its
    build recorded and the oldest CUDA driver that JIT-compiles it (`archs.PTX_ISA_OF_DRIVER`)."""
    from cutecc.archs import driver_for_ptx_isa, how_runs, is_ptx, parse_version, show_version
    from cutecc.entry.rules import ptx_isa_of

    arch = str(entry.recorded.arch)
    out: dict[str, Any] = {"gpu": gpu, "runs": how_runs(arch, gpu)}
    isa = ptx_isa_of(entry.doc)
    if is_ptx(arch):
        out["ptx_isa"] = isa
        want = parse_version(isa)
        needs = driver_for_ptx_isa(want) if want else None
        if out["runs"] != "no":
            out["runs"] += (f" (PTX ISA {isa}: a CUDA {show_version(needs)} driver or newer)" if needs
                            else f" (PTX ISA {isa}: a newer CUDA driver)" if isa
                            else " (PTX ISA not recorded)")
    return out
