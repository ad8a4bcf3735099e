"""Where and when the figures come from: the machine, the versions, the commit, and the line
that says so at the top of headline.md and report.md."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from collections.abc import Mapping
from typing import Any

from benchmarks.report import stats

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = math.nan
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = math.nan
    return {"cpu_model": model, "nproc": os.cpu_count(), "memory_gib": round(memory, 1),
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "hostname": platform.node(), "load_average_at_start": round(load, 2)}


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return math.nan


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("actormesh", "ray", "numpy", "nanobind", "matplotlib", "rich"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git() -> dict[str, Any]:
    """The commit measured, and whether tracked files differed from it (untracked ones do not
    count: other work in the checkout that nothing imports)."""

    def run(*cmd: str) -> str:
        return subprocess.run(["git", "-C", REPOSITORY, *cmd], capture_output=True, text=True,
                              timeout=10).stdout.rstrip("\n")

    try:
        commit = run("rev-parse", "--short", "HEAD")
        changed = [line[3:] for line in run("status", "--porcelain",
                                            "--untracked-files=no").splitlines()]
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None, "changed": []}
    return {"commit": commit or "unknown", "dirty": bool(changed), "changed": changed,
            "subject": run("log", "-1", "--format=%s") if commit else ""}


def machine_line(results: Mapping[str, Any]) -> str:
    m = results["machine"]
    return (f"{m['cpu_model']}, {m['nproc']} cores, {m['memory_gib']} GiB, {m['system']}; "
            f"Python {m['python']}, Ray {results['versions']['ray']}, "
            f"actormesh {results['versions']['actormesh']}")


def provenance(results: Mapping[str, Any]) -> str:
    m, v, g = results["machine"], results["versions"], results.get("git", {})
    commit = g.get("commit", "unknown")
    state = ("uncommitted changes in " + ", ".join(g.get("changed", [])[:8])
             + (" …" if len(g.get("changed", [])) > 8 else "")) if g.get("dirty") else "clean"
    actors = ""
    if results.get("scenarios"):
        actors = f"; default policy `{results.get('default_policy', '?')}`"
    if results.get("ray", {}).get("actors"):
        actors += (f"; {results['ray']['actors']} single-slot actors shared by every contender "
                   "of the balancing scenarios")
    end = results.get("load_average_at_end")
    return (f"`{results['command']}` ({results['mode']}, {stats.fmt(results['duration_s'])} s) on "
            f"{results['created'][:10]} at commit `{commit}` (tree: {state}); {m['cpu_model']}, "
            f"{m['nproc']} cores, load average {m.get('load_average_at_start', '?')} at start"
            + (f" and {end} at the end" if end is not None else "")
            + f"; Python {m['python']}, Ray {v.get('ray', '?')}{actors}.")
