"""RoPE (docs/design.md §1, §2): GPT-J pairs on dims 448..511, plain and YaRN frequencies, the
inverse."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from dsv41.common.rope import (
    apply_inverse_rope,
    apply_rope,
    cos_sin_cache,
    inv_frequencies,
    rope_pair_tl,
    rope_tables,
)
from dsv41.config import load_model_config

NOPE, ROPE = 448, 64


def plain_freqs(theta: float, dim: int = ROPE) -> list[float]:
    """``theta^(-2i/dim)``, i = 0 .. dim/2 - 1."""
    return [theta ** (-2 * i / dim) for i in range(dim // 2)]


def yarn_freqs(theta: float, factor: float, orig: int, beta_fast: float, beta_slow: float,
               dim: int = ROPE) -> list[float]:
    """DeepSeek YaRN: blend f and f / factor with a linear ramp between the correction dims."""

    def correction_dim(rotations: float) -> float:
        # The dim whose wavelength 2 pi / f fits `rotations` times into `orig` positions.
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if high == low:
        high += 0.001
    out = []
    for i, f in enumerate(plain_freqs(theta, dim)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        smooth = 1 - ramp
        out.append(f / factor * (1 - smooth) + f * smooth)
    return out


def test_plain_frequencies() -> None:
    for model in ("tiny", "dsv41-flash"):
        rope = load_model_config(model).rope_window
        got = inv_frequencies(ROPE, rope)
        assert got.dtype == torch.float32 and got.shape == (32,)
        want = torch.tensor(plain_freqs(rope.theta), dtype=torch.float64)
        torch.testing.assert_close(got.double(), want, rtol=1e-7, atol=0)


@pytest.mark.parametrize("model", ["tiny", "dsv41-flash"])
def test_yarn_frequencies(model: str) -> None:
    rope = load_model_config(model).rope_compressed
    y = rope.yarn
    got = inv_frequencies(ROPE, rope).double()
    want = torch.tensor(yarn_freqs(rope.theta, y.factor, y.original_max_position, y.beta_fast,
                                   y.beta_slow), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=0)
    plain = torch.tensor(plain_freqs(rope.theta), dtype=torch.float64)
    # Short wavelengths keep f, long ones become f / factor, with a ramp in between.
    assert got[0] == pytest.approx(plain[0].item(), rel=1e-7)
    assert got[-1] == pytest.approx(plain[-1].item() / y.factor, rel=1e-7)
    ratio = plain / got
    assert ((ratio >= 1 - 1e-6) & (ratio <= y.factor * (1 + 1e-6))).all()
    assert (ratio[1:] >= ratio[:-1] * (1 - 1e-6)).all()  # monotone in the pair index


def test_flash_yarn_ramp_range() -> None:
    """At dsv41-flash the ramp runs from dim 15 to 25 (theta 160000, original 65536)."""
    f = torch.tensor(yarn_freqs(160000.0, 16.0, 65536, 32.0, 1.0))
    p = torch.tensor(plain_freqs(160000.0))
    assert torch.allclose(f[:16], p[:16]) and torch.allclose(f[25:], p[25:] / 16)
    assert not torch.allclose(f[16:25], p[16:25]) and not torch.allclose(f[16:25], p[16:25] / 16)


def test_cos_sin_cache() -> None:
    rope = load_model_config("tiny").rope_compressed
    cos, sin = cos_sin_cache(ROPE, rope, 300)
    assert cos.shape == sin.shape == (300, 32) and cos.dtype == torch.float32
    f = inv_frequencies(ROPE, rope).double()
    pos = torch.arange(300, dtype=torch.float64)[:, None]
    torch.testing.assert_close(cos.double(), torch.cos(pos * f), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.double(), torch.sin(pos * f), rtol=0, atol=1e-7)


def _complex_rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Pairs (v0, v1) as v0 + i v1 times exp(i pos f), float64; x [M, ..., 512]."""
    x = x.double()
    pairs = torch.complex(x[..., NOPE::2], x[..., NOPE + 1 :: 2])
    angle = positions.double()[:, None] * freqs.double()[None, :]
    turn = torch.polar(torch.ones_like(angle), angle)
    turn = turn.view(turn.shape[0], *([1] * (x.dim() - 2)), turn.shape[1])
    out = x.clone()
    rotated = pairs * turn
    out[..., NOPE::2] = rotated.real
    out[..., NOPE + 1 :: 2] = rotated.imag
    return out


