"""LayerWeights loaders against a synthetic checkpoint: slices, scale expansion and permutations
recomputed here from docs/design.md §3 / §5 index formulas, idempotent loads, the reference step on
loaded weights against a standard-layout forward, and every load error."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dsv41.common.checkpoint import load_layer, synth_checkpoint
from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import gather_keys
from dsv41.common.mx import mxfp8_round
from dsv41.common.reference import reference_step
from dsv41.common.rope import apply_inverse_rope, apply_rope, rope_tables
from dsv41.common.scenario import make_scenario
from dsv41.common.weights import (
    LayerWeights,
    WeightLoadError,
    checkpoint_shapes,
    synth_layer_tensors,
)

MODEL = "tiny"
LAYER = 1  # a compressed layer (YaRN RoPE, top-k keys)
BLOCK = 32  # rows / columns sharing one checkpoint scale (docs/design.md §3)
RANKS = [(tp, rank) for tp in (1, 2, 4) for rank in range(tp)]
PARAMS = ("wqkv", "wqkv_scale", "q_norm", "kv_norm", "wq_b", "wq_b_scale", "wo_a", "wo_a_scale",
          "wo_b", "wo_b_scale", "attn_sink")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    synth_checkpoint(MODEL, 2, out, shards=3, seed=7)
    return out


@pytest.fixture(scope="module")
def ckpt(ckpt_dir) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, read file by file (not through the index)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(ckpt_dir.glob("model-*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def layer_items(ckpt: dict[str, torch.Tensor], layer_id: int = LAYER) -> list:
    prefix = f"layers.{layer_id}.attn."
    return [(k, v) for k, v in ckpt.items() if k.startswith(prefix)]


def u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def snapshot(lw: LayerWeights) -> dict[str, torch.Tensor]:
    return {name: u8(getattr(lw, name).data).clone() for name in PARAMS}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for name in PARAMS:
        assert torch.equal(a[name], b[name]), name


def row_codes(block_codes: torch.Tensor) -> torch.Tensor:
    """Per-row codes from 32x32 block codes: ``row[r, kb] = block[r // 32, kb]``."""
    codes = block_codes.view(torch.uint8)
    return codes[torch.arange(codes.shape[0] * BLOCK) // BLOCK]


def q_fused_index(heads: int, head_dim: int) -> list[int]:
    """``idx[(d // 16) * (H * 16) + h * 16 + d % 16] = h * D + d`` (docs/design.md §5, Q)."""
    idx = [0] * (heads * head_dim)
    for h in range(heads):
        for d in range(head_dim):
            idx[(d // 16) * (heads * 16) + h * 16 + d % 16] = h * head_dim + d
    return idx


def o_fused_index(group: int, head_dim: int, chunk: int) -> list[int]:
    """``idx[(c * G + h) * chunk + j] = h * (D / chunk) * chunk + c * chunk + j`` (docs/design.md
    §5, O).

    ``chunk`` 32 gives the column order of wo_a, ``chunk`` 1 over ``D / 32``
    entries the order of its scale columns.
    """
    idx = [0] * (group * head_dim)
    for h in range(group):
        for c in range(head_dim // chunk):
            for j in range(chunk):
                idx[(c * group + h) * chunk + j] = h * head_dim + c * chunk + j
    return idx


def expected_params(ckpt: dict[str, torch.Tensor], dims: Dims, rank: int) -> dict:
    """Kernel-visible tensors of ``rank`` built from the checkpoint with docs/design.md's
    formulas."""
    m, p = dims.model, f"layers.{LAYER}.attn."
    w = {k.removeprefix(p): u8(v) for k, v in ckpt.items() if k.startswith(p)}
    D, H, G = m.head_dim, dims.heads, m.heads_per_group
    q_rows = slice(rank * H * D, (rank + 1) * H * D)
    o_rows = slice(rank * dims.o_rows, (rank + 1) * dims.o_rows)
    q_idx = q_fused_index(H, D)
    o_cols = o_fused_index(G, D, BLOCK)
    o_scale_cols = o_fused_index(G, D // BLOCK, 1)
    return {
        "wqkv": torch.cat([w["wq_a.weight"], w["wkv.weight"]]),
        "wqkv_scale": torch.cat([row_codes(w["wq_a.scale"]), row_codes(w["wkv.scale"])]),
        "q_norm": w["q_norm.weight"],
        "kv_norm": w["kv_norm.weight"],
        "wq_b": w["wq_b.weight"][q_rows][q_idx],
        "wq_b_scale": row_codes(w["wq_b.scale"])[q_rows][q_idx],
        "wo_a": w["wo_a.weight"][o_rows][:, o_cols],
        "wo_a_scale": row_codes(w["wo_a.scale"])[o_rows][:, o_scale_cols],
        "wo_b": w["wo_b.weight"][:, o_rows],
        "wo_b_scale": row_codes(w["wo_b.scale"])[:, o_rows.start // BLOCK : o_rows.stop // BLOCK],
        "attn_sink": w["attn_sink"][rank * H : (rank + 1) * H],
    }


@pytest.mark.parametrize("tp,rank", RANKS)
def test_loaded_params_are_the_permuted_checkpoint_slices(ckpt_dir, ckpt, tp, rank):
    dims = Dims.of(MODEL, tp)
    lw = LayerWeights(dims, rank, LAYER)
    load_layer(ckpt_dir, lw)
    got, want = snapshot(lw), expected_params(ckpt, dims, rank)
    for name in PARAMS:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


def test_second_and_shuffled_loads_are_bit_identical(ckpt):
    dims = Dims.of(MODEL, 2)
    lw = LayerWeights(dims, 1, LAYER)
    items = layer_items(ckpt)
    lw.load_weights(items)
    first = snapshot(lw)
    for seed in range(3):  # again, in shuffled orders: permuted exactly once each time
        random.Random(seed).shuffle(items)
        lw.load_weights(items)
        assert_same(snapshot(lw), first)
    fresh = LayerWeights(dims, 1, LAYER)
    fresh.load_weights(reversed(items))
    assert_same(snapshot(fresh), first)


def test_dummy_then_real_load_equals_real_load(ckpt):
    dims = Dims.of(MODEL, 4)
    real = LayerWeights(dims, 2, LAYER)
    real.load_weights(layer_items(ckpt))
    lw = LayerWeights(dims, 2, LAYER)
    lw.dummy_load(seed=3)
    dummy = snapshot(lw)
    assert not torch.equal(dummy["wq_b"], snapshot(real)["wq_b"])
    lw.load_weights(layer_items(ckpt))
    assert_same(snapshot(lw), snapshot(real))
    lw.dummy_load(seed=3)  # the dummy load is deterministic and goes through the loaders too
    assert_same(snapshot(lw), dummy)


def test_e8m0_scales_may_come_as_uint8_codes(ckpt):
    dims = Dims.of(MODEL, 2)
    as_e8m0, as_u8 = LayerWeights(dims, 0, LAYER), LayerWeights(dims, 0, LAYER)
    as_e8m0.load_weights(layer_items(ckpt))
    as_u8.load_weights((k, u8(v) if k.endswith(".scale") else v) for k, v in layer_items(ckpt))
    assert_same(snapshot(as_u8), snapshot(as_e8m0))


# -- the reference step on loaded weights against a standard-layout forward -------------------


def dequant_blocks(w: torch.Tensor, block_codes: torch.Tensor) -> torch.Tensor:
    """``w[n, k] * 2^(code[n // 32, k // 32] - 127)``, fp32, in the checkpoint's layout."""
    n, k = w.shape
    scale = torch.exp2(block_codes.view(torch.uint8).double() - 127)
    return (w.double() * scale[torch.arange(n) // BLOCK][:, torch.arange(k) // BLOCK]).float()


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).bfloat16()


def standard_forward(ckpt: dict[str, torch.Tensor], dims: Dims, rank: int, sc) -> dict:
    """docs/design.md §2 for one rank on the checkpoint's unpermuted tensors, sliced here."""
    m, p = dims.model, f"layers.{LAYER}.attn."
    W = {n: dequant_blocks(ckpt[f"{p}{n}.weight"], ckpt[f"{p}{n}.scale"])
         for n in ("wq_a", "wkv", "wq_b", "wo_a", "wo_b")}
    H, D, tokens = dims.heads, m.head_dim, sc.x.shape[0]
    heads = slice(rank * H, (rank + 1) * H)
    cos, sin = rope_tables(m, LAYER)
    pos = sc.positions

    qkv = (mxfp8_round(sc.x) @ torch.cat([W["wq_a"], W["wkv"]]).T).bfloat16()
    qr = rmsnorm(qkv[:, : m.q_rank], ckpt[p + "q_norm.weight"], m.eps)
    kv = rmsnorm(qkv[:, m.q_rank :], ckpt[p + "kv_norm.weight"], m.eps)
    kv = apply_rope(kv, pos, cos, sin, m.nope_dim)
    sc.window_cache.insert(sc.slot_mapping, kv)

    wq_b = W["wq_b"][heads.start * D : heads.stop * D]
    q = (mxfp8_round(qr) @ wq_b.T).bfloat16().view(tokens, H, D)
    q = apply_rope(q, pos, cos, sin, m.nope_dim)

    keys, valid = gather_keys(sc.key_table, sc.window_cache, sc.compressed_cache)
    s = torch.einsum("mhd,mkd->mhk", q.float(), keys) * m.softmax_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ keys
    sink = ckpt[p + "attn_sink"][heads]
    o = o / (1 + torch.exp(sink - lse))[..., None]
    o = apply_inverse_rope(o, pos, cos, sin, m.nope_dim).bfloat16()

    xo = mxfp8_round(o)  # per 32 along each head's 512
    z = torch.empty(tokens, dims.groups, m.o_rank)
    for g in range(dims.groups):
        gg = rank * dims.groups + g  # global group
        x_g = xo[:, g * m.heads_per_group : (g + 1) * m.heads_per_group].reshape(tokens, -1)
        z[:, g] = x_g @ W["wo_a"][gg * m.o_rank : (gg + 1) * m.o_rank].T
    z = z.bfloat16()
    o_cols = slice(rank * dims.o_rows, (rank + 1) * dims.o_rows)
    y = (mxfp8_round(z.reshape(tokens, -1)) @ W["wo_b"][:, o_cols].T).bfloat16()
    return {"qkv": qkv, "qr": qr, "kv": kv, "q": q, "lse": lse, "o": o, "z": z, "y": y}


@pytest.mark.parametrize("tp,rank", [(2, 1), (4, 2)])
def test_reference_step_on_loaded_weights_matches_standard_forward(ckpt_dir, ckpt, tp, rank):
    dims = Dims.of(MODEL, tp)
    lw = LayerWeights(dims, rank, LAYER)
    load_layer(ckpt_dir, lw)
    sc = make_scenario(dims, LAYER, 5, seed=11)
    ref_sc = sc.clone_caches()
    seams = reference_step(lw, ref_sc)
    want = standard_forward(ckpt, dims, rank, sc.clone_caches())
    for seam in ("qkv", "qr", "kv", "q"):  # before any permuted reduction: exact
        assert torch.equal(getattr(seams, seam), want[seam]), seam
    torch.testing.assert_close(seams.lse, want["lse"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seams.o.float(), want["o"].float(), rtol=1e-2, atol=1e-3)
    # wo_a sums its K in the fused order: equal up to fp32 reordering, then a bf16 ulp
    for seam in ("z", "y"):
        got, exp = getattr(seams, seam).float(), want[seam].float()
        torch.testing.assert_close(got, exp, rtol=2e-2, atol=2e-2 * exp.abs().max().item())
        assert (got - exp).abs().mean() < 1e-2 * exp.abs().mean(), seam


# -- errors -------------------------------------------------------------------------------------


def replaced(tensors: dict[str, torch.Tensor], short: str, tensor: torch.Tensor | None) -> list:
    """The layer's items with ``short`` replaced by ``tensor`` (dropped if None)."""
    name = f"layers.{LAYER}.attn.{short}"
    items = [(k, v) for k, v in layer_items(tensors) if k != name]
    return items if tensor is None else [*items, (name, tensor)]


@pytest.mark.parametrize(
    "short,tensor,message",
    [
        ("wq_b.weight", torch.zeros(16384, 128, dtype=torch.bfloat16),
         ("layers.1.attn.wq_b.weight: expected float8_e4m3fn [16384, 128], "
          "got bfloat16 [16384, 128]")),
        ("wo_a.scale", torch.zeros(8, 64, dtype=torch.uint8).view(torch.float8_e8m0fnu),
         "layers.1.attn.wo_a.scale: expected float8_e8m0fnu [8, 128], got float8_e8m0fnu [8, 64]"),
        ("attn_sink", torch.zeros(32, dtype=torch.bfloat16),
         "layers.1.attn.attn_sink: expected float32 [32], got bfloat16 [32]"),
        ("kv_norm.weight", None,
         "layers.1.attn.kv_norm.weight: expected bfloat16 [512], got nothing (missing)"),
        ("wq_c.weight", torch.zeros(3, 4),
         "layers.1.attn.wq_c.weight: expected no such tensor in layer 1, got float32 [3, 4]"),
    ],
    ids=["mistyped", "misshaped", "mistyped-sink", "missing", "unexpected"],
)
def test_bad_tensor_is_named_and_nothing_is_written(ckpt, short, tensor, message):
    dims = Dims.of(MODEL, 2)
    lw = LayerWeights(dims, 0, LAYER)
    lw.load_weights(layer_items(ckpt))
    before = snapshot(lw)
    # otherwise valid tensors with other values: had any been written, params would change
    other = synth_layer_tensors(dims, LAYER, torch.Generator().manual_seed(99))
    with pytest.raises(WeightLoadError, match=re.escape(message)) as err:
        lw.load_weights(replaced(other, short, tensor))
    assert str(err.value).endswith("nothing was loaded")
    assert_same(snapshot(lw), before)


def test_tensor_of_another_layer_is_unexpected(ckpt):
    lw = LayerWeights(Dims.of(MODEL, 1), 0, LAYER)
    name = "layers.0.attn.wq_a.weight"
    message = f"{name}: expected no such tensor in layer 1"
    with pytest.raises(WeightLoadError, match=re.escape(message)):
        lw.load_weights([*layer_items(ckpt), *layer_items({name: ckpt[name]}, 0)])


def test_every_problem_of_a_batch_is_reported(ckpt):
    lw = LayerWeights(Dims.of(MODEL, 1), 0, LAYER)
    items = replaced(ckpt, "wkv.scale", None)
    items = [(k, v.bfloat16() if k.endswith("attn_sink") else v[:-1] if "q_norm" in k else v)
             for k, v in items]
    with pytest.raises(WeightLoadError) as err:
        lw.load_weights(items)
    lines = str(err.value).splitlines()
    assert lines[-1] == "nothing was loaded"
    assert sorted(lines[:-1]) == [
        "layers.1.attn.attn_sink: expected float32 [32], got bfloat16 [32]",
        "layers.1.attn.q_norm.weight: expected bfloat16 [128], got bfloat16 [127]",
        "layers.1.attn.wkv.scale: expected float8_e8m0fnu [16, 8], got nothing (missing)",
    ]


def test_partial_batch_only_with_require_all_false(ckpt):
    lw = LayerWeights(Dims.of(MODEL, 2), 1, LAYER)
    sink = [(k, v) for k, v in layer_items(ckpt) if k.endswith("attn_sink")]
    with pytest.raises(WeightLoadError, match="got nothing"):
        lw.load_weights(sink)
    assert lw.load_weights(sink, require_all=False) == {f"layers.{LAYER}.attn.attn_sink"}
    assert torch.equal(lw.attn_sink.data, sink[0][1][16:])
    assert not lw.wq_b.data.view(torch.uint8).any()  # untouched


def test_failing_loader_says_what_was_written(ckpt):
    lw = LayerWeights(Dims.of(MODEL, 2), 0, LAYER)

    def broken(param, loaded):
        raise RuntimeError("device lost")

    lw.wo_b.weight_loader = broken
    message = ("wo_b.weight: expected its weight_loader to succeed, got RuntimeError: device lost; "
               "parameters written before it: [")
    with pytest.raises(WeightLoadError, match=re.escape(message)) as err:
        lw.load_weights(layer_items(ckpt))
    assert "half-written" in str(err.value)


def test_direct_loader_call_refuses_a_wrong_dtype(ckpt):
    lw = LayerWeights(Dims.of(MODEL, 2), 1, LAYER)
    wq_b = ckpt[f"layers.{LAYER}.attn.wq_b.weight"]
    message = ("wq_b: expected a shard of float8_e4m3fn [8192, 128], got bfloat16 [8192, 128] "
               "from bfloat16 [16384, 128]")
    with pytest.raises(WeightLoadError, match=re.escape(message)):
        lw.wq_b.weight_loader(lw.wq_b, wq_b.bfloat16())
    with pytest.raises(WeightLoadError, match=re.escape("wqkv[wkv]: expected a shard of")):
        lw.wqkv.weight_loader(lw.wqkv, wq_b, "wkv")
    assert not lw.wq_b.data.view(torch.uint8).any() and not lw.wqkv.data.view(torch.uint8).any()


def test_layer_id_out_of_range():
    with pytest.raises(ValueError, match=re.escape(
            "layer_id: expected 0 <= layer_id < 3, got 3 (3 layers, then 0 MTP)")):
        LayerWeights(Dims.of(MODEL, 1), 0, 3)


def test_checkpoint_shapes_at_dsv41_flash():
    shapes = checkpoint_shapes(Dims.of("dsv41-flash", 4))
    E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
    assert shapes["wq_a.weight"] == ((1280, 5120), E4M3)
    assert shapes["wkv.scale"] == ((16, 160), E8M0)
    assert shapes["wq_b.weight"] == ((32768, 1280), E4M3)
    assert shapes["wo_a.weight"] == ((8192, 4096), E4M3)
    assert shapes["wo_b.scale"] == ((160, 256), E8M0)
    assert shapes["attn_sink"] == ((64,), torch.float32)
    assert len(shapes) == 13
