"""The kernel record helpers against dsv41.common.kv_cache: same bytes stored, same keys read."""

import pytest
import torch
import triton
import triton.language as tl

from dsv41.common.kv_cache import (
    COMPRESSED_FLAG,
    KV_DIM,
    PagedKVCache,
    decode_key_table,
    gather_keys,
    pack_records,
    record_format,
)
from dsv41.common.kv_records_tl import (
    FMT_DS_MLA,
    FMT_MX,
    decode_entries_tl,
    fmt_id,
    load_keys_tl,
    load_records_tl,
    record_offsets_tl,
    store_record_tl,
)

FORMATS = ("fp8_ds_mla", "fp8_mx")
BLOCK = 16
ROWS = 8  # records a test program stores or loads at once


@triton.jit
def _decode_kernel(
    entries_ptr, comp_ptr, slot_ptr, valid_ptr, window_slots, compressed_slots, N: tl.constexpr
):
    i = tl.arange(0, N)
    is_comp, slot, valid = decode_entries_tl(
        tl.load(entries_ptr + i), window_slots, compressed_slots
    )
    tl.store(comp_ptr + i, is_comp.to(tl.int8))
    tl.store(slot_ptr + i, slot)
    tl.store(valid_ptr + i, valid.to(tl.int8))


@triton.jit
def _load_kernel(
    cache_ptr,
    entries_ptr,
    out_ptr,
    window_slots,
    BLOCK_TOKENS: tl.constexpr,
    FMT: tl.constexpr,
    BK: tl.constexpr,
):
    rows = tl.program_id(0) * BK + tl.arange(0, BK)
    _, slots, valid = decode_entries_tl(tl.load(entries_ptr + rows), window_slots, 0)
    keys = load_keys_tl(cache_ptr, slots, valid, BLOCK_TOKENS, FMT, BK)
    tl.store(out_ptr + rows[:, None] * 512 + tl.arange(0, 512)[None, :], keys)


@triton.jit
def _store_kernel(
    cache_ptr,
    slots_ptr,
    kv_ptr,
    num_slots,
    BLOCK_TOKENS: tl.constexpr,
    FMT: tl.constexpr,
    R: tl.constexpr,
):
    rows = tl.program_id(0) * R + tl.arange(0, R)
    kv = tl.load(kv_ptr + rows[:, None] * 512 + tl.arange(0, 512)[None, :]).to(tl.float32)
    store_record_tl(cache_ptr, tl.load(slots_ptr + rows), kv, num_slots, BLOCK_TOKENS, FMT)


@triton.jit
def _load_two_caches_kernel(
    win_ptr,
    comp_ptr,
    entries_ptr,
    out_ptr,
    window_slots,
    compressed_slots,
    FMT: tl.constexpr,
    BK: tl.constexpr,
):
    rows = tl.program_id(0) * BK + tl.arange(0, BK)
    is_comp, slots, valid = decode_entries_tl(
        tl.load(entries_ptr + rows), window_slots, compressed_slots
    )
    win_data, win_codes = record_offsets_tl(slots, BLOCK, FMT)
    comp_data, comp_codes = record_offsets_tl(slots, 2 * BLOCK, FMT)
    data_ptrs = tl.where(is_comp, comp_ptr + comp_data, win_ptr + win_data)
    code_ptrs = tl.where(is_comp, comp_ptr + comp_codes, win_ptr + win_codes)
    keys = load_records_tl(data_ptrs, code_ptrs, valid, FMT, BK)
    tl.store(out_ptr + rows[:, None] * 512 + tl.arange(0, 512)[None, :], keys)


def _filled_cache(fmt: str, pages: int, seed: int, block: int = BLOCK) -> PagedKVCache:
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(pages, block, fmt)
    kv = (
        torch.randn(cache.num_slots, KV_DIM, generator=gen)
        * torch.rand(cache.num_slots, 1, generator=gen)
        * 8
    )
    kv[:, 64:128] *= 1e-3  # groups with very different ranges get different codes
    cache.insert(torch.arange(cache.num_slots), kv.bfloat16())
    return cache


def test_fmt_id():
    assert fmt_id("fp8_ds_mla") == FMT_DS_MLA.value == 0
    assert fmt_id(record_format("fp8_mx")) == FMT_MX.value == 1
    with pytest.raises(ValueError, match="record format"):
        fmt_id("fp8_other")


