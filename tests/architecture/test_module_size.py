"""No module under `cutecc/` passes 600 lines: one that grows past it is split by concept
into modules of the same folder (the same layer), each named for what it holds, and each
named in docs/architecture.md's package tree.

The cap is a smell detector, not a rule to satisfy: a class is never split across modules to
fit it (by inheritance or mixins). A module over the cap because it holds one class whole is
named in `WHOLE_CLASSES`, with the class and why it is one; the list holds exactly the
modules over the cap, so an entry goes when its module shrinks back."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "cutecc"
MAX_LINES = 600
# module: (the one class it holds whole, why that is one concept)
WHOLE_CLASSES = {
    "cutecc/store/writer.py": ("Store", "every create and delete in the cache, the build records' "
                               "among them, is the one writer's (issue 46 joined its two halves)"),
}


def test_no_module_passes_600_lines() -> None:
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert sizes, f"no module found under {ROOT}"
    over = sorted((n, path) for path, n in sizes.items() if n > MAX_LINES and path not in WHOLE_CLASSES)
    assert over == [], (f"modules over {MAX_LINES} lines (split each by concept, in its folder): "
                        + ", ".join(f"{path} ({n})" for n, path in over))
    gone = sorted(p for p in WHOLE_CLASSES if sizes.get(p, 0) <= MAX_LINES)
    assert gone == [], f"under the cap now (drop them from WHOLE_CLASSES): {gone}"


def test_a_module_over_the_cap_is_its_class_whole() -> None:
    """The class named holds most of its module, and no class anywhere derives from it to
    carry its methods elsewhere (nor is it a derived half: its bases are outside its folder)."""
    for path, (name, _) in WHOLE_CLASSES.items():
        tree = ast.parse((ROOT.parent / path).read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        assert cls.end_lineno is not None
        assert cls.end_lineno - cls.lineno > MAX_LINES // 2, f"{path}: {name} is not most of it"
        for p in ROOT.rglob("*.py"):
            for n in ast.walk(ast.parse(p.read_text())):
                if isinstance(n, ast.ClassDef):
                    assert name not in {ast.unparse(b).split(".")[-1] for b in n.bases}, (
                        f"{p}: {n.name} derives from {name}, whose module is over the cap")


# base class: why it is a concept of its own, not half of the one class deriving from it
BASES_OF_THEIR_OWN = {
    "StoreView": "reading the cache, what the runtime imports (it never imports the writer, `Store`)",
}


def test_no_class_is_split_across_modules_of_one_folder() -> None:
    """A class whose base is defined in another module of its own folder, and is derived
    from nowhere else, is one class in two files (as the store's writer was): join them.
    Bases shared by several classes (a front end's `KernelBase`) are concepts of their own,
    and so are those of `BASES_OF_THEIR_OWN`."""
    defined: dict[str, str] = {}
    derived: dict[str, list[tuple[str, str]]] = {}
    for p in ROOT.rglob("*.py"):
        rel = str(p.relative_to(ROOT.parent))
        for n in ast.parse(p.read_text()).body:
            if isinstance(n, ast.ClassDef):
                defined[n.name] = rel
                for b in n.bases:
                    derived.setdefault(ast.unparse(b).split(".")[-1], []).append((n.name, rel))
    halves = []
    for base, subs in derived.items():
        home = defined.get(base)
        if home is None or len(subs) != 1 or base in BASES_OF_THEIR_OWN:
            continue
        name, rel = subs[0]
        if rel != home and Path(rel).parent == Path(home).parent and not base.endswith(("Error", "Base")):
            halves.append(f"{rel}: {name}({base}) of {home}")
    assert halves == [], f"a class split across modules (join it): {halves}"