@pytest.mark.parametrize("layer_id", [0, 1])
def test_forward_is_complex_multiplication(layer_id: int) -> None:
    model = load_model_config("tiny")
    gen = torch.Generator().manual_seed(layer_id)
    positions = torch.randint(0, model.max_position, (6,), generator=gen)
    positions[0] = 0
    cos, sin = rope_tables(model, layer_id)
    freqs = inv_frequencies(ROPE, model.rope_for_layer(layer_id))
    for shape in ((6, 512), (6, 3, 512)):
        x = torch.randn(shape, generator=gen)
        got = apply_rope(x, positions, cos, sin, NOPE)
        assert got.dtype == torch.float32
        assert torch.equal(got[..., :NOPE], x[..., :NOPE])  # nope dims untouched
        torch.testing.assert_close(got.double(), _complex_rope(x, positions, freqs),
                                   rtol=0, atol=2e-6)
    assert torch.equal(got[0], x[0])  # position 0 turns by nothing


def test_inverse_undoes_forward() -> None:
    model = load_model_config("tiny")
    gen = torch.Generator().manual_seed(2)
    positions = torch.randint(0, model.max_position, (8,), generator=gen)
    cos, sin = rope_tables(model, 2)
    x = torch.randn(8, 4, 512, generator=gen)
    back = apply_inverse_rope(apply_rope(x, positions, cos, sin, NOPE), positions, cos, sin, NOPE)
    torch.testing.assert_close(back, x, rtol=0, atol=1e-5)
    xb = x.bfloat16()
    turned = apply_rope(xb, positions, cos, sin, NOPE)
    assert turned.dtype == torch.bfloat16
    back = apply_inverse_rope(turned, positions, cos, sin, NOPE)
    assert back.dtype == torch.bfloat16
    err = (back.float() - xb.float()).abs()
    assert err.max() <= 2.0**-6 * xb.float().abs().max()  # two bf16 roundings
    assert err.mean() <= 2.0**-9
    assert torch.equal(back[..., :NOPE], xb[..., :NOPE])
    # The inverse is the turn by -angle.
    freqs = inv_frequencies(ROPE, model.rope_for_layer(2))
    torch.testing.assert_close(apply_inverse_rope(x, positions, cos, sin, NOPE).double(),
                               _complex_rope(x, -positions, freqs), rtol=0, atol=2e-6)


def test_rope_tables_per_layer_kind() -> None:
    model = load_model_config("tiny")
    cos0, _ = rope_tables(model, 0)
    cos1, _ = rope_tables(model, 1)
    assert cos0.shape == (model.max_position, 32)
    assert rope_tables(model, 0)[0] is cos0  # built once
    assert rope_tables(model, 2)[0] is cos1  # layers 1 and 2 share the YaRN table
    assert not torch.equal(cos0, cos1)
    want0, _ = cos_sin_cache(ROPE, model.rope_window, model.max_position)
    assert torch.equal(cos0, want0)


@triton.jit
def _rope_pair_kernel(x_ptr, c_ptr, s_ptr, out_ptr, INVERSE: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    v0 = tl.load(x_ptr + 2 * i)
    v1 = tl.load(x_ptr + 2 * i + 1)
    a, b = rope_pair_tl(v0, v1, tl.load(c_ptr + i), tl.load(s_ptr + i), INVERSE)
    tl.store(out_ptr + 2 * i, a)
    tl.store(out_ptr + 2 * i + 1, b)


@pytest.mark.parametrize("inverse", [False, True])
def test_rope_pair_tl(inverse: bool) -> None:
    model = load_model_config("tiny")
    cos, sin = rope_tables(model, 1)
    gen = torch.Generator().manual_seed(3)
    pos = torch.randint(0, model.max_position, (1,), generator=gen)
    x = torch.randn(1, 512, generator=gen)
    out = torch.empty(64)
    _rope_pair_kernel[(1,)](x[0, NOPE:].contiguous(), cos[pos[0]].contiguous(),
                            sin[pos[0]].contiguous(), out, INVERSE=inverse, N=32)
    want = (apply_inverse_rope if inverse else apply_rope)(x, pos, cos, sin, NOPE)[0, NOPE:]
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
