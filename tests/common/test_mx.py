"""MXFP8 (docs/design.md §3): E8M0 codes, round trips, weight block scales and the @triton.jit
helpers."""

from __future__ import annotations

import math
import re

import pytest
import torch
import triton
import triton.language as tl

from dsv41.common.mx import (
    E4M3,
    bf16_round_tl,
    block_to_row_scales,
    dequantize_weight,
    e4m3_round_tl,
    e4m3_saturate,
    e8m0_code,
    e8m0_code_tl,
    e8m0_scale,
    e8m0_scale_tl,
    mx_dequantize_tl,
    mx_quantize_tl,
    mxfp8_dequantize,
    mxfp8_quantize,
    quantize_weight_blocks,
)

F32_MAX = 3.4028234663852886e38
F32_MIN_SUBNORMAL = 2.0**-149
E4M3_MIN_NORMAL = 2.0**-6


def code_formula(amax: float) -> int:
    """``clamp(ceil(log2(amax / 448)) + 127, 0, 254)`` in python floats; amax 0 -> 0; Inf or NaN
    -> 255 (E8M0's NaN, docs/bad_inputs.md)."""
    if amax == 0:
        return 0
    if math.isinf(amax) or math.isnan(amax):
        return 255
    return min(max(math.ceil(math.log2(amax / 448.0)) + 127, 0), 254)


def _amax_cases() -> list[float]:
    cases = [0.0, F32_MIN_SUBNORMAL, 1e-40, 2.0**-130, 1e-30, 448.0, 449.0, 1.0, 0.5, F32_MAX,
             math.inf]
    for k in range(-130, 120, 7):
        edge = 448.0 * 2.0**k
        if edge < F32_MAX:
            # The boundary itself, the next fp32 above it, and just below it.
            f = torch.tensor(edge, dtype=torch.float32)
            up = torch.nextafter(f, torch.tensor(math.inf)).item()
            down = torch.nextafter(f, torch.tensor(0.0)).item()
            cases += [f.item(), up, down]
    return cases


def test_code_exact_points() -> None:
    got = e8m0_code(torch.tensor([0.0, 448.0, 449.0, math.inf, F32_MAX, 1e-40, 896.0, 897.0]))
    assert got.dtype == torch.uint8
    assert got.tolist() == [0, 127, 128, 255, 247, 0, 128, 129]


def test_code_matches_formula() -> None:
    cases = _amax_cases()
    got = e8m0_code(torch.tensor(cases, dtype=torch.float32)).tolist()
    want = [code_formula(torch.tensor(a, dtype=torch.float32).item()) for a in cases]
    bad = [(a, g, w) for a, g, w in zip(cases, got, want, strict=True) if g != w]
    assert not bad, bad[:5]
    # Sign does not matter.
    neg = e8m0_code(-torch.tensor(cases, dtype=torch.float32)).tolist()
    assert neg == got


def test_code_random_magnitudes() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.exp2(torch.rand(4000, generator=gen, dtype=torch.float64) * 260 - 140).float()
    got = e8m0_code(a).tolist()
    assert got == [code_formula(v) for v in a.tolist()]


def test_scale_is_power_of_two() -> None:
    codes = torch.arange(0, 255, dtype=torch.uint8)
    assert e8m0_scale(codes).double().tolist() == [2.0 ** (c - 127) for c in range(255)]


