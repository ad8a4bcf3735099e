"""What the harness prints while it runs: a rich table per scenario, the sections without Ray,
and the headline at the end (one block per row; headline.md has it as a table)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.report import headline
from benchmarks.report.document import RATIO_HEADER, comparison, table_rows
from benchmarks.report.provenance import provenance
from benchmarks.report.text import num

# The columns printed while running (report.md has them all); a header not listed is left out.
TERMINAL = ("p50 ms", "p99 ms", "p99.9 ms", "slow", "lost", "makespan s", "range", "× bound",
            "calls/s", "CPU µs/call", "failed", "unfinished", "rejoin s", "sent", "returned",
            "finished but lost", "run twice", "on killed actors", "load after", RATIO_HEADER)


def scenario_table(scenario: Mapping[str, Any]) -> Table:
    header, rows = table_rows(scenario)
    keep = [0] + [i for i, h in enumerate(header) if h in TERMINAL]
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


def decision_cost_table(dc: Mapping[str, Any]) -> Table:
    t = Table(title="Decision cost: ns per decision through nanobind (the same algorithm in pure "
              "Python ÷ that); report.md has every column", title_justify="left",
              show_edge=False)
    sizes = sorted({r["num_actors"] for r in dc["rows"]})
    t.add_column("policy")
    for n in sizes:
        t.add_column(f"N={n}", justify="right")
    for policy in dict.fromkeys(r["policy"] for r in dc["rows"]):
        cells = []
        for n in sizes:
            r = next((r for r in dc["rows"] if r["policy"] == policy and r["num_actors"] == n),
                     None)
            cells.append("–" if r is None else
                         f"{num(r['via_python_ns'])} "
                         f"({num(r['python_ns'] / r['via_python_ns'], 2)}×"
                         + ("" if r["same_decisions"] else ", decisions differ!") + ")")
        t.add_row(policy, *cells)
    return t


def sim_table(s: Mapping[str, Any]) -> Table:
    t = Table(title=f"SIMULATED (no Ray): {s['actors']} actors, {s['calls']:,} calls — p99 "
              "latency in mean service times (batch: makespan ÷ lower bound)",
              title_justify="left", show_edge=False)
    t.add_column("policy")
    for sc in s["scenarios"]:
        t.add_column(sc["title"], justify="right")
    t.add_column("same as reference", justify="right")
    same = {r["policy"]: r["identical"] for r in s.get("reference", {}).get("rows", [])}
    for i, policy in enumerate(r["policy"] for r in s["scenarios"][0]["policies"]):
        cells = []
        for sc in s["scenarios"]:
            r = sc["policies"][i]
            cells.append(num(r["p99"] if sc["load"] is not None else r["makespan_over_bound"]))
        t.add_row(policy, *cells, "yes" if same.get(policy) else "NO")
    return t


def theory_table(th: Mapping[str, Any]) -> Table:
    t = Table(title="SIMULATED against queueing theory: mean time in system (mean service times)",
              title_justify="left", show_edge=False)
    for h in ("policy", "λ", "formula", "predicted", "measured ± SE", "agrees"):
        t.add_column(h, justify="left" if h in ("policy", "formula") else "right")
    for r in th["rows"]:
        t.add_row(r["policy"], f"{r['load']:g}", r["formula"], num(r["predicted"]),
                  f"{num(r['measured'])} ± {num(r['se'], 2)}", "yes" if r["agrees"] else "NO")
    return t


def show_headline(results: Mapping[str, Any]) -> None:
    console = Console()
    say = functools.partial(console.print, markup=False, highlight=False)
    header, body = headline.ray_table(headline.ray_rows(results),
                                      results.get("default_policy", "?"))
    if body:
        console.rule("Headline: ratio > 1 = actormesh better, [95% interval], A/A = the noise")
        for row in body:
            say(row[0], style="bold")
            for label, cell in zip(header[2:], row[2:]):
                say(f"    {label}: {cell.replace('**', '')}")
    overhead = headline.overhead_rows(results)
    if overhead:
        console.rule("Library overhead: am random ÷ random.choice")
        for what, ratio, control, verdict in overhead:
            say(f"{what}: {ratio}; A/A {control}: {verdict}")
    for what, ratio, control, verdict in headline.side_rows(results):
        say(what, style="bold")
        say(f"    {ratio}; A/A {control}: {verdict}")
    other = headline.other_rows(results)
    if other:
        console.rule("Without Ray")
        for what, result, check in other:
            say(what, style="bold")
            say(f"    {result} ({check.replace('**', '')})")
    console.rule()
    say(provenance(results))
