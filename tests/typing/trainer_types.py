"""Checked by pyright and mypy (`make typecheck`), never run: the typed surface of the trainer.

Each `assert_type` must hold. Each line marked `# type: ignore[...]` MUST be rejected: with
unused-ignore reporting on in both checkers, a line that type-checks fails the check.
"""

from __future__ import annotations

import dataclasses

from typing_extensions import assert_type

# Type checkers read the source tree, where `actormesh.integrations` is the top-level integrations/
# folder (the mapping into the package exists only in the installed wheel and editable hook).
from integrations.trainer import AsyncTrainer, Counters, StepMetrics, TrainerState


@dataclasses.dataclass
class Group:
    uid: int
    rewards: list[float]


async def rollout(prompt: str, uid: int) -> Group | None:
    return Group(uid, [float(len(prompt))])


def train(groups: list[Group], step: int) -> float:
    return sum(sum(g.rewards) for g in groups)


async def train_async(groups: list[Group], step: int) -> None: ...


async def sync_weights(version: int) -> None: ...


def watch(counters: Counters) -> None: ...


prompts = ["a", "bb", "ccc"]
trainer = AsyncTrainer(prompts, rollout, train, batch_size=2, max_staleness=2,
                       sync_weights=sync_weights, on_transition=watch)
assert_type(trainer, AsyncTrainer[Group])
assert_type(AsyncTrainer(prompts, rollout, train_async, batch_size=2), AsyncTrainer[Group])
metrics = trainer.run(max_steps=3)
assert_type(metrics, list[StepMetrics])
assert_type(metrics[0]["staleness"], list[int])
assert_type(metrics[0]["uids"], list[int])
assert_type(metrics[0]["train_s"], float)
assert_type(trainer.state_dict(), TrainerState)
assert_type(trainer.state_dict()["consumed"], list[int])


async def main() -> None:
    assert_type(await trainer.run_async(), list[StepMetrics])


def train_ints(groups: list[int], step: int) -> None: ...


async def rollout_ints(prompt: int, uid: int) -> int | None:
    return prompt


# Prompts must fit the rollout's first parameter, groups the train's.
AsyncTrainer([1, 2], rollout, train, batch_size=2)  # type: ignore[arg-type]
AsyncTrainer([1, 2], rollout_ints, train, batch_size=2)  # type: ignore[misc]
AsyncTrainer(prompts, rollout, train, batch_size="2")  # type: ignore[arg-type]
AsyncTrainer(prompts, rollout, train, 2)  # type: ignore[call-arg]
trainer.run(max_steps="3")  # type: ignore[arg-type]
metrics[0]["loss"]  # type: ignore[typeddict-item]
