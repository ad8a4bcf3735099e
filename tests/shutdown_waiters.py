"""Readers waiting for calls when `ray.shutdown()` runs, in a driver process of its own that
joins the cluster at the address it is given (the tests' session cluster: `ray.shutdown()` ends
this driver, not the cluster). Run by tests/test_errors.py; prints one JSON line: what each
reader raised.

Ray raises `SystemExit` in a thread other than the main one that waits in `ray.get` while the
core worker shuts down; a mesh's reader raises a `MeshError` saying Ray shut down instead. A
reader that never returns is reported with where it waits (Ray 2.60 sometimes never wakes a
thread inside one `ray.get`, `worker.py:get_objects`, when another thread shuts Ray down; the
library's readers read in slices, `_ray.get_until`, and so see that Ray is gone).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import ray
from workers import Worker, signal, waiters

import actormesh as am


def outcome(fn: Any) -> str:
    try:
        fn()
    except BaseException as err:  # noqa: BLE001 - SystemExit included: that is the point
        return f"{type(err).__name__}: {err}"
    return "no error"


def main(address: str) -> None:
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    mesh = am.ActorMesh(Worker, shape=2, num_cpus=0.25)
    sig = signal()
    held = [mesh.methods.block.choose(sig) for _ in range(2)]
    waiters(sig, 2)  # both calls run in their actors, and never end
    seen: dict[str, str] = {}
    readers = {"future.get in a thread": lambda: held[0].get(timeout=30),
               "am.get in a thread": lambda: am.get([held[1]], timeout=30)}
    threads = []
    for name, read in readers.items():
        # Daemons: a reader that never returns shows as missing, and does not hold the exit.
        threads.append(threading.Thread(target=lambda n=name, r=read: seen.__setitem__(
            n, outcome(r)), daemon=True))
        threads[-1].start()
    ray.shutdown()
    deadline = time.monotonic() + 45  # past the readers' own timeout of 30 s
    for (name, _), thread in zip(readers.items(), threads):
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            seen[name] = f"still waiting in {innermost(thread)}"
    print(json.dumps(seen), flush=True)


def innermost(thread: threading.Thread) -> str:
    """Where a thread that never returned is waiting: the innermost function's file and name."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"


if __name__ == "__main__":
    main(sys.argv[1])
