"""Side scripts: benchmarks of their own, each run as `python -m benchmarks.side.<name>`; those
registered in `SIDE` also run inside `python -m benchmarks` (side scenarios).

The scripts: `choose_overhead` (what `choose` adds to a raw call), `queued_send` (the hop of a
queued call to the library's loop thread), `death_notice` (how soon a dead actor is out of
rotation), `shard_transfer` (a large `shard` against a hand split), `jax_broadcast` and
`torch_world` (the integrations' start-up and transfers), and the side scenarios below.

A side scenario is a module of this package with a function

    run(quick: bool, out_dir: str) -> dict

that measures something the balancing scenarios do not (the vLLM pool's routing, the trainer's
async against sync steps, a torch world). The harness calls it after the Ray scenarios, with
Ray already initialised on the harness's cluster (the function must not call `ray.shutdown()`),
`quick` True unless the run is `--full`, and `out_dir` the harness's output directory as a
`pathlib.Path` (for plots). It may print progress. What it returns goes to results.json as is;
report.md renders these keys when present:

- `"summary"`: a paragraph (markdown);
- `"tables"`: a list of `{"title": str, "header": [str, ...], "rows": [[cell, ...], ...]}`;
- `"headline"`: one row for headline.md, or a list of them, in either of two forms.
  The full form joins the main table beside the balancing scenarios: a dict with `"title"`
  (scenario · metric), `"values"` (text), `"strongest"` (the baseline's name), ratios as
  `stats.Ratio.as_dict()` in `"vs_strongest"` (the contender against the strongest baseline),
  optionally `"vs_random"`, `"best"` with `"best_vs_strongest"`, and the A/A pair in `"control"`;
  `stats.compare` builds all of these from per-run samples (`stats.RunSample`), as the balancing
  scenarios do (benchmarks/side/async_trainer.py is an example). The simple form goes to a table of
  its own: `"what"`, the ratio as `"value"` (> 1: the contender is better) with its interval as
  `"lo"` and `"hi"` (or `"median"`, `"min"`, `"max"` over repeats), the A/A control as
  `"control": {"lo": .., "hi": ..}` (or its half-width around 1 as `"aa_noise"`), and
  optionally `"text"`. Both get the verdict rule of the balancing scenarios.

To add one, add a line to `SIDE`. A module that cannot be imported (its framework is not
installed) is reported as skipped, not failed; an exception inside `run` is reported as failed
and the harness goes on.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import time
import traceback
from typing import Any


@dataclasses.dataclass(frozen=True)
class Side:
    module: str  # under benchmarks/side/
    title: str
    quick: bool = True  # part of `make bench`; False: only when named with --only


SIDE: dict[str, Side] = {
    "pool_routing": Side("pool_routing", "Engine pool routing"),
    "async_trainer": Side("async_trainer", "Async trainer against the synchronous loop"),
    "pool_map": Side("pool_map", "am.ActorPool against ray.util.ActorPool: a straggler, a kill"),
    "weights": Side("weights", "Weights from a trainer actor into 2 vLLM engines"),
    "metrics_cost": Side("metrics_cost", "What a mesh's metrics cost tiny calls"),
}


def selected(mode: str, only: list[str] | None) -> list[str]:
    """The side scenarios a run includes: those named by --only, else those `quick` allows."""
    if only:
        return [n for n in SIDE if any(n.startswith(o) for o in only)]
    return [n for n, s in SIDE.items() if s.quick or mode == "full"]


def run(name: str, quick: bool, out_dir: str) -> dict[str, Any]:
    """Run one side scenario; a section for results.json whatever happened."""
    side = SIDE[name]
    section: dict[str, Any] = {"name": name, "title": side.title,
                               "module": f"benchmarks.side.{side.module}"}
    started = time.perf_counter()
    try:
        module = importlib.import_module(section["module"])
    except ImportError as error:
        section["skipped"] = f"cannot import {section['module']}: {error}"
        return section
    try:
        result = module.run(quick, pathlib.Path(out_dir))
    except Exception as error:  # a side scenario's failure is reported, not fatal
        section["error"] = f"{type(error).__name__}: {error}"
        section["traceback"] = traceback.format_exc(limit=8)
    else:
        section["result"] = result if isinstance(result, dict) else {"value": result}
    section["duration_s"] = time.perf_counter() - started
    return section
