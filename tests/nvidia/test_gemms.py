"""The step's GEMM-side kernels against their reference seams (tiny geometry, interpreter on CPU).

Seams: ``qkv = mx_linear(mxfp8(x), Wqkv)``, ``qr / kv`` = ``rmsnorm`` (+ ``apply_rope``
and the record ``PagedKVCache.insert``), ``q = mx_linear(mxfp8(qr), Wq_b)``, the
grouped ``z`` of wo_a with its MXFP8, ``y = mx_linear(z8, Wo_b)``. The kernels round to
bf16 to nearest even themselves, so bf16 seams are bit-equal but for the odd
rounding that fp32 accumulation order flips (within one bf16 step); the
interpreter rounds f32 -> e4m3 differently at ties, so e4m3 values are compared
to within one e4m3 step; E8M0 codes, computed from bits, must match exactly.
"""


import dataclasses

import pytest
import torch
import triton
from sm90 import ptx_facts  # tests/nvidia/sm90.py

from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.mx import (
    E4M3,
    block_to_row_scales,
    mxfp8_dequantize,
    mxfp8_quantize,
    mxfp8_round,
    quantize_weight_blocks,
)
from dsv41.common.reference import mx_linear, rmsnorm, wo_a_grouped
from dsv41.common.rope import apply_rope, rope_tables
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.launch import bucket_for
from dsv41.nvidia.ops.mx_gemm import (
    GEMV_BLOCK_K_MAX,
    GEMV_MAX_M,
    GEMV_QUANT_TILE_BYTES,
    GEMV_SPLIT_TILE_BYTES,
    GEMV_TAIL_BYTES,
    GEMV_TILE_BYTES,
    PROGRAMS_PER_SM,
    TRACE_FIELDS,
    GemmConfig,
    Dequantized,
    GemvRules,
    NormInput,
    Scratch,
    gemm_config,
    mx_gemm,
)
from dsv41.nvidia.ops.mx_round import mx_round
from dsv41.nvidia.ops.norm_rope_insert import norm_rope_insert
from dsv41.nvidia.tuning import gemm_shapes

BF16_STEP = 2.0**-7  # bf16 spacing relative to a value, at most
E4M3_STEP = 2.0**-3


@pytest.fixture(scope="module")
def layer() -> LayerWeights:
    lw = LayerWeights(Dims.of("tiny", 2), rank=1, layer_id=1)
    lw.dummy_load(seed=7)
    return lw


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor, exact: float = 0.99) -> None:
    """Within one bf16 step of the reference (fp32 accumulation order may flip a rounding),
    and bit-equal in at least ``exact`` of the elements."""
    got, want = got.float(), want.float()
    assert got.shape == want.shape
    bound = BF16_STEP * want.abs() + 1e-3 * want.abs().max()
    bad = (got - want).abs() > bound
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.numel()} differ, max {(got - want).abs().max()}"
    )
    assert (got == want).float().mean() >= exact


