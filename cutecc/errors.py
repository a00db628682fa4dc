"""cutecc's one exception family, each carrying where it was found (file, key path, argument).

`CuteccError` is the base the CLI renders as one line; its class decides the exit code
(`exit_code`: 2 for bad input, `InputError`; 1 for failures at work, `WorkError`, and for
calls, `CallError` and `CallTypeError`), never the raiser. A kernel call that does not fit raises
`CallError` (a ValueError: no built contract takes these arrays or values) or
`CallTypeError` (a TypeError: an unknown or missing keyword, a non-array argument, a scalar
of the wrong type), so JAX and torch users catch what they would catch from any function.
"""

from __future__ import annotations

from typing import ClassVar


class CuteccError(Exception):
    """A user-facing error: what was wrong and where (file, key path or argument).

    The CLI renders it as one line on stderr and exits with its class's `exit_code`
    (2 for bad input, as click does for usage errors; 1 for failures at work).
    """

    exit_code: ClassVar[int] = 2

    def __init__(self, message: str, *, where: str | None = None, key_path: str | None = None) -> None:
        self.message = message
        self.where = where
        self.key_path = key_path
        super().__init__(self.render())

    def render(self) -> str:
        parts = [p for p in (self.where, self.key_path) if p]
        prefix = ": ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message


class InputError(CuteccError):
    """Bad input (a manifest, an argument, a file given): exit 2."""


class ManifestErrors(InputError):
    """Several errors of one manifest, reported at once (capped, in file order): each in
    `errors` carries its own file and key path; `more` counts those left unsaid. Its own
    `where` and `key_path` are the first error's, so one-error handlers still point there."""

    def __init__(self, errors: list[CuteccError] | tuple[CuteccError, ...], more: int = 0) -> None:
        self.errors = tuple(errors)
        self.more = more
        first = self.errors[0]
        total = len(self.errors) + more
        super().__init__(f"{total} errors in the manifest; the first: {first.message}",
                         where=first.where, key_path=first.key_path)

    def lines(self) -> list[str]:
        """One line per error (`file: key path: message`), then how many were left out."""
        out = [e.render() for e in self.errors]
        return out + ([f"... and {self.more} more"] if self.more else [])

    def render(self) -> str:
        return f"{len(self.errors) + self.more} errors in the manifest:\n" + "\n".join(
            f"  {line}" for line in self.lines())


class WorkError(CuteccError):
    """A failure at work (a build, a cache, a network): exit 1."""

    exit_code: ClassVar[int] = 1


class CompileError(WorkError):
    """A kernel that did not compile: the message names the kernel, the variant and the
    kernel's file and line; `traceback` is the whole traceback (escaped), for `-v` and
    `--json`."""

    def __init__(self, message: str, *, where: str | None = None, traceback: str | None = None) -> None:
        self.traceback = traceback
        super().__init__(message, where=where)


class CallError(CuteccError, ValueError):
    """A kernel call whose arrays or values no built contract takes (dtype, shape, device,
    layout, a call keyword's value that was not built): the message names the argument and
    the built signatures. Exit 1, as any failure at work."""

    exit_code: ClassVar[int] = 1


class NoBuildFits(CallError):
    """No build of the kernel serves the call here: no variant fits its arrays or call
    keywords, or none was built for this GPU's arch. A kernel with a declared fallback
    serves the call with it instead (unless strict); without one, this is the error."""


class FallbackWarning(UserWarning):
    """A kernel call was served by the kernel's declared fallback, not a built kernel
    (warned once per kernel and call signature; filter or escalate it as any warning:
    `warnings.simplefilter("error", cutecc.FallbackWarning)`)."""


class CopyWarning(UserWarning):
    """A kernel's in-place operand (an `inout` tensor, or an input an `in_place` call writes)
    is an argument of the `jax.jit` being lowered that is not donated, so XLA copies it
    before every call (warned once per kernel and operand: donate it,
    `jax.jit(f, donate_argnums=...)`, or pass a value that is dead after the call)."""


class JitBuildWarning(UserWarning):
    """A kernel call no built variant fit was compiled just in time (`cutecc.load(jit=True)`
    or `$CUTECC_JIT=1`), once per kernel and call signature: add the variant to the
    manifest (`cutecc misses --toml` prints it) so that `cutecc build` ships it."""


class CallTypeError(CuteccError, TypeError):
    """A kernel call passing what the kernel cannot take: an unknown or missing keyword, a
    non-array where an array goes, a runtime scalar of the wrong type. Exit 1, as `CallError`."""

    exit_code: ClassVar[int] = 1
