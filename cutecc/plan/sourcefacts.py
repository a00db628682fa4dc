"""What the key reads of a Python source file (`SourceFacts`): its import statements, anywhere
in it, and the names its top level surely binds, parsed with CPython's `ast` from fewer bytes.

A first planning parses every source of its closures (a published library's: a thousand
files, 36 MB), and `ast.parse` costs about 200 ns a byte. Most of those bytes are the bodies
of functions and classes, which no fact reads unless an import statement is in them: the
names are the top level's, and an import is a statement, spelled with the keyword `import`.
So before parsing, `skim` finds each such body that holds no `import` keyword outside its
strings and comments and puts `...` in its place (its lines left empty: every line number is
kept), and `ast` parses what is left; inside a function or class body, the blocks of its
compound statements (`if`, `for`, `try`, ...) are put aside the same way. The facts are the
same: what was put aside held no import statement (their order, breadth first, is that of
the statements left), and the top level's names are those of what is left.

Where the skim cannot be sure, the whole file is parsed: bytes it does not read as the
tokenizer would (a tab, form feed or carriage return outside strings, a string it does not
close on its line, a NUL, an f-string under Python 3.12's grammar), a file `ast` refuses once
skimmed (the whole file then says why, as before), and a set-aside body that a top-level
statement read for names would walk (inside a `match` or `async with` at the top level). One
difference is seen only in a broken file: a syntax error inside a body put aside is no longer
planning's to report; the build's import of the module reports it.
"""

from __future__ import annotations

import ast
import collections
import gc
import re
import sys
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError
from cutecc.toolchain.planfacts import SourceFacts

# A triple-quoted string's rest after its opening quotes, up to and with its closing ones.
_REST2 = rb'[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*"""'
_REST1 = rb"[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*'''"
# Strings and comments, left to right as the tokenizer meets them (each alternative starts
# with its own character, so the regex engine skips to the next one): a triple-quoted string
# over several lines is kept less its first quote (group t or u, for `_triple`), any other
# string or a comment is dropped (a backslash-newline inside a one-quoted string is not
# matched: its quote is left, and the whole file parsed). A backslash that does not end a line
# is dropped with what it escapes (none in code: a string's, misread), so each quote is tried
# once: a misread string, or one without its closing quote, costs a line's scan, not one per
# quote; with `_HIDDEN` refused, the substitution stays linear in the file's size.
_LINE2 = rb'""[^"\\\n]*(?:(?:\\[^\n]|"(?!""))[^"\\\n]*)*"""'  # a triple-quoted rest on one line
_LINE1 = rb"''[^'\\\n]*(?:(?:\\[^\n]|'(?!''))[^'\\\n]*)*'''"
_STRINGS = re.compile(rb'"(?:' + _LINE2 + rb'|(?P<t>""' + _REST2 + rb')|[^"\\\n]*(?:\\[^\n][^"\\\n]*)*")'
                      rb"|'(?:" + _LINE1 + rb"|(?P<u>''" + _REST1 + rb")|[^'\\\n]*(?:\\[^\n][^'\\\n]*)*')"
                      rb"|\#[^\n]*|\\[^\n\r]")
