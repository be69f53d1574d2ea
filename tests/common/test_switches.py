"""The one reader of the DSV41_* switches: unset, accepted, refused."""

from __future__ import annotations

import pytest

from dsv41.common.switches import env_flag, env_int


def test_env_int_and_flag(monkeypatch) -> None:
    monkeypatch.delenv("DSV41_TEST_SWITCH", raising=False)
    assert env_int("DSV41_TEST_SWITCH", 7, lambda v: v < 10, "below 10") == 7
    assert env_flag("DSV41_TEST_SWITCH", None) is None
    monkeypatch.setenv("DSV41_TEST_SWITCH", "1")
    assert env_int("DSV41_TEST_SWITCH", 7, lambda v: v < 10, "below 10") == 1
    assert env_flag("DSV41_TEST_SWITCH", False) is True
    for bad in ("12", "-1", "x", ""):
        monkeypatch.setenv("DSV41_TEST_SWITCH", bad)
        with pytest.raises(ValueError, match=f"DSV41_TEST_SWITCH: expected below 10, got '{bad}'"):
            env_int("DSV41_TEST_SWITCH", 7, lambda v: v < 10, "below 10")
    monkeypatch.setenv("DSV41_TEST_SWITCH", "2")
    with pytest.raises(ValueError, match="DSV41_TEST_SWITCH: expected 0 or 1, got '2'"):
        env_flag("DSV41_TEST_SWITCH", False)
