"""The one exception type cutecc raises for bad input, with where it was found."""

from __future__ import annotations


class CuteccError(Exception):
    """A user-facing error: what was wrong and where (file, key path or argument).

    The CLI renders it as one line on stderr and exits with `exit_code`
    (2 for bad input, as click does for usage errors; 1 for failures at work).
    """

    def __init__(
        self, message: str, *, where: str | None = None, key_path: str | None = None,
        exit_code: int = 2,
    ) -> None:
        self.message = message
        self.where = where
        self.key_path = key_path
        self.exit_code = exit_code
        super().__init__(self.render())

    def render(self) -> str:
        parts = [p for p in (self.where, self.key_path) if p]
        prefix = ": ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message
