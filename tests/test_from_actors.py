"""`ActorMesh.from_actors`: a mesh over Ray actors made elsewhere, which it does not own."""

from __future__ import annotations

import pytest
import ray
from workers import Plain, signal, wait_until, waiters

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")


def make(count: int) -> list[ray.actor.ActorHandle[Plain]]:
    handles = [Plain.remote(tag) for tag in range(count)]  # type: ignore[attr-defined]
    ray.get([h.__ray_ready__.remote() for h in handles], timeout=60)
    return handles


def test_every_verb_works_over_actors_made_elsewhere() -> None:
    handles = make(4)
    with am.ActorMesh.from_actors(handles, {"dp": 2, "tp": 2}) as mesh:
        assert list(mesh.methods.whoami.all().get(timeout=60)) == [0, 1, 2, 3]
        assert mesh.methods.whoami.choose().get(timeout=60) in range(4)
        assert list(mesh.slice(dp=1).methods.whoami.all().get(timeout=60)) == [2, 3]
        split = mesh.methods.split_len.options(dispatch=am.dispatch.split())
        assert split.shard(list(range(8))).get(timeout=60) == [2, 2, 2, 2]
        assert list(mesh.run_in_actors(lambda actor: actor.tag * 10).get(timeout=60)) == [
            0, 10, 20, 30]
    assert ray.get([h.whoami.remote() for h in handles], timeout=60) == [0, 1, 2, 3]


def test_shutdown_leaves_the_actors_alive_and_refuses_later_calls() -> None:
    handles = make(2)
    mesh = am.ActorMesh.from_actors(handles)
    mesh.shutdown()
    with pytest.raises(am.MeshError, match="shut down"):
        mesh.methods.whoami.choose()
    assert ray.get(handles[1].whoami.remote(), timeout=60) == 1


def test_a_dead_actor_fails_only_its_calls_and_leaves_the_rotation() -> None:
    handles = make(3)
    with am.ActorMesh.from_actors(handles, balancer="least_loaded") as mesh:
        sig = signal()
        doomed = mesh[1].methods.hold.choose(sig)
        waiters(sig, 1)
        ray.kill(handles[1])
        with pytest.raises(am.ActorDiedError, match=r"rank 1"):
            doomed.get(timeout=60)
        wait_until(lambda: mesh.load().alive == [True, False, True])
        assert {mesh.methods.whoami.choose().get(timeout=60) for _ in range(20)} <= {0, 2}


def test_an_actor_dead_before_the_mesh_was_made_is_out_from_the_start() -> None:
    handles = make(2)
    ray.kill(handles[0])
    wait_until(lambda: _dead(handles[0]))
    with am.ActorMesh.from_actors(handles) as mesh:
        assert mesh.load().alive == [False, True]
        assert {mesh.methods.whoami.choose().get(timeout=60) for _ in range(10)} == {1}


def _dead(handle: ray.actor.ActorHandle[Plain]) -> bool:
    try:
        ray.get(handle.__ray_ready__.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return True
    return False


def test_bad_input_is_refused_clearly() -> None:
    handles = make(2)
    with pytest.raises(ValueError, match="shape .* 3 points but 2 actors"):
        am.ActorMesh.from_actors(handles, (3,))
    with pytest.raises(ValueError, match="same actor is given twice"):
        am.ActorMesh.from_actors([handles[0], handles[0]])
    with pytest.raises(TypeError, match="Ray actor handles"):
        am.ActorMesh.from_actors([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at least one"):
        am.ActorMesh.from_actors([])
    with am.ActorMesh.from_actors(handles) as mesh:
        with pytest.raises(AttributeError, match="Plain has no method 'nope'"):
            mesh.methods.nope  # type: ignore[attr-defined]  # noqa: B018


def test_arguments_that_do_not_fit_a_method_are_refused_at_the_call_whether_it_waits_or_not(
) -> None:
    """As for a mesh of the library's own actors: the arguments are checked against the
    method's parameters as Ray recorded them, before anything is sent; a call that would have
    waited and ridden a task with others is refused the same (not run in the actor, where it
    would raise as the actor's error and count against it)."""
    handles = make(1)
    with am.ActorMesh.from_actors(handles, balancer=am.Policy("adaptive", max_tasks=1)) as mesh:
        with pytest.raises(TypeError, match=r"Plain\.whoami\(\): too many positional"):
            mesh.methods.whoami.choose(1)  # the actor idle: it would go alone
        sig = signal()
        held = mesh.methods.hold.choose(sig)
        waiters(sig, 1)
        with pytest.raises(TypeError, match=r"Plain\.split_len\(xs\): missing a required"):
            mesh.methods.split_len.choose()  # the actor busy: it would wait and ride
        with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
            mesh.methods.split_len.all([1], y=2)
        sig.send.remote()
        assert held.get(timeout=60) == 0
        assert not any(actor.ejected for actor in mesh.load().actors)
        assert mesh.stats()["calls"].get("split_len", {}).get("error", 0) == 0
