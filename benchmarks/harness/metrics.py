"""From the raw record of a run to the numbers a report shows, and their spread over repeats."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.harness.driver import Run
from benchmarks.report.stats import METRICS, RunSample

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# Quantiles kept for the latency CDF plots: dense in the body, then down the tail to 1e-4.
CDF_QUANTILES = np.concatenate([np.linspace(0.0, 0.9, 46), 1.0 - np.logspace(-1, -4, 31)[1:]])


def pct_key(p: float) -> str:
    return f"p{p:g}".replace(".", "_")


def latencies(run: Run, warmup_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latencies in ms of the measured calls that finished, censored ones, measured mask).

    Measured calls are those planned at or after `warmup_s`. A call with no result by the drain
    deadline is counted at the deadline (a lower bound: "censored"); a call that failed has no
    latency and is counted as lost instead.
    """
    measured = run.planned_s >= warmup_s
    done = measured & run.ok
    unfinished = measured & np.isnan(run.ended)
    lat = (run.ended[done] - run.sent[done]) * 1e3
    censored = (run.deadline - run.sent[unfinished]) * 1e3
    return lat, censored, measured


def batch_lower_bound(durations: np.ndarray, slowdowns: Sequence[float]) -> float:
    """No scheduler finishes the calls sooner: their work spread perfectly over the actors'
    speeds (1 / slowdown), or the longest call on the fastest actor."""
    speeds = 1.0 / np.asarray(slowdowns, dtype=float)
    return max(float(durations.sum() / speeds.sum()), float(durations.max() / speeds.max()))


def run_metrics(run: Run, *, warmup_s: float, slowdowns: Sequence[float],
                killed_rank: int | None = None, slow_ms: float = math.nan) -> dict[str, Any]:
    """The metrics of one run. `slowdowns` are the actors' factors, for the batch lower bound;
    a call that took longer than `slow_ms` (or never finished) counts in `slow_frac`."""
    n_actors = len(slowdowns)
    finished, censored_ms, measured = latencies(run, warmup_s)
    lat = np.concatenate([finished, censored_ms])
    censored = len(censored_ms)
    failed = int((measured & ~run.ok & ~np.isnan(run.ended)).sum())
    calls = int(measured.sum())
    out: dict[str, Any] = {
        "calls": calls,
        "completed": int((measured & run.ok).sum()),
        "failed": failed,
        "unfinished": censored,
        "lost": failed + censored,
        "lost_frac": (failed + censored) / calls if calls else math.nan,
    }
    if not math.isnan(slow_ms) and len(lat):
        out["slow"] = int((lat > slow_ms).sum())
        out["slow_frac"] = out["slow"] / len(lat)
    if run.n and run.cpu_s >= 0:
        out["cpu_us_per_call"] = run.cpu_s / run.n * 1e6
    if len(lat):
        values = np.percentile(lat, PERCENTILES)
        # A percentile that reaches past the slowest finished call rests on censored values.
        top = float(finished.max()) if len(finished) else -math.inf
        for p, v in zip(PERCENTILES, values):
            out[pct_key(p) + "_ms"] = float(v)
            out[pct_key(p) + "_censored"] = bool(censored and v > top)
        out["mean_ms"] = float(lat.mean())

    sent = run.sent[~np.isnan(run.sent)]
    ends = np.where(np.isnan(run.ended), run.deadline, run.ended)
    if len(sent):
        first, last_end = float(sent.min()), float(ends.max())
        out["makespan_s"] = last_end - first
        m_sent = run.sent[measured]
        m_end = ends[measured]
        if len(m_sent):
            window = float(m_end.max() - m_sent.min())
            out["throughput_per_s"] = out["completed"] / window if window > 0 else math.nan
        busy = np.zeros(n_actors)
        good = run.ok & (run.rank >= 0) & (run.rank < n_actors)
        np.add.at(busy, run.rank[good], run.took_s[good])
        span = last_end - first
        out["utilisation"] = float(busy.sum() / (n_actors * span)) if span > 0 else math.nan
        out["imbalance"] = float(busy.max() / busy.mean()) if busy.mean() > 0 else math.nan
        out["busy_s_per_actor"] = [round(float(b), 4) for b in busy]
        bound = batch_lower_bound(run.duration_s, slowdowns)
        out["lower_bound_s"] = bound
        out["makespan_over_bound"] = out["makespan_s"] / bound if bound > 0 else math.nan
        # Did the driver keep up with the plan?
        lag = (run.sent - (run.start + run.planned_s))[~np.isnan(run.sent)] * 1e3
        out["driver_lag_p99_ms"] = float(np.percentile(lag, 99))
        out["driver_lag_max_ms"] = float(lag.max())
        spread = float(sent.max() - sent.min())
        planned = float(run.planned_s.max() - run.planned_s.min())
        if len(sent) > 1 and spread > 0:
            out["sent_rate_per_s"] = (len(sent) - 1) / spread
        if len(sent) > 1 and planned > 0:
            out["planned_rate_per_s"] = (len(sent) - 1) / planned
    if killed_rank is not None and "kill" in run.events:
        out.update(fault_metrics(run, killed_rank, measured))
    if run.errors:
        out["errors"] = list(run.errors)
    return out


