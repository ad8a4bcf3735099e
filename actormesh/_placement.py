"""Placement: one actor per bundle of a placement group, ranks ordered so neighbours share a node."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

log = logging.getLogger("actormesh")

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the actors go: `bundles` for a new placement group, or an existing `placement_group`."""

    bundles: Sequence[Mapping[str, float]] | None = None
    strategy: Strategy = "PACK"
    placement_group: PlacementGroup | None = None
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if (self.bundles is None) == (self.placement_group is None):
            raise ValueError("am.Placement needs exactly one of bundles= or placement_group=")
        if self.strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"placement strategy {self.strategy!r}: unknown")

    @property
    def bundle_specs(self) -> Sequence[Mapping[str, float]]:
        """The bundles: those given, or those of the placement group."""
        if self.bundles is not None:
            return self.bundles
        assert self.placement_group is not None
        return self.placement_group.bundle_specs

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    def check(self, size: int) -> None:
        """Raise before anything starts if the bundles cannot hold one actor per rank."""
        if self.bundle_count != size:
            raise ValueError(
                f"placement has {self.bundle_count} bundles but the mesh has {size} actors; "
                "give one bundle per actor"
            )


class Placed:
    """A ready placement group and, for each rank, the bundle index it runs in."""

    def __init__(self, placement: Placement) -> None:
        self.owned = placement.placement_group is None
        if placement.placement_group is None:
            assert placement.bundles is not None
            pg = placement_group([dict(b) for b in placement.bundles], strategy=placement.strategy)
        else:
            pg = placement.placement_group
        lacking = "; ".join(dict.fromkeys(
            filter(None, (shortfall(_as_options(b)) for b in pg.bundle_specs))))
        if lacking:
            log.warning("actormesh: the placement group with bundles %s will wait: %s",
                        pg.bundle_specs, lacking)
        try:
            ready = pg.wait(placement.timeout_s)
        except Exception:
            ready = False
        if not ready:
            if self.owned:
                remove_placement_group(pg)
            raise TimeoutError(
                f"placement group with bundles {pg.bundle_specs} not ready after "
                f"{placement.timeout_s} s: the cluster lacks the resources"
                + (f" ({lacking})" if lacking else "")
            )
        self.group = pg
        self.bundle_of_rank = _rank_order(pg)

    def actor_options(self, rank: int, options: Mapping[str, Any]) -> dict[str, Any]:
        """Ray options for rank's actor: its bundle, and by default the bundle's CPUs and GPUs."""
        bundle = self.group.bundle_specs[self.bundle_of_rank[rank]]
        placed = dict(options)
        if placed.get("num_cpus") is None:
            placed["num_cpus"] = bundle.get("CPU", 0)
        if placed.get("num_gpus") is None and "GPU" in bundle:
            placed["num_gpus"] = bundle["GPU"]
        placed["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=self.group,
            placement_group_bundle_index=self.bundle_of_rank[rank],
            placement_group_capture_child_tasks=True,
        )
        return placed

    def release(self) -> None:
        if self.owned:
            remove_placement_group(self.group)


def _rank_order(pg: PlacementGroup) -> list[int]:
    """Bundles sorted by node, then by index: neighbouring ranks share a node."""
    table: dict[str, Any] = ray.util.placement_group_table(pg)
    node_of: Mapping[int, str] = table.get("bundles_to_node_id", {})
    count = len(pg.bundle_specs)
    return sorted(range(count), key=lambda b: (node_of.get(b, ""), b))


def shortfall(options: Mapping[str, Any]) -> str:
    """What no live node of the cluster can give one actor started with these Ray options
    (`num_cpus`, `num_gpus`, `resources`, `memory`), in words; "" if some node can, or if the
    options pin the actor somewhere (a scheduling strategy) this cannot judge. Such an actor
    waits (for an autoscaler to add a node, or forever): the mesh says so at once."""
    if options.get("scheduling_strategy") is not None:
        return ""
    demand = dict(options.get("resources") or {})
    demand["CPU"] = 1 if options.get("num_cpus") is None else options["num_cpus"]
    for key, resource in (("num_gpus", "GPU"), ("memory", "memory")):
        if options.get(key):
            demand[resource] = options[key]
    demand = {k: float(v) for k, v in demand.items() if v}
    every: Callable[[], list[dict[str, Any]]] = ray.nodes  # untyped in Ray
    nodes = [n.get("Resources", {}) for n in every() if n.get("Alive")]
    if not demand or any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in nodes):
        return ""
    short = []
    for resource, wanted in demand.items():
        most = max((node.get(resource, 0.0) for node in nodes), default=0.0)
        if most < wanted:
            short.append(f"{resource}={wanted:g} per actor, and no node has more than {most:g} "
                         f"{resource}" if most else f"{resource}={wanted:g} per actor, and no "
                         f"node of the cluster has any {resource}")
    if not short:
        short.append(f"{demand} per actor, which no single node has all of")
    return "each actor asks for " + "; ".join(short)


def _as_options(bundle: Mapping[str, float]) -> dict[str, Any]:
    """A placement bundle as the actor options `shortfall` reads."""
    rest = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")}
    return {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0),
            "memory": bundle.get("memory", 0), "resources": rest}
