"""How sure a ratio is: paired intervals over repeats, and the A/A control's noise floor.

Every ratio the harness reports is "how many times better the contender is than the baseline"
(baseline ÷ contender for a metric where lower is better, contender ÷ baseline otherwise), so
> 1 always favours the contender. Within a repeat every contender played the same plan (the
same calls, sent at the same offsets, with the same service times), so ratios are paired by
repeat. Each metric is taken per repeat (a percentile of that run's calls, the fraction of its
calls that were slow or lost, a makespan, a rate), and the ratio is the 20%-trimmed mean of the
per-repeat log ratios, with a 95% bootstrap interval over repeats. A repeat the machine stalled
in (a shared two-core machine does) moves one per-repeat ratio, which the trimming drops,
instead of the tail of every pooled call. A fraction carries +½ / +1 in a ratio, so that a run
with none of the counted calls still gives a finite, conservative ratio.

A contender that plays only some repeats (see `benchmarks.harness.runner`) is compared on the
repeats it shares with the other.

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
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.stats

RESAMPLES = 1000
LEVEL = 0.95
NO_DIFFERENCE = "no difference (within noise)"


@dataclasses.dataclass(frozen=True)
class Metric:
    """A quantity a scenario is judged on, and how one run gives its value (`kind`)."""

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
    """What the statistics need from one run of one contender, call by call in plan order.

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

    def statistic(self, metric: Metric, corrected: bool = False) -> tuple[float, bool]:
        """This run's value of `metric`, and whether it is a lower bound (a percentile reaching
        past the slowest call that finished). `corrected`: a fraction with +½ / +1."""
        if metric.kind == "scalar":
            return self.values.get(metric.key, math.nan), False
        if metric.kind == "fraction":
            flags = self.flags.get(metric.key)
            n = 0 if flags is None else int((~np.isnan(flags)).sum())
            if flags is None or (not n and not corrected):
                return math.nan, False
            k = float(np.nansum(flags))
            return ((k + 0.5) / (n + 1.0) if corrected else k / n), False
        lat = self.latencies_ms
        if not len(lat) or np.isnan(lat).all():
            return math.nan, False
        value = float(np.nanpercentile(lat, metric.q))
        finished = lat[~self.censored & ~np.isnan(lat)]
        return value, bool(self.censored.any() and (not len(finished)
                                                     or value > float(finished.max())))


Runs = Sequence["RunSample | None"]  # one entry per repeat; None: the contender sat it out


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One contender's figure on a metric: the median over the repeats it played, and whether
    it rests on calls cut off at the deadline."""

    value: float
    censored: bool


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


TRIM = 0.2  # the share of per-repeat ratios dropped at each end


def estimate(runs: Runs, metric: Metric) -> Estimate | None:
    """`metric` for one contender over the repeats it played."""
    played = [r for r in runs if r is not None]
    if metric.kind == "fraction" and any(metric.key not in r.flags for r in played):
        return None
    stats = [r.statistic(metric) for r in played]
    values = np.array([v for v, _ in stats], dtype=float)
    if not len(values) or np.isnan(values).all():
        return None
    return Estimate(float(np.nanmedian(values)), any(c for _, c in stats))


def ratio(metric: Metric, contender: str, a: Runs, baseline: str, b: Runs,
          seed: int) -> Ratio | None:
    """How many times better `a` (the contender's runs) is than `b` (the baseline's), on the
    repeats both played; None when they share none."""
    both = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if not both:
        return None
    if metric.kind == "fraction" and any(metric.key not in r.flags for pair in both
                                         for r in pair):
        return None
    rng = np.random.default_rng(seed)
    sa = [x.statistic(metric, corrected=True) for x, _ in both]
    sb = [y.statistic(metric, corrected=True) for _, y in both]
    with np.errstate(all="ignore"):
        logs = np.log(np.array([v for v, _ in sb]) / np.array([v for v, _ in sa]))
    if not metric.lower_is_better:
        logs = -logs
    logs = logs[np.isfinite(logs)]
    if not len(logs):
        return None
    value = math.exp(float(scipy.stats.trim_mean(logs, TRIM)))
    lo = hi = math.nan
    if len(logs) > 1:
        with warnings.catch_warnings():  # all repeats equal: a degenerate but valid interval
            warnings.simplefilter("ignore", scipy.stats.DegenerateDataWarning)
            interval = scipy.stats.bootstrap(
                (logs,), _trimmed_mean, n_resamples=RESAMPLES, confidence_level=LEVEL,
                method="percentile", random_state=rng, vectorized=True).confidence_interval
        lo, hi = math.exp(float(interval.low)), math.exp(float(interval.high))
    return Ratio(metric.key, contender, baseline, value, lo, hi,
                 _bound(any(c for _, c in sa), any(c for _, c in sb)))


def _trimmed_mean(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The mean after dropping `TRIM` of the values at each end, along `axis`."""
    result: np.ndarray = scipy.stats.trim_mean(values, TRIM, axis=axis)
    return result


def _bound(contender_censored: bool, baseline_censored: bool) -> str:
    """A censored baseline makes the ratio a lower bound, a censored contender an upper one."""
    if baseline_censored and not contender_censored:
        return "≥"
    if contender_censored and not baseline_censored:
        return "≤"
    return "?" if contender_censored else ""


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


def compare(samples: Mapping[str, Runs], metrics: Sequence[str], *,
            contenders: Sequence[str], baselines: Sequence[str],
            control: tuple[str, str] | None, seed: int = 0,
            pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Every contender against every baseline, per metric, and each (contender, reference) of
    `pairs` (a reference that is no baseline: the default against a mesh made anew).

    `samples` holds each contender's runs, repeat by repeat (repeat i of every contender played
    the same plan; None where a contender sat a repeat out). `control` is the A/A pair: one
    contender and its twin. Returns, per metric: each contender's `estimates` (value shown,
    censored), the `strongest` baseline and the `best` contender on the point estimate, the
    `control` ratio, and `ratios` (contender, baseline) for every contender against every
    baseline.
    """
    out: dict[str, Any] = {}
    for m, key in enumerate(metrics):
        metric = METRICS[key]
        est = {name: e for name, runs in samples.items()
               if (e := estimate(runs, metric)) is not None}
        if not est:
            continue
        sign = -1.0 if metric.lower_is_better else 1.0
        goodness = {n: sign * e.value for n, e in est.items()}
        present = [b for b in baselines if b in est]
        mine = [c for c in contenders if c in est]
        pair_seed = seed + 7919 * (m + 1)
        wanted = [(c, b) for c in mine for b in present]
        wanted += [(c, b) for c, b in pairs if c in est and b in est and (c, b) not in wanted]
        ratios = [r.as_dict() for c, b in wanted
                  if (r := ratio(metric, c, samples[c], b, samples[b], pair_seed)) is not None]
        ctl = (ratio(metric, control[0], samples[control[0]], control[1], samples[control[1]],
                     pair_seed)
               if control and control[0] in est and control[1] in est else None)
        out[key] = {
            "estimates": {n: {"value": e.value, "censored": e.censored} for n, e in est.items()},
            "strongest": max(present, key=goodness.__getitem__) if present else None,
            "best": max(mine, key=goodness.__getitem__) if mine else None,
            "control": ctl.as_dict() if ctl else None,
            "ratios": ratios,
        }
    return out


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
