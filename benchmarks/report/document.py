"""report.md: every scenario with its table, its ratios in words and its plot, the noise floor
each scenario could resolve, the side scenarios, and the sections without Ray.

Everything here reads the results dictionary (the same one written to results.json), so a report
can be rebuilt from a saved run: `python -m benchmarks --report bench-results/results.json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from benchmarks.report import headline, stats
from benchmarks.report.provenance import machine_line, provenance
from benchmarks.report.text import display, markdown_table, num, percent, ratio_text
from benchmarks.without_ray.sim import paragraph as sim_paragraph


# -- cells ----------------------------------------------------------------------------------------
def med(contender: Mapping[str, Any], key: str) -> float:
    s = contender["summary"].get(key)
    return math.nan if s is None or "median" not in s else float(s["median"])


def spread(contender: Mapping[str, Any], key: str) -> tuple[float, float]:
    s = contender["summary"].get(key)
    if s is None or "min" not in s:
        return math.nan, math.nan
    return float(s["min"]), float(s["max"])


def censored(contender: Mapping[str, Any], key: str) -> bool:
    """Whether any repeat's value is a lower bound (`p99_ms` -> `p99_censored`)."""
    s = contender["summary"].get(key.rsplit("_", 1)[0] + "_censored")
    return bool(s and s.get("any"))


def cell(contender: Mapping[str, Any], key: str) -> str:
    """Median over repeats, with a ≥ when unfinished calls make it a lower bound."""
    return ("≥" if censored(contender, key) else "") + num(med(contender, key))


def range_cell(contender: Mapping[str, Any], key: str) -> str:
    lo, hi = spread(contender, key)
    return "–" if math.isnan(lo) else f"{num(lo)}–{num(hi)}"


# -- a scenario's table ---------------------------------------------------------------------------
RATIO_HEADER = "÷ strongest baseline [95%]"


def primary(scenario: Mapping[str, Any]) -> str:
    """The metric that decides the scenario (the first it is judged on)."""
    return str(scenario.get("metrics", ["p99_ms"])[0])


def comparison(scenario: Mapping[str, Any], metric: str | None = None) -> dict[str, Any]:
    return dict(scenario.get("comparisons", {}).get(metric or primary(scenario), {}))


def ratio_against_strongest(scenario: Mapping[str, Any], contender: Mapping[str, Any]) -> str:
    comp = comparison(scenario)
    strongest = comp.get("strongest")
    if contender["name"] == strongest:
        return "(strongest baseline)"
    if contender["family"] == "aa":
        return f"A/A: {stats.interval_text(stats.control_of(comp))}"
    r = stats.find(comp, contender["name"], strongest)
    if r is None:
        return ""
    verdict = stats.verdict(r, stats.control_of(comp))
    short = "≈ noise" if verdict == stats.NO_DIFFERENCE else verdict
    return f"{stats.interval_text(r)} {short}"


