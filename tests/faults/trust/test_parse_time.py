"""Foreign JSON is parsed in time linear in its size, not only bounded in bytes and depth.

Seen: `entry.parse_json`'s nesting pre-check stripped strings with a
backtracking regex, so `"` followed by many `\\"` took 10.7 s at 16 KB and 177 s at 64 KB,
before any hash or signature was looked at; every reader of foreign JSON (a pack's lock and
signature, a remote's meta.json, tuning records, key files) went through it. Each hostile
shape below, at a parser's own cap, must parse or fail in the stated time on the 2-core
CPU host, and fail only with ValueError.
"""

from __future__ import annotations

import contextlib
import json
import random
import time

import pytest

from cutecc.entry.rules import MAX_JSON_DEPTH, MAX_META_BYTES, _depth_over, _text_depth_over, parse_json

MIB = 1 << 20


def _fill(unit: bytes, size: int, head: bytes = b"", tail: bytes = b"") -> bytes:
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


# Shapes that were (or could be) slow for a scanner that backtracks or recurses.
HOSTILE = {
    "escaped quotes, unterminated": lambda n: _fill(b'\\"', n, head=b'"'),
    "escaped backslashes, unterminated": lambda n: _fill(b"\\\\", n, head=b'"'),
    "quote and escape pairs": lambda n: _fill(b'"\\', n),
    "lone quotes": lambda n: _fill(b'"', n),
    "unicode escapes, unterminated": lambda n: _fill(b"\\u00e9", n, head=b'"'),
    "open brackets": lambda n: _fill(b"[", n),
    "open objects": lambda n: _fill(b'{"a":', n),
    "brackets at the depth limit, repeated": lambda n: _fill(
        b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b",", n, head=b"[", tail=b"0]"),
    "many empty arrays": lambda n: _fill(b"[],", n, head=b"[", tail=b"0]"),
    "many keys": lambda n: _fill(b'"k":1,', n, head=b"{", tail=b'"z":0}'),
    "long digits": lambda n: _fill(b"9", n),
    "long fraction": lambda n: _fill(b"1", n, head=b"0."),
    "strings with brackets": lambda n: _fill(b'"[[[{{{",', n, head=b"[", tail=b"0]"),
}


@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_a_hostile_meta_json_at_its_cap_parses_or_fails_within_a_second(shape: str) -> None:
    data = HOSTILE[shape](MAX_META_BYTES)
    assert len(data) <= MAX_META_BYTES
    t0 = time.perf_counter()
    with contextlib.suppress(ValueError):
        parse_json(data)
    assert time.perf_counter() - t0 < 1.0, f"{shape}: {time.perf_counter() - t0:.2f} s for 1 MiB"


@pytest.mark.parametrize("shape", ["escaped quotes, unterminated", "brackets at the depth limit, repeated"])
def test_parse_time_grows_linearly_with_size(shape: str) -> None:
    """8 MiB takes at most about 8 times (here: 16) what 1 MiB takes, plus slack: no
    quadratic term hides below the 1 MiB cap of meta.json (the lock's cap is 16 MiB)."""
    def timed(n: int) -> float:
        data = HOSTILE[shape](n)
        t0 = time.perf_counter()
        with contextlib.suppress(ValueError):
            parse_json(data, max_bytes=n)
        return time.perf_counter() - t0

    small, large = timed(MIB), timed(8 * MIB)
    assert large < 16 * small + 0.5, f"{shape}: 1 MiB {small:.3f} s, 8 MiB {large:.3f} s"


def test_nesting_past_the_limit_is_refused_and_at_the_limit_accepted() -> None:
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(ValueError, match="nested"):
        parse_json(deep)
    ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert parse_json(ok) is not None
    mixed = b'{"a":' * 30 + b"[" * 30 + b"1" + b"]" * 30 + b"}" * 30
    with pytest.raises(ValueError, match="nested"):
        parse_json(mixed)
    brackets_in_strings = b'["' + b"[" * 500 + b'"]'
    assert parse_json(brackets_in_strings) == ["[" * 500]


def test_a_file_denser_in_arrays_than_cutecc_writes_is_refused_before_parsing() -> None:
    """Building millions of tiny arrays is what costs (0.25 s a MiB): past 1,024, at most one
    array or object per 32 bytes (brackets in strings count: an over-approximation)."""
    with pytest.raises(ValueError, match="arrays and objects in"):
        parse_json(b"[" + b"[]," * 2000 + b"0]")
    with pytest.raises(ValueError, match="arrays and objects in"):
        parse_json(b'["' + b"[" * 5000 + b'"]')
    assert len(parse_json(b"[" + b'{"abcdefghijklmnopqrstuvw":1},' * 3000 + b"0]")) == 3001


def test_nesting_far_past_the_interpreters_recursion_limit_is_a_value_error() -> None:
    for opener, closer in ((b"[", b"]"), (b'{"a":', b"}")):
        data = opener * 200_000 + closer * 200_000
        with pytest.raises(ValueError):
            parse_json(data, max_bytes=4 * MIB)


def test_over_the_byte_cap_is_refused_before_parsing() -> None:
    with pytest.raises(ValueError, match="over the"):
        parse_json(b" " * (MAX_META_BYTES + 1))


def _random_doc(rnd: random.Random, depth: int = 0) -> object:
    def text() -> str:  # brackets, quotes, backslashes and wide characters inside strings
        return "".join(rnd.choice('ab[]{}"\\/\u00e9\U0001f600\n,:') for _ in range(rnd.randint(0, 6)))

    r = rnd.random()
    if depth > 12 or r < 0.3:
        return rnd.choice([text(), 1, 2.5, None, True])
    if r < 0.65:
        return [_random_doc(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return {text(): _random_doc(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}


def test_the_nesting_read_from_the_text_is_the_walks() -> None:
    """`parse_json` reads the nesting from the bytes (`_text_depth_over`, C-speed passes):
    on random documents whose strings hold brackets, escaped quotes and backslashes, written
    ASCII-escaped or not, indented or not, it finds what the walk of the objects finds."""
    rnd = random.Random(35)
    for _ in range(3000):
        doc = _random_doc(rnd)
        for ascii_only, indent in ((True, None), (False, 1)):
            data = json.dumps(doc, ensure_ascii=ascii_only, indent=indent).encode()
            parsed = json.loads(data)
            for limit in (0, 1, 2, 3, 5, 8):
                assert _text_depth_over(data, limit) == _depth_over(parsed, limit), (data, limit)
    tricky = [b'["\\\\"]', b'["\\\\\\"[[["]', b'{"\\"{":[["]"]]}', b'[[[["\\u005c\\"]"]]]]']
    for data in tricky:
        assert _text_depth_over(data, 2) == _depth_over(json.loads(data), 2), data
    # UTF-16 is JSON too: the bytes are not read, the walk decides
    wide = json.dumps([[["[["]]]).encode("utf-16")
    assert _text_depth_over(wide, 2) is None
    with pytest.raises(ValueError, match="nested"):
        parse_json(wide, max_depth=2)
    assert parse_json(wide, max_depth=3) == [[["[["]]]
