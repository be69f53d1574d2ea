"""KV records, paged caches and key tables (docs/design.md §4), against byte-level and loop
computations."""

from __future__ import annotations

import math

import pytest
import torch

from dsv41.common.kv_cache import (
    FP8_DS_MLA,
    FP8_MX,
    PagedKVCache,
    build_key_table,
    decode_key_table,
    gather_keys,
    pack_records,
    record_format,
    unpack_records,
    validate_key_table,
)

E4M3 = torch.float8_e4m3fn
FLAG = 1 << 31


def _code(amax: float) -> int:
    """``clamp(ceil(log2(amax / 448)) + 127, 0, 254)``, 0 for amax 0."""
    return 0 if amax == 0 else min(max(math.ceil(math.log2(amax / 448.0)) + 127, 0), 254)


def _random_kv(n: int, seed: int) -> torch.Tensor:
    """bf16 [n, 512] with a different magnitude per 32 dims."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-6, 6, (n, 16), generator=gen).float()).repeat_interleave(32, 1)
    return (torch.randn(n, 512, generator=gen) * mag).bfloat16()


def _within_precision(back: torch.Tensor, x: torch.Tensor, group: int) -> bool:
    """|err| <= 2^-4 |x| for values in e4m3's normal range, else <= half the subnormal step."""
    x = x.double()
    amax = x.view(x.shape[0], -1, group).abs().amax(-1)
    scale = torch.tensor([[2.0 ** (_code(a) - 127) for a in r] for r in amax.tolist()],
                         dtype=torch.float64).repeat_interleave(group, 1)
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)
    return bool(((back.double() - x).abs() <= bound).all())


def test_record_formats() -> None:
    assert (FP8_DS_MLA.record_bytes, FP8_DS_MLA.data_bytes, FP8_DS_MLA.num_codes) == (584, 576, 7)
    assert (FP8_MX.record_bytes, FP8_MX.data_bytes, FP8_MX.num_codes) == (528, 528, 16)
    assert record_format("fp8_mx") is FP8_MX
    with pytest.raises(ValueError, match="record format: expected one of"):
        record_format("fp8_e5m2")


def test_round_trip_fp8_mx() -> None:
    kv = _random_kv(40, seed=1)
    records = pack_records(kv, "fp8_mx")
    assert records.dtype == torch.uint8 and records.shape == (40, 528)
    back = unpack_records(records, "fp8_mx")
    assert back.dtype == torch.float32 and back.shape == (40, 512)
    assert _within_precision(back, kv.float(), 32)
    assert not torch.equal(back, kv.float())  # the rope dims are quantized too


def test_round_trip_fp8_ds_mla() -> None:
    kv = _random_kv(40, seed=2)
    back = unpack_records(pack_records(kv, "fp8_ds_mla"), "fp8_ds_mla")
    assert _within_precision(back[:, :448], kv[:, :448].float(), 64)
    assert torch.equal(back[:, 448:], kv[:, 448:].float())  # rope dims exact (bf16)


def test_bad_records() -> None:
    with pytest.raises(ValueError, match=r"kv: expected \[N, 512\], got \[3, 448\]"):
        pack_records(torch.zeros(3, 448), "fp8_mx")
    with pytest.raises(ValueError, match=r"records: expected uint8 \[N, 584\]"):
        unpack_records(torch.zeros(3, 528, dtype=torch.uint8), "fp8_ds_mla")


