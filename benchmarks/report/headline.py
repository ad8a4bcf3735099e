"""The headline: the rows a reader looks at first, written to be pasted into BENCHMARKS.md as is.

Each row of the main table is one scenario and one metric (the rows each section asks for, see
`benchmarks.harness.section.Row`). Its first comparison is the default (what a user gets without
choosing: the library's default policy, or the default way to make the calls) against the
strongest baseline of that scenario in this run, with a verdict against the A/A control; then
the default against random choice, the best of the library's contenders against the strongest
baseline (chosen after the run: a selection), and the A/A control itself (the default against
its twin: the noise floor). A second table gives the library's own overhead: actormesh `random`
against `random.choice`, the same algorithm with and without the library around it.

Rows that need no Ray (decision cost, the simulation against queueing theory) follow in a table
of their own. `headline.md` holds the tables with a line naming the commit and the machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.report import stats
from benchmarks.report.provenance import provenance
from benchmarks.report.text import BASELINE_NAMES, display, markdown_table

RANDOM = "ray-random"


def value_text(metric: str, v: float | None, censored: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    ge = "≥" if censored else ""
    if metric.endswith("_frac"):
        return f"{ge}{v * 100:.2g}%" if v >= 0.001 or v == 0 else f"{ge}{v * 100:.1g}%"
    unit = stats.METRICS[metric].unit
    return f"{ge}{stats.fmt(v)}{unit}" if unit == "×" else f"{ge}{stats.fmt(v)} {unit}".strip()


def ratio_cell(r: stats.Ratio | None, control: stats.Ratio | None) -> str:
    """`1.62× [1.31–2.05] better`, in bold unless it is no difference."""
    if r is None:
        return "–"
    verdict = stats.verdict(r, control)
    text = f"{stats.interval_text(r)} {verdict}"
    return text if verdict == stats.NO_DIFFERENCE else f"**{text}**"


def _estimate(comparison: Mapping[str, Any], contender: str | None) -> tuple[float | None, bool]:
    e = comparison.get("estimates", {}).get(contender) if contender else None
    return (None, False) if not e else (e["value"], bool(e["censored"]))


def _names(scenario: Mapping[str, Any]) -> dict[str, str]:
    return {c["name"]: display(c) for c in scenario.get("contenders", [])}


def _also(scenario: Mapping[str, Any], metric: str, shown: Sequence[str]) -> str:
    """The values of another metric for the contenders a row shows (medians of repeats)."""
    comparison = scenario.get("comparisons", {}).get(metric)
    if comparison:
        cells = [value_text(metric, *_estimate(comparison, c)) for c in shown
                 if _estimate(comparison, c)[0] is not None]
    else:
        medians = {c["name"]: c["summary"].get(metric, {}).get("median")
                   for c in scenario.get("contenders", [])}
        cells = [value_text(metric, medians[c]) for c in shown if medians.get(c) is not None]
    return f"{stats.METRICS[metric].words} " + " · ".join(cells)


def ray_row(scenario: Mapping[str, Any], spec: Mapping[str, str]) -> dict[str, Any] | None:
    """One row of the main table, or None when the scenario did not measure what it needs."""
    metric = spec["metric"]
    comparison = scenario.get("comparisons", {}).get(metric)
    if not comparison:
        return None
    names = _names(scenario)
    contender = spec.get("contender") or scenario["default"]
    strongest = spec.get("baseline") or comparison.get("strongest")
    best = comparison.get("best")
    control = stats.control_of(comparison)
    shown = [c for c in dict.fromkeys([contender, strongest, RANDOM, best]) if c in names]
    values = " · ".join(f"{names[c]} {value_text(metric, *_estimate(comparison, c))}"
                        for c in shown if _estimate(comparison, c)[0] is not None)
    for extra in spec.get("also", ()):
        values += "; " + _also(scenario, extra, shown)
    vs_strongest = stats.find(comparison, contender, strongest)
    vs_random = (stats.find(comparison, contender, RANDOM)
                 if strongest != RANDOM and not spec.get("baseline") else None)
    best_vs = (stats.find(comparison, best, strongest)
               if best not in (None, contender) and not spec.get("contender") else None)
    words = stats.METRICS[metric].words
    if spec.get("contender") or spec.get("baseline"):
        words += f", {names.get(contender, contender)} ÷ {names.get(strongest, strongest)}"
    return {
        "scenario": scenario["name"],
        "title": f"{scenario['title']} · {words}",
        "metric": metric,
        "contender": names.get(contender, contender),
        "strongest": names.get(strongest, strongest) if strongest else None,
        "best": names.get(best, best) if best else None,
        "values": values,
        "vs_strongest": vs_strongest.as_dict() if vs_strongest else None,
        "vs_random": vs_random.as_dict() if vs_random else None,
        "best_vs_strongest": best_vs.as_dict() if best_vs else None,
        "control": control.as_dict() if control else None,
        "verdict": stats.verdict(vs_strongest, control) if vs_strongest else "–",
    }


def ray_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of the main table: the scenarios' in run order, then side scenarios' rows that
    carry ratios in the same form (`vs_strongest`, ...; see `benchmarks.side`)."""
    rows = [ray_row(s, spec) for s in results.get("scenarios", []) for spec in s["headline"]]
    rows += [{**r, "side": True} for r in _side_headline(results) if "vs_strongest" in r]
    return [r for r in rows if r]


