"""The sections of `python -m benchmarks` that need no Ray: what one balancing decision costs
(`decision_cost`), the native balancer driving a simulated queue at a scale this machine cannot
hold (`sim`), and that simulation checked against queueing theory (`theory`).

They measure the library's policies that the pure-Python reference (`benchmarks/reference.py`)
also implements, since each is checked to make the reference's decisions (`POLICIES`)."""

from __future__ import annotations

from actormesh import _balancer
from benchmarks import reference

POLICIES: tuple[str, ...] = tuple(p for p in _balancer.POLICIES if p in reference.POLICIES)
