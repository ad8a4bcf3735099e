"""How far a reader must follow one call: the library's functions a warm `choose(x).get()` runs.

    python -m benchmarks.side.call_hops

On a local Ray cluster, one mesh of two no-op actors, warmed up; then one
`mesh.methods.f.choose(x).get()` (a lone call) and one call that waited and rode a task with
others, traced with `sys.setprofile` / `threading.setprofile` on every thread (the caller's,
Ray's completion thread, the library's loop thread). It prints, per path: the library's
functions entered in order (file:function), the cross-file hops (a call from a function of one
file to a function of another), the files, the lines of those functions' source (what a reader
reads), and the crossings into the native core (`actormesh._native`). Python's own library,
Ray and the test's code are not counted; `_loop`'s thread plumbing is counted like any file.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import textwrap
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import ray

import actormesh as am
from actormesh import _loop, _metrics
from benchmarks.side.shard_transfer import Signal

_PACKAGE = os.path.dirname(os.path.abspath(am.__file__))


class Echo:
    @am.method
    def f(self, x: int) -> int:
        return x

    @am.method
    def block(self, sig: Any) -> None:
        ray.get(sig.wait.remote())


class Trace:
    """The library's functions entered while tracing, in order, with who called them."""

    def __init__(self) -> None:
        self.entered: list[tuple[str, str, str | None]] = []  # (file, function, caller's file)
        self.native: list[str] = []
        self.sources: dict[tuple[str, str], int] = {}
        self.code: dict[tuple[str, str], int] = {}  # the same, less docstrings, comments, blanks
        self._lock = threading.Lock()

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            module = getattr(arg, "__module__", None) or ""
            owner = getattr(getattr(arg, "__self__", None), "__class__", None)
            if "actormesh._native" in module or (owner is not None and
                                                 owner.__module__ == "actormesh._native"):
                with self._lock:
                    self.native.append(getattr(arg, "__name__", "?"))
            return
        if event != "call":
            return
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE) or "benchmarks" in path:
            return
        caller = frame.f_back
        caller_file = None
        while caller is not None:
            caller_path = os.path.abspath(caller.f_code.co_filename)
            if caller_path.startswith(_PACKAGE):
                caller_file = os.path.relpath(caller_path, _PACKAGE)
                break
            caller = caller.f_back
        name = os.path.relpath(path, _PACKAGE)
        function = frame.f_code.co_qualname
        if function.endswith(">"):  # a comprehension or genexpr: part of its function
            return
        key = (name, function)
        with self._lock:
            self.entered.append((name, function, caller_file))
            if key not in self.sources:
                try:
                    source = inspect.getsourcelines(frame.f_code)[0]
                except (OSError, TypeError):
                    source = []
                self.sources[key] = len(source)
                self.code[key] = _code_lines(source)

    def drop_tail(self) -> None:
        """Forget the tracing's own plumbing (installing the profiler on the loop thread) and
        the loop thread's own wrapper of what is posted to it."""
        with self._lock:
            plumbing = ("_on_threads.<locals>.install", "post", "loop", "_guarded",
                        "_profiled.<locals>.run")
            self.entered = [e for e in self.entered if e[1] not in plumbing]

    def report(self, title: str) -> None:
        hops = sum(1 for file, _, caller in self.entered if caller is not None and caller != file)
        files = sorted({file for file, _, _ in self.entered})
        functions = list(dict.fromkeys((f, fn) for f, fn, _ in self.entered))
        lines = sum(self.sources[key] for key in functions)
        code = sum(self.code[key] for key in functions)
        print(f"\n{title}")
        print(f"  {len(functions)} functions, {hops} cross-file hops over {len(files)} files "
              f"({', '.join(files)}), {lines} lines of source ({code} of code: no docstring, "
              f"comment or blank line), "
              f"{len(self.native)} native crossings ({', '.join(self.native)})")
        for file, function in functions:
            print(f"    {file}:{function} ({self.sources[(file, function)]} lines)")
        print("  the hops, in order (caller's file -> function entered):")
        for file, function, caller in self.entered:
            if caller is not None and caller != file:
                print(f"    {caller} -> {file}:{function}")


