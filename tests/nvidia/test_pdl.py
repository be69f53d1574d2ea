"""Which launches use programmatic dependent launch: the token buckets, the switch, the checks."""

from __future__ import annotations

import pytest

from dsv41.nvidia.ops.pdl import (
    LATE_ATTENTION,
    LATE_COMBINE,
    LATE_GEMV,
    PDL_MAX_TOKENS,
    pdl_enabled,
    pdl_late,
    pdl_launch_options,
)


def test_pdl_by_tokens_and_switch(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU
    monkeypatch.delenv("DSV41_PDL", raising=False)
    assert pdl_enabled(1) and pdl_enabled(PDL_MAX_TOKENS) and not pdl_enabled(PDL_MAX_TOKENS + 1)
    assert pdl_launch_options(True) == {"launch_pdl": True} and pdl_launch_options(False) == {}
    monkeypatch.setenv("DSV41_PDL", "0")
    assert not pdl_enabled(1)
    monkeypatch.setenv("DSV41_PDL", "1")
    assert pdl_enabled(1) and pdl_enabled(48)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter has no grid dependency control
    assert not pdl_enabled(1)
    for bad in ("2", "yes", ""):
        monkeypatch.setenv("DSV41_PDL", bad)
        with pytest.raises(ValueError, match=f"DSV41_PDL: expected 0 or 1, got '{bad}'"):
            pdl_enabled(1)


def test_late_release_switch(monkeypatch) -> None:
    """``DSV41_PDL_LATE``: a sum of the kinds' bits; none by default; other values refused."""
    monkeypatch.delenv("DSV41_PDL_LATE", raising=False)
    kinds = (LATE_GEMV, LATE_ATTENTION, LATE_COMBINE)
    assert not any(pdl_late(k) for k in kinds)
    monkeypatch.setenv("DSV41_PDL_LATE", str(LATE_ATTENTION + LATE_COMBINE))
    assert [pdl_late(k) for k in kinds] == [False, True, True]
    monkeypatch.setenv("DSV41_PDL_LATE", "7")
    assert all(pdl_late(k) for k in kinds)
    for bad in ("8", "all"):
        monkeypatch.setenv("DSV41_PDL_LATE", bad)
        with pytest.raises(ValueError, match=f"DSV41_PDL_LATE: expected 0 .. 7, got '{bad}'"):
            pdl_late(LATE_GEMV)
