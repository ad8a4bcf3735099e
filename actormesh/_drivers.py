"""Several drivers of one mesh: how each learns the calls the others have in flight.

A driver's scheduler counts its own calls exactly; alone, it would route as if no other driver
existed and herd onto the actors the others are busy with (four drivers that each see an actor
idle all send to it). So every driver of a named mesh (made with `name=`, joined with
`ActorMesh.connect`) takes part in `Shared`:

- On its host, a table in shared memory (`csrc/shared_load.hpp`): one row per driver, which that
  driver alone writes on every change of its counts, and which the others sum during a decision,
  at most every few hundred microseconds. No remote call per decision and no process in between.
- Across hosts, the mesh's `LoadRegistry` (a small actor its creator starts): every driver
  leaves its counts there and takes back the sum of the drivers on other hosts, off the hot path
  on the library's loop thread: every second while every driver shares one host (to notice one
  that joins from elsewhere), every 25 ms while they do not.

Why counts the drivers publish rather than what the actors report with each reply (calls
running, how long a call waited before it started): a synchronous actor cannot see the calls
Ray has queued for it, and a driver learns of a change only with its next reply from that
actor, a service time or more after it happened. Measured with 4 drivers on 8 actors at 80%
load (README, "Several drivers"): the table keeps the p99 at that of one driver sending
everything, while replies leave it where drivers that see only their own calls are.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import logging
import os
import tempfile
import threading
import time
import uuid
from typing import Any

import ray

from . import _loop, _native, _ray

log = logging.getLogger("actormesh")

_SHARED_MEMORY = "/dev/shm"
_ACTIVE_S = 0.025  # exchange period while the mesh's drivers run on more than one host
_IDLE_S = 1.0  # while they share one: only to notice a driver joining from another host
_CALL_S = 10.0  # an exchange that takes longer is abandoned (and tried again)
_EXPIRY_S = 5.0  # a driver that has not exchanged for this long has gone


def table_path(token: str) -> str:
    """The file of the load table named `token`, in shared memory where the host has it."""
    folder = _SHARED_MEMORY if os.path.isdir(_SHARED_MEMORY) else tempfile.gettempdir()
    return os.path.join(folder, f"actormesh-{token}")


class LoadRegistry:
    """Where the drivers of one mesh on different hosts meet: each leaves its calls in flight
    per actor, and takes back the sum of the drivers whose table (host) is not its own."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[int, list[int], float]] = {}  # driver -> table, counts, when

    def exchange(self, table: int, driver: str, calls: list[int]) -> tuple[list[int], int]:
        """Record `driver`'s `calls`; return the other hosts' calls per actor and how many
        hosts (tables) have drivers."""
        now = time.monotonic()
        self._rows[driver] = (table, calls, now)
        others = [0] * len(calls)
        tables = set()
        for name, (their_table, theirs, when) in list(self._rows.items()):
            if now - when > _EXPIRY_S:
                del self._rows[name]
                continue
            tables.add(their_table)
            if their_table != table:
                others = [a + b for a, b in zip(others, theirs)]
        return others, len(tables)

    def leave(self, driver: str) -> None:
        self._rows.pop(driver, None)


_Registry = ray.remote(num_cpus=0)(LoadRegistry)

# The tables this process's meshes created and has not removed yet: removed at exit too, when a
# creator ends without `shutdown()` (the file would outlive every driver in /dev/shm).
_own_tables: set[str] = set()
_own_tables_lock = threading.Lock()


def _remove_table(path: str) -> None:
    with _own_tables_lock:
        _own_tables.discard(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@atexit.register
def _remove_own_tables() -> None:
    with _own_tables_lock:
        paths = list(_own_tables)
    for path in paths:
        _remove_table(path)


class Shared:
    """This driver's part in sharing a mesh's load: its row in its host's table, and its
    exchange with the drivers of other hosts. `creator`: this driver made the mesh, and starts
    (and at the end stops) the registry and removes the table."""

    def __init__(self, scheduler: _native.Scheduler, token: str, registry: str, label: str, *,
                 creator: bool) -> None:
        self._scheduler = scheduler
        self._token = token
        self._registry = registry
        self._label = label
        self._creator = creator
        self._driver = uuid.uuid4().hex
        self._handle: Any = None
        try:
            scheduler.share_load(table_path(token))
        except RuntimeError as err:
            log.warning("actormesh: %s: cannot share the load with other drivers on this host "
                        "(%s); it is shared through the mesh's registry only", label, err)
            scheduler.share_load(None)
        if creator:
            with _own_tables_lock:
                _own_tables.add(table_path(token))
            try:
                self._handle = _Registry.options(name=registry).remote()
            except BaseException:
                scheduler.unshare_load()
                _remove_table(table_path(token))
                raise
        self._task: cf.Future[None] = _loop.submit(self._exchange())

    async def _exchange(self) -> None:
        """Every period: this driver's counts to the registry, the other hosts' back."""
        table = self._scheduler.load_table_id()
        while _ray.connected():  # after ray.shutdown() a call would start a new cluster
            period = _IDLE_S
            try:
                if self._handle is None:
                    self._handle = await asyncio.to_thread(ray.get_actor, self._registry)
                ref = self._handle.exchange.remote(table, self._driver,
                                                   self._scheduler.in_flight())
                others, tables = await asyncio.wait_for(asyncio.wrap_future(ref.future()),
                                                        _CALL_S)
                self._scheduler.set_remote_load(others)
                if tables > 1:
                    period = _ACTIVE_S
            except Exception as err:  # noqa: BLE001 - the registry is away: ask again later
                log.debug("actormesh: %s: exchanging load with other hosts failed: %s",
                          self._label, err)
                if not self._creator:
                    self._handle = None
            await asyncio.sleep(period)

    def leave(self) -> None:
        """Stop sharing: this driver's calls no longer count for the others, theirs no longer
        for it. The creator's leaving ends the registry and the table."""
        self._task.cancel()
        self._scheduler.unshare_load()
        handle, self._handle = self._handle, None
        if self._creator:
            _remove_table(table_path(self._token))
        if handle is None or not _ray.connected():  # Ray ended: the registry went with it
            return
        if self._creator:
            ray.kill(handle, no_restart=True)
        else:
            handle.leave.remote(self._driver)
