"""The pins file a manifest's `[build] pins` names: the requirements file that pins the build
environment. Read for the exact versions it pins (`name==version` lines, hashes or not), so
that a build names the pin to change when its lock was made with another version, and what
is installed that the pins do not match.

The file is the user's (and may be anyone's): bounded, read as text with undecodable bytes
replaced; lines that are not exact pins (options, ranges, URLs) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MAX_PINS_BYTES = 4 * 1024 * 1024
_SEPARATORS = re.compile(r"[-_.]+")
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")
# `name[extras] == version`, the version in PEP 440's characters (a pin of anything else,
# escape sequences included, is no pin: what is read here is printed in advice)
_PIN = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*===?\s*"
                  r"([A-Za-z0-9][A-Za-z0-9.+!_-]*)(?=\s|;|\\|$)")


@dataclass(frozen=True)
class Pins:
    """The exact versions a pins file pins ((normalized name, version), sorted; a name
    pinned under several markers comes once per version), and whether it carries hashes (so
    `pip install --require-hashes` takes it)."""

    path: str  # as the manifest resolves it (shown in advice)
    versions: tuple[tuple[str, str], ...]
    hashed: bool

    def pinned(self, name: str) -> tuple[str, ...]:
        """The versions pinned for `name` (markers are not evaluated: any may be this host's)."""
        n = normalize(name)
        return tuple(v for k, v in self.versions if k == n)

    def version(self, name: str) -> str | None:
        """The one version pinned for `name`; None when none or several are."""
        got = self.pinned(name)
        return got[0] if len(got) == 1 else None

    def install_command(self) -> str:
        return f"pip install {'--require-hashes ' if self.hashed else ''}-r {self.path}"


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return _SEPARATORS.sub("-", name).lower()


def read_pins(path: str | Path) -> Pins | None:
    """The pins of the file at `path`; None when there is none to read (missing, not a
    regular file, over `MAX_PINS_BYTES`)."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size > MAX_PINS_BYTES:
            return None
        with open(p, "rb") as f:
            text = f.read(MAX_PINS_BYTES + 1).decode("utf-8", errors="replace")
    except OSError:
        return None
    return parse_pins(text, str(path))


def parse_pins(text: str, path: str) -> Pins:
    """The exact pins of requirements-file `text` (continuation lines joined, comments dropped)."""
    versions: set[tuple[str, str]] = set()
    hashed = False
    for line in text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        hashed = hashed or "--hash=" in line
        m = _PIN.match(line)
        if m:
            versions.add((normalize(m.group(1)), m.group(2)))
    return Pins(path, tuple(sorted(versions)), hashed)


def installed_unlike(pins: Pins, installed: dict[str, str]) -> list[tuple[str, str, str]]:
    """`(name, pinned, installed)` for each of `installed` (name -> "version digest", the
    key-deciding distributions) whose version is not the one `pins` pins."""
    out = []
    for name, v in sorted(installed.items()):
        pinned, here = pins.pinned(name), v.split(" ")[0]
        if pinned and here not in pinned:
            out.append((name, " or ".join(pinned), here))
    return out


# A distribution as a closure walk sees it: (its name as it spells it, version, Requires-Dist).
Found = tuple[str, str, list[str]]


def requirement_closure(requirements: Iterable[str], lookup: Callable[[str], Found | None], *,
                        skip: Iterable[str] = ()) -> dict[str, tuple[str, str]]:
    """{normalized name: (name, version)} of every distribution `requirements` reach through
    `lookup`'s Requires-Dist, the extras they name followed; a requirement whose marker names
    an extra not asked for is left out, other markers are not evaluated (what `lookup` does
    not know is left out: a marker that held nowhere). `skip`: names neither kept nor walked."""
    skipped = {normalize(s) for s in skip}
    walked: dict[str, set[str]] = {}  # name -> extras walked
    found: dict[str, tuple[str, str]] = {}
    todo = list(requirements)
    while todo:
        m = _NAME.match(todo.pop())
        if not m:
            continue
        name = normalize(m.group(1))
        extras = {normalize(x) for x in (m.group(2) or "").split(",") if x.strip()}
        done = walked.get(name)
        if name in skipped or (done is not None and extras <= done):
            continue
        got = lookup(name)
        if got is None:
            continue
        walked[name] = (done or set()) | extras
        found[name] = (got[0] or name, got[1])
        for r in got[2]:
            req, _, marker = r.partition(";")
            wants = {normalize(x) for x in _EXTRA.findall(marker)}
            if not wants or wants & walked[name]:
                todo.append(req)
    return found


def installed_pins(requirements: list[str]) -> list[str]:
    """`Name==version` of every installed distribution `requirements` reach (their
    Requires-Dist closure), sorted; cutecc itself left out (it is installed on its own)."""
    found = requirement_closure(requirements, installed, skip=("cutecc",))
    return sorted((f"{n}=={v}" for n, v in found.values()), key=str.lower)


def installed(name: str) -> Found | None:
    """Installed distribution `name` as a closure walk sees it; None when not installed."""
    import importlib.metadata as md

    try:
        d = md.distribution(name)
    except md.PackageNotFoundError:
        return None
    return d.metadata["Name"] or name, d.version, list(d.requires or [])
