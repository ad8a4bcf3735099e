"""Removes the load tables of a driver (`_drivers`) once no process uses them, SIGKILL included.

A driver that leaves a table last removes it itself (csrc/shared_load.hpp); one that is killed
cannot. So each driver process that shares a table starts this script once, as a process of its
own that outlives it:

    python -I -S _janitor.py FOLDER PREFIX

It reads the paths of the driver's tables on stdin, one a line, and removes each once no process
uses it: every user of a table holds a read lock on its users byte, which the kernel drops with
the process, so a table on which this script can take a write lock has none. It exits once its
driver has gone (end of stdin) and every table it watched is gone. When it starts, it also
removes the unused tables it finds in FOLDER whose names start with PREFIX (left by processes
whose janitor was killed as well). Standard library only: it must start in milliseconds and
import nothing of the driver's.
"""

from __future__ import annotations

import fcntl
import os
import select
import sys
import time

USERS_BYTE = 64  # SharedLoad::kUsersByte
MAGIC = 0x316D6174  # SharedLoad::kMagic, at byte 4 of every table
PERIOD_S = 0.5  # how often the watched tables are checked


def remove_if_unused(path: str) -> bool:
    """Remove the table at `path` if no process uses it; whether it is gone (or is not a table
    this script may remove)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:  # another user's file
        return True
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, USERS_BYTE)
        except OSError:
            return False  # a user holds it
        header = os.pread(fd, 8, 0)
        # An empty or zeroed header: a table whose first user has not sized or marked it yet.
        if header.strip(b"\0") and int.from_bytes(header[4:8], sys.byteorder) != MAGIC:
            return True
        opened = os.fstat(fd)
        try:
            named = os.stat(path)
        except FileNotFoundError:
            return True
        if (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino):
            os.unlink(path)
        return True
    finally:
        os.close(fd)  # drops the write lock: a joiner that waited opens a new table


def sweep(folder: str, prefix: str) -> None:
    """Remove every unused table in `folder` whose name starts with `prefix`."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            remove_if_unused(os.path.join(folder, name))


def main() -> None:
    folder, prefix = sys.argv[1], sys.argv[2]
    sweep(folder, prefix)
    watched: set[str] = set()
    pending = b""
    driver_alive = True
    while driver_alive or watched:
        if driver_alive:
            ready, _, _ = select.select([0], [], [], PERIOD_S)
            if ready:
                data = os.read(0, 65536)
                driver_alive = bool(data)
                *lines, pending = (pending + data).split(b"\n")
                watched.update(os.fsdecode(line) for line in lines if line)
        else:
            time.sleep(PERIOD_S)
        watched = {path for path in watched if not remove_if_unused(path)}


if __name__ == "__main__":
    main()
