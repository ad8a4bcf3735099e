"""Where the JAX coordinator listens, and how the processes meet before they connect to it.

The port. A port found free and then closed can be taken by anyone before the coordinator binds
it (the race SkyRL fixed with retries). Here the `Rendezvous` actor, placed in rank 0's bundle,
binds port 0 (so the kernel picks a port no socket uses), then sets SO_REUSEPORT on that socket
and keeps it bound, without listening, until rank 0's `jax.distributed.initialize` has returned.
Meanwhile the kernel never hands the port to another `bind(0)`, any bind without SO_REUSEPORT
fails, and only a socket of the same user with SO_REUSEPORT may join: JAX's gRPC server sets it,
so the coordinator binds the held port beside the holder, which then closes. The port is never
free between the choice and the handover. `ACTORMESH_JAX_COORDINATOR_PORT` on the driver fixes
the port instead (nothing is held; rank 0 checks it is free before starting the coordinator).

The meeting. `jax.distributed.initialize` cannot fail politely: a coordinator that cannot bind
crashes its process, and a process that cannot reach the coordinator in time aborts. So every
process first checks in with the `Rendezvous` and calls `initialize` only once all have arrived.
A process whose set-up fails reports it there, and the others raise at once, naming it; a
process that never arrives (its actor failed to start) is named in the others' timeout error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import Callable
from typing import Any

import ray
import ray.actor

PORT_ENV = "ACTORMESH_JAX_COORDINATOR_PORT"

_exit_actor: Callable[[], None] = ray.actor.exit_actor


def port_override() -> int | None:
    """The port set in `ACTORMESH_JAX_COORDINATOR_PORT` on the driver, or None."""
    value = os.environ.get(PORT_ENV, "").strip()
    if not value:
        return None
    port = int(value) if value.isdigit() else -1
    if not 0 < port < 65536:
        raise ValueError(f"{PORT_ENV}={value!r}: must be a port number in 1..65535")
    return port


def _socket() -> tuple[socket.socket, str]:
    """A TCP socket on the wildcard address JAX's coordinator binds ([::], dual-stack) or IPv4."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        return sock, "::"
    except OSError:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"


def hold_free_port() -> socket.socket:
    """A socket bound to a port no other socket uses, open to SO_REUSEPORT binds of this user."""
    sock, host = _socket()
    sock.bind((host, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def check_port_free(port: int) -> None:
    """Raise OSError if JAX's coordinator could not bind `port` here (it would crash on it).

    The check binds as the coordinator does, with SO_REUSEPORT, so a port this user holds for it
    passes and a port bound by anyone else without SO_REUSEPORT fails.
    """
    sock, host = _socket()
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))


@dataclasses.dataclass(frozen=True)
class Arrival:
    """What `Rendezvous.arrive` returns: the port, or why a process could not join."""

    port: int
    failure: str | None = None


class Rendezvous:
    """An async Ray actor in rank 0's bundle: holds the port and gathers the processes."""

    def __init__(self, num_processes: int, port: int | None) -> None:
        self._sock: socket.socket | None = None
        if port is None:
            self._sock = hold_free_port()
            port = int(self._sock.getsockname()[1])
        self._port = port
        self._expected = num_processes
        self._arrived: set[int] = set()
        self._failure: str | None = None
        self._all_in = asyncio.Event()

    async def port(self) -> int:
        return self._port

    async def arrive(self, rank: int) -> Arrival:
        """Wait until every process has arrived (or one failed); then the port, or the failure."""
        self._arrived.add(rank)
        if len(self._arrived) == self._expected:
            self._all_in.set()
        await self._all_in.wait()
        return Arrival(self._port, self._failure)

    async def fail(self, rank: int, message: str) -> None:
        """Process `rank` cannot join: every waiting and later `arrive` returns `message`."""
        if self._failure is None:
            self._failure = f"JAX process {rank} failed before joining: {message}"
        self._all_in.set()

    async def missing(self) -> list[int]:
        return [r for r in range(self._expected) if r not in self._arrived]

    async def release(self) -> None:
        """Rank 0's coordinator owns the port now: close the held socket and end this actor."""
        if self._sock is not None:
            self._sock.close()
        _exit_actor()


def start_rendezvous(num_processes: int, port: int | None, scheduling_strategy: Any) -> Any:
    """Start the `Rendezvous` (0 CPUs) with `scheduling_strategy`; returns its handle, unwaited."""
    return ray.remote(Rendezvous).options(
        num_cpus=0, scheduling_strategy=scheduling_strategy, max_restarts=0
    ).remote(num_processes, port)
