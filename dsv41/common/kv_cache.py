"""KV records, paged caches and the key table (docs/design.md §4).

Two record formats hold one token's 512-dim KV (K = V):

- ``fp8_ds_mla`` (584 B, AMD and SM90): a page is ``block`` data rows of 576 B
  (dims 0..447 as e4m3, then dims 448..511 as bf16) followed by ``block`` scale
  rows of 8 B (7 UE8M0 codes, one per 64 nope dims, then a pad byte).
- ``fp8_mx`` (528 B, SM100 family): a record is 512 e4m3 (RoPE dims quantized
  too) followed by 16 UE8M0 codes, one per 32 dims; records lie back to back.

A cache is a uint8 tensor ``[num_pages, block * record_bytes]``; slot ``s`` is
row ``s % block`` of page ``s // block``. The key table a kernel reads is int32
``[M, KEYS]``: ``slot | 1 << 31`` for a row of the compressed cache, a window
cache slot otherwise, -1 for none; valid compressed entries first (in top-k
order), then the window (oldest first), then -1. Since ``-1 & 0x7fffffff`` is
larger than any cache, "outside the cache" and "none" are one test in a kernel.
"""

from __future__ import annotations

import dataclasses

import torch

from dsv41.common.mx import E4M3, E8M0_BIAS, E8M0_NAN, e4m3_saturate, e8m0_code, e8m0_scale, pow2

KV_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
COMPRESSED_FLAG = 1 << 31  # key-table bit marking a compressed-cache row
SLOT_MASK = (1 << 31) - 1
NONE = -1
COMPRESSED_BLOCK = 64  # tokens a page of the compressed cache


@dataclasses.dataclass(frozen=True)
class RecordFormat:
    name: str
    record_bytes: int  # bytes a token takes in a page
    data_bytes: int  # bytes of the data row (all of the record for fp8_mx)
    scale_group: int  # dims sharing one UE8M0 code
    quantized_dims: int  # leading dims stored as e4m3

    @property
    def num_codes(self) -> int:
        return self.quantized_dims // self.scale_group

    @property
    def split_page(self) -> bool:
        """Scale rows lie after the page's data rows rather than inside each record."""
        return self.data_bytes != self.record_bytes


FP8_DS_MLA = RecordFormat("fp8_ds_mla", 584, 576, 64, NOPE_DIM)  # 448 + 64 * 2 = 576; 7 codes + pad
FP8_MX = RecordFormat("fp8_mx", 528, 528, 32, KV_DIM)  # 512 + 16
RECORD_FORMATS = {f.name: f for f in (FP8_DS_MLA, FP8_MX)}
DS_MLA_SCALE_ROW = FP8_DS_MLA.record_bytes - FP8_DS_MLA.data_bytes  # 8


def record_format(name: str | RecordFormat) -> RecordFormat:
    if isinstance(name, RecordFormat):
        return name
    if name not in RECORD_FORMATS:
        raise ValueError(f"record format: expected one of {sorted(RECORD_FORMATS)}, got {name!r}")
    return RECORD_FORMATS[name]


def _quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = x.float().reshape(x.shape[0], -1, group)
    codes = e8m0_code(blocks.abs().amax(dim=-1))
    inv = pow2(E8M0_BIAS - codes.int())
    values = e4m3_saturate(blocks * inv.unsqueeze(-1)).float()
    values = torch.where((codes == E8M0_NAN).unsqueeze(-1), float("nan"), values).to(E4M3)
    return values.reshape(x.shape[0], -1), codes


def pack_records(kv: torch.Tensor, fmt: str | RecordFormat) -> torch.Tensor:
    """``kv [N, 512]`` -> uint8 ``[N, record_bytes]``: the data row then (fp8_ds_mla) the scale row."""
    fmt = record_format(fmt)
    if kv.dim() != 2 or kv.shape[1] != KV_DIM:
        raise ValueError(f"kv: expected [N, {KV_DIM}], got {list(kv.shape)}")
    n = kv.shape[0]
    values, codes = _quantize_groups(kv[:, : fmt.quantized_dims], fmt.scale_group)
    parts = [values.view(torch.uint8)]
    if fmt is FP8_DS_MLA:
        parts.append(kv[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8))
        pad = DS_MLA_SCALE_ROW - fmt.num_codes
        parts += [codes, torch.zeros(n, pad, dtype=torch.uint8, device=kv.device)]
    else:
        parts.append(codes)
    return torch.cat(parts, dim=1)


