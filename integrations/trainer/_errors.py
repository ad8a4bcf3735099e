"""The trainer's public exceptions: each names the prompt (uid) or the state value at fault."""

from __future__ import annotations


class TrainerError(RuntimeError):
    """A run of `AsyncTrainer` stopped for a reason of its own (not an exception from `train`)."""


class RolloutError(TrainerError):
    """The rollout of one prompt failed on every attempt (raised, or ran past its timeout).

    `uid` is the prompt's index in `prompts`, `attempts` the number of tries made; `__cause__` is
    the last attempt's exception (a `TimeoutError` for a timeout).
    """

    def __init__(self, uid: int, attempts: int, reason: str) -> None:
        self.uid = uid
        self.attempts = attempts
        self.reason = reason
        tries = "once" if attempts == 1 else f"{attempts} times"
        super().__init__(f"rollout of uid {uid} failed {tries}: {reason}")

    def __reduce__(self) -> tuple[type[RolloutError], tuple[int, int, str]]:
        return (type(self), (self.uid, self.attempts, self.reason))