def table_rows(scenario: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The scenario's columns (its section says which) per contender, and the ratio of each
    to the strongest baseline on the deciding metric."""
    cols = [(str(h), str(k)) for h, k in scenario["columns"]]
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


# -- what a scenario says -------------------------------------------------------------------------
def median(scenario: Mapping[str, Any], name: str | None, metric: str) -> str:
    """A contender's value of `metric`: the median over the repeats it played."""
    e = comparison(scenario, metric).get("estimates", {}).get(name) if name else None
    if not e:
        return "–"
    if metric.endswith("_frac"):
        return percent(e["value"])
    unit = stats.METRICS[metric].unit
    return f"{'≥' if e['censored'] else ''}{num(e['value'])} {unit}"


def paragraph(scenario: Mapping[str, Any]) -> str:
    """The default against the strongest baseline and random choice, the best of the library,
    and the A/A control they are judged against, per metric."""
    names = {c["name"]: display(c) for c in scenario["contenders"]}
    default = scenario["default"]
    text: list[str] = []
    for metric in scenario.get("metrics", []):
        comp = comparison(scenario, metric)
        if not comp:
            continue
        words = stats.METRICS[metric].words
        strongest, best = comp.get("strongest"), comp.get("best")
        control = stats.control_of(comp)
        part = [f"**{words[0].upper() + words[1:]}** (median of repeats):"]
        if strongest:
            part.append(f"strongest baseline {names[strongest]} "
                        f"{median(scenario, strongest, metric)};")
        for who, against in dict.fromkeys([(default, strongest), (default, headline.RANDOM),
                                           (best, strongest)]):
            r = stats.find(comp, who, against) if who != against else None
            if r is None or who is None or against is None:
                continue
            label = (f"the default, {names[who]}" if who == default
                     else f"the best of the library (a selection), {names[who]}")
            part.append(f"{label} {median(scenario, who, metric)}, "
                        f"{stats.interval_text(r)} against {names[against]}: "
                        f"{stats.verdict(r, control)};")
        if control:
            lo, hi = stats.noise_band(control)
            part.append(f"A/A control (the default ÷ its twin) {stats.interval_text(control)}: "
                        f"this run can call a ratio below {stats.fmt(lo)}× or above "
                        f"{stats.fmt(hi)}×.")
        else:
            part.append("No A/A control in this run (it needs the default and its twin).")
        text.append(" ".join(part))
    if scenario["kind"] == "fault":
        text.append(fault_note(scenario))
    text.append(driver_note(scenario))
    return " ".join(t for t in text if t)


def fault_note(scenario: Mapping[str, Any]) -> str:
    failed = ", ".join(f"{display(c)} {num(med(c, 'failed'))}" for c in scenario["contenders"])
    note = f"Calls that came back as errors (median of repeats): {failed}."
    rejoin = [c for c in scenario["contenders"] if c["family"] != "baseline"
              and not censored(c, "rejoin_s") and not math.isnan(med(c, "rejoin_s"))]
    if rejoin:
        times = [med(c, "rejoin_s") for c in rejoin]
        note += (f" The restarted actor served calls again {num(min(times))}–{num(max(times))} s "
                 "after the kill through " + ", ".join(c["name"] for c in rejoin) + ".")
    return note


def driver_note(scenario: Mapping[str, Any]) -> str:
    if scenario["kind"] not in ("open", "fault"):
        return ""
    lags = [med(c, "driver_lag_p99_ms") for c in scenario["contenders"]]
    rates = [med(c, "sent_rate_per_s") / med(c, "planned_rate_per_s")
             for c in scenario["contenders"]]
    worst_lag = max((v for v in lags if not math.isnan(v)), default=math.nan)
    worst_rate = min((v for v in rates if not math.isnan(v)), default=math.nan)
    return (f"Driver: sent at ≥{num(worst_rate * 100, 3)}% of the planned rate; "
            f"p99 send lag ≤{num(worst_lag)} ms.")


# -- the noise floor ------------------------------------------------------------------------------
def noise_rows(results: Mapping[str, Any]) -> list[list[str]]:
    """Per scenario and headline metric: the repeats, the A/A interval, how far it reaches from
    1, and the smallest ratios the run could call."""
    rows = []
    for s in results.get("scenarios", []):
        for metric in dict.fromkeys(row["metric"] for row in s.get("headline", [])):
            control = stats.control_of(comparison(s, metric))
            if control is None:
                continue
            lo, hi = stats.noise_band(control)
            reach = stats.half_width(control)
            rows.append([f"{s['title']} · {stats.METRICS[metric].words}", str(s["repeats"]),
                         stats.interval_text(control), f"±{reach * 100:.0f}%",
                         f"< {stats.fmt(lo)}× or > {stats.fmt(hi)}×",
                         "yes" if lo > 1 / 1.2 and hi < 1.2 else "no"])
    return rows


NOISE = (
    "How much each scenario could tell apart in this run: the A/A control is the default run "
    "twice, taking its turn with the others; a ratio must leave the control's interval (and "
    "have an interval of its own that leaves out 1) to read better or worse. *Calls 1.2×* says "
    "whether a 1.2× difference, either way, lies outside the floor."
)


# -- whole documents ------------------------------------------------------------------------------
def report_md(results: Mapping[str, Any]) -> str:
    cfg = results["config"]
    lines = [
        "# actormesh benchmark results",
        "",
        provenance(results),
        "",
        f"Machine: {machine_line(results)}. Ray: {results['ray']['address']}; the balancing "
        f"scenarios share {cfg['actors']} actors (num_cpus={cfg['actor_cpus']} each) between "
        f"every contender, each policy with its own mesh and scheduler over them, all answering "
        f"{num(results['ray']['startup_s'])} s after they were requested (the decision cost and "
        "the simulation ran meanwhile).",
        "",
        "Every figure below was measured in this run, baselines included. Latency is from just "
        "before the call is sent to its result reaching the driver (completion callback). "
        "Table cells are medians over repeats (ranges where shown). A ratio is the trimmed mean "
        "of the per-repeat ratios, with a 95% bootstrap interval over repeats "
        "(`benchmarks/report/stats.py`). "
        "A `≥` marks a lower bound: some calls had no result by the drain deadline and count "
        "at it. Calls sent in the warm-up are not measured. *slow*: calls slower than 10× the "
        "mean service time.",
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
    noise = noise_rows(results)
    if noise:
        lines += ["## The noise floor", "", NOISE, "",
                  markdown_table(["scenario · metric", "repeats", "A/A: default ÷ its twin",
                                  "reach from 1", "can call", "calls 1.2×"], noise), ""]
    for s in results.get("scenarios", []):
        header, rows = table_rows(s)
        lines += ["", f"## {s['title']} (`{s['name']}`)", "",
                  f"{s['description']}; {s['repeats']} repeats, contenders taking turns.", "",
                  "Contenders: " + "; ".join(
                      f"**{display(c)}**: {c['label']}" + (
                          f" ({len(c['runs'])} of the repeats)"
                          if len(c["runs"]) < s["repeats"] else "")
                      for c in s["contenders"]) + ".", "",
                  markdown_table(header, rows), "", paragraph(s)]
        plot = results.get("plots", {}).get(s["name"])
        if plot:
            lines += ["", f"![{s['title']}]({plot})"]
    for side in results.get("side", []):
        lines += ["", *side_md(side)]
    lines += without_ray_md(results)
    lines += ["", "## How to read and reproduce", "", NOTES.strip(), ""]
    return "\n".join(lines)


def without_ray_md(results: Mapping[str, Any]) -> list[str]:
    """The decision cost, the simulation against queueing theory, the simulated balancer."""
    lines: list[str] = []
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
    return lines


def side_md(side: Mapping[str, Any]) -> list[str]:
    """A side scenario's section: its summary and tables if it gave them, else its raw result."""
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
- `python -m benchmarks --quick` (what `make bench` runs) takes about eleven minutes on two
  quiet cores; `--full` runs longer, bigger and more repeats; `--only straggler map` picks scenarios
  (also `sim`, `theory`, `decision_cost` and the side scenarios), `--contenders pow2 sed
  ray-random` picks the balancing contenders. With `RAY_ADDRESS` set (e.g. `RAY_ADDRESS=auto`
  on a node of a cluster where actormesh is installed) the harness joins that cluster instead
  of starting one. `--report results.json` rebuilds this report, `headline.md` and the plots
  from a saved run.
- Taking turns: every repeat plays each contender once, in an order shuffled per repeat, so a
  drift of the machine hits all alike; before its turn, a contender waits until the actors have
  worked off the last one's calls.
- Service times are drawn by the driver (one seeded plan per repeat, identical for every
  contender) and slept by the actor, times its slowdown; the actor reports the time it took.
  `util` is the actors' busy time over the run span; `imbalance` is the busiest actor's busy
  time over the mean.
- Open-loop arrivals: calls are sent at planned times whatever happened to earlier calls. The
  driver's own send lag is reported; if it fell behind, latencies would be understated, never
  inflated.
- Ratios are paired by repeat (within a repeat every contender played the same plan): every
  metric is taken per repeat (a latency percentile, the fraction of slow or lost calls, a
  makespan, a rate) and the ratio is the 20%-trimmed mean of the per-repeat log ratios (a
  repeat the machine stalled in moves one of them, which the trimming drops), with 1,000
  bootstrap resamples of the repeats. In a ratio, a fraction carries +½ / +1 so that a run with
  none of the counted calls still gives a finite, conservative ratio. The library's policies
  other than the default play every other repeat in `--quick` (ratios use the repeats both
  sides played).
- The A/A control is the default run twice: the mesh that made the actors and a second mesh
  with the default policy over the same actors. actormesh `random` against `random.choice` is
  reported apart, as the library's overhead.
- On a two-core machine the driver, the actors and Ray's own daemons share the CPUs, so absolute
  latencies include contention; compare contenders within a scenario, not across machines.
"""
