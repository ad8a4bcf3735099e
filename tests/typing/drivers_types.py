"""Checked by pyright and mypy (`make typecheck`), never run: `ActorMesh.connect` is typed by the
class it is given, and `ActorMesh[Any]` without one.

Each `assert_type` must hold; each line marked `# type: ignore[...]` MUST be rejected.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

import actormesh as am


class Engine:
    @am.method
    def generate(self, prompt: list[int]) -> list[int]:
        return prompt

    @am.method
    async def stats(self) -> dict[str, int]:
        return {}


typed = am.ActorMesh.connect("engines", Engine)
assert_type(typed, am.ActorMesh[Engine])
assert_type(typed.methods.generate.choose([1, 2]).get(), list[int])
assert_type(typed.methods.stats.all().get(), am.ValueMesh[dict[str, int]])
assert_type(am.ActorMesh.connect("engines", Engine, balancer="pull", max_in_flight=2,
                                 coalesce=1), am.ActorMesh[Engine])
assert_type(am.ActorMesh.connect("engines"), am.ActorMesh[Any])
assert_type(typed.load()[0], int)
assert_type(typed.load().actors[0].others, int)

# These MUST be rejected.
typed.methods.generate.choose("not tokens")  # type: ignore[arg-type]
am.ActorMesh.connect(3)  # type: ignore[call-overload]
am.ActorMesh.connect("engines", Engine, max_in_flight="two")  # type: ignore[call-overload]
am.ActorMesh.connect("engines", name="engines")  # type: ignore[call-overload]
