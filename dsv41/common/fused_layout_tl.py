"""A tile of q read from the fused Q layout (docs/design.md §5) as device helpers: both backends'
attention reads q this way (nvidia's mega attention, mono's attention task).

The fused Q layout keeps a token's q as ``[head_dim / Q_CHUNK chunks, heads, Q_CHUNK]``: a
chunk's 16 dims of consecutive heads are contiguous. A tile of heads is read in that memory
order, ``[chunks, tile * Q_CHUNK]`` (a warp's read covers 512 contiguous bytes), and permuted to
``[tile, head_dim]`` in registers. Reading it head by head instead made each warp's read span
32 lines, ``heads * 32`` B apart: about 2,200 cycles a program against 1,300 this way (nvidia's
attention on the H200).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv41.common.fused_layout import Q_CHUNK

_Q_CHUNK = tl.constexpr(Q_CHUNK)


@triton.jit
def q_tile_at_tl(token, head0, H: tl.constexpr, HT: tl.constexpr, D: tl.constexpr):
    """Offsets ``[D / Q_CHUNK, HT * Q_CHUNK]`` (from a q of ``H`` heads of ``D`` dims a token) of
    heads ``head0 .. head0 + HT`` of ``token``, in memory order, and their mask (heads past H
    are off)."""
    c = tl.arange(0, D // _Q_CHUNK)
    col = head0 * _Q_CHUNK + tl.arange(0, HT * _Q_CHUNK)
    at = token * (H * D) + c[:, None] * (H * _Q_CHUNK) + col[None, :]
    return at, (col < H * _Q_CHUNK)[None, :]


@triton.jit
def q_tile_heads_tl(raw, HT: tl.constexpr, D: tl.constexpr):
    """``raw`` read at ``q_tile_at_tl``'s offsets as ``[HT, D]``: row a head, column a dim."""
    chunks = tl.reshape(raw, (D // _Q_CHUNK, HT, _Q_CHUNK))
    return tl.reshape(tl.permute(chunks, (1, 0, 2)), (HT, D))
