"""Checked by pyright and mypy (`make typecheck`), never run.

Each `assert_type` must hold. Each line marked `# type: ignore[...]` MUST be rejected: with
unused-ignore reporting on in both checkers, a line that type-checks fails the check.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from typing_extensions import assert_type

import actormesh as am


class Worker:
    def __init__(self, scale: int) -> None:
        self.scale = scale

    @am.method
    def f(self, x: int) -> int:
        return x * self.scale

    @am.method
    async def g(self, x: int) -> str:
        return str(x)

    @am.method(dispatch=am.dispatch.split())
    def process(self, xs: list[int], y: int) -> list[int]:
        return [x + y for x in xs]

    @am.method()
    def named(self, *, key: str, n: int = 1) -> bytes:
        return key.encode() * n

    @am.method
    def inside(self) -> int:
        assert_type(self.f(1), int)  # a direct call inside the actor is a plain call
        return self.f(2) + 1

    @am.method
    async def inside_async(self) -> str:
        coroutine = self.g(1)
        _ = assert_type(coroutine, Coroutine[Any, Any, str])
        return await coroutine

    @am.method(coalesce=False)
    def own_task(self, x: int) -> int:
        return x

    def plain(self) -> None: ...


mesh = am.ActorMesh(Worker, shape={"dp": 2, "tp": 2}, args=(3,), num_cpus=0.5)
assert_type(mesh, am.ActorMesh[Worker])
assert_type(mesh[1, :], am.ActorMesh[Worker])
assert_type(mesh.slice(dp=0), am.ActorMesh[Worker])
assert_type(mesh.shape, am.Shape)

# The verbs keep the method's parameters and result.
assert_type(mesh.methods.f.all(1), am.MeshFuture[am.ValueMesh[int]])
assert_type(mesh.methods.f.choose(1), am.MeshFuture[int])
assert_type(mesh.methods.f.choose(x=1).get(), int)
assert_type(mesh.methods.process.shard([1, 2, 3], 5), am.MeshFuture[list[int]])
assert_type(mesh.methods.named.choose(key="a").get(timeout=1.0), bytes)
assert_type(mesh.methods.f.options(affinity="s", timeout=2.0, retries=1).choose(1), am.MeshFuture[int])
assert_type(mesh.methods.f.options(hedge=True).choose(1), am.MeshFuture[int])
assert_type(list(mesh.methods.f.options(hedge=0.05).map([1, 2])), list[int])
assert_type(mesh.methods.f.all(1).get()[0, 1], int)
assert_type(mesh.methods.f.all(1).get().item(dp=0, tp=1), int)

# Async methods yield the awaited type.
assert_type(mesh.methods.g.all(1), am.MeshFuture[am.ValueMesh[str]])
assert_type(mesh.methods.g.choose(1).get(), str)

# A MeshMethod is what the contract names.
m: am.MeshMethod[[int], int] = mesh.methods.f
for point, value in mesh.methods.f.all(1).as_completed():
    assert_type(point, am.Point)
    assert_type(value, int)


# map streams results of the method's result type over items of its single parameter.
assert_type(mesh.methods.f.map([1, 2, 3]), am.MeshMap[int])
assert_type(mesh.methods.g.map(iter(range(5)), ordered=False, window=4), am.MeshMap[str])
for mapped in mesh.methods.f.map(range(10)):
    assert_type(mapped, int)
mapping = mesh.methods.f.map(range(10))
assert_type(next(mapping), int)
assert_type(iter(mapping), am.MeshMap[int])
mapping.close()
assert_type(mesh.methods.own_task.choose(1), am.MeshFuture[int])

# Many futures at once: am.get keeps the result type, am.wait splits the futures.
assert_type(am.get([mesh.methods.f.choose(1), mesh.methods.f.choose(2)]), list[int])
assert_type(am.get(mesh.methods.g.choose(1), timeout=1.0), str)
assert_type(am.get([mesh.methods.f.all(1)]), list[am.ValueMesh[int]])
done, pending = am.wait([mesh.methods.f.choose(1)], num_returns=1, timeout=0.5)
assert_type(done, list[am.MeshFuture[int]])
assert_type(pending, list[am.MeshFuture[int]])
mixed = am.get([mesh.methods.f.choose(1), mesh.methods.g.choose(1)])
assert_type(mixed, list[Any])

# Coalescing is a mesh setting, and the default policy is a name like the others.
assert_type(am.ActorMesh(Worker, shape=2, args=(1,), coalesce=16), am.ActorMesh[Worker])
assert_type(am.ActorMesh.from_actors(mesh.actors, coalesce=1), am.ActorMesh[Any])
am.ActorMesh(Worker, shape=2, args=(1,), balancer="adaptive")
am.ActorMesh(Worker, shape=2, args=(1,), balancer=am.Policy("adaptive", max_tasks=4))

# run_in_actors types the actor instance and the function's result.
assert_type(mesh.run_in_actors(lambda worker: worker.scale), am.MeshFuture[am.ValueMesh[int]])

# A mesh over actors made elsewhere keeps their class.
plain_mesh = am.ActorMesh.from_actors(mesh.actors)
assert_type(plain_mesh, am.ActorMesh[Any])


async def awaited() -> None:
    async for mapped_async in mesh.methods.g.map([1]):
        assert_type(mapped_async, str)
    assert_type(await mesh.methods.f.choose(1), int)
    assert_type(await mesh.methods.g.choose(1), str)
    async for point, text in mesh.methods.g.all(1):
        assert_type(point, am.Point)
        assert_type(text, str)


# Lines that MUST be rejected.
mesh.methods.f.all("x")  # type: ignore[arg-type]
mesh.methods.f.choose(1, 2)  # type: ignore[call-arg]
mesh.methods.f.choose(y=1)  # type: ignore[call-arg]
mesh.methods.process.shard("abc", 5)  # type: ignore[arg-type]
mesh.methods.named.choose("a")  # type: ignore[call-arg]
bad_result: str = mesh.methods.f.choose(1).get()  # type: ignore[assignment]
bad_async: int = mesh.methods.g.choose(1).get()  # type: ignore[assignment]
mesh.methods.nope.choose()  # type: ignore[attr-defined]
mesh.methods.plain.choose()  # type: ignore[attr-defined]
am.ActorMesh(Worker, shape=2, balancer=3)  # type: ignore[arg-type]
mesh.methods.f.options(retries="many")  # type: ignore[arg-type]
mesh.methods.f.options(hedge="fast")  # type: ignore[arg-type]
words: list[str] = ["x"]
mesh.methods.f.map(words)  # type: ignore[arg-type]
mesh.methods.process.map([[1]])  # type: ignore[misc, arg-type]
mesh.methods.f.map([1], window="all")  # type: ignore[arg-type]
am.get(mesh.methods.f.choose(1).get())  # type: ignore[call-overload]
am.wait(mesh.methods.f.choose(1))  # type: ignore[arg-type]
am.get([1, 2])  # type: ignore[arg-type]
am.ActorMesh(Worker, shape=2, args=(1,), coalesce="many")  # type: ignore[arg-type]
am.method(coalesce=1)  # type: ignore[call-overload]

# A ValueMesh selects like the mesh.
grid_values = mesh.methods.f.all(1).get()
assert_type(grid_values[1, 0], int)
assert_type(grid_values[:, 0], am.ValueMesh[int])
assert_type(grid_values.slice(dp=1), am.ValueMesh[int])
