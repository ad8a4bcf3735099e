"""The headline: a few rows a reader looks at first, written to be pasted into the README as is.

Each Ray row is one scenario and one metric. It names the default policy (`pow2`), the strongest
baseline of that scenario (the best of random choice, raw round robin and `ActorPool` on that
metric, in this run), and gives three ratios with their 95% bootstrap intervals: `pow2` against
the strongest baseline, `pow2` against random choice, and the best of the six policies against
the strongest baseline (chosen after the run: a selection, its interval does not cover the
choice). Beside them, the A/A control (actormesh `random` against `random.choice`): a ratio whose
interval overlaps the control's (widened to include 1) reads "no difference (within noise)".

Rows that need no Ray (decision cost, the simulation against queueing theory) follow in a table
of their own. `headline.md` holds both tables with a line naming the commit and the machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import stats
from .contenders import POLICIES

DEFAULT = "pow2"
RANDOM = "ray-random"

# (scenario, metric) in the order they appear.
RAY_ROWS = (
    ("uniform70", "p99_ms"),
    ("uniform90", "p99_ms"),
    ("lognormal", "p99_ms"),
    ("straggler", "slow_frac"),
    ("burst", "p99_ms"),
    ("batch_straggler", "makespan_s"),
    ("tiny_noop", "throughput_per_s"),
    ("tiny_noop", "cpu_us_per_call"),
    ("killed", "lost_frac"),
)

NAMES = {"ray-random": "random.choice", "ray-rr": "raw round robin", "ActorPool": "ActorPool"}


def name(contender: str | None) -> str:
    if contender is None:
        return "–"
    return NAMES.get(contender, f"am {contender}" if contender in POLICIES else contender)


def value_text(metric: str, v: float | None, censored: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    ge = "≥" if censored else ""
    if metric.endswith("_frac"):
        return f"{ge}{v * 100:.2g}%" if v >= 0.001 or v == 0 else f"{ge}{v * 100:.1g}%"
    unit = stats.METRICS[metric].unit
    return f"{ge}{stats.fmt(v)} {unit}".strip()


def ratio_cell(r: stats.Ratio | None, control: stats.Ratio | None) -> str:
    if r is None:
        return "–"
    verdict = stats.verdict(r, control)
    text = f"{stats.interval_text(r)} {verdict}"
    return text if verdict == stats.NO_DIFFERENCE else f"**{text}**"


def estimate(comparison: dict[str, Any], contender: str | None) -> tuple[float | None, bool]:
    e = comparison.get("estimates", {}).get(contender) if contender else None
    return (None, False) if not e else (e["value"], bool(e["censored"]))


def ray_row(scenario: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """One headline row, or None when the scenario did not measure what the row needs."""
    comparison = scenario.get("comparisons", {}).get(metric)
    if not comparison:
        return None
    strongest, best = comparison.get("strongest"), comparison.get("best")
    control = stats.control_of(comparison)
    shown = [c for c in dict.fromkeys([DEFAULT, strongest, RANDOM, best]) if c is not None]
    values = " · ".join(f"{name(c)} {value_text(metric, *estimate(comparison, c))}"
                        for c in shown if estimate(comparison, c)[0] is not None)
    if metric == "slow_frac" and "p99_ms" in scenario.get("comparisons", {}):
        p99 = scenario["comparisons"]["p99_ms"]
        values += "; p99 " + " · ".join(
            value_text("p99_ms", *estimate(p99, c)) for c in shown
            if estimate(p99, c)[0] is not None)
    note = scenario.get("control_note")
    if control is None and note:
        pair = stats.find(comparison, "random", RANDOM)
        note = f"none: {note}" + (f" (their ratio {stats.interval_text(pair)})" if pair else "")
    vs_strongest = stats.find(comparison, DEFAULT, strongest)
    vs_random = stats.find(comparison, DEFAULT, RANDOM) if strongest != RANDOM else None
    best_vs = stats.find(comparison, best, strongest) if best not in (None, DEFAULT) else None
    return {
        "scenario": scenario["name"],
        "title": scenario["title"],
        "metric": metric,
        "strongest": strongest,
        "best": best,
        "values": values,
        "vs_strongest": vs_strongest.as_dict() if vs_strongest else None,
        "vs_random": vs_random.as_dict() if vs_random else None,
        "best_vs_strongest": best_vs.as_dict() if best_vs else None,
        "control": control.as_dict() if control else None,
        "no_control": note,
        "verdict": stats.verdict(vs_strongest, control) if vs_strongest else "–",
    }


def ray_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the main table: the balancing scenarios', then side scenarios' rows that
    carry ratios in the same form (`vs_strongest`, ...; see `benchmarks.side`)."""
    by_name = {s["name"]: s for s in results.get("scenarios", [])}
    rows = [ray_row(by_name[s], m) for s, m in RAY_ROWS if s in by_name]
    rows += [{**r, "side": True} for r in _side_headline(results) if "vs_strongest" in r]
    return [r for r in rows if r]