def unpack_records(records: torch.Tensor, fmt: str | RecordFormat) -> torch.Tensor:
    """uint8 ``[N, record_bytes]`` -> fp32 ``[N, 512]``."""
    fmt = record_format(fmt)
    if records.dtype != torch.uint8 or records.dim() != 2 or records.shape[1] != fmt.record_bytes:
        raise ValueError(
            f"records: expected uint8 [N, {fmt.record_bytes}], got {records.dtype} {list(records.shape)}"
        )
    q = fmt.quantized_dims
    values = records[:, :q].contiguous().view(E4M3).float()
    if fmt is FP8_DS_MLA:
        codes = records[:, fmt.data_bytes : fmt.data_bytes + fmt.num_codes]
    else:
        codes = records[:, q : q + fmt.num_codes]
    nope = (values.view(-1, fmt.num_codes, fmt.scale_group) * e8m0_scale(codes).unsqueeze(-1)).view(-1, q)
    if fmt is FP8_DS_MLA:
        rope = records[:, q : fmt.data_bytes].contiguous().view(torch.bfloat16).float()
        return torch.cat([nope, rope], dim=1)
    return nope


def record_round(kv: torch.Tensor, fmt: str | RecordFormat) -> torch.Tensor:
    """What a key reads back after a store: ``unpack(pack(kv))``, fp32."""
    return unpack_records(pack_records(kv, fmt), fmt)


