"""Checked by pyright and mypy (`make typecheck`), never run: `am.ActorPool`'s signatures.

Each `assert_type` must hold. Each line marked `# type: ignore[...]` MUST be rejected: with
unused-ignore reporting on in both checkers, a line that type-checks fails the check.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ray.actor import ActorHandle
from typing_extensions import assert_type

import actormesh as am


class Worker:
    def double(self, x: int) -> int:
        return 2 * x


handles: list[ActorHandle[Worker]] = []
pool = am.ActorPool(handles, balancer="sed", max_in_flight=2, retries=1)
assert_type(pool, am.ActorPool[Worker])


def double(actor: ActorHandle[Worker], value: int) -> Any:
    return actor.double.remote(value)


pool.submit(double, 1)
assert_type(pool.map(double, [1, 2]), Iterator[Any])
assert_type(pool.map_unordered(double, range(3)), Iterator[Any])
assert_type(pool.get_next(timeout=1.5, ignore_if_timedout=True), Any)
assert_type(pool.get_next_unordered(timeout=0), Any)
assert_type(pool.has_next(), bool)
assert_type(pool.has_free(), bool)
assert_type(pool.pop_idle(), ActorHandle[Worker] | None)
pool.push(handles[0])

def no_value(actor: ActorHandle[Worker]) -> Any:
    return actor


# Lines that must fail.
am.ActorPool([1, 2])  # type: ignore[arg-type]
am.ActorPool(handles, max_in_flight="2")  # type: ignore[arg-type]
am.ActorPool(handles, balancer="fastest")  # type: ignore[arg-type]
pool.submit(no_value, 1)  # type: ignore[arg-type]
pool.submit(double, "one")  # type: ignore[arg-type]
pool.get_next(timeout="1")  # type: ignore[arg-type]
pool.push(1)  # type: ignore[arg-type]
