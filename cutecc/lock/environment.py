"""A lock's optional "environment": the key-deciding distributions its keys were planned
with (`Environment`), and what differs from them here (`Drift`, `drift_line`), so a build
or verify elsewhere names it before it compiles."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc.errors import CuteccError
from cutecc.lock.pins import Pins

# The optional "environment" object (`Environment`): the key-deciding distributions the
# lock's keys were planned with, so a build or verify elsewhere names what differs before
# it compiles. Versioned on its own: readers that predate it ignore it. Format 2 names every
# distribution by its installed files (`DistIndex.environment`); format 1 named one reached
# only as a requirement by its RECORD, whichever entry planned it last: its digests are
# compared by version alone (`Environment.digests`).
ENVIRONMENT_FORMAT = 2
MAX_ENV_DISTRIBUTIONS = 5_000


@dataclass(frozen=True)
class Drift:
    """One key-deciding distribution that differs from the lock's environment."""

    name: str
    locked: str | None  # "version digest" as the lock records it (None: not in the lock)
    installed: str | None  # as planning reads it here (None: not installed)

    def __str__(self) -> str:
        def ver(v: str | None) -> str:
            return "absent" if v is None else v.split(" ")[0]

        same = (self.locked is not None and self.installed is not None
                and ver(self.locked) == ver(self.installed))
        return f"{self.name} {ver(self.locked)} -> {ver(self.installed)}" + (" (other files)" if same else "")


@dataclass(frozen=True)
class Environment:
    """The installed distributions that decided the lock's keys, as `{name: "version
    digest"}` (`cutecc.toolchain.dists.DistIndex.reached`): what every locked key was planned with."""

    distributions: tuple[tuple[str, str], ...] = ()
    # whether the digests are this format's (a format-1 lock's are of another formula: only
    # their versions are compared, and a partial build does not keep them)
    digests: bool = True

    @classmethod
    def of(cls, reached: Iterable[Mapping[str, str]]) -> Environment:
        """The environment of planned entries, from each one's keyed distributions."""
        out: dict[str, str] = {}
        for d in reached:
            out.update(d)
        return cls(tuple(sorted(out.items())))

    def merged(self, older: Environment) -> Environment:
        """This environment, with `older`'s distributions that this one does not name (a
        partial build keeps lines planned in the older one). Those of a format-1 `older`
        are not kept: their digests are of another formula (the next whole build names them)."""
        if not older.digests:
            return self
        return Environment(tuple(sorted({**dict(older.distributions), **dict(self.distributions)}.items())))

    def drift(self, here: Environment) -> list[Drift]:
        """What differs between this (the lock's) and the environment `here` planned in,
        over the distributions `here` names, and those this names that are gone (by version
        alone where this lock's digests are of format 1)."""
        mine, theirs = dict(self.distributions), dict(here.distributions)
        if not self.digests:
            theirs = {n: v.split(" ")[0] for n, v in theirs.items()}
            mine = {n: v.split(" ")[0] for n, v in mine.items()}
        return [Drift(n, mine.get(n), theirs.get(n)) for n in sorted(set(mine) | set(theirs))
                if mine.get(n) != theirs.get(n) and (n in theirs or _gone(n))]

    def to_json(self) -> dict[str, Any]:
        return {"format": ENVIRONMENT_FORMAT, "distributions": dict(self.distributions)}

    @classmethod
    def from_json(cls, d: Any, where: str) -> Environment | None:
        """The lock's environment; None for one of a later format (it decides nothing); one
        of format 1 compares versions alone (`digests` False)."""
        if not isinstance(d, dict) or not isinstance(d.get("format"), int):
            raise CuteccError("environment is not an object with a format", where=where,
                              key_path="environment")
        if d["format"] not in (1, ENVIRONMENT_FORMAT):
            return None
        dists = d.get("distributions")
        if not isinstance(dists, dict) or len(dists) > MAX_ENV_DISTRIBUTIONS or not all(
                isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 200 and 0 < len(v) <= 200
                for k, v in dists.items()):
            raise CuteccError(f"distributions must map at most {MAX_ENV_DISTRIBUTIONS} names to "
                              "\"version digest\" strings", where=where, key_path="environment.distributions")
        return cls(tuple(sorted(dists.items())), digests=d["format"] == ENVIRONMENT_FORMAT)


def _gone(name: str) -> bool:
    """Whether distribution `name` is not installed here."""
    import importlib.metadata as md

    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return True
    return False


def drift_line(lock_path: str | Path, drift: list[Drift], *, pins: str | None = None,
               pinned: Pins | None = None) -> str:
    """The one line a build or verify says when the key-deciding distributions differ from
    the environment the lock at `lock_path` was made in. With the manifest's pins file
    (`pins`, as read: `pinned`), it names each pin that is not the lock's version: installing
    that file would not reproduce the lock until the pin is changed."""
    shown = ", ".join(map(str, drift[:6])) + (f" and {len(drift) - 6} more" if len(drift) > 6 else "")
    install = pinned.install_command() if pinned else f"pip install --require-hashes -r {pins}"
    back = f"run `{install}`" if pins else "install the pinned environment it was made in"
    if pinned is not None:
        change = []
        for d in drift:
            want = d.locked.split(" ")[0] if d.locked else None
            have = pinned.pinned(d.name)
            if want is None or want in have:
                continue
            change.append(f"{d.name}=={have[0]} to {d.name}=={want}" if len(have) == 1
                          else f"add {d.name}=={want}" if not have
                          else f"{d.name}'s pins to {d.name}=={want}")
        if change:
            shown_change = "; ".join(c if c.startswith("add ") else f"change {c}" for c in change[:6])
            more = f" and {len(change) - 6} more" if len(change) > 6 else ""
            back = f"in {pins}, {shown_change}{more}, then run `{install}`"
    return (f"{lock_path} was made in another environment ({shown}): its keys will not match; "
            f"{back} to reproduce it, or build anyway to re-lock on purpose")


def pins_line(pinned: Pins, unlike: list[tuple[str, str, str]]) -> str:
    """The one line a build says when what is installed is not what the manifest's pins
    file pins (for the key-deciding distributions): `unlike` is (name, pinned, installed)."""
    shown = ", ".join(f"{n} {have} installed, {pinned.path} pins {want}" for n, want, have in unlike[:6])
    more = f" and {len(unlike) - 6} more" if len(unlike) > 6 else ""
    return (f"this environment is not the one {pinned.path} pins ({shown}{more}): run "
            f"`{pinned.install_command()}`, or change those pins to re-pin on purpose")
