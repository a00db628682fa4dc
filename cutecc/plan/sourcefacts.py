"""What the key reads of a Python source file: its import statements, anywhere in it
(`SourceFacts`, for every source of a closure), and the names its top level surely binds
(`TopNames`, only for the modules a manifest names: `SourceIndex.lacks`).

A first planning reads every source of its closures (a published library's: a thousand
files, 36 MB), and `ast.parse` costs about 200 ns a byte, though an import is a statement
spelled with a hard keyword and the rest of the file decides nothing the closure reads. So
`scan` drops the strings and comments (one regex split and join, in C), finds each `import`
keyword left, and reads its statement from the text around it: the part of its logical line
after the last `;` or `:` before the keyword (nothing, or `from` and a module), and what
follows it to the end of the statement (names, `as` names, a bracketed list or `*`). Where
a statement is not of that plain shape (a name that is not ASCII, which `ast` would
normalize; anything unexpected), or the text is not read as the tokenizer would (a tab, form
feed or carriage return outside strings, a string not closed on its line, a NUL, an f-string
under Python 3.12's grammar), the whole file is parsed with `ast` instead. The facts are
the same either way, imports sorted (order decides nothing: the walk takes them as a set).

What the scan does not do is check the rest of the file's syntax: a broken installed file is
the build's import's to report. A project's own sources (`check`) are parsed whole, so a
syntax error there is still planning's to report, with its line.
"""

from __future__ import annotations

import ast
import gc
import re
import sys
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError
from cutecc.toolchain.planfacts import SourceFacts, TopNames

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
_SPACES = re.compile(rb"[\t\f]")  # in code (not a string): columns this does not count
# an encoding declaration (on line 1 or 2), and those that read ASCII as ASCII
_CODING = re.compile(rb"[ \t\f]*#[^\n]*?coding[:=][ \t]*([-\w.]+)")
_ASCII_SUPERSETS = {b"utf-8", b"utf8", b"ascii", b"us-ascii", b"latin-1", b"latin1", b"iso-8859-1",
                    b"iso8859-1"}
_FSTRING = re.compile(rb"(?i)(?<![\w])(?:f|rf|fr|t|rt|tr)['\"]")  # and 3.14's t-strings, of that grammar

# the keyword, not inside a name (spelled from its letters: the engine looks for those in C)
_IMPORT = re.compile(rb"import(?<![\w\x80-\xff]import)(?![\w\x80-\xff])")
_NAME = rb"[A-Za-z_][A-Za-z0-9_]*"
_IDENTIFIER = re.compile(_NAME)
_DOTTED = _NAME + rb"(?: *\. *" + _NAME + rb")*"
_FROM = re.compile(rb" *from(?=[ .])((?: *\.)*) *(" + _DOTTED + rb")? *| *")  # what precedes `import`
_ALIAS = re.compile(rb" *(" + _DOTTED + rb")(?: +as +" + _NAME + rb")? *")
_END = re.compile(rb"[;\n]")  # a simple statement's end (newlines left: not after a backslash)
# a top-level definition's name: a logical line starting with one at column 0 (its first
# physical line's indent is the statement's: backslash-newlines may come before the keyword)
# (each pattern spelled from its first literal byte: the engine looks for that in C)
_DEF = re.compile(rb"\n(?<!\\\n)(?:\\\n *)*(?:async(?: |\\\n)+)?(?:def|class)(?: |\\\n)+([^ (:\n\\]*)")
_GAP = re.compile(rb"(?: |\\\n)*")  # spaces and backslash-newlines


class _Unsure(Exception):
    """A statement or text the scan does not read as surely as `ast` would."""


def parse(data: bytes, f: Path, check: bool = False) -> SourceFacts:
    """The facts of source `data` (file `f`): its import statements, anywhere in it, as
    `[level, module, names or None for a plain import]`, sorted, and its top level's `def`
    and `class` names; scanned (`scan`), or where the scan cannot be sure or `check` asks,
    from the whole file's `ast` (which reports a syntax error, with its line)."""
    if not check:
        got = scan(data)
        if got is not None:
            return got
    tree = _tree(data, f)
    defs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return SourceFacts(_sorted(_tree_imports(tree)), sorted(defs))


def top_names(data: bytes, f: Path) -> TopNames:
    """The names the top level of source `data` (file `f`) surely binds: defined, imported,
    assigned, or read in a top-level statement, which is a superset and so never claims a
    name is missing that is not; None where it may make names at run time (a star import)."""
    tree = _tree(data, f)
    names: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    return TopNames(None)
                names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
        else:  # every name under it: assignment targets, and globals() as a name
            names.update(sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name))
    return TopNames(sorted(names))


