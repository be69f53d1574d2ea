"""KV records inside kernels: key-table decode, record loads and stores, both formats
(docs/design.md §4).

The ``@triton.jit`` helpers here read and write exactly the bytes that
``dsv41.common.kv_cache.pack_records`` lays out, for both record formats, picked
by a constexpr ``FMT``:

- ``FMT_DS_MLA`` (``fp8_ds_mla``, 584 B): a page is ``BLOCK_TOKENS`` data rows of
  576 B (448 e4m3 nope dims, then 64 bf16 rope dims), then ``BLOCK_TOKENS``
  scale rows of 8 B (7 UE8M0 codes, one per 64 nope dims, then a zero pad).
- ``FMT_MX`` (``fp8_mx``, 528 B): records back to back, 512 e4m3 then 16 UE8M0,
  one per 32 dims.

A cache pointer is the ``uint8`` data of a ``PagedKVCache``; slot ``s`` is row
``s % BLOCK_TOKENS`` of page ``s // BLOCK_TOKENS``; offsets are int64 so caches
past 2 GiB work. Every load and store is masked: an invalid slot reads zeros and
writes nothing. Quantization is the E8M0 cast of ``dsv41.common.mx``: ``code =
clamp(ceil(log2(amax / 448)) + 127, 0, 254)``, ``value = e4m3(clamp(x * 2^(127 -
code), -448, 448))`` per scale group.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsv41.common.kv_cache import (
    DS_MLA_SCALE_ROW,
    FP8_DS_MLA,
    FP8_MX,
    KV_DIM,
    NOPE_DIM,
    PagedKVCache,
    RecordFormat,
    record_format,
)
from dsv41.common.mx import (
    E4M3_MAX,
    amax_tl,
    e4m3_nan_bits_tl,
    e4m3_round_tl,
    e8m0_code_tl,
    e8m0_inv_scale_tl,
    e8m0_scale_tl,
)

FMT_DS_MLA = tl.constexpr(0)  # fp8_ds_mla: split pages, bf16 rope dims
FMT_MX = tl.constexpr(1)  # fp8_mx: contiguous records, all dims e4m3

_KV_DIM = tl.constexpr(KV_DIM)  # 512
_NOPE_DIM = tl.constexpr(NOPE_DIM)  # 448
_E4M3_MAX = tl.constexpr(E4M3_MAX)  # 448.0
_SLOT_MASK = tl.constexpr(0x7FFFFFFF)  # key-table entry without the compressed bit
_DS_MLA_RECORD = tl.constexpr(FP8_DS_MLA.record_bytes)  # 584
_DS_MLA_DATA = tl.constexpr(FP8_DS_MLA.data_bytes)  # 576
_DS_MLA_SCALE_ROW = tl.constexpr(DS_MLA_SCALE_ROW)  # 8
_DS_MLA_GROUP = tl.constexpr(FP8_DS_MLA.scale_group)  # 64 nope dims per code
_DS_MLA_CODES = tl.constexpr(FP8_DS_MLA.num_codes)  # 7
_MX_RECORD = tl.constexpr(FP8_MX.record_bytes)  # 528
_MX_GROUP = tl.constexpr(FP8_MX.scale_group)  # 32 dims per code


def fmt_id(fmt: str | RecordFormat) -> int:
    """The kernels' constexpr ``FMT`` of a record format: fp8_ds_mla -> 0, fp8_mx -> 1."""
    return {FP8_DS_MLA.name: FMT_DS_MLA.value, FP8_MX.name: FMT_MX.value}[record_format(fmt).name]


@triton.jit
def decode_entries_tl(entries, window_slots, compressed_slots):
    """Key-table entries -> ``(is_compressed, slot int64, valid)``, ``valid = slot < cache slots``.

    ``entries < 0`` marks a compressed row with ``slot = entry & 0x7fffffff``, so
    -1 (slot 2^31 - 1) and any entry outside its cache are not valid.
    """
    is_compressed = entries < 0
    slot = (entries & _SLOT_MASK).to(tl.int64)
    limit = tl.where(is_compressed, compressed_slots, window_slots).to(tl.int64)
    return is_compressed, slot, slot < limit


ROW_ALIGN = 16  # bytes: a data row at a multiple of this loads in 16-B pieces


