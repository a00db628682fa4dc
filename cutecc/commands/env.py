"""`cutecc env`: what a bug report needs: versions, every directory cutecc keeps (its homes,
`cutecc.store.homes`, each with its size), this device, the extras, and the live resident
compile services with their memory.

Reads package metadata and the environment; imports JAX only to ask for the GPU (and not
at all when `$CUTECC_ARCH` is set), never the DSL.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutecc import settings
from cutecc.commands.report import Report
from cutecc.store import homes
from cutecc.store.view import StoreView
from cutecc.units import human_size

# What each extra of cutecc brings, by the distribution that marks it installed.
EXTRAS = {"build": "nvidia-cutlass-dsl", "test": "pytest", "remote": "obstore", "ray": "ray",
          "torch": "torch"}
PACKAGES = ("cutecc", "jax", "jaxlib", "torch", "apache-tvm-ffi", "jax-tvm-ffi", "nvidia-cutlass-dsl",
            "nvidia-cuda-runtime", "ziglang", "cuda-python", "click", "filelock", "platformdirs",
            "obstore", "ray")


@dataclass(frozen=True)
class EnvReport(Report):
    values: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.values

    def lines(self, verbose: int = 0) -> list[str]:
        v = self.values
        out = [f"python         {v['python']}", f"platform       {v['platform']}",
               f"cache          {v['cache_dir']} ({v['cache']})",
               "homes"]
        out += [f"  {h['name']:14} {h['path'] or 'off'} ({human_size(h['bytes'])})"
                + ("" if h["exists"] else ", not made yet") for h in v["homes"]]
        out += [
               f"device arch    {v['device_arch'] or '-'}",
               f"extras         {', '.join(k for k, on in v['extras'].items() if on) or '-'}",
               "packages"]
        out += [f"  {name:20} {ver or '-'}" for name, ver in v["packages"].items()]
        out.append(f"services       {len(v['services'])} resident compile service(s) live")
        out += [f"  pid {s['pid']:<8} {human_size(s['rss'])} resident, {s['age_s']:.0f} s old, "
                f"last used {s['unused_s']:.0f} s ago" for s in v["services"]]
        set_vars = {k: val for k, val in v["environment"].items() if val is not None}
        if set_vars:
            out.append("environment")
            out += [f"  {k}={val}" for k, val in set_vars.items()]
        return out


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _device_arch() -> str | None:
    if importlib.util.find_spec("jax") is None:
        return None
    from cutecc.archs import device_arch

    try:
        return device_arch()
    except Exception as e:  # a broken GPU stack is what a bug report is about
        return f"unknown ({type(e).__name__}: {e})"


def services() -> list[dict[str, Any]]:
    """This user's live resident compile services (`cutecc.build.executors.service`), most
    recently used first: each one's pid, resident memory (VmRSS), age, and seconds since a
    build last connected (its socket's mtime), read from /proc without starting anything."""
    from cutecc.build.executors.service import listener_pid, socket_dir

    d = socket_dir(create=False)
    out = []
    for path in d.glob("*.sock") if d is not None else ():
        pid = listener_pid(path)
        if pid is None:  # no service answers there
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rss = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:"))) * 1024
            start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
            uptime = float(Path("/proc/uptime").read_text().split()[0])
            unused = time.time() - path.stat().st_mtime
        except (OSError, ValueError, IndexError, StopIteration):  # none answered, or it just ended
            continue
        age = uptime - start / os.sysconf("SC_CLK_TCK")
        out.append({"pid": pid, "rss": rss, "age_s": round(max(0.0, age), 1),
                    "unused_s": round(max(0.0, unused), 1), "socket": str(path)})
    return sorted(out, key=lambda s: s["unused_s"])


def env(cache_dir: str | Path | None = None) -> EnvReport:
    store = StoreView(cache_dir)
    fmt = store.layout.format_file()
    cache = "a cache" if fmt.is_file() else "no cache yet"
    # every setting of the table (`cutecc.settings`), and the other programs' that decide a build
    names = (*(r.env for r in settings.TABLE if not r.internal),
             "AWS_ENDPOINT_URL", "AWS_REGION", "CUTE_DSL_ARCH", "CUTE_DSL_CACHE_DIR")
    return EnvReport({
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()} ({platform.libc_ver()[0]} "
                    f"{platform.libc_ver()[1]})",
        "cache_dir": str(store.root),
        "cache": cache,
        "homes": [dict(h.__dict__) for h in homes.listing(store.root)],
        "device_arch": _device_arch(),
        "extras": {extra: _version(dist) is not None for extra, dist in EXTRAS.items()},
        "packages": {p: _version(p) for p in PACKAGES},
        "services": services(),
        "environment": {n: os.environ.get(n) for n in names},
    })
