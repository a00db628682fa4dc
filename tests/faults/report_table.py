"""Print docs/faults.md's results table from the JSON the fault suite writes.

    CUTECC_FAULT_REPORT=faults.json .venv/bin/python -m pytest tests/faults
    .venv/bin/python tests/faults/report_table.py faults.json

Every number comes from the run: the suite adds a count only after the assertions about
it passed, so a count of lost or wrongly accepted entries other than 0 cannot appear.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def table(report: dict[str, Any]) -> str:
    s = report["sections"]
    c, k, d, m, st, ca = (s.get(n, {}) for n in ("concurrency", "crashes", "damage", "manifests",
                                                 "storage", "calls"))

    def g(section: dict[str, int], key: str) -> int:
        return section.get(key, 0)

    kinds = sum(n.startswith("planted_") for n in d)
    phases = ", ".join(f"{n.removeprefix('killed_build_in_')} {v}" for n, v in sorted(k.items())
                       if n.startswith("killed_build_in_"))
    rows = [
        ("processes on one cache at once",
         f"{g(c, 'max_concurrent_processes')} store processes at once ({g(c, 'publishes_attempted')}"
         f" publishes of {g(c, 'keys_built')} keys; {g(c, 'churn_builds')} builds and "
         f"{g(c, 'churn_removals')} removals under gc/rm churn); "
         f"{g(c, 'real_max_concurrent_builds')} `cutecc build` processes at once with list/verify/"
         f"gc/load observers; {g(c, 'entries_observed_whole')} entry observations",
         f"{g(c, 'real_compilations')} compilations for {g(c, 'real_variants')} variants; "
         "every key built once; 0 half-visible"),
        ("SIGKILL",
         f"{g(k, 'store_kills')} kills in publish/remove, gc, quarantine, stats, cache creation; "
         f"{g(k, 'build_kills')} kills of `cutecc build` (builds caught in: {phases})",
         f"{g(k, 'entries_lost')} lost, {g(k, 'entries_half_visible')} half-visible; next build "
         "completes; leftovers swept"),
        ("damaged files",
         f"{g(d, 'planted')} planted ({kinds} kinds); {g(d, 'unsafe_permissions_planted')} "
         "unsafe permissions",
         f"{g(d, 'detected_by_verify')} reported by verify, {g(d, 'refused_by_runtime')} refused by"
         f" the runtime, {g(d, 'mapped_while_damaged')} mapped; "
         f"{g(d, 'unsafe_permissions_refused')} unsafe caches refused"),
        ("full disk, read-only cache",
         f"{g(st, 'full_disk_failures')} out-of-space builds; {g(st, 'read_only_commands')} commands "
         "on a read-only cache",
         f"{g(st, 'full_disk_entries_lost')} entries lost, {g(st, 'read_only_bytes_changed')} bytes "
         "changed, no traceback"),
        ("malformed manifests",
         f"{g(m, 'tried')} generated ({len([n for n in m if n.startswith('kind_')])} kinds); "
         f"{g(m, 'valid_edge_cases_planned')} valid edge cases",
         f"{g(m, 'rejected_exit_2')} rejected with exit 2 naming file and key path; "
         f"{g(m, 'tried') - g(m, 'wrote_nothing')} wrote anything"),
        ("bad calls",
         f"{g(ca, 'generated')} generated calls; {g(ca, 'bad_scalars_refused')} bad scalars, "
         f"{g(ca, 'wrong_device_refused') + g(ca, 'placement_refused')} wrong device/placement, "
         f"{g(ca, 'wrong_arch_refused')} archs without a build",
         f"{g(ca, 'accepted_as_predicted')} accepted and {g(ca, 'rejected_as_predicted')} refused"
         " as the contracts predict; 0 wrongly accepted"),
    ]
    out = ["| fault | what the suite did | outcome |", "| --- | --- | --- |"]
    out += [f"| {a} | {b} | {c_} |" for a, b, c_ in rows]
    return "\n".join(out) + f"\n\n({'soak' if report.get('soak') else 'default'} run, " \
        f"{report.get('seconds')} s of fixtures and tests)\n"


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())), end="")