def data_rows_aligned(cache: PagedKVCache) -> bool:
    """Whether every record's data row in ``cache`` starts ``ROW_ALIGN``-B aligned: the base
    address, and the row offsets ``record_offsets_tl`` states aligned (fp8_mx always, fp8_ds_mla
    in pages of an even number of records)."""
    rows = cache.fmt != FP8_DS_MLA or cache.block % 2 == 0
    return rows and cache.data.data_ptr() % ROW_ALIGN == 0


@triton.jit
def record_offsets_tl(slots, BLOCK_TOKENS: tl.constexpr, FMT: tl.constexpr):
    """int64 byte offsets ``(data row, scale codes)`` of each slot's record in its cache.

    A data row starts 16-B aligned in the cache (584-B records in pages of an even number of
    them, 576-B data rows; or 528-B records), and the offsets say so, so a row is read in
    16-B loads rather than one byte or one bf16 at a time."""
    slots = slots.to(tl.int64)
    if FMT == FMT_DS_MLA:
        page_base = (slots // BLOCK_TOKENS) * (BLOCK_TOKENS * _DS_MLA_RECORD)
        row = slots % BLOCK_TOKENS
        data = page_base + row * _DS_MLA_DATA
        codes = page_base + BLOCK_TOKENS * _DS_MLA_DATA + row * _DS_MLA_SCALE_ROW
        if BLOCK_TOKENS % 2 == 0:  # 584 * an even count and 576 are multiples of 16
            data = tl.multiple_of(data, 16)
    else:
        data = tl.multiple_of(slots * _MX_RECORD, 16)  # 528 = 33 * 16
        codes = data + _KV_DIM
    return data, codes


@triton.jit
def record_codes_tl(code_ptrs, valid, NG: tl.constexpr, WORDS: tl.constexpr):
    """int32 E8M0 codes ``[BK, NG]`` of the records whose codes start at ``code_ptrs [BK]`` (0
    where not ``valid``). ``WORDS`` (the code rows 4-B aligned): read as int32 words, 4 codes a
    word, so a loop's pipeliner copies them ahead asynchronously like the data (it does not
    take 1-B loads)."""
    if WORDS:
        NW: tl.constexpr = NG // 4
        w = tl.arange(0, NW)
        words = tl.load(code_ptrs.to(tl.pointer_type(tl.int32))[:, None] + w[None, :],
                        mask=valid[:, None], other=0)  # fmt: skip
        shift = tl.arange(0, 4) * 8
        codes = (words[:, :, None] >> shift[None, None, :]) & 0xFF
        return tl.reshape(codes, (code_ptrs.shape[0], NG)).to(tl.int32)
    g = tl.arange(0, NG)
    return tl.load(code_ptrs[:, None] + g[None, :], mask=valid[:, None], other=0).to(tl.int32)


@triton.jit
def load_records_tl(data_ptrs, code_ptrs, valid, FMT: tl.constexpr, BK: tl.constexpr,
                    WORDS: tl.constexpr = False):  # fmt: skip
    """fp32 keys ``[BK, 512]`` of the records whose data rows and codes start at the uint8
    pointers ``data_ptrs [BK]`` and ``code_ptrs [BK]``; rows where ``valid [BK]`` is false are 0.

    Read as ``[BK, scale groups, group]``: fp8_ds_mla's e4m3 groups 0..6 and its bf16 rope dims
    (group 7, unit scale) in separate loads of only their bytes; ``WORDS``: as in
    ``record_codes_tl``. Row pointers let one tile mix records of two caches.
    """
    if FMT == FMT_DS_MLA:
        NG: tl.constexpr = _KV_DIM // _DS_MLA_GROUP  # 8: 7 e4m3 groups, then the rope dims
        GW: tl.constexpr = _DS_MLA_GROUP
    else:
        NG: tl.constexpr = _KV_DIM // _MX_GROUP  # 16
        GW: tl.constexpr = _MX_GROUP
    g = tl.arange(0, NG)
    j = tl.arange(0, GW)
    cols = (g * GW)[None, :, None] + j[None, None, :]
    scale = e8m0_scale_tl(record_codes_tl(code_ptrs, valid, NG, WORDS))
    if FMT == FMT_DS_MLA:
        nope = (g < NG - 1)[None, :, None]
        fp8 = tl.load(data_ptrs[:, None, None] + cols, mask=valid[:, None, None] & nope, other=0)
        # The rope dims are bf16 at byte 448 + 2 (d - 448) of the (even) data row.
        rope_ptrs = (data_ptrs + _NOPE_DIM).to(tl.pointer_type(tl.bfloat16))
        rope = tl.load(rope_ptrs[:, None] + j[None, :], mask=valid[:, None], other=0.0)
        vals = fp8.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, :, None]
        keys = tl.where(nope, vals, rope.to(tl.float32)[:, None, :])
    else:
        d = tl.arange(0, _KV_DIM)
        fp8 = tl.load(data_ptrs[:, None] + d[None, :], mask=valid[:, None], other=0)
        raw = tl.reshape(fp8.to(tl.float8e4nv, bitcast=True).to(tl.float32), (BK, NG, GW))
        keys = raw * scale[:, :, None]
    return tl.reshape(keys, (BK, _KV_DIM))


