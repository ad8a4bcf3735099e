"""The Ray actormesh needs: refused at import, with the version found, when older; and every
private Ray API it reads, named and checked against the installed Ray."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import ray
import tomllib

from actormesh import _ray
from actormesh._method import Arguments


def test_an_older_ray_is_refused_naming_the_version_found() -> None:
    with pytest.raises(ImportError, match=r"needs ray>=2\.60 \(found ray 2\.59\.0\)"):
        _ray.require("2.59.0", ray.ObjectRef)


def test_a_ray_without_the_completion_callback_is_refused() -> None:
    with pytest.raises(ImportError, match="ObjectRef._on_ready"):
        _ray.require("2.60.0", object)


def test_the_installed_ray_is_accepted_and_a_newer_one_would_be() -> None:
    _ray.require(ray.__version__, ray.ObjectRef)
    _ray.require("3.0.0.dev0", ray.ObjectRef)


def test_importing_actormesh_with_an_older_ray_fails_with_that_message() -> None:
    code = "import ray; ray.__version__ = '2.40.0'; import actormesh"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "actormesh needs ray>=2.60 (found ray 2.40.0)" in out.stderr


def test_the_package_requires_the_ray_the_code_checks_for_and_bounds_it() -> None:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    requirement = next(d for d in dependencies if d.startswith("ray"))
    major, minor = _ray.MIN_RAY
    assert requirement.startswith(f"ray>={major}.{minor},<"), requirement  # internals are read


# -- Ray's internals the library reads ------------------------------------------------------------
# Every private Ray API actormesh and its integrations use, each with how to find it in the
# installed Ray. pyproject.toml bounds Ray to the range these were checked on; an upgrade that
# moves one fails here, by name, before any test of the library does.
ROOT = Path(__file__).resolve().parent.parent
MODULES = {  # private modules, and what is taken from each
    "ray._private.worker": ("global_worker",),
    "ray._private.gcs_pubsub": ("GcsAioActorSubscriber",),
    "ray._private.async_compat": ("has_async_methods",),
    "ray._raylet": ("PythonFunctionDescriptor",),
    "ray.experimental.internal_kv": ("_internal_kv_put", "_internal_kv_get", "_internal_kv_del"),
}
WORKER = ("connected", "core_worker", "gcs_client")  # of ray._private.worker.global_worker
CORE_WORKER = ("object_exists", "get_objects", "get_local_actor_state",
               "current_actor_is_asyncio", "run_async_func_or_coro_in_event_loop")
GCS_CLIENT = ("address", "async_get_all_actor_info")
SUBSCRIBER = ("subscribe", "poll")
OBJECT_REF = ("_on_ready", "_on_completed")
HANDLE = ("_actor_id", "_ray_method_signatures", "_ray_actor_creation_function_descriptor",
          "_ray_allow_out_of_order_execution", "_ray_max_task_retries",
          "_ray_method_max_task_retries", "_ray_method_retry_exceptions",
          "_ray_method_num_returns", "_ray_method_is_generator",
          "__ray_call__", "__ray_ready__")
ACTOR_METHOD = ("_remote",)  # handle.__ray_call__._remote(...), for a task's options
METHOD_FUNCTION = ("__ray_concurrency_group__",)  # set by @ray.method(concurrency_group=...)
# What `@ray.remote` makes of a class: its record, whose `modified_class` has the methods.
ACTOR_CLASS = ("__ray_metadata__",)
# A parameter Ray's tracing adds to every actor method's signature (ray.util.tracing).
INJECTED = ("_ray_trace_ctx",)

# What counts as a use of Ray's internals in the source, and the table each name must be in.
USES = [
    (re.compile(r"\bray\.(?:_private|_raylet)[\w.]*|\bray\.experimental\.internal_kv\b"),
     lambda name: name in MODULES or any(name.startswith(m + ".") for m in MODULES)),
    (re.compile(r"\b_internal_kv_\w+"), lambda name: name in MODULES["ray.experimental.internal_kv"]),
    (re.compile(r"global_worker\.(\w+)"), lambda name: name in WORKER),
    (re.compile(r"core_worker\.(\w+)\("), lambda name: name in CORE_WORKER),
    (re.compile(r"gcs_client\.(\w+)|client\.(async_\w+)"), lambda name: name in GCS_CLIENT),
    (re.compile(r"(?<!self)\.(_on_\w+)\("), lambda name: name in OBJECT_REF),
    (re.compile(r"\b(__ray_(?!concurrency_group)\w+__|_ray_\w+)\b"),
     lambda name: name in HANDLE or name in INJECTED or name in ACTOR_CLASS),
    (re.compile(r"(?<!self)\.(_actor_id)\b"), lambda name: name in HANDLE),
    (re.compile(r"__ray_call__\.(\w+)\("), lambda name: name in ACTOR_METHOD),
    (re.compile(r"\b(__ray_concurrency_group__)\b"), lambda name: name in METHOD_FUNCTION),
]


def test_every_private_ray_api_the_source_uses_is_listed_here() -> None:
    unlisted = []
    for path in sorted([*ROOT.glob("actormesh/*.py"), *ROOT.glob("integrations/**/*.py")]):
        text = path.read_text()
        for pattern, listed in USES:
            for match in pattern.finditer(text):
                name = next((g for g in match.groups() if g), match.group(0))
                if not listed(name):
                    unlisted.append(f"{path.relative_to(ROOT)}: {name}")
    assert not unlisted, f"Ray internals used but not checked by this test: {unlisted}"


@pytest.mark.parametrize(("module", "names"), sorted(MODULES.items()))
def test_each_private_ray_module_has_what_is_taken_from_it(module: str,
                                                          names: tuple[str, ...]) -> None:
    found = importlib.import_module(module)
    assert [n for n in names if not hasattr(found, n)] == [], f"ray {ray.__version__}: {module}"


def test_the_parameter_ray_tracing_adds_to_actor_methods_is_still_named_so() -> None:
    from ray.util.tracing import tracing_helper

    source = Path(tracing_helper.__file__).read_text()
    assert [n for n in INJECTED if n not in source] == [], f"ray {ray.__version__}"


@pytest.mark.usefixtures("ray_cluster")
def test_each_private_ray_attribute_the_library_reads_exists() -> None:
    from ray._private.gcs_pubsub import GcsAioActorSubscriber
    from ray._private.worker import global_worker

    @ray.remote(num_cpus=0, concurrency_groups={"io": 1})
    class Probe:
        @ray.method(concurrency_group="io")
        def grouped(self) -> None: ...

    handle = Probe.remote()  # type: ignore[attr-defined]
    try:
        missing = [f"global_worker.{n}" for n in WORKER if not hasattr(global_worker, n)]
        missing += [f"core_worker.{n}" for n in CORE_WORKER
                    if not hasattr(global_worker.core_worker, n)]
        missing += [f"gcs_client.{n}" for n in GCS_CLIENT if not hasattr(global_worker.gcs_client, n)]
        missing += [f"GcsAioActorSubscriber.{n}" for n in SUBSCRIBER
                    if not hasattr(GcsAioActorSubscriber, n)]
        missing += [f"ObjectRef.{n}" for n in OBJECT_REF if not hasattr(ray.ObjectRef, n)]
        missing += [f"ActorHandle.{n}" for n in HANDLE if not hasattr(handle, n)]
        missing += [f"ActorMethod.{n}" for n in ACTOR_METHOD
                    if not hasattr(handle.__ray_call__, n)]
        missing += [f"@ray.method function.{n}" for n in METHOD_FUNCTION
                    if not hasattr(Probe.__ray_metadata__.modified_class.grouped, n)]
        missing += [f"ActorClass.{n}" for n in ACTOR_CLASS if not hasattr(Probe, n)]
        descriptor = handle._ray_actor_creation_function_descriptor
        missing += [f"FunctionDescriptor.{n}" for n in ("module_name", "class_name")
                    if not hasattr(descriptor, n)]
        assert missing == [], f"ray {ray.__version__} lacks: {missing}"
    finally:
        ray.kill(handle)


# -- reading an actor made elsewhere from its handle (no cluster: a handle's Ray records) --------
class _Outer:
    class Grouped:
        @ray.method(concurrency_group="io")  # type: ignore[misc]
        def io(self) -> None: ...

        def plain(self) -> None: ...


class _Ungrouped:
    def plain(self) -> None: ...


def _handle(module: str, qualname: str, methods: dict[str, list[Any]]) -> Any:
    descriptor = types.SimpleNamespace(module_name=module, class_name=qualname)
    return types.SimpleNamespace(_ray_actor_creation_function_descriptor=descriptor,
                                 _ray_method_signatures=methods)


def test_a_class_with_a_method_in_a_concurrency_group_is_found_by_its_qualified_name() -> None:
    methods: dict[str, list[Any]] = {"io": [], "plain": [], "__ray_ready__": []}
    assert _ray.runs_groups_at_once(_handle(__name__, "_Outer.Grouped", methods))
    assert not _ray.runs_groups_at_once(_handle(__name__, "_Ungrouped", {"plain": []}))
    assert not _ray.runs_groups_at_once(_handle("no_such_module", "_Outer.Grouped", methods))
    assert not _ray.runs_groups_at_once(_handle(__name__, "f.<locals>.Local", methods))
    assert not _ray.runs_groups_at_once(types.SimpleNamespace())  # no record at all


def test_a_scripts_class_is_found_in_main_under_the_scripts_file_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    script = types.ModuleType("__main__")
    script.__file__ = "/somewhere/train_loop.py"
    script.Grouped = _Outer.Grouped  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert _ray.runs_groups_at_once(_handle("train_loop", "Grouped", {"io": []}))
    assert not _ray.runs_groups_at_once(_handle("other_script", "Grouped", {"io": []}))


def test_the_arguments_of_an_actor_made_elsewhere_are_checked_as_ray_checks_them() -> None:
    def method(self: Any, a: int, *rest: int, key: int, **extra: int) -> None: ...

    recorded = [*list(inspect.signature(method).parameters.values())[1:],
                inspect.Parameter("_ray_trace_ctx", inspect.Parameter.KEYWORD_ONLY, default=None)]
    arguments = Arguments.of_handle("Remote", _handle(__name__, "Remote", {"m": recorded}), "m")
    assert arguments is not None
    arguments.check((1, 2, 3), {"key": 4, "other": 5})
    with pytest.raises(TypeError, match=r"Remote\.m\(a, \*rest, key, \*\*extra\): missing"):
        arguments.check((1,), {})
    assert Arguments.of_handle("Remote", _handle(__name__, "Remote", {}), "m") is None
