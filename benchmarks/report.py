"""Turning results into words and tables: headline ratios, terminal tables, report.md, README text.

Everything here reads the results dictionary (the same one written to results.json), so a report
can be rebuilt from a saved run: `python -m benchmarks --report bench-results/results.json`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import headline, stats
from .contenders import POLICIES
from .sim import paragraph as sim_paragraph

DEFAULT, RANDOM = headline.DEFAULT, headline.RANDOM


# -- numbers --------------------------------------------------------------------------------------
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


def med(contender: dict[str, Any], key: str) -> float:
    s = contender["summary"].get(key)
    return math.nan if s is None or "median" not in s else float(s["median"])


def spread(contender: dict[str, Any], key: str) -> tuple[float, float]:
    s = contender["summary"].get(key)
    if s is None or "min" not in s:
        return math.nan, math.nan
    return float(s["min"]), float(s["max"])


def censored(contender: dict[str, Any], key: str) -> bool:
    """Whether any repeat's value is a lower bound (`p99_ms` -> `p99_censored`)."""
    s = contender["summary"].get(key.rsplit("_", 1)[0] + "_censored")
    return bool(s and s.get("any"))


def cell(contender: dict[str, Any], key: str, digits: int = 3) -> str:
    """Median over repeats, with a ≥ when unfinished calls make it a lower bound."""
    v = med(contender, key)
    return ("≥" if censored(contender, key) else "") + num(v, digits)


def range_cell(contender: dict[str, Any], key: str) -> str:
    lo, hi = spread(contender, key)
    if math.isnan(lo):
        return "–"
    return f"{num(lo)}–{num(hi)}"


def display(contender: dict[str, Any]) -> str:
    if contender["family"] == "actormesh":
        return f"am {contender['name']}"
    return headline.NAMES.get(contender["name"], contender["name"])


