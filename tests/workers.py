"""Actor classes shared by the Ray tests (importable by the actor processes)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import actormesh as am

ENV_NAMES = ("ACTORMESH_RANK", "ACTORMESH_WORLD_SIZE", "ACTORMESH_COORDS", "ACTORMESH_SHAPE",
             "RAY_ACTOR_MESH_RANK")


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for a condition the library changes asynchronously (a death notice, a restart)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


class Worker:
    """A synchronous actor: one call at a time, so in-flight counts are queue depths."""

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale
        self.env_at_init = {name: os.environ.get(name) for name in ENV_NAMES}
        point = am.current_rank()
        self.point_at_init = (point.rank, point.coords, dict(point.shape), point.world_size)

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

    @am.method
    async def g(self, x: int) -> str:
        await asyncio.sleep(0)
        return f"g{x}"

    @am.method
    async def twice(self, x: int) -> str:
        first = await self.g(x)  # a decorated async method awaited directly inside the actor
        return first * 2