class PagedKVCache:
    """A paged cache of records: uint8 ``data [num_pages, block * record_bytes]``."""

    def __init__(self, num_pages: int, block: int, fmt: str | RecordFormat, device="cpu"):
        self.fmt = record_format(fmt)
        self.block = block
        self.data = torch.zeros(num_pages, block * self.fmt.record_bytes, dtype=torch.uint8, device=device)

    @property
    def num_slots(self) -> int:
        return self.data.shape[0] * self.block

    def _offsets(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Byte offsets of each slot's data row and scale row in the flat cache."""
        slots = slots.long()
        bad = (slots < 0) | (slots >= self.num_slots)
        if bad.any():
            raise IndexError(
                f"slots: expected 0 <= slot < {self.num_slots}, got {slots[bad][:4].tolist()}"
            )
        page, row = slots // self.block, slots % self.block
        page_base = page * self.block * self.fmt.record_bytes
        data = page_base + row * self.fmt.data_bytes
        scale = page_base + self.block * self.fmt.data_bytes + row * DS_MLA_SCALE_ROW
        return data, scale

    def _byte_index(self, slots: torch.Tensor) -> torch.Tensor:
        data, scale = self._offsets(slots)
        idx = data[:, None] + torch.arange(self.fmt.data_bytes, device=data.device)
        if self.fmt.split_page:
            scale_idx = scale[:, None] + torch.arange(DS_MLA_SCALE_ROW, device=data.device)
            idx = torch.cat([idx, scale_idx], dim=1)
        return idx

    def insert(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Store ``kv [N, 512]`` as records at ``slots [N]``."""
        records = pack_records(kv, self.fmt).to(self.data.device)
        flat = self.data.view(-1)
        flat[self._byte_index(slots.to(self.data.device))] = records

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """uint8 records ``[N, record_bytes]`` at ``slots [N]``."""
        return self.data.view(-1)[self._byte_index(slots.to(self.data.device))]

    def dequantize(self, slots: torch.Tensor) -> torch.Tensor:
        """fp32 ``[N, 512]`` keys at ``slots [N]``."""
        return unpack_records(self.read(slots), self.fmt)

    def _row_views(self) -> list[torch.Tensor]:
        """Views of the pages' rows: ``[pages, block, data_bytes]``, then (fp8_ds_mla) the
        scale rows ``[pages, block, 8]``."""
        data_end = self.block * self.fmt.data_bytes
        views = [self.data[:, :data_end].view(-1, self.block, self.fmt.data_bytes)]
        if self.fmt.split_page:
            views.append(self.data[:, data_end:].view(-1, self.block, DS_MLA_SCALE_ROW))
        return views

    def gather_records(self, slots: torch.Tensor) -> torch.Tensor:
        """uint8 records ``[N, record_bytes]`` at ``slots [N]``, which must lie inside the cache:
        unchecked, so no host sync and a CUDA graph can capture it (``read`` checks)."""
        page, row = slots.long() // self.block, slots.long() % self.block
        return torch.cat([v[page, row] for v in self._row_views()], dim=1)

    def scatter_records(self, slots: torch.Tensor, records: torch.Tensor) -> None:
        """Store uint8 ``records [N, record_bytes]`` at ``slots [N]`` inside the cache, unchecked
        as ``gather_records``."""
        page, row = slots.long() // self.block, slots.long() % self.block
        start = 0
        for v in self._row_views():
            v[page, row] = records[:, start : start + v.shape[-1]]
            start += v.shape[-1]


def window_slots(positions: torch.Tensor, block_tables: torch.Tensor, block: int) -> torch.Tensor:
    """Cache slot of each (token, position): ``block_tables[t, pos // block] * block + pos % block``.

    ``positions [M, ...]`` int; ``block_tables [M, max_pages]``: the page list of
    each token's sequence. Returns int64 with positions' shape.
    """
    pos = positions.long()
    pages = torch.gather(block_tables.long(), 1, (pos // block).reshape(pos.shape[0], -1)).reshape(pos.shape)
    return pages * block + pos % block


def build_key_table(
    positions: torch.Tensor,
    block_tables: torch.Tensor,
    *,
    window: int,
    block: int,
    topk: torch.Tensor | None = None,
    keys: int | None = None,
) -> torch.Tensor:
    """int32 ``[M, keys]``: valid top-k rows ``| 1 << 31``, then window slots of ``max(0, p - window + 1) .. p``, then -1.

    ``positions [M]``; ``block_tables [M, max_pages]`` (each token's sequence
    pages); ``topk [M, TOPK]`` int32 row indices into the compressed cache, -1
    for none, or None for a window-only layer; ``keys`` defaults to
    ``TOPK + window``.
    """
    m = positions.shape[0]
    device = positions.device
    n_topk = 0 if topk is None else topk.shape[1]
    keys = n_topk + window if keys is None else keys
    if keys < n_topk + window:
        raise ValueError(f"keys: expected >= topk + window = {n_topk + window}, got {keys}")
    win_pos = positions.long()[:, None] - (window - 1) + torch.arange(window, device=device)
    win_valid = win_pos >= 0
    win_slots = window_slots(win_pos.clamp(min=0), block_tables, block)
    entries = [torch.where(win_valid, win_slots, NONE)]
    valid = [win_valid]
    if topk is not None:
        comp_valid = topk >= 0
        entries.insert(0, torch.where(comp_valid, topk.long() | COMPRESSED_FLAG, NONE))
        valid.insert(0, comp_valid)
    entries_t, valid_t = torch.cat(entries, dim=1), torch.cat(valid, dim=1)
    # Stable compaction: valid entries keep their order and move to the front.
    order = torch.argsort((~valid_t).to(torch.int8), dim=1, stable=True)
    compact = torch.gather(entries_t, 1, order)
    table = torch.full((m, keys), NONE, dtype=torch.int64, device=device)
    table[:, : compact.shape[1]] = compact
    # Re-express as int32 bit patterns: slot | 1 << 31 is negative in int32.
    return torch.where(table >= COMPRESSED_FLAG, table - (1 << 32), table).to(torch.int32)


def decode_key_table(
    key_table: torch.Tensor, window_slots_n: int, compressed_slots_n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(is_compressed, slot, valid)`` of each entry; an entry outside its cache is not valid."""
    entry = key_table.long() & 0xFFFFFFFF
    is_comp = entry >= COMPRESSED_FLAG
    slot = entry & SLOT_MASK
    limit = torch.where(is_comp, compressed_slots_n, window_slots_n)
    valid = (slot < limit) & (key_table != NONE)
    return is_comp, slot, valid


def validate_key_table(key_table: torch.Tensor, window_slots_n: int, compressed_slots_n: int) -> None:
    """Raise naming the first entry that is neither -1 nor inside its cache."""
    if key_table.dtype != torch.int32 or key_table.dim() != 2:
        raise ValueError(f"key_table: expected int32 [M, KEYS], got {key_table.dtype} {list(key_table.shape)}")
    is_comp, slot, valid = decode_key_table(key_table, window_slots_n, compressed_slots_n)
    bad = (~valid) & (key_table != NONE)
    if bad.any():
        t, k = (int(i) for i in bad.nonzero()[0])
        which = "compressed" if bool(is_comp[t, k]) else "window"
        size = compressed_slots_n if which == "compressed" else window_slots_n
        raise IndexError(
            f"key_table[{t}, {k}]: {which} slot {int(slot[t, k])} is outside the {which} cache "
            f"of {size} slots"
        )


def gather_keys(
    key_table: torch.Tensor, window_cache: PagedKVCache, compressed_cache: PagedKVCache | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys fp32 [M, K, 512], valid bool [M, K])`` read through the key table; invalid keys are
    0. No host sync, so a CUDA graph can capture it (an invalid entry reads slot 0, then zeroed)."""
    comp_n = 0 if compressed_cache is None else compressed_cache.num_slots
    is_comp, slot, valid = decode_key_table(key_table, window_cache.num_slots, comp_n)
    keys = torch.zeros(*key_table.shape, KV_DIM, dtype=torch.float32, device=key_table.device)
    for cache, picked in ((window_cache, valid & ~is_comp), (compressed_cache, valid & is_comp)):
        if cache is not None and cache.num_slots:
            at = torch.where(picked, slot, 0).flatten().to(cache.data.device)
            read = unpack_records(cache.gather_records(at),
                                  cache.fmt).view_as(keys)  # fmt: skip
            keys = torch.where(picked[..., None], read.to(keys.device), keys)
    return keys, valid
