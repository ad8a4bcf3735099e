"""What a trainer has committed: its epoch, the steps trained, the prompts consumed or filtered.

Progress moves only when a step's `train` returns (or when an epoch ends on filtered prompts), so
it always describes a prefix of the epoch's permutation: `consumed` and `filtered` together are
exactly its first `cursor` uids. That prefix is the whole resumable state; groups generated past
it (buffered, or still running when a run stops) are generated again by the next run.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any, TypedDict

STATE_FORMAT = 1


def epoch_order(num_prompts: int, seed: int, epoch: int) -> list[int]:
    """The uids of `epoch` in the order every loop visits them: a permutation seeded by both.

    Seeded by a string so that (seed, epoch) pairs never collide and the order is the same on
    every machine and Python version (`random.Random` hashes a str seed with SHA-512).
    """
    order = list(range(num_prompts))
    random.Random(f"actormesh.trainer/{seed}/{epoch}").shuffle(order)
    return order


class EpochCounters(TypedDict):
    """The admission counters of the current epoch at a clean stop (nothing running)."""

    submitted: int
    accepted: int
    filtered: int
    trained: int


class TrainerState(TypedDict):
    """`AsyncTrainer.state_dict()`: plain ints and lists, safe to pickle or write as JSON."""

    format: int
    num_prompts: int
    seed: int
    epoch: int
    step: int
    epoch_step: int
    consumed: list[int]
    filtered: list[int]
    counters: EpochCounters


@dataclasses.dataclass
class Progress:
    """The committed position of a trainer in its epochs (see the module docstring)."""

    num_prompts: int
    seed: int
    epoch: int = 0
    step: int = 0
    epoch_step: int = 0
    consumed: list[int] = dataclasses.field(default_factory=list)
    filtered: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.order = epoch_order(self.num_prompts, self.seed, self.epoch)

    @property
    def cursor(self) -> int:
        """The position in `order` of the first prompt not yet consumed or filtered."""
        return len(self.consumed) + len(self.filtered)

    @property
    def epoch_done(self) -> bool:
        return self.cursor == self.num_prompts

    def commit(self, consumed: list[int], filtered: list[int], *, trained: bool) -> None:
        """Record the next span of the permutation: a trained step, or (trained=False) the
        filtered prompts that end an epoch without a step."""
        self.consumed.extend(consumed)
        self.filtered.extend(filtered)
        if trained:
            self.step += 1
            self.epoch_step += 1

    def next_epoch(self) -> None:
        self.epoch += 1
        self.epoch_step = 0
        self.consumed = []
        self.filtered = []
        self.order = epoch_order(self.num_prompts, self.seed, self.epoch)

    def state(self) -> TrainerState:
        """The progress as plain data; a finished epoch is reported as the next one, not begun."""
        done = self.epoch_done
        consumed = [] if done else list(self.consumed)
        filtered = [] if done else list(self.filtered)
        accepted = len(consumed)
        return TrainerState(
            format=STATE_FORMAT,
            num_prompts=self.num_prompts,
            seed=self.seed,
            epoch=self.epoch + done,
            step=self.step,
            epoch_step=0 if done else self.epoch_step,
            consumed=consumed,
            filtered=filtered,
            counters=EpochCounters(
                submitted=accepted + len(filtered), accepted=accepted, filtered=len(filtered),
                trained=accepted,
            ),
        )

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, num_prompts: int, seed: int) -> Progress:
        """Check a state against this trainer's prompts and seed, and rebuild its progress.

        Raises `ValueError` naming the first field that is missing, of the wrong kind, or
        inconsistent (uids that are not the start of the epoch's permutation, counters that do
        not match the uids: resuming from those would lose prompts or inflate the capacity).
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping from state_dict(), got {type(state).__name__}")
        missing = sorted(set(TrainerState.__annotations__) - set(state))
        if missing:
            raise ValueError(f"trainer state: missing {', '.join(missing)}")
        if state["format"] != STATE_FORMAT:
            raise ValueError(f"trainer state: format {state['format']!r}, expected {STATE_FORMAT}")
        for key in ("num_prompts", "seed", "epoch", "step", "epoch_step"):
            if type(state[key]) is not int:
                raise ValueError(f"trainer state: {key}={state[key]!r} is not an int")
        for key, expected in (("num_prompts", num_prompts), ("seed", seed)):
            if state[key] != expected:
                raise ValueError(
                    f"trainer state: {key}={state[key]} but this trainer has {key}={expected}")
        epoch, step, epoch_step = state["epoch"], state["step"], state["epoch_step"]
        if epoch < 0 or not 0 <= epoch_step <= step:
            raise ValueError(f"trainer state: epoch={epoch}, step={step}, epoch_step={epoch_step}"
                             ": need epoch >= 0 and 0 <= epoch_step <= step")
        lists = {key: state[key] for key in ("consumed", "filtered")}
        for key, uids in lists.items():
            if not isinstance(uids, list) or any(type(u) is not int for u in uids):
                raise ValueError(f"trainer state: {key} must be a list of int uids, got {uids!r}")
        consumed, filtered = lists["consumed"], lists["filtered"]
        progress = cls(num_prompts, seed, epoch, step, epoch_step, list(consumed), list(filtered))
        prefix = progress.order[: progress.cursor]
        if progress.epoch_done:
            raise ValueError(f"trainer state: consumed and filtered uids cover all of epoch {epoch}"
                             "; state_dict() reports a finished epoch as the next one")
        if sorted(consumed + filtered) != sorted(prefix):
            raise ValueError(
                f"trainer state: consumed and filtered uids of epoch {epoch} "
                f"({len(consumed)} + {len(filtered)}) are not the first uids of its permutation")
        if bool(consumed) != bool(epoch_step):
            raise ValueError(f"trainer state: epoch_step={epoch_step} with {len(consumed)} "
                             "consumed uids in the epoch")
        counters = state["counters"]
        if counters != progress.state()["counters"]:
            raise ValueError(f"trainer state: counters {counters!r} do not match the uids "
                             f"(expected {progress.state()['counters']!r})")
        return progress
