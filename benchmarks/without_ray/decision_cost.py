"""What one balancing decision costs, per policy and mesh size, four ways:

- native: a C++ loop over the scheduler (`_native.measure_decision_ns`), no Python at all;
- via Python: the same loop written in Python, calling `_native.Scheduler.submit/complete`
  through nanobind (what `choose` pays);
- pure Python: that Python loop over a pure-Python scheduler running the same algorithm:
  for least_loaded, pull and sed the indexed heap of benchmarks/reference_heap.py (a heap
  against the native heap), for the others benchmarks/reference.py (already O(1) per decision);
- scan (least_loaded, pull, sed only): the readable reference, which scans; an extra line, not
  the comparison.

Each pure-Python scheduler is first checked to make the native core's decisions on the same loop.

A decision is one `submit` plus the `complete` of the oldest call in flight — every call costs
both — with num_actors // 2 calls kept in flight so that loads are those of a busy mesh. Times
are CPU time of the measuring thread (other processes on a shared machine inflate them less than
wall time), in nanoseconds per decision, the best of `repeats` runs. The two Python columns include the driving loop itself, reported
alone as `loop_ns` (the same loop over no-op methods). `external` calls a Python least-loaded
picker, so it has no native-only figure.

Run: python -m benchmarks.without_ray.decision_cost [--decisions N] [--sizes 16 256 4096] [--policies ...]
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from actormesh import _native
from benchmarks import reference, reference_heap, without_ray

POLICIES = (*without_ray.POLICIES, "external")
SIZES = (16, 256, 4096)


class _Scheduler(Protocol):
    def submit(self, group: int, affinity: int | None = None) -> Any: ...
    def complete(self, actor: int, started_s: float, ended_s: float, failed: int) -> list[Any]: ...


def least_loaded_picker(
    ranks: list[int], in_flight: list[int], latency: list[float], key: int | None,
    call: object = None,
) -> int:
    """The `external` policy's picker: least loaded. The native core also passes the call being
    placed; the reference does not."""
    return in_flight.index(min(in_flight))


class _NoOpScheduler:
    """Costs nothing but the calls, to measure the driving loop alone."""

    class _Decision:
        actor = 0

    _decision = _Decision()

    def submit(self, group: int, affinity: int | None = None) -> _NoOpScheduler._Decision:
        return self._decision

    def complete(self, actor: int, started_s: float, ended_s: float, failed: int) -> list[Any]:
        return []


def _loop_ns(scheduler: _Scheduler, num_actors: int, decisions: int) -> float:
    """The Python twin of the loop in csrc/bench.hpp."""
    running = deque(scheduler.submit(0).actor for _ in range(num_actors // 2))
    submit, complete = scheduler.submit, scheduler.complete
    clock = 0.0
    start = time.thread_time_ns()
    for _ in range(decisions):
        running.append(submit(0).actor)
        clock += 1e-6
        complete(running.popleft(), clock - 1e-5, clock, 0)
    return (time.thread_time_ns() - start) / decisions


def _decisions(scheduler: _Scheduler, num_actors: int, decisions: int) -> list[int]:
    """The actor of every submit in the decision-cost loop (no timing): to compare twins."""
    running = deque(scheduler.submit(0).actor for _ in range(num_actors // 2))
    chosen = list(running)
    clock = 0.0
    for _ in range(decisions):
        actor = scheduler.submit(0).actor
        chosen.append(actor)
        running.append(actor)
        clock += 1e-6
        complete = scheduler.complete(running.popleft(), clock - 1e-5, clock, 0)
        chosen += [d.actor for d in complete]
    return chosen


def _budgeted_ns(
    make: Callable[[], _Scheduler], num_actors: int, decisions: int, budget_s: float, repeats: int
) -> float:
    """At most `decisions`, fewer when a short probe says they would take longer than budget_s."""
    probe = _loop_ns(make(), num_actors, min(decisions, 200))
    count = max(200, min(decisions, int(budget_s * 1e9 / probe)))
    return min(_loop_ns(make(), num_actors, count) for _ in range(repeats))


def measure(
    policies: Sequence[str] = POLICIES,
    sizes: Sequence[int] = SIZES,
    decisions: int = 200_000,
    *,
    seed: int = 0,
    budget_s: float = 0.2,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """One row per policy and size, in nanoseconds per decision: native_ns (None for external),
    via_python_ns, python_ns (the same algorithm in pure Python, `twin` names it), scan_ns (None
    where the twin is the reference itself) and loop_ns; `same_decisions` says whether the twin
    chose the native core's actors over a short run of the loop."""
    rows: list[dict[str, Any]] = []
    for num_actors in sizes:
        loop_ns = min(_loop_ns(_NoOpScheduler(), num_actors, decisions) for _ in range(repeats))
        for policy in policies:
            picker = least_loaded_picker if policy == "external" else None
            native_ns: float | None = None
            if picker is None:
                native_ns = min(
                    _native.measure_decision_ns(policy, num_actors, decisions, seed)
                    for _ in range(repeats)
                )
            heap = policy in reference_heap.POLICIES
            makers: dict[str, Callable[[], _Scheduler]] = {
                "via_python": partial(_native.Scheduler, num_actors, policy, seed=seed,
                                      picker=picker),
                "python": (partial(reference_heap.Scheduler, num_actors, policy, seed=seed)
                           if heap else partial(reference.Scheduler, num_actors, policy,
                                                seed=seed, picker=picker)),
            }
            if heap:
                makers["scan"] = partial(reference.Scheduler, num_actors, policy, seed=seed)
            check = min(decisions, 2000)
            same = (_decisions(makers["python"](), num_actors, check)
                    == _decisions(makers["via_python"](), num_actors, check))
            # Every Python-driven measurement on the same budget.
            ns = {name: _budgeted_ns(make, num_actors, decisions, budget_s, repeats)
                  for name, make in makers.items()}
            rows.append(
                {
                    "policy": policy,
                    "num_actors": num_actors,
                    "native_ns": native_ns,
                    "via_python_ns": ns["via_python"],
                    "python_ns": ns["python"],
                    "twin": "heap" if heap else "reference",
                    "scan_ns": ns.get("scan"),
                    "same_decisions": same,
                    "loop_ns": loop_ns,
                }
            )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    header = (f"{'policy':<13}{'N':>6}{'native':>10}{'via Python':>12}{'pure Python':>13}"
              f"{'(twin)':>11}{'scan':>10}{'loop':>8}{'py / via':>10}")
    lines = [header, "-" * len(header)]
    for row in rows:
        native = "-" if row["native_ns"] is None else f"{row['native_ns']:.0f}"
        scan = "-" if row["scan_ns"] is None else f"{row['scan_ns']:.0f}"
        twin = row["twin"] + ("" if row["same_decisions"] else "!")
        lines.append(
            f"{row['policy']:<13}{row['num_actors']:>6}{native:>10}{row['via_python_ns']:>12.0f}"
            f"{row['python_ns']:>13.0f}{twin:>11}{scan:>10}{row['loop_ns']:>8.0f}"
            f"{row['python_ns'] / row['via_python_ns']:>9.1f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument(
        "--budget-s", type=float, default=0.2, help="time cap per Python measurement"
    )
    parser.add_argument("--repeats", type=int, default=3, help="report the best of this many runs")
    args = parser.parse_args(argv)
    rows = []
    for n in args.sizes:  # one size at a time, so that progress shows
        print(f"measuring N={n} ...", flush=True)
        rows += measure(args.policies, [n], args.decisions, budget_s=args.budget_s,
                        repeats=args.repeats)
    print(
        "ns per decision (submit + complete), thread CPU time; pure Python = the same algorithm "
        "(twin: heap or reference; ! = not the native decisions); scan = the readable reference; "
        "loop = the Python driving loop alone"
    )
    print(format_table(rows))


if __name__ == "__main__":
    main()
