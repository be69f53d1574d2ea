"""MXFP8: e4m3 values with one E8M0 power-of-two code per 32 values (docs/design.md §3).

``code = clamp(ceil(log2(amax / 448)) + 127, 0, 254)``, ``scale = 2^(code - 127)``,
``value = e4m3(clamp(x / scale, -448, 448))``; a block whose amax is 0 gets code 0
and zeros; a block holding a NaN or an Inf gets E8M0's NaN code 255, its values e4m3 NaN
and its scale NaN, so the block dequantizes to NaN in torch and in every kernel alike
(docs/bad_inputs.md). The code is computed from the bits of amax, not from a float log2,
so it is exact at every power-of-two boundary: with ``amax = 1.m * 2^(e - 127)``
and ``448 = 1.75 * 2^8``, ``code = e - 8 + (1.m > 1.75)``. The torch functions
here are the reference; the ``@triton.jit`` helpers at the bottom are the same
cast for kernels, shared by both backends.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MX_BLOCK = 32  # values sharing one E8M0 code
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
E8M0_BIAS = 127
E8M0_MAX_CODE = 254  # largest finite code
E8M0_NAN = 255  # E8M0's NaN: the code of a block holding a NaN or an Inf
E4M3 = torch.float8_e4m3fn
_F32_MANT_BITS = 23
_MANT_1_75 = 0x600000  # mantissa bits of 1.75 (448 = 1.75 * 2^8)


def e8m0_code(amax: torch.Tensor) -> torch.Tensor:
    """``clamp(ceil(log2(amax / 448)) + 127, 0, 254)`` as uint8, exactly; amax 0 -> 0;
    amax NaN or Inf -> 255 (E8M0's NaN)."""
    bits = amax.float().abs().contiguous().view(torch.int32)
    exp = (bits >> _F32_MANT_BITS) & 0xFF
    mant = bits & ((1 << _F32_MANT_BITS) - 1)
    code = exp - 8 + (mant > _MANT_1_75).int()
    code = torch.where(exp == 0xFF, E8M0_NAN, code.clamp(0, E8M0_MAX_CODE))  # inf / nan
    return code.to(torch.uint8)


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """``2^exponent`` in fp32, exact for integer exponents in [-149, 127]."""
    return torch.ldexp(torch.ones(exponent.shape, dtype=torch.float32, device=exponent.device), exponent.int())


def e8m0_scale(codes: torch.Tensor) -> torch.Tensor:
    """``2^(code - 127)`` in fp32; NaN for code 255."""
    return torch.where(codes == E8M0_NAN, float("nan"), pow2(codes.int() - E8M0_BIAS))


def e4m3_saturate(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3 with round-to-nearest-even and saturation at +-448."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def mxfp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` -> ``(values e4m3 [..., K], codes uint8 [..., K/32])`` along the last dim."""
    k = x.shape[-1]
    if k % MX_BLOCK:
        raise ValueError(f"x: expected a last dim that is a multiple of {MX_BLOCK}, got {k}")
    blocks = x.float().reshape(*x.shape[:-1], k // MX_BLOCK, MX_BLOCK)
    codes = e8m0_code(blocks.abs().amax(dim=-1))
    inv_scale = pow2(E8M0_BIAS - codes.int())
    values = e4m3_saturate(blocks * inv_scale.unsqueeze(-1))
    values = torch.where((codes == E8M0_NAN).unsqueeze(-1), float("nan"), values.float()).to(E4M3)
    return values.reshape(x.shape), codes


def mxfp8_dequantize(values: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``values [..., K] * 2^(codes - 127)`` broadcast over each 32 values, fp32."""
    k = values.shape[-1]
    if codes.shape != (*values.shape[:-1], k // MX_BLOCK):
        raise ValueError(
            f"codes: expected shape {(*values.shape[:-1], k // MX_BLOCK)} for values "
            f"{tuple(values.shape)}, got {tuple(codes.shape)}"
        )
    scale = e8m0_scale(codes).repeat_interleave(MX_BLOCK, dim=-1)
    return values.float() * scale


def mxfp8_round(x: torch.Tensor) -> torch.Tensor:
    """The value an MXFP8 round trip gives, fp32: ``dequantize(quantize(x))``."""
    return mxfp8_dequantize(*mxfp8_quantize(x))


def _check_block(block: tuple[int, int]) -> None:
    bn, bk = block
    if bn <= 0 or bk <= 0 or bk % MX_BLOCK:
        raise ValueError(
            f"block: expected (rows, cols) > 0 with cols a multiple of {MX_BLOCK}, got {tuple(block)}"
        )


def quantize_weight_blocks(
    w: torch.Tensor, block: tuple[int, int] = (MX_BLOCK, MX_BLOCK)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint format: ``w [N, K]`` -> ``(e4m3 [N, K], codes uint8 [ceil(N/bn), ceil(K/bk)])``,
    one code a ``block = (bn, bk)`` block (a last partial block takes the amax of what it holds)."""
    _check_block(block)
    n, k = w.shape
    if k % MX_BLOCK:
        raise ValueError(f"w: expected K a multiple of {MX_BLOCK}, got {tuple(w.shape)}")
    bn, bk = block
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    blocks = padded.reshape(nb, bn, kb, bk)
    codes = e8m0_code(blocks.abs().amax(dim=(1, 3)))
    inv_scale = pow2(E8M0_BIAS - codes.int())
    values = e4m3_saturate(blocks * inv_scale[:, None, :, None]).reshape(nb * bn, kb * bk)
    return values[:n, :k].contiguous(), codes


def block_to_row_scales(
    block_codes: torch.Tensor,
    block: tuple[int, int] = (MX_BLOCK, MX_BLOCK),
    shape: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Block codes ``[ceil(N/bn), ceil(K/bk)]`` -> per-row codes ``[N, K/32]``: each code repeated
    on its block's rows and on each 32 columns it covers. ``shape`` = (N, K) of the weight
    (default: whole blocks)."""
    _check_block(block)
    bn, bk = block
    nb, kb = block_codes.shape
    n, k = shape if shape is not None else (nb * bn, kb * bk)
    if (nb, kb) != (-(-n // bn), -(-k // bk)) or k % MX_BLOCK:
        raise ValueError(
            f"block_codes: expected [{-(-n // bn)}, {-(-k // bk)}] for a [{n}, {k}] weight in "
            f"{bn} x {bk} blocks, got {list(block_codes.shape)}"
        )
    rows = block_codes.repeat_interleave(bk // MX_BLOCK, dim=1)[:, : k // MX_BLOCK]
    return rows.repeat_interleave(bn, dim=0)[:n]


def dequantize_weight(values: torch.Tensor, row_codes: torch.Tensor) -> torch.Tensor:
    """A loaded weight ``e4m3 [N, K]`` with per-row codes ``[N, K/32]`` -> fp32 [N, K]."""
    return mxfp8_dequantize(values, row_codes)


# ----------------------------------------------------------------------------
# The same cast inside kernels. Triton 3.6 and 3.9 both compile these.


@triton.jit
def e8m0_code_tl(amax):
    """E8M0 code of fp32 ``amax`` (>= 0) from its bits, int32 in [0, 254]; 255 (NaN) for an
    amax NaN or Inf (read from the bits: a float max may drop a NaN, its bits do not lie)."""
    bits = amax.to(tl.int32, bitcast=True)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    code = exp - 8 + (mant > 0x600000).to(tl.int32)
    return tl.where(exp == 0xFF, 255, tl.minimum(tl.maximum(code, 0), 254))


@triton.jit
def e8m0_scale_tl(code):
    """``2^(code - 127)`` as fp32 from an int32 code in [0, 254] (code 0 is the subnormal 2^-127);
    NaN for code 255."""
    bits = tl.where(code > 0, tl.where(code == 255, 0x7FC00000, code << 23), 0x400000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e8m0_inv_scale_tl(code):
    """``2^(127 - code)`` as fp32 from an int32 code in [0, 254]."""
    bits = tl.where(code < 254, (254 - code) << 23, 0x400000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def bf16_round_tl(x):
    """fp32 ``x`` rounded to nearest-even bf16, kept fp32 (the interpreter's cast truncates); a
    NaN stays NaN (the GPU's NaN 0x7FFFFFFF would carry into the sign bit and become -0.0)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return tl.where(x != x, x, ((bits >> 16) << 16).to(tl.float32, bitcast=True))


@triton.jit
def bf16_rn_tl(x, HW: tl.constexpr):
    """``bf16_round_tl(x)``; with ``HW`` (the GPU, whose cast rounds to nearest even) the cast
    to bf16 and back: one conversion each way instead of ~4 integer steps a value."""
    if HW:
        return x.to(tl.bfloat16).to(tl.float32)
    return bf16_round_tl(x)


@triton.jit
def e4m3_round_tl(x):
    """fp32 ``x`` (|x| <= 448) rounded to the nearest-even e4m3 value, still fp32.

    ``(|x| + m) - m`` with ``m = 2^(max(e, -6) + 20)`` (``e`` = x's binary exponent)
    leaves exactly 3 fraction bits (the e4m3 step, 2^-9 in its subnormal range),
    so the later cast to e4m3 is exact. The Triton interpreter's own cast drops
    the carry when rounding up crosses a power of two with an odd exponent
    (124 -> 64, not 128); rounding here first makes both executors agree.
    """
    mag = tl.abs(x)
    exp = tl.maximum((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF, 121)  # 121: 2^-6
    magic = ((exp + 20) << 23).to(tl.float32, bitcast=True)
    rounded = (mag + magic) - magic
    return tl.where(x < 0, -rounded, rounded)


@triton.jit
def amax_tl(blocks):
    """``max |v|`` over the last axis of ``blocks``, as the max of the magnitudes' int32 bits: a
    NaN or an Inf (exponent bits all ones) wins, whatever NaN rule the float max follows."""
    bits = tl.max(tl.abs(blocks).to(tl.int32, bitcast=True), axis=2)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e4m3_nan_bits_tl(bits, code, ROWS: tl.constexpr, COLS: tl.constexpr, GROUP: tl.constexpr):
    """uint8 e4m3 ``bits [ROWS, COLS]`` with the blocks (``GROUP`` values a code) of code 255 set
    to 0x7F, e4m3's NaN as torch writes it (the interpreter's cast of a NaN gives another byte)."""
    nan = tl.reshape(tl.broadcast_to((code == 255)[:, :, None], (ROWS, COLS // GROUP, GROUP)),
                     (ROWS, COLS))  # fmt: skip
    return tl.where(nan, 0x7F, bits).to(tl.uint8)


@triton.jit
def _mx_scaled_tl(x, ROWS: tl.constexpr, COLS: tl.constexpr, HW: tl.constexpr):
    """fp32 ``x [ROWS, COLS]`` -> (its e4m3 values as exact fp32 [ROWS, COLS // 32, 32], int32
    codes [ROWS, COLS // 32]). ``HW`` (the GPU only): the round is the hardware's fp32 -> e4m3
    conversion (nearest even, saturating at 448) and back, two values an instruction each way,
    the same values as ``e4m3_round_tl``'s ~10 steps a value (which the interpreter needs: its
    own cast drops a carry). A block of code 255 (a NaN or an Inf in it) keeps the values the
    round gave: each caller makes it NaN by its NaN scale or NaN bytes, so no mask costs
    registers here (one took the two-token wq_b from 5 to 4 programs a SM on SM90)."""
    blocks = tl.reshape(x, (ROWS, COLS // 32, 32))
    code = e8m0_code_tl(amax_tl(blocks))
    scaled = blocks * e8m0_inv_scale_tl(code)[:, :, None]
    if HW:
        values = scaled.to(tl.float8e4nv).to(tl.float32)
    else:
        values = e4m3_round_tl(tl.minimum(tl.maximum(scaled, -448.0), 448.0))
    return values, code


@triton.jit
def mx_quantize_tl(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """fp32 ``x [ROWS, COLS]`` -> (e4m3 values [ROWS, COLS], int32 codes [ROWS, COLS // 32])."""
    scaled, code = _mx_scaled_tl(x, ROWS, COLS, False)
    bits = tl.reshape(scaled, (ROWS, COLS)).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return e4m3_nan_bits_tl(bits, code, ROWS, COLS, 32).to(tl.float8e4nv, bitcast=True), code


@triton.jit
def mx_parts_tl(x, ROWS: tl.constexpr, COLS: tl.constexpr, HW: tl.constexpr):
    """fp32 ``x [ROWS, COLS]`` -> ``mxfp8(x)`` as two fp32 parts: its e4m3 values ``[ROWS,
    COLS]`` and their block scales ``2^(code - 127)`` ``[ROWS, COLS // 32]`` (``HW``: as in
    ``_mx_scaled_tl``); a NaN / Inf block's scale is NaN, so its products are NaN."""
    values, code = _mx_scaled_tl(x, ROWS, COLS, HW)
    return tl.reshape(values, (ROWS, COLS)), e8m0_scale_tl(code)


@triton.jit
def mx_round_tl(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """``dequant(mxfp8(x))`` of fp32 ``x [ROWS, COLS]``, fp32: the rounded values are exact
    e4m3 already, so no cast to e4m3 and back."""
    scaled, code = _mx_scaled_tl(x, ROWS, COLS, False)
    return tl.reshape(scaled * e8m0_scale_tl(code)[:, :, None], (ROWS, COLS))


@triton.jit
def code_rows_tl(code_ptrs, valid, NG: tl.constexpr, WORDS: tl.constexpr):
    """int32 E8M0 codes ``[R, NG]`` of the rows whose codes start at the uint8 ``code_ptrs [R]``
    (0 where not ``valid``). ``WORDS`` (the rows' codes 4-B aligned, NG a multiple of 4): code
    g is byte g % 4 of int32 word g // 4, each word read once a code (no reshape, so the codes
    take the values' layout), so a loop's pipeliner copies them ahead with the values (it
    takes no 1-B loads)."""
    g = tl.arange(0, NG)
    if WORDS:
        words = tl.load(code_ptrs.to(tl.pointer_type(tl.int32))[:, None] + (g // 4)[None, :],
                        mask=valid[:, None], other=0)  # fmt: skip
        return (words >> ((g % 4) * 8)[None, :]) & 0xFF
    return tl.load(code_ptrs[:, None] + g[None, :], mask=valid[:, None], other=0).to(tl.int32)


@triton.jit
def mx_dequantize_tl(values, code, ROWS: tl.constexpr, COLS: tl.constexpr):
    """e4m3 ``values [ROWS, COLS]`` and int32 ``code [ROWS, COLS // 32]`` -> fp32 [ROWS, COLS]."""
    blocks = tl.reshape(values.to(tl.float32), (ROWS, COLS // 32, 32))
    return tl.reshape(blocks * e8m0_scale_tl(code)[:, :, None], (ROWS, COLS))