# A triple quote after a backslash: where a closing quote may be escaped, a file of them would
# have each opening one scanned to the file's end (parsed whole instead).
_HIDDEN = (b'\\"""', b"\\'''")
_SPACES = re.compile(rb"[\t\f\r]")  # in code (not a string): columns this does not count
_FSTRING = re.compile(rb"(?i)(?<![\w])(?:f|rf|fr)['\"]")
_HEADER = re.compile(rb"\n( *)(?:async +)?(def|class|if|elif|else|for|while|try|except|finally|with)\b")
_NAME = re.compile(rb" +([^ (:\[\n]+)")
_HEAD_PART = re.compile(rb"[()\[\]{}:\n]")
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_ENDS: dict[int, re.Pattern[bytes]] = {}
MAX_HEADER = 1 << 16  # bytes a header is looked for in (a broken file's open bracket: not to its end)
_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)
_ASIDE = (ast.Expr, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # what `skim` leaves


class _Unsure(Exception):
    """A skimmed file whose facts might not be the whole file's."""


def parse(data: bytes, f: Path) -> SourceFacts:
    """What the key reads of source `data` (file `f`): its import statements, anywhere in it,
    as `[level, module, names or None for a plain import]` in `ast.walk`'s order, and the
    names its top level surely binds (None when it may make names at run time: a star
    import). The cyclic garbage collector is paused meanwhile: a syntax tree holds no cycle
    (reference counts free it), and the collections its hundreds of thousands of nodes would
    set off, each walking everything planning holds, were a third of a cold plan's parsing."""
    paused = gc.isenabled()
    gc.disable()
    try:
        skimmed = skim(data)
        if skimmed is not None:
            try:
                return _facts(ast.parse(skimmed[0], filename=str(f)), skimmed[1])
            except (SyntaxError, ValueError, _Unsure):
                pass  # the whole file says
        try:
            tree = ast.parse(data, filename=str(f))
        except SyntaxError as e:
            raise CuteccError(f"syntax error: {e.msg} (line {e.lineno})", where=str(f)) from None
        return _facts(tree, frozenset())
    finally:
        if paused:
            gc.enable()


def _code(data: bytes) -> bytes | None:
    """`data` without its strings and comments, line for line: a one-line string and a
    comment dropped, a triple-quoted one as `S` with each of its line ends as a backslash-
    newline (its lines are one logical line), a newline put first (every line follows one);
    None where something is left that this does not read as the tokenizer would."""
    # `split` hands the text between matches and each match's groups t and u (None where
    # unmatched) to one join in C: no Python per string or comment (a published library's
    # closure holds hundreds of thousands), only per triple-quoted string kept
    parts = _STRINGS.split(data)
    for i in range(1, len(parts), 3):
        kept = parts[i] or parts[i + 1]
        if kept is not None:
            parts[i], parts[i + 1] = _triple(kept), None
    code = b"\n" + b"".join(filter(None, parts))
    if b'"' in code or b"'" in code:
        return None  # a quote not read as a string's
    if (b"\t" in data or b"\f" in data or b"\r" in data) and _SPACES.search(code):
        return None
    return code


def _triple(string: bytes) -> bytes:
    """A triple-quoted string kept by `_STRINGS` (less its first quote), as `S` and a
    backslash-newline for each of its line ends."""
    return b"S" + b"\\\n" * string.count(b"\n")


def _end_of(indent: int) -> re.Pattern[bytes]:
    """A line end followed by a line of code indented `indent` spaces or fewer."""
    p = _ENDS.get(indent)
    if p is None:
        p = _ENDS[indent] = re.compile(rb"\n {0,%d}(?=[^ \n])" % indent)
    return p


def skim(data: bytes) -> tuple[bytes, frozenset[int]] | None:
    """`data` with the bodies no fact reads put aside (`...` on their first line, the rest
    empty), and those lines (0-based); None where only the whole file tells."""
    if b"\0" in data or any(h in data for h in _HIDDEN):
        return None
    if sys.version_info >= (3, 12) and _FSTRING.search(data):
        return None  # 3.12's f-strings may nest quotes and span lines
    code = _code(data)
    if code is None:
        return None
    try:
        bodies, heads = _bodies(code)
    except _Unsure:
        return None
    if not bodies and not heads:
        return data, frozenset()
    lines = data.split(b"\n")
    for first, stop, indent in reversed(bodies):
        lines[first:stop] = [b" " * (indent + 1) + b"...", *([b""] * (stop - first - 1))]
    for first, stop, head in heads:
        lines[first:stop] = [head, *([b""] * (stop - first - 1))]
    return b"\n".join(lines), frozenset([*(b[0] for b in bodies), *(h[0] for h in heads)])


def _bodies(code: bytes) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, bytes]]]:
    """(first line, line after it, indent of its header) of each body to put aside, in
    order, from `_code`'s text: a function's or class's body without the keyword `import`,
    and inside one, such a compound statement's block (its brackets balanced: a line that
    only looks like a header, inside brackets, is left); and (first line, line after it,
    header) of each function's or class's header as its name alone (`def f():`, `class C:`:
    no fact reads its decorators' arguments, bases or annotations)."""
    out: list[tuple[int, int, int]] = []
    heads: list[tuple[int, int, bytes]] = []
    kept: list[int] = []  # where the functions and classes kept (holding an import) end
    line, at = -1, 0  # the line number of offset `at` (the leading newline: line -1)
    brackets = code.translate(_BRACKETS)
    pos, budget = 0, 2 * len(code) + MAX_HEADER
    while (m := _HEADER.search(code, pos)) is not None:
        start = m.start()
        pos = m.end()
        if start and code[start - 1] == 0x5C:  # a continuation line
            continue
        while kept and kept[-1] <= start:
            kept.pop()
        block = m.group(2) in (b"def", b"class")
        if not block and not kept:
            continue  # the top level's compound statements: their statements' names count
        colon, looked = _colon(code, m.end())
        budget -= looked - m.end()
        if budget < 0:  # headers looked for over and over (open brackets): parse it whole
            raise _Unsure
        if colon < 0:
            continue
        eol = code.find(b"\n", colon)
        if eol < 0 or code[colon + 1:eol].strip(b" "):
            continue  # a body on the header's line (or none)
        indent = len(m.group(1))
        e = _end_of(indent).search(code, eol)
        while e is not None and code[e.start() - 1] == 0x5C:
            e = _end_of(indent).search(code, e.start() + 1)
        end = len(code) if e is None else e.start()
        if end == eol:
            continue
        line += code.count(b"\n", at, eol)
        at = eol
        first = line + 1  # the body's first line; `line`: the header's last
        if first < 2:  # an encoding declaration may be on lines 1 and 2
            continue
        if block:
            top = line - code.count(b"\n", start + 1, eol)  # the header's first line
            name = _NAME.match(code, m.end())
            if top >= 2 and name is not None:
                heads.append((top, line + 1, m.group()[1:] + b" " + name.group(1)
                              + (b"():" if m.group(2) == b"def" else b":")))
        if code.find(b"import", eol, end) >= 0:
            if block:
                kept.append(end)
            continue
        if not block and brackets.count(b"(", eol, end) != brackets.count(b")", eol, end):
            continue
        out.append((first, first + code.count(b"\n", eol, end) if e is not None
                    else code.count(b"\n"), indent))
        pos = end
    return out, heads


