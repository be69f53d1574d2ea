"""The ``DSV41_*`` environment switches of the A/B runs (README, "Switches"): one reader.

A switch is a non-negative integer; a value that is not one, or that its check
refuses, is an error naming the variable, what it takes and what it got.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def env_int(name: str, default: int | None, ok: Callable[[int], bool], expected: str) -> int | None:
    """``int($name)`` when set and ``ok`` of it, ``default`` when unset; else ``ValueError``
    ``"name: expected <expected>, got '<raw>'"``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not ok(int(raw)):
        raise ValueError(f"{name}: expected {expected}, got {raw!r}")
    return int(raw)


def env_flag(name: str, default: bool | None) -> bool | None:
    """``$name`` as 1 (True) or 0 (False), ``default`` when unset."""
    value = env_int(name, None, lambda v: v in (0, 1), "0 or 1")
    return default if value is None else value == 1


def interpreting() -> bool:
    """``TRITON_INTERPRET=1``: Triton kernels run on the CPU in the interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"
