"""What planning reads of closure sources (`cutecc.plan.sourcefacts`): the scan of import
statements gives what the whole file's `ast` gives, over real closures, the standard library
and the tokenizer's corner cases; a file it cannot be sure of is parsed whole; a project's own
file is parsed whole (its syntax errors reported with their line); the top-level names
`lacks` reads are the whole tree's."""

from __future__ import annotations

import ast
import importlib.util
import random
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cutecc.errors import CuteccError
from cutecc.plan import sourcefacts
from cutecc.plan.key import SourceIndex
from cutecc.toolchain.planfacts import SourceFacts, TopNames


def whole(data: bytes) -> SourceFacts:
    """The facts of the whole file, as `ast` gives them, in `parse`'s order: every import
    statement, and the top level's `def` and `class` names."""
    tree = ast.parse(data)
    found: list[list[Any]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend([0, a.name, None] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append([node.level, node.module or "", [a.name for a in node.names]])
    defs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return SourceFacts(sorted(found, key=lambda i: (i[1], i[0], i[2] is not None, i[2] or [])), sorted(defs))


def same(src: str, scanned: bool | None = True) -> bytes:
    """`src`'s facts are the whole file's; and the scan read it (not `ast`) when `scanned`
    (None: either)."""
    data = textwrap.dedent(src).encode()
    assert sourcefacts.parse(data, Path("m.py")) == whole(data)
    if scanned is not None:
        assert (sourcefacts.scan(data) is not None) == scanned
    return data


def test_the_dsl_closure_gives_the_whole_files_facts() -> None:
    """Every source of `cutlass.cute`'s closure (the DSL, 180-odd files), as planning walks
    them; nearly all read by the scan."""
    pytest.importorskip("cutlass")
    files = SourceIndex((Path.cwd(),)).files("cutlass.cute")
    assert len(files) > 100
    scanned = 0
    for f in files:
        data = Path(f.path).read_bytes()
        assert sourcefacts.parse(data, Path(f.path)) == whole(data), f.path
        scanned += sourcefacts.scan(data) is not None
    assert scanned > len(files) * 9 // 10


@pytest.mark.parametrize("module", ["quack.rmsnorm", "flash_attn.cute.interface"])
def test_installed_entry_closures_give_the_whole_files_facts(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed (the examples extra)")
    for f in SourceIndex((Path.cwd(),)).files(module):
        data = Path(f.path).read_bytes()
        assert sourcefacts.parse(data, Path(f.path)) == whole(data), f.path


@pytest.mark.parametrize("package", ["asyncio", "email", "importlib", "json", "unittest", "xml", "logging"])
def test_the_standard_library_gives_the_whole_files_facts(package: str) -> None:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    files = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.py"))
    assert files
    for f in files:
        data = f.read_bytes()
        assert sourcefacts.parse(data, f) == whole(data), f


def test_import_statements_of_every_spelling() -> None:
    data = same('''
        import os
        import a . b as c, d.e, \\
            f
        from . import (a,
                       b as bb,
        )
        from .. x . y import z
        from.sib import w
        from .import v
        from ...up import *
        from a \\
            import b
        from q import \\
            r, s
        x = {1: 2}; import semi; from semi2 import t
        if x: import inline
        try: import tried
        except ImportError: from fallback import u
        class C: import in_class
        def f():
            import deep as dp
            return lambda: __import__("not_a_statement")
        s = "import in_a_string"
        # import in_a_comment
        t = f"{x} import in_an_f_string"
        doc = """
        import in_a_docstring
        """
        importlib.import_module("not_seen_by_ast_either")
        reimport = simport = 1
    ''')
    facts = sourcefacts.parse(data, Path("m.py"))
    got = facts.imports
    assert facts.defs == ["C", "f"]
    assert [0, "a.b", None] in got and [2, "x.y", ["z"]] in got and [1, "", ["v"]] in got
    assert [3, "up", ["*"]] in got and [0, "deep", None] in got
    assert not any("string" in i[1] or "comment" in i[1] or "docstring" in i[1] for i in got)


@pytest.mark.parametrize("src", [
    # a string's lines at column 0 holding `import` and `def`: not code
    '''
    def f():
        s = """
    import os
    def fake():
    """
        return s
    import sys
    ''',
    # a bracket continued at column 0 inside a method
    '''
    class A:
        def f(self):
            x = g(
    1)
            return x
        import sys
    ''',
    # a backslash continuation below the indent
    '''
    def f():
        x = 1 + \\
    2
        return x
    from a import b
    ''',
    # a one-quoted string continued by a backslash-newline (left to `ast`)
    '''
    def f():
        s = "abc\\
    def"
    import os
    ''',
    # strings and comments holding quotes, hashes and keywords
    '''
    def f():
        a = "it's # not a comment"
        b = 'say "import"'  # a comment with "quotes" and 'import'
        c = """x""" + \'\'\'y\'\'\' + """""" + r"\\"" + b'\\\\'
        d = """""text""" + """a\\"""b"""
        return a
    from z import w
    ''',
    # headers spread over lines, colons inside brackets, a lambda in a default
    '''
    def f(a: dict[str, int] = {1: 2},
          b=lambda y: y[1:2],
    ) -> "X":
        pass
    class K(
        Base,
    ):
        x: int = 1
    import k
    ''',
    # headers with their bodies on the same line, an import among them
    '''
    def f(): return 1
    class E(Exception): pass
    if x: import a
    ''',
    # keywords inside brackets at a line's start
    '''
    def f():
        y = (a if b
    else c)
        z = [i
    for i in y
    if i]
        d = {
            k
            if k
            else j:
                1,
        }
        return {k: v
                for k, v in d}
    import q
    ''',
    # a top-level match and async with, definitions inside them (not top-level)
    '''
    match command:
        case [x]:
            def handler():
                return 1
        case _:
            class Other:
                y = 2
    async def main():
        async with lock:
            pass
    ''',
    # a star import; globals(); __getattr__
    '''
    from m import *
    def __getattr__(name):
        return globals()[name]
    ''',
    # a file that ends inside a function, without a newline
    '''
    def f():
        return 1''',
    # nested functions and classes, an import only deep inside
    '''
    def outer():
        def mid():
            class Inner:
                def deep(self):
                    if x:
                        for y in z:
                            import deepmod
            return Inner
        return mid
    ''',
    # decorators and a class whose body is only a docstring
    '''
    @a.b(c)
    @d
    class X:
        """Doc."""
    @property
    def p(self):
        """Doc."""
    ''',
])
def test_corner_cases_give_the_whole_files_facts(src: str) -> None:
    same(src, scanned=None)


@pytest.mark.parametrize("data", [
    b"def f():\n\tx = 1\n\treturn x\nimport os\n",  # a tab: the whole file
    b"def f():\r\n    x = 1\r\n    return x\r\nimport os\r\n",  # carriage returns
    b"# -*- coding: cp1252 -*-\ndef f():\n    return '\x80'\nimport os\n",  # another codec
    b"import \xc3\xa9t\xc3\xa9\n",  # a name that is not ASCII (`ast` normalizes it)
    b"x = 'abc\\\ndef'\nimport os\n",  # a one-quoted string continued by a backslash-newline
])
def test_what_the_scan_does_not_read_is_parsed_whole(data: bytes) -> None:
    assert sourcefacts.scan(data) is None
    assert sourcefacts.parse(data, Path("m.py")) == whole(data)


@pytest.mark.parametrize("data", [
    b"\xef\xbb\xbfimport os\n",  # a byte order mark before the first statement
    b"# -*- coding: utf-8 -*-\nimport os\n",
    b"# -*- coding: latin-1 -*-\ndef f():\n    return '\xe9'\nimport os\n",
])
def test_what_reads_ascii_as_ascii_is_scanned(data: bytes) -> None:
    assert sourcefacts.scan(data) == whole(data) != SourceFacts([], [])


@pytest.mark.parametrize("data", [
    # a lone carriage return ends a comment (CPython reads it as a line end)
    b"# a\rimport os\n",
    b"#\rdef f(): pass\n",
    b"if 1:\n    pass # x\r    import os\n",
    b'#\r"""\nimport os\n#"""\n',
    b'#\rx = """\ndef f(): pass\n#"""\n',
    # a definition's keyword and name on two physical lines
    b"class\\\nA: pass\n",
    b"def\\\nf(): pass\n",
    b"async\\\ndef f(): pass\n",
    # a line at column 0 that continues a nested statement: not a top-level definition
    b"class C:\n    async \\\ndef f(): pass\n",
    b"if 1:\n    \\\ndef f(): pass\n",
    b"def g():\n    pass\n    \\\nclass A: pass\n",
    b"\\\nclass Z: pass\n",  # a backslash-only line at column 0: the class is top-level
    # two encodings declared: line 1's is CPython's, and it reads ASCII bytes otherwise
    b"# coding: utf-7\n# coding: utf-8\n# +AAo-import os\n",
    b"# coding: utf-7\n# coding: utf-8\n#+AAo-def f(): pass\n",
    b"# coding: hz\n# coding: utf-8\n#~\nimport os\n",
    b"# x\r# coding: utf-7\n# coding: utf-8\n# +AAo-import os\n",
])
def test_what_a_hostile_tester_found_gives_the_whole_files_facts(data: bytes) -> None:
    """Valid sources a review found the scan misread (it now reads them right, or leaves
    them to `ast`)."""
    got = sourcefacts.scan(data)
    assert got is None or got == whole(data)
    assert sourcefacts.parse(data, Path("m.py")) == whole(data)


@pytest.mark.parametrize("data", [
    b"import a;\\\n" * 20_000 + b"import a\n",  # one logical line of 20,000 physical ones
    b'x = """' + b"\n" * 20_000 + b'"""' + b"; import a" * 20_000 + b"\n",
    b"import a;" * 100_000 + b"\n",  # 100,000 statements on one line
    b"x = 1" + b" " * 1_000_000 + b"; import a\n",
    b"from a import b" + b", \\\n c" * 20_000 + b"\n",  # one statement of 20,000 lines
    b"import b" + b", \\\n c" * 20_000 + b"\n",
])
def test_long_logical_lines_cost_a_linear_scan(data: bytes) -> None:
    t0 = time.process_time()
    got = sourcefacts.scan(data)
    assert time.process_time() - t0 < 2
    assert got == whole(data)


@pytest.mark.parametrize("data", [
    b"from a import (b):" * 50_000 + b"\n",  # colons between imports, no statement's
    b"import a " * 50_000 + b"\n",  # nothing between them
])
def test_a_broken_line_of_many_imports_costs_a_linear_scan(data: bytes) -> None:
    """Invalid files of one long line of import keywords (an installed file's syntax is the
    build's import's to check): the scan stays linear, whatever it reads of them."""
    t0 = time.process_time()
    sourcefacts.scan(data)
    assert time.process_time() - t0 < 2


# Fragments a generated program is made of (`test_generated_programs_give_the_whole_files_facts`)
_GAPS = [" ", "  ", " \\\n", "\\\n  "]
_NAMES = ["a", "os", "x_1", "match", "type", "import_", "_"]
_VALUES = ["1", "'a'", '"#"', "r'\\\\'", "b'import x'", '"""q\nimport z\n"""', "f'{x}'", "{1: 2}",
           "[1,\n2]", "(lambda: 0)", "x[1:2]", "(a if b\nelse c)"]
_HEADERS = ["if x", "class K(B)", "def f(a={1: 2})", "async def g()", "for i in y", "with a as b",
            "class\\\nQ", "def \\\nh()", "try"]


def _program(r: random.Random) -> str:
    def gap() -> str:
        return r.choice(_GAPS)

    def dotted() -> str:
        return (r.choice(["", " ", "\\\n"]) + "." + r.choice(["", " "])).join(
            r.choice(_NAMES) for _ in range(r.randint(1, 3)))

    def statement() -> str:
        k = r.random()
        if k < 0.3:
            return "import" + gap() + ("," + gap()).join(
                dotted() + (gap() + "as" + gap() + r.choice(_NAMES) if r.random() < 0.3 else "")
                for _ in range(r.randint(1, 3)))
        if k < 0.55:
            names = [r.choice(_NAMES) for _ in range(r.randint(1, 3))]
            bracketed = "(" + ",\n ".join(names) + r.choice(["", ","]) + ")"
            listed = "*" if r.random() < 0.1 else (bracketed if r.random() < 0.4 else ", ".join(names))
            dots = "." * r.randint(0, 3)
            module = dotted() if not dots or r.random() < 0.5 else ""
            first = gap() if module or not dots else r.choice(["", " "])
            return "from" + first + dots + module + gap() + "import " + listed
        return r.choice(["x = ", "y: int = ", "z = f("]) + r.choice(_VALUES) + (")" if k > 0.9 else "")

    def block(indent: str, depth: int) -> list[str]:
        lines = []
        for _ in range(r.randint(1, 4)):
            line = "; ".join(statement() for _ in range(r.randint(1, 2)))
            if r.random() < 0.2:
                line += r.choice(["  # import q", " # 'x\"", ";"])
            if depth < 2 and r.random() < 0.3:
                header = r.choice(_HEADERS)
                lines += [indent + header + ":", *block(indent + "    ", depth + 1)]
                if header == "try":
                    lines += [indent + "except E:", *block(indent + "    ", depth + 1)]
            else:
                lines.append(indent + line)
        return lines

    return "\n".join(block("", 0)) + r.choice(["\n", ""])


def test_generated_programs_give_the_whole_files_facts() -> None:
    """Programs made of import statements of every spelling, strings, comments, brackets and
    nested blocks, joined by spaces and backslash-newlines at random: every one `ast` accepts
    gives the whole file's facts when scanned, and most are scanned."""
    r = random.Random(45)
    valid = scanned = 0
    for _ in range(3_000):
        data = _program(r).encode()
        try:
            expected = whole(data)
        except SyntaxError:
            continue
        valid += 1
        got = sourcefacts.scan(data)
        if got is not None:
            scanned += 1
            assert got == expected, data
    assert valid > 1_000 and scanned > valid // 2


def test_under_python_3_12_an_f_string_file_is_parsed_whole() -> None:
    data = b"def f(x):\n    return f'{x}'\nimport os\n"
    assert (sourcefacts.scan(data) is None) == (sys.version_info >= (3, 12))
    assert sourcefacts.parse(data, Path("m.py")) == whole(data)


def test_a_syntax_error_is_reported_with_its_line_where_the_file_is_checked() -> None:
    """A project's own source (`check`) is parsed whole; an installed one is scanned, its
    syntax left to the build's import."""
    data = b"import os\n\ndef ok():\n    return 1\n\ndef bad(:\n    pass\n"
    with pytest.raises(CuteccError, match=r"syntax error: .* \(line 6\)") as info:
        sourcefacts.parse(data, Path("bad.py"), check=True)
    assert info.value.where == "bad.py"
    assert sourcefacts.parse(data, Path("bad.py")) == SourceFacts([[0, "os", None]], ["bad", "ok"])


def test_a_broken_import_statement_is_parsed_whole_and_reported() -> None:
    data = b"import os\nfrom x import\n"
    with pytest.raises(CuteccError, match=r"syntax error: .* \(line 2\)"):
        sourcefacts.parse(data, Path("m.py"))


@pytest.mark.parametrize("line", [
    b'x = "' + b'\\"' * 200_000 + b"\n",  # a string never closed, of escaped quotes
    b"x = '" + b"\\'" * 200_000 + b"\n",
    b'x = """' + b'x\\"""' * 100_000 + b"\n",  # closing quotes all escaped
    b"y = 1  # " + b"\"'" * 200_000 + b"\n",  # a comment of quotes
])
def test_hostile_quotes_cost_a_linear_scan(line: bytes) -> None:
    """Bytes shaped to make each quote start a scan to the line's or file's end: the scan
    stays linear (the file is parsed whole where it cannot tell), and says the same."""
    data = b"import os\n\ndef f():\n    return 1\n" + line
    t0 = time.process_time()
    sourcefacts.scan(data)
    assert time.process_time() - t0 < 2
    try:
        expected: SourceFacts | str = whole(data)
    except SyntaxError:
        expected = "syntax error"
    try:
        got: SourceFacts | str = sourcefacts.parse(data, Path("m.py"))
    except CuteccError as e:
        assert "syntax error" in e.message
        got = "syntax error"
    assert got == expected


def test_many_import_keywords_cost_a_linear_scan() -> None:
    data = b"import os\n" + b"x = 1; import a, b; from c import (d, e)\n" * 50_000
    t0 = time.process_time()
    got = sourcefacts.scan(data)
    assert time.process_time() - t0 < 5
    assert got is not None and len(got.imports) == 1 + 3 * 50_000


def test_top_names_are_the_top_level_s() -> None:
    data = textwrap.dedent('''
        import os.path
        from . import a, b as c
        def f(): x = 1
        class C:
            inner = 2
        if TYPE:
            def g(): pass
        else:
            h = other(f(1), key=word)
        try:
            import json as j
        except ImportError:
            j = None
        for i in range(3):
            k = i
        async def co(): pass
    ''').encode()
    got = sourcefacts.top_names(data, Path("m.py"))
    assert got.names is not None
    assert {"os", "a", "c", "f", "C", "g", "h", "other", "word", "j", "k", "co"} <= set(got.names)
    assert not {"x", "inner", "key", "b", "path"} & set(got.names)
    assert sourcefacts.top_names(b"from m import *\n", Path("m.py")) == TopNames(None)


def test_defs_are_the_top_level_s_def_and_class_statements() -> None:
    data = same('''
        """Docstring naming
        class InDoc: ...
        """
        @decorated
        class Kernel(Base):
            def method(self): ...
        async  def co(): ...
        def fn(
            x,
        ): return x
        if flag:
            def nested(): ...
        Kernel2 = Kernel
    ''')
    assert sourcefacts.parse(data, Path("m.py")).defs == ["Kernel", "co", "fn"]
    same("def f\u00e9(): pass\n", scanned=False)  # a name `ast` normalizes
