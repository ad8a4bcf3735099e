"""Engines whose weight loads fail when a test arms them (importable by the actor processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal

import ray

import actormesh as am
from actormesh.integrations.vllm import FakeEngine

Fault = Literal["raise", "hang"]

# While a Signal actor of this name lives (tests/workers.py), a restarted FlakyEngine waits in
# its constructor until the signal is sent: a test holds a restart back.
RESTART_GATE = "flaky-engine-restart-gate"


class FlakyEngine(FakeEngine):
    """A `FakeEngine` whose next weight loads fail as armed: "raise" at once, or "hang" until
    cancelled. Unarmed, it is a `FakeEngine`; a restarted one is unarmed."""

    def __init__(self, model: str, engine_args: Mapping[str, Any]) -> None:
        if ray.get_runtime_context().was_current_actor_reconstructed:
            try:
                gate = ray.get_actor(RESTART_GATE)
            except ValueError:  # no test holds restarts back
                gate = None
            if gate is not None:
                try:
                    ray.get(gate.wait.remote(), timeout=120)
                except ray.exceptions.RayActorError:  # the test ended and removed its gate
                    pass
        super().__init__(model, engine_args)
        self.faults: list[Fault] = []

    @am.method
    async def load_weights(self, blob: bytes, version: int) -> int:
        if self.faults:
            fault = self.faults.pop(0)
            if fault == "raise":
                raise RuntimeError(f"engine {self._rank} could not load version {version}")
            await asyncio.Event().wait()
        return await super().load_weights(blob, version)


def arm(engine: FlakyEngine, *faults: Fault) -> None:
    """Run in the engine (`mesh.run_in_actors(arm, "raise")`): its next loads fail so."""
    engine.faults.extend(faults)


def fail_next_load(engine: Any) -> None:
    """Run in a `VllmEngine`: its next weight load raises before it touches the model."""
    llm = engine._llm
    real = llm.collective_rpc

    async def once(method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "actormesh_load_weights":
            llm.collective_rpc = real
            raise RuntimeError("injected: the weights could not be loaded")
        return await real(method, *args, **kwargs)

    llm.collective_rpc = once
