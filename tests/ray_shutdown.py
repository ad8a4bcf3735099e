"""Meshes that outlive `ray.shutdown()`, in a driver process of its own that joins the cluster
at the address it is given (the tests' session cluster: `ray.shutdown()` ends this driver, and
the actors it owns, not the cluster). Run by tests/test_ray_shutdown.py; prints one JSON line of
what it saw.

Ray's `.remote()`, `ray.get`, `ray.kill`, `ray.cancel` and `ray.get_actor` start a new local
cluster when none is running. A mesh of the cluster that ended must never do that: not from
its own threads (the load exchange of a named mesh, the reads of actor states), not from a
finalizer or `shutdown()`, not for a call made on it. Its calls fail and name the cause.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
from typing import Any

import ray
from workers import Worker

import actormesh as am
from actormesh import _loop


def failure(fn: Any) -> str:
    try:
        fn()
    except am.MeshError as err:
        return str(err)
    return "no error"


def main(address: str) -> None:
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    named = am.ActorMesh(Worker, shape=2, name="outlives-ray", num_cpus=0.25)
    dropped = am.ActorMesh(Worker, shape=1, num_cpus=0.25)
    assert named.methods.f.choose(1).get(timeout=60) == 1
    assert dropped.methods.f.choose(1).get(timeout=60) == 1
    unread = named.methods.f.choose(2)
    am.wait([unread], timeout=60)  # ended, its value not read yet
    # The named mesh's finalizer holds its share of the load, whose exchange loop runs on.
    exchange = named._root.cleanup.peek()[2][5]._task  # type: ignore[index]
    assert not exchange.done()

    ray.shutdown()

    seen: dict[str, Any] = {}
    # The exchange loop (a `.remote()` every second) ends by itself.
    exchange.result(timeout=30)
    seen["choose"] = failure(lambda: named.methods.f.choose(1).get(timeout=30))
    seen["all"] = failure(lambda: list(named.methods.f.all(1).get(timeout=30)))
    seen["read"] = failure(lambda: unread.get(timeout=30))
    del dropped  # its finalizer shuts it down on the loop thread
    gc.collect()
    _loop.submit(asyncio.sleep(0)).result(timeout=30)  # after what the finalizer posted
    named.shutdown()
    seen["initialized"] = ray.is_initialized()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(sys.argv[1])