def fault_metrics(run: Run, killed_rank: int, measured: np.ndarray) -> dict[str, Any]:
    """After an actor is killed: how long until things are normal again, and until it serves.

    `recovery_s`: from the kill to the end of the last call that went wrong because of it (failed,
    unfinished, or slower than twice the p99 of the calls that ended before the kill); 0 when
    none did. `rejoin_s`: from the kill until the restarted actor returned a result for a call
    sent after the kill; when it did not within the run, the time to the end of the run, flagged
    `rejoin_censored` (a lower bound).
    """
    t_kill = run.events["kill"]
    ends = np.where(np.isnan(run.ended), run.deadline, run.ended)
    before = measured & run.ok & (run.ended < t_kill)
    lat = ends - run.sent
    normal = 2 * float(np.percentile(lat[before], 99)) if before.any() else math.inf
    affected = (ends > t_kill) & ~np.isnan(run.sent)
    wrong = affected & (~run.ok | (lat > normal))
    back = run.ok & (run.rank == killed_rank) & (run.sent > t_kill)
    return {
        "recovery_s": float(ends[wrong].max() - t_kill) if wrong.any() else 0.0,
        "rejoin_s": float(run.ended[back].min() - t_kill) if back.any() else run.deadline - t_kill,
        "rejoin_censored": not back.any(),
        "lost_all": int((~run.ok).sum()),
    }


def sample(run: Run, metrics: dict[str, Any], warmup_s: float,
           slow_ms: float = math.nan) -> RunSample:
    """What the bootstrap of `stats` keeps of a run: every measured call in plan order (so that
    contenders that played the same plan are resampled call for call), and the scalars."""
    measured = run.planned_s >= warmup_s
    sent, ended, ok = run.sent[measured], run.ended[measured], run.ok[measured]
    unfinished = np.isnan(ended)
    latency = np.where(unfinished, run.deadline - sent, ended - sent) * 1e3
    latency[~ok & ~unfinished] = np.nan  # failed: no latency
    flags = {"lost_frac": (~ok).astype(float)}
    if not math.isnan(slow_ms):
        flags["slow_frac"] = np.where(np.isnan(latency), np.nan, (latency > slow_ms) * 1.0)
    values = {k: float(metrics[k]) for k, m in METRICS.items()
              if m.kind == "scalar" and isinstance(metrics.get(k), (int, float))}
    return RunSample(latency, unfinished, flags, values)


def summarise(repeats: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, min and max over repeats of every numeric metric."""
    keys = [k for k, v in repeats[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out: dict[str, dict[str, float]] = {}
    for key in keys:
        values = [r[key] for r in repeats if isinstance(r.get(key), (int, float))]
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            out[key] = {"median": math.nan, "min": math.nan, "max": math.nan}
            continue
        out[key] = {"median": float(np.median(finite)), "min": float(min(finite)),
                    "max": float(max(finite))}
    for key in [k for k, v in repeats[0].items() if isinstance(v, bool)]:
        out[key] = {"any": any(bool(r.get(key)) for r in repeats)}  # type: ignore[dict-item]
    return out


def cdf(latency_ms: np.ndarray) -> dict[str, list[float]]:
    """The latency distribution at fixed quantiles (for plots and results.json)."""
    if not len(latency_ms):
        return {"q": [], "ms": []}
    values = np.quantile(latency_ms, CDF_QUANTILES)
    return {"q": [round(float(q), 6) for q in CDF_QUANTILES],
            "ms": [round(float(v), 4) for v in values]}
