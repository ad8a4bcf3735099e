"""The sizes each mode of `python -m benchmarks` runs at: `--quick` (what `make bench` runs),
`--full` (a bigger machine or an existing cluster) and `--smoke` (the test suite).

Repeats are what the intervals resample, so `quick` spends its minutes on many short repeats
rather than a few long ones: on two shared cores that is what narrows the A/A interval.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
    mode: str
    # -- the balancing scenarios (benchmarks/scenarios/balancing.py) ----------------------------
    actors: int = 8  # shared by every contender
    actor_cpus: float = 0.1
    repeats: int = 10  # repeats per scenario
    # The default, its twin and the baselines play every repeat, the library's other policies
    # every n-th (in turns, so each repeat holds some); 1: every contender every repeat.
    others_every: int = 2
    warmup_s: float = 0.1  # calls planned before this are sent but not measured
    measure_s: float = 0.40
    mean_s: float = 0.010  # mean service time of the latency scenarios
    drain_s: float = 0.5  # wait after the last send; calls still out count at it (lower bounds)
    batch_drain_s: float = 20.0  # the same for batches and tiny calls, which must all finish
    batch_calls: int = 96
    batch_mean_s: float = 0.010
    batch_repeats: int = 6
    # Long enough that a turn's start (the first calls go alone, before a backlog forms) does not
    # decide it: at 800 calls two turns of the same mesh differed up to 2x, at 2,000 far less,
    # but a turn still lasted ~70 ms and one mesh's turns spread over 20-41k calls/s (A/A 0.916x
    # [0.839-1.04] at fb9c723); at 6,000 they spread over 32-42k and the A/A read 1.01x
    # [0.967-1.05] (`--only batch_straggler tiny_noop`, 288 s against 126 s).
    tiny_calls: int = 6000
    # tiny_noop, the choose-against-raw headline; tiny_100us runs `repeats`. 16 rather than 8
    # narrowed the A/A interval ([0.874-1.09] at 8dfc068 with 8); with turns of 6,000 calls it
    # read [0.883-1.07] at 5eb995e with 16, and with 24 [0.947-1.13], [0.877-1.00] (a turn's
    # rate strays ~12% whatever the mesh: 2 cores shared with the actors and Ray). So 48, the
    # slow baselines and the other policies playing every 2nd of them (`baselines_every`): as
    # many of their turns as before, at the cost of 2x24 fast turns of the default and its twin
    # (and of the fresh mesh, a headline row's reference), the A/A's interval ~1/sqrt(2) as wide.
    tiny_repeats: int = 48
    fault_measure_s: float = 1.5  # with its drain, long enough for Ray to restart the actor
    fault_drain_s: float = 1.5
    fault_repeats: int = 2  # each kills an actor per contender: a restart costs ~0.6 s
    calibration_rounds: int = 2
    # Left out unless named by --only (quick: the time goes to repeats instead; uniform load at
    # 50%, a second heavy tail, CPU-bound tiny calls and a batch on equal actors say least about
    # the balancer).
    skip: tuple[str, ...] = ("uniform50", "pareto", "tiny_100us", "batch")
    # -- the call-path scenarios (benchmarks/scenarios/call_path.py) ---------------------------
    call_actors: int = 4
    call_repeats: int = 10
    map_items: int = 1500
    burst_calls: int = 2000
    sequential_calls: int = 300
    # -- prepared scenarios (benchmarks/scenarios/hedged.py, drivers.py) -----------------------
    hedge_calls: int = 160
    hedge_repeats: int = 12  # 8 gave an A/A interval of [0.908-1.22] at 8dfc068
    drivers_measure_s: float = 2.0
    drivers_repeats: int = 4
    # -- calls under kills (benchmarks/scenarios/kills.py) -------------------------------------
    kill_calls: int = 3000
    kill_actors: int = 6
    kill_every_s: float = 0.2  # one actor killed this often while calls are out
    kill_repeats: int = 2  # each turn kills an actor every kill_every_s: restarts cost seconds
    # -- without Ray (benchmarks/without_ray/) ---------------------------------------------
    sim_actors: int = 4096
    sim_calls: int = 100_000
    sim_ref_actors: int = 64
    sim_ref_calls: int = 20_000
    dc_sizes: tuple[int, ...] = (16, 256, 4096)
    dc_decisions: int = 50_000
    dc_budget_s: float = 0.1
    # The simulation against queueing theory: loads, and per policy the simulated actors and
    # the measured span in mean service times (after the warm-up).
    theory_loads: tuple[float, ...] = (0.7, 0.9, 0.95)
    theory_random: tuple[int, float] = (16, 6000.0)
    theory_pow2: tuple[int, float] = (512, 200.0)


QUICK = Config("quick")
FULL = Config(
    "full", actors=16, repeats=12, others_every=1, warmup_s=1.0, measure_s=4.0, drain_s=10.0,
    fault_drain_s=10.0, batch_drain_s=60.0,
    batch_calls=2000, batch_repeats=10, tiny_calls=10_000, tiny_repeats=20, fault_measure_s=8.0,
    fault_repeats=5, skip=(), call_repeats=15, map_items=20_000, burst_calls=8000,
    sequential_calls=1000, hedge_repeats=12, drivers_measure_s=10.0, drivers_repeats=8,
    kill_calls=20_000, kill_repeats=6,
    sim_calls=1_000_000, sim_ref_actors=256, sim_ref_calls=100_000,
    dc_sizes=(16, 64, 256, 1024, 4096), dc_decisions=1_000_000, dc_budget_s=1.0,
    theory_random=(64, 20000.0), theory_pow2=(4096, 400.0),
)
# The smoke run asserts what the harness writes, not how fast anything was: one repeat where a
# turn costs seconds (a straggler's turns, a kill's restart, drivers, hedging), two where a
# turn is cheap (tiny calls, the call path), so the report still computes intervals.
SMOKE = Config(
    "smoke", actors=2, repeats=1, warmup_s=0.05, measure_s=0.25, drain_s=1.0, fault_drain_s=0.6,
    batch_drain_s=5.0,
    batch_calls=20, batch_repeats=2, tiny_calls=50, tiny_repeats=2, fault_measure_s=0.6,
    fault_repeats=1, calibration_rounds=1, call_actors=2, call_repeats=2, map_items=40,
    burst_calls=40, sequential_calls=20, hedge_calls=24, hedge_repeats=1,
    drivers_measure_s=0.3, drivers_repeats=1, kill_calls=200, kill_actors=3, kill_every_s=0.1,
    kill_repeats=1,
    sim_actors=32, sim_calls=2000, sim_ref_actors=8,
    sim_ref_calls=500, dc_sizes=(16, 64), dc_decisions=2000, dc_budget_s=0.02,
    theory_random=(8, 200.0), theory_pow2=(64, 20.0),
)
MODES = {c.mode: c for c in (QUICK, FULL, SMOKE)}
