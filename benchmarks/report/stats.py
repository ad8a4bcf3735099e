"""How sure a ratio is: paired bootstrap intervals over repeats, and the A/A control's noise floor.

Every ratio the harness reports is "how many times better the contender is than the baseline"
(baseline ÷ contender for a metric where lower is better, contender ÷ baseline otherwise), so
> 1 always favours the contender. Its interval is a paired bootstrap: within a repeat every
contender played the same plan (the same calls, sent at the same offsets, with the same service
times), so each resample draws the repeats with replacement, the same repeats for every
contender, and, for a percentile or a fraction, the same calls (by their place in the plan)
within each drawn repeat.

The A/A control of a scenario is the SAME contender run twice (the default on a second mesh over
the same actors), taking its turn with the others: whatever separates the two is noise. Its
interval, widened to include 1, is the noise band. A ratio is a difference ("better" or
"worse") when its own interval leaves out 1 AND its value lies outside the noise band; otherwise
it is "no difference (within noise)". So the band's edges are the smallest ratios a scenario can
call in that run.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

RESAMPLES = 1000
LEVEL = 0.95
NO_DIFFERENCE = "no difference (within noise)"


@dataclasses.dataclass(frozen=True)
class Metric:
    """A quantity a scenario is judged on, and how its bootstrap resamples it."""

    key: str
    words: str  # for tables and headlines
    unit: str
    kind: str  # "percentile" (of latencies), "fraction" (of calls), "scalar" (one value per run)
    lower_is_better: bool
    q: float = 99.0  # the percentile, for kind "percentile"


METRICS = {m.key: m for m in (
    Metric("p99_ms", "p99 latency", "ms", "percentile", True),
    Metric("p50_ms", "median latency", "ms", "percentile", True, q=50.0),
    Metric("slow_frac", "calls slower than 10× the mean service time", "", "fraction", True),
    Metric("lost_frac", "calls lost (failed or unfinished)", "", "fraction", True),
    Metric("makespan_s", "makespan", "s", "scalar", True),
    Metric("makespan_over_bound", "makespan ÷ the lower bound", "×", "scalar", True),
    Metric("throughput_per_s", "throughput", "calls/s", "scalar", False),
    Metric("cpu_us_per_call", "driver CPU per call", "µs", "scalar", True),
    Metric("executions_per_call", "executions per call", "", "scalar", True),
    Metric("peak_over_mean", "busiest actor's peak in flight ÷ the mean peak", "", "scalar",
           True),
)}


@dataclasses.dataclass
class RunSample:
    """What the bootstrap needs from one run of one contender, call by call in plan order.

    `latencies_ms` has one entry per measured call (NaN: the call failed, so it has no latency);
    `censored` marks calls with no result by the deadline, counted at it (lower bounds).
    `flags` holds, per fraction metric, 1.0 or 0.0 per call (NaN: the call does not count).
    """

    latencies_ms: np.ndarray
    censored: np.ndarray
    flags: dict[str, np.ndarray]
    values: dict[str, float]  # scalar metric -> value

    @classmethod
    def scalars(cls, values: Mapping[str, float]) -> RunSample:
        """A run measured by scalar metrics only (a makespan, a rate)."""
        return cls(np.empty(0), np.empty(0, dtype=bool), {}, dict(values))


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One contender's statistic on all the data (`value`) and on each bootstrap resample."""

    value: float
    censored: bool  # `value` rests on calls cut off at the deadline: a lower bound
    resamples: np.ndarray
    shown: float  # what a table shows: the plain fraction (no continuity correction)


@dataclasses.dataclass(frozen=True)
class Ratio:
    """How many times better `contender` is than `baseline` on `metric`, with its interval."""

    metric: str
    contender: str
    baseline: str
    value: float
    lo: float
    hi: float
    bound: str = ""  # "≥": a lower bound (the baseline's value is); "≤": an upper bound

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ratio:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


@dataclasses.dataclass(frozen=True)
class Resampling:
    """The draws every contender of one comparison shares, which is what pairs them: the
    repeats of each resample (resamples × repeats) and a uniform number per call slot, turned
    into a call index within the drawn repeat (`calls`)."""

    plan: np.ndarray
    seed: int

    @classmethod
    def new(cls, repeats: int, seed: int, resamples: int = RESAMPLES) -> Resampling:
        rng = np.random.default_rng(seed)
        return cls(rng.integers(0, repeats, size=(resamples, repeats)), seed)

    def chunks(self, width: int, chunk: int = 100) -> Any:
        """(first resample, its drawn repeats, uniforms of shape (b, repeats, width)) in chunks;
        the same for every contender, since the generator restarts from `seed`."""
        rng = np.random.default_rng(self.seed + 1)
        for start in range(0, len(self.plan), chunk):
            picks = self.plan[start:start + chunk]
            yield start, picks, rng.random((*picks.shape, width))


