"""A whole node lost under a mesh, on a multi-raylet cluster (`ray.cluster_utils.Cluster`).

Run as a script by tests/test_node_loss.py: it needs a Ray cluster of its own, apart from the
session cluster of the other tests. Prints one JSON line of observations.
"""

from __future__ import annotations

import json
import time

import ray
from ray.cluster_utils import Cluster
from workers import Worker

import actormesh as am


def main() -> None:
    # No dashboard: nothing here reads it, and on two cores its start-up is seconds.
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    # Bundles alternate nodes, so rank order by node must regroup them. Both nodes start at
    # once; the mesh is made only when both have registered.
    nodes = {name: cluster.add_node(wait=False, num_cpus=2, resources={name: 4})
             for name in ("a", "b")}
    cluster.wait_for_nodes(timeout=120)
    ray.init(address=cluster.address, log_to_driver=False)
    bundles = [{"CPU": 0.25, name: 1} for name in ("b", "a", "b", "a")]
    mesh = am.ActorMesh(Worker, shape=4, placement=am.Placement(bundles=bundles, strategy="SPREAD"))
    node_of_rank = list(mesh.methods.node_id.all().get(timeout=120))
    lost = nodes["b"].node_id
    lost_ranks = [rank for rank, node in enumerate(node_of_rank) if node == lost]
    in_flight = {rank: mesh[rank].methods.sleep.choose(120) for rank in lost_ranks}
    while sum(mesh.load()) < len(lost_ranks):
        time.sleep(0.01)
    removed_at = time.monotonic()
    cluster.remove_node(nodes["b"])
    errors = {}
    for rank, future in in_flight.items():
        try:
            future.get(timeout=120)
            errors[rank] = None
        except am.ActorDiedError as err:
            errors[rank] = [err.rank, err.coords]
    while any(mesh.load().alive[r] for r in lost_ranks):
        time.sleep(0.01)
    unrouted_after_s = time.monotonic() - removed_at
    # At once, so that every live actor is needed (one call at a time takes the warm actor).
    picks = sorted(set(am.get([mesh.methods.rank.choose() for _ in range(40)], timeout=60)))
    print(json.dumps({
        "node_of_rank": node_of_rank,
        "lost_ranks": lost_ranks,
        "errors": {str(k): v for k, v in errors.items()},
        "alive": mesh.load().alive,
        "picks": picks,
        "load": list(mesh.load()),
        "unrouted_after_s": unrouted_after_s,
    }))
    mesh.shutdown()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
