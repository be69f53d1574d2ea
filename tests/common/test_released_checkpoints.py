"""Released model directories (docs/checkpoints.md): config.json flat or under text_config,
scale blocks of any size, MTP layers, the compressor's and indexer's tensors skipped.

The public values are written out here by hand from the released configs, and scale
expansion is checked against an element-by-element index formula, not the loaders' code.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsv41 import cli
from dsv41.common.checkpoint import (
    INDEX_FILE,
    inspect_checkpoint,
    iter_checkpoint,
    load_layer,
    synth_checkpoint,
)
from dsv41.common.geometry import Dims
from dsv41.common.mx import (
    MX_BLOCK,
    block_to_row_scales,
    dequantize_weight,
    e8m0_code,
    quantize_weight_blocks,
)
from dsv41.common.weights import E8M0, LayerWeights, WeightLoadError, checkpoint_shapes
from dsv41.config import ConfigError, load_model_config, parse_hf_config, read_hf_config

YARN = {"factor": 16, "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 65536}
V41_RATIOS = [0, 0] + [2] * 18 + [1] * 20 + [0] * 3
V4_RATIOS = [0, 0] + [4, 128] * 20 + [4] + [0]  # 43 layers, then the MTP layer


def public_v41() -> dict:
    """V4.1-Flash's config.json as published: the model under text_config."""
    return {
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                                "expert_dtype": "fp4"},
        "text_config": {
            "model_type": "deepseek_v41_text", "hidden_size": 5120, "num_hidden_layers": 40,
            "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
            "qk_rope_head_dim": 64, "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8,
            "rms_norm_eps": 1e-20, "max_position_embeddings": 1048576, "rope_theta": 10000,
            "compress_rope_theta": 160000, "rope_scaling": {"rope_type": "yarn", **YARN},
            "sliding_window": 128, "index_topk": 512, "num_nextn_predict_layers": 3,
            "compress_ratios": V41_RATIOS, "kv_source_layer_ids": [2, 8, 14, 20],
            "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
        },
    }


