"""PNG plots of a results dictionary: latency CDFs per scenario, decision cost against N,
throughput bars, and the simulated tails. Each function returns the file name it wrote."""

from __future__ import annotations

import math
import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from benchmarks.report.text import display  # noqa: E402

COLORS = {
    "random": "#9e9e9e", "round_robin": "#795548", "pow2": "#1f77b4", "least_loaded": "#17becf",
    "pull": "#2ca02c", "sed": "#d62728", "ray-random": "#000000", "ray-rr": "#ff7f0e",
    "ActorPool": "#9467bd", "external": "#8c564b",
}


# Plain tick labels ("100", "0.01") instead of mathtext powers: clearer, and 4x faster to draw.
_PLAIN = FuncFormatter(lambda v, _: f"{v:g}")


def _log(ax: Any, x: bool = True, y: bool = False) -> None:
    if x:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_PLAIN)
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    if y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.grid(True, which="major", alpha=0.3)


def _style(name: str, family: str) -> dict[str, Any]:
    return {"color": COLORS.get(name), "linestyle": "-" if family == "actormesh" else "--",
            "linewidth": 1.6 if family == "actormesh" else 1.3}


def scenario_plot(scenario: dict[str, Any], out_dir: str) -> str | None:
    """Throughput bars for a scenario decided by calls/s, else its latency CDF."""
    if scenario["metrics"] and scenario["metrics"][0] == "throughput_per_s":
        return throughput_bars(scenario, out_dir)
    return latency_cdf(scenario, out_dir)


def latency_cdf(scenario: dict[str, Any], out_dir: str) -> str | None:
    curves = [(c, c["cdf"]) for c in scenario["contenders"] if c["cdf"]["ms"]]
    if not curves:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c, cdf in curves:
        ms = [max(v, 1e-3) for v in cdf["ms"]]
        style = _style(c["name"], c["family"])
        left.plot(ms, cdf["q"], label=display(c), **style)
        tail = [(m, 1 - q) for m, q in zip(ms, cdf["q"]) if 1 - q > 0]
        right.plot([m for m, _ in tail], [t for _, t in tail], **style)
    slow = scenario.get("slow_ms")
    if isinstance(slow, (int, float)) and not math.isnan(slow):
        for ax in (left, right):
            ax.axvline(slow, color="#d62728", linestyle=":", linewidth=1)
        right.annotate("slow: 10× mean service", (slow, 0.93), xytext=(4, 0),
                       textcoords="offset points", fontsize=7, color="#d62728",
                       xycoords=("data", "axes fraction"))
    _log(left)
    left.set_xlabel("latency (ms, log)")
    left.set_ylabel("fraction of calls ≤ latency")
    left.set_title("CDF")
    _log(right, y=True)
    right.set_xlabel("latency (ms, log)")
    right.set_ylabel("fraction of calls > latency")
    right.set_title("tail (p90 = 1e-1, p99 = 1e-2, p99.9 = 1e-3)")
    left.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{scenario['title']}: {scenario['description']}", fontsize=9)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.85, wspace=0.22)
    name = f"latency_{scenario['name']}.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return name


def throughput_bars(scenario: dict[str, Any], out_dir: str) -> str | None:
    rows = [(c, c["summary"].get("throughput_per_s")) for c in scenario["contenders"]]
    rows = [(c, s) for c, s in rows if s and not math.isnan(s["median"])]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels = [display(c) for c, _ in rows]
    medians = [s["median"] for _, s in rows]
    err = [[s["median"] - s["min"] for _, s in rows], [s["max"] - s["median"] for _, s in rows]]
    ax.bar(labels, medians, yerr=err, capsize=3,
           color=[COLORS.get(c["name"], "#888888") for c, _ in rows])
    ax.set_ylabel("calls/s (median, range over repeats)")
    ax.set_title(f"{scenario['title']}: {scenario['description']}", fontsize=9)
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.3, top=0.9)
    name = f"throughput_{scenario['name']}.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return name


def decision_cost(rows: list[dict[str, Any]], out_dir: str) -> str | None:
    if not rows:
        return None
    policies = sorted({r["policy"] for r in rows}, key=lambda p: list(COLORS).index(p)
                      if p in COLORS else 99)
    fig, ax = plt.subplots(figsize=(10, 5))
    for policy in policies:
        pr = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["num_actors"])
        n = [r["num_actors"] for r in pr]
        color = COLORS.get(policy)
        if any(r.get("native_ns") for r in pr):
            ax.plot(n, [r["native_ns"] for r in pr], "-o", color=color, markersize=3,
                    label=f"{policy} native")
        ax.plot(n, [r["via_python_ns"] for r in pr], ":", color=color, linewidth=1)
        ax.plot(n, [r["python_ns"] for r in pr], "--s", color=color, markersize=3,
                linewidth=1, label=f"{policy} pure Python, same algorithm")
        scan = [(r["num_actors"], r["scan_ns"]) for r in pr if r.get("scan_ns")]
        if scan:
            ax.plot([x for x, _ in scan], [y for _, y in scan], "-.", color=color, linewidth=0.7,
                    alpha=0.6, label=f"{policy} pure-Python scan (extra)")
    _log(ax, y=True)
    ax.set_xticks(sorted({r["num_actors"] for r in rows}))
    ax.set_xlabel("actors (N)")
    ax.set_ylabel("ns per decision (submit + complete)")
    ax.set_title("Decision cost: native (solid), through nanobind (dotted),\nthe same algorithm "
                 "in pure Python (dashed), a pure-Python scan (dash-dot)", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.subplots_adjust(left=0.1, right=0.7, bottom=0.1, top=0.9)
    name = "decision_cost.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return name


def simulation(sim: dict[str, Any], out_dir: str) -> str | None:
    scenarios = [s for s in sim.get("scenarios", []) if s["policies"]]
    if not scenarios:
        return None
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 4), squeeze=False)
    for ax, sc in zip(axes[0], scenarios):
        for r in sc["policies"]:
            tail = [(v, 1 - q) for v, q in zip(r["cdf"]["ms"], r["cdf"]["q"]) if 1 - q > 0]
            ax.plot([max(v, 1e-3) for v, _ in tail], [t for _, t in tail],
                    color=COLORS.get(r["policy"]), label=r["policy"])
        _log(ax, y=True)
        ax.set_xlabel("latency / mean service time")
        ax.set_title(sc["title"], fontsize=9)
    axes[0][0].set_ylabel("fraction of calls > latency")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"SIMULATED (no Ray): {sim['actors']} actors, {sim['calls']:,} calls per policy",
                 fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.13, top=0.85, wspace=0.25)
    name = "simulation.png"
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    return name
