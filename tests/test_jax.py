"""The JAX integration on real processes: two JAX processes over Ray actors, on the CPU."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray
from jax_workers import JaxWorker

import actormesh as am
from actormesh.integrations.jax import PORT_ENV, JaxMesh, checkpoint
from actormesh.integrations.jax._coordinator import (
    check_port_free,
    hold_free_port,
    start_rendezvous,
)
from actormesh.integrations.jax._mesh import JaxSetup, join

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def mesh(ray_cluster: None) -> Iterator[JaxMesh[JaxWorker]]:
    with JaxMesh(JaxWorker, 2, platforms="cpu", num_cpus=0.5, args=("tagged",)) as m:
        m.wait_ready(timeout=120)
        yield m


@pytest.fixture(scope="module")
def fixed_port_mesh(ray_cluster: None) -> Iterator[tuple[JaxMesh[JaxWorker], int]]:
    """Two processes of two CPU devices each, on a port the test holds (as the holder would)."""
    held = hold_free_port()
    port = held.getsockname()[1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PORT_ENV, str(port))
        m = JaxMesh(JaxWorker, 2, platforms="cpu", local_device_count=2, num_cpus=0.5)
    with m:
        try:
            m.wait_ready(timeout=120)
        finally:
            held.close()
        yield m, port


def live_placement_groups() -> set[str]:
    return {pg_id for pg_id, pg in ray.util.placement_group_table().items()
            if pg["state"] != "REMOVED"}


# -- joining ----------------------------------------------------------------------------------
def test_each_process_joined_jax_before_init_with_its_rank(mesh: JaxMesh[JaxWorker]) -> None:
    states = list(mesh.methods.state.all().get(timeout=60))
    for rank, state in enumerate(states):
        assert state == {"process_index": rank, "process_count": 2, "rank": rank,
                         "local_devices": 1, "devices": 2, "platform": "cpu", "tag": "tagged"}


def test_a_jax_mesh_is_an_actor_mesh_on_dim_process(mesh: JaxMesh[JaxWorker]) -> None:
    assert isinstance(mesh, am.ActorMesh)
    assert dict(mesh.shape) == {"process": 2}
    assert mesh.num_processes == len(mesh.actors) == 2
    assert re.fullmatch(r"[\w.:\[\]]+:\d+", mesh.coordinator_address)
    assert list(mesh[1].methods.state.all().get(timeout=60))[0]["rank"] == 1


def test_processes_agree_on_a_cross_process_allgather(mesh: JaxMesh[JaxWorker]) -> None:
    assert list(mesh.methods.allgather.all(10).get(timeout=60)) == [[10, 11], [10, 11]]


def test_processes_agree_on_a_cross_process_psum(mesh: JaxMesh[JaxWorker]) -> None:
    assert list(mesh.methods.psum.all(1.5).get(timeout=60)) == [4.5, 4.5]  # 1.5 * 1 + 1.5 * 2


def test_port_override_is_the_coordinator_port(
    fixed_port_mesh: tuple[JaxMesh[JaxWorker], int],
) -> None:
    m, port = fixed_port_mesh
    assert m.coordinator_address.endswith(f":{port}")
    assert [s["process_index"] for s in m.methods.state.all().get(timeout=60)] == [0, 1]


def test_local_device_count_sets_cpu_devices_per_process(
    fixed_port_mesh: tuple[JaxMesh[JaxWorker], int],
) -> None:
    m, _ = fixed_port_mesh
    states = list(m.methods.state.all().get(timeout=60))
    assert [(s["local_devices"], s["devices"]) for s in states] == [(2, 4), (2, 4)]
    assert list(m.methods.psum.all(1.0).get(timeout=60)) == [3.0, 3.0]  # over 4 devices


# -- batches ----------------------------------------------------------------------------------
def test_a_batch_sent_to_all_processes_is_put_once(
    mesh: JaxMesh[JaxWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    put_bytes: list[int] = []
    real_put = ray.put

    def counting_put(value: object, **kwargs: object) -> object:
        put_bytes.append(getattr(value, "nbytes", 0))
        return real_put(value, **kwargs)

    monkeypatch.setattr(ray, "put", counting_put)
    batch = np.ones((512, 512), dtype=np.float32)  # 1 MiB: above Ray's inline limit
    assert list(mesh.methods.batch_sum.all(batch).get(timeout=60)) == [512.0 * 512] * 2
    assert put_bytes == [batch.nbytes]


# -- errors -----------------------------------------------------------------------------------
def test_num_processes_is_required() -> None:
    with pytest.raises(TypeError, match="num_processes"):
        JaxMesh(JaxWorker)  # type: ignore[call-arg]


def test_num_processes_below_one_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="num_processes=0"):
        JaxMesh(JaxWorker, 0)


def test_bundle_count_must_match_num_processes_and_starts_nothing() -> None:
    before = live_placement_groups()
    with pytest.raises(ValueError, match="3 placement bundles for num_processes=2"):
        JaxMesh(JaxWorker, 2, bundles=[{"CPU": 0.1}] * 3)
    assert live_placement_groups() == before


def test_restarts_are_refused() -> None:
    with pytest.raises(TypeError, match="max_restarts"):
        JaxMesh(JaxWorker, 2, max_restarts=1)  # type: ignore[call-arg]


def test_a_taken_coordinator_port_fails_every_process_naming_the_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    taken.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    taken.bind(("::", 0))  # bound without SO_REUSEPORT: JAX's coordinator could not bind it
    with taken:
        monkeypatch.setenv(PORT_ENV, str(taken.getsockname()[1]))
        before = live_placement_groups()
        m = JaxMesh(JaxWorker, 2, platforms="cpu", num_cpus=0.5, init_timeout_s=60)
        address = m.coordinator_address
        try:
            for rank, actor in enumerate(m.actors):
                with pytest.raises(ray.exceptions.RayActorError) as info:
                    ray.get(actor.__ray_ready__.remote(), timeout=120)
                assert f"coordinator at {address}" in str(info.value), rank
                assert PORT_ENV in str(info.value), rank
        finally:
            m.shutdown()
        assert live_placement_groups() == before


@ray.remote(num_cpus=0)
def join_as_process_1(setup: JaxSetup) -> None:
    """Joins in a fresh worker process, where JAX is still unused, as an actor would."""
    os.environ.update({"ACTORMESH_RANK": "1", "ACTORMESH_SHAPE": "process=2"})
    join(setup)


def test_a_process_that_never_arrives_is_named_in_the_timeout_error() -> None:
    """Process 1 waits for process 0, which never comes (as when its actor fails to start)."""
    rendezvous = start_rendezvous(2, None, None)
    try:
        port = ray.get(rendezvous.port.remote(), timeout=60)
        setup = JaxSetup(2, "10.0.0.7", None, rendezvous, 1, None, None)
        with pytest.raises(ray.exceptions.RayTaskError, match=re.escape(
                f"process(es) [0] did not reach the coordinator at 10.0.0.7:{port} "
                "within init_timeout_s=1 s")):
            ray.get(join_as_process_1.remote(setup), timeout=120)
    finally:
        ray.kill(rendezvous)


def test_the_held_port_admits_only_reuseport_binds() -> None:
    """What makes the choice race-free: nobody but a SO_REUSEPORT socket (JAX's) can take it."""
    held = hold_free_port()
    with held:
        port = held.getsockname()[1]
        plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with plain, pytest.raises(OSError):
            plain.bind(("0.0.0.0", port))
        check_port_free(port)  # binds with SO_REUSEPORT, as the coordinator does


# -- checkpoints ------------------------------------------------------------------------------
def test_on_a_shared_directory_exactly_one_process_writes(
    mesh: JaxMesh[JaxWorker], tmp_path: Path
) -> None:
    path = tmp_path / "shared" / "params.bin"
    assert list(mesh.methods.save.all(str(path), b"weights").get(timeout=60)) == [True, False]
    assert path.read_bytes() == b"weights"
    assert os.listdir(path.parent) == ["params.bin"]  # no probe or temporary file left


def test_with_per_process_directories_every_process_writes(
    mesh: JaxMesh[JaxWorker], tmp_path: Path
) -> None:
    template = str(tmp_path / "node{rank}" / "params.bin")
    assert list(mesh.methods.save.all(template, b"weights").get(timeout=60)) == [True, True]
    for rank in (0, 1):
        directory = tmp_path / f"node{rank}"
        assert os.listdir(directory) == ["params.bin"]
        assert (directory / "params.bin").read_bytes() == b"weights"


def test_a_failed_checkpoint_write_raises_in_every_process(
    mesh: JaxMesh[JaxWorker], tmp_path: Path
) -> None:
    (tmp_path / "params.bin" / "inside").mkdir(parents=True)  # a directory where the file goes
    save = mesh.methods.save.options(return_exceptions=True)
    errors = list(save.all(str(tmp_path / "params.bin"), b"weights").get(timeout=60))
    for error in errors:
        assert isinstance(error, am.ActorError)
        assert "the write failed in process(es) [0]" in str(error)
    assert sorted(os.listdir(tmp_path)) == ["params.bin"]


def test_a_process_that_cannot_probe_fails_every_process_without_hanging(
    mesh: JaxMesh[JaxWorker], tmp_path: Path
) -> None:
    (tmp_path / "node1").write_bytes(b"")  # process 1's directory is a file
    save = mesh.methods.save.options(return_exceptions=True)
    errors = list(save.all(str(tmp_path / "node{rank}" / "params.bin"), b"w").get(timeout=60))
    for error in errors:
        assert isinstance(error, am.ActorError)
        assert "the write failed in process(es) [1]" in str(error)


def test_atomic_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "params.bin"
    checkpoint.atomic_write(path, b"old")
    checkpoint.atomic_write(path, lambda file: file.write(b"new"))
    assert path.read_bytes() == b"new"


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "params.bin"
    checkpoint.atomic_write(path, b"old")

    def fail(file: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoint.atomic_write(path, fail)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["params.bin"]
