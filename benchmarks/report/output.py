"""The files a run writes into its output directory: results.json (strict JSON, read back by
`--report`), report.md, headline.md (BENCHMARKS.md's tables, verbatim) and the PNG plots."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from typing import Any

from benchmarks.report import document, headline, plots

PUBLISH_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # BENCHMARKS.md's plot

# Keys whose null means "none" (no control, no such contender), not a number that was NaN.
NULLABLE = {"control", "strongest", "best", "vs_strongest", "vs_random", "best_vs_strongest",
            "native_ns", "scan_ns", "dirty", "overhead", "load_average_at_end"}


def clean(value: Any) -> Any:
    """NaN and infinity as null, so results.json is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def unclean(value: Any, key: str = "") -> Any:
    """Back from results.json: null metric values become NaN again."""
    if value is None:
        return None if key in NULLABLE else math.nan
    if isinstance(value, dict):
        return {k: unclean(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [unclean(v) for v in value]
    return value


def read(path: str) -> dict[str, Any]:
    with open(path) as f:
        results: dict[str, Any] = unclean(json.load(f))
    return results


def write(results: dict[str, Any], out: str, publish: bool,
          say: Callable[[str], None] = print) -> None:
    """results.json, report.md, headline.md and the plots; with `publish`, BENCHMARKS.md's plot."""
    os.makedirs(out, exist_ok=True)
    figures: dict[str, str] = {}
    for s in results["scenarios"]:
        name = plots.scenario_plot(s, out)
        if name:
            figures[s["name"]] = name
    if results.get("decision_cost"):
        name = plots.decision_cost(results["decision_cost"]["rows"], out)
        if name:
            figures["decision_cost"] = name
    if results.get("simulation"):
        name = plots.simulation(results["simulation"], out)
        if name:
            figures["simulation"] = name
    results["plots"] = figures
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(clean(results), f, indent=1, allow_nan=False)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(document.report_md(results))
    with open(os.path.join(out, "headline.md"), "w") as f:
        f.write(headline.markdown(results))
    if publish and figures.get("straggler"):
        target = os.path.join(PUBLISH_DIR, "README_straggler.png")
        shutil.copy(os.path.join(out, figures["straggler"]), target)
        say(f"Published {target}")
