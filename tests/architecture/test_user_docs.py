"""The README is the user's: within 400 lines, its first project (`cutecc init` -> `cutecc
build` -> a call from JAX, with what each prints) in its first 60, its printed output the
commands' own, the two commands `.ci/run` runs word for word, and every relative link in the
user and contributor docs pointing at a file and heading that exist. The quickstart's calls
on a GPU: tests/gpu/test_readme_gpu.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from helpers import PY, REPO, run_cli

README = REPO / "README.md"
DOCS = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md")),
        REPO / "examples" / "README.md",
        REPO / "benchmarks" / "README.md", REPO / "benchmarks" / "HISTORY.md"]


def _console(text: str, command: str) -> list[str]:
    """The lines a ```console block shows after `$ command`, up to the next `$` or the fence."""
    m = re.search(rf"^\$ {re.escape(command)}\n(.*?)(?=^\$ |^```)", text, re.M | re.S)
    assert m, f"README.md shows no `$ {command}`"
    return m.group(1).splitlines()


def test_the_readme_is_within_400_lines_and_opens_with_the_users_first_project() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 400, len(lines)
    first = "\n".join(lines[:60])
    steps = ("$ cutecc init myproject", "$ cd myproject && cutecc build", ">>> kernels = cutecc.load()",
             ">>> kernels.scale(", "Array([0., 2., 4., 6.], dtype=float32)")
    for step in steps:
        assert step in first, f"not in README.md's first 60 lines: {step}"
    assert [first.index(s) for s in steps] == sorted(first.index(s) for s in steps)


def test_the_readme_keeps_the_two_commands_ci_runs_word_for_word() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    commands = [re.search(rf"^{v}='(.*)'$", ci, re.M) for v in ("INSTALL", "TEST")]
    assert all(commands), "the INSTALL and TEST variables of .ci/run"
    text = README.read_text()
    for m in commands:
        assert m is not None and f"\n{m.group(1)}\n" in text, m and m.group(1)


def test_cutecc_init_prints_what_the_readme_shows(tmp_path: Path) -> None:
    r = run_cli("init", "myproject", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == _console(README.read_text(), "cutecc init myproject")


def test_the_readmes_build_and_kernel_print_what_it_shows(dsl: None, tmp_path: Path) -> None:
    """The starter project built from an empty cache prints the README's lines (timings and
    paths aside), and the loaded kernel's repr is the README's."""
    text = README.read_text()
    assert run_cli("init", "myproject", cwd=tmp_path).returncode == 0
    proj, cache = tmp_path / "myproject", tmp_path / "cache"
    r = run_cli("build", env={"CUTECC_CACHE_DIR": str(cache)}, cwd=proj)
    assert r.returncode == 0, r.stderr
    def shape(line: str) -> str:
        return re.sub(r"\(\d+\.\d+s\)|in \d+\.\d+s \(.*\)$|wrote /.*/myproject/", "#", line)
    got = [shape(x) for x in (r.stderr + r.stdout).splitlines() if x.strip()]
    assert sorted(got) == sorted(shape(x) for x in _console(text, "cd myproject && cutecc build"))
    shown = re.search(r">>> kernels\.scale\n(.*?)\n>>> ", text, re.S)
    assert shown, "README.md's repr of kernels.scale"
    # arch: what an H100 or H200 reports (the README's session ran there)
    code = (f"import cutecc; print(repr(cutecc.load({str(cache)!r}, arch='sm_90').scale))")
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300, cwd=proj)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == shown.group(1)


def _slugs(md: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings (outside code fences)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6} (.*)", line)
        if m:
            s = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_every_relative_link_of_the_docs_reaches_a_file_and_heading() -> None:
    bad = []
    for f in DOCS:
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)
        for t in re.findall(r"\]\(([^)\s]+)\)", text):
            if t.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = t.partition("#")
            target = (f.parent / path) if path else f
            if not target.exists():
                bad.append(f"{f.relative_to(REPO)}: {t} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _slugs(target):
                bad.append(f"{f.relative_to(REPO)}: {t} (no such heading)")
    assert bad == []
