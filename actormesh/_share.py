"""Put an argument that goes to several actors into the object store once.

Ray copies an argument into each call's request, or puts it again for each call when it is
larger than its inline limit; a batch broadcast to N actors would be written N times. Here every
large top-level argument sent to more than one actor is put once and each call gets its ref.
Arguments are matched by identity, so `all` (the same arguments everywhere) and a dispatch that
shares a chunk by passing the same object go through the same path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray

# Ray inlines arguments up to 100 KiB into the call itself; above that it writes each copy to the
# object store, which is what putting once avoids.
LARGE_BYTES = 100 * 1024
LARGE_LEN = 10_000

Plan = Mapping[int, tuple[tuple[Any, ...], dict[str, Any]]]


def is_large(value: Any) -> bool:
    """A cheap size estimate that never serialises the value."""
    if isinstance(value, (bytes, bytearray, str)):
        return len(value) >= LARGE_BYTES
    nbytes = getattr(value, "nbytes", None)  # numpy, torch, jax arrays and memoryview
    if isinstance(nbytes, int):
        return nbytes >= LARGE_BYTES
    if isinstance(value, (list, tuple, dict, set)):
        return len(value) >= LARGE_LEN
    return False


def share_plan(plan: Plan) -> dict[int, tuple[tuple[Any, ...], dict[str, Any]]]:
    """Per-actor arguments with every large object that appears for several actors put once."""
    seen: dict[int, int] = {}
    for args, kwargs in plan.values():
        for value in (*args, *kwargs.values()):
            seen[id(value)] = seen.get(id(value), 0) + 1
    refs: dict[int, Any] = {}

    def shared(value: Any) -> Any:
        key = id(value)
        if seen[key] < 2 or not is_large(value):
            return value
        if key not in refs:
            refs[key] = ray.put(value)
        return refs[key]

    return {
        pos: (tuple(shared(a) for a in args), {k: shared(v) for k, v in kwargs.items()})
        for pos, (args, kwargs) in plan.items()
    }

