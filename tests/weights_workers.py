"""A trainer's process for the weight-sender tests: it holds a `WeightSender` (pickled into it)
and sends from here, as a trainer's rank 0 does (importable by the actor processes)."""

from __future__ import annotations

import os
from typing import Any

import actormesh as am
from actormesh.integrations.vllm import WeightSender, _transfer


class Trainer:
    """Sends weights to a pool's engines from its own process."""

    def __init__(self, sender: WeightSender) -> None:
        self.sender = sender

    @am.method
    def send(self, weights: dict[str, Any], version: int | None = None,
             timeout: float | None = None) -> int:
        return self.sender.send(weights, version=version, timeout=timeout)

    @am.method
    def send_and_die(self, weights: dict[str, Any], after_buckets: int) -> int:
        """Send, and end this process once `after_buckets` buckets are out (mid-send)."""
        real = _transfer.send_bucket
        sent = 0

        def dying(*args: Any) -> None:
            nonlocal sent
            if sent == after_buckets:
                os._exit(1)
            sent += 1
            real(*args)

        _transfer.send_bucket = dying  # type: ignore[assignment]
        return self.sender.send(weights)
