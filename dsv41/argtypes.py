"""argparse types of the ``dsv41`` commands: each range-checks one argument at parse time, so
a bad value ends in argparse's error form (exit 2, the argument named, what was expected, what
came)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path


def int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            msg = f"expected an integer >= {low}, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def float_in(low: float, high: float = math.inf, low_open: bool = False):
    """An argparse type: a finite float in [low, high] (low excluded if ``low_open``)."""
    bound = f"{'>' if low_open else '>='} {low:g}"
    bound += f" and <= {high:g}" if high < math.inf else ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}") from None
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text}")
        return value

    return parse


def backend_list(text: str) -> str:
    """An argparse type: comma-separated backend names, at least one, none repeated."""
    from dsv41.backends import NAMES

    names = [n.strip() for n in text.split(",")]
    known = all(n in NAMES for n in names)
    if not text.strip() or not known or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated names from "
                                         f"{', '.join(NAMES)}, got {text!r}")  # fmt: skip
    return ",".join(names)


def existing_dir(text: str) -> str:
    """An argparse type: an existing directory."""
    if not Path(text).is_dir():
        what = "a file" if Path(text).exists() else "no such path"
        raise argparse.ArgumentTypeError(f"expected an existing directory, got {what}: {text}")
    return text


def new_file(text: str) -> str:
    """An argparse type: a file path whose directory exists (checked before any work is done)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file path, got a directory: {text}")
    if not path.resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a path in an existing directory, got {text} "
                                         f"(no directory {path.resolve().parent})")  # fmt: skip
    return text


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, except the unset (None) and off (False) ones."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)
