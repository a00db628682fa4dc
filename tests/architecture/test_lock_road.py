"""One road to kernels.lock: every command writes and signs it through `record_lock`.

`cutecc tune` once merged its winners, wrote the lock and signed it on a path of its own
beside the builder's. Read from the source (never by importing it): in `cutecc/`, the
lock's writer (`write_lock`), the file signer (`sign_file`) and what removes a signature of
the lock's old bytes (`drop_stale_signature`) are called only inside `record_lock`
(cutecc/lock/lockfile.py), and both commands that record a lock, `build` (through the
builder) and `tune`, call `record_lock`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"
ROAD = ("cutecc/lock/lockfile.py", "record_lock")
GUARDED = {"write_lock", "sign_file", "drop_stale_signature"}  # what writes the lock, signs it, unsigns it
RECORDERS = ("cutecc/build/builder.py", "cutecc/commands/tune.py")


def _name(call: ast.Call) -> str | None:
    fn = call.func
    return fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None


def _calls(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(enclosing function, called name, line) of every call, the function dotted
    (`outer.inner`; "" at module level)."""
    out: list[tuple[str, str, int]] = []

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, f"{where}.{child.name}" if where else child.name)
                continue
            if isinstance(child, ast.ClassDef):
                walk(child, f"{where}.{child.name}" if where else child.name)
                continue
            if isinstance(child, ast.Call):
                name = _name(child)
                if name:
                    out.append((where, name, child.lineno))
            walk(child, where)

    walk(tree, "")
    return out


def _sources() -> dict[str, ast.AST]:
    return {f"cutecc/{p.relative_to(ROOT).as_posix()}": ast.parse(p.read_text(), str(p))
            for p in sorted(ROOT.rglob("*.py"))}


def test_only_record_lock_writes_or_signs_the_lock() -> None:
    stray = [f"{path}:{line} {where or '<module>'} calls {name}"
             for path, tree in _sources().items() for where, name, line in _calls(tree)
             if name in GUARDED and (path, where) != ROAD]
    assert not stray, "the lock is written or signed off its one road (record_lock):\n" + "\n".join(stray)


def test_the_road_itself_writes_and_signs() -> None:
    """The test above guards something: `record_lock` is where both calls are."""
    tree = _sources()[ROAD[0]]
    assert {name for where, name, _ in _calls(tree) if where == ROAD[1]} >= GUARDED


def test_build_and_tune_record_through_the_road() -> None:
    sources = _sources()
    for path in RECORDERS:
        assert any(name == "record_lock" for _, name, _ in _calls(sources[path])), \
            f"{path} no longer records its lock through record_lock"
