"""Numbers and names as text: the formatting every table of the harness shares.

It imports nothing of the harness, so the headline, report.md, the terminal tables and the side
scripts can all use it without importing one another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# How the baselines read in tables; an actormesh policy reads "am <policy>".
BASELINE_NAMES = {"ray-random": "random.choice", "ray-rr": "raw round robin",
                  "ActorPool": "ActorPool"}


def num(v: float | None, digits: int = 3) -> str:
    """A value with `digits` significant digits (no exponent for everyday magnitudes)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e6:
        return f"{int(v):,}"
    mag = math.floor(math.log10(abs(v)))
    decimals = max(0, digits - 1 - mag)
    return f"{v:,.{decimals}f}"


def ratio_text(r: float | None, at_least: bool = False) -> str:
    if r is None or math.isnan(r):
        return "–"
    return f"{'≥' if at_least else ''}{num(r, 2 if r >= 10 else 3)}×"


def percent(v: float) -> str:
    return "–" if math.isnan(v) else "0%" if v == 0 else f"{v * 100:.2g}%"


def display(contender: Mapping[str, Any]) -> str:
    """A contender of a results section as a reader calls it (its `display`, else by family)."""
    if contender.get("display"):
        return str(contender["display"])
    if contender["family"] == "actormesh":
        return f"am {contender['name']}"
    return BASELINE_NAMES.get(contender["name"], contender["name"])


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    align = ["---"] + ["--:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
