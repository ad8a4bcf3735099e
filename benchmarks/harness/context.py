"""What a scenario is given to run: the sizes, a progress line, the shared fleet, and actors that
later scenarios may reuse (starting an actor costs about half a second here)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

from benchmarks.config import Config
from benchmarks.harness.cluster import Fleet

log = logging.getLogger(__name__)


class Closable(Protocol):
    def shutdown(self) -> None: ...


C = TypeVar("C", bound=Closable)


@dataclasses.dataclass
class Context:
    cfg: Config
    progress: Callable[[str], None]
    fleet: Fleet | None = None  # the balancing scenarios' actors and contenders
    _shared: dict[str, Closable] = dataclasses.field(default_factory=dict)

    def shared(self, key: str, make: Callable[[], C]) -> C:
        """What `make()` returned the first time `key` was asked for; shut down by `close`."""
        if key not in self._shared:
            self._shared[key] = make()
        return cast(C, self._shared[key])

    def close(self) -> None:
        """Shut down everything `shared` made, newest first."""
        for key in reversed(list(self._shared)):
            try:
                self._shared.pop(key).shutdown()
            except Exception:  # one failed shutdown must not keep the rest alive
                log.exception("shutting down %s", key)
