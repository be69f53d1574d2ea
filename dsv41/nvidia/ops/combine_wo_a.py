"""The attention combine and wo_a in one launch (one token's step; SPEC §2.5-2.7).

After the split attention launch (``mega_attention_kernel``'s fp32 partials) a program of
``combine_wo_a_kernel`` takes ``CWA_HEADS`` heads of one group and one 32-dim chunk (one MX block
each) of a token: it sums the splits' partials and finishes those heads' dims as the combine
does (sink, inverse RoPE, bf16, MXFP8; the programs of the first row block store them in the
fused O layout: the ``xo`` seam), then multiplies that MXFP8 piece of ``xo`` by its
``CWA_HEADS * 32`` columns of the group's ``wo_a`` rows (``CWA_ROWS`` a program, the weight
tile loaded before the PDL wait) and adds the product into ``z``'s fixed-point accumulator.

The accumulator holds ``z * 2^Z_FIX_SHIFT`` in int64 (each product truncated toward zero at
that step): integer sums are exact in any order, so the step stays bit-reproducible though its
``2 * 512 / 32 / CWA_HEADS`` column pieces a row arrive in any order; it bounds ``|z| <
2^(63 - Z_FIX_SHIFT)``. wo_b reads it (``FixedInput``), rounds z to bf16 and casts it to MXFP8
in its prologue. The attention launch zeroes it (after its PDL wait, so the previous step's
wo_b has read it: every kernel of a step waits for the one before it).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv41.common.fused_layout import O_CHUNK
from dsv41.common.mx import e8m0_scale_tl
from dsv41.nvidia.ops.mega_attention import (
    _HEAD_DIM,
    _combine_wide_tl,
    _finish_tl,
    _rope_angles_tl,
    _store_xo_tl,
)
from dsv41.nvidia.ops.mx_gemm import Z_FIX_SHIFT, _gemv_dot_one, _gemv_tile
from dsv41.nvidia.ops.pdl import pdl_prologue_tl

CWA_HEADS = 4  # heads a program finishes: its activation is CWA_HEADS MX blocks of xo
CWA_ROWS = 256  # wo_a rows a program multiplies: a 32 KB weight tile at 4 heads
CWA_WARPS = 8
_Z_FIX = tl.constexpr(float(2**Z_FIX_SHIFT))
_O_CHUNK = tl.constexpr(O_CHUNK)


@triton.jit(do_not_specialize=["max_pos"])
def combine_wo_a_kernel(
    pos_ptr, sink_ptr, cos_ptr, sin_ptr, xo_ptr, codes_ptr, lse_ptr, part_o_ptr, part_stat_ptr,
    w_ptr, w_codes_ptr, zfix_ptr, max_pos,
    H: tl.constexpr, G: tl.constexpr, HT: tl.constexpr, SPLITS: tl.constexpr,
    SPLIT_PAD: tl.constexpr, CH: tl.constexpr, ROWS: tl.constexpr, O_RANK: tl.constexpr,
    USE_PDL: tl.constexpr = False, HW: tl.constexpr = False,
):  # fmt: skip
    """Program ``(piece, row block, token)``: piece = (group, chunk, head quarter) of the
    token's heads, ``ROWS`` rows of the group's ``O_RANK``; ``z[token, group rows] +=`` its
    piece of xo times those wo_a columns, in ``zfix`` (module docstring)."""
    CHUNKS: tl.constexpr = _HEAD_DIM // _O_CHUNK  # 16
    PARTS: tl.constexpr = G // CH  # head pieces a group's chunk is cut into
    TILES: tl.constexpr = (H + HT - 1) // HT
    piece = tl.program_id(0)
    rb = tl.program_id(1)
    token = tl.program_id(2)
    group = piece // (CHUNKS * PARTS)
    chunk = piece // PARTS % CHUNKS
    e0 = piece % PARTS * CH  # first head of the piece within its group
    head0 = group * G + e0
    heads = head0 + tl.arange(0, CH)
    head_ok = heads < H
    # The weight tile: rows group * O_RANK + rb * ROWS .., fused columns (chunk * G + e0) * 32
    # .. (CH MX blocks: head e0 + i's dims chunk * 32 ..), loaded before the wait with what no
    # step kernel writes: the sink logits, the position, its RoPE angles.
    n = group * O_RANK + rb * ROWS + tl.arange(0, ROWS)
    w8, wc, _ = _gemv_tile(w_ptr, w_codes_ptr, n.to(tl.int64), n < (group + 1) * O_RANK,
                           (chunk * G + e0) * _O_CHUNK, G * _HEAD_DIM, CH)  # fmt: skip
    sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    d0 = chunk * _O_CHUNK
    c, s = _rope_angles_tl(d0, pos, max_pos, cos_ptr, sin_ptr, _O_CHUNK)
    pdl_prologue_tl(USE_PDL)
    tile = token * TILES + head0 // HT  # the piece's (token, head tile): G divides HT
    acc, l_i, m_i = _combine_wide_tl(part_o_ptr, part_stat_ptr, tile, heads % HT, d0, HT, SPLITS,
                                     _O_CHUNK, SPLIT_PAD)  # fmt: skip
    values, codes, lse = _finish_tl(acc, l_i, m_i, sink, c, s, CH, _O_CHUNK, HW)
    first = heads * 0 + rb == 0  # a tensor mask (the interpreter takes no scalar)
    _store_xo_tl(values, codes, lse, d0, token, heads, head_ok & first, xo_ptr, codes_ptr,
                 lse_ptr, H, G, _O_CHUNK)  # fmt: skip
    scales = e8m0_scale_tl(tl.reshape(codes, (CH,)))
    z = _gemv_dot_one(tl.zeros((1, ROWS), tl.float32), w8, wc, values.to(tl.float32), scales)
    at = zfix_ptr + token * (H // G * O_RANK) + n
    tl.atomic_add(at, tl.reshape(z * _Z_FIX, (ROWS,)).to(tl.int64), sem="relaxed", scope="gpu")


def cwa_grid(heads: int, heads_per_group: int, o_rank: int, tokens: int) -> tuple[int, int, int]:
    """``combine_wo_a_kernel``'s grid: (pieces of the heads, row blocks, tokens)."""
    pieces = heads // CWA_HEADS * (_HEAD_DIM.value // O_CHUNK)
    return pieces, triton.cdiv(o_rank, cwa_rows(o_rank)), tokens


def cwa_rows(o_rank: int) -> int:
    """Rows a program multiplies: ``CWA_ROWS``, or all of a smaller ``o_rank`` (a power of two)."""
    return min(CWA_ROWS, triton.next_power_of_2(o_rank))
