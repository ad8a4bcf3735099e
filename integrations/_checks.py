"""Checks of an integration's arguments, made on the driver before anything starts: each returns
the value (as the type it names) or raises a `ValueError` naming the argument."""

from __future__ import annotations

import math


def check_int(name: str, value: object, minimum: int) -> int:
    """`value` if it is an int (not a bool) >= minimum, else a `ValueError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an int >= {minimum}")
    return int(value)


def check_optional_int(name: str, value: object, minimum: int) -> int | None:
    """`None`, or what `check_int` accepts."""
    return None if value is None else check_int(name, value, minimum)


def check_timeout(name: str, value: object) -> float | None:
    """`None`, or a finite number of seconds > 0."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name}={value!r}: must be None or a finite number of seconds > 0")
    return float(value)


def seconds(label: str, value: float) -> float:
    """`value` as seconds, or a ValueError naming `label` if it is not a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{label}={value!r}: must be a finite number of seconds > 0")
    return float(value)
