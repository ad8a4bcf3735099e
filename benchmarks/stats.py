"""How sure a ratio is: bootstrap intervals over repeats, and the A/A control that sets the noise.

Every ratio the harness reports is "how many times better the contender is than the baseline"
(baseline ÷ contender for a metric where lower is better, contender ÷ baseline otherwise), so
> 1 always favours the contender. Its interval is a paired bootstrap: each resample draws the
repeats with replacement (the same repeats for every contender, since within a repeat they all
played the same plan) and, for a percentile or a fraction, the calls within each drawn repeat.

The A/A control of a scenario is the same comparison between two contenders that run the same
algorithm: actormesh's `random` policy and `random.choice` over the handles. Whatever separates
them is noise (and a few microseconds of actormesh's own per-call work). Its interval, widened to
include 1, is the noise band: a ratio whose interval overlaps it is reported as no difference.
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
    Metric("slow_frac", "calls slower than 10× the mean service time", "", "fraction", True),
    Metric("lost_frac", "calls lost (failed or unfinished)", "", "fraction", True),
    Metric("makespan_s", "makespan", "s", "scalar", True),
    Metric("throughput_per_s", "throughput", "calls/s", "scalar", False),
    Metric("cpu_us_per_call", "driver CPU per call", "µs", "scalar", True),
)}


@dataclasses.dataclass
class RunSample:
    """What the bootstrap needs from one run of one contender."""

    latencies_ms: np.ndarray  # measured calls that finished, then those cut off at the deadline
    finished: int  # how many of `latencies_ms` finished (the rest are lower bounds)
    counts: dict[str, tuple[int, int]]  # fraction metric -> (calls that count, calls)
    values: dict[str, float]  # scalar metric -> value


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


def resample_plan(repeats: int, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """Which repeats each resample draws (resamples × repeats), shared by every contender."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, repeats, size=(resamples, repeats))


def estimate(runs: Sequence[RunSample], metric: Metric, plan: np.ndarray,
             seed: int) -> Estimate | None:
    """`metric` for one contender over its runs (one per repeat), with its bootstrap resamples."""
    rng = np.random.default_rng(seed)
    if metric.kind == "percentile":
        pools = [r.latencies_ms for r in runs]
        if not sum(len(p) for p in pools):
            return None
        everything = np.concatenate(pools)
        value = float(np.percentile(everything, metric.q))
        top = max((float(r.latencies_ms[:r.finished].max()) for r in runs if r.finished),
                  default=-math.inf)
        return Estimate(value, value > top, _resampled_percentiles(pools, plan, metric.q, rng),
                        value)
    if metric.kind == "fraction":
        pairs = [r.counts.get(metric.key) for r in runs]
        if any(p is None for p in pairs):
            return None
        k = np.array([p[0] for p in pairs if p is not None], dtype=float)
        n = np.array([p[1] for p in pairs if p is not None], dtype=float)
        if n.sum() == 0:
            return None
        # Within each drawn repeat, its count is redrawn from its own rate.
        rates = np.divide(k, n, out=np.zeros_like(k), where=n > 0)
        redrawn = rng.binomial(n.astype(np.int64), rates, size=(len(plan), len(n)))
        k_b = np.take_along_axis(redrawn, plan, axis=1).sum(axis=1)
        n_b = n[plan].sum(axis=1)
        # +½ / +1: a contender with no such call still gets a finite, conservative ratio.
        value = (k.sum() + 0.5) / (n.sum() + 1.0)
        return Estimate(float(value), False, (k_b + 0.5) / (n_b + 1.0), float(k.sum() / n.sum()))
    values = np.array([r.values.get(metric.key, math.nan) for r in runs], dtype=float)
    if np.isnan(values).all():
        return None
    value = float(np.nanmedian(values))
    with np.errstate(all="ignore"):
        out = np.nanmedian(values[plan], axis=1)
    return Estimate(value, False, out, value)


def _resampled_percentiles(pools: Sequence[np.ndarray], plan: np.ndarray, q: float,
                           rng: np.random.Generator, chunk: int = 100) -> np.ndarray:
    """The q-th percentile of each resample: the drawn repeats, each with its calls redrawn.

    Vectorised over resamples: every drawn repeat is padded to the longest with +inf, each row
    sorted, and the percentile interpolated among the row's real values (numpy's "linear").
    """
    sizes = np.array([len(p) for p in pools])
    width = int(sizes.max())
    padded = np.full((len(pools), width), np.inf)
    for i, p in enumerate(pools):
        padded[i, :len(p)] = p
    out = np.empty(len(plan))
    for start in range(0, len(plan), chunk):
        picks = plan[start:start + chunk]  # (b, R)
        n = sizes[picks]  # calls in each drawn repeat
        idx = (rng.random((*picks.shape, width)) * n[..., None]).astype(np.int64)
        values = padded[picks[..., None], idx]
        values[np.arange(width) >= n[..., None]] = np.inf  # beyond a repeat's own calls
        rows = np.sort(values.reshape(len(picks), -1), axis=1)
        m = n.sum(axis=1)
        pos = q / 100 * (m - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(m - 1, 0))
        at = np.arange(len(picks))
        frac = pos - lo
        with np.errstate(invalid="ignore"):
            out[start:start + chunk] = np.where(
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
    """"better", "worse" or no difference, against the noise band of the A/A control."""
    if math.isnan(r.lo):
        return "no interval: one repeat"
    lo, hi = noise_band(control)
    if r.hi >= lo and r.lo <= hi:
        return NO_DIFFERENCE
    if r.lo > hi:
        return "better" if r.bound != "≤" else "better (an upper bound)"
    return "worse" if r.bound != "≥" else "worse (a lower bound)"


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


def compare(samples: Mapping[str, Sequence[RunSample]], metrics: Sequence[str], *,
            contenders: Sequence[str], baselines: Sequence[str],
            control: tuple[str, str] | None, seed: int = 0) -> dict[str, Any]:
    """Every contender against the strongest baseline and against each baseline, per metric.

    `samples` holds each contender's runs, repeat by repeat (repeat i of every contender played
    the same plan). `control` is the A/A pair (contender, baseline) that runs one algorithm twice.
    Returns, per metric: each contender's `estimates` (value shown, censored), the `strongest`
    baseline and the `best` contender on the point estimate, the `control` ratio, and `ratios`
    (contender, baseline) for every contender against every baseline.
    """
    repeats = min((len(runs) for runs in samples.values()), default=0)
    out: dict[str, Any] = {}
    if not repeats:
        return out
    plan = resample_plan(repeats, seed)
    for m, key in enumerate(metrics):
        metric = METRICS[key]
        est: dict[str, Estimate] = {}
        for c, (name, runs) in enumerate(samples.items()):
            e = estimate(list(runs)[:repeats], metric, plan, seed + 7919 * (m + 1) + c)
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


def find(comparison: Mapping[str, Any], contender: str, baseline: str | None) -> Ratio | None:
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
    samples = {name: [RunSample(np.empty(0), 0, {}, {metric: v}) for v in runs]
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