def _code_lines(source: list[str]) -> int:
    """The lines of a function's `source` that are code: not its docstring, a comment or blank."""
    if not source:
        return 0
    skip: set[int] = set()
    try:
        tree = ast.parse(textwrap.dedent("".join(source)))
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            end = body[0].end_lineno or body[0].lineno
            skip.update(range(body[0].lineno, end + 1))
    return sum(1 for i, line in enumerate(source, 1)
               if i not in skip and line.strip() and not line.strip().startswith("#"))


# What Ray's completion thread runs of the library: its callbacks on a task's ObjectRefs (and,
# to compare with earlier commits, those of the call path before tasks: `Call.ended`,
# `_batch.Batch.ended`). Ray enters Python there afresh for each callback, so each is profiled
# while it runs.
_CALLBACKS = (("_calls", "Task", ("_ready", "_listed", "_reported", "_stream_ended")),
              ("_calls", "Call", ("ended",)), ("_batch", "Batch", ("ended",)))


def _on_threads(profile: Any) -> None:
    """Install `profile` (None: remove it) on this thread, on the library's loop thread, and
    around each completion callback on Ray's thread."""
    sys.setprofile(profile)
    done = threading.Event()

    def install() -> None:
        sys.setprofile(profile)
        done.set()

    _loop.post(install)
    assert done.wait(10)
    for module_name, class_name, names in _CALLBACKS:
        owner = getattr(sys.modules.get(f"actormesh.{module_name}"), class_name, None)
        for name in names if owner is not None else ():
            if not hasattr(owner, name):
                continue
            original = getattr(owner, f"_untraced{name}", None) or getattr(owner, name)
            if profile is None:
                setattr(owner, name, original)
                continue
            setattr(owner, f"_untraced{name}", original)
            setattr(owner, name, _profiled(original, profile))


def _profiled(callback: Callable[..., None], profile: Any) -> Callable[..., None]:
    def run(task: Any, *args: Any) -> None:
        sys.setprofile(profile)
        try:
            callback(task, *args)
        finally:
            sys.setprofile(None)
    return run


def traced(work: Callable[[], Any]) -> Trace:
    trace = Trace()
    _on_threads(trace.profile)
    try:
        work()
    finally:
        _on_threads(None)
    trace.drop_tail()
    return trace


def main() -> None:
    # The metrics' export timer (every 2 s on the loop thread) is no part of a call: it is kept
    # out of the traces by firing after them.
    _metrics.FLUSH_S = 3600.0
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with am.ActorMesh(Echo, shape=2, num_cpus=0.1) as mesh:
            for x in range(50):  # warm: methods measured, handles cached
                mesh.methods.f.choose(x).get(timeout=60)
            f = mesh.methods.f
            traced(lambda: f.choose(1).get(timeout=60)).report(
                "a lone call: mesh.methods.f.choose(x).get()")
        # The ride, on a mesh whose `adaptive` policy never holds a call back: by default the
        # calls queued behind a long call may be held and then sent alone, by timing.
        with am.ActorMesh(Echo, shape=2, num_cpus=0.1,
                          balancer=am.Policy(hold_ratio=1e9)) as mesh:
            for x in range(50):
                mesh.methods.f.choose(x).get(timeout=60)
            one = mesh[0]
            sig = Signal.remote()  # type: ignore[attr-defined]
            held = one.methods.block.choose(sig)
            while ray.get(sig.count.remote()) < 1:
                pass
            futures = [one.methods.f.choose(x) for x in range(4)]

            def ride() -> None:
                sig.send.remote()
                held.get(timeout=60)
                futures[0].get(timeout=60)

            traced(ride).report("a call that waited and rode a task with 3 others "
                                "(the release included)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