def estimate(runs: Sequence[RunSample], metric: Metric, draws: Resampling,
             width: int) -> Estimate | None:
    """`metric` for one contender over its runs (one per repeat), with its bootstrap resamples.
    `width` is the most calls any contender measured in one run (the draws' width)."""
    if metric.kind == "scalar":
        values = np.array([r.values.get(metric.key, math.nan) for r in runs], dtype=float)
        if np.isnan(values).all():
            return None
        with np.errstate(all="ignore"):
            out = np.nanmedian(values[draws.plan], axis=1)
        value = float(np.nanmedian(values))
        return Estimate(value, False, out, value)
    if metric.kind == "percentile":
        pools = [r.latencies_ms for r in runs]
        everything = np.concatenate(pools) if pools else np.empty(0)
        if np.isnan(everything).all():
            return None
        value = float(np.nanpercentile(everything, metric.q))
        finished = [r.latencies_ms[~r.censored & ~np.isnan(r.latencies_ms)] for r in runs]
        top = max((float(f.max()) for f in finished if len(f)), default=-math.inf)
        return Estimate(value, value > top, _resampled(pools, draws, width, metric.q), value)
    flags = [r.flags.get(metric.key) for r in runs]
    if any(f is None for f in flags):
        return None
    pools = [f for f in flags if f is not None]
    counted = np.concatenate(pools)
    n = int((~np.isnan(counted)).sum())
    if not n:
        return None
    k = float(np.nansum(counted))
    # +½ / +1: a contender with no such call still gets a finite, conservative ratio.
    return Estimate((k + 0.5) / (n + 1.0), False, _resampled(pools, draws, width, None),
                    k / n)


def _resampled(pools: Sequence[np.ndarray], draws: Resampling, width: int,
               q: float | None) -> np.ndarray:
    """Per resample: the drawn repeats, each with its calls redrawn (by place in the plan, as
    every contender redraws them), pooled; then their q-th percentile (numpy's "linear"), or
    for `q=None` their fraction of ones with +½ / +1. NaN marks a call that does not count."""
    sizes = np.array([len(p) for p in pools])
    padded = np.full((len(pools), max(width, 1)), np.nan)
    for i, p in enumerate(pools):
        padded[i, :len(p)] = p
    out = np.empty(len(draws.plan))
    for start, picks, uniforms in draws.chunks(max(width, 1)):
        n = sizes[picks]  # calls in each drawn repeat
        idx = (uniforms * n[..., None]).astype(np.int64)
        values = padded[picks[..., None], idx]
        values[np.arange(uniforms.shape[-1]) >= n[..., None]] = np.nan  # past a run's calls
        rows = values.reshape(len(picks), -1)
        at = np.arange(len(picks))
        if q is None:
            k = np.nansum(rows, axis=1)
            m = (~np.isnan(rows)).sum(axis=1)
            out[start:start + len(picks)] = (k + 0.5) / (m + 1.0)
            continue
        rows = np.sort(rows, axis=1)  # NaN sorts last
        m = (~np.isnan(rows)).sum(axis=1)
        pos = q / 100 * np.maximum(m - 1, 0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(m - 1, 0))
        frac = pos - lo
        with np.errstate(invalid="ignore"):
            out[start:start + len(picks)] = np.where(
                m > 0, rows[at, lo] + frac * (rows[at, hi] - rows[at, lo]), math.nan)
    return out


def ratio(metric: Metric, contender: str, a: Estimate, baseline: str, b: Estimate) -> Ratio:
    """How many times better `a` (the contender) is than `b` (the baseline)."""
    with np.errstate(all="ignore"):
        if metric.lower_is_better:
            value = b.value / a.value if a.value > 0 else math.inf
            boots = b.resamples / a.resamples
        else:
            value = a.value / b.value if b.value > 0 else math.inf
            boots = a.resamples / b.resamples
    boots = boots[~np.isnan(boots)]
    alpha = (1.0 - LEVEL) / 2
    lo, hi = ((float(np.quantile(boots, alpha)), float(np.quantile(boots, 1 - alpha)))
              if len(boots) else (math.nan, math.nan))
    # Only a latency percentile can be censored; a censored baseline makes the ratio bigger.
    bound = ""
    if b.censored and not a.censored:
        bound = "≥"
    elif a.censored and not b.censored:
        bound = "≤"
    elif a.censored and b.censored:
        bound = "?"
    return Ratio(metric.key, contender, baseline, value, lo, hi, bound)


def noise_band(control: Ratio | None) -> tuple[float, float]:
    """The A/A control's interval, widened to include 1 (no control: just 1)."""
    if control is None or math.isnan(control.lo):
        return 1.0, 1.0
    return min(control.lo, 1.0), max(control.hi, 1.0)


def verdict(r: Ratio, control: Ratio | None) -> str:
    """"better" or "worse" when `r`'s interval leaves out 1 and its value lies outside the
    noise band of the A/A control; else no difference."""
    if math.isnan(r.lo):
        return "no interval: one repeat"
    lo, hi = noise_band(control)
    if r.lo > 1.0 and r.value > hi:
        return "better" if r.bound != "≤" else "better (an upper bound)"
    if r.hi < 1.0 and r.value < lo:
        return "worse" if r.bound != "≥" else "worse (a lower bound)"
    return NO_DIFFERENCE


