"""What `python -m benchmarks` (and so `make bench`) runs on Ray, in this order:

- `balancing`: one mesh, who gets each call: load levels, heavy tails, a straggler, bursts,
  batches, tiny calls, a killed actor; every policy of the library against the baselines;
- `call_path`: what one driver pays per call: `map`, a burst of `choose`, one call at a time;
- `hedged`: a batch with one slow actor, hedged calls against `ray.util.ActorPool`;
- `drivers`: several driver processes sharing one mesh;
- `kills`: thousands of small calls while an actor is killed every 200 ms.

Each scenario has a `name`, a `title`, `needs_fleet` (played on the shared actors of
`benchmarks.harness.cluster.Fleet`), `pending` (empty, or the library feature it waits for: a
pending scenario runs only when named by `--only`) and `run(ctx)`, which returns its results
section (`benchmarks.harness.section`). `--list` names them all.
"""

from __future__ import annotations

from typing import Any, Protocol

from benchmarks.config import Config
from benchmarks.harness.context import Context
from benchmarks.scenarios import balancing, call_path, drivers, hedged, kills


class Scenario(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def needs_fleet(self) -> bool: ...
    @property
    def pending(self) -> str: ...
    def run(self, ctx: Context) -> dict[str, Any]: ...


def build(cfg: Config) -> list[Scenario]:
    return [*balancing.build(cfg), *call_path.build(cfg), hedged.build(cfg), drivers.build(cfg),
            kills.build(cfg)]
