"""Key-table records for the NVIDIA kernels: their addresses, and asking the L2 for them.

``record_ptrs_tl`` turns key-table entries into the uint8 addresses of their records (data row,
scale codes) in the window or the compressed cache; ``prefetch_records_tl`` asks the L2 for
those records with a predicated PTX bulk prefetch (nothing is read into registers, so a
prefetch of a record still being written is harmless: the write lands in the L2). Attention
reads records through these; the norm kernel and wq_b ask the L2 for attention's records
ahead of it.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from dsv41.common.kv_cache import FP8_DS_MLA, FP8_MX, PagedKVCache
from dsv41.common.kv_records_tl import (
    FMT_DS_MLA,
    data_rows_aligned,
    decode_entries_tl,
    fmt_id,
    record_offsets_tl,
)

# The record prefetch (``prefetch_records_tl``), a predicated PTX bulk prefetch to L2 of a record's
# contiguous bytes: fp8_ds_mla's 576-B data row (and its scale row's line), fp8_mx's 528-B record.
_PREFETCH_DS_MLA = tl.constexpr(
    "{ .reg .pred p; setp.ne.s32 p, $3, 0; "
    f"@p cp.async.bulk.prefetch.L2.global [$1], {FP8_DS_MLA.data_bytes}; "
    "@p prefetch.global.L2 [$2]; mov.b32 $0, 0; }"
)
_PREFETCH_MX = tl.constexpr(
    "{ .reg .pred p; setp.ne.s32 p, $2, 0; "
    f"@p cp.async.bulk.prefetch.L2.global [$1], {FP8_MX.record_bytes}; mov.b32 $0, 0; }}"
)


@triton.jit
def record_ptrs_tl(table_row, kk, live, win_ptr, comp_ptr, window_slots, compressed_slots,
                   FMT: tl.constexpr, WIN_BLOCK: tl.constexpr, COMP_BLOCK: tl.constexpr,
                   ALIGNED: tl.constexpr):  # fmt: skip
    """The records of key-table entries ``kk`` (read where ``live``): uint8 pointers to each
    one's data row (16-B aligned when ``ALIGNED``) and scale codes, in the compressed or the
    window cache, and which are valid."""
    entries = tl.load(table_row + kk, mask=live, other=-1)
    is_comp, slots, valid = decode_entries_tl(entries, window_slots, compressed_slots)
    win_data, win_codes = record_offsets_tl(slots, WIN_BLOCK, FMT)
    comp_data, comp_codes = record_offsets_tl(slots, COMP_BLOCK, FMT)
    data_ptrs = tl.where(is_comp, comp_ptr + comp_data, win_ptr + win_data)
    if ALIGNED:  # every data row starts 16-B aligned in both caches: 16-B loads
        data_ptrs = tl.multiple_of(data_ptrs, 16)
    code_ptrs = tl.where(is_comp, comp_ptr + comp_codes, win_ptr + win_codes)
    return data_ptrs, code_ptrs, valid


@triton.jit
def record_row_ptrs_tl(table_row, k_start, win_ptr, comp_ptr, window_slots, compressed_slots,
                       KEYS: tl.constexpr, FMT: tl.constexpr, WIN_BLOCK: tl.constexpr,
                       COMP_BLOCK: tl.constexpr, N: tl.constexpr,
                       N_PAD: tl.constexpr):  # fmt: skip
    """The records of keys ``k_start .. k_start + N`` of a key-table row (16-B aligned data rows
    only), ``[N_PAD]`` (a power of two >= N): data row and scale code pointers, and which are
    valid. What ``prefetch_records_tl`` asks the L2 for."""
    kk = k_start + tl.arange(0, N_PAD)
    return record_ptrs_tl(table_row, kk, (kk < KEYS) & (kk < k_start + N), win_ptr, comp_ptr,
                          window_slots, compressed_slots, FMT, WIN_BLOCK, COMP_BLOCK,
                          True)  # fmt: skip


@triton.jit
def prefetch_records_tl(data, codes, valid, FMT: tl.constexpr):
    """Ask the L2 for the records ``record_ptrs_tl`` gives: one bulk prefetch a data row, and
    the fp8_ds_mla scale row's line. A split's loop then reads each block after the first from
    L2, not HBM, so its blocks' memory latencies overlap instead of adding up; wq_b asks for the
    step's whole key table ahead of attention (``prefetch_share_tl``), and the norm kernel can
    ask for its token's row (``norm_rope_insert``'s ``prefetch``). No record is read into
    registers, and an invalid entry prefetches nothing."""
    if FMT == FMT_DS_MLA:  # the data row, then the 8-B scale row elsewhere in the page
        tl.inline_asm_elementwise(
            _PREFETCH_DS_MLA, "=r,l,l,r",
            [data.to(tl.int64), codes.to(tl.int64), valid.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip
    else:  # the whole record: values, then codes
        tl.inline_asm_elementwise(
            _PREFETCH_MX, "=r,l,r", [data.to(tl.int64), valid.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip


def rows_aligned(*caches: PagedKVCache) -> bool:
    """Whether every record's data row starts 16-B aligned in all these caches."""
    return all(data_rows_aligned(c) for c in caches)


