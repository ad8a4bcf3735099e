"""Several drivers of one mesh: how each learns the calls the others have in flight.

A driver's scheduler counts its own calls exactly; on its own it would route as if it were alone
and herd onto the actors the other drivers are busy with (four drivers that each see an actor
idle all send to it). So every driver of a named mesh (made with `name=`, joined with
`ActorMesh.connect`) publishes its counts and reads the others' from a table in shared memory on
its host, `csrc/shared_load.hpp`: one row per driver that it alone writes, on every change, and
that the others sum during a decision, at most every few hundred microseconds. No remote call
per decision and no process in between: the table is where the counts are.

The alternative, learning the others' load from what the actors report with each reply (calls
running, how long a call waited before it started), was measured against this one
(/work/probes/drivers_probe.py, README "Several drivers"): a synchronous actor cannot see the
calls Ray queues for it, and a driver learns of a change only with its next reply from that
actor, tens of milliseconds late at the rates where herding hurts.
"""

from __future__ import annotations

import logging
import os
import tempfile

from . import _native

log = logging.getLogger("actormesh")

_SHARED_MEMORY = "/dev/shm"


def table_path(token: str) -> str:
    """The file of the load table named `token`, in shared memory where the host has it."""
    folder = _SHARED_MEMORY if os.path.isdir(_SHARED_MEMORY) else tempfile.gettempdir()
    return os.path.join(folder, f"actormesh-{token}")


def share(scheduler: _native.Scheduler, token: str, label: str) -> None:
    """Make `scheduler` publish its counts to the table `token` and count the other drivers'.
    A table that cannot be used (no shared memory, every row taken) is logged: the driver then
    routes on its own counts only, as a mesh of its own would."""
    try:
        scheduler.share_load(table_path(token))
    except RuntimeError as err:
        log.warning("actormesh: %s: cannot share the load with other drivers (%s); this driver "
                    "sees only its own calls", label, err)
        scheduler.share_load(None)


def remove_table(token: str) -> None:
    """Remove the table file (the mesh is gone). Drivers that still map it keep their mapping."""
    try:
        os.unlink(table_path(token))
    except FileNotFoundError:
        pass
