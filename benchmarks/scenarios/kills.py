"""Calls under kills: thousands of small calls on actors that are killed again and again.

`Config.kill_calls` calls of 1-5 ms (drawn per repeat, the same for every contender) sent at
once to `Config.kill_actors` actors made with `max_restarts=-1`; from the first send until the
last call has ended, one actor is killed every `Config.kill_every_s` (`ray.kill`, the actor
restarts), in an order drawn per repeat, among those alive while at least half are (`Killer`). Each call records its token in a counter actor that is
never killed just before it returns (`KillWorker.work`), so executions are counted outside the
actors that die. Measured per turn:

- calls sent, returned (their own value), failed (and how many of those were an actor's death),
  unfinished (never sent or never ended: only a pool that lost every actor leaves any; a call
  that hangs is an error, not a figure);
- finished but lost: calls that failed although they had finished in their actor (recorded by
  the counter): the contract of DESIGN.md "Batching is invisible" says 0, whatever rode with
  them; with the longest time from such a call's end to the kill of its actor (negative: it
  ended after the kill was sent, in the milliseconds before the kill reached the process, a
  window every Ray call has: a lone call's reply is lost the same way);
- run twice: calls recorded more than once (0 without retries, and 0 with the library's);
- on killed actors: the calls in flight on each actor when it was killed, summed over the kills
  (the calls a kill can cost), and the mesh's calls in flight once every call has ended (0).

Contenders take turns within each repeat: the default mesh (`am.ActorMesh(..., max_restarts=-1)`,
coalescing on, every call through `choose`) and its A/A twin (the default on a second mesh
over the same actors, `from_actors`), the same with `coalesce=1` (every call its own Ray task),
the default with `options(retries=2)`; the baselines users have, over the same actors: raw
`.remote()` in turn, the same with Ray's own `max_task_retries=2` (like for like with
`retries=2`), and `ray.util.ActorPool`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
from ray import cloudpickle
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
)
from ray.util import ActorPool as RayPool

import actormesh as am
from benchmarks.config import Config
from benchmarks.harness import section, trials
from benchmarks.harness.context import Context
from benchmarks.report import stats

# Actor processes may not have this repository on their path (an existing cluster, pytest's own
# runtime_env): ship this module's code with the actor classes instead of importing it by name.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SERVICE_S = (0.001, 0.005)  # each call sleeps a uniform draw from this range
RETRIES = 2
TIMEOUT_S = 300.0  # no turn waits longer for its calls: a hang is an error, not a figure
READY_TIMEOUT_S = 60.0  # for every actor to be back (and seen back) before a turn
WARMUP_CALLS_PER_ACTOR = 20  # the untimed turn, without kills: what the mesh learns of `work`

DEFAULT, TWIN = "default", "default (A/A)"
ALONE, RETRY = "coalesce=1", f"default, retries={RETRIES}"
RAW, RAW_RETRY, POOL = "raw round robin", f"raw round robin, max_task_retries={RETRIES}", \
    "ray.util.ActorPool"


class KillWorker:
    """A synchronous actor whose calls sleep a few milliseconds, then record their end."""

    def __init__(self) -> None:
        self.rank = am.current_rank().rank

    @am.method
    def work(self, token: int, duration_s: float, log: str) -> int:
        """Sleep `duration_s`, append `token rank time` to the file `log`, return `token`.

        The line is in the kernel once `os.write` returns, so it outlives this process however
        it dies: executions are counted outside the actors that get killed, with no round trip
        between the record and the return."""
        time.sleep(duration_s)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{token} {self.rank} {time.time()!r}\n".encode())
        finally:
            os.close(fd)
        return token

    @am.method
    def ping(self) -> int:
        return self.rank


@dataclasses.dataclass
class Killable:
    """The actors of the scenario, made by the default's mesh on the driver's node (their
    records are files there); its twin and the mesh with `coalesce=1` over the same actors
    (`from_actors`: the same Ray calls, a scheduler of their own), which the baselines call
    too; and the folder of the records, a file per turn."""

    mesh: am.ActorMesh[KillWorker]
    twin: am.ActorMesh[KillWorker]
    alone: am.ActorMesh[KillWorker]
    folder: str
    turns: int = 0

    @classmethod
    def start(cls, actors: int) -> Killable:
        here = {f"node:{ray.util.get_node_ip_address()}": 0.001}
        mesh = am.ActorMesh(KillWorker, shape=actors, num_cpus=0.1, resources=here,
                            max_restarts=-1)
        folder = tempfile.mkdtemp(prefix="actormesh-kills-",
                                  dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            mesh.wait_ready(timeout=READY_TIMEOUT_S)
        except BaseException:
            mesh.shutdown()
            shutil.rmtree(folder)
            raise
        return cls(mesh, am.ActorMesh.from_actors(mesh.actors),
                   am.ActorMesh.from_actors(mesh.actors, coalesce=1), folder)

    @property
    def meshes(self) -> tuple[am.ActorMesh[KillWorker], ...]:
        return self.mesh, self.twin, self.alone

    def ready(self) -> None:
        """Wait until every actor answers and every mesh routes to all of its actors again."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        for handle in self.mesh.actors:
            while True:
                try:
                    ray.get(handle.ping.remote(), timeout=max(0.1, deadline - time.monotonic()))
                    break
                except ActorUnavailableError:  # restarting: ask again
                    _pause(deadline, self.mesh)
        for m in self.meshes:
            while not all(m.load().alive):
                _pause(deadline, m)

    def new_log(self) -> str:
        """The file the calls of the next turn record their ends in."""
        self.turns += 1
        return os.path.join(self.folder, f"turn-{self.turns}")

    def shutdown(self) -> None:
        for m in self.meshes[::-1]:  # the owner last: it kills the actors
            m.shutdown()
        shutil.rmtree(self.folder, ignore_errors=True)