def _random_blocks(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random values with a different magnitude per 32-block, across many exponents."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    mag = torch.exp2(torch.randint(-40, 40, (rows, cols // 32), generator=gen).float())
    return x * mag.repeat_interleave(32, dim=1)


def test_round_trip_precision() -> None:
    x = _random_blocks(64, 256, seed=1)
    values, codes = mxfp8_quantize(x)
    assert values.dtype == E4M3 and codes.dtype == torch.uint8 and codes.shape == (64, 8)
    amax = x.view(64, 8, 32).abs().amax(-1)
    assert codes.tolist() == [[code_formula(a) for a in row] for row in amax.tolist()]
    scale = torch.exp2(codes.double() - 127).repeat_interleave(32, dim=1)
    back = mxfp8_dequantize(values, codes)
    assert back.dtype == torch.float32
    assert torch.equal(back.double(), values.double() * scale)
    normal = x.abs().double() >= E4M3_MIN_NORMAL * scale
    rel = ((back.double() - x.double()).abs() / x.abs().double())[normal]
    assert normal.float().mean() > 0.9
    assert rel.max() <= 2.0**-4
    # Below the subnormal range: the error is at most half an e4m3 subnormal step.
    sub_err = (back.double() - x.double()).abs()[~normal]
    assert (sub_err <= 2.0**-10 * scale[~normal]).all()
    # Every block's largest value lands in (224, 448] after scaling (224 after rounding).
    top = values.float().abs().view(64, 8, 32).amax(-1)
    assert ((top >= 224) & (top <= 448)).all()


def test_saturation_and_zero_block() -> None:
    x = _random_blocks(2, 128, seed=2)
    x[0, :32] = 0.0  # an all-zero block
    x[1, 32:64] = 0.0
    x[1, 40] = 449.0  # amax just above 448: code 128, scale 2
    x[1, 64:96] = 1e37  # huge finite block
    x[1, 64] = -3e38  # code 247, scale 2^120: -3e38 / 2^120 = -225.7 -> -224
    values, codes = mxfp8_quantize(x)
    assert codes[0, 0] == 0 and codes[1, 1] == 128 and codes[1, 2] == code_formula(3e38) == 247
    assert torch.equal(values[0, :32].float(), torch.zeros(32))
    assert values[1, 40].float() == 224.0  # 449 / 2 = 224.5 -> 224 (e4m3 step 16 there)
    back = mxfp8_dequantize(values, codes)
    assert torch.isfinite(back).all()
    assert values[1, 64].float() == -224.0
    assert torch.equal(values[1, 65:96].float(), torch.full((31,), 7.5))  # 1e37 / 2^120 = 7.52
    # A block whose amax is exactly 2^k * 448 maps it to 448; one fp32 ulp above, to 224.
    edge = torch.tensor([[448.0 * 4] + [1.0] * 31, [-448.0 * 4 * (1 + 2**-23)] + [1.0] * 31])
    v, c = mxfp8_quantize(edge)
    assert c[:, 0].tolist() == [129, 130]
    assert v[:, 0].float().tolist() == [448.0, -224.0]


def test_e4m3_saturate() -> None:
    x = torch.tensor([1000.0, -1e30, 464.0, -449.0, 447.0, 0.3, math.inf, -math.inf])
    got = e4m3_saturate(x).float().tolist()
    assert got == [448.0, -448.0, 448.0, -448.0, 448.0, 0.3125, 448.0, -448.0]


def test_bad_shapes() -> None:
    with pytest.raises(ValueError, match="x: expected a last dim that is a multiple of 32, got 40"):
        mxfp8_quantize(torch.ones(2, 40))
    with pytest.raises(ValueError, match="codes: expected shape"):
        mxfp8_dequantize(torch.ones(2, 64).to(E4M3), torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="w: expected K a multiple of 32"):
        quantize_weight_blocks(torch.ones(48, 40))
    with pytest.raises(ValueError, match=re.escape("block: expected (rows, cols) > 0 with cols a multiple of 32, got (128, 48)")):
        quantize_weight_blocks(torch.ones(48, 64), (128, 48))
    with pytest.raises(ValueError, match=re.escape("block_codes: expected [1, 1] for a [96, 64] weight")):
        block_to_row_scales(torch.zeros(2, 1, dtype=torch.uint8), (128, 128), (96, 64))


def test_weight_blocks_equal_per_row_quantization() -> None:
    gen = torch.Generator().manual_seed(3)
    w = _random_blocks(96, 128, seed=3)
    values, block_codes = quantize_weight_blocks(w)
    assert block_codes.shape == (3, 4)
    block_amax = w.view(3, 32, 4, 32).abs().amax(dim=(1, 3))
    assert block_codes.tolist() == [[code_formula(a) for a in r] for r in block_amax.tolist()]
    row_codes = block_to_row_scales(block_codes)
    assert row_codes.shape == (96, 4)
    assert torch.equal(row_codes, block_codes.repeat_interleave(32, 0))
    # Per-row quantization of a weight whose row blocks all share the 32x32 block's amax:
    # plant the block amax in every row of the block (at a random column of each row block).
    shared = w.clone()
    cols = torch.randint(0, 32, (96, 4), generator=gen)
    sign = torch.where(torch.rand(96, 4, generator=gen) < 0.5, -1.0, 1.0)
    for r in range(96):
        for b in range(4):
            shared[r, b * 32 + cols[r, b]] = sign[r, b] * block_amax[r // 32, b]
    sv, sc = quantize_weight_blocks(shared)
    rv, rc = mxfp8_quantize(shared)
    assert torch.equal(block_to_row_scales(sc), rc)
    assert torch.equal(sv.view(torch.uint8), rv.view(torch.uint8))
    assert torch.equal(dequantize_weight(sv, block_to_row_scales(sc)), mxfp8_dequantize(rv, rc))
    # And the block quantization of w round-trips within e4m3 precision of its block scale.
    back = dequantize_weight(values, row_codes).double()
    scale = torch.exp2(row_codes.double() - 127).repeat_interleave(32, dim=1)
    assert ((back - w.double()).abs() <= torch.maximum(w.abs().double() * 2.0**-4,
                                                        scale * 2.0**-10)).all()


# ----------------------------------------------------------------------------
# The @triton.jit helpers, under the interpreter on CPU.


@triton.jit
def _mx_helpers_kernel(x_ptr, val_ptr, code_ptr, scale_ptr, deq_ptr, amax_ptr, amax_code_ptr,
                       N_AMAX, ROWS: tl.constexpr, COLS: tl.constexpr, AMAX_BLOCK: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    x = tl.load(x_ptr + r[:, None] * COLS + c[None, :])
    values, code = mx_quantize_tl(x, ROWS, COLS)
    tl.store(val_ptr + r[:, None] * COLS + c[None, :], values.to(tl.float32))
    b = tl.arange(0, COLS // 32)
    tl.store(code_ptr + r[:, None] * (COLS // 32) + b[None, :], code)
    tl.store(scale_ptr + r[:, None] * (COLS // 32) + b[None, :], e8m0_scale_tl(code))
    tl.store(deq_ptr + r[:, None] * COLS + c[None, :], mx_dequantize_tl(values, code, ROWS, COLS))
    # e8m0_code_tl straight on a vector of amax values.
    a = tl.arange(0, AMAX_BLOCK)
    amax = tl.load(amax_ptr + a, mask=a < N_AMAX, other=0.0)
    tl.store(amax_code_ptr + a, e8m0_code_tl(amax), mask=a < N_AMAX)


def test_triton_helpers_match_torch() -> None:
    rows, cols = 8, 128
    x = _random_blocks(rows, cols, seed=4)
    x[1, :32] = 0.0  # zero block
    x[1, 32:64] *= 0
    x[1, 40] = 449.0
    x[2, :32] = x[2, :32].sign() * 448.0 * 4  # amax exactly 2^2 * 448
    x[3, :32] = F32_MIN_SUBNORMAL * torch.arange(32)  # subnormal amax
    values = torch.empty(rows, cols)
    codes = torch.empty(rows, cols // 32, dtype=torch.int32)
    scales = torch.empty(rows, cols // 32)
    deq = torch.empty(rows, cols)
    amax = torch.tensor(_amax_cases(), dtype=torch.float32)
    amax_code = torch.empty(amax.numel(), dtype=torch.int32)
    _mx_helpers_kernel[(1,)](x, values, codes, scales, deq, amax, amax_code, amax.numel(),
                             ROWS=rows, COLS=cols, AMAX_BLOCK=triton.next_power_of_2(amax.numel()))

    want_values, want_codes = mxfp8_quantize(x)
    assert torch.equal(codes, want_codes.int())
    assert torch.equal(scales, e8m0_scale(want_codes))
    assert torch.equal(amax_code, e8m0_code(amax).int())
    assert amax_code.tolist() == [code_formula(a) for a in amax.tolist()]
    # Values: e4m3_round_tl makes the interpreter's cast exact, so they agree bit for bit.
    assert torch.equal(values, want_values.float())
    assert torch.equal(deq, values * scales.repeat_interleave(32, dim=1))
    torch.testing.assert_close(deq, mxfp8_dequantize(want_values, want_codes), rtol=0, atol=0)


@triton.jit
def _e4m3_round_kernel(x_ptr, out_ptr, cast_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < N, other=0.0)
    r = e4m3_round_tl(x)
    tl.store(out_ptr + i, r, mask=i < N)
    tl.store(cast_ptr + i, r.to(tl.float8e4nv).to(tl.float32), mask=i < N)


def test_e4m3_round_tl_matches_torch_cast() -> None:
    """Every e4m3 value, every midpoint (ties), and points just either side of them."""
    grid = torch.arange(0, 256, dtype=torch.uint8).view(E4M3).float()
    grid = grid[torch.isfinite(grid)].unique()  # sorted, -448 .. 448
    mid = (grid[1:] + grid[:-1]) / 2
    inf = torch.tensor(math.inf)
    x = torch.cat([grid, mid, torch.nextafter(mid, inf), torch.nextafter(mid, -inf),
                   torch.rand(2000, generator=torch.Generator().manual_seed(5)) * 896 - 448,
                   torch.tensor([2.0**-10, 2.0**-11, -(2.0**-10) * 3, 1e-30, -1e-45])])
    out, cast = torch.empty_like(x), torch.empty_like(x)
    _e4m3_round_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, cast, x.numel(), BLOCK=1024)
    want = x.to(E4M3).float()
    assert torch.equal(out, want)
    assert torch.equal(cast, want)


@triton.jit
def _bf16_round_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, bf16_round_tl(tl.load(x_ptr + i, mask=i < N, other=0.0)), mask=i < N)


def test_bf16_round_tl_keeps_every_nan_and_rounds_to_nearest_even() -> None:
    """Random values against torch's bf16 cast, and NaN in the encodings a GPU produces
    (0x7FFFFFFF, its canonical NaN, and 0xFFFFFFFF), not only the interpreter's 0x7FC00000:
    the integer rounding once carried 0x7FFFFFFF into the sign bit and gave -0.0."""
    vals = torch.randn(200, generator=torch.Generator().manual_seed(6)) * 1e3
    nans = torch.tensor([0x7FFFFFFF, -1, 0x7FC00000, 0x7F800001], dtype=torch.int32).view(torch.float32)
    x = torch.cat([vals, nans, torch.tensor([math.inf, -math.inf, 3.3895e38])])
    out = torch.empty_like(x)
    _bf16_round_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    assert out[200:204].isnan().all(), out[200:204]
    finite = torch.cat([vals, x[204:]])
    assert torch.equal(torch.cat([out[:200], out[204:]]), finite.bfloat16().float())
