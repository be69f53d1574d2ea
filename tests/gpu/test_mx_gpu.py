"""The MXFP8 cast's two rounds on the GPU: the hardware's e4m3 conversion (``mx_parts_tl``'s
``HW``, what the one-token GEMV prologue runs) against ``e4m3_round_tl`` and the torch reference.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from dsv41.common.mx import E4M3, MX_BLOCK, mx_parts_tl, mxfp8_quantize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ROWS, COLS = 64, 256


@triton.jit
def _parts_kernel(x_ptr, values_ptr, scales_ptr, ROWS: tl.constexpr, COLS: tl.constexpr,
                  HW: tl.constexpr):  # fmt: skip
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    values, scales = mx_parts_tl(tl.load(x_ptr + r * COLS + c), ROWS, COLS, HW)
    tl.store(values_ptr + r * COLS + c, values)
    b = tl.arange(0, COLS // 32)[None, :]
    tl.store(scales_ptr + r * (COLS // 32) + b, scales)


def _parts(x: torch.Tensor, hw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.empty_like(x)
    scales = torch.empty(ROWS, COLS // MX_BLOCK, dtype=torch.float32, device=x.device)
    _parts_kernel[(1,)](x, values, scales, ROWS=ROWS, COLS=COLS, HW=hw)
    return values, scales


def _inputs(seed: int) -> torch.Tensor:
    """Blocks of random values over 2^-40 .. 2^40; a quarter of the rows are ties instead: a
    block whose max is 448 * 2^e (its scale 2^e) holding values halfway between e4m3 neighbours
    at that scale, ``2^b (1 + (2m + 1) / 16)`` (normal) or ``(2m + 1) 2^-10`` (subnormal), so the
    round's nearest-even case decides them."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randn(ROWS, COLS // MX_BLOCK, MX_BLOCK, generator=g)
    blocks *= torch.exp2(torch.randint(-40, 41, (ROWS, COLS // MX_BLOCK, 1), generator=g).float())
    shape = (ROWS // 4, COLS // MX_BLOCK, MX_BLOCK)
    b = torch.randint(-6, 8, shape, generator=g).float()
    m = torch.randint(0, 8, shape, generator=g).float()
    ties = torch.exp2(b) * (1 + (2 * m + 1) / 16)
    sub = torch.rand(shape, generator=g) < 0.25
    ties[sub] = (2 * torch.randint(0, 32, shape, generator=g)[sub].float() + 1) * 2.0**-10
    ties[..., 0] = 448
    ties *= torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    e = torch.randint(-20, 21, (*shape[:2], 1), generator=g).float()
    blocks[: ROWS // 4] = ties * torch.exp2(e)
    return blocks.reshape(ROWS, COLS).cuda()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hardware_e4m3_round_equals_the_exact_round(seed):
    """Both rounds give the same e4m3 values and scales, bit for bit, and those are the torch
    reference's (``mxfp8_quantize``: its values as fp32 and its codes' scales)."""
    x = _inputs(seed)
    values, codes = mxfp8_quantize(x)
    assert values.dtype == E4M3
    want = (values.float(), torch.exp2(codes.float() - 127))
    for name, got in (("hardware", _parts(x, True)), ("exact", _parts(x, False))):
        assert torch.equal(got[0], want[0]), f"{name}: {int((got[0] != want[0]).sum())} values"
        assert torch.equal(got[1], want[1]), f"{name}: {int((got[1] != want[1]).sum())} scales"