@triton.jit
def load_keys_tl(
    cache_ptr, slots, valid, BLOCK_TOKENS: tl.constexpr, FMT: tl.constexpr, BK: tl.constexpr
):
    """fp32 keys ``[BK, 512]`` of the records at ``slots [BK]``; rows not ``valid [BK]`` are 0."""
    data, codes = record_offsets_tl(slots, BLOCK_TOKENS, FMT)
    return load_records_tl(cache_ptr + data, cache_ptr + codes, valid, FMT, BK)


@triton.jit
def store_record_tl(cache_ptr, slots, kv, num_slots, BLOCK_TOKENS: tl.constexpr, FMT: tl.constexpr):
    """Quantize fp32 ``kv [R, 512]`` and write its records at ``slots [R]`` (rows with slot outside
    ``[0, num_slots)`` are skipped), byte for byte as ``pack_records``.

    ``kv`` should already hold the bf16 values the contract stores (the fp8_ds_mla
    rope dims are cast to bf16 here; the nope dims are quantized from kv as given).
    """
    R: tl.constexpr = kv.shape[0]
    GROUP: tl.constexpr = _DS_MLA_GROUP if FMT == FMT_DS_MLA else _MX_GROUP
    NG: tl.constexpr = _KV_DIM // GROUP
    data, codes_at = record_offsets_tl(slots, BLOCK_TOKENS, FMT)
    store = (slots >= 0) & (slots < num_slots)
    d = tl.arange(0, _KV_DIM)
    g = tl.arange(0, NG)
    blocks = tl.reshape(kv, (R, NG, GROUP))
    code = e8m0_code_tl(amax_tl(blocks))
    scaled = blocks * e8m0_inv_scale_tl(code)[:, :, None]
    scaled = e4m3_round_tl(tl.minimum(tl.maximum(scaled, -_E4M3_MAX), _E4M3_MAX))
    fp8 = tl.reshape(scaled, (R, _KV_DIM)).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    fp8 = e4m3_nan_bits_tl(fp8, code, R, _KV_DIM, GROUP)
    if FMT == FMT_DS_MLA:
        is_nope = d < _NOPE_DIM
        tl.store(
            cache_ptr + data[:, None] + d[None, :], fp8, mask=store[:, None] & is_nope[None, :]
        )
        bf16_ptr = cache_ptr.to(tl.pointer_type(tl.bfloat16))
        rope_at = (data[:, None] + _NOPE_DIM) // 2 + (d[None, :] - _NOPE_DIM)
        tl.store(bf16_ptr + rope_at, kv.to(tl.bfloat16), mask=store[:, None] & ~is_nope[None, :])
        # The last group is the rope dims: its slot in the scale row is the zero pad byte.
        row_bytes = tl.where(g < _DS_MLA_CODES, code, 0).to(tl.uint8)
        tl.store(cache_ptr + codes_at[:, None] + g[None, :], row_bytes, mask=store[:, None])
    else:
        tl.store(cache_ptr + data[:, None] + d[None, :], fp8, mask=store[:, None])
        tl.store(cache_ptr + codes_at[:, None] + g[None, :], code.to(tl.uint8), mask=store[:, None])
