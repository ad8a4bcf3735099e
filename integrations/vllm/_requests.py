"""The resend bookkeeping of one pool request: what the caller asked, what engines produced.

A `Sequence` is one sample being generated. Each time an engine answers, its `Piece` is added:
finished, the sequence is done; cut (an abort), the tokens so far stay and the next
`SubRequest` asks for the rest (prompt + tokens so far, `max_tokens` and `min_tokens` reduced).
An engine that died loses its piece: the sequence is resent from what the pool already has.
Pure logic, no Ray: the property tests drive it directly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from typing import Any, Literal

from ._protocol import Piece, SubRequest

DEFAULT_MAX_TOKENS = 16  # vLLM's own default


def _non_negative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _token_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(_non_negative_int(t) for t in value)


def _in(low: float, high: float, *, open_low: bool = False) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return _number(value) and (value > low if open_low else value >= low) and value <= high
    return check


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seed(value: Any) -> bool:
    return value is None or _int(value)


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


SAMPLING_FIELDS: dict[str, Callable[[Any], bool]] = {
    "max_tokens": _non_negative_int,
    "min_tokens": _non_negative_int,
    "temperature": _in(0.0, math.inf),
    "top_p": _in(0.0, 1.0, open_low=True),
    "top_k": lambda v: _int(v) and (v == -1 or v >= 0),
    "min_p": _in(0.0, 1.0),
    "seed": _seed,
    "stop_token_ids": _token_list,
    "ignore_eos": _flag,
    "repetition_penalty": _in(0.0, math.inf, open_low=True),
}
"""The `SamplingParams` fields a pool request may set. Left out on purpose: `n` (use
`generate_group`), `logprobs` (always the sampled token's), text-level fields (tokens in, tokens
out), and presence / frequency penalties, which count only the tokens generated in the current
engine request and so would change after a resend."""


def check_sampling(sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    """The sampling settings as a plain dict, `max_tokens` filled in; a ValueError names a field
    the pool does not take or a value of the wrong kind."""
    if sampling is None:
        sampling = {}
    if not isinstance(sampling, Mapping):
        raise TypeError(f"sampling={sampling!r}: must be a mapping of SamplingParams fields")
    out = dict(sampling)
    for name, value in out.items():
        check = SAMPLING_FIELDS.get(name)
        if check is None:
            raise ValueError(
                f"sampling field {name!r} is not supported by the pool; use {sorted(SAMPLING_FIELDS)}"
            )
        if not check(value):
            raise ValueError(f"sampling {name}={value!r}: not a valid value")
    out.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    if out["max_tokens"] < 1:
        raise ValueError(f"sampling max_tokens={out['max_tokens']!r}: must be >= 1")
    if "stop_token_ids" in out:
        out["stop_token_ids"] = list(out["stop_token_ids"])
    return out


def check_prompt(prompt_token_ids: Any) -> list[int]:
    """The prompt as a list of ints; a ValueError names what is wrong with it."""
    if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Seq):
        raise TypeError(
            f"prompt_token_ids must be a sequence of token ids, got {type(prompt_token_ids).__name__}"
        )
    tokens = list(prompt_token_ids)
    if not tokens:
        raise ValueError("prompt_token_ids is empty")
    for i, token in enumerate(tokens):
        if not _non_negative_int(token):
            raise ValueError(f"prompt_token_ids[{i}]={token!r}: must be an int >= 0")
    return tokens


@dataclasses.dataclass(frozen=True)
class Generation:
    """A finished request: the tokens, the log-probability and weight version of each, why it
    stopped (`"stop"` or `"length"`, never `"abort"`), the engine that finished it, and how many
    times it was cut and resent (aborts with tokens, and failovers)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    weight_versions: list[int]
    engine: int
    interruptions: int


class Sequence:
    """One sample in generation: the caller's prompt and settings, and what engines produced."""

    __slots__ = ("prompt", "sampling", "tokens", "logprobs", "versions", "finish_reason",
                 "engine", "interruptions")

    def __init__(self, prompt: list[int], sampling: dict[str, Any]) -> None:
        self.prompt = prompt
        self.sampling = sampling
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.finish_reason: Literal["stop", "length"] | None = None
        self.engine = -1
        self.interruptions = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return int(self.sampling["max_tokens"]) - len(self.tokens)

    def request(self, key: str) -> SubRequest:
        """What to send an engine now: the prompt and the tokens so far, asking for the rest."""
        sampling = dict(self.sampling)
        sampling["max_tokens"] = self.remaining
        if "min_tokens" in sampling:
            sampling["min_tokens"] = max(0, int(sampling["min_tokens"]) - len(self.tokens))
        return SubRequest(key, self.prompt + self.tokens, sampling)

    def add(self, piece: Piece) -> None:
        """Take an engine's answer. A cut that brought tokens counts as an interruption; an
        empty one (cut before its first token) does not."""
        if self.done:
            raise RuntimeError("a finished sequence was sent again")
        if len(piece.token_ids) > self.remaining:
            raise RuntimeError(
                f"engine {piece.engine} returned {len(piece.token_ids)} tokens for a request "
                f"of {self.remaining}"
            )
        self.tokens.extend(piece.token_ids)
        self.logprobs.extend(piece.logprobs)
        self.versions.extend(piece.versions)
        self.engine = piece.engine
        if piece.finish_reason != "abort":
            self.finish_reason = piece.finish_reason
        elif self.remaining == 0:  # cut as it produced its last token
            self.finish_reason = "length"
        elif piece.token_ids:
            self.interruptions += 1

    def lost(self) -> None:
        """Its engine died: whatever that engine produced is gone; it will be resent."""
        self.interruptions += 1

    def result(self) -> Generation:
        if self.finish_reason is None:
            raise RuntimeError("the sequence is not finished")
        return Generation(list(self.tokens), list(self.logprobs), self.finish_reason,
                          list(self.versions), self.engine, self.interruptions)


def group(prompt: list[int], sampling: dict[str, Any], n: int) -> list[Sequence]:
    """`n` samples of one prompt; with a seed, sample i uses seed + i (as vLLM's own `n` does)."""
    samples = []
    for i in range(n):
        params = dict(sampling)
        if params.get("seed") is not None:
            params["seed"] = int(params["seed"]) + i
        samples.append(Sequence(prompt, params))
    return samples
