"""The environment switches (``docs/tuning.md`` lists them): the one module that reads them.

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


def backend_override() -> str | None:
    """``$DSV41_BACKEND``: the backend every layer built with ``backend="auto"`` takes, if set."""
    return os.environ.get("DSV41_BACKEND") or None


def pdl() -> bool | None:
    """``$DSV41_PDL``: programmatic dependent launch between the nvidia kernels forced on (1)
    or off (0) at every token count, for A/B runs; None: the tuning decides."""
    return env_flag("DSV41_PDL", None)


def validate() -> bool:
    """``$DSV41_VALIDATE``: every layer checks the values of a step's inputs before it runs (1),
    as ``DSV41Attention(validate=True)`` does; off (0, the default) on the serving path."""
    return bool(env_flag("DSV41_VALIDATE", False))


def use_interpreter_without_gpu() -> None:
    """Run Triton kernels in the interpreter unless told otherwise (the CLI on a CPU-only
    machine); must happen before triton decorates them."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
