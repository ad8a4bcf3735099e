"""Actor classes shared by the Ray tests (importable by the actor processes)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray

import actormesh as am

ENV_NAMES = ("ACTORMESH_RANK", "ACTORMESH_WORLD_SIZE", "ACTORMESH_COORDS", "ACTORMESH_SHAPE",
             "RAY_ACTOR_MESH_RANK")
TESTS = os.path.dirname(os.path.abspath(__file__))


def script_env() -> dict[str, str]:
    """The environment of a test's script, a process of its own: this one's, with the test
    workers importable by name."""
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))}


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for a condition the library changes asynchronously (a death notice, a restart)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


@ray.remote(num_cpus=0)
class Signal:
    """A one-shot event tests and actors share: actors `wait()` until the test calls `send()`."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiting = 0

    async def wait(self) -> None:
        self._waiting += 1
        await self._event.wait()

    def send(self) -> None:
        self._event.set()

    def waiting(self) -> int:
        """How many calls are waiting (or have waited) on the signal."""
        return self._waiting


def signal() -> Any:
    return Signal.remote()  # type: ignore[attr-defined]


def waiters(sig: Any, count: int, timeout: float = 60.0) -> None:
    """Wait until `count` calls are blocked on `sig`: they have started on their actors."""
    wait_until(lambda: ray.get(sig.waiting.remote(), timeout=timeout) >= count, timeout)


