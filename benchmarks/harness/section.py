"""A scenario's results section: the one shape every scenario writes into results.json.

The report, the headline and the plots read only this, so a scenario of any kind (a balancing
scenario played open-loop, a call-path scenario timed turn by turn) shows up in every output
once it returns a section. What a section holds:

- `contenders`: name, label, family (`actormesh`, `baseline`, or `aa` for the A/A twin, which is
  neither side of a ratio), per-run metrics (`runs`), their `summary` over repeats and a latency
  `cdf`;
- `comparisons`: per metric, the paired bootstrap of `benchmarks.report.stats.compare`, with the
  A/A control (the default against its twin);
- `default`: the contender the headline puts first (what a user gets without choosing);
- `headline`: the rows it gives the headline, `columns`: the columns of its table in report.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import metrics
from benchmarks.report import stats


@dataclasses.dataclass(frozen=True)
class Entrant:
    """A contender as a section records it."""

    name: str
    label: str
    family: str  # "actormesh", "baseline" or "aa"
    display: str = ""  # how tables name it; empty: by family (see report.text.display)


@dataclasses.dataclass(frozen=True)
class Row:
    """A headline row: `contender` (default: the scenario's default) against `baseline`
    (default: the strongest baseline) on `metric`; the values of the metrics in `also` are shown
    beside (the p99 beside a fraction of slow calls)."""

    metric: str
    contender: str = ""
    baseline: str = ""
    also: tuple[str, ...] = ()


def seed(name: str) -> int:
    """A stable seed per scenario name, for its plans and its bootstrap."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def build(*, name: str, title: str, kind: str, description: str, entrants: Sequence[Entrant],
          default: str, twin: str, runs: Mapping[str, Sequence[dict[str, Any]]],
          samples: Mapping[str, Sequence[stats.RunSample]], judged_on: Sequence[str],
          rows: Sequence[Row], columns: Sequence[tuple[str, str]], started: float,
          params: Mapping[str, Any] | None = None, overhead: tuple[str, str] | None = None,
          overhead_note: str = "", **extra: Any) -> dict[str, Any]:
    """The section of one scenario from what each contender measured, repeat by repeat.

    `overhead` is the pair whose ratio is the library's own cost (actormesh `random` against
    `random.choice`), reported in a table of its own; `overhead_note` says why there is none.
    """
    present = [e for e in entrants if e.name in samples]
    baselines = [e.name for e in present if e.family == "baseline"]
    comparisons = stats.compare(
        samples, judged_on,
        contenders=[e.name for e in present if e.family == "actormesh"],
        baselines=baselines,
        control=(default, twin) if default in samples and twin in samples else None,
        seed=seed(name),
        # a row against a reference that is no baseline (a mesh made anew) gets its ratio too
        pairs=[(r.contender or default, r.baseline) for r in rows
               if r.baseline and r.baseline not in baselines])
    contenders = []
    for e in present:
        played = [s.latencies_ms for s in samples[e.name] if s is not None]
        lat = np.concatenate(played) if played else np.empty(0)
        lat = lat[~np.isnan(lat)]
        contenders.append({"name": e.name, "label": e.label, "family": e.family,
                           "display": e.display, "summary": metrics.summarise(runs[e.name]),
                           "runs": list(runs[e.name]), "cdf": metrics.cdf(lat)})
    return {
        "name": name,
        "title": title,
        "kind": kind,
        "description": description,
        "repeats": max((len(s) for s in samples.values()), default=0),
        "params": dict(params or {}),
        "contenders": contenders,
        "metrics": list(judged_on),
        "comparisons": comparisons,
        "default": default,
        "twin": twin,
        "headline": [dataclasses.asdict(r) for r in rows],
        "columns": [list(c) for c in columns],
        "overhead": list(overhead) if overhead else None,
        "overhead_note": overhead_note,
        "duration_s": time.perf_counter() - started,
        **extra,
    }