def recorded(log: str) -> list[tuple[int, int, float]]:
    """Every call recorded in `log`: (token, rank, `time.time()` of its end)."""
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [(int(t), int(r), float(at)) for t, r, at in (line.split() for line in f)]


def _pause(deadline: float, mesh: am.ActorMesh[Any]) -> None:
    """A short pause while an actor of `mesh` restarts (Ray offers nothing to wait on), or
    `TimeoutError` after `deadline`."""
    if time.monotonic() > deadline:
        raise TimeoutError(f"{mesh!r}: actors not back after {READY_TIMEOUT_S} s")
    time.sleep(0.01)


Outcome = tuple[bool, Any]  # (True, value) or (False, the call's error); None: never ended


class Sender:
    """One contender: sends every call at once to its actors (`handles`, in rank order), tells
    how many calls each actor holds, and returns each call's outcome (None: never sent or never
    ended)."""

    handles: list[Any]

    def in_flight(self, rank: int) -> int:
        raise NotImplementedError

    def run(self, tokens: Sequence[int], durations: Sequence[float], log: str,
            deadline: float) -> list[Outcome | None]:
        raise NotImplementedError

    def load_after(self) -> float:
        """Calls the library still counts in flight once every call has ended (NaN: no
        library)."""
        return float("nan")

    def state(self) -> str:
        """What the library knows of the actors, for the error that reports a hang."""
        return ""


class MeshSender(Sender):
    """`choose` for every call, then each future read."""

    def __init__(self, mesh: am.ActorMesh[KillWorker], retries: int = 0) -> None:
        self.mesh = mesh
        self.handles = list(mesh.actors)
        self.method = mesh.methods.work.options(retries=retries) if retries else mesh.methods.work

    def in_flight(self, rank: int) -> int:
        return int(self.mesh.load()[rank])

    def run(self, tokens: Sequence[int], durations: Sequence[float], log: str,
            deadline: float) -> list[Outcome | None]:
        futures = [self.method.choose(t, d, log) for t, d in zip(tokens, durations)]
        out: list[Outcome | None] = []
        for future in futures:
            try:
                out.append((True, future.get(timeout=max(0.0, deadline - time.monotonic()))))
            except am.MeshTimeoutError as err:  # the call's own timeout: an outcome
                out.append((False, err))
            except TimeoutError:
                out.append(None)
            except Exception as err:  # the call's own error, reported as an outcome
                out.append((False, err))
        return out

    def load_after(self) -> float:
        return float(sum(self.mesh.load()))

    def state(self) -> str:
        load = self.mesh.load()
        return (f"; calls in flight per actor {list(load)}, alive {load.alive}, restarting "
                f"{[a.restarting for a in load.actors]}")