class Worker:
    """A synchronous actor: one call at a time, so in-flight counts are queue depths."""

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale
        self.env_at_init = {name: os.environ.get(name) for name in ENV_NAMES}
        point = am.current_rank()
        self.point_at_init = (point.rank, point.coords, dict(point.shape), point.world_size)
        self.init_thread = threading.get_ident()
        self.local = threading.local()
        self.local.set_in_init = True
        self.executions: Counter[int] = Counter()

    @am.method
    def block(self, sig: Any) -> int:
        """Hold the actor until `sig` is sent; returns the rank."""
        ray.get(sig.wait.remote())
        return am.current_rank().rank

    @am.method
    def block_then_length(self, sig: Any, value: Any) -> int:
        ray.get(sig.wait.remote())
        return len(value)

    @am.method
    def threading_seen(self) -> tuple[bool, bool]:
        """(runs on the thread that ran __init__, sees thread-local state set in __init__)"""
        return threading.get_ident() == self.init_thread, getattr(self.local, "set_in_init", False)

    @am.method
    def counted(self, x: int) -> tuple[int, int]:
        """Counts its executions per input; returns (x, pid)."""
        self.executions[x] += 1
        return x, os.getpid()

    @am.method
    def execution_counts(self) -> dict[int, int]:
        return dict(self.executions)

    @am.method
    def logged(self, x: int, path: str, seconds: float) -> int:
        """Appends x to the file at `path` (a record that outlives a killed actor), sleeps,
        returns x."""
        with open(path, "a") as log:
            log.write(f"{x}\n")
        time.sleep(seconds)
        return x

    @am.method
    def fail_on(self, rank: int, seconds: float) -> int:
        """Raises at once on `rank`; elsewhere sleeps `seconds` and returns the rank."""
        me = am.current_rank().rank
        if me == rank:
            raise RuntimeError(f"rank {me} always fails")
        time.sleep(seconds)
        return me

    @am.method
    def f(self, x: int) -> int:
        return x * self.scale

    @am.method
    def add(self, x: int, y: int) -> int:
        return x + y

    @am.method(dispatch=am.dispatch.split())
    def process(self, xs: list[int], y: int) -> list[int]:
        return [x + y for x in xs]

    @am.method
    def double(self, xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    @am.method
    def tag(self, xs: Any) -> list[tuple[int, int]]:
        """One (rank, row) pair per input row."""
        return [(am.current_rank().rank, int(x)) for x in xs]

    @am.method
    def lengths(self, xs: Any, *extra: Any) -> list[int]:
        """The length of each argument received."""
        return [len(xs), *(len(e) for e in extra)]

    @am.method
    def scaled(self, xs: Any, factor: float = 1.0) -> Any:
        return xs * factor

    @am.method
    def rank(self) -> int:
        return am.current_rank().rank

    @am.method
    def identity(self) -> tuple[dict[str, str | None], tuple[Any, ...]]:
        return self.env_at_init, self.point_at_init

    @am.method
    def f_plus_one(self, x: int) -> int:
        return self.f(x) + 1  # a decorated method called directly inside the actor

    @am.method
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @am.method
    def checked(self, x: int) -> int:
        """x, or a ValueError for a negative x."""
        if x < 0:
            raise ValueError(f"negative: {x}")
        return x

    @am.method
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return am.current_rank().rank

    @am.method
    def length(self, value: Any) -> int:
        return len(value)

    @am.method
    def sleep_then_length(self, seconds: float, value: Any) -> int:
        time.sleep(seconds)
        return len(value)

    @am.method
    def pid(self) -> int:
        return os.getpid()

    @am.method
    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def undecorated(self, x: int) -> int:
        return -x


class AsyncWorker:
    """An async actor: its methods are coroutines."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    @am.method
    async def wait_open(self) -> str:
        """Returns once `open_gate` ran: only an async actor can serve both at once."""
        await self.opened.wait()
        return "opened"

    @am.method
    async def open_gate(self) -> None:
        self.opened.set()

    @am.method
    async def overlapping(self, x: int) -> int:
        """Records how many calls of this method run at once; returns x."""
        self.running = getattr(self, "running", 0) + 1
        self.most = max(getattr(self, "most", 0), self.running)
        await asyncio.sleep(0.01)
        self.running -= 1
        return x

    @am.method
    async def most_overlapping(self) -> int:
        return getattr(self, "most", 0)

    @am.method
    async def cancellable(self, sig: Any) -> str:
        """Waits for `sig`; a cancellation is recorded (see `cancelled`) and raised on."""
        try:
            await sig.wait.remote()
        except asyncio.CancelledError:
            self.was_cancelled = True
            raise
        return "not cancelled"

    @am.method
    async def cancelled(self) -> bool:
        return getattr(self, "was_cancelled", False)

    @am.method
    async def g(self, x: int) -> str:
        await asyncio.sleep(0)
        return f"g{x}"

    @am.method
    async def twice(self, x: int) -> str:
        first = await self.g(x)  # a decorated async method awaited directly inside the actor
        return first * 2


class ComesBackOnSignal(Worker):
    """A restarted incarnation finishes `__init__` only once `sig` is sent."""

    def __init__(self, sig: Any) -> None:
        if ray.get_runtime_context().was_current_actor_reconstructed:
            ray.get(sig.wait.remote())
        super().__init__()


class Box:
    """A value whose lifetime a test can watch with a weak reference."""

    def __init__(self, payload: int) -> None:
        self.payload = payload


class Boxes:
    @am.method
    def box(self, payload: int) -> Box:
        return Box(payload)


@ray.remote(num_cpus=0.1)
class Plain:
    """A Ray actor made without actormesh, for `ActorMesh.from_actors`."""

    def __init__(self, tag: int) -> None:
        self.tag = tag

    def whoami(self) -> int:
        return self.tag

    def split_len(self, xs: list[int]) -> list[int]:
        return [len(xs)]

    def hold(self, sig: Any) -> int:
        ray.get(sig.wait.remote())
        return self.tag


def killed(actor: Any, timeout: float = 60.0) -> None:
    """`ray.kill(actor)` and wait until Ray says it is dead (a kill is sent, not awaited: until
    it lands, the actor may still finish a call).

    Dead means a probe sent after the kill failed. A threaded actor (`max_concurrency` > 1) runs
    a probe at once, beside its other calls, and may answer it before the kill lands: then the
    next probe goes."""
    ray.kill(actor)
    probe = [actor.__ray_ready__.remote()]

    def dead() -> bool:
        try:
            ray.get(probe[0], timeout=0.05)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        probe[0] = actor.__ray_ready__.remote()  # answered: the kill had not landed yet
        return False

    wait_until(dead, timeout)

