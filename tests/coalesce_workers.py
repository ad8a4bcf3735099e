"""Actor classes for the coalescing tests: their calls report the Ray task they ran in."""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from workers import Worker

import actormesh as am


def task() -> tuple[str, str]:
    """The id and name of the Ray task running the caller: a batch is one task for all its
    calls, named after the method that runs batches."""
    context = ray.get_runtime_context()
    return context.get_task_id() or "", context.get_task_name() or ""


class Batched(Worker):
    """A synchronous actor: it runs a batch's calls in order."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[int] = []

    @am.method
    def where(self, x: int) -> tuple[int, str, str]:
        """x, and the id and name of the Ray task this call ran in."""
        self.order.append(x)
        return (x, *task())

    @am.method(coalesce=False)
    def alone(self, x: int) -> tuple[int, str, str]:
        return (x, *task())

    @am.method
    def ran_in_order(self) -> list[int]:
        return list(self.order)

    @am.method
    def echo(self, value: Any) -> Any:
        return value


class AsyncBatched:
    """An asyncio actor: it runs a batch's calls at once, as it runs separate calls."""

    @am.method
    async def block(self, sig: Any) -> None:
        await sig.wait.remote()

    @am.method
    async def gate(self, sig: Any, x: int) -> tuple[int, str, str]:
        """Waits for `sig`: several calls are waiting at once only if they run at once."""
        await sig.wait.remote()
        return (x, *task())


@ray.remote(num_cpus=0.1)
class PlainSync:
    """A Ray actor made without actormesh, for `ActorMesh.from_actors`."""

    def where(self, x: int) -> tuple[int, str, str]:
        return (x, *task())

    def checked(self, x: int) -> int:
        if x < 0:
            raise ValueError(f"negative: {x}")
        return x

    def block(self, sig: Any) -> None:
        ray.get(sig.wait.remote())


@ray.remote(num_cpus=0.1)
class PlainAsync:
    """An asyncio Ray actor made without actormesh."""

    async def gate(self, sig: Any, x: int) -> tuple[int, str, str]:
        await sig.wait.remote()
        return (x, *task())

    def plain(self, x: int) -> int:
        """A synchronous method of an asyncio actor: Ray runs it on the actor's event loop."""
        asyncio.get_running_loop()  # raises off the loop
        return x
