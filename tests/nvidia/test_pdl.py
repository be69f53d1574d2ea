"""Which launches use programmatic dependent launch: the token buckets, the switch, the checks."""

from __future__ import annotations

import pytest

from dsv41.common.platform import parse_target, targeting
from dsv41.nvidia.ops.pdl import PDL_MAX_TOKENS, pdl_enabled, pdl_launch_options


def test_pdl_by_tokens_and_switch(monkeypatch) -> None:
    monkeypatch.delenv("DSV41_PDL", raising=False)
    with targeting(parse_target("sm90")):  # launchers choosing for an H200
        assert pdl_enabled(1) and pdl_enabled(PDL_MAX_TOKENS)
        assert not pdl_enabled(PDL_MAX_TOKENS + 1)
        assert pdl_launch_options(True) == {"launch_pdl": True} and pdl_launch_options(False) == {}
        monkeypatch.setenv("DSV41_PDL", "0")
        assert not pdl_enabled(1)
        monkeypatch.setenv("DSV41_PDL", "1")
        assert pdl_enabled(1) and pdl_enabled(48)
    for where in ("gfx942", "gfx950"):  # ROCm has no grid dependency control: forcing it is moot
        with targeting(parse_target(where)):
            assert not pdl_enabled(1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # nor has the interpreter
    assert not pdl_enabled(1)
    for bad in ("2", "yes", ""):
        monkeypatch.setenv("DSV41_PDL", bad)
        with pytest.raises(ValueError, match=f"DSV41_PDL: expected 0 or 1, got '{bad}'"):
            pdl_enabled(1)
