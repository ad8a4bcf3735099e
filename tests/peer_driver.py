"""A second driver process for tests/test_drivers.py: it joins the test's Ray cluster and
namespace, connects to meshes by name, and runs the commands the test sends.

    python peer_driver.py GCS_ADDRESS NAMESPACE

Each command is a JSON line on stdin, `{"op": name, "args": [...]}`; each answer a JSON line on
stdout, `{"ok": value}` or `{"error": [type name, message]}`.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import ray
from workers import Worker

import actormesh as am
from actormesh import _drivers, _named


class Peer:
    def __init__(self) -> None:
        self.meshes: dict[str, am.ActorMesh[Any]] = {}
        self.held: list[am.MeshFuture[Any]] = []

    def create(self, name: str, size: int) -> str:
        """Make a mesh of `size` Workers named `name`; the path of its load table."""
        self.meshes[name] = am.ActorMesh(Worker, shape=size, num_cpus=0.1, name=name)
        record, _ = _named.find(name)
        return _drivers.table_path(record.table)

    def connect(self, name: str, balancer: str = "adaptive") -> dict[str, Any]:
        mesh = am.ActorMesh.connect(name, balancer=balancer)
        self.meshes[name] = mesh
        return {"repr": repr(mesh), "shape": dict(mesh.shape), "size": mesh.size}

    def verbs(self, name: str) -> dict[str, Any]:
        methods = self.meshes[name].methods
        return {
            "all": list(methods.rank.all().get(timeout=60)),
            "choose": methods.add.choose(2, 3).get(timeout=60),
            "shard": methods.process.shard([1, 2, 3, 4, 5], 10).get(timeout=60),
            "map": list(methods.f.map(range(6))),
            "view": list(self.meshes[name].slice(dp=1).methods.rank.all().get(timeout=60)),
        }

    def hold(self, name: str, signal: str, count: int) -> int:
        """Send `count` calls that block on the named signal, one at a time through `choose`."""
        sig = ray.get_actor(signal)
        self.held += [self.meshes[name].methods.block.choose(sig) for _ in range(count)]
        return count

    def release(self) -> list[int]:
        """The ranks that ran the held calls (once their signal is sent)."""
        held, self.held = self.held, []
        return [future.get(timeout=60) for future in held]

    def load(self, name: str) -> list[list[Any]]:
        return [[a.in_flight, a.others, a.alive] for a in self.meshes[name].load().actors]

    def wait_dead(self, name: str, rank: int) -> bool:
        deadline = time.monotonic() + 60
        while self.meshes[name].load().alive[rank]:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def choose_ranks(self, name: str, count: int) -> list[int]:
        methods = self.meshes[name].methods
        return [methods.rank.choose().get(timeout=60) for _ in range(count)]

    def shutdown(self, name: str) -> None:
        self.meshes[name].shutdown()


def main() -> None:
    address, namespace = sys.argv[1], sys.argv[2]
    ray.init(address=address, namespace=namespace, log_to_driver=False, configure_logging=False)
    peer = Peer()
    print(json.dumps({"ok": "ready"}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            answer: dict[str, Any] = {"ok": getattr(peer, command["op"])(*command["args"])}
        except Exception as err:  # noqa: BLE001 - reported to the test, which asserts on it
            answer = {"error": [type(err).__name__, str(err)]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
