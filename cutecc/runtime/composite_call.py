"""How a composite kernel is called: an ordered list of launches of other kernels of the
set, sharing tensors by name (`[kernel.NAME] launches = [..]`; its definition as a lock pins
it is `cutecc.contract.composite_line.CompositeLine`), called as one kernel.

What a composite call is, whichever framework calls it: its arity and keywords checked,
each launch given its arrays by name from the call's inputs and earlier launches' results
(saved ones too) and the keywords it takes, the declared outputs returned. Shared by the
JAX runtime (`cutecc.runtime.dispatch.CompositeFn`) and the PyTorch one
(`cutecc.torch.TorchCompositeFn`), which say only how one launch is called
(`CompositeBase._launch`); imports neither JAX nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cutecc.errors import CallError, CallTypeError
from cutecc.runtime.calls import Build, _same


class CompositeBase:
    """A composite kernel of a kernel set (`owner`): `fn(*inputs, **keywords)` runs its
    launches in order and returns its outputs (a tuple of several, else the one). Runtime
    scalars and call keywords go to each launch that takes them. Pairable as a backward."""

    builds: tuple[Build, ...] = ()  # nothing of its own: its launches are kernels
    unusable: tuple[str, ...] = ()
    backward = None
    grad = None
    tuning = None
    _noun = "array"  # what the framework calls the call's inputs, for messages

    def __init__(self, name: str, launches: Sequence[str], inputs: Sequence[str],
                 outputs: Sequence[str], owner: Any = None) -> None:
        self.name = name
        self.launches, self.inputs, self.outputs = tuple(launches), tuple(inputs), tuple(outputs)
        self._owner = owner

    def __repr__(self) -> str:
        return (f"<cutecc kernel {self.name}: ({', '.join(self.inputs)}) -> "
                f"({', '.join(self.outputs)}) through {' -> '.join(self.launches)}>")

    def _fns(self) -> list[Any]:
        """The launches' kernels, or an error naming the first that is not in the set."""
        fns = [self._owner.get(n) if self._owner is not None else None for n in self.launches]
        missing = [n for n, f in zip(self.launches, fns) if f is None]
        if missing:
            raise CallError(f"launch kernel {missing[0]!r} is not in this kernel set (not loaded, "
                            "or not built: run `cutecc build`)", where=f'kernel "{self.name}"')
        return fns

    @property
    def _keywords(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for f in self._fns():
            for k, vals in f._keywords.items():
                out.setdefault(k, []).extend(v for v in vals if not any(_same(v, w) for w in out[k]))
        return out

    @property
    def keywords(self) -> dict[str, list[Any]]:
        """The launches' call keywords and the values built for each."""
        return {k: list(v) for k, v in self._keywords.items()}

    def scalar_names(self) -> set[str]:
        """The runtime scalars a call may pass: any launch's."""
        return set().union(*(f.scalar_names() for f in self._fns()))

    def input_names(self) -> tuple[str, ...]:
        return self.inputs

    def _run(self, args: Sequence[Any], kw: Mapping[str, Any], every: bool = False) -> Any:
        """The call: the launches in order (`_launch`), each given the arrays it names and
        the keywords it takes; the outputs (with `every`, a dict of them by name)."""
        if len(args) != len(self.inputs):
            raise CallTypeError(f"takes {len(self.inputs)} {self._noun}(s) ({', '.join(self.inputs)}), "
                                f"got {len(args)}", where=f'kernel "{self.name}"')
        fns = self._fns()
        taken = set().union(*(f.scalar_names() for f in fns), *(f._keywords for f in fns))
        unknown = sorted(set(kw) - taken)
        if unknown:
            raise CallTypeError(f"unknown keyword argument {unknown[0]!r}; runtime scalars and call "
                                f"keywords of the launches: {', '.join(sorted(taken)) or 'none'}",
                                where=f'kernel "{self.name}"')
        have = dict(zip(self.inputs, args))
        for f in fns:
            gone = [n for n in f.input_names() if n not in have]
            if gone:  # the launch's contract is not the one the composite was declared over
                raise CallError(f'launch "{f.name}" takes "{gone[0]}", which is no input of the '
                                "composite and no result of an earlier launch; rebuild and lock "
                                "them together", where=f'kernel "{self.name}"')
            mine = f.scalar_names() | set(f._keywords)
            have.update(self._launch(f, tuple(have[n] for n in f.input_names()),
                                     {k: v for k, v in kw.items() if k in mine}, args))
        gone = [n for n in self.outputs if n not in have]
        if gone:
            raise CallError(f'output "{gone[0]}" is no result of its launches; rebuild and lock them '
                            "together", where=f'kernel "{self.name}"')
        if every:
            return {n: have[n] for n in self.outputs}
        out = tuple(have[n] for n in self.outputs)
        return out[0] if len(out) == 1 else out

    def _launch(self, fn: Any, args: tuple[Any, ...], kw: Mapping[str, Any],
                given: Sequence[Any]) -> Mapping[str, Any]:
        """One launch: kernel `fn` called on `args` with its keywords `kw`; all its results
        by name, saved ones too. `given` are the composite call's own inputs."""
        raise NotImplementedError