def fmt(v: float) -> str:
    """A ratio with three significant digits (two from 10 on)."""
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞"
    digits = 2 if abs(v) >= 10 else 3
    mag = math.floor(math.log10(abs(v))) if v else 0
    return f"{v:,.{max(0, digits - 1 - mag)}f}"


def interval_text(r: Ratio | None) -> str:
    """`1.62× [1.31–2.05]`; a `≥` marks a lower bound."""
    if r is None or math.isnan(r.value):
        return "–"
    bound = r.bound if r.bound in ("≥", "≤") else ""
    if math.isnan(r.lo):
        return f"{bound}{fmt(r.value)}× [no interval]"
    return f"{bound}{fmt(r.value)}× [{fmt(r.lo)}–{fmt(r.hi)}]"


def half_width(r: Ratio | None) -> float:
    """How far the interval reaches from 1 at most, as a fraction (0.12: within ±12%)."""
    if r is None or math.isnan(r.lo):
        return math.nan
    return max(1.0 - r.lo, r.hi - 1.0, 0.0)


def compare(samples: Mapping[str, Sequence[RunSample]], metrics: Sequence[str], *,
            contenders: Sequence[str], baselines: Sequence[str],
            control: tuple[str, str] | None, seed: int = 0) -> dict[str, Any]:
    """Every contender against the strongest baseline and against each baseline, per metric.

    `samples` holds each contender's runs, repeat by repeat (repeat i of every contender played
    the same plan). `control` is the A/A pair: one contender and its twin. Returns, per metric:
    each contender's `estimates` (value shown, censored), the `strongest` baseline and the
    `best` contender on the point estimate, the `control` ratio, and `ratios` (contender,
    baseline) for every contender against every baseline.
    """
    repeats = min((len(runs) for runs in samples.values()), default=0)
    out: dict[str, Any] = {}
    if not repeats:
        return out
    runs_of = {name: list(runs)[:repeats] for name, runs in samples.items()}
    width = max((len(r.latencies_ms) for runs in runs_of.values() for r in runs), default=0)
    for m, key in enumerate(metrics):
        metric = METRICS[key]
        draws = Resampling.new(repeats, seed + 7919 * (m + 1))
        est: dict[str, Estimate] = {}
        for name, runs in runs_of.items():
            e = estimate(runs, metric, draws, width)
            if e is not None:
                est[name] = e
        if not est:
            continue
        sign = -1.0 if metric.lower_is_better else 1.0
        goodness = {n: sign * e.value for n, e in est.items()}
        present = [b for b in baselines if b in est]
        mine = [c for c in contenders if c in est]
        strongest = max(present, key=goodness.__getitem__) if present else None
        ratios = [_between(metric, est, c, b, repeats).as_dict() for c in mine for b in present]
        ctl = None
        if control and control[0] in est and control[1] in est:
            ctl = _between(metric, est, *control, repeats)
        out[key] = {
            "estimates": {n: {"value": e.shown, "censored": e.censored} for n, e in est.items()},
            "strongest": strongest,
            "best": max(mine, key=goodness.__getitem__) if mine else None,
            "control": ctl.as_dict() if ctl else None,
            "ratios": ratios,
        }
    return out


def _between(metric: Metric, est: Mapping[str, Estimate], a: str, b: str,
             repeats: int) -> Ratio:
    r = ratio(metric, a, est[a], b, est[b])
    if repeats > 1 or metric.kind != "scalar":
        return r
    return dataclasses.replace(r, lo=math.nan, hi=math.nan)  # one value: nothing to resample


def find(comparison: Mapping[str, Any], contender: str | None,
         baseline: str | None) -> Ratio | None:
    """The ratio of `contender` against `baseline` in one metric's block of `compare`."""
    for r in comparison.get("ratios", []):
        if r["contender"] == contender and r["baseline"] == baseline:
            return Ratio.from_dict(r)
    return None


def control_of(comparison: Mapping[str, Any]) -> Ratio | None:
    c = comparison.get("control")
    return Ratio.from_dict(c) if c else None


def compare_scalars(values: Mapping[str, Sequence[float]], metric: str, *,
                    contenders: Sequence[str], baselines: Sequence[str],
                    control: tuple[str, str] | None) -> dict[str, Any]:
    """`compare` for one scalar metric given as one value per repeat (side scenarios)."""
    samples = {name: [RunSample.scalars({metric: v}) for v in runs]
               for name, runs in values.items()}
    block: dict[str, Any] = compare(samples, [metric], contenders=contenders,
                                    baselines=baselines, control=control)[metric]
    return block


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of per-repeat values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired(a: Sequence[float], b: Sequence[float], higher_is_better: bool) -> dict[str, float]:
    """How many times better a is than b, repeat by repeat: median and range."""
    return spread([x / y if higher_is_better else y / x for x, y in zip(a, b)])
