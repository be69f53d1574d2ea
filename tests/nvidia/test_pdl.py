"""Which launches use programmatic dependent launch: the token buckets, the switch, the checks."""

from __future__ import annotations

import pytest

from dsv41.common.geometry import Dims
from dsv41.common.platform import parse_target, targeting
from dsv41.nvidia.ops.mx_gemm import (
    PRELOAD_BLOCK_K,
    PRELOAD_MAX_M,
    PRELOAD_PROGRAMS_PER_SM,
    gemm_config,
)
from dsv41.nvidia.ops.pdl import PDL_MAX_TOKENS, pdl_enabled, pdl_launch_options
from dsv41.nvidia.tuning import GEMM_SITES, gemm_shapes, preload_changes, resolve


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


@pytest.mark.parametrize("tp", [4, 2])
def test_mma_steps_take_pdl_where_every_grid_fits_one_wave(monkeypatch, tp) -> None:
    """An H200's tuning (132 SMs) of steps past the CUDA-core buckets: up to PRELOAD_MAX_M
    tokens every GEMM reads one K step before the wait and PDL is on where each such grid fits
    PRELOAD_PROGRAMS_PER_SM programs a SM (tp 4); otherwise (tp 2, its grids twice the size)
    the pipelined loop runs without PDL; past PRELOAD_MAX_M neither, unless DSV41_PDL forces."""
    monkeypatch.delenv("DSV41_PDL", raising=False)
    dims = Dims.of("dsv41-flash", tp)
    with targeting(parse_target("sm90")):
        t = resolve(dims, 132, PRELOAD_MAX_M)
        cfgs = [getattr(t, site) for site in GEMM_SITES]
        one_step = [gemm_config(PRELOAD_MAX_M, n, k, n_per_group=npg or n, quant_out=q, sms=132,
                                gemv_ok=False, preload=PRELOAD_BLOCK_K)
                    for n, k, npg, q in gemm_shapes(dims).values()]  # fmt: skip
        programs = [-(-n // c.block_n) * c.split_k
                    for c, (n, *_) in zip(one_step, gemm_shapes(dims).values())]  # fmt: skip
        fits = max(programs) <= PRELOAD_PROGRAMS_PER_SM * 132
        assert fits == (tp == 4), programs
        assert t.pdl == fits and all(c.preload == fits and not c.gemv for c in cfgs), t
        if fits:  # the A/B helper's fields are the default's
            assert all(c.block_k <= PRELOAD_BLOCK_K and c.block_k * c.split_k == k
                       for c, (_, k, *_) in zip(cfgs, gemm_shapes(dims).values()))  # fmt: skip
            fields = preload_changes(dims, PRELOAD_MAX_M, PRELOAD_BLOCK_K)
            assert fields == {name: getattr(getattr(t, name.split(".")[0]), name.split(".")[1])
                              for name in fields}  # fmt: skip
        late = resolve(dims, 132, 2 * PRELOAD_MAX_M)
        assert not late.pdl and not any(getattr(late, s).preload for s in GEMM_SITES)
        monkeypatch.setenv("DSV41_PDL", "1")
        assert resolve(dims, 132, 2 * PRELOAD_MAX_M).pdl
        monkeypatch.delenv("DSV41_PDL")
        assert pdl_enabled(PRELOAD_MAX_M) and not pdl_enabled(PRELOAD_MAX_M, weights_first=False)
