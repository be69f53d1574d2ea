"""The mutation list of tests/mutants.py does not rot: every pattern occurs exactly once in the
source, and its substitution changes the file."""

from pathlib import Path

import pytest
from mutants import MUTATIONS, ROOT


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_pattern_occurs_once(mutation) -> None:
    text = (ROOT / mutation.path).read_text()
    assert text.count(mutation.old) == 1, (mutation.name, mutation.path)
    assert mutation.old != mutation.new
    for arg in mutation.tests:  # the tests named for it exist
        if arg.startswith("tests/"):
            assert (ROOT / arg.split("::")[0]).is_file(), arg


def test_names_are_unique() -> None:
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names))
    assert ROOT == Path(__file__).resolve().parents[1]
