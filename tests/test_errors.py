"""Errors a user can act on: the user's exception and its traceback in the actor, an `__init__`
error whole, and Ray's own failures as `MeshError`s."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator

import pytest
import ray
from workers import script_env, wait_until

import actormesh as am

pytestmark = pytest.mark.usefixtures("ray_cluster")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shutdown_waiters.py")

class Coded(Exception):
    """An exception with an attribute of its own."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class NotFound(Exception):
    """An exception Ray cannot unpickle: its constructor takes other arguments than its args."""

    def __init__(self, path: str, code: int) -> None:
        super().__init__(f"no model at {path}")
        self.code = code


class Raiser:
    def __init__(self, model: str = "") -> None:
        if model:
            open(model)  # noqa: SIM115 - raises FileNotFoundError for the test

    @am.method
    def value_error(self, x: int) -> int:
        raise ValueError(f"bad value {x}")

    @am.method
    def coded(self, code: int) -> int:
        raise Coded(code)

    @am.method
    def not_found(self, path: str) -> int:
        raise NotFound(path, 7)


@pytest.fixture(scope="module")
def mesh() -> Iterator[am.ActorMesh[Raiser]]:
    with am.ActorMesh(Raiser, shape={"dp": 2}, num_cpus=0.25) as made:
        yield made


def test_an_actor_error_is_an_instance_of_the_users_exception_class(
        mesh: am.ActorMesh[Raiser]) -> None:
    with pytest.raises(ValueError, match="bad value 3") as info:
        mesh.methods.value_error.choose(3).get(timeout=60)
    assert isinstance(info.value, am.ActorError)
    assert isinstance(info.value.cause, ValueError) and str(info.value.cause) == "bad value 3"
    assert info.value.__cause__ is info.value.cause


def test_an_actor_error_ends_with_the_traceback_in_the_actor(mesh: am.ActorMesh[Raiser]) -> None:
    with pytest.raises(am.ActorError) as info:
        mesh[1].methods.value_error.choose(4).get(timeout=60)
    text = str(info.value)
    assert text.startswith("value_error on rank 1 (dp=1) raised ValueError: bad value 4")
    assert 'raise ValueError(f"bad value {x}")' in text  # the line in the actor's source
    assert "\x1b[" not in text


def test_the_users_exception_keeps_its_attributes(mesh: am.ActorMesh[Raiser]) -> None:
    with pytest.raises(Coded) as info:
        mesh.methods.coded.choose(7).get(timeout=60)
    assert isinstance(info.value, am.ActorError) and info.value.code == 7


def test_an_exception_ray_cannot_unpickle_is_still_the_actors_error_with_its_traceback(
        mesh: am.ActorMesh[Raiser]) -> None:
    with pytest.raises(am.ActorError) as info:
        mesh.methods.not_found.choose("/nope").get(timeout=60)
    assert "NotFound: no model at /nope" in str(info.value)
    assert "raise NotFound(path, 7)" in str(info.value)


def test_an_actor_error_pickles_as_what_it_is(mesh: am.ActorMesh[Raiser]) -> None:
    with pytest.raises(am.ActorError) as info:
        mesh.methods.value_error.choose(5).get(timeout=60)
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, ValueError) and isinstance(again, am.ActorError)
    assert str(again) == str(info.value)


def test_an_unknown_keyword_argument_is_named_before_the_call_is_sent(
        mesh: am.ActorMesh[Raiser]) -> None:
    with pytest.raises(TypeError, match=r"Raiser\.value_error\(x\) got an unexpected keyword argument 'y'"):
        mesh.methods.value_error.choose(y=1)  # type: ignore[call-arg]


def test_too_many_arguments_name_the_method_and_its_parameters(
        mesh: am.ActorMesh[Raiser]) -> None:
    with pytest.raises(TypeError, match=r"Raiser\.value_error\(x\): too many positional"):
        mesh.methods.value_error.all(1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"Raiser\.value_error\(x\): missing .*'x'"):
        mesh.methods.value_error.choose()  # type: ignore[call-arg]


def test_an_init_error_reaches_the_caller_whole_without_colour_codes() -> None:
    with am.ActorMesh(Raiser, shape=1, args=("/nope/model.bin",), num_cpus=0.25) as broken:
        with pytest.raises(am.ActorDiedError) as info:
            broken.methods.value_error.choose(1).get(timeout=60)
        text = str(info.value)
        assert "__init__ raised" in text
        assert "FileNotFoundError" in text and "/nope/model.bin" in text
        assert "open(model)" in text  # the line of __init__ that raised
        assert "\x1b[" not in text
        assert info.value.init_failed


def test_wait_ready_raises_the_init_error_whole() -> None:
    with am.ActorMesh(Raiser, shape=1, args=("/nope/model.bin",), num_cpus=0.25) as broken:
        with pytest.raises(am.ActorDiedError, match="FileNotFoundError") as info:
            broken.wait_ready(timeout=60)
        assert "/nope/model.bin" in str(info.value) and "\x1b[" not in str(info.value)


def test_a_call_after_every_init_failed_says_no_live_actor_in_the_users_words() -> None:
    with am.ActorMesh(Raiser, shape=2, args=("/nope/model.bin",), num_cpus=0.25) as broken:
        with pytest.raises(am.ActorDiedError):
            broken.wait_ready(timeout=60)
        wait_until(lambda: broken.load().alive == [False, False])
        with pytest.raises(am.NoLiveActorsError) as info:
            broken.methods.value_error.choose(1).get(timeout=60)
        text = str(info.value)
        assert "no live actor to run the call: all 2 actors it may go to are dead" in text
        assert "group" not in text


def test_readers_waiting_when_ray_shuts_down_get_a_mesh_error_never_system_exit() -> None:
    run = subprocess.run([sys.executable, SCRIPT, ray.get_runtime_context().gcs_address],
                         env=script_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    for reader in ("future.get in a thread", "am.get in a thread"):
        # A MeshError; never a SystemExit, nor a wait in the library. Ray 2.60 sometimes never
        # returns from a call a thread is in when another shuts it down (~1 run in 3 with one
        # ray.get of 30 s; seen in a 200 ms ray.wait too): readers read in slices of at most
        # 200 ms, which made it rare (none in 26 runs, 8 of them on a loaded machine), not
        # impossible, so Ray's own hang, inside Ray, is still told apart and let pass.
        assert seen[reader].startswith("MeshError") or \
            seen[reader] == "still waiting in worker.py:get_objects", (reader, seen)
