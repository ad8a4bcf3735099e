"""Checkpoint writes from a multi-process JAX program: one writer per file system, atomic writes.

Every process of a data-parallel program holds the same parameters, and each would save them. On
a shared file system (NFS, a mounted bucket) that is N writers racing on one file; on node-local
disks every node needs its own copy. `save` finds out which case it is in, per call, by probing
the target directory: each process drops a probe file named with a token drawn by process 0,
all wait at a barrier, and each lists the probes it can see. Processes that see each other's
probes share a file system, and the lowest-ranked of them writes. On a shared file system that is
process 0 and every other process sees its probe and skips; with node-local paths each node (or
each process, for per-process directories) writes its own copy.

All functions except `atomic_write` are collective: every process of the program calls them, in
the same order.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Callable
from typing import BinaryIO

import numpy as np

PathLike = str | os.PathLike[str]
Data = bytes | bytearray | memoryview | Callable[[BinaryIO], object]
"""The bytes to write, or a function that writes them to an open binary file.

A function runs only in the processes that write, so pass one when producing the bytes costs
(e.g. `lambda f: pickle.dump(jax.device_get(params), f)` for fully replicated params).
"""

PROBE_PREFIX = ".actormesh-probe-"


def atomic_write(path: PathLike, data: Data) -> None:
    """Write `path` through a temporary file in the same directory, then rename it into place.

    A reader sees the old file or the complete new one, never a partial write; a failed write
    leaves no temporary file behind.
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as file:
            if isinstance(data, (bytes, bytearray, memoryview)):
                file.write(data)
            else:
                data(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # make the rename itself durable
    finally:
        os.close(directory_fd)


def is_writer(directory: PathLike) -> bool:
    """Collective: True in exactly one process among those that share `directory`'s file system.

    That process is the lowest-ranked one whose probe file the others can see, so on a shared
    file system it is process 0. Creates `directory` if needed; leaves no probe file behind. A
    process that cannot probe still takes part in every barrier, then raises its error.
    """
    import jax

    rank = jax.process_index()
    if jax.process_count() == 1:
        return True
    directory = os.path.abspath(os.fspath(directory))
    prefix = f"{PROBE_PREFIX}{_token()}-"
    probe = os.path.join(directory, f"{prefix}{rank}")
    error: OSError | None = None
    seen: list[int] = []
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb"):
            pass
    except OSError as err:
        error = err
    _barrier(f"{prefix}written")
    if error is None:
        try:
            seen = [int(name[len(prefix):]) for name in os.listdir(directory)
                    if name.startswith(prefix)]
        except OSError as err:
            error = err
    _barrier(f"{prefix}listed")  # nobody removes a probe before everyone has looked
    with contextlib.suppress(FileNotFoundError):
        os.unlink(probe)
    if error is not None:
        raise error
    return min(seen) == rank


def save(path: PathLike, data: Data) -> bool:
    """Collective: write `data` to `path` atomically, once per file system; True where written.

    When it returns, in any process, the file is complete at `path` for every process that shares
    the writer's file system. If a process fails to probe or to write, every process raises,
    naming the ones that failed.
    """
    from jax.experimental import multihost_utils

    path = os.path.abspath(os.fspath(path))
    failure: Exception | None = None
    writer = False
    try:
        writer = is_writer(os.path.dirname(path))
        if writer:
            atomic_write(path, data)
    except Exception as err:
        failure = err
    failed = np.asarray(multihost_utils.process_allgather(np.array([failure is not None])))
    if failed.any():
        ranks = [int(r) for r in np.flatnonzero(failed.reshape(-1))]
        detail = f": {type(failure).__name__}: {failure}" if failure is not None else ""
        raise RuntimeError(
            f"checkpoint {path}: the write failed in process(es) {ranks}{detail}"
        ) from failure
    return writer


def _token() -> str:
    """A random token drawn by process 0 and known to every process (names one probe round)."""
    from jax.experimental import multihost_utils

    words = np.frombuffer(secrets.token_bytes(16), dtype=np.uint32)
    shared = multihost_utils.broadcast_one_to_all(words)
    return "".join(f"{int(w):08x}" for w in np.asarray(shared))


def _barrier(name: str) -> None:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