# -- tables -----------------------------------------------------------------------------------
def columns(kind: str) -> list[tuple[str, str]]:
    """(header, metric key) per column of a scenario table; `~key` is the range over repeats."""
    if kind == "open":
        return [("p50 ms", "p50_ms"), ("p90 ms", "p90_ms"), ("p99 ms", "p99_ms"),
                ("p99.9 ms", "p99_9_ms"), ("p99 range", "~p99_ms"), ("slow", "slow_frac"),
                ("calls/s", "throughput_per_s"), ("util", "utilisation"),
                ("imbalance", "imbalance"), ("lost", "lost")]
    if kind == "batch":
        return [("makespan s", "makespan_s"), ("range", "~makespan_s"),
                ("× bound", "makespan_over_bound"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
                ("util", "utilisation"), ("imbalance", "imbalance"), ("lost", "lost")]
    if kind == "throughput":
        return [("calls/s", "throughput_per_s"), ("range", "~throughput_per_s"),
                ("CPU µs/call", "cpu_us_per_call"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
                ("lost", "lost")]
    return [("failed", "failed"), ("unfinished", "unfinished"), ("lost", "lost_frac"),
            ("recovery s", "recovery_s"), ("rejoin s", "rejoin_s"), ("p50 ms", "p50_ms"),
            ("p99 ms", "p99_ms"), ("slow", "slow_frac"), ("calls/s", "throughput_per_s")]


RATIO_HEADER = "÷ strongest baseline [95%]"
TERMINAL = {  # the narrower set of columns printed while running (report.md has them all)
    "open": ("p50 ms", "p99 ms", "p99.9 ms", "slow", "lost", RATIO_HEADER),
    "batch": ("makespan s", "range", "× bound", "lost", RATIO_HEADER),
    "throughput": ("calls/s", "range", "CPU µs/call", "p99 ms", RATIO_HEADER),
    "fault": ("failed", "unfinished", "rejoin s", "p99 ms", "slow", RATIO_HEADER),
}


def percent(v: float) -> str:
    return "–" if math.isnan(v) else "0%" if v == 0 else f"{v * 100:.2g}%"


def primary(scenario: dict[str, Any]) -> str:
    """The metric that decides the scenario (the first it is judged on)."""
    return str(scenario.get("metrics", ["p99_ms"])[0])


def comparison(scenario: dict[str, Any], metric: str | None = None) -> dict[str, Any]:
    return dict(scenario.get("comparisons", {}).get(metric or primary(scenario), {}))


def ratio_against_strongest(scenario: dict[str, Any], contender: dict[str, Any]) -> str:
    comp = comparison(scenario)
    strongest = comp.get("strongest")
    if contender["name"] == strongest:
        return "(strongest baseline)"
    r = stats.find(comp, contender["name"], strongest)
    if r is None:
        return ""
    verdict = stats.verdict(r, stats.control_of(comp))
    short = "≈ noise" if verdict == stats.NO_DIFFERENCE else verdict
    return f"{stats.interval_text(r)} {short}"


def table_rows(scenario: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    cols = columns(scenario["kind"])
    rows = []
    for c in scenario["contenders"]:
        row = [display(c)]
        for _, key in cols:
            if key.startswith("~"):
                row.append(range_cell(c, key[1:]))
            elif key.endswith("_frac"):
                row.append(percent(med(c, key)))
            elif key in ("lost", "failed", "unfinished"):
                row.append(num(med(c, key)))
            else:
                row.append(cell(c, key))
        row.append(ratio_against_strongest(scenario, c))
        rows.append(row)
    return ["contender"] + [h for h, _ in cols] + [RATIO_HEADER], rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    align = ["---"] + ["--:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def rich_table(scenario: dict[str, Any]) -> Any:
    from rich.table import Table

    header, rows = table_rows(scenario)
    keep = [0] + [i for i, h in enumerate(header) if h in TERMINAL[scenario["kind"]]]
    header = [header[i] for i in keep]
    rows = [[row[i] for i in keep] for row in rows]
    winner = comparison(scenario).get("best")
    table = Table(title=f"{scenario['title']} — {scenario['description']}", title_justify="left",
                  show_edge=False, pad_edge=False)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=i < len(header) - 1)
    for c, row in zip(scenario["contenders"], rows):
        style = "bold green" if c["name"] == winner else (
            "dim" if c["family"] != "actormesh" else None)
        table.add_row(*row, style=style)
    return table


# -- what a scenario says ---------------------------------------------------------------------
def pooled(scenario: dict[str, Any], name: str | None, metric: str) -> str:
    """A contender's value of `metric` pooled over repeats, as text."""
    e = comparison(scenario, metric).get("estimates", {}).get(name) if name else None
    if not e:
        return "–"
    if metric.endswith("_frac"):
        return percent(e["value"])
    unit = stats.METRICS[metric].unit
    return f"{'≥' if e['censored'] else ''}{num(e['value'])} {unit}"


named = headline.name


def paragraph(scenario: dict[str, Any]) -> str:
    """Against the strongest baseline and random choice, inside or outside the A/A noise."""
    text: list[str] = []
    for metric in scenario.get("metrics", []):
        comp = comparison(scenario, metric)
        if not comp:
            continue
        words = stats.METRICS[metric].words
        strongest, best = comp.get("strongest"), comp.get("best")
        control = stats.control_of(comp)
        part = [f"**{words[0].upper() + words[1:]}**"
                + (" (pooled over repeats)" if stats.METRICS[metric].kind != "scalar"
                   else " (median of repeats)") + ":"]
        if strongest:
            part.append(f"strongest baseline {named(strongest)} "
                        f"{pooled(scenario, strongest, metric)};")
        pairs = dict.fromkeys([(DEFAULT, strongest), (DEFAULT, RANDOM), (best, strongest)])
        for who, against in pairs:
            if who is None or against is None or who == against:
                continue
            r = stats.find(comp, who, against)
            if r is None:
                continue
            label = (f"default {who}" if who == DEFAULT
                     else f"best of the {len(POLICIES)} policies (a selection), {who}")
            part.append(f"{label} {pooled(scenario, who, metric)}, "
                        f"{stats.interval_text(r)} against {named(against)}: "
                        f"{stats.verdict(r, control)};")
        if control:
            part.append(f"A/A control (am random ÷ random.choice) {stats.interval_text(control)}.")
        elif scenario.get("control_note"):
            pair = stats.find(comp, "random", RANDOM)
            part.append(f"No A/A control: {scenario['control_note']}"
                        + (f"; their ratio {stats.interval_text(pair)}" if pair else "")
                        + ". A ratio is a difference when its interval leaves out 1.")
        else:
            part.append("No A/A control in this run (it needs random and ray-random).")
        text.append(" ".join(part))
    if scenario["kind"] == "fault":
        text.append(fault_note(scenario))
    text.append(driver_note(scenario))
    return " ".join(t for t in text if t)


def fault_note(scenario: dict[str, Any]) -> str:
    failed = ", ".join(f"{display(c)} {num(med(c, 'failed'))}" for c in scenario["contenders"])
    note = f"Calls that came back as errors (median of repeats): {failed}."
    rejoin = [c for c in scenario["contenders"] if c["family"] == "actormesh"
              and not censored(c, "rejoin_s") and not math.isnan(med(c, "rejoin_s"))]
    if rejoin:
        times = [med(c, "rejoin_s") for c in rejoin]
        note += (f" The restarted actor served calls again {num(min(times))}–{num(max(times))} s "
                 "after the kill through " + ", ".join(c["name"] for c in rejoin) + ".")
    return note


def driver_note(scenario: dict[str, Any]) -> str:
    if scenario["kind"] not in ("open", "fault"):
        return ""
    lags = [med(c, "driver_lag_p99_ms") for c in scenario["contenders"]]
    rates = [med(c, "sent_rate_per_s") / med(c, "planned_rate_per_s")
             for c in scenario["contenders"]]
    worst_lag = max((v for v in lags if not math.isnan(v)), default=math.nan)
    worst_rate = min((v for v in rates if not math.isnan(v)), default=math.nan)
    return (f"Driver: sent at ≥{num(worst_rate * 100, 3)}% of the planned rate; "
            f"p99 send lag ≤{num(worst_lag)} ms.")


# -- whole documents ------------------------------------------------------------------------------
def machine_line(results: dict[str, Any]) -> str:
    m = results["machine"]
    return (f"{m['cpu_model']}, {m['nproc']} cores, {m['memory_gib']} GiB, {m['system']}; "
            f"Python {m['python']}, Ray {results['versions']['ray']}, "
            f"actormesh {results['versions']['actormesh']}")


def report_md(results: dict[str, Any]) -> str:
    cfg = results["config"]
    lines = [
        "# actormesh benchmark results",
        "",
        headline.provenance(results),
        "",
        f"Machine: {machine_line(results)}. Ray: {results['ray']['address']}"
        f" ({results['ray']['actors']} actors, num_cpus={cfg['actor_cpus']} each, "
        + ("shared by every contender: each policy has its own mesh and scheduler over them"
           if results["ray"].get("shared_actors") else
           f"{cfg['actors']} per policy, because they could not be shared "
           f"({results['ray'].get('not_shared_because', '?')}); the baselines use the handles "
           "of those meshes")
        + f"; all answering {num(results['ray']['startup_s'])} s after they were requested, "
        "the decision cost and the simulation running meanwhile).",
        "",
        "Every figure below was measured in this run, baselines included. Latency is from just "
        "before the call is sent to its result reaching the driver (completion callback). "
        "Table cells are medians over repeats (ranges where shown); ratios pool the repeats and "
        "carry a 95% bootstrap interval (`benchmarks/stats.py`). A `≥` marks a lower bound: "
        "some calls had no result by the drain deadline and count at it. Calls sent in the "
        "warm-up are not measured. *slow*: calls slower than 10× the mean service time.",
        "",
    ]
    cal = results.get("calibration")
    if cal:
        lines += [
            f"Load is relative to the capacity measured at start: a call of "
            f"{num(cal['service_s'] * 1e3)} ms occupied an actor for "
            f"{num(cal['per_call_s'] * 1e3)} ms (Ray's per-call cost included), so "
            f"{cfg['actors']} actors serve {num(cal['capacity_per_s'])} calls/s (nominal "
            f"{num(cal['nominal_capacity_per_s'])}).",
            "",
        ]
    lines += ["## Headline", "", headline.EXPLAIN, "", *headline.tables(results)]
    lines += ["## Contenders", ""]
    for c in results.get("contenders", []):
        lines.append(f"- **{c['display']}** — {c['label']}")
    for s in results.get("scenarios", []):
        header, rows = table_rows(s)
        lines += ["", f"## {s['title']} (`{s['name']}`)", "",
                  f"{s['description']}; {s['repeats']} repeats.", "",
                  markdown_table(header, rows), "", paragraph(s)]
        plot = results.get("plots", {}).get(s["name"])
        if plot:
            lines += ["", f"![{s['title']}]({plot})"]
    for side in results.get("side", []):
        lines += ["", *side_md(side)]
    dc = results.get("decision_cost")
    if dc and dc.get("rows"):
        lines += ["", "## Decision cost", "", dc["note"], "",
                  markdown_table(["policy", "N", "native ns", "via nanobind ns",
                                  "pure Python ns (same algorithm)", "twin",
                                  "pure Python ÷ via nanobind", "scan ns (extra line)"],
                                 [[r["policy"], str(r["num_actors"]), num(r["native_ns"]),
                                   num(r["via_python_ns"]), num(r["python_ns"]),
                                   r["twin"] + ("" if r["same_decisions"]
                                                else " (**decisions differ**)"),
                                   ratio_text(r["python_ns"] / r["via_python_ns"]),
                                   num(r["scan_ns"])]
                                  for r in dc["rows"]])]
        if results.get("plots", {}).get("decision_cost"):
            lines += ["", f"![decision cost]({results['plots']['decision_cost']})"]
    theory = results.get("theory")
    if theory and theory.get("rows"):
        lines += ["", "## SIMULATED against queueing theory", "", theory["note"], "",
                  markdown_table(["policy", "λ", "actors", "formula", "predicted", "measured",
                                  "± SE", "deviation", "agrees"],
                                 [[r["policy"], f"{r['load']:g}", str(r["actors"]),
                                   r["formula"], num(r["predicted"]), num(r["measured"]),
                                   num(r["se"], 2), f"{r['deviation'] * 100:+.1f}%",
                                   "yes" if r["agrees"] else "**no**"]
                                  for r in theory["rows"]])]
    sim = results.get("simulation")
    if sim and sim.get("scenarios"):
        lines += ["", "## SIMULATED: the native balancer in a queue model (no Ray)", "",
                  sim["note"], ""]
        for sc in sim["scenarios"]:
            lat = sc["load"] is not None
            header = ["policy", "p50", "p90", "p99", "p99.9"] + ([] if lat else ["× bound"])
            rows = [[r["policy"], num(r["p50"]), num(r["p90"]), num(r["p99"]), num(r["p99_9"])]
                    + ([] if lat else [num(r["makespan_over_bound"])]) for r in sc["policies"]]
            lines += [f"### {sc['title']} — {sc['description']}", "",
                      "Latency in units of the mean service time; one seeded run per policy.", "",
                      markdown_table(header, rows), "", sim_paragraph(sc), ""]
        ref = sim.get("reference")
        if ref:
            lines += [ref["note"], "",
                      markdown_table(["policy", "native µs/call", "reference µs/call",
                                      "same decisions"],
                                     [[r["policy"], num(r["native_us"]), num(r["reference_us"]),
                                       "yes" if r["identical"] else "**no**"]
                                      for r in ref["rows"]]), ""]
        if results.get("plots", {}).get("simulation"):
            lines += [f"![simulation]({results['plots']['simulation']})", ""]
    lines += ["", "## How to read and reproduce", "", NOTES.strip(), ""]
    return "\n".join(lines)


def side_md(side: dict[str, Any]) -> list[str]:
    """A side scenario's section: its summary and tables if it gave them, else its raw result."""
    import json

    result = side.get("result", {})
    lines = [f"## {side.get('title', side['name'])} (`{side['name']}`, side scenario)", ""]
    if side.get("skipped"):
        return lines + [f"Not run: {side['skipped']}"]
    if side.get("error"):
        return lines + [f"**Failed**: {side['error']}"]
    lines.append(f"`{side['module']}.run(quick, out_dir)`, {num(side.get('duration_s'))} s.")
    if result.get("summary"):
        lines += ["", str(result["summary"])]
    for table in result.get("tables", []):
        lines += ["", f"**{table.get('title', '')}**", "",
                  markdown_table([str(h) for h in table["header"]],
                                 [[str(c) for c in row] for row in table["rows"]])]
    if not result.get("summary") and not result.get("tables"):
        lines += ["", "```json", json.dumps(result, indent=1, default=str)[:4000], "```"]
    return lines


NOTES = """
- `python -m benchmarks --quick` (what `make bench` runs) takes about seven minutes on two cores;
  `--full` runs longer, bigger and more repeats; `--only straggler tiny_noop` picks scenarios
  (also `sim`, `theory`, `decision_cost` and the side scenarios), `--contenders pow2 sed
  ray-random` picks contenders. With `RAY_ADDRESS` set (e.g. `RAY_ADDRESS=auto` on a node of a
  cluster where actormesh is installed) the harness joins that cluster instead of starting one.
  `--report results.json` rebuilds this report, `headline.md` and the plots from a saved run.
- Service times are drawn by the driver (one seeded plan per repeat, identical for every
  contender) and slept by the actor, times its slowdown; the actor reports the time it took.
  `util` is the actors' busy time over the run span; `imbalance` is the busiest actor's busy time
  over the mean.
- Open-loop arrivals: calls are sent at planned times whatever happened to earlier calls. The
  driver's own send lag is reported; if it fell behind, latencies would be understated, never
  inflated.
- Intervals: 1,000 bootstrap resamples; each draws the repeats with replacement (the same
  repeats for every contender: within a repeat they all played the same plan) and, for
  percentiles and fractions, the calls within each drawn repeat. Fractions carry +½ / +1 so
  that a contender with none of the counted calls still gets a finite, conservative ratio.
- The A/A control, actormesh `random` against `random.choice`, is the same algorithm run twice;
  the ratio between them is the noise of this machine in this scenario (plus actormesh's few
  microseconds of per-call work, which only the tiny-call scenarios can see).
- On a two-core machine the driver, eight to forty-eight actor processes and Ray's own daemons
  share the CPUs, so absolute latencies include contention; compare contenders within a
  scenario, not across machines.
"""