def overhead_rows(results: Mapping[str, Any]) -> list[list[str]]:
    """The library's own cost per scenario: actormesh `random` ÷ `random.choice` (one algorithm,
    with and without the library), its interval and its verdict against the A/A control."""
    rows = []
    for s in results.get("scenarios", []):
        if not s.get("overhead"):
            continue
        mine, theirs = s["overhead"]
        for spec in s["headline"]:
            metric = spec["metric"]
            comparison = s.get("comparisons", {}).get(metric, {})
            r = stats.find(comparison, mine, theirs)
            if r is None:
                continue
            control = stats.control_of(comparison)
            what = f"{s['title']} · {stats.METRICS[metric].words}"
            if s.get("overhead_note"):
                rows.append([what, f"{stats.interval_text(r)}: not the overhead, "
                                   f"{s['overhead_note']}", "–", "–"])
                continue
            rows.append([what, stats.interval_text(r), stats.interval_text(control),
                         stats.verdict(r, control)])
    return rows


def _side_headline(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for section in results.get("side", []):
        given = section.get("result", {}).get("headline") or []
        for h in [given] if isinstance(given, dict) else given:
            if isinstance(h, dict):
                rows.append({**h, "section": section.get("title", section["name"])})
    return rows


def side_rows(results: Mapping[str, Any]) -> list[list[str]]:
    """Side scenarios' simple headline rows (a ratio and a range, see `benchmarks.side`): what,
    ratio, A/A, verdict."""
    rows = []
    for h in _side_headline(results):
        if "vs_strongest" in h:
            continue  # in the main table
        value = h.get("value", h.get("median", math.nan))
        r = stats.Ratio(str(h.get("metric", "")), "", "", float(value),
                        float(h.get("lo", h.get("min", math.nan))),
                        float(h.get("hi", h.get("max", math.nan))))
        c = h.get("control")
        noise = h.get("aa_noise")
        control = (stats.Ratio("", "", "", float(c.get("value", math.nan)), float(c["lo"]),
                               float(c["hi"]))
                   if isinstance(c, dict) else
                   stats.Ratio("", "", "", 1.0, 1 - float(noise), 1 + float(noise))
                   if isinstance(noise, (int, float)) else None)
        text = stats.interval_text(r) + (f" ({h['text']})" if h.get("text") else "")
        shown = ("no control" if control is None else stats.interval_text(control)
                 if not math.isnan(control.value)
                 else f"[{stats.fmt(control.lo)}–{stats.fmt(control.hi)}]")
        rows.append([f"{h['section']}: {h.get('what', '')}", text, shown,
                     stats.verdict(r, control) if control else "–"])
    return rows


def _ratio(d: Mapping[str, Any] | None) -> stats.Ratio | None:
    return stats.Ratio.from_dict(d) if d else None


def ray_table(rows: Sequence[Mapping[str, Any]],
              default: str) -> tuple[list[str], list[list[str]]]:
    header = ["scenario · metric", f"values: default ({default}) · strongest baseline · "
              "random.choice · best", f"default ({default}) ÷ strongest baseline",
              "default ÷ random.choice", "best of the library ÷ strongest (a selection)",
              "A/A: default ÷ its twin (the noise floor)"]
    body = []
    for r in rows:
        control = _ratio(r.get("control"))
        vs = _ratio(r.get("vs_strongest"))
        strongest = (f"{r.get('contender', 'default')} vs {r['strongest']}: "
                     if r.get("strongest") else "")
        best = r.get("best")
        best_cell = (f"{best}: {ratio_cell(_ratio(r.get('best_vs_strongest')), control)}"
                     if r.get("best_vs_strongest") else
                     "the default" if best and best == r.get("contender") else "–")
        body.append([
            str(r.get("title", "")),
            str(r.get("values", "")),
            strongest + ratio_cell(vs, control),
            ("strongest is random.choice" if r.get("strongest") == BASELINE_NAMES[RANDOM]
             else ratio_cell(_ratio(r.get("vs_random")), control)),
            best_cell,
            stats.interval_text(control) if control else "no A/A control in this run",
        ])
    return header, body


def other_rows(results: Mapping[str, Any]) -> list[list[str]]:
    """Decision cost (heap against heap) and the simulation against theory: no Ray, no A/A."""
    rows: list[list[str]] = []
    dc = results.get("decision_cost", {}).get("rows", [])
    for policy in ("least_loaded", "sed"):
        mine = [r for r in dc if r["policy"] == policy and r.get("native_ns")]
        if not mine:
            continue
        big = max(mine, key=lambda r: r["num_actors"])
        rows.append([
            f"decision cost, {policy}, N={big['num_actors']:,}: the same algorithm (indexed heap) "
            "in pure Python ÷ native through nanobind (what `choose` pays)",
            f"{stats.fmt(big['python_ns'] / big['via_python_ns'])}× ({stats.fmt(big['python_ns'])}"
            f" vs {stats.fmt(big['via_python_ns'])} ns; native alone {stats.fmt(big['native_ns'])}"
            f" ns; a pure-Python scan, extra line: {stats.fmt(big['scan_ns'] or math.nan)} ns)",
            "same decisions as native" if big.get("same_decisions") else "**decisions differ**",
        ])
    theory = results.get("theory", {}).get("rows", [])
    for policy in dict.fromkeys(r["policy"] for r in theory):
        mine = [r for r in theory if r["policy"] == policy]
        rows.append([
            f"SIMULATED mean time in system, {policy} ({mine[0]['actors']} actors), against "
            f"{mine[0]['formula']}",
            "; ".join(f"λ={r['load']:g}: {r['measured']:.3g} ± {r['se']:.2g} vs "
                      f"{r['predicted']:.3g}" for r in mine),
            "agrees" if all(r["agrees"] for r in mine) else "**disagrees at λ=" + ", ".join(
                f"{r['load']:g}" for r in mine if not r["agrees"]) + "**",
        ])
    sim = results.get("simulation", {})
    for sc in sim.get("scenarios", []):
        p = {r["policy"]: r for r in sc["policies"]}
        if sc["name"] == "uniform90" and "random" in p and "pow2" in p:
            rows.append([
                f"SIMULATED p99, {sim['actors']:,} actors, exponential service at 90% load: "
                "random ÷ pow2",
                f"{stats.fmt(p['random']['p99'] / p['pow2']['p99'])}× "
                f"({stats.fmt(p['random']['p99'])} vs {stats.fmt(p['pow2']['p99'])} mean "
                "service times)", "one seeded run",
            ])
    return rows


EXPLAIN = (
    "Ratios are how many times better the first contender is (> 1: better; baseline ÷ "
    "contender for latency, makespan, lost or slow calls and CPU, contender ÷ baseline for "
    "throughput). Contenders take turns within each repeat and play the same plan, so a ratio "
    "is the trimmed mean of the per-repeat ratios, with a 95% bootstrap interval over repeats; "
    "values are medians of repeats. "
    "The A/A control is the default run twice, on two meshes over the same actors: its "
    "interval, widened to include 1, is the noise floor. A ratio reads *better* or *worse* when "
    "its interval leaves out 1 and its value lies outside that floor, else *no difference "
    "(within noise)*; so the floor's edges are the smallest ratios a row can call. The "
    "strongest baseline is the best of the baselines on that metric in this run (random.choice, "
    "raw round robin and `ray.util.ActorPool` for the balancing scenarios; raw Ray calls and "
    "`ray.util.ActorPool` for the call path). \"Best of the library\" is picked after the run. "
    "`≥`: a lower bound (calls cut off at the deadline)."
)

OVERHEAD = (
    "The library's own overhead: actormesh's `random` policy against `random.choice` over the "
    "same handles, one algorithm with and without the library around it (> 1: the library "
    "costs nothing measurable or less; < 1: what its own work costs), judged against the "
    "scenario's A/A control."
)


def tables(results: Mapping[str, Any]) -> list[str]:
    """The headline's tables as markdown lines (`markdown` and the report both show them)."""
    lines: list[str] = []
    header, body = ray_table(ray_rows(results), results.get("default_policy", "?"))
    if body:
        lines += [markdown_table(header, body), ""]
    overhead = overhead_rows(results)
    if overhead:
        lines += [OVERHEAD, "", markdown_table(
            ["library overhead: scenario · metric", "am random ÷ random.choice", "A/A control",
             "verdict"], overhead), ""]
    side = side_rows(results)
    if side:
        lines += [markdown_table(["side scenario", "ratio [interval]", "A/A control", "verdict"],
                                 side), ""]
    other = other_rows(results)
    if other:
        lines += [markdown_table(["without Ray", "result", "check"], other), ""]
    return lines


def markdown(results: Mapping[str, Any]) -> str:
    lines = [provenance(results), "", EXPLAIN, "", *tables(results)]
    lines.append("Every figure comes from this run; `bench-results/report.md` has every scenario.")
    return "\n".join(lines) + "\n"