def assert_mx_close(
    got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """Codes equal; values within one e4m3 step."""
    assert torch.equal(got[1], want[1]), f"codes differ in {int((got[1] != want[1]).sum())} groups"
    g, w = got[0].float(), want[0].float()
    assert ((g - w).abs() <= E4M3_STEP * w.abs() + 2.0**-9).all()


def x_of(m: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("m", [1, 5, 48])
def test_wqkv_casts_x_in_its_prologue(layer, m):
    """Seam qkv: bf16 x in, ``mx_linear(mxfp8(x), Wqkv)`` out."""
    x = x_of(m, layer.dims.model.hidden, m)
    got = mx_gemm(x, layer.wqkv, layer.wqkv_scale)
    assert_bf16_close(got, mx_linear(mxfp8_quantize(x), layer.wqkv, layer.wqkv_scale))


def test_split_k_leaves_tickets_at_zero(layer):
    """Forced split-K: same seam, and the tickets are back at 0 (graph replays need no memset)."""
    x = x_of(3, layer.dims.model.hidden, 3)
    scratch = Scratch()
    cfg = GemmConfig(block_m=16, block_n=32, block_k=64, split_k=4)
    got = mx_gemm(x, layer.wqkv, layer.wqkv_scale, scratch=scratch, config=cfg)
    assert_bf16_close(got, mx_linear(mxfp8_quantize(x), layer.wqkv, layer.wqkv_scale))
    assert scratch.tickets.numel() >= layer.wqkv.shape[0] // 32
    assert not scratch.tickets.any()


@pytest.mark.parametrize("m", [1, 5])
def test_wq_b_emits_fused_q(layer, m):
    """Seam q (fused, before RoPE): ``mx_linear(mxfp8(qr), Wq_b)``."""
    qr8 = mxfp8_quantize(x_of(m, layer.dims.model.q_rank, 10 + m))
    got = mx_gemm(qr8, layer.wq_b, layer.wq_b_scale)
    assert_bf16_close(got, mx_linear(qr8, layer.wq_b, layer.wq_b_scale))


@pytest.mark.parametrize("m,split_k", [(1, 1), (5, 4)])
def test_wo_a_grouped_with_z_quantized(layer, m, split_k):
    """Seams z and z8: per group ``xo_g @ Wo_a_g^T`` in bf16, then its MXFP8 in the same launch."""
    dims, model = layer.dims, layer.dims.model
    xo = mxfp8_quantize(x_of(m, dims.heads * model.head_dim, 20 + m))
    z8 = (
        torch.empty(m, dims.o_rows, dtype=E4M3),
        torch.empty(m, dims.o_rows // 32, dtype=torch.uint8),
    )
    cfg = GemmConfig(block_m=16, block_n=32, block_k=128, split_k=split_k)
    z = mx_gemm(xo, layer.wo_a, layer.wo_a_scale, out8=z8, n_per_group=model.o_rank, config=cfg)
    want = wo_a_grouped(layer, mxfp8_dequantize(*xo)).reshape(m, dims.o_rows)
    assert_bf16_close(z, want)
    assert_mx_close(z8, mxfp8_quantize(z))


@pytest.mark.parametrize("k", [96, 1280])
def test_mx_round_gives_x_dequantized(k):
    """``mx_round``: bf16 of the torch MXFP8 round trip, bit for bit (K of 3 and 40 MX blocks,
    20 tokens: two row tiles)."""
    x = x_of(20, k, k) * torch.logspace(-3, 3, k).bfloat16()
    got = mx_round(x, torch.empty_like(x))
    assert torch.equal(got, mxfp8_round(x).bfloat16())


def test_wo_a_and_wo_b_on_dequantized_activations(layer):
    """Seams z, z8 and y with ``A_DEQ`` activations and wo_a's ``out_deq``: bit-equal to the
    MXFP8 inputs, and ``out_deq`` the torch dequantization of z8."""
    dims, model = layer.dims, layer.dims.model
    m = 5
    xo = mxfp8_quantize(x_of(m, dims.heads * model.head_dim, 25))
    z8, z8d = [(torch.empty(m, dims.o_rows, dtype=E4M3),
                torch.empty(m, dims.o_rows // 32, dtype=torch.uint8))
               for _ in range(2)]  # fmt: skip
    zd = torch.empty(m, dims.o_rows, dtype=torch.bfloat16)
    z = mx_gemm(xo, layer.wo_a, layer.wo_a_scale, out8=z8, n_per_group=model.o_rank)
    got = mx_gemm(Dequantized(mxfp8_dequantize(*xo).bfloat16()), layer.wo_a, layer.wo_a_scale,
                  out8=z8d, out_deq=zd, n_per_group=model.o_rank)  # fmt: skip
    assert torch.equal(got, z) and torch.equal(z8d[1], z8[1])
    assert torch.equal(z8d[0].view(torch.uint8), z8[0].view(torch.uint8))
    assert torch.equal(zd, mxfp8_dequantize(*z8).bfloat16())
    y = mx_gemm(Dequantized(zd), layer.wo_b, layer.wo_b_scale)
    assert torch.equal(y, mx_gemm(z8, layer.wo_b, layer.wo_b_scale))


@pytest.mark.parametrize("site", ["wqkv", "wq_b", "wo_a", "wo_b"])
def test_preloaded_mma_loop_matches_the_reference(layer, site):
    """``gemm_config(preload=...)``: one K step a program, read before the wait; each site's
    output within a bf16 step of ``mx_linear`` on its dequantized MXFP8 activation."""
    m, w, scale = 5, getattr(layer, site), getattr(layer, f"{site}_scale")
    npg = layer.dims.model.o_rank if site == "wo_a" else w.shape[0]
    n, k = w.shape
    cfg = gemm_config(m, n, k, n_per_group=npg, quant_out=False, sms=8, gemv_ok=False,
                      preload=64)  # fmt: skip
    assert cfg.preload and cfg.block_k * cfg.split_k == k and cfg.split_k > 1, cfg
    a8 = mxfp8_quantize(x_of(m, k * (n // npg), 40))
    got = mx_gemm(Dequantized(mxfp8_dequantize(*a8).bfloat16()), w, scale, n_per_group=npg,
                  scratch=Scratch(), config=cfg)  # fmt: skip
    if site == "wo_a":
        want = wo_a_grouped(layer, mxfp8_dequantize(*a8)).reshape(m, n)
    else:
        want = mx_linear(a8, w, scale)
    assert_bf16_close(got, want)


def test_wo_b(layer):
    """Seam y: ``mx_linear(z8, Wo_b)``."""
    z8 = mxfp8_quantize(x_of(5, layer.dims.o_rows, 30))
    got = mx_gemm(z8, layer.wo_b, layer.wo_b_scale)
    assert_bf16_close(got, mx_linear(z8, layer.wo_b, layer.wo_b_scale))


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("site", ["wqkv", pytest.param("wq_b", marks=pytest.mark.slow), "wo_a"])
def test_cuda_core_loop_matches_the_reference(layer, site, m, tail):
    """The GEMV loop (forced; at M = 5 rows past M in its 8-row bucket) against each seam:
    bf16 x cast in the prologue, MXFP8 qr8 (both as 2 unrolled K steps of one program, no
    split-K sum), grouped xo with z re-quantized (2 K splits). With ``tail``, a program's
    last quarter (wo_a: half) of K is a second tile loaded before the wait, after 3 (wo_a: 1)
    unrolled K steps."""
    dims, model = layer.dims, layer.dims.model
    z8 = None
    if site == "wqkv":
        w, ws, npg, a = layer.wqkv, layer.wqkv_scale, None, x_of(m, model.hidden, 50 + m)
        want = mx_linear(mxfp8_quantize(a), w, ws)
    elif site == "wq_b":
        w, ws, npg = layer.wq_b, layer.wq_b_scale, None
        a = mxfp8_quantize(x_of(m, model.q_rank, 60 + m))
        want = mx_linear(a, w, ws)
    else:
        w, ws, npg = layer.wo_a, layer.wo_a_scale, model.o_rank
        a = mxfp8_quantize(x_of(m, dims.heads * model.head_dim, 70 + m))
        z8 = (torch.empty(m, dims.o_rows, dtype=E4M3),
              torch.empty(m, dims.o_rows // 32, dtype=torch.uint8))  # fmt: skip
        want = wo_a_grouped(layer, mxfp8_dequantize(*a)).reshape(m, dims.o_rows)
    k = w.shape[1]
    steps, splits = (1, 2) if site == "wo_a" else (2, 1)  # M = 1: one row's lanes over steps
    block_k, k_tail = k // 2, 0
    if tail:  # wo_a: one step and the tail; the others: 3 steps (M = 1: lanes) and the tail
        steps, block_k = (1, k // 2) if site == "wo_a" else (3, k // 4)
        splits, k_tail = 1, block_k
    cfg = GemmConfig(block_m=8 if m > 1 else 1, block_n=32, block_k=block_k, split_k=splits,
                     gemv=True, k_steps=steps, k_tail=k_tail)  # fmt: skip
    scratch = Scratch()
    got = mx_gemm(a, w, ws, out8=z8, n_per_group=npg, scratch=scratch, config=cfg)
    assert_bf16_close(got, want)
    if z8 is not None:
        assert_mx_close(z8, mxfp8_quantize(got))
    assert not scratch.tickets.any()


@pytest.mark.slow
def test_rmsnorm_prologue_matches_the_norm_kernel(layer):
    """wq_b on the Wqkv output (A_NORM; 3 tokens in a 4-row bucket): the same product as wq_b
    on norm_rope_insert's qr8, bit for bit, and within a bf16 step of the reference."""
    model, m = layer.dims.model, 3
    qkv = (3 * x_of(m, model.qkv_rows, 83).float()).bfloat16()
    cache = PagedKVCache(4, model.window_block, "fp8_ds_mla")
    cos, sin = rope_tables(model, layer.layer_id)
    qr8 = (torch.empty(m, model.q_rank, dtype=E4M3),
           torch.empty(m, model.q_rank // 32, dtype=torch.uint8))  # fmt: skip
    norm_rope_insert(qkv, layer.q_norm, layer.kv_norm, torch.arange(m), torch.arange(m), cache,
                     cos, sin, eps=model.eps, nope=model.nope_dim,
                     kv=torch.empty(m, model.kv_dim, dtype=torch.bfloat16), qr8=qr8)  # fmt: skip
    k = model.q_rank
    cfg = GemmConfig(block_m=4, block_n=32, block_k=k // 2, split_k=2, gemv=True)
    got = mx_gemm(NormInput(qkv[:, :k], layer.q_norm, model.eps), layer.wq_b, layer.wq_b_scale,
                  scratch=Scratch(), config=cfg)  # fmt: skip
    assert torch.equal(got, mx_gemm(qr8, layer.wq_b, layer.wq_b_scale, config=cfg))
    # one token in 2 unrolled K steps (per-lane sums): the RMS factor is read once a program
    one = GemmConfig(block_m=1, block_n=32, block_k=k // 2, split_k=1, gemv=True, k_steps=2)
    got1 = mx_gemm(NormInput(qkv[1:2, :k], layer.q_norm, model.eps), layer.wq_b,
                   layer.wq_b_scale, scratch=Scratch(), config=one)  # fmt: skip
    assert torch.equal(got1, mx_gemm((qr8[0][1:2], qr8[1][1:2]), layer.wq_b, layer.wq_b_scale,
                                     config=one))  # fmt: skip
    want = mx_linear(mxfp8_quantize(rmsnorm(qkv[:, :k], layer.q_norm, model.eps)), layer.wq_b,
                     layer.wq_b_scale)  # fmt: skip
    assert_bf16_close(got, want, exact=0.9)
    with pytest.raises(ValueError, match="a: the RMSNorm prologue runs on the CUDA-core loop"):
        mx_gemm(NormInput(qkv[:, :k], layer.q_norm, model.eps), layer.wq_b, layer.wq_b_scale,
                config=GemmConfig(block_m=16, block_n=32, block_k=k, split_k=1))  # fmt: skip


def test_one_token_takes_whole_rows_with_a_tail():
    """Real geometry, tp 4, one token: a K past GEMV_BLOCK_K_MAX takes whole rows of
    ``GemvRules.tail`` bytes as a power-of-two tile and a tail (Wqkv 4096 + 1024, wq_b 1024 +
    256, wo_a without its MXFP8 epilogue 4096); two tokens, and a tail rule of 0, split K. A K of
    2048 (wo_b) takes that many bytes of whole rows too (16); without them, or at two tokens,
    ``GemvRules.tile``'s (8)."""
    no_tail = GemvRules(tail=0)
    shapes = gemm_shapes(Dims.of("dsv41-flash", 4))
    want = {"wqkv": (4, 4096, 1024), "wq_b": (16, 1024, 256), "wo_a": (8, 4096, 0)}
    for name, (rows, head, tail) in want.items():
        n, k, npg, _ = shapes[name]
        cfg = gemm_config(1, n, k, n_per_group=npg or n, quant_out=False, sms=132)
        assert (cfg.block_n, cfg.block_k, cfg.k_tail, cfg.k_steps, cfg.split_k) == (
            rows, head, tail, 1, 1), (name, cfg)  # fmt: skip
        assert cfg.block_n * k <= GEMV_TAIL_BYTES and cfg.num_warps == 8, cfg
        assert gemm_config(2, n, k, n_per_group=npg or n, quant_out=False, sms=132).split_k > 1
        assert gemm_config(1, n, k, n_per_group=npg or n, quant_out=False, sms=132,
                           rules=no_tail).split_k > 1  # fmt: skip
    n, k, npg, _ = shapes["wo_b"]
    assert k == GEMV_BLOCK_K_MAX and GEMV_TAIL_BYTES // k == 16 and GEMV_TILE_BYTES // k == 8
    cfg = gemm_config(1, n, k, n_per_group=n, quant_out=False, sms=132)
    assert (cfg.block_n, cfg.block_k, cfg.k_tail, cfg.split_k, cfg.num_warps) == (16, k, 0, 1, 8)
    assert gemm_config(1, n, k, n_per_group=n, quant_out=False, sms=132,
                       rules=no_tail).block_n == 8  # fmt: skip
    assert gemm_config(2, n, k, n_per_group=n, quant_out=False, sms=132).block_n == 8
    n, k, npg, _ = shapes["wo_a"]
    assert gemm_config(1, n, k, n_per_group=npg, quant_out=True, sms=132).split_k > 1  # casts z
    for bad in (1, 65536, 12288):
        with pytest.raises(ValueError, match=f"GemvRules.tail: expected 0 or a power of two "
                                             f"4096 .. 32768, got {bad}"):  # fmt: skip
            GemvRules(tail=bad)


@pytest.mark.parametrize("steps, tile", [(1, GEMV_SPLIT_TILE_BYTES), (5, 2 * GEMV_SPLIT_TILE_BYTES)])
def test_small_buckets_take_the_cuda_core_loop(steps, tile):
    """Real geometry, tp 4: buckets up to GEMV_MAX_M run the GEMV loop, whole rows a program
    where they fit a tile in at most ``GemvRules.max_steps`` K steps, else K split in tiles; the
    MMA loop above them and for the fused WO-A prologue (one token's tail rule off)."""
    rules = GemvRules(tail=0, max_steps=steps, split_tile=tile)
    dims = Dims.of("dsv41-flash", 4)
    whole = set()
    for name, (n, k, npg, quant) in gemm_shapes(dims).items():
        for m in (1, 2, 8, 16):
            cfg = gemm_config(m, n, k, n_per_group=npg or n, quant_out=quant, sms=132, rules=rules)
            assert cfg.gemv == (m <= GEMV_MAX_M), (name, m, cfg)
            if cfg.gemv:
                assert cfg.block_m == m and cfg.block_k * cfg.k_steps * cfg.split_k == k, cfg
                if cfg.split_k == 1:
                    whole.add(name)
                    assert cfg.block_n * k <= GEMV_TILE_BYTES and cfg.k_steps <= steps, cfg
                else:
                    assert cfg.k_steps == 1 and cfg.block_n >= (32 if quant else 8), cfg
                    want = GEMV_QUANT_TILE_BYTES if quant else tile  # wo_a: its own rule
                    assert cfg.block_n * cfg.block_k == want, (name, cfg)
        assert not gemm_config(1, n, k, n_per_group=npg or n, quant_out=quant, sms=132,
                               gemv_ok=False, rules=rules).gemv  # fmt: skip
    # wo_b's 2048 columns are one K step; Wqkv's 5120 and wq_b's 1280 take 5; wo_a casts z
    assert whole == ({"wo_b"} if steps == 1 else {"wqkv", "wq_b", "wo_b"})
    for field, bad, expected in (("max_steps", 0, "1 .. 8"), ("max_steps", 9, "1 .. 8"),
                                 ("max_m", 49, "0 .. 48"), ("max_m", -1, "0 .. 48"),
                                 ("tile", 12288, "a power of two"),
                                 ("split_tile", 65536, "a power of two")):  # fmt: skip
        with pytest.raises(ValueError, match=f"GemvRules.{field}: expected {expected}"):
            GemvRules(**{field: bad})
    assert not gemm_config(1, 64, 256, n_per_group=64, quant_out=False, sms=132,
                           rules=GemvRules(max_m=0)).gemv  # fmt: skip
    n, k, _, _ = gemm_shapes(dims)["wo_b"]  # wo_b: 4 whole rows of 2048 a program
    cfg = gemm_config(1, n, k, n_per_group=n, quant_out=False, sms=132,
                      rules=GemvRules(tail=0, tile=8192))  # fmt: skip
    assert (cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps) == (4, 2048, 1, 4), cfg
    n, k, npg, _ = gemm_shapes(dims)["wo_a"]  # wo_a: 32 rows x 512, 8 K splits
    cfg = gemm_config(1, n, k, n_per_group=npg, quant_out=True, sms=132,
                      rules=GemvRules(quant_tile=16384))  # fmt: skip
    assert (cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps) == (32, 512, 8, 8), cfg


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8_mx"])
def test_norm_rope_insert(layer, fmt):
    """Seams qr (as MXFP8), kv and the record insert; a slot outside the cache is skipped."""
    model = layer.dims.model
    m = 4
    qkv = (3 * x_of(m, model.qkv_rows, 40).float()).bfloat16()
    positions = torch.tensor([0, 5, 77, 1000])
    cache = PagedKVCache(4, model.window_block, fmt)
    cache.data.random_(0, 256, generator=torch.Generator().manual_seed(1))
    slots = torch.tensor([3, 17, cache.num_slots, 40])  # the third is outside the cache
    before = cache.data.clone()
    cos, sin = rope_tables(model, layer.layer_id)
    kv = torch.empty(m, model.kv_dim, dtype=torch.bfloat16)
    qr8 = (
        torch.empty(m, model.q_rank, dtype=E4M3),
        torch.empty(m, model.q_rank // 32, dtype=torch.uint8),
    )
    norm_rope_insert(
        qkv,
        layer.q_norm,
        layer.kv_norm,
        positions,
        slots,
        cache,
        cos,
        sin,
        eps=model.eps,
        nope=model.nope_dim,
        kv=kv,
        qr8=qr8,
    )

    qr = rmsnorm(qkv[:, : model.q_rank], layer.q_norm, model.eps)
    want_kv = apply_rope(
        rmsnorm(qkv[:, model.q_rank :], layer.kv_norm, model.eps),
        positions,
        cos,
        sin,
        model.nope_dim,
    )
    assert_bf16_close(kv, want_kv)
    got_qr = mxfp8_dequantize(*qr8)
    assert (
        (got_qr - mxfp8_dequantize(*mxfp8_quantize(qr))).abs()
        <= 2 * BF16_STEP * qr.float().abs() + E4M3_STEP * got_qr.abs()
    ).all()
    ref = PagedKVCache(4, model.window_block, fmt)
    ref.data.copy_(before)
    keep = slots < cache.num_slots
    ref.insert(slots[keep], kv[keep])  # the kernel's own kv, stored by the reference packer
    assert torch.allclose(
        cache.dequantize(slots[keep]), ref.dequantize(slots[keep]), rtol=E4M3_STEP, atol=1e-6
    )
    others = torch.ones(cache.num_slots, dtype=torch.bool)
    others[slots[keep]] = False
    assert torch.equal(cache.read(others.nonzero()[:, 0]), ref.read(others.nonzero()[:, 0]))
    # without qr8 (a wq_b that normalises qr itself): the same kv and records, no q half
    kv_only, cache_kv = torch.empty_like(kv), PagedKVCache(4, model.window_block, fmt)
    cache_kv.data.copy_(before)
    norm_rope_insert(qkv, layer.q_norm, layer.kv_norm, positions, slots, cache_kv, cos, sin,
                     eps=model.eps, nope=model.nope_dim, kv=kv_only, qr8=None)  # fmt: skip
    assert torch.equal(kv_only, kv) and torch.equal(cache_kv.data, cache.data)


def test_configs_fill_the_gpu_from_the_bucket():
    """Real geometry, tp 4, 132 SMs: PROGRAMS_PER_SM programs a SM at M = 1, one config a bucket."""
    dims = Dims.of("dsv41-flash", 4)
    model = dims.model
    shapes = {
        "wqkv": (model.qkv_rows, model.hidden, model.qkv_rows, False),
        "wq_b": (dims.q_rows, model.q_rank, dims.q_rows, False),
        "wo_a": (dims.o_rows, dims.group_k, model.o_rank, True),
        "wo_b": (model.hidden, dims.o_rows, model.hidden, False),
    }
    for name, (n, k, npg, quant) in shapes.items():
        cfg = gemm_config(1, n, k, n_per_group=npg, quant_out=quant, sms=132)
        programs = -(-n // cfg.block_n) * cfg.split_k
        assert programs >= PROGRAMS_PER_SM * 132, (name, cfg, programs)
        assert npg % cfg.block_n == 0 and cfg.k_split * cfg.split_k == k
    for m in range(1, 49):
        b = bucket_for(m)
        assert b >= m and gemm_config(
            m, 2048, 4096, n_per_group=1024, quant_out=True, sms=132
        ) == gemm_config(b, 2048, 4096, n_per_group=1024, quant_out=True, sms=132)


def test_bad_inputs_name_the_argument(layer):
    x = x_of(2, layer.dims.model.hidden, 0)
    with pytest.raises(ValueError, match="w: expected float8_e4m3fn"):
        mx_gemm(x, layer.wqkv.float(), layer.wqkv_scale)
    with pytest.raises(ValueError, match="a: expected bfloat16"):
        mx_gemm(x.float(), layer.wqkv, layer.wqkv_scale)
    with pytest.raises(ValueError, match="n_per_group"):
        mx_gemm(mxfp8_quantize(x), layer.wqkv, layer.wqkv_scale, n_per_group=100)
    k = 160  # five MX blocks: no power-of-two K step covers a row
    w, codes = quantize_weight_blocks(torch.randn(64, k, generator=torch.Generator().manual_seed(11)))
    with pytest.raises(ValueError, match="config: block_k must be a power of two of whole MX"):
        mx_gemm(x_of(1, k, 90), w, block_to_row_scales(codes),
                config=GemmConfig(block_m=1, block_n=8, block_k=k, split_k=1, gemv=True))  # fmt: skip
    # K = 160 as 128 + 32: whole rows with a tail; a tail that is no power of two is refused
    a = x_of(1, k, 91)
    got = mx_gemm(a, w, block_to_row_scales(codes),
                  config=GemmConfig(block_m=1, block_n=8, block_k=128, split_k=1, gemv=True,
                                    k_tail=32))  # fmt: skip
    assert_bf16_close(got, mx_linear(mxfp8_quantize(a), w, block_to_row_scales(codes)))
    with pytest.raises(ValueError, match="config: k_tail must be a power of two"):
        mx_gemm(a, w, block_to_row_scales(codes),
                config=GemmConfig(block_m=1, block_n=8, block_k=64, split_k=1, gemv=True,
                                  k_tail=96))  # fmt: skip
    with pytest.raises(ValueError, match="a8_out: expected a bf16 a on the CUDA-core loop and "
                                         "no out8, got an a that"):  # fmt: skip
        mx_gemm(mxfp8_quantize(x), layer.wqkv, layer.wqkv_scale,
                a8_out=mxfp8_quantize(x))  # fmt: skip
    with pytest.raises(ValueError, match="a: a Dequantized activation feeds the MMA loop"):
        n, k = layer.wqkv.shape
        gemv = gemm_config(2, n, k, n_per_group=n, quant_out=False, sms=8)  # the CUDA-core loop
        mx_gemm(Dequantized(x), layer.wqkv, layer.wqkv_scale, config=gemv)
    with pytest.raises(ValueError, match=r"a dequantized: expected bfloat16 \[2, \d+\], got"):
        mx_gemm(Dequantized(x.float()), layer.wqkv, layer.wqkv_scale)
    with pytest.raises(ValueError, match=r"config: code_words \(the MMA loop reading the weight"):
        n, k = layer.wqkv.shape
        gemv = gemm_config(2, n, k, n_per_group=n, quant_out=False, sms=8)  # the CUDA-core loop
        mx_gemm(x, layer.wqkv, layer.wqkv_scale, config=dataclasses.replace(gemv, code_words=True))
    with pytest.raises(ValueError, match=r"config: weights_a \(the weights the MMA's A operand\) "
                                         r"needs the MMA loop"):
        mx_gemm(x, layer.wqkv, layer.wqkv_scale, config=dataclasses.replace(gemv, weights_a=True))
    with pytest.raises(ValueError, match=r"config: preload \(the MMA loop's weights read "
                                         r"before the wait\) needs the MMA loop"):
        mx_gemm(x, layer.wqkv, layer.wqkv_scale, config=dataclasses.replace(gemv, preload=True))
    with pytest.raises(ValueError, match=r"and one K step a program \(block_k \* split_k = "):
        mma = GemmConfig(block_m=16, block_n=32, block_k=64, split_k=1, preload=True)
        mx_gemm(x_of(5, x.shape[1], 1), layer.wqkv, layer.wqkv_scale, config=mma)
    with pytest.raises(ValueError, match="needs block_k and K multiples of 128"):
        mma = GemmConfig(block_m=16, block_n=32, block_k=64, split_k=1, code_words=True)
        mx_gemm(x_of(5, x.shape[1], 1), layer.wqkv, layer.wqkv_scale, config=mma)
    with pytest.raises(ValueError, match="out_deq: expected it with out8"):
        mx_gemm(x_of(5, x.shape[1], 1), layer.wqkv, layer.wqkv_scale, out_deq=x)
    with pytest.raises(ValueError, match=r"x: expected bfloat16 \[2, \d+\]"):
        mx_round(x.float(), x)
    short = Scratch()
    short.trace = torch.zeros(1, TRACE_FIELDS, dtype=torch.int64)  # a row for one program
    fields = rf"scratch.trace: expected int64 \[>= \d+, {TRACE_FIELDS}\]"
    with pytest.raises(ValueError, match=fields):
        mx_gemm(x, layer.wqkv, layer.wqkv_scale, scratch=short)


@pytest.mark.parametrize("m", [1, 3])
def test_cuda_core_loop_stores_the_cast_of_a(layer, m):
    """wo_b on a bf16 z (A_CAST) with ``a8_out``: the stored MXFP8 form equals the torch cast
    of z bit for bit (the first N tile's programs store it, once per K split), and y the
    reference of that form."""
    k = layer.wo_b.shape[1]
    z = x_of(m, k, 95 + m)
    z8 = (torch.empty(m, k, dtype=E4M3), torch.empty(m, k // 32, dtype=torch.uint8))
    cfg = GemmConfig(block_m=triton.next_power_of_2(m), block_n=32, block_k=k // 2, split_k=2,
                     gemv=True)  # fmt: skip
    got = mx_gemm(z, layer.wo_b, layer.wo_b_scale, a8_out=z8, scratch=Scratch(), config=cfg)
    want = mxfp8_quantize(z)
    assert torch.equal(z8[1], want[1])
    assert torch.equal(z8[0].view(torch.uint8), want[0].view(torch.uint8))
    assert_bf16_close(got, mx_linear(want, layer.wo_b, layer.wo_b_scale))


SM90_COMPILE = r"""
import json, re, sys
from sm90 import sm90_ptx
from dsv41.nvidia.ops.mx_gemm import mx_gemm_kernel as fn
consts = {"N": 8192, "K": 1280, "N_PER_GROUP": 8192, "A_MODE": 0, "QUANT_OUT": False,
          "DOT_BF16": True, "G": 1, "HEAD_DIM": 1, "NOPE": 0, "HALF_ROPE": 1, "BLOCK_M": 16,
          "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 1, "GEMV": sys.argv[1] == "gemv",
          "K_PAD": 2048, "K_STEPS": 1, "K_TAIL": 0, "A8_OUT": False, "DEQ_OUT": False,
          "TRACE": False,
          "HW_E4M3": True, "RP_PER": 0, "RP_PAD": 1, "RP_TOTAL": 0, "RP_FMT": 0,
          "RP_WIN_BLOCK": 64, "RP_COMP_BLOCK": 64}
if sys.argv[2:] == ["records"]:  # 640 entries of fp8_ds_mla records over 512 programs
    consts.update(RP_PER=2, RP_PAD=2, RP_TOTAL=640)
if sys.argv[2:] == ["words"]:
    consts.update(CODE_WORDS=True)
if sys.argv[2:] == ["preload"]:  # one K step a program, read before the PDL wait
    consts.update(SPLIT_K=5, PRELOAD=True, USE_PDL=True)
if consts["GEMV"]:
    consts.update(BLOCK_M=1, BLOCK_N=64, BLOCK_K=256, SPLIT_K=5, USE_PDL=True)
kinds = {"a_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "out_ptr": "*bf16", "out8_ptr": "*fp8e4nv",
         "part_ptr": "*fp32", "ticket_ptr": "*i32", "pos_ptr": "*i64", "cos_ptr": "*fp32",
         "sin_ptr": "*fp32", "rp_table_ptr": "*i32"}
ptx = sm90_ptx(fn, consts, kinds, lambda n, k: k[0] == "*" or n.startswith("stride"),
               num_stages=4)
before_wait = ptx.split("griddepcontrol.wait")[0]
print(json.dumps({"wide_before_wait": len(re.findall(r"ld\.global\.v4\.b32", before_wait))} |
                 {k: len(re.findall(p, ptx)) for k, p in
                  {"cp_async": r"cp\.async\.cg\.shared\.global", "mma": r"mma\.sync|wgmma",
                   "word_copies": r"cp\.async\.ca\.shared\.global[^;]*, 0x4,",
                   "byte_loads": r"ld\.global\.b8", "waits": r"griddepcontrol\.wait"}.items()}
                 | {"l2_prefetch_before_wait": len(re.findall(r"cp\.async\.bulk\.prefetch\.L2",
                                                              before_wait))}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_records_ahead_are_asked_of_the_l2_before_the_wait():
    """wq_b's CUDA-core loop compiled for SM90 with attention's records to ask for
    (``RecordsAhead``): bulk L2 prefetches before its PDL wait; none without."""
    plain, ahead = (ptx_facts(SM90_COMPILE, "gemv", r) for r in ("none", "records"))
    assert plain["l2_prefetch_before_wait"] == 0, plain
    assert ahead["l2_prefetch_before_wait"] >= 1 and ahead["waits"] == 1, ahead


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_weight_code_words_are_copied_ahead_on_sm90():
    """The MMA loop compiled for SM90: with ``code_words`` its weight codes arrive by 4-byte
    cp.async copies, as its values do by 16-byte ones; without, by loads the loop waits for."""
    plain, words = (ptx_facts(SM90_COMPILE, "mma", r) for r in ("none", "words"))
    assert plain["word_copies"] == 0 and words["word_copies"] > 0, (plain, words)
    assert words["cp_async"] == plain["cp_async"] > 0, (plain, words)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_preloaded_weights_are_read_before_the_wait_on_sm90():
    """The MMA loop compiled for SM90 with ``preload``: its one weight tile (32 x 256 bytes over
    128 threads) arrives by 16-byte loads issued before the PDL wait, not by cp.async."""
    counts = ptx_facts(SM90_COMPILE, "mma", "preload")
    assert counts["waits"] == 1 and counts["wide_before_wait"] >= 4, counts
    assert counts["mma"] > 0 and counts["byte_loads"] <= 2, counts


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
@pytest.mark.parametrize("loop", ["mma", "gemv"])
def test_weight_stream_compiles_to_wide_loads_for_sm90(loop):
    """wq_b compiled for SM90 without a GPU: the MMA loop's weights arrive by cp.async, the
    CUDA-core loop's by 16-byte vector loads straight to registers, issued before the PDL
    wait; never by byte loads."""
    counts = ptx_facts(SM90_COMPILE, loop)
    if loop == "mma":
        assert counts["cp_async"] > 0 and counts["mma"] > 0, counts
    else:  # 64 x 256 bytes over 256 threads: four 16-byte loads each
        assert counts["waits"] == 1 and counts["wide_before_wait"] >= 4, counts
        assert counts["mma"] == 0, counts
    assert counts["byte_loads"] <= 2, counts  # the epilogue's scalar loads at most
