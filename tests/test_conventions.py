"""Ray's conventions, kept: `am.get` / `am.wait` over mesh futures and ObjectRefs mixed, clear
errors where a mesh or a future cannot go, Ray's actor options passed through, and a cluster
never started behind the user's back."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from workers import Worker, script_env, signal, waiters

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


@ray.remote(num_cpus=0)
def plus_one(x: int) -> int:
    return x + 1


class Decorated:
    @am.method
    def double(self, x: int) -> int:
        return 2 * x

    @am.method
    @ray.method(concurrency_group="io")
    def in_group(self, x: int) -> int:
        return x


@pytest.fixture(scope="module")
def mesh() -> Iterator[am.ActorMesh[Worker]]:
    with am.ActorMesh(Worker, shape=2, num_cpus=0.25) as made:
        yield made


def run_alone(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh Python process with no Ray cluster of its own."""
    env = {k: v for k, v in script_env().items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


# -- am.get / am.wait ---------------------------------------------------------------------------
def test_get_takes_mesh_futures_and_object_refs_mixed_in_order(
        mesh: am.ActorMesh[Worker]) -> None:
    items = [mesh.methods.f.choose(1), plus_one.remote(10), mesh.methods.f.choose(3),
             plus_one.remote(20)]  # type: ignore[attr-defined]
    assert am.get(items, timeout=60) == [1, 11, 3, 21]


def test_get_of_one_object_ref_is_its_value() -> None:
    assert am.get(plus_one.remote(1), timeout=60) == 2  # type: ignore[attr-defined]


def test_wait_takes_mesh_futures_and_object_refs_mixed(mesh: am.ActorMesh[Worker]) -> None:
    sig = signal()
    blocked = mesh.methods.block.choose(sig)
    ref = plus_one.remote(1)  # type: ignore[attr-defined]
    done, pending = am.wait([blocked, ref], num_returns=1, timeout=60)
    assert done == [ref] and pending == [blocked]
    sig.send.remote()
    done, pending = am.wait([blocked, ref], num_returns=2, timeout=60)
    assert done == [blocked, ref] and pending == []


def test_get_and_wait_refuse_other_objects_naming_them() -> None:
    with pytest.raises(TypeError, match="ray.ObjectRef.*got 3"):
        am.get([3], timeout=1)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got 'x'"):
        am.wait(["x"], timeout=1)  # type: ignore[type-var]


# -- what cannot be pickled ---------------------------------------------------------------------
@ray.remote(num_cpus=0)
def takes(thing: Any) -> str:
    return repr(thing)


def test_a_mesh_future_passed_to_a_task_says_to_pass_its_ref(mesh: am.ActorMesh[Worker]) -> None:
    future = mesh.methods.f.choose(1)
    with pytest.raises(TypeError, match=r"future\.ref"):
        takes.remote(future)  # type: ignore[attr-defined]
    assert am.get(takes.remote(future.ref), timeout=60)  # type: ignore[attr-defined]


def test_a_mesh_passed_to_a_task_says_to_connect_by_name(mesh: am.ActorMesh[Worker]) -> None:
    with pytest.raises(TypeError, match=r"am\.ActorMesh\.connect\(name\)"):
        takes.remote(mesh)  # type: ignore[attr-defined]


# -- Ray's actor options ------------------------------------------------------------------------
def test_ray_actor_options_reach_the_actors() -> None:
    sig = signal()
    with am.ActorMesh(Worker, shape=1, num_cpus=0.25,
                      ray_actor_options={"max_concurrency": 2,
                                         "scheduling_strategy": "SPREAD"}) as threaded:
        calls = [threaded.methods.block.choose(sig) for _ in range(2)]
        waiters(sig, 2)  # both run at once in the one actor: max_concurrency=2 reached it
        sig.send.remote()
        assert am.get(calls, timeout=60) == [0, 0]


def test_concurrency_groups_reach_the_actor_class() -> None:
    with am.ActorMesh(Decorated, shape=1, num_cpus=0.25,
                      ray_actor_options={"concurrency_groups": {"io": 2}}) as grouped:
        assert grouped.methods.in_group.choose(5).get(timeout=60) == 5


def test_a_decorated_method_is_callable_through_a_plain_ray_handle() -> None:
    handle = ray.remote(num_cpus=0, concurrency_groups={"io": 1})(Decorated).remote()
    try:
        assert ray.get(handle.double.remote(2), timeout=60) == 4
    finally:
        ray.kill(handle)


@pytest.mark.parametrize(("option", "instead"), [
    ("num_cpus", r"ActorMesh\(num_cpus=\.\.\.\)"),
    ("max_restarts", r"ActorMesh\(max_restarts=\.\.\.\)"),
    ("name", r"ActorMesh\(name=\.\.\.\)"),
    ("max_task_retries", r"options\(retries=n\)"),
])
def test_options_the_mesh_sets_itself_are_refused_naming_what_to_use(
        option: str, instead: str) -> None:
    with pytest.raises(ValueError, match=instead):
        am.ActorMesh(Worker, shape=1, ray_actor_options={option: 1})


def test_an_option_ray_does_not_know_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="max_concurency"):
        am.ActorMesh(Worker, shape=1, ray_actor_options={"max_concurency": 2})