def public_v4() -> dict:
    """V4-Flash's config.json: flat."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 4096, "q_lora_rank": 1024,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
        "qk_rope_head_dim": 64, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
        "index_topk": 512, "num_hidden_layers": 43, "num_nextn_predict_layers": 1,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", **YARN}, "max_position_embeddings": 1048576,
        "compress_ratios": V4_RATIOS,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    }


# -- config.json -------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, bundled", [(public_v41, "dsv41-flash"), (public_v4, "dsv4-flash")])
def test_public_config_json_maps_to_the_bundled_config(raw, bundled):
    got, unmapped = parse_hf_config(raw(), "dl")
    want = load_model_config(bundled)
    assert got == dataclasses.replace(want, name="dl", max_position=1048576)
    assert got.total_layers == len(got.compress_ratios) == want.num_layers + want.mtp_layers
    nested = bundled == "dsv41-flash"
    assert ("text_config.kv_source_layer_ids" in unmapped) == nested
    assert "architectures" in unmapped and "text_config.hidden_size" not in unmapped


def test_layer_kinds_and_prefixes_from_the_config():
    m, _ = parse_hf_config(public_v4())
    assert [m.rope_for_layer(i).theta for i in (0, 1, 2, 42, 43)] == [1e4, 1e4, 1.6e5, 1.6e5, 1e4]
    assert m.rope_for_layer(0).yarn is None and m.rope_for_layer(3).yarn.factor == 16.0
    assert m.keys == 512 + 128 and m.eps == 1e-6 and m.weight_block == (128, 128)
    assert [m.checkpoint_prefix(i) for i in (0, 42, 43)] == ["layers.0.attn.", "layers.42.attn.",
                                                             "mtp.0.attn."]
    with pytest.raises(ValueError, match=re.escape("layer_id: expected 0 <= layer_id < 44, got 44")):
        m.checkpoint_prefix(44)
    # Ratios for the main layers only: the MTP layers are window-only.
    raw = public_v4()
    raw["compress_ratios"] = V4_RATIOS[:43]
    assert parse_hf_config(raw)[0].compress_ratios == tuple(V4_RATIOS)
    del raw["num_nextn_predict_layers"]  # no MTP layers
    assert parse_hf_config(raw)[0].total_layers == 43


def _edit(path: list, value):
    def edit(raw):
        d = raw
        for k in path[:-1]:
            d = d[k]
        if value is KeyError:
            del d[path[-1]]
        else:
            d[path[-1]] = value
        return raw

    return edit


@pytest.mark.parametrize(
    "raw, edit, message",
    [
        (public_v41, _edit(["text_config", "index_topk"], KeyError), "text_config.index_topk: missing"),
        (public_v4, _edit(["num_key_value_heads"], 8), "num_key_value_heads: expected 1"),
        (public_v41, _edit(["quantization_config", "scale_fmt"], "fp32"),
         "quantization_config.scale_fmt: expected 'ue8m0', got 'fp32'"),
        (public_v4, _edit(["quantization_config", "weight_block_size"], [128, 48]),
         "quantization_config.weight_block_size: expected [rows, cols]"),
        (public_v4, _edit(["rope_scaling", "type"], "linear"), "rope_scaling.rope_type: expected 'yarn'"),
        (public_v41, _edit(["text_config", "compress_ratios", 5], 3),
         "text_config.compress_ratios[5]: expected one of"),
        (public_v4, _edit(["hidden_size"], 4100), "hidden_size: expected a multiple of 32, got 4100 (dsv41's hidden)"),
        (public_v4, _edit(["quantization_config"], KeyError), "quantization_config: missing"),
    ],
)
def test_a_bad_config_json_names_its_field(raw, edit, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_hf_config(edit(raw()))


def test_config_json_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'config.json'}: expected a model's")):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'config.json'}: expected JSON")):
        load_model_config(tmp_path)
    raw = public_v4()
    del raw["sliding_window"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'config.json'}: sliding_window: missing")):
        load_model_config(str(tmp_path))


# -- shapes and scale blocks -------------------------------------------------------------------

V4_PUBLIC_SHAPES = {  # name: (weight, scale) of one V4-Flash layer
    "wq_a": ([1024, 4096], [8, 32]), "wkv": ([512, 4096], [4, 32]),
    "wq_b": ([32768, 1024], [256, 8]), "wo_a": ([8192, 4096], [64, 32]),
    "wo_b": ([4096, 8192], [32, 64]),
}


def test_v4_flash_shapes_are_the_public_ones():
    shapes = checkpoint_shapes(load_model_config("dsv4-flash"))
    for name, (w, s) in V4_PUBLIC_SHAPES.items():
        assert shapes[f"{name}.weight"] == (tuple(w), torch.float8_e4m3fn)
        assert shapes[f"{name}.scale"] == (tuple(s), E8M0)
    assert shapes["q_norm.weight"] == ((1024,), torch.bfloat16)
    assert shapes["kv_norm.weight"] == ((512,), torch.bfloat16)
    assert shapes["attn_sink"] == ((64,), torch.float32)


def expand_by_index(codes: torch.Tensor, block, n: int, k: int) -> torch.Tensor:
    """Per-row codes [n, k/32] by the formula code[r // bn, (32 c) // bk]."""
    r = torch.arange(n)[:, None] // block[0]
    c = (torch.arange(k // MX_BLOCK)[None, :] * MX_BLOCK) // block[1]
    return codes[r, c]


@pytest.mark.parametrize("block", [(32, 32), (128, 128), (48, 64), (1, 96)])
def test_any_block_quantizes_and_expands_by_the_formula(block):
    gen = torch.Generator().manual_seed(11)
    n, k = 100, 288  # neither a multiple of every block: partial last blocks
    w = torch.randn(n, k, generator=gen) * torch.exp2(torch.randint(-6, 6, (n, 1), generator=gen))
    values, codes = quantize_weight_blocks(w, block)
    bn, bk = block
    assert codes.shape == (-(-n // bn), -(-k // bk))
    for i in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            amax = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].abs().max()
            assert codes[i, j] == e8m0_code(amax)
    rows = block_to_row_scales(codes, block, (n, k))
    assert torch.equal(rows, expand_by_index(codes, block, n, k))
    back = dequantize_weight(values, rows).double()
    scale = torch.exp2(rows.double() - 127).repeat_interleave(MX_BLOCK, dim=1)
    assert ((back - w.double()).abs() <= torch.maximum(w.abs().double() * 2.0**-4, scale * 2.0**-10)).all()


# -- tiny directories in both released layouts -------------------------------------------------

TINY = "tiny-v4"  # 64 heads in 8 groups: tp 1, 2, 4, 8


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for like in ("dsv41-flash", "dsv4-flash"):
        d = tmp_path_factory.mktemp(like)
        synth_checkpoint(TINY, 3, d, shards=3, seed=4, mtp=1, like=like, others=True)
        out[like] = d
    return out


def read_all(d: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(d.glob("model-*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_each_layout_reads_back_its_own_config(dirs):
    v41 = json.loads((dirs["dsv41-flash"] / "config.json").read_text())
    v4 = json.loads((dirs["dsv4-flash"] / "config.json").read_text())
    assert "text_config" in v41 and "text_config" not in v4
    assert v41["quantization_config"]["weight_block_size"] == [32, 32]
    assert v4["quantization_config"]["weight_block_size"] == [128, 128]
    want = load_model_config(TINY)
    for like, block in (("dsv41-flash", (32, 32)), ("dsv4-flash", (128, 128))):
        m, _ = read_hf_config(dirs[like])
        assert m == dataclasses.replace(want, name=dirs[like].name, weight_block=block, window_block=32)
        rows = inspect_checkpoint(dirs[like])  # against its own config.json
        names = {r.name for r in rows}
        assert "mtp.0.attn.wq_b.scale" in names and "layers.1.attn.indexer.wq_b.weight" in names
        wq_b = next(r for r in rows if r.name == "layers.2.attn.wq_b.scale")
        assert wq_b.shape == str([32768 // block[0], 128 // block[1]])


def as_32x32(tensors: dict[str, torch.Tensor], block) -> dict[str, torch.Tensor]:
    """The same weights with every block code repeated onto its 32 x 32 sub-blocks."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".scale"):
            n, k = tensors[name.removesuffix("scale") + "weight"].shape
            sub = expand_by_index(t.view(torch.uint8), block, n, k)[::MX_BLOCK]
            out[name] = sub.contiguous().view(E8M0)
        else:
            out[name] = t
    return out


def u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_128_blocks_load_bit_identical_to_their_32x32_copy(dirs, tp):
    ckpt = read_all(dirs["dsv4-flash"])
    m128 = read_hf_config(dirs["dsv4-flash"])[0]
    m32 = dataclasses.replace(m128, weight_block=(32, 32))
    for layer_id, prefix in ((1, "layers.1.attn."), (3, "mtp.0.attn.")):
        mine = {k: v for k, v in ckpt.items() if k.startswith(prefix)}
        small = as_32x32({k: v for k, v in mine.items() if "compressor" not in k and "indexer" not in k},
                         m128.weight_block)
        assert small[prefix + "wo_b.scale"].shape == (256 // 32, 512 // 32)
        for rank in range(tp):
            a = LayerWeights(Dims(tp, m128), rank, layer_id)
            b = LayerWeights(Dims(tp, m32), rank, layer_id)
            load_layer(dirs["dsv4-flash"], a)
            b.load_weights(small.items())
            for name, p in a.named_parameters():
                assert torch.equal(u8(p.data), u8(dict(b.named_parameters())[name].data)), (tp, rank, name)
            # wo_b's columns are not permuted: its rank slice against the formula, blocks straddling ranks.
            cols = slice(a.groups.start * m128.o_rank, a.groups.stop * m128.o_rank)
            w = mine[prefix + "wo_b.weight"]
            codes = expand_by_index(mine[prefix + "wo_b.scale"].view(torch.uint8), (128, 128), *w.shape)
            want = dequantize_weight(w, codes)[:, cols]
            assert torch.equal(dequantize_weight(a.wo_b.data, a.wo_b_scale.data), want)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_32x32_nested_layout_loads_at_every_tp(dirs, tp):
    d = dirs["dsv41-flash"]
    m = read_hf_config(d)[0]
    ckpt = read_all(d)
    for rank in range(tp):
        lw = LayerWeights(Dims(tp, m), rank, 2)
        load_layer(d, lw)
        n_q = m.q_rank
        w = ckpt["layers.2.attn.wq_a.weight"]
        codes = expand_by_index(ckpt["layers.2.attn.wq_a.scale"].view(torch.uint8), (32, 32), *w.shape)
        assert torch.equal(dequantize_weight(lw.wqkv.data[:n_q], lw.wqkv_scale.data[:n_q]),
                           dequantize_weight(w, codes))
        heads = lw.heads
        assert torch.equal(lw.attn_sink.data, ckpt["layers.2.attn.attn_sink"][heads.start:heads.stop])


def test_compressor_and_indexer_are_skipped_and_named(dirs):
    d = dirs["dsv4-flash"]
    m = read_hf_config(d)[0]
    lw = LayerWeights(Dims(4, m), 1, 1)  # ratio 4: compressor and indexer
    loaded = load_layer(d, lw)
    assert loaded == {f"layers.1.attn.{s}" for s in checkpoint_shapes(m)}
    ckpt = read_all(d)
    not_ours = sorted(k for k in ckpt if k.startswith(("layers.1.attn.compressor.", "layers.1.attn.indexer.")))
    assert lw.last_skipped == not_ours and any("indexer" in k for k in not_ours)
    lw2 = LayerWeights(Dims(4, m), 1, 2)  # ratio 128: compressor only
    load_layer(d, lw2)
    assert lw2.last_skipped and all(".compressor." in k for k in lw2.last_skipped)
    # Any other unknown name under the layer's prefix is still refused, and nothing is written.
    batch = [(k, v) for k, v in ckpt.items() if k.startswith("layers.2.attn.")]
    fresh = LayerWeights(Dims(4, m), 1, 2)
    with pytest.raises(WeightLoadError, match=re.escape(
            "layers.2.attn.rotary.weight: expected no such tensor in layer 2, got float32 [4]")):
        fresh.load_weights(batch + [("layers.2.attn.rotary.weight", torch.ones(4))])
    assert not any(u8(p.data).any() for p in fresh.parameters())


def test_mtp_layer_loads_from_its_own_names(dirs):
    d = dirs["dsv4-flash"]
    m = read_hf_config(d)[0]
    got = dict(iter_checkpoint(d, "mtp.0.attn."))
    assert set(got) == {f"mtp.0.attn.{s}" for s in checkpoint_shapes(m)}
    lw = LayerWeights(Dims(2, m), 0, m.num_layers)
    assert load_layer(d, lw) == set(got)
    heads = lw.heads
    assert torch.equal(lw.attn_sink.data, got["mtp.0.attn.attn_sink"][heads.start:heads.stop])
    with pytest.raises(ValueError, match="layer_id: expected 0 <= layer_id < 4, got 4"):
        LayerWeights(Dims(2, m), 0, m.num_layers + 1)


def test_inspect_refuses_an_mtp_layer_the_config_lacks(dirs, tmp_path):
    import shutil

    d = Path(shutil.copytree(dirs["dsv4-flash"], tmp_path / "copy"))
    index = json.loads((d / INDEX_FILE).read_text())
    file = index["weight_map"]["mtp.0.attn.attn_sink"]
    tensors = load_file(d / file)
    tensors["mtp.1.attn.attn_sink"] = torch.zeros(64)
    save_file(tensors, str(d / file))
    index["weight_map"]["mtp.1.attn.attn_sink"] = file
    (d / INDEX_FILE).write_text(json.dumps(index))
    message = "mtp.1.attn.attn_sink: expected an MTP layer below mtp_layers = 1 of 'copy', got mtp.1"
    with pytest.raises(WeightLoadError, match=re.escape(message)):
        inspect_checkpoint(d)


# -- the command line --------------------------------------------------------------------------


def test_cli_synth_like_then_inspect(tmp_path, capsys):
    out = tmp_path / "v41"
    assert cli.main(["checkpoint", "synth", "--like", "dsv41-flash", "--config", "tiny", "--layers", "2",
                     "--mtp", "0", "--others", "--out", str(out)]) == 0
    assert cli.main(["checkpoint", "inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model from config.json: 3 layers + 0 MTP, hidden 256, scale blocks 32 x 32" in text
    assert ("fields not mapped (not the attention step's): architectures, model_type, text_config.model_type, "
            "text_config.torch_dtype") in text
    assert cli.main(["checkpoint", "synth", "--like", "dsv4-flash", "--layers", "1", "--mtp", "2",
                     "--out", str(tmp_path / "x")]) == 2
    assert "mtp: expected 0 <= mtp <= mtp_layers = 1, got 2" in capsys.readouterr().err


def test_cli_parity_on_a_model_directory(dirs, capsys):
    assert cli.main(["parity", "--checkpoint", str(dirs["dsv4-flash"]), "--tp", "8", "--layer", "1",
                     "--tokens", "1", "--backends", "nvidia"]) == 0
    text = capsys.readouterr().out
    assert f"parity: {dirs['dsv4-flash'].name}, tp 8 rank 0, layer 1" in text
    assert "4 compressor/indexer tensors skipped" in text and "parity ok" in text


@pytest.mark.slow
def test_cli_parity_on_a_model_directory_every_backend(dirs, capsys):
    assert cli.main(["parity", "--checkpoint", str(dirs["dsv4-flash"]), "--tp", "4", "--layer", "2",
                     "--tokens", "2"]) == 0
    text = capsys.readouterr().out
    assert "mono vs nvidia" in text and "parity ok" in text
    assert cli.main(["parity", "--checkpoint", str(dirs["dsv41-flash"]), "--tp", "2", "--layer", "3",
                     "--tokens", "2"]) == 0  # the MTP layer
    assert "parity ok" in capsys.readouterr().out


@pytest.mark.parametrize("like", ["dsv41-flash", "dsv4-flash"])
def test_real_shapes_one_layer_headers(tmp_path, like):
    synth_checkpoint(like, 1, tmp_path, shards=2, like=like)
    m = read_hf_config(tmp_path)[0]
    assert m == dataclasses.replace(load_model_config(like), name=tmp_path.name)
    rows = {r.name: (r.dtype, r.shape) for r in inspect_checkpoint(tmp_path)}
    if like == "dsv4-flash":
        for name, (w, s) in V4_PUBLIC_SHAPES.items():
            assert rows[f"layers.0.attn.{name}.weight"] == ("float8_e4m3fn", str(w))
            assert rows[f"layers.0.attn.{name}.scale"] == ("float8_e8m0fnu", str(s))
    else:
        assert rows["layers.0.attn.wq_b.weight"] == ("float8_e4m3fn", "[32768, 1280]")
        assert rows["layers.0.attn.wq_b.scale"] == ("float8_e8m0fnu", "[1024, 40]")
    assert rows["layers.0.attn.attn_sink"] == ("float32", "[64]")


def test_the_server_module_takes_a_model_directory(dirs):
    from dsv41.layer import DSV41Attention

    d = dirs["dsv4-flash"]
    attn = DSV41Attention(str(d), tp=2, rank=1, layer_id=3, backend="reference")  # mtp.0
    assert attn.dims.model.weight_block == (128, 128) and attn.weights.prefix == "mtp.0.attn."
    loaded = attn.load_weights(iter_checkpoint(d, "mtp.0.attn."))
    sink = dict(iter_checkpoint(d, "mtp.0.attn."))["mtp.0.attn.attn_sink"]
    assert len(loaded) == 13 and torch.equal(attn.weights.attn_sink.data, sink[32:])