@dataclasses.dataclass(frozen=True)
class RecordsAhead:
    """The records attention reads next, for a kernel before it to ask the L2 for (``mx_gemm``'s
    ``records``): a key table and the caches its entries point into."""

    key_table: torch.Tensor  # int32 [M, KEYS], contiguous
    window_cache: PagedKVCache
    compressed_cache: PagedKVCache | None

    def kernel_args(self, programs: int) -> dict:
        """A launch of ``programs`` programs' arguments: each asks for its share of the table's
        ``M * KEYS`` entries (``rp_*``, ``RP_*``; ``RP_PER`` 0: none, where a data row of the
        caches is not 16-B aligned, the bulk prefetch's unit)."""
        win = self.window_cache
        comp = self.compressed_cache if self.compressed_cache is not None else win
        if not rows_aligned(win, comp):
            return {}
        total = self.key_table.numel()
        per = -(-total // programs)
        return {"rp_table_ptr": self.key_table, "rp_win_ptr": win.data, "rp_comp_ptr": comp.data,
                "rp_window_slots": win.num_slots,
                "rp_comp_slots": comp.num_slots if comp is not win else 0,
                "RP_PER": per, "RP_PAD": triton.next_power_of_2(per), "RP_TOTAL": total,
                "RP_FMT": fmt_id(win.fmt), "RP_WIN_BLOCK": win.block,
                "RP_COMP_BLOCK": comp.block}  # fmt: skip


@triton.jit
def prefetch_share_tl(pid, rp_table_ptr, rp_win_ptr, rp_comp_ptr, rp_window_slots, rp_comp_slots,
                      RP_PER: tl.constexpr, RP_PAD: tl.constexpr, RP_TOTAL: tl.constexpr,
                      RP_FMT: tl.constexpr, RP_WIN_BLOCK: tl.constexpr,
                      RP_COMP_BLOCK: tl.constexpr):  # fmt: skip
    """Program ``pid``'s share of ``RecordsAhead``: entries ``pid * RP_PER ..`` of the flat key
    table, their records asked of the L2."""
    i = tl.arange(0, RP_PAD)
    kk = pid * RP_PER + i
    data, codes, valid = record_ptrs_tl(rp_table_ptr, kk, (i < RP_PER) & (kk < RP_TOTAL),
                                        rp_win_ptr, rp_comp_ptr, rp_window_slots, rp_comp_slots,
                                        RP_FMT, RP_WIN_BLOCK, RP_COMP_BLOCK, True)  # fmt: skip
    prefetch_records_tl(data, codes, valid, RP_FMT)