# -- the cluster --------------------------------------------------------------------------------
def test_a_name_already_taken_is_a_mesh_error_naming_it(mesh: am.ActorMesh[Worker]) -> None:
    with am.ActorMesh(Worker, shape=1, num_cpus=0.25, name="taken-name"):
        with pytest.raises(am.MeshError, match="name='taken-name' is taken"):
            am.ActorMesh(Worker, shape=1, num_cpus=0.25, name="taken-name")


def test_actors_asking_for_what_no_node_has_are_named_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="actormesh"):
        with am.ActorMesh(Worker, shape=2, num_cpus=0.25, num_gpus=1) as waiting:
            assert any("GPU=1 per actor" in r.getMessage() and "no node of the cluster has any"
                       in r.getMessage() for r in caplog.records), caplog.text
            with pytest.raises(TimeoutError, match="GPU=1 per actor"):
                waiting.wait_ready(timeout=1)
            with pytest.raises(TimeoutError, match="wait for resources: .*GPU=1 per actor"):
                waiting.methods.f.choose(1).get(timeout=1)
            with pytest.raises(am.MeshTimeoutError, match="wait for resources: .*GPU=1 per actor"):
                waiting.methods.f.options(timeout=1).choose(1).get(timeout=30)


def test_without_ray_init_a_mesh_and_connect_say_so_and_start_no_cluster() -> None:
    run = run_alone("""
        import ray
        import actormesh as am
        from workers import Worker
        for make in (lambda: am.ActorMesh(Worker, shape=1),
                     lambda: am.ActorMesh.connect("engines")):
            try:
                make()
            except am.MeshError as err:
                print("MeshError:", err)
        print("initialized:", ray.is_initialized())
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("MeshError: ActorMesh(Worker): Ray is not running"), lines
    assert lines[1].startswith("MeshError: ActorMesh.connect('engines'): Ray is not running")
    assert "ray.init()" in lines[0]
    assert lines[-1] == "initialized: False"


def test_ray_client_is_refused_at_construction_saying_why(ray_cluster: None) -> None:
    # The client server's driver joins the session cluster (starting one of its own took 10 s).
    address = ray.get_runtime_context().gcs_address
    run = run_alone(f"""
        from ray.util.client.ray_client_helpers import ray_start_client_server_for_address
        import actormesh as am
        from workers import Worker
        with ray_start_client_server_for_address({address!r}):
            try:
                am.ActorMesh(Worker, shape=1)
            except am.MeshError as err:
                print("MeshError:", err)
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MeshError: ActorMesh(Worker): Ray Client" in run.stdout, run.stdout
    assert "ray job submit" in run.stdout
