"""Synthetic checkpoints on disk: files, index, dtypes; lazy iteration; inspect and its errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dsv41.common.checkpoint import (
    INDEX_FILE,
    format_table,
    inspect_checkpoint,
    iter_checkpoint,
    load_layer,
    synth_checkpoint,
)
from dsv41.common.geometry import Dims
from dsv41.common.weights import LayerWeights, WeightLoadError, checkpoint_shapes

MODEL = "tiny"
LAYERS = 3
SHARDS = 4
SHORT_NAMES = sorted(checkpoint_shapes(Dims.of(MODEL, 1)))
FILE_DTYPES = {"weight": "F8_E4M3", "scale": "F8_E8M0", "q_norm": "BF16", "kv_norm": "BF16",
               "attn_sink": "F32"}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt")
    synth_checkpoint(MODEL, LAYERS, out, shards=SHARDS, seed=1)
    return out


@pytest.fixture
def copy_dir(ckpt_dir, tmp_path) -> Path:
    """A private copy to corrupt."""
    return Path(shutil.copytree(ckpt_dir, tmp_path / "copy"))


def all_names() -> list[str]:
    return [f"layers.{i}.attn.{s}" for i in range(LAYERS) for s in SHORT_NAMES]


def test_files_index_names_and_dtypes(ckpt_dir):
    index = json.loads((ckpt_dir / INDEX_FILE).read_text())
    files = [f"model-{k:05d}-of-{SHARDS:05d}.safetensors" for k in range(1, SHARDS + 1)]
    assert sorted(index["weight_map"]) == sorted(all_names())
    assert sorted(set(index["weight_map"].values())) == files
    assert index["metadata"]["dsv41_model"] == MODEL
    total = 0
    for file in files:
        with safe_open(str(ckpt_dir / file), framework="pt") as f:
            held = set(f.keys())
            assert held == {n for n, v in index["weight_map"].items() if v == file}
            for name in held:
                view = f.get_slice(name)
                kind = name.rsplit(".", 1)[-1]
                kind = name.split(".")[3] if kind == "weight" and "norm" in name else kind
                assert view.get_dtype() == FILE_DTYPES[kind], name
                total += f.get_tensor(name).nbytes
    assert index["metadata"]["total_size"] == total


def test_layer_tensors_depend_only_on_seed_and_layer(ckpt_dir, tmp_path):
    synth_checkpoint(MODEL, 2, tmp_path / "a", shards=1, seed=1)
    synth_checkpoint(MODEL, 2, tmp_path / "b", shards=2, seed=2)
    one_file = load_file(tmp_path / "a" / "model-00001-of-00001.safetensors")
    sharded = dict(iter_checkpoint(ckpt_dir))
    other_seed = dict(iter_checkpoint(tmp_path / "b"))
    for name, t in one_file.items():
        assert torch.equal(t.view(torch.uint8), sharded[name].view(torch.uint8)), name
    sink = "layers.1.attn.attn_sink"
    assert not torch.equal(one_file[sink], other_seed[sink])


def test_iter_checkpoint_one_layer(ckpt_dir):
    got = dict(iter_checkpoint(ckpt_dir, "layers.2.attn."))
    assert sorted(got) == [f"layers.2.attn.{s}" for s in SHORT_NAMES]
    for file in ckpt_dir.glob("model-*.safetensors"):
        for name, t in load_file(file).items():
            if name in got:
                assert t.dtype == got[name].dtype and torch.equal(t.view(torch.uint8),
                                                                  got[name].view(torch.uint8))


def test_synth_then_inspect_round_trip(ckpt_dir):
    rows = inspect_checkpoint(ckpt_dir)  # model from the index metadata
    assert rows == inspect_checkpoint(ckpt_dir, MODEL)
    index = json.loads((ckpt_dir / INDEX_FILE).read_text())["weight_map"]
    shapes = checkpoint_shapes(Dims.of(MODEL, 1))
    assert [r.name for r in rows] == sorted(all_names())
    for row in rows:
        shape, dtype = shapes[row.name.split(".attn.")[1]]
        assert (row.dtype, row.shape, row.file) == (
            str(dtype).removeprefix("torch."), str(list(shape)), index[row.name])
    table = format_table(rows).splitlines()
    assert len(table) == len(rows) + 1 and table[0].split() == ["name", "dtype", "shape", "file"]
    column = table[0].index("file")
    assert all(line[column:].startswith("model-") for line in table[1:])


def test_load_layer_equals_load_weights_of_the_files(ckpt_dir):
    dims = Dims.of(MODEL, 2)
    from_dir, from_files = LayerWeights(dims, 1, 2), LayerWeights(dims, 1, 2)
    assert load_layer(ckpt_dir, from_dir) == {f"layers.2.attn.{s}" for s in SHORT_NAMES}
    tensors: dict[str, torch.Tensor] = {}
    for file in ckpt_dir.glob("model-*.safetensors"):
        tensors.update(load_file(file))
    from_files.load_weights((k, v) for k, v in tensors.items() if k.startswith("layers.2."))
    for name, p in from_dir.named_parameters():
        other = dict(from_files.named_parameters())[name]
        assert torch.equal(p.data.view(torch.uint8) if p.element_size() == 1 else p.data,
                           other.data.view(torch.uint8) if p.element_size() == 1 else other.data)


# -- corrupted checkpoints ---------------------------------------------------------------------


def rewrite(ckpt_dir: Path, name: str, tensor: torch.Tensor | None) -> None:
    """Replace (None: remove) one tensor in its file and in the index."""
    index_path = ckpt_dir / INDEX_FILE
    index = json.loads(index_path.read_text())
    file = index["weight_map"].get(name, "model-00001-of-00004.safetensors")
    tensors = load_file(ckpt_dir / file)
    if tensor is None:
        del tensors[name], index["weight_map"][name]
    else:
        tensors[name] = tensor
        index["weight_map"][name] = file
    save_file(tensors, str(ckpt_dir / file))
    index_path.write_text(json.dumps(index))


@pytest.mark.parametrize(
    "name,tensor,message",
    [
        ("layers.1.attn.wq_b.weight", torch.zeros(16384, 128, dtype=torch.bfloat16),
         ("layers.1.attn.wq_b.weight: expected float8_e4m3fn [16384, 128], "
          "got bfloat16 [16384, 128]")),
        ("layers.0.attn.wkv.scale", torch.zeros(16, 8),
         "layers.0.attn.wkv.scale: expected float8_e8m0fnu [16, 8], got float32 [16, 8]"),
        ("layers.2.attn.wo_b.weight", torch.zeros(256, 128, dtype=torch.float8_e4m3fn),
         ("layers.2.attn.wo_b.weight: expected float8_e4m3fn [256, 256], "
          "got float8_e4m3fn [256, 128]")),
        ("layers.2.attn.q_norm.weight", None,
         "layers.2.attn.q_norm.weight: expected bfloat16 [128], got nothing (missing)"),
        ("layers.0.attn.wq_c.weight", torch.zeros(2, 2),
         "layers.0.attn.wq_c.weight: expected no such tensor in layer 0, got float32 [2, 2]"),
        ("layers.7.attn.attn_sink", torch.zeros(32),
         "layers.7.attn.attn_sink: expected a layer below num_layers = 3 of 'tiny', got layer 7"),
    ],
    ids=["retyped", "scale-as-float", "reshaped", "removed", "unexpected", "layer-out-of-range"],
)
def test_inspect_and_load_flag_a_corrupted_checkpoint(copy_dir, name, tensor, message):
    rewrite(copy_dir, name, tensor)
    with pytest.raises(WeightLoadError, match=re.escape(message)) as err:
        inspect_checkpoint(copy_dir)
    assert str(err.value) == message  # the one problem, nothing else
    layer = int(name.split(".")[1])
    if layer < LAYERS:  # loading that layer fails too, and writes nothing
        lw = LayerWeights(Dims.of(MODEL, 2), 0, layer)
        lw.dummy_load(seed=5)
        before = lw.wq_b.data.clone()
        with pytest.raises(WeightLoadError, match=re.escape(message)):
            load_layer(copy_dir, lw)
        assert torch.equal(lw.wq_b.data.view(torch.uint8), before.view(torch.uint8))


def test_index_naming_a_tensor_its_file_lacks(copy_dir):
    index_path = copy_dir / INDEX_FILE
    index = json.loads(index_path.read_text())
    name = "layers.1.attn.wo_a.weight"
    files = sorted(set(index["weight_map"].values()))
    wrong = next(f for f in files if f != index["weight_map"][name])
    index["weight_map"][name] = wrong
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightLoadError, match=re.escape(f"{name}: expected in {wrong} (index)")):
        inspect_checkpoint(copy_dir)
    with pytest.raises(WeightLoadError, match=re.escape(f"{name}: expected in {wrong} (index)")):
        list(iter_checkpoint(copy_dir, "layers.1.attn."))


def test_single_file_checkpoint_without_index(ckpt_dir, tmp_path):
    tensors = dict(iter_checkpoint(ckpt_dir, "layers.0.attn."))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    rows = inspect_checkpoint(tmp_path, MODEL)
    assert [r.name for r in rows] == sorted(tensors)
    assert {r.file for r in rows} == {"model.safetensors"}
    with pytest.raises(WeightLoadError, match="model: expected a config name"):
        inspect_checkpoint(tmp_path)


def test_not_a_checkpoint(tmp_path):
    message = f"expected {INDEX_FILE} or model.safetensors, got neither"
    with pytest.raises(WeightLoadError, match=re.escape(message)):
        inspect_checkpoint(tmp_path, MODEL)


@pytest.mark.parametrize(
    "layers,shards,message",
    [(0, 1, "layers: expected 1 <= layers <= num_layers = 3, got 0"),
     (4, 1, "layers: expected 1 <= layers <= num_layers = 3, got 4"),
     (1, 14, "shards: expected 1 <= shards <= 13 tensors, got 14")],
)
def test_synth_arguments(tmp_path, layers, shards, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        synth_checkpoint(MODEL, layers, tmp_path, shards=shards)


def test_as_many_shards_as_tensors_leaves_none_empty(tmp_path):
    synth_checkpoint(MODEL, 1, tmp_path, shards=13)
    for file in tmp_path.glob("model-*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            assert len(f.keys()) == 1
    assert len(inspect_checkpoint(tmp_path)) == 13
