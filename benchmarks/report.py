"""Turning results into words and tables: headline ratios, terminal tables, report.md, README text.

Everything here reads the results dictionary (the same one written to results.json), so a report
can be rebuilt from a saved run: `python -m benchmarks --report bench-results/results.json`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .scenarios import PRIMARY
from .sim import paragraph as sim_paragraph

RANDOM = "ray-random"  # the baseline users have today: random choice over the handles
RAW = "ray-rr"  # raw .remote() over the handles in turn
BASELINES = ("ray-random", "ray-rr", "ActorPool")


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


def by_name(scenario: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in scenario["contenders"]}


def display(contender: dict[str, Any]) -> str:
    if contender["family"] == "actormesh":
        return f"am {contender['name']}"
    return {"ray-random": "random.choice", "ray-rr": "raw round robin",
            "ActorPool": "ActorPool"}.get(contender["name"], contender["name"])


# -- tables -----------------------------------------------------------------------------------
def columns(kind: str) -> list[tuple[str, str]]:
    """(header, metric key) per column of a scenario table."""
    if kind == "open":
        return [("p50 ms", "p50_ms"), ("p90 ms", "p90_ms"), ("p99 ms", "p99_ms"),
                ("p99.9 ms", "p99_9_ms"), ("p99 range", "~p99_ms"),
                ("calls/s", "throughput_per_s"), ("util", "utilisation"),
                ("imbalance", "imbalance"), ("lost", "lost")]
    if kind == "batch":
        return [("makespan s", "makespan_s"), ("range", "~makespan_s"),
                ("× bound", "makespan_over_bound"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
                ("util", "utilisation"), ("imbalance", "imbalance"), ("lost", "lost")]
    if kind == "throughput":
        return [("calls/s", "throughput_per_s"), ("range", "~throughput_per_s"),
                ("vs raw", "vs_raw"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
                ("lost", "lost")]
    return [("failed", "failed"), ("range", "~failed"), ("unfinished", "unfinished"),
            ("recovery s", "recovery_s"), ("rejoin s", "rejoin_s"), ("p50 ms", "p50_ms"),
            ("p99 ms", "p99_ms"), ("calls/s", "throughput_per_s")]


TERMINAL = {  # the narrower set of columns printed while running (report.md has them all)
    "open": ("p50 ms", "p99 ms", "p99.9 ms", "p99 range", "calls/s", "lost"),
    "batch": ("makespan s", "range", "× bound", "p99 ms", "lost"),
    "throughput": ("calls/s", "range", "vs raw", "p50 ms", "p99 ms"),
    "fault": ("failed", "unfinished", "recovery s", "rejoin s", "p99 ms"),
}


def table_rows(scenario: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    cols = columns(scenario["kind"])
    names = by_name(scenario)
    raw = names.get(RAW)
    rows = []
    for c in scenario["contenders"]:
        row = [display(c)]
        for _, key in cols:
            if key.startswith("~"):
                row.append(range_cell(c, key[1:]))
            elif key == "vs_raw":
                r = med(c, "throughput_per_s") / med(raw, "throughput_per_s") if raw else math.nan
                row.append(ratio_text(r))
            elif key in ("lost", "failed", "unfinished"):
                row.append(num(med(c, key)))
            else:
                row.append(cell(c, key))
        rows.append(row)
    return ["contender"] + [h for h, _ in cols], rows


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
    winner = winner_of(scenario)
    table = Table(title=f"{scenario['title']} — {scenario['description']}", title_justify="left",
                  show_edge=False, pad_edge=False)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for c, row in zip(scenario["contenders"], rows):
        style = "bold green" if winner and c["name"] == winner["name"] else (
            "dim" if c["family"] != "actormesh" else None)
        table.add_row(*row, style=style)
    return table


# -- who won ----------------------------------------------------------------------------------
def primary(scenario: dict[str, Any]) -> tuple[str, bool]:
    return PRIMARY[scenario["kind"]]


def ranked(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    key, lower = primary(scenario)
    def score(c: dict[str, Any]) -> tuple[float, float]:
        v = med(c, key)
        v = math.inf if math.isnan(v) else v
        tie = med(c, "p99_ms")  # fault: fewer lost first, then lower p99
        tie = math.inf if math.isnan(tie) else tie
        return (v if lower else -v), tie
    return sorted(scenario["contenders"], key=score)


def winner_of(scenario: dict[str, Any]) -> dict[str, Any] | None:
    order = ranked(scenario)
    return order[0] if order else None


def factor(a: dict[str, Any], b: dict[str, Any], key: str, lower: bool) -> tuple[float, bool]:
    """How many times better `a` is than `b` on `key`; and whether that is a lower bound."""
    va, vb = med(a, key), med(b, key)
    if lower:
        r = vb / va if va > 0 else math.inf
        return r, censored(b, key) and not censored(a, key)
    return (va / vb if vb > 0 else math.inf), False


METRIC_WORDS = {"p99_ms": "p99 latency", "makespan_s": "makespan",
                "throughput_per_s": "throughput", "failed": "calls failed, then p99"}


def value_text(c: dict[str, Any], key: str) -> str:
    if key == "failed":
        return f"{num(med(c, 'failed'))} failed, p99 {cell(c, 'p99_ms')} ms"
    unit = {"p99_ms": " ms", "makespan_s": " s", "throughput_per_s": " calls/s"}[key]
    return cell(c, key) + unit


def paragraph(scenario: dict[str, Any]) -> str:
    """Who won, by how much, against what; and whether the driver kept up."""
    key, lower = primary(scenario)
    order = ranked(scenario)
    if not order:
        return "No results."
    best = order[0]
    names = by_name(scenario)
    words = METRIC_WORDS[key]
    text = [f"**{display(best)}** won on {words} ({value_text(best, key)})."]
    am = [c for c in order if c["family"] == "actormesh"]
    base = [c for c in order if c["family"] != "actormesh"]
    if best["family"] == "actormesh" and base:
        b = base[0]
        r, ge = factor(best, b, key, lower)
        text.append(f"The best baseline, {display(b)}, had {value_text(b, key)}"
                    + (f": {ratio_text(r, ge)} {'better' if r >= 1 else 'worse'} for actormesh."
                       if key != "failed" else "."))
    elif am:
        a = am[0]
        r, ge = factor(best, a, key, lower)
        text.append(f"The best actormesh policy, {a['name']}, had {value_text(a, key)}"
                    + (f" ({ratio_text(r, ge)} behind)." if key != "failed" else "."))
    rnd = names.get(RANDOM)
    if rnd is not None and rnd is not best and key != "failed":
        r, ge = factor(best, rnd, key, lower)
        text.append(f"Against random choice (Ray's ActorMesh prototype, Monarch): "
                    f"{value_text(rnd, key)}, {ratio_text(r, ge)}.")
    if scenario["kind"] == "throughput":
        paired = paired_ratios(scenario, "pow2", RAW)
        if paired:
            text.append(f"Default `choose` (pow2) ran at {ratio_text(median(paired))} the calls/s "
                        f"of raw `.remote()` on the same actors (median of per-repeat ratios, "
                        f"{num(min(paired))}–{num(max(paired))}).")
    if scenario["kind"] == "fault":
        lost = {display(c): med(c, "failed") for c in scenario["contenders"]}
        am_lost = [v for c, v in lost.items() if c.startswith("am ")]
        text.append(f"Calls that failed: actormesh (choose with retries=1) {num(max(am_lost))} at "
                    "most; " + ", ".join(f"{n} {num(v)}" for n, v in lost.items()
                                         if not n.startswith("am ")) + ".")
        rejoin = [c for c in scenario["contenders"] if c["family"] == "actormesh"
                  and not censored(c, "rejoin_s") and not math.isnan(med(c, "rejoin_s"))]
        if rejoin:
            times = [med(c, "rejoin_s") for c in rejoin]
            text.append(f"The restarted actor served calls again {num(min(times))}–"
                        f"{num(max(times))} s after the kill through "
                        + ", ".join(c["name"] for c in rejoin) + "; `≥` in the rejoin column: "
                        "not within the run.")
    lo, hi = spread(best, key)
    if not math.isnan(lo) and scenario["repeats"] > 1:
        text.append(f"Over {scenario['repeats']} repeats the winner ranged {num(lo)}–{num(hi)}.")
    text.append(driver_note(scenario))
    return " ".join(t for t in text if t)


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


# -- headline ratios ----------------------------------------------------------------------------
def paired_ratios(scenario: dict[str, Any], a: str, b: str) -> list[float]:
    """a ÷ b of the primary metric, repeat by repeat (both ran on the same plan, same actors)."""
    return [row[a] / row[b] for row in scenario.get("paired", [])
            if isinstance(row.get(a), float) and isinstance(row.get(b), float)
            and row[b] > 0 and not math.isnan(row[a])]


def median(values: Sequence[float]) -> float:
    v = sorted(values)
    n = len(v)
    return math.nan if not n else v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The few ratios a reader looks for first, each with its goal where the issue set one."""
    scen = {s["name"]: s for s in results.get("scenarios", [])}
    out: list[dict[str, Any]] = []

    for name in ("tiny_noop", "tiny_100us"):
        s = scen.get(name)
        if not s:
            continue
        ratios = sorted(paired_ratios(s, "pow2", RAW))
        if ratios:
            mid = median(ratios)
            names = by_name(s)
            out.append({
                "name": f"choose_vs_raw_{name}",
                "what": f"`choose` (pow2) calls/s ÷ raw `.remote()` calls/s, same actors "
                        f"({s['title'][0].lower() + s['title'][1:]})",
                "readme": name == "tiny_noop",
                "value": mid, "min": ratios[0], "max": ratios[-1], "goal": ">= 0.95",
                "met": mid >= 0.95,
                "text": f"{num(mid)} (range {num(ratios[0])}–{num(ratios[-1])} over "
                        f"{len(ratios)} paired repeats; {num(med(names['pow2'], 'throughput_per_s'))}"
                        f" vs {num(med(names[RAW], 'throughput_per_s'))} calls/s)",
            })

    s = scen.get("straggler")
    if s:
        names = by_name(s)
        rnd = names.get(RANDOM)
        for policy in ("pull", "sed"):
            c = names.get(policy)
            if rnd is None or c is None:
                continue
            r, ge = factor(c, rnd, "p99_ms", True)
            out.append({
                "name": f"straggler_p99_random_over_{policy}",
                "what": f"p99 with one actor 20× slower: random.choice ÷ actormesh {policy}",
                "value": r, "lower_bound": ge, "goal": ">= 5", "met": r >= 5, "readme": True,
                "text": f"{ratio_text(r, ge)} ({cell(rnd, 'p99_ms')} ms vs "
                        f"{cell(c, 'p99_ms')} ms)",
            })

    for name, what in (("uniform90", "p99 at 90% load (exponential)"),
                       ("lognormal", "p99 with lognormal σ=2 service"),
                       ("pareto", "p99 with Pareto α=1.5 service"),
                       ("burst", "p99 under bursts")):
        s = scen.get(name)
        if not s or RANDOM not in by_name(s):
            continue
        names = by_name(s)
        am = [c for c in ranked(s) if c["family"] == "actormesh"]
        best = am[0]
        pow2 = names.get("pow2")
        r, ge = factor(best, names[RANDOM], "p99_ms", True)
        text = (f"best actormesh ({best['name']}) {ratio_text(r, ge)} lower than random.choice "
                f"({cell(best, 'p99_ms')} vs {cell(names[RANDOM], 'p99_ms')} ms)")
        if pow2 is not None:
            r2, ge2 = factor(pow2, names[RANDOM], "p99_ms", True)
            text += f"; default pow2 {ratio_text(r2, ge2)}"
        out.append({"name": f"{name}_p99_vs_random", "what": what, "value": r,
                    "lower_bound": ge, "text": text, "readme": name in ("uniform90", "lognormal")})

    s = scen.get("batch_straggler")
    if s:
        names = by_name(s)
        am = [c for c in ranked(s) if c["family"] == "actormesh"][0]
        if RANDOM in names:
            r, _ = factor(am, names[RANDOM], "makespan_s", True)
            out.append({
                "name": "batch_straggler_makespan",
                "what": "batch with one actor 10× slower: makespan of random.choice ÷ best actormesh",
                "value": r, "readme": True,
                "text": f"{ratio_text(r)} ({am['name']} {cell(am, 'makespan_s')} s = "
                        f"{cell(am, 'makespan_over_bound')}× the lower bound; random.choice "
                        f"{cell(names[RANDOM], 'makespan_s')} s)",
            })

    s = scen.get("killed")
    if s:
        names = by_name(s)
        am_lost = max(med(c, "failed") for c in s["contenders"] if c["family"] == "actormesh")
        others = ", ".join(f"{display(c)} {num(med(c, 'failed'))}" for c in s["contenders"]
                           if c["family"] != "actormesh")
        out.append({"name": "killed_calls_lost",
                    "what": "calls failed when an actor is killed mid-run (median of repeats)",
                    "value": am_lost, "readme": True,
                    "text": f"actormesh (retries=1) {num(am_lost)} at most; {others}"})

    dc = results.get("decision_cost", {}).get("rows", [])
    for policy in ("pow2", "least_loaded", "sed"):
        rows = [r for r in dc if r["policy"] == policy and r.get("native_ns")]
        if not rows:
            continue
        big = max(rows, key=lambda r: r["num_actors"])
        out.append({
            "name": f"decision_cost_{policy}",
            "what": f"{policy} decision cost at N={big['num_actors']}: pure-Python reference ÷ native",
            "value": big["reference_ns"] / big["native_ns"], "readme": policy == "least_loaded",
            "text": f"{ratio_text(big['reference_ns'] / big['native_ns'])} "
                    f"({num(big['native_ns'])} ns native, {num(big['via_python_ns'])} ns through "
                    f"nanobind, {num(big['reference_ns'])} ns reference)",
        })

    sim = results.get("simulation", {})
    for sc in sim.get("scenarios", []):
        if sc["name"] != "uniform90":
            continue
        p = {r["policy"]: r for r in sc["policies"]}
        if "random" in p and "pow2" in p:
            best = min(sc["policies"], key=lambda r: r["p99"])
            out.append({
                "name": "sim_uniform90",
                "what": f"SIMULATED, {sim['actors']} actors, {sim['calls']:,} calls, 90% load: "
                        "p99 of random ÷ pow2 and ÷ best",
                "value": p["random"]["p99"] / p["pow2"]["p99"], "readme": True,
                "text": f"pow2 {ratio_text(p['random']['p99'] / p['pow2']['p99'])}, "
                        f"{best['policy']} {ratio_text(p['random']['p99'] / best['p99'])} "
                        f"(p99 {num(p['random']['p99'])} vs {num(p['pow2']['p99'])} vs "
                        f"{num(best['p99'])} mean service times)",
            })
    return out


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
        f"{results['created']} · `{results['command']}` · mode **{results['mode']}** · "
        f"{num(results['duration_s'])} s",
        "",
        f"Machine: {machine_line(results)}. Ray: {results['ray']['address']}"
        f" ({results['ray']['actors']} actors, num_cpus={cfg['actor_cpus']} each, "
        + ("shared by every contender: each policy has its own mesh and scheduler over them"
           if results["ray"].get("shared_actors") else
           f"{cfg['actors']} per policy; the baselines use the handles of those meshes")
        + f"; all answering {num(results['ray']['startup_s'])} s after they were requested, "
        "the decision cost and the simulation running meanwhile).",
        "",
        "Every figure below was measured in this run, baselines included. Latency is from just "
        "before the call is sent to its result reaching the driver (completion callback); "
        "values are medians over repeats, with the range over repeats where shown. A `≥` marks "
        "a lower bound: some calls had no result by the drain deadline and count at it. "
        "Calls sent in the warm-up are not measured.",
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
    lines += [
        "## Headlines",
        "",
    ]
    hl = results.get("headlines", [])
    if hl:
        lines.append(markdown_table(["what", "result", "goal"],
                                    [[h["what"], h["text"], h.get("goal", "")] for h in hl]))
    lines += ["", "## Contenders", ""]
    for c in results.get("contenders", []):
        lines.append(f"- **{c['display']}** — {c['label']}")
    for s in results.get("scenarios", []):
        header, rows = table_rows(s)
        lines += ["", f"## {s['title']} (`{s['name']}`)", "", s["description"] + ".", "",
                  markdown_table(header, rows), "", paragraph(s)]
        plot = results.get("plots", {}).get(s["name"])
        if plot:
            lines += ["", f"![{s['title']}]({plot})"]
    dc = results.get("decision_cost")
    if dc and dc.get("rows"):
        lines += ["", "## Decision cost", "", dc["note"], "",
                  markdown_table(["policy", "N", "native ns", "via nanobind ns",
                                  "reference ns", "reference ÷ native",
                                  "reference ÷ via nanobind"],
                                 [[r["policy"], str(r["num_actors"]), num(r["native_ns"]),
                                   num(r["via_python_ns"]), num(r["reference_ns"]),
                                   ratio_text(r["reference_ns"] / r["native_ns"])
                                   if r.get("native_ns") else "–",
                                   ratio_text(r["reference_ns"] / r["via_python_ns"])]
                                  for r in dc["rows"]])]
        if results.get("plots", {}).get("decision_cost"):
            lines += ["", f"![decision cost]({results['plots']['decision_cost']})"]
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
                      "Latency in units of the mean service time.", "",
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


