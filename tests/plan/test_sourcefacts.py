"""The skimmed parse of closure sources (`cutecc.plan.sourcefacts`) gives the facts the whole
file's `ast` parse gives: import statements (in `ast.walk`'s order) and top-level names, over
real closures and over the tokenizer's corner cases; and a file it cannot be sure of is
parsed whole."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cutecc.errors import CuteccError
from cutecc.plan import sourcefacts
from cutecc.plan.key import SourceIndex
from cutecc.toolchain.planfacts import SourceFacts


def whole(data: bytes) -> SourceFacts:
    """The facts of the whole file, parsed by `ast` (what planning read before the skim)."""
    return sourcefacts._facts(ast.parse(data), frozenset())


def same(src: str) -> bytes:
    data = textwrap.dedent(src).encode()
    assert sourcefacts.parse(data, Path("m.py")) == whole(data)
    return data


def put_aside(data: bytes) -> bool:
    """Whether the skim set anything aside (the facts then came from fewer bytes)."""
    skimmed = sourcefacts.skim(data)
    return skimmed is not None and skimmed[0] != data


def test_the_dsl_closure_gives_the_whole_files_facts() -> None:
    """Every source of `cutlass.cute`'s closure (the DSL, 180-odd files) and of the examples'
    installed entries, as planning walks them."""
    pytest.importorskip("cutlass")
    index = SourceIndex((Path.cwd(),))
    files = index.files("cutlass.cute")
    assert len(files) > 100
    skimmed = 0
    for f in files:
        data = Path(f.path).read_bytes()
        assert sourcefacts.parse(data, Path(f.path)) == whole(data), f.path
        skimmed += put_aside(data)
    assert skimmed > len(files) // 2  # the skim did its work on most of them


@pytest.mark.parametrize("module", ["quack.rmsnorm", "flash_attn.cute.interface"])
def test_installed_entry_closures_give_the_whole_files_facts(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed (the examples extra)")
    index = SourceIndex((Path.cwd(),))
    for f in index.files(module):
        data = Path(f.path).read_bytes()
        assert sourcefacts.parse(data, Path(f.path)) == whole(data), f.path


def test_bodies_without_imports_are_put_aside_and_imports_in_bodies_kept() -> None:
    data = same('''
        import os
        from . import a, b as c

        @decorator(x=[1, 2])
        def f(x: int = 3, *args: "T", **kw) -> dict[str, int]:
            """A docstring with import in it: not an import statement."""
            y = {"k": (x,
            1)}
            return y

        class C(Base, metaclass=M):
            attr = value
            def m(self):
                if self:
                    import json
                else:
                    return [i for i in range(3)
                            if i]
                try:
                    pass
                except ValueError as e:
                    from .. import z
                finally:
                    q = 1
                for i in x:
                    while i:
                        i -= 1
                with open(p) as fh:
                    import re as regex

        async def g():
            async with x:
                pass
            await h()

        if TYPE:
            def inner(): return 1
        else:
            from x import (y,
                           w)
        top = other(f(1), key=word)
    ''')
    assert put_aside(data)
    got = sourcefacts.parse(data, Path("m.py"))
    assert [0, "json", None] in got.imports and [2, "", ["z"]] in got.imports
    assert got.names is not None and {"f", "C", "g", "top", "other", "inner", "w"} <= set(got.names)


@pytest.mark.parametrize("src", [
    # lines of a string below a body's indent: still the body
    '''
    def f():
        s = """
    import os
    def fake():
    """
        return s
    import sys
    ''',
    # a bracket continued below the body's indent
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
    # a one-quoted string continued by a backslash-newline (left to the whole parse)
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
    # a header on one line with its body (left as it is)
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
    # a top-level match and async with (walked for names): a body set aside in one is seen
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
    # a file that ends inside a body, without a newline
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
    same(src)


@pytest.mark.parametrize("data", [
    b"def f():\n\tx = 1\n\treturn x\nimport os\n",  # a tab: the whole file
    b"def f():\r\n    x = 1\r\n    return x\r\nimport os\r\n",  # carriage returns
    b"# -*- coding: latin-1 -*-\ndef f():\n    return '\xe9'\nimport os\n",  # an encoding declared
    b"\xef\xbb\xbfdef f():\n    return 1\nimport os\n",  # a byte order mark
])
def test_what_the_skim_does_not_read_is_parsed_whole(data: bytes) -> None:
    assert sourcefacts.parse(data, Path("m.py")) == whole(data)


def test_a_syntax_error_outside_the_bodies_set_aside_is_still_planning_s_to_report() -> None:
    data = b"def ok():\n    return 1\n\ndef bad(:\n    pass\n"
    with pytest.raises(CuteccError, match=r"syntax error: .* \(line 4\)"):
        sourcefacts.parse(data, Path("bad.py"))


def test_line_numbers_are_kept() -> None:
    """The skimmed text has the file's lines: an error outside the bodies names its line."""
    data = textwrap.dedent('''
        def f():
            a = 1
            b = """
        x
        """
            return a
        x = (
    ''').encode()
    skimmed = sourcefacts.skim(data)
    assert skimmed is not None and skimmed[0].count(b"\n") == data.count(b"\n")
    with pytest.raises(CuteccError, match=r"\(line 8\)"):
        sourcefacts.parse(data, Path("m.py"))


def test_under_python_3_12_an_f_string_file_is_parsed_whole() -> None:
    data = b"def f(x):\n    return f'{x}'\nimport os\n"
    assert (sourcefacts.skim(data) is None) == (sys.version_info >= (3, 12))
    assert sourcefacts.parse(data, Path("m.py")) == whole(data)


def test_headers_that_never_close_are_not_looked_for_over_and_over() -> None:
    """A broken file of 20,000 open brackets after header keywords, inside a function that
    imports: the skim gives up (the whole parse reports the error) in linear time."""
    data = b"# broken\n\ndef f():\n    import os\n" + b"    if (x:\n" * 20_000
    t0 = time.process_time()
    assert sourcefacts.skim(data) is None
    with pytest.raises(CuteccError, match="syntax error"):
        sourcefacts.parse(data, Path("m.py"))
    assert time.process_time() - t0 < 5


def test_a_header_continued_after_its_keyword_is_left_to_the_parse() -> None:
    same('''
        def \\
          f(x):
            return x
        class \\
            K:
            pass
        import os
    ''')


@pytest.mark.parametrize("line", [
    b'x = "' + b'\\"' * 200_000 + b"\n",  # a string never closed, of escaped quotes
    b"x = '" + b"\\'" * 200_000 + b"\n",
    b'x = """' + b'x\\"""' * 100_000 + b"\n",  # closing quotes all escaped
    b"y = 1  # " + b"\"'" * 200_000 + b"\n",  # a comment of quotes
])
def test_hostile_quotes_cost_a_linear_scan(line: bytes) -> None:
    """Bytes shaped to make each quote start a scan to the line's or file's end: the skim
    stays linear (the file is parsed whole where it cannot tell), and says the same."""
    data = b"import os\n\ndef f():\n    return 1\n" + line
    t0 = time.process_time()
    sourcefacts.skim(data)
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
