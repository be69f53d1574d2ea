"""The q tile read from the fused Q layout (``fused_layout_tl``) against the standard layout
made by ``permute_q_from_fused``."""

import pytest
import torch
import triton
import triton.language as tl

from dsv41.common.fused_layout import permute_q_from_fused, permute_q_to_fused
from dsv41.common.fused_layout_tl import q_tile_at_tl, q_tile_heads_tl

D = 64  # head dims of the test's q: 4 chunks
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _q_tile_kernel(q_ptr, out_ptr, H: tl.constexpr, HT: tl.constexpr, D: tl.constexpr):
    token = tl.program_id(0)
    head0 = tl.program_id(1) * HT
    at, ok = q_tile_at_tl(token, head0, H, HT, D)
    q = q_tile_heads_tl(tl.load(q_ptr + at, mask=ok, other=-7.0), HT, D)
    rows = head0 + tl.arange(0, HT)
    out_at = (token * ((H + HT - 1) // HT) * HT + rows)[:, None] * D + tl.arange(0, D)[None, :]
    tl.store(out_ptr + out_at, q)


@pytest.mark.parametrize(("heads", "tile"), [(8, 8), (16, 8), (12, 8), (4, 16)])
def test_q_tile_matches_the_standard_layout(heads, tile):
    """Random q of 3 tokens: each tile's rows are its heads' dims in the standard layout; rows
    past the heads (a part-filled last tile) read the mask's fill."""
    torch.manual_seed(heads * tile)
    q = torch.randn(3, heads, D, device=DEVICE)
    fused = permute_q_to_fused(q).flatten(-2).contiguous()
    assert torch.equal(permute_q_from_fused(fused, heads, D), q)  # the reference's round trip
    assert not torch.equal(fused, q.reshape(3, heads * D))  # and the layout is not the identity
    tiles = -(-heads // tile)
    out = torch.zeros(3, tiles * tile, D, device=DEVICE)
    _q_tile_kernel[(3, tiles)](fused, out, H=heads, HT=tile, D=D)
    assert torch.equal(out[:, :heads], q)
    assert torch.all(out[:, heads:] == -7.0)