NOTES = """
- `python -m benchmarks --quick` (what `make bench` runs) takes about five minutes on two cores;
  `--full` runs longer, bigger and more repeats; `--only straggler tiny_noop` picks scenarios
  (also `sim` and `decision_cost`), `--contenders pow2 sed ray-random` picks contenders. With
  `RAY_ADDRESS` set (e.g. `RAY_ADDRESS=auto` on a node of a cluster where actormesh is installed)
  the harness joins that cluster instead of starting one.
- Service times are drawn by the driver (one seeded plan per repeat, identical for every
  contender) and slept by the actor, times its slowdown; the actor reports the time it took.
  `util` is the actors' busy time over the run span; `imbalance` is the busiest actor's busy time
  over the mean.
- Open-loop arrivals: calls are sent at planned times whatever happened to earlier calls. The
  driver's own send lag is reported; if it fell behind, latencies would be understated, never
  inflated.
- On a two-core machine the driver, eight to forty-eight actor processes and Ray's own daemons
  share the CPUs, so absolute latencies include contention; compare contenders within a
  scenario, not across machines.
"""


def readme_snippet(results: dict[str, Any], plot_path: str | None) -> str:
    """The short results section for the project README."""
    m = results["machine"]
    shared = "shared by every contender" if results["ray"].get("shared_actors") else "per policy"
    lines = [
        "## Latest benchmark results",
        "",
        f"`make bench` (`python -m benchmarks --quick`, {num(results['duration_s'])} s) on "
        f"{results['created'][:10]}: {m['cpu_model']}, {m['nproc']} cores, Python {m['python']}, "
        f"Ray {results['versions']['ray']}, commit {results['versions'].get('git', '?')}; "
        f"{results['config']['actors']} single-slot actors {shared}, sleeping service times "
        "drawn by the driver. Every figure was measured in the same run as its baseline; "
        "`make bench` writes the full report (every scenario, the decision cost, the simulation) "
        "to `bench-results/report.md`.",
        "",
        markdown_table(["what", "result", "goal"],
                       [[h["what"], h["text"], h.get("goal", "")]
                        for h in results.get("headlines", []) if h.get("readme")]),
    ]
    if plot_path:
        lines += ["", f"![latency CDF with one actor 20× slower]({plot_path})"]
    return "\n".join(lines) + "\n"