def _colon(code: bytes, pos: int) -> tuple[int, int]:
    """Where the header from `pos` ends: its first colon outside brackets (-1: a line ends
    first outside brackets, a bracket closes that it did not open, or none in MAX_HEADER
    bytes: no header to skim); and how far it was looked for."""
    depth = 0
    for m in _HEAD_PART.finditer(code, pos, pos + MAX_HEADER):
        at = m.start()
        c = code[at]
        if c == 0x3A:  # :
            if depth == 0:
                return at, at
        elif c == 0x0A:  # newline
            if depth == 0 and code[at - 1] != 0x5C:
                return -1, at
        elif c in b"([{":
            depth += 1
        else:
            depth -= 1
            if depth < 0:
                return -1, at
    return -1, pos + MAX_HEADER


def _facts(tree: ast.Module, aside: frozenset[int]) -> SourceFacts:
    imports: list[list[Any]] = []
    # In `ast.walk`'s order (breadth first), visiting statements and the clauses that hold
    # them only: an expression holds no statement, and expressions are most of a tree.
    queue: collections.deque[ast.AST] = collections.deque(tree.body)
    while queue:
        node = queue.popleft()
        if isinstance(node, ast.Import):
            imports.extend([0, a.name, None] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imports.append([node.level, node.module or "", [a.name for a in node.names]])
        else:
            for field in node._fields:
                value = getattr(node, field, None)
                if isinstance(value, list):
                    queue.extend(x for x in value if isinstance(x, _HOLDS_STATEMENTS))
                elif isinstance(value, _HOLDS_STATEMENTS):
                    queue.append(value)
    names: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return SourceFacts(imports, None)
                names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
        else:  # every node under it, as `ast.walk` visits them (in another order)
            nodes: list[ast.AST] = [node]
            while nodes:
                sub = nodes.pop()
                if isinstance(sub, ast.Name):
                    names.add(sub.id)  # assignment targets, and globals() as a name
                    continue  # (its one child is its context)
                if aside and isinstance(sub, _ASIDE) and sub.lineno - 1 in aside:
                    raise _Unsure  # a body or header put aside, which this walk would have read
                for field in sub._fields:
                    value = getattr(sub, field, None)
                    if isinstance(value, list):
                        nodes.extend([x for x in value if isinstance(x, ast.AST)])
                    elif isinstance(value, ast.AST):
                        nodes.append(value)
    return SourceFacts(imports, sorted(names))
