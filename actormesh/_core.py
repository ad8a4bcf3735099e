"""Loads the compiled scheduler core (`actormesh._native`) before anything else of the package.

A source tree without a built core may shadow an installed package: Ray starts a worker for a
driver run from a checkout with the driver's working directory ahead of site-packages on its
path, so the worker imports the checkout, not the package `pip install .` built from it. Then
the core of that installed actormesh is used. Without any, the import fails saying how to build
one.
"""

from __future__ import annotations

import glob
import importlib
import os
import sys


def _borrow_installed_core() -> str | None:
    """The folder of an installed actormesh whose compiled core this package now uses (added to
    its `__path__`), or None if no other actormesh on `sys.path` has one."""
    package = sys.modules["actormesh"]
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    for entry in sys.path:
        candidate = os.path.realpath(os.path.join(entry or os.getcwd(), "actormesh"))
        if candidate != here and glob.glob(os.path.join(candidate, "_native.*")):
            package.__path__.append(candidate)
            importlib.import_module("actormesh._native")
            return candidate
    return None


try:
    importlib.import_module("actormesh._native")
    borrowed_from: str | None = None
except ImportError as err:
    borrowed_from = _borrow_installed_core()
    if borrowed_from is None:
        raise ImportError(
            "actormesh._native, the compiled scheduler core, is missing or failed to load "
            f"({err}), and no installed actormesh on sys.path has one. Install the package with "
            "pip so its C++ core is built (`pip install .` or `make test`)."
        ) from err
