"""What every command returns: a report with a text rendering for people and a JSON one
for programs.

The command line only chooses between them (`--json`), so a command's library function
and its output are tested without the CLI. Every JSON report carries `format` (this
module's `REPORT_FORMAT`) and writes times as ISO 8601 UTC (`cutecc.units.iso`).
"""

from __future__ import annotations

from typing import Any

REPORT_FORMAT = 1


class Report:
    """Base of command reports: `lines` (stdout), `warnings` (stderr), `to_json`, `exit_code`."""

    def lines(self, verbose: int = 0) -> list[str]:
        """The report for people; `verbose` > 0 shows more, < 0 only the essentials."""
        return []

    def warnings(self) -> list[str]:
        """Lines for stderr: what went wrong, printed whatever the verbosity."""
        return []

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def json(self) -> dict[str, Any]:
        """`to_json()` with the report format first."""
        return {"format": REPORT_FORMAT, **self.to_json()}

    @property
    def exit_code(self) -> int:
        return 0
