"""Rules across kernels: a composite's launches and their inputs and results, and grad
pairs (a backward's arguments and the cotangents it takes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Set

from cutecc.contract.args import (
    CallingConvention,
    TensorArg,
)
from cutecc.contract.cotangents import COTANGENT, STOP_GRADIENT, undeclared
from cutecc.errors import CuteccError
from cutecc.manifest.grammar import _Ctx
from cutecc.manifest.model import Composite, Kernel

Errors = list[tuple[str, CuteccError]]  # (the kernel's name, its error), as checks collect them


def _check_composites(ctx: _Ctx, composites: list[Composite], kernels: list[Kernel],
                      errors: Errors | None = None, failed: Set[str] = frozenset()
                      ) -> dict[str, CallingConvention]:
    """Each launch is a kernel of the manifest (not a composite; its first variant's
    contract stands for all), each launch input is a composite input or an earlier launch's
    result, and each output some launch's result (a composite input too, once a launch has
    written it in place; a launch that only needs an input's extents for an output takes it
    `extents_only` instead and writes a fresh array, as FA4's postprocess does). Returns each
    composite's convention, for grad pairing. With `errors`, each composite's error is
    collected there (by its name) rather than raised; one launching a kernel named in
    `failed` (which did not parse) is not checked."""
    by_name = {k.name: k for k in kernels}
    names = {x.name for x in composites}
    out = {}
    for c in composites:
        if any(ln in failed for ln in c.launches):
            continue
        try:
            out[c.name] = _check_composite(ctx, c, by_name, names)
        except CuteccError as e:
            if errors is None:
                raise
            errors.append((c.name, e))
    return out


def _check_composite(ctx: _Ctx, c: Composite, by_name: dict[str, Kernel],
                     composites: set[str]) -> CallingConvention:
    """One composite's checks (`_check_composites`), and its convention."""
    kp = f'kernel "{c.name}"'
    have: dict[str, TensorArg | None] = dict.fromkeys(c.inputs)
    written: set[str] = set()  # launch results, those written in place (inout) included
    for i, ln in enumerate(c.launches):
        k = by_name.get(ln)
        if k is None:
            raise ctx.fail(f"{kp}, launches[{i}]", f'no kernel "{ln}" in the manifest'
                           + (" (a composite cannot launch a composite)"
                              if ln in composites else ""))
        conv = k.variants[0].convention
        for t in conv.inputs:
            if t.name not in have:
                raise ctx.fail(f"{kp}, launches[{i}]", f'"{ln}" takes "{t.name}", which is no '
                               "input of the composite and no result of an earlier launch")
            if have[t.name] is None:
                have[t.name] = t
        for t in conv.results:
            have[t.name] = t
            written.add(t.name)
    unused = [n for n in c.inputs if have[n] is None]
    if unused:
        raise ctx.fail(f"{kp}, inputs", f'"{unused[0]}" is taken by no launch')
    for i, n in enumerate(c.outputs):
        if n not in written:
            raise ctx.fail(f"{kp}, outputs[{i}]", f'"{n}" is no launch result')
    ins = tuple(t for t in (have[n] for n in c.inputs) if t is not None)
    res = tuple(dataclasses.replace(t, role="output", saved=False, may_alias=None)
                for t in (have[n] for n in c.outputs) if t is not None)
    return CallingConvention(ins, res, (), ())


def _check_grads(ctx: _Ctx, kernels: list[Kernel],
                 composites: dict[str, CallingConvention] | None = None,
                 errors: Errors | None = None, failed: Set[str] = frozenset()) -> None:
    """Each grad pairing's checks; with `errors`, each kernel's error is collected there
    (by its name) rather than raised; a pairing with a backward in `failed` (a kernel or
    composite that did not parse) is not checked."""
    by_name = {k.name: k for k in kernels}
    composites = composites or {}
    for k in kernels:
        if not k.backward or k.backward in failed:
            continue
        try:
            _check_grad(ctx, k, by_name, composites)
        except CuteccError as e:
            if errors is None:
                raise
            errors.append((k.name, e))