def _side_headline(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for section in results.get("side", []):
        given = section.get("result", {}).get("headline") or []
        for h in [given] if isinstance(given, dict) else given:
            if isinstance(h, dict):
                rows.append({**h, "section": section.get("title", section["name"])})
    return rows


def side_rows(results: dict[str, Any]) -> list[list[str]]:
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


def _ratio(d: dict[str, Any] | None) -> stats.Ratio | None:
    return stats.Ratio.from_dict(d) if d else None


def ray_table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["scenario · metric", "values: default pow2 · strongest baseline · random.choice",
              "default (pow2) ÷ strongest baseline", "pow2 ÷ random.choice",
              f"best of {len(POLICIES)} policies ÷ strongest (a selection)",
              "A/A: am random ÷ random.choice"]
    body = []
    for r in rows:
        control = _ratio(r.get("control"))
        best = r.get("best")
        best_cell = ("same as pow2" if best == DEFAULT else
                     f"{name(best)}: {ratio_cell(_ratio(r.get('best_vs_strongest')), control)}"
                     if r.get("best_vs_strongest") else "–")
        vs = _ratio(r.get("vs_strongest"))
        who = "" if vs is None or vs.contender in ("", DEFAULT) else f"{name(vs.contender)} "
        strongest = f"{who}vs {name(r.get('strongest'))}: " if r.get("strongest") else ""
        metric = r.get("metric")
        title = (str(r.get("title", "")) if r.get("side") or metric not in stats.METRICS
                 else f"{r['title']} · {stats.METRICS[metric].words}")
        aa = (stats.interval_text(control) if control else
              str(r.get("no_control", "no control in this run")))
        body.append([
            title,
            r.get("values", ""),
            strongest + ratio_cell(vs, control),
            ("strongest is random.choice" if r.get("strongest") == RANDOM
             else ratio_cell(_ratio(r.get("vs_random")), control)),
            best_cell,
            aa,
        ])
    return header, body


def other_rows(results: dict[str, Any]) -> list[list[str]]:
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
        if sc["name"] == "uniform90" and "random" in p and DEFAULT in p:
            rows.append([
                f"SIMULATED p99, {sim['actors']:,} actors, exponential service at 90% load: "
                "random ÷ pow2",
                f"{stats.fmt(p['random']['p99'] / p[DEFAULT]['p99'])}× "
                f"({stats.fmt(p['random']['p99'])} vs {stats.fmt(p[DEFAULT]['p99'])} mean "
                "service times)", "one seeded run",
            ])
    return rows


def provenance(results: dict[str, Any]) -> str:
    m, v, git = results["machine"], results["versions"], results.get("git", {})
    commit = git.get("commit", "unknown")
    state = ("uncommitted changes in " + ", ".join(git.get("changed", [])[:8])
             + (" …" if len(git.get("changed", [])) > 8 else "")) if git.get("dirty") else "clean"
    actors = ""
    if results.get("scenarios"):
        shared = ("shared by every contender" if results.get("ray", {}).get("shared_actors")
                  else "NOT shared: one set per policy")
        actors = f"; {results.get('config', {}).get('actors', '?')} single-slot actors {shared}"
    return (f"`{results['command']}` ({results['mode']}, {stats.fmt(results['duration_s'])} s) on "
            f"{results['created'][:10]} at commit `{commit}` (tree: {state}); {m['cpu_model']}, "
            f"{m['nproc']} cores, load average {m.get('load_average_at_start', '?')} at start; "
            f"Python {m['python']}, Ray {v.get('ray', '?')}{actors}.")


EXPLAIN = (
    "Ratios are how many times better the first contender is (> 1: better; baseline ÷ "
    "contender for latency, makespan, lost or slow calls and CPU, contender ÷ baseline for "
    "throughput), with a 95% bootstrap interval over repeats (repeats and calls resampled). The "
    "A/A control runs one algorithm twice (actormesh `random` and `random.choice`); a ratio "
    "whose interval overlaps the control's (widened to include 1) reads *no difference (within "
    "noise)*. The strongest baseline is the best of random.choice, raw round robin and "
    "`ray.util.ActorPool` on that metric in this run. \"Best of 6\" is picked after the run. "
    "`≥`: a lower bound (calls cut off at the deadline)."
)


def tables(results: dict[str, Any]) -> list[str]:
    """The headline's tables as markdown lines (`markdown` and the report both show them)."""
    from .report import markdown_table

    lines: list[str] = []
    header, body = ray_table(ray_rows(results))
    if body:
        lines += [markdown_table(header, body), ""]
    side = side_rows(results)
    if side:
        lines += [markdown_table(["side scenario", "ratio [interval]", "A/A control", "verdict"],
                                 side), ""]
    other = other_rows(results)
    if other:
        lines += [markdown_table(["without Ray", "result", "check"], other), ""]
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = [provenance(results), "", EXPLAIN, "", *tables(results)]
    lines.append("Every figure comes from this run; `bench-results/report.md` has every scenario.")
    return "\n".join(lines) + "\n"