class RawSender(Sender):
    """Raw `.remote()` in turn over the actors' handles (with Ray's own task retries), every
    ref then read."""

    def __init__(self, handles: Sequence[Any], retries: int = 0) -> None:
        self.handles = list(handles)
        self.methods = [h.work.options(max_task_retries=retries) if retries else h.work
                        for h in handles]
        self.held = [0] * len(handles)  # per actor: calls sent and not yet ended
        self.lock = threading.Lock()

    def in_flight(self, rank: int) -> int:
        return self.held[rank]

    def sent(self, rank: int, ref: Any) -> Any:
        with self.lock:
            self.held[rank] += 1
        ref._on_completed(functools.partial(self.ended, rank))
        return ref

    def ended(self, rank: int, result: object) -> None:
        """Ray's completion thread: O(1), never waits."""
        with self.lock:
            self.held[rank] -= 1

    def run(self, tokens: Sequence[int], durations: Sequence[float], log: str,
            deadline: float) -> list[Outcome | None]:
        n = len(self.methods)
        refs = [self.sent(i % n, self.methods[i % n].remote(t, d, log))
                for i, (t, d) in enumerate(zip(tokens, durations))]
        return [read(ref, deadline) for ref in refs]


class PoolSender(RawSender):
    """`ray.util.ActorPool`: every call submitted, results taken as they come; the refs the pool
    made are read afterwards for each call's own outcome."""


    def run(self, tokens: Sequence[int], durations: Sequence[float], log: str,
            deadline: float) -> list[Outcome | None]:
        pool = RayPool(self.handles)  # a fresh pool: Ray's pool drops an actor that died
        rank_of = {id(h): r for r, h in enumerate(self.handles)}
        refs: dict[int, Any] = {}

        def submit(actor: Any, call: tuple[int, float]) -> Any:
            refs[call[0]] = self.sent(rank_of[id(actor)], actor.work.remote(*call, log))
            return refs[call[0]]

        for call in zip(tokens, durations):
            pool.submit(submit, call)
        while pool.has_next():
            try:
                pool.get_next_unordered(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
            except RayError:  # the call's own error: read from its ref below
                pass
        return [read(refs[t], deadline) if t in refs else None for t in tokens]


def read(ref: Any, deadline: float) -> Outcome | None:
    try:
        return True, ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
    except GetTimeoutError:
        return None
    except RayError as err:
        return False, err


def died(error: BaseException) -> bool:
    """Whether a call failed because its actor died (the library's error or Ray's own)."""
    return isinstance(error, (am.ActorDiedError, RayActorError,
                              ActorUnavailableError))


@dataclasses.dataclass
class Kill:
    rank: int
    at: float  # time.time()
    in_flight: int


class Killer:
    """Every `every_s`, from `start` until `stop`, kills the next actor in `order` (cycled)
    that is alive, as the mesh that made the actors sees them (`alive`), while at least half
    of them are: an actor still restarting is not killed again, so every kill lands on an
    actor that takes calls, and the turn measures what kills cost calls rather than how long
    a loaded machine takes to restart actors (seconds each on two busy cores)."""

    def __init__(self, handles: Sequence[Any], order: Sequence[int], every_s: float,
                 in_flight: Callable[[int], int], alive: Callable[[], list[bool]]) -> None:
        self.handles = list(handles)
        self.order = list(order)
        self.every_s = every_s
        self.in_flight = in_flight
        self.alive = alive
        self.kills: list[Kill] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="actormesh-bench-killer",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> list[Kill]:
        self.done.set()
        self.thread.join(timeout=TIMEOUT_S)
        if self.thread.is_alive():
            raise RuntimeError(f"the killer thread did not stop within {TIMEOUT_S} s")
        return self.kills

    def _run(self) -> None:
        k = 0
        while not self.done.wait(self.every_s):  # a clock, not a synchronisation
            alive = self.alive()
            if 2 * sum(alive) < len(alive):
                continue
            for _ in self.order:
                rank = self.order[k % len(self.order)]
                k += 1
                if alive[rank]:
                    self.kills.append(Kill(rank, time.time(), self.in_flight(rank)))
                    ray.kill(self.handles[rank], no_restart=False)
                    break


class KillTurn(trials.Turn):
    """A turn whose per-call flags are the calls lost (failed or unfinished)."""

    lost = np.empty(0)

    def sample(self, m: dict[str, Any]) -> stats.RunSample:
        out = super().sample(m)
        out.flags["lost_frac"] = self.lost
        return out


def measure(outcomes: Sequence[Outcome | None], tokens: Sequence[int], kills: Sequence[Kill],
            ended: Sequence[tuple[int, int, float]], name: str) -> dict[str, Any]:
    """The figures of one turn from each call's outcome, the kills and the executions (with
    a few of the errors other than an actor's death, for the report)."""
    times: dict[int, int] = {}
    finished_at: dict[int, tuple[int, float]] = {}
    for token, rank, at in ended:
        times[token] = times.get(token, 0) + 1
        finished_at.setdefault(token, (rank, at))
    returned = failed = deaths = unfinished = 0
    lost_gaps: list[float] = []
    errors: dict[str, int] = {}
    for token, outcome in zip(tokens, outcomes):
        if outcome is None:
            unfinished += 1
            continue
        ok, value = outcome
        if ok:
            if value != token or token not in times:
                raise AssertionError(f"{name}: call {token} returned {value!r}"
                                     + ("" if token in times else " but never recorded its end"))
            returned += 1
            continue
        failed += 1
        deaths += died(value)
        if not died(value):
            text = f"{type(value).__name__}: {str(value).splitlines()[0][:160]}"
            errors[text] = errors.get(text, 0) + 1
        if token in finished_at:  # it finished in its actor, yet its caller got an error
            rank, at = finished_at[token]
            # The kill that took its actor: the nearest of that actor's (a kill takes effect
            # some milliseconds after it is sent; the next one comes seconds later).
            nearest = min((k.at for k in kills if k.rank == rank), key=lambda t: abs(t - at),
                          default=float("nan"))
            lost_gaps.append((nearest - at) * 1e3)
    calls = len(tokens)
    return {
        "returned": returned,
        "failed": failed,
        "died": deaths,
        "unfinished": unfinished,
        "lost": failed + unfinished,
        "finished_lost": len(lost_gaps),
        # > 0: the call's end preceded the kill (its outcome waited in the actor); <= 0: it
        # ended after the kill was sent, before the kill reached the process.
        "finished_lost_gap_ms_max": max(lost_gaps, default=float("nan")),
        "run_twice": sum(1 for n in times.values() if n > 1),
        "executions_per_call": sum(times.values()) / calls if calls else float("nan"),
        "kills": len(kills),
        "on_killed_actors": sum(k.in_flight for k in kills),
        "errors": [f"{n}× {text}" for text, n in list(errors.items())[:3]],
    }


def make_trials(actors: Killable, cfg: Config, name: str) -> list[trials.Trial]:
    handles = list(actors.mesh.actors)
    n = len(handles)

    def plan(repeat: int) -> tuple[list[int], list[float], list[int]]:
        """The calls' durations and the order of the kills: the same for every contender of a
        repeat (the warm-up: a few calls per actor and no kills)."""
        rng = np.random.default_rng(section.seed(f"{name}/{repeat}"))
        calls = WARMUP_CALLS_PER_ACTOR * n if repeat < 0 else cfg.kill_calls
        durations = rng.uniform(*SERVICE_S, calls).tolist()
        return list(range(calls)), durations, [int(r) for r in rng.permutation(n)]

    def turn(contender: str, make: Callable[[], Sender]) -> Callable[[int], trials.Turn]:
        def one(repeat: int) -> trials.Turn:
            tokens, durations, order = plan(repeat)
            sender = make()
            actors.ready()
            log = actors.new_log()
            killer = Killer(sender.handles, order, cfg.kill_every_s, sender.in_flight,
                            lambda: actors.mesh.load().alive)
            deadline = time.monotonic() + TIMEOUT_S
            cpu, wall = time.process_time(), time.perf_counter()
            if repeat >= 0:
                killer.start()
            try:
                outcomes = sender.run(tokens, durations, log, deadline)
            finally:
                kills = killer.stop() if repeat >= 0 else []
            seconds = time.perf_counter() - wall
            cpu_s = time.process_time() - cpu
            hung = sum(o is None for o in outcomes)
            if hung and not isinstance(sender, PoolSender):
                raise AssertionError(f"{contender}: {hung} of {len(tokens)} calls did not end "
                                     f"within {TIMEOUT_S:g} s{sender.state()}")
            values = measure(outcomes, tokens, kills, recorded(log), contender)
            t = KillTurn(len(tokens), seconds, cpu_s)
            t.values = {**values, "lost_frac": values["lost"] / len(tokens),
                        "makespan_s": seconds, "load_after": sender.load_after()}
            t.lost = np.array([0.0 if o is not None and o[0] else 1.0 for o in outcomes])
            return t
        return one

    def entrant(contender: str, family: str, label: str) -> section.Entrant:
        return section.Entrant(contender, label, family, contender)

    return [
        trials.Trial(entrant(DEFAULT, "actormesh", "am.ActorMesh(..., max_restarts=-1), "
                                                   "choose"),
                     turn(DEFAULT, lambda: MeshSender(actors.mesh))),
        trials.Trial(entrant(TWIN, "aa", "the default on a second mesh over the same actors: "
                                         "the A/A control"),
                     turn(TWIN, lambda: MeshSender(actors.twin))),
        trials.Trial(entrant(ALONE, "actormesh", "a mesh with coalesce=1 over the same actors: "
                                                 "every call its own Ray task"),
                     turn(ALONE, lambda: MeshSender(actors.alone))),
        trials.Trial(entrant(RETRY, "actormesh", f"the default, .options(retries={RETRIES})"),
                     turn(RETRY, lambda: MeshSender(actors.mesh, retries=RETRIES))),
        trials.Trial(entrant(RAW, "baseline", "actor.work.remote() in turn, then ray.get"),
                     turn(RAW, lambda: RawSender(handles))),
        trials.Trial(entrant(RAW_RETRY, "baseline", "the same with "
                                                    f".options(max_task_retries={RETRIES})"),
                     turn(RAW_RETRY, lambda: RawSender(handles, retries=RETRIES))),
        trials.Trial(entrant(POOL, "baseline", "ray.util.ActorPool: submit, "
                                               "get_next_unordered"),
                     turn(POOL, lambda: PoolSender(handles))),
    ]


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str = "kills"
    title: str = "Calls under kills"
    needs_fleet = False
    pending = ""  # runs in every mode

    def describe(self, cfg: Config) -> str:
        lo, hi = (s * 1e3 for s in SERVICE_S)
        return (f"{cfg.kill_calls:,} calls of {lo:g}-{hi:g} ms sent at once to "
                f"{cfg.kill_actors} actors (max_restarts=-1), one killed every "
                f"{cfg.kill_every_s * 1e3:g} ms until the last call ended")

    def run(self, ctx: Context) -> dict[str, Any]:
        started = time.perf_counter()
        cfg = ctx.cfg
        actors = ctx.shared("kills", lambda: Killable.start(cfg.kill_actors))
        contenders = make_trials(actors, cfg, self.name)
        runs, samples = trials.play(contenders, cfg.kill_repeats, self.name, ctx.progress)
        return section.build(
            name=self.name, title=self.title, kind="calls", description=self.describe(cfg),
            entrants=[t.entrant for t in contenders], default=DEFAULT, twin=TWIN, runs=runs,
            samples=samples, judged_on=("lost_frac", "executions_per_call", "makespan_s"),
            rows=[section.Row("lost_frac", baseline=RAW, also=("executions_per_call",)),
                  section.Row("lost_frac", contender=RETRY, baseline=RAW_RETRY,
                              also=("executions_per_call",))],
            columns=(("sent", "calls"), ("returned", "returned"), ("failed", "failed"),
                     ("unfinished", "unfinished"), ("finished but lost", "~finished_lost"),
                     ("ms from its end to the kill, max", "finished_lost_gap_ms_max"),
                     ("run twice", "~run_twice"), ("on killed actors", "on_killed_actors"),
                     ("kills", "kills"), ("load after", "~load_after"),
                     ("lost", "lost_frac"), ("makespan s", "makespan_s")),
            started=started, params={"calls": cfg.kill_calls, "actors": cfg.kill_actors,
                                     "kill_every_s": cfg.kill_every_s, "service_s": SERVICE_S,
                                     "retries": RETRIES})


def build(cfg: Config) -> Scenario:
    return Scenario()