def test_decode_entries_matches_decode_key_table():
    window_n, comp_n = 48, 128
    entries = torch.tensor(
        [
            0,
            47,
            48,
            1000,
            -1,
            5 | COMPRESSED_FLAG,
            127 | COMPRESSED_FLAG,
            128 | COMPRESSED_FLAG,
            0 | COMPRESSED_FLAG,
            2**31 - 1,
            7,
            -1,
            3,
            200 | COMPRESSED_FLAG,
            46,
            12,
        ],
        dtype=torch.int64,
    )
    entries = torch.where(entries >= COMPRESSED_FLAG, entries - (1 << 32), entries).to(torch.int32)
    n = entries.numel()
    comp, slot, valid = (
        torch.empty(n, dtype=torch.int8),
        torch.empty(n, dtype=torch.int64),
        torch.empty(n, dtype=torch.int8),
    )
    _decode_kernel[(1,)](entries, comp, slot, valid, window_n, comp_n, N=n)
    want_comp, want_slot, want_valid = decode_key_table(entries[None], window_n, comp_n)
    assert torch.equal(comp.bool(), want_comp[0])
    assert torch.equal(valid.bool(), want_valid[0])
    assert torch.equal(slot[valid.bool()], want_slot[0][want_valid[0]])


@pytest.mark.parametrize("fmt", FORMATS)
def test_load_keys_matches_dequantize(fmt):
    cache = _filled_cache(fmt, pages=3, seed=1)
    gen = torch.Generator().manual_seed(2)
    n = 4 * ROWS
    entries = torch.randint(0, cache.num_slots, (n,), generator=gen, dtype=torch.int32)
    entries[3] = -1
    entries[10] = cache.num_slots  # just outside: none
    entries[17] = 2**31 - 1
    out = torch.full((n, KV_DIM), float("nan"))
    _load_kernel[(n // ROWS,)](
        cache.data, entries, out, cache.num_slots, BLOCK_TOKENS=BLOCK, FMT=fmt_id(fmt), BK=ROWS
    )
    want, valid = gather_keys(entries[None], cache, None)
    assert valid[0].sum() == n - 3
    assert torch.equal(out, want[0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_load_records_mixes_two_caches(fmt):
    window = _filled_cache(fmt, pages=3, seed=4)
    compressed = _filled_cache(fmt, pages=2, seed=5, block=2 * BLOCK)
    gen = torch.Generator().manual_seed(6)
    n = 4 * ROWS
    win = torch.randint(0, window.num_slots, (n,), generator=gen)
    comp = torch.randint(0, compressed.num_slots, (n,), generator=gen) - (1 << 31)
    entries = torch.where(torch.rand(n, generator=gen) < 0.5, comp, win).to(torch.int32)
    entries[1] = -1
    entries[2] = compressed.num_slots - (1 << 31)  # just outside the compressed cache
    entries[3] = window.num_slots  # just outside the window cache
    out = torch.full((n, KV_DIM), float("nan"))
    _load_two_caches_kernel[(n // ROWS,)](
        window.data, compressed.data, entries, out, window.num_slots, compressed.num_slots,
        FMT=fmt_id(fmt), BK=ROWS,
    )  # fmt: skip
    want, valid = gather_keys(entries[None], window, compressed)
    assert valid[0].sum() == n - 3
    assert 0 < decode_key_table(entries, 0, 0)[0].sum() < n
    assert torch.equal(out, want[0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_store_record_matches_pack_records(fmt):
    pages = 3
    gen = torch.Generator().manual_seed(3)
    cache = PagedKVCache(pages, BLOCK, fmt)
    cache.data.random_(0, 256, generator=gen)  # stale bytes everywhere: every byte must be written
    before = cache.data.clone()
    n = 2 * ROWS
    slots = torch.randperm(cache.num_slots, generator=gen)[:n]
    slots[5] = -1  # padding token: stores nothing
    slots[9] = cache.num_slots  # outside the cache: stores nothing
    kv = torch.randn(n, KV_DIM, generator=gen) * torch.rand(n, 1, generator=gen) * 100
    kv[:, 32:64] *= 1e-4
    kv[2] = 0.0  # all-zero record: codes 0
    kv = kv.bfloat16()
    _store_kernel[(n // ROWS,)](
        cache.data, slots, kv.float(), cache.num_slots, BLOCK_TOKENS=BLOCK, FMT=fmt_id(fmt), R=ROWS
    )

    keep = (slots >= 0) & (slots < cache.num_slots)
    want = PagedKVCache(pages, BLOCK, fmt)
    want.data.copy_(before)
    want.insert(slots[keep], kv[keep])
    # Every byte: e4m3 values, codes, rope bf16 and the pad; skipped rows and other slots untouched.
    assert torch.equal(cache.data, want.data)
    assert torch.equal(cache.read(slots[keep]), pack_records(kv[keep], fmt))
