"""How `cutecc build` shows progress: a bar with a total on a terminal, one plain line per
finished entry otherwise (so CI logs show progress), and a line whenever the build waits
for another process's lock. All of it on stderr; `-q` or `--json` silence it."""

from __future__ import annotations

import sys
from typing import Any

import click

from cutecc.build.outcome import Outcome, Progress
from cutecc.plan.build_plan import Planned


class BuildProgress(Progress):
    def __init__(self, quiet: bool = False, tty: bool | None = None) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.bar: Any = None
        self.total = 0
        self.done_count = 0

    def start(self, total: int) -> None:
        self.total = total
        if self.quiet or not self.tty:
            return
        self.bar = click.progressbar(length=total, label="building", file=sys.stderr,
                                     show_pos=True, item_show_func=lambda s: s)
        self.bar.__enter__()

    def waiting(self, planned: Planned) -> None:
        if not self.quiet:
            click.echo(f"waiting for {planned.label} {planned.key[:12]}: another process holds "
                       "its lock (building it?)", err=True)

    def done(self, outcome: Outcome) -> None:
        self.done_count += 1
        if self.quiet:
            return
        text = f"{outcome.status:7} {outcome.planned.label}"
        if self.bar is not None:
            self.bar.update(1, text)
        else:
            click.echo(f"[{self.done_count}/{self.total}] {text} ({outcome.seconds:.1f}s)", err=True)

    def note(self, text: str) -> bool:
        if not self.quiet:
            click.echo(text, err=True)
        return not self.quiet

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
