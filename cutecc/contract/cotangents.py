"""Every cotangent or an error: which of a forward's returned outputs its paired backward
takes the cotangent of, and what becomes of the others.

A named pairing (`grad.args`) may leave out the cotangent of a returned output (a residual
such as `rstd` or `lse` returned beside the result). Dropped silently, `jax.grad` of a loss
on that output would be exactly zero. So each such output is declared: `nondiff` (a real
cotangent reaching it is an error at trace time) or `stop_gradient` (its cotangent is
dropped, as `lax.stop_gradient` on it would). The manifest refuses an undeclared one; the
runtimes (JAX with symbolic zeros, torch with unmaterialized gradients) tell a real
cotangent from an unused one and apply the rule. Framework-free: shared by the manifest
check, both runtimes and `cutecc show`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cutecc.errors import CallError

COTANGENT = "cotangent."  # grad.args: "cotangent.out" is the cotangent of forward output "out"
STOP_GRADIENT = "stop_gradient"  # the pairing's key (stored with the entry) for the explicit choice


@dataclass(frozen=True)
class Cotangents:
    """Per returned output of a paired forward: whose cotangent the backward takes (`taken`),
    which are non-differentiable (`nondiff`: a real cotangent is an error) and which are
    stop-gradient by declaration (`stopped`: a cotangent is dropped)."""

    backward: str
    taken: tuple[str, ...]
    nondiff: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()

    @classmethod
    def of(cls, backward: str, returned: Sequence[str], args: Sequence[str] | None,
           stop_gradient: Collection[str] = ()) -> Cotangents:
        """The pairing of a forward returning `returned` (its visible outputs, in order) with
        a backward taking `args` by name (None: the inputs then every cotangent). An output
        neither taken nor declared stop-gradient is non-differentiable."""
        if args is None:
            return cls(backward, tuple(returned))
        taken = tuple(n for n in returned if COTANGENT + n in args)
        stopped = tuple(n for n in returned if n in stop_gradient and n not in taken)
        nondiff = tuple(n for n in returned if n not in taken and n not in stopped)
        return cls(backward, taken, nondiff, stopped)

    @classmethod
    def of_pairing(cls, backward: str, returned: Sequence[str],
                   pairing: Mapping[str, Any] | None) -> Cotangents:
        """From a pairing as entries store it (`key_inputs.grad`: args, returns and, only when
        declared, stop_gradient); None is the plain pairing (every cotangent taken)."""
        if pairing is None:
            return cls.of(backward, returned, None)
        return cls.of(backward, returned, tuple(pairing["args"]), tuple(pairing.get(STOP_GRADIENT) or ()))

    @property
    def complete(self) -> bool:
        """Whether the backward takes every returned output's cotangent."""
        return not self.nondiff and not self.stopped

    def check(self, kernel: str, real: Collection[str]) -> None:
        """Refuse a real (not symbolically zero) cotangent of a non-differentiable output:
        `real` names the returned outputs a cotangent reached."""
        bad = [n for n in self.nondiff if n in real]
        if bad:
            raise CallError(
                f'a gradient flows into its output "{bad[0]}", but its backward "{self.backward}" '
                f'takes no cotangent of it (declared non-differentiable: grad.nondiff). Apply '
                f'jax.lax.stop_gradient (torch: .detach()) to "{bad[0]}" before using it in the '
                f"loss, or pair a backward that takes \"{COTANGENT}{bad[0]}\"",
                where=f'kernel "{kernel}"')

    def lines(self) -> list[str]:
        """What `cutecc show` says of the pairing, one line per kind of output."""
        out = [f"backward {self.backward} takes the cotangents of: {', '.join(self.taken) or '(none)'}"]
        if self.nondiff:
            out.append(f"non-differentiable (a gradient through it is an error): {', '.join(self.nondiff)}")
        if self.stopped:
            out.append(f"stop-gradient (its cotangent is dropped): {', '.join(self.stopped)}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"backward": self.backward, "taken": list(self.taken), "nondiff": list(self.nondiff),
                "stop_gradient": list(self.stopped)}


def undeclared(returned: Sequence[str], args: Sequence[str], nondiff: Collection[str],
               stop_gradient: Collection[str]) -> list[str]:
    """The returned outputs whose cotangent `args` leaves out and the manifest declares
    neither non-differentiable nor stop-gradient: each would get a silent zero gradient."""
    return [n for n in returned if COTANGENT + n not in args and n not in nondiff
            and n not in stop_gradient]