def _check_grad(ctx: _Ctx, k: Kernel, by_name: dict[str, Kernel],
                composites: dict[str, CallingConvention]) -> None:
    """One forward's grad pairing (`_check_grads`)."""
    kp = f'kernel "{k.name}", grad.backward'
    backward = k.backward or ""
    b = by_name.get(backward)
    if b is None and backward not in composites:
        raise ctx.fail(kp, f'no kernel "{backward}" in the manifest')
    if backward == k.name:
        raise ctx.fail(kp, "a kernel cannot be its own backward")
    fc = k.variants[0].convention
    bc = composites[backward] if b is None else b.variants[0].convention
    padded = [t.name for v in k.variants for t in v.convention.inputs if t.padded]
    if padded:
        raise ctx.fail(kp, f'forward input "{padded[0]}" is padded (buffer): its gradient would '
                       "be the whole buffer, padding included, which no declared output can "
                       "promise; differentiate a kernel that takes the dense array instead")
    if fc.aliases:
        raise ctx.fail(kp, "in-place forwards cannot be differentiated")
    if k.grad_args is not None:
        _check_named_grad(ctx, f'kernel "{k.name}", grad', k, fc, backward, bc)
        return
    if any(t.saved for t in fc.results):
        raise ctx.fail(kp, f'forward output "{[t.name for t in fc.results if t.saved][0]}" is '
                       "saved for the backward: say what the backward takes by name "
                       '(grad.args = ["x", "rstd", "cotangent.out", ...])')
    want_in = len(fc.inputs) + len(fc.visible)
    if len(bc.inputs) != want_in or len(bc.results) != len(fc.inputs) or fc.aliases:
        raise ctx.fail(kp, f'"{k.backward}" must take the forward inputs then one cotangent per '
                       f"forward output ({want_in} inputs) and return one gradient per "
                       f"forward input ({len(fc.inputs)} outputs); it takes "
                       f"{len(bc.inputs)} and returns {len(bc.results)}"
                       + ("; in-place forwards cannot be differentiated" if fc.aliases else ""))


def _check_named_grad(ctx: _Ctx, kp: str, k: Kernel, fc: CallingConvention, bname: str,
                      bc: CallingConvention) -> None:
    """`grad.args` names forward inputs, forward outputs (saved or not) and cotangents of the
    outputs a call returns, one per backward input; `grad.returns` names a forward input per
    backward result (inputs not named get no gradient: zero)."""
    inputs = [t.name for t in fc.inputs]
    known = [*inputs, *(t.name for t in fc.results), *(COTANGENT + t.name for t in fc.visible)]
    args = k.grad_args or ()
    for i, n in enumerate(args):
        if n not in known:
            raise ctx.fail(f"{kp}.args[{i}]", f'"{n}" is no forward input, output or cotangent '
                           f"(known: {', '.join(known)})")
    if len(args) != len(bc.inputs):
        raise ctx.fail(f"{kp}.args", f'"{bname}" takes {len(bc.inputs)} input(s), grad.args names '
                       f"{len(args)}")
    returns = k.grad_returns if k.grad_returns is not None else tuple(inputs)
    for i, n in enumerate(returns):
        if n not in inputs:
            raise ctx.fail(f"{kp}.returns[{i}]", f'"{n}" is no forward input (inputs: '
                           f"{', '.join(inputs)})")
    if len(set(returns)) != len(returns):
        raise ctx.fail(f"{kp}.returns", "names a forward input twice")
    if len(returns) != len(bc.visible):
        raise ctx.fail(f"{kp}.returns", f'"{bname}" returns {len(bc.visible)} result(s), one per '
                       f"name of grad.returns ({len(returns)}: {', '.join(returns)})")
    _check_declared_cotangents(ctx, kp, k, fc)


def _check_declared_cotangents(ctx: _Ctx, kp: str, k: Kernel, fc: CallingConvention) -> None:
    """Every cotangent or an error: a returned output whose cotangent `grad.args` leaves
    out is declared `nondiff` or `stop_gradient` (else jax.grad of a loss on it would be
    a silent zero); what those lists name is a returned output the backward takes no
    cotangent of, in one list only."""
    returned = [t.name for t in fc.visible]
    saved = {t.name for t in fc.results if t.saved}
    args = k.grad_args or ()
    for key, names in (("nondiff", k.grad_nondiff), (STOP_GRADIENT, k.grad_stop)):
        for i, n in enumerate(names):
            where = f"{kp}.{key}[{i}]"
            if n in saved:
                raise ctx.fail(where, f'"{n}" is saved (not returned): no cotangent ever reaches it, '
                               "leave it out")
            if n not in returned:
                raise ctx.fail(where, f'"{n}" is no output the forward returns (returned: '
                               f"{', '.join(returned) or 'none'})")
            if COTANGENT + n in args:
                raise ctx.fail(where, f'the backward takes "{COTANGENT}{n}" (grad.args): "{n}" is '
                               "differentiable, leave it out")
            if names.index(n) != i:
                raise ctx.fail(where, f'names "{n}" twice')
    both = sorted(set(k.grad_nondiff) & set(k.grad_stop))
    if both:
        raise ctx.fail(f"{kp}.{STOP_GRADIENT}", f'"{both[0]}" is also in grad.nondiff: declare it in '
                       "one of them")
    left = undeclared(returned, args, k.grad_nondiff, k.grad_stop)
    if left:
        n = left[0]
        raise ctx.fail(f"{kp}.args", f'takes no cotangent of returned output "{n}", so jax.grad of a '
                       f'loss on "{n}" would be a silent zero: pass "{COTANGENT}{n}" to the backward, '
                       f'or declare it: nondiff = ["{n}"] (a gradient through it is an error) or '
                       f'stop_gradient = ["{n}"] (its cotangent is dropped)')
