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
  that joins from elsewhere), every 25 ms while they do not. A registry that dies is started
  again by the first driver to miss it, as long as the mesh it serves is still published.

Both are the mesh's incarnation's (`_named.Record.incarnation`): a driver of a mesh that was shut
down never shares with a newer mesh of the same name. A table is removed by the last process
that leaves it, or, when its users were killed, by their janitor (`_janitor`, a process each
driver starts once and which outlives it), so no file outlives the processes that used it.

Why counts the drivers publish rather than what the actors report with each reply (calls
running, how long a call waited before it started): a synchronous actor cannot see the calls
Ray has queued for it, and a driver learns of a change only with its next reply from that
actor, a service time or more after it happened. Measured with 4 drivers on 8 actors at 80%
load (README, "Several drivers"): the table keeps the p99 at that of one driver sending
everything, while replies leave it where drivers that see only their own calls are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import ray

from . import _loop, _named, _native, _ray

log = logging.getLogger("actormesh")

_SHARED_MEMORY = "/dev/shm"
_PREFIX = "actormesh-load-"  # of every table: what a janitor sweeps
_ACTIVE_S = 0.025  # exchange period while the mesh's drivers run on more than one host
_IDLE_S = 1.0  # while they share one: only to notice a driver joining from another host
_CALL_S = 10.0  # an exchange that takes longer is abandoned (and tried again)
_EXPIRY_S = 5.0  # a driver that has not exchanged for this long has gone


def _table_folder() -> str:
    return _SHARED_MEMORY if os.path.isdir(_SHARED_MEMORY) else tempfile.gettempdir()


def table_path(token: str) -> str:
    """The file of the load table named `token`, in shared memory where the host has it."""
    return os.path.join(_table_folder(), _PREFIX + token)


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

_JANITOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_janitor.py")
# This process's janitor, and the tables it uses (told again to a janitor started anew).
_janitor: subprocess.Popen[bytes] | None = None
_tables: set[str] = set()
_tables_lock = threading.Lock()


def _watch(path: str) -> None:
    """Have this process's janitor remove the table at `path` once no process uses it, even
    after this process is killed."""
    global _janitor
    with _tables_lock:
        _tables.add(path)
        try:
            if _janitor is None or _janitor.poll() is not None:
                _janitor = subprocess.Popen(
                    [sys.executable, "-I", "-S", _JANITOR, _table_folder(), _PREFIX],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, cwd="/", start_new_session=True)
                told = _tables
            else:
                told = {path}
            assert _janitor.stdin is not None
            _janitor.stdin.write(b"".join(os.fsencode(p) + b"\n" for p in told))
            _janitor.stdin.flush()
        except OSError as err:
            log.warning("actormesh: cannot start the janitor of the drivers' load tables (%s): "
                        "a table this process uses stays in %s if it is killed", err,
                        os.path.dirname(path))


def _unwatch(path: str) -> None:
    with _tables_lock:
        _tables.discard(path)


class Shared:
    """This driver's part in sharing a mesh's load: its row in its host's table, and its
    exchange with the drivers of other hosts. `creator`: this driver made the mesh, and starts
    (and at the end stops) the registry."""

    def __init__(self, scheduler: _native.Scheduler, record: _named.Record, label: str, *,
                 creator: bool) -> None:
        self._scheduler = scheduler
        self._record = record
        self._registry = _named.registry_name(record)
        self._label = label
        self._creator = creator
        self._driver = uuid.uuid4().hex
        self._handle: Any = None  # the registry this driver exchanges with; None: look it up
        # The registry this driver started, held for as long as it shares: Ray ends an actor
        # whose starter holds no handle of it, named or not.
        self._started: Any = None
        self._path: str | None = table_path(record.table)
        try:
            scheduler.share_load(self._path)
        except RuntimeError as err:
            log.warning("actormesh: %s: cannot share the load with other drivers on this host "
                        "(%s); it is shared through the mesh's registry only", label, err)
            scheduler.share_load(None)
            self._path = None
        else:
            _watch(self._path)
        if creator:
            try:
                self._started = self._handle = _Registry.options(name=self._registry).remote()
            except BaseException:
                self._unshare()
                raise
        self._task: cf.Future[None] = _loop.submit(self._exchange())

    async def _exchange(self) -> None:
        """Every period: this driver's counts to the registry, the other hosts' back."""
        table = self._scheduler.load_table_id()
        while _ray.connected():  # after ray.shutdown() a call would start a new cluster
            period = _IDLE_S
            try:
                if self._handle is None:
                    self._handle = await asyncio.to_thread(self._find_registry)
                    if self._handle is None:
                        log.info("actormesh: %s: the mesh was shut down by its creator; this "
                                 "driver no longer shares its load", self._label)
                        self._scheduler.set_remote_load([0] * self._record.shape.size)
                        return
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
                self._handle = None
            await asyncio.sleep(period)

    def _find_registry(self) -> Any:
        """The mesh's registry, started anew if it died; None once the mesh is gone (shut down,
        or its name taken by a newer mesh), whose drivers this one must not count."""
        try:
            return ray.get_actor(self._registry)
        except ValueError:
            pass
        if not _named.is_current(self._record):
            return None
        handle: Any = _Registry.options(name=self._registry, get_if_exists=True).remote()
        if not _named.is_current(self._record):  # shut down meanwhile: leave nothing behind
            ray.kill(handle, no_restart=True)
            return None
        log.warning("actormesh: %s: the load registry of the mesh was gone; it runs again",
                    self._label)
        self._started = handle
        return handle

    def _unshare(self) -> None:
        self._scheduler.unshare_load()  # the last user of the table removes it
        if self._path is not None:
            _unwatch(self._path)

    def leave(self) -> None:
        """Stop sharing: this driver's calls no longer count for the others, theirs no longer
        for it. The creator's leaving ends the registry."""
        self._task.cancel()
        self._unshare()
        handle, self._handle, self._started = self._handle, None, None
        if not _ray.connected():  # Ray ended: the registry went with it
            return
        if self._creator:
            try:  # whichever registry runs now: a driver may have started it anew
                handle = ray.get_actor(self._registry)
            except ValueError:
                return
            ray.kill(handle, no_restart=True)
        elif handle is not None:
            handle.leave.remote(self._driver)
