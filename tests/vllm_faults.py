"""Engines whose weight loads fail when a test arms them (importable by the actor processes)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import ray

import actormesh as am
from actormesh.integrations.vllm import FakeEngine, _transfer
from actormesh.integrations.vllm._protocol import Blob
from actormesh.integrations.vllm._transfer import Formation

Fault = Literal["raise", "hang"]
ReceiveFault = Literal["hold", "die"]
"""How a FlakyEngine's next `receive_weights` goes wrong: "hold" waits for the Signal named
`HOLD_GATE` first; "die" ends the process after the first tensor arrives (mid-stream)."""

HOLD_GATE = "flaky-engine-hold-gate"

# While a Signal actor of this name lives (tests/workers.py), a restarted FlakyEngine waits in
# its constructor until the signal is sent: a test holds a restart back.
RESTART_GATE = "flaky-engine-restart-gate"


class FlakyEngine(FakeEngine):
    """A `FakeEngine` whose next weight loads fail as armed: "raise" at once, or "hang" until
    cancelled; whose next streamed receive is held or dies (`arm_receive`); whose next resume
    raises (`fail_next_resume`). Unarmed, it is a `FakeEngine`; a restarted one is unarmed."""

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
        self.receive_faults: list[ReceiveFault] = []
        self.resume_faults = 0

    @am.method
    async def load_weights(self, version: int, blobs: list[Blob]) -> int:
        if self.faults:
            fault = self.faults.pop(0)
            if fault == "raise":
                raise RuntimeError(f"engine {self._rank} could not load version {version}")
            await asyncio.Event().wait()
        return await super().load_weights(version, blobs)


    @am.method
    async def receive_weights(self, formation: Formation, extra: list[Blob],
                              version: int) -> int:
        if self.receive_faults:
            fault = self.receive_faults.pop(0)
            if fault == "hold":
                await ray.get_actor(HOLD_GATE).wait.remote()
            else:
                _die_after_first_tensor()
        return await super().receive_weights(formation, extra, version)

    @am.method
    async def resume(self) -> None:
        if self.resume_faults:
            self.resume_faults -= 1
            raise RuntimeError(f"engine {self._rank} could not resume (injected)")
        await super().resume()


def _die_after_first_tensor() -> None:
    real = _transfer.receive

    def dying(*args: Any) -> Iterator[tuple[str, Any]]:
        for item in real(*args):
            yield item
            os._exit(1)

    _transfer.receive = dying  # type: ignore[assignment]


def arm_receive(engine: FlakyEngine, *faults: ReceiveFault) -> None:
    """Run in the engine: its next streamed receives go wrong so."""
    engine.receive_faults.extend(faults)


def process_of(engine: Any) -> int:
    """Run in the engine: its process id (a restart changes it)."""
    return os.getpid()


def fail_next_resume(engine: FlakyEngine) -> None:
    """Run in the engine: its next resume raises."""
    engine.resume_faults += 1


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