def _tree(data: bytes, f: Path) -> ast.Module:
    """`data` parsed whole, with the cyclic garbage collector paused (a syntax tree holds no
    cycle; the collections its nodes would set off walk everything planning holds)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(data, filename=str(f))
    except SyntaxError as e:
        raise CuteccError(f"syntax error: {e.msg} (line {e.lineno})", where=str(f)) from None
    finally:
        if paused:
            gc.enable()


def _tree_imports(tree: ast.Module) -> list[list[Any]]:
    """Every import statement in `tree`, as `parse` gives them (unsorted)."""
    out: list[list[Any]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend([0, a.name, None] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append([node.level, node.module or "", [a.name for a in node.names]])
    return out


def _sorted(imports: list[list[Any]]) -> list[list[Any]]:
    """`imports` in one order whichever way they were read (the walk takes them as a set)."""
    return sorted(imports, key=lambda i: (i[1], i[0], i[2] is not None, i[2] or []))


def scan(data: bytes) -> SourceFacts | None:
    """`parse`'s facts of `data` read from its text without a syntax tree; None where only
    `ast` can tell. A logical line of code that starts with `def` or `class` at column 0 is
    a top-level definition (nothing else starts one there: strings are gone, brackets hold
    no statement)."""
    code = _code(data)
    if code is None:
        return None
    defs = _DEF.findall(code)
    if not all(_IDENTIFIER.fullmatch(d) for d in defs):
        return None  # a name `ast` would normalize, or a broken header
    imports: list[list[Any]] = []
    # where the logical line of each `import` starts (backslash-newlines, and a triple-quoted
    # string's lines, join physical ones): looked for back from the keyword, no further than
    # the one before it (on the same logical line, the same start), so each line end once
    before = start = 0
    try:
        for m in _IMPORT.finditer(code):
            at = m.start()
            line = code.rfind(b"\n", before, at)
            while line > 0 and code[line - 1] == 0x5C:  # continued: the logical line began before
                line = code.rfind(b"\n", before, line - 1)
            if line >= 0:
                start = line + 1  # (else none ended since the import before: its start)
            imports.extend(_statement(code, start, max(start, before), at, m.end()))
            before = m.end()
    except _Unsure:
        return None
    return SourceFacts(_sorted(imports), sorted({d.decode() for d in defs}))


def _statement(code: bytes, start: int, floor: int, at: int, end: int) -> list[list[Any]]:
    """The imports of the statement whose `import` keyword is `code[at:end]`, on the logical
    line from `start`, whose text from `floor` on follows the import keyword before it."""
    # after the last `;`, or a compound statement's `:` after it, looked for back to the
    # import before on this line at most (so a line of many costs its length): one must be
    # there, between two statements
    semi = code.rfind(b";", floor, at)
    colon = code.rfind(b":", max(floor, semi), at)
    if floor > start and max(semi, colon) < 0:
        raise _Unsure
    head = code[max(floor, semi + 1, colon + 1):at]
    head = head.replace(b"\\\n", b" ")
    m = _FROM.fullmatch(head)
    if m is None or b"\n" in head:
        raise _Unsure
    if head.strip(b" "):  # from ... import
        level = m.group(1).count(b".")
        module = _join(m.group(2) or b"")
        if not level and not module:
            raise _Unsure
        gap = _GAP.match(code, end)
        rest = end if gap is None else gap.end()
        if code.startswith(b"(", rest):
            close = code.find(b")", rest)
            if close < 0:
                raise _Unsure
            body = code[rest + 1:close].replace(b"\\\n", b" ").replace(b"\n", b" ")
            items = body.split(b",")
            if len(items) > 1 and not items[-1].strip(b" "):
                items.pop()  # a trailing comma
        else:
            items = code[rest:_end_of_statement(code, rest)].replace(b"\\\n", b" ").split(b",")
        if [i.strip(b" ") for i in items] == [b"*"]:
            return [[level, module, ["*"]]]
        return [[level, module, [_alias(i, dotted=False) for i in items]]]
    items = code[end:_end_of_statement(code, end)].replace(b"\\\n", b" ").split(b",")
    if not items[0].startswith(b" "):
        raise _Unsure
    return [[0, _alias(i, dotted=True), None] for i in items]


def _end_of_statement(code: bytes, pos: int) -> int:
    """Where the simple statement going on at `pos` ends: its `;`, or the line end that is
    not a backslash's (outside brackets), or the text's end."""
    stop = _END.search(code, pos)
    while stop is not None and stop.group() == b"\n" and code[stop.start() - 1] == 0x5C:
        stop = _END.search(code, stop.end())
    return len(code) if stop is None else stop.start()


def _alias(item: bytes, dotted: bool) -> str:
    """The imported name of one `name [as other]` of an import statement."""
    m = _ALIAS.fullmatch(item)
    if m is None or (not dotted and b"." in m.group(1)):
        raise _Unsure
    return _join(m.group(1))


def _join(dotted: bytes) -> str:
    """A dotted name as `ast` spells it (the spaces the grammar allows around dots dropped)."""
    return dotted.replace(b" ", b"").decode("ascii")


def _code(data: bytes) -> bytes | None:
    """`data` without its strings and comments, line for line: a one-line string and a
    comment dropped, a triple-quoted one as `S` with each of its line ends as a backslash-
    newline (its lines are one logical line), a newline put first (every line follows one);
    None where something is left that this does not read as the tokenizer would."""
    if b"\0" in data or any(h in data for h in _HIDDEN):
        return None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a byte order mark: not a line, not code
    if b"\r" in data:
        return None  # a line end the patterns do not know (a lone one ends a comment)
    for line in data.split(b"\n", 2)[:2]:  # an encoding declared on line 1 or 2 (either counts)
        coding = _CODING.match(line)
        if coding is not None and coding.group(1).lower().replace(b"_", b"-") not in _ASCII_SUPERSETS:
            return None  # bytes another codec decodes: `ast` reads them
    if sys.version_info >= (3, 12) and _FSTRING.search(data):
        return None  # 3.12's f-strings may nest quotes and span lines
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
    if (b"\t" in data or b"\f" in data) and _SPACES.search(code):
        return None
    return code


def _triple(string: bytes) -> bytes:
    """A triple-quoted string kept by `_STRINGS` (less its first quote), as `S` and a
    backslash-newline for each of its line ends."""
    return b"S" + b"\\\n" * string.count(b"\n")
