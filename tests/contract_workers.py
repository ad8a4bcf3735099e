"""Actor classes for the tests of the call contract under coalescing (`test_batch_contract`)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import ray

import actormesh as am


class Abort(BaseException):
    """An exception of the user's own that is no `Exception`."""


def _never_loads(payload: int) -> Any:
    raise ValueError(f"argument {payload} cannot be loaded here")


class LoadsNowhere:
    """An argument that pickles on the driver but cannot be unpickled (in the actor)."""

    def __init__(self, payload: int) -> None:
        self.payload = payload

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _never_loads, (self.payload,)


class Logged:
    """Records every execution in a counter actor, so a test sees what ran and how often."""

    @am.method
    def block(self, sig: Any) -> int:
        ray.get(sig.wait.remote())
        return am.current_rank().rank

    @am.method
    def logged(self, x: int, counter: Any) -> int:
        ray.get(counter.add.remote(x))
        return x

    @am.method
    def value(self, x: int) -> Any:
        if x < 0:
            return threading.Lock()  # a value no pickle takes
        return x

    @am.method
    def slow(self, x: int, seconds: float, counter: Any) -> int:
        """Record `x`, after `seconds` of work."""
        time.sleep(seconds)
        ray.get(counter.add.remote(x))
        return x

    @am.method
    def aborting(self, x: int) -> int:
        if x < 0:
            raise Abort(f"abort {x}")
        return x


@ray.remote(num_cpus=0)
class Counter:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def add(self, x: int) -> None:
        self.seen.append(x)

    def add_counted(self, x: int) -> int:
        """Record `x`; how many times it has been recorded."""
        self.seen.append(x)
        return self.seen.count(x)

    def executions(self) -> list[int]:
        return sorted(self.seen)


@ray.remote(num_cpus=0.1, max_concurrency=2)
class Bounded:
    """An asyncio actor made elsewhere with its own bound on calls at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    async def block(self, sig: Any) -> None:
        await sig.wait.remote()

    async def work(self, x: int) -> int:
        self.now += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(0.05)
        self.now -= 1
        return x

    def peak_seen(self) -> int:
        return self.peak


@ray.remote(num_cpus=0.1, max_restarts=1, max_task_retries=1)
class Restarting:
    """A synchronous actor made elsewhere whose calls Ray retries once it has restarted (the
    actor's own `max_task_retries`, the default of each of its methods)."""

    def block(self, sig: Any) -> None:
        ray.get(sig.wait.remote())

    def logged(self, x: int, counter: Any, crash: int) -> int:
        """Record `x`; the process dies the first time it is given `crash`."""
        if ray.get(counter.add_counted.remote(x)) == 1 and x == crash:
            os._exit(1)
        return x


@ray.remote(num_cpus=0.1)
class Flaky:
    """A synchronous actor made elsewhere with a method Ray retries when it raises."""

    def __init__(self) -> None:
        self.attempts: dict[int, int] = {}

    def block(self, sig: Any) -> None:
        ray.get(sig.wait.remote())

    @ray.method(max_task_retries=1, retry_exceptions=[ConnectionError])
    def flaky(self, x: int) -> int:
        """Raise on the first attempt for `x`, return it on the second."""
        self.attempts[x] = self.attempts.get(x, 0) + 1
        if self.attempts[x] == 1:
            raise ConnectionError(f"{x}: a transient failure")
        return x

    def attempts_made(self) -> dict[int, int]:
        return self.attempts


@ray.remote(num_cpus=0.1)
class Returns:
    """An actor made elsewhere whose methods return as Ray lets them: a generator, two returns."""

    def block(self, sig: Any) -> None:
        ray.get(sig.wait.remote())

    def counted(self, n: int) -> Iterator[int]:
        for i in range(n):  # noqa: UP028 - Ray's generators take no `yield from` of one
            yield i

    def held(self, sig: Any) -> Iterator[int]:
        yield 1
        ray.get(sig.wait.remote())
        yield 2

    @ray.method(num_returns=2)
    def pair(self, x: int) -> tuple[int, int]:
        return x, -x

    @ray.method(num_returns=0)
    def fire_and_forget(self) -> None:
        pass


class Yields:
    """A mesh actor with a generator method."""

    @am.method
    def counted(self, n: int) -> Iterator[int]:
        for i in range(n):  # noqa: UP028 - Ray's generators take no `yield from` of one
            yield i


@ray.remote(num_cpus=0.1, concurrency_groups={"io": 1})
class Grouped:
    """A synchronous actor made elsewhere, one of whose methods runs in a group of its own."""

    def block(self, sig: Any) -> None:
        ray.get(sig.wait.remote())

    @ray.method(concurrency_group="io")
    def in_io(self, x: int) -> str:
        return f"{x}:{threading.current_thread().name}"

    def thread(self) -> str:
        return threading.current_thread().name


class Gated:
    """An asyncio mesh actor whose calls wait on a signal, counting those cancelled."""

    def __init__(self) -> None:
        self.cancelled = 0

    @am.method
    async def block(self, sig: Any) -> None:
        await sig.wait.remote()

    @am.method
    async def gate(self, sig: Any) -> None:
        try:
            await sig.wait.remote()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    @am.method
    async def cancelled_calls(self) -> int:
        return self.cancelled


class Peaked:
    """An asyncio mesh actor that records how many of its calls ran at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    @am.method
    async def block(self, sig: Any) -> None:
        await sig.wait.remote()

    @am.method
    async def work(self, x: int) -> int:
        self.now += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(0.05)
        self.now -= 1
        return x

    @am.method
    async def peak_seen(self) -> int:
        return self.peak