def _decode_e4m3(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(E4M3).float()


def test_ds_mla_page_layout_bytes() -> None:
    block, pages = 16, 5
    cache = PagedKVCache(pages, block, "fp8_ds_mla")
    assert cache.data.shape == (pages, block * 584)
    gen = torch.Generator().manual_seed(3)
    slots = torch.randperm(pages * block, generator=gen)[:23]
    kv = _random_kv(23, seed=3)
    cache.insert(slots, kv)
    flat = cache.data.view(-1)
    written = torch.zeros_like(flat, dtype=torch.bool)
    for i, s in enumerate(slots.tolist()):
        page, row = divmod(s, block)
        data = page * block * 584 + row * 576
        scale = page * block * 584 + block * 576 + row * 8
        written[data : data + 576] = True
        written[scale : scale + 8] = True
        codes = flat[scale : scale + 8]
        amax = kv[i, :448].float().view(7, 64).abs().amax(-1)
        assert codes[:7].tolist() == [_code(a) for a in amax.tolist()]
        assert codes[7] == 0  # pad byte
        nope = _decode_e4m3(flat[data : data + 448]).view(7, 64)
        nope = nope * torch.exp2(codes[:7].float() - 127)[:, None]
        assert _within_precision(nope.view(1, 448), kv[i : i + 1, :448].float(), 64)
        rope = flat[data + 448 : data + 576].contiguous().view(torch.bfloat16)
        assert torch.equal(rope, kv[i, 448:])
    assert (flat[~written] == 0).all()  # nothing else was touched


def test_mx_record_layout_bytes() -> None:
    block, pages = 8, 4
    cache = PagedKVCache(pages, block, "fp8_mx")
    slots = torch.tensor([0, 7, 8, 31, 13])
    kv = _random_kv(5, seed=4)
    cache.insert(slots, kv)
    flat = cache.data.view(-1)
    for i, s in enumerate(slots.tolist()):
        rec = flat[s * 528 : (s + 1) * 528]  # records back to back: page * block + row = slot
        amax = kv[i].float().view(16, 32).abs().amax(-1)
        assert rec[512:].tolist() == [_code(a) for a in amax.tolist()]
        back = _decode_e4m3(rec[:512]).view(16, 32) * torch.exp2(rec[512:].float() - 127)[:, None]
        assert _within_precision(back.view(1, 512), kv[i : i + 1].float(), 32)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_mx"])
def test_cache_insert_read_random_slots(fmt: str) -> None:
    gen = torch.Generator().manual_seed(5)
    cache = PagedKVCache(6, 16, fmt)
    slots = torch.randperm(cache.num_slots, generator=gen)[:30]
    kv = _random_kv(30, seed=5)
    cache.insert(slots, kv)
    order = torch.randperm(30, generator=gen)  # read back in another order
    assert torch.equal(cache.read(slots[order]), pack_records(kv[order], fmt))
    back = unpack_records(pack_records(kv, fmt), fmt)
    assert torch.equal(cache.dequantize(slots[order]), back[order])
    unused = torch.tensor(sorted(set(range(cache.num_slots)) - set(slots.tolist())))
    assert (cache.read(unused) == 0).all()
    # Overwriting one slot changes only that slot.
    cache.insert(slots[:1], kv[1:2])
    assert torch.equal(cache.read(slots[:2]), pack_records(kv[1:2].expand(2, -1), fmt))


def test_out_of_range_slot_raises() -> None:
    cache = PagedKVCache(2, 16, "fp8_ds_mla")
    kv = _random_kv(2, seed=6)
    with pytest.raises(IndexError, match=r"slots: expected 0 <= slot < 32, got \[32\]"):
        cache.insert(torch.tensor([3, 32]), kv)
    with pytest.raises(IndexError, match=r"got \[-1\]"):
        cache.read(torch.tensor([-1]))
    assert (cache.data == 0).all()  # the refused insert wrote nothing


def _table_loop(positions, block_tables, topk, window, block, keys) -> torch.Tensor:
    """docs/design.md §4 entry by entry: valid top-k | 1 << 31, then the window oldest first, then
    -1."""
    rows = []
    for t, p in enumerate(positions.tolist()):
        row = []
        if topk is not None:
            row += [int(r) | FLAG for r in topk[t].tolist() if r >= 0]
        for q in range(max(0, p - window + 1), p + 1):
            row.append(int(block_tables[t, q // block]) * block + q % block)
        row += [-1] * (keys - len(row))
        rows.append([e - (1 << 32) if e >= FLAG else e for e in row])
    return torch.tensor(rows, dtype=torch.int32)


def _table_inputs(seed: int, tokens: int = 6, window: int = 32, block: int = 16, topk_n: int = 24):
    gen = torch.Generator().manual_seed(seed)
    max_pages = 8
    block_tables = torch.randperm(tokens * max_pages, generator=gen).view(tokens, max_pages).int()
    positions = torch.randint(0, max_pages * block, (tokens,), generator=gen)
    positions[0] = 3  # shorter than the window
    positions[1] = 0  # the first token of its sequence
    positions[2] = window - 1  # exactly a full window
    positions[3] = 100  # a full window, with an empty top-k below
    topk = torch.randint(0, 1000, (tokens, topk_n), generator=gen).int()
    topk[torch.rand(tokens, topk_n, generator=gen) < 0.3] = -1  # -1 padding anywhere
    topk[3] = -1  # empty top-k
    topk[4, -5:] = -1  # -1 at the tail only
    return positions, block_tables, topk


@pytest.mark.parametrize("with_topk", [True, False])
@pytest.mark.parametrize("extra_keys", [0, 7])
def test_build_key_table_matches_loop(with_topk: bool, extra_keys: int) -> None:
    window, block = 32, 16
    positions, block_tables, topk = _table_inputs(seed=7, window=window, block=block)
    topk = topk if with_topk else None
    keys = (topk.shape[1] if with_topk else 0) + window + extra_keys
    table = build_key_table(
        positions, block_tables, window=window, block=block, topk=topk, keys=keys
    )
    assert table.dtype == torch.int32 and table.shape == (6, keys)
    want = _table_loop(positions, block_tables, topk, window, block, keys)
    assert torch.equal(table, want)
    # Spot checks of the structure the loop encodes.
    assert (table[0] >= 0).sum() == 4 and (table[1] >= 0).sum() == 1
    if with_topk:
        assert (table[3, :window] >= 0).all()  # no compressed entry: the window comes first
        assert table[5, 0] < 0 and table[5, 0] != -1  # flagged compressed slot
        assert (table[5, 0].item() & 0x7FFFFFFF) == topk[5][topk[5] >= 0][0].item()


def test_build_key_table_default_keys_and_too_few() -> None:
    positions, block_tables, topk = _table_inputs(seed=8)
    table = build_key_table(positions, block_tables, window=32, block=16, topk=topk)
    assert table.shape == (6, 24 + 32)
    with pytest.raises(ValueError, match="keys: expected >= topk \\+ window = 56, got 55"):
        build_key_table(positions, block_tables, window=32, block=16, topk=topk, keys=55)


def test_decode_and_validate_key_table() -> None:
    positions, block_tables, topk = _table_inputs(seed=9)
    table = build_key_table(positions, block_tables, window=32, block=16, topk=topk, keys=60)
    window_n, comp_n = 6 * 8 * 16, 1000
    validate_key_table(table, window_n, comp_n)  # a good table passes
    is_comp, slot, valid = decode_key_table(table, window_n, comp_n)
    assert torch.equal(valid, table != -1)
    assert torch.equal(is_comp & valid, table < -1)
    flagged = table[table < -1].long() + (1 << 32) - FLAG
    assert torch.equal(slot[table < -1], flagged)
    bad = table.clone()
    bad[2, 30] = window_n  # window slot one past the cache
    with pytest.raises(IndexError, match=rf"key_table\[2, 30\]: window slot {window_n} is outside "
                                         rf"the window cache of {window_n} slots"):
        validate_key_table(bad, window_n, comp_n)
    bad = table.clone()
    bad[4, 1] = ((comp_n + 5) | FLAG) - (1 << 32)  # (comp_n + 5) | 1 << 31 as int32
    with pytest.raises(IndexError, match=r"key_table\[4, 1\]: compressed slot 1005 is outside"):
        validate_key_table(bad, window_n, comp_n)
    is_comp, slot, valid = decode_key_table(bad, window_n, comp_n)
    assert not valid[4, 1]  # a kernel treats it as none
    with pytest.raises(ValueError, match="key_table: expected int32"):
        validate_key_table(table.long(), window_n, comp_n)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_mx"])
def test_gather_keys_matches_per_slot_dequantize(fmt: str) -> None:
    window, block = 32, 16
    positions, block_tables, topk = _table_inputs(seed=10, window=window, block=block)
    win_cache = PagedKVCache(6 * 8, block, fmt)
    comp_cache = PagedKVCache(1024 // 64, 64, fmt)
    win_cache.insert(torch.arange(win_cache.num_slots), _random_kv(win_cache.num_slots, seed=11))
    comp_cache.insert(torch.arange(comp_cache.num_slots), _random_kv(comp_cache.num_slots, seed=12))
    table = build_key_table(positions, block_tables, window=window, block=block, topk=topk, keys=60)
    table[0, -1] = win_cache.num_slots + 3  # outside the window cache: none
    keys, valid = gather_keys(table, win_cache, comp_cache)
    assert keys.shape == (6, 60, 512) and valid.shape == (6, 60)
    for t in range(6):
        for k in range(60):
            e = int(table[t, k])
            if e == -1 or e == win_cache.num_slots + 3:
                assert not valid[t, k] and (keys[t, k] == 0).all()
                continue
            assert valid[t, k]
            cache, slot = (comp_cache, (e + (1 << 32)) - FLAG) if e < 0 else (win_cache, e)
            want = cache.dequantize(torch.tensor([slot]))[0]
            assert torch.equal(keys[t, k], want)
    # Without a compressed cache, compressed entries are none.
    keys, valid = gather_keys(table, win_cache, None)
    assert not valid[table < -1].any()
