"""Checkpoints on disk: sharded safetensors files with an HF-style index (docs/design.md §3).

A checkpoint directory holds ``model-0000k-of-0000n.safetensors`` files and
``model.safetensors.index.json`` (``{"metadata": {...}, "weight_map": {name:
file}}``), as Hugging Face writes them; a single ``model.safetensors`` without
an index is read too. Tensors keep the public names and dtypes: ``layers.{i}.attn.
<name>.weight`` F8_E4M3 with ``.scale`` F8_E8M0 on 32x32 blocks, ``q_norm`` /
``kv_norm`` BF16, ``attn_sink`` F32. Reading is lazy: ``iter_checkpoint`` opens one
file at a time through the index and reads only the tensors asked for, and
``inspect_checkpoint`` reads headers only. The index's metadata records the
model config name (``dsv41_model``) so ``inspect`` can default to it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dsv41.common.weights import (
    LayerWeights,
    WeightLoadError,
    layer_tensor_specs,
    synth_layer_tensors,
    tensor_problems,
)
from dsv41.config import ModelConfig, load_model_config

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MODEL_KEY = "dsv41_model"  # index metadata: the model config the checkpoint was made for
LAYER_NAME = re.compile(r"^layers\.(\d+)\.attn\.")
SAFETENSORS_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}


class TensorRow(NamedTuple):
    """One line of ``inspect``'s table."""

    name: str
    dtype: str
    shape: str
    file: str


def shard_file_name(k: int, n: int) -> str:
    """``model-{k:05d}-of-{n:05d}.safetensors``, k counted from 1."""
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def _model(model: str | ModelConfig) -> ModelConfig:
    return model if isinstance(model, ModelConfig) else load_model_config(model)


def _shard_of_each(sizes: Sequence[int], shards: int) -> list[int]:
    """Contiguous, byte-balanced shard index of each tensor; no shard left empty."""
    total, start, out = sum(sizes), 0, []
    for i, size in enumerate(sizes):
        prev = out[-1] if out else 0
        lowest = max(prev, shards - (len(sizes) - i))  # enough tensors left for later shards
        out.append(min(max(start * shards // total, lowest), prev + 1 if out else 0))
        start += size
    return out


def synth_checkpoint(
    model_name_or_cfg: str | ModelConfig,
    layers: int,
    out_dir: str | Path,
    *,
    shards: int = 4,
    seed: int = 0,
) -> Path:
    """Write random layers ``0 .. layers-1`` in ``shards`` safetensors files; the index path.

    Layer ``i`` draws from its own generator (seeded from ``seed`` and ``i``),
    so its tensors do not depend on ``layers`` or ``shards``. One or two layers
    are held in memory at a time.
    """
    m = _model(model_name_or_cfg)
    if not 1 <= layers <= m.num_layers:
        raise ValueError(
            f"layers: expected 1 <= layers <= num_layers = {m.num_layers}, got {layers}"
        )
    specs = {i: layer_tensor_specs(m, i) for i in range(layers)}
    names = [(i, name) for i in range(layers) for name in specs[i]]
    if not 1 <= shards <= len(names):
        raise ValueError(f"shards: expected 1 <= shards <= {len(names)} tensors, got {shards}")
    sizes = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in
             (specs[i][name] for i, name in names)]
    owner = _shard_of_each(sizes, shards)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    cached: tuple[int, dict[str, torch.Tensor]] = (-1, {})
    for k in range(shards):
        file = shard_file_name(k + 1, shards)
        tensors = {}
        for (i, name), s in zip(names, owner, strict=True):
            if s != k:
                continue
            if cached[0] != i:
                gen = torch.Generator().manual_seed(seed * m.num_layers + i)
                cached = (i, synth_layer_tensors(m, i, gen))
            tensors[name] = cached[1][name]
            weight_map[name] = file
        save_file(tensors, str(out / file), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": sum(sizes), MODEL_KEY: m.name},
        "weight_map": dict(sorted(weight_map.items())),
    }
    path = out / INDEX_FILE
    path.write_text(json.dumps(index, indent=2) + "\n")
    return path


def _read_index(ckpt_dir: Path) -> tuple[dict[str, str], dict]:
    """``(weight_map name -> file, metadata)`` of a checkpoint directory."""
    index = ckpt_dir / INDEX_FILE
    if index.is_file():
        raw = json.loads(index.read_text())
        if not isinstance(raw.get("weight_map"), dict):
            got = raw.get("weight_map")
            raise WeightLoadError(f"{index}: expected a 'weight_map' mapping, got {got!r}")
        return raw["weight_map"], raw.get("metadata") or {}
    single = ckpt_dir / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), SINGLE_FILE), f.metadata() or {}
    raise WeightLoadError(f"{ckpt_dir}: expected {INDEX_FILE} or {SINGLE_FILE}, got neither")


def _by_file(weight_map: dict[str, str], layer_id: int | None) -> dict[str, list[str]]:
    """File -> the names it holds (in index order), only layer ``layer_id``'s if given."""
    prefix = None if layer_id is None else f"layers.{layer_id}.attn."
    files: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        if prefix is None or name.startswith(prefix):
            files.setdefault(file, []).append(name)
    return files


def _open(ckpt_dir: Path, file: str, names: list[str]):
    path = ckpt_dir / file
    if not path.is_file():
        raise WeightLoadError(f"{names[0]}: expected in {path} (index), got no such file")
    f = safe_open(str(path), framework="pt", device="cpu")
    held = set(f.keys())
    for name in names:
        if name not in held:
            raise WeightLoadError(f"{name}: expected in {file} (index), got a file without it")
    return f


def iter_checkpoint(
    ckpt_dir: str | Path, layer_id: int | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor (layer ``layer_id``'s if given), one file at a time."""
    ckpt_dir = Path(ckpt_dir)
    weight_map, _ = _read_index(ckpt_dir)
    for file, names in _by_file(weight_map, layer_id).items():
        with _open(ckpt_dir, file, names) as f:
            for name in names:
                yield name, f.get_tensor(name)


def inspect_checkpoint(
    ckpt_dir: str | Path, model: str | ModelConfig | None = None
) -> list[TensorRow]:
    """Check every ``layers.{i}.attn.*`` tensor against the model (headers only); the table rows.

    Every layer with at least one tensor must hold all of its tensors with the
    right dtypes and shapes, and no others. ``model`` defaults to the one named
    in the index metadata. Tensors outside ``layers.{i}.attn.`` (the rest of a
    full model's checkpoint) are listed but not checked. Raises one
    ``WeightLoadError`` listing every problem.
    """
    ckpt_dir = Path(ckpt_dir)
    weight_map, metadata = _read_index(ckpt_dir)
    if model is None:
        if MODEL_KEY not in metadata:
            raise WeightLoadError(
                f"model: expected a config name or {MODEL_KEY!r} in the index metadata, got neither"
            )
        model = metadata[MODEL_KEY]
    m = _model(model)
    found: dict[int, dict[str, tuple[torch.dtype | str, tuple[int, ...]]]] = {}
    rows = []
    for file, names in _by_file(weight_map, None).items():
        with _open(ckpt_dir, file, names) as f:
            for name in names:
                view = f.get_slice(name)
                dtype = SAFETENSORS_DTYPES.get(view.get_dtype(), view.get_dtype())
                shape = tuple(view.get_shape())
                dtype_name = str(dtype).removeprefix("torch.")
                rows.append(TensorRow(name, dtype_name, str(list(shape)), file))
                layer = LAYER_NAME.match(name)
                if layer:
                    found.setdefault(int(layer.group(1)), {})[name] = (dtype, shape)
    if not found:
        raise WeightLoadError(f"{ckpt_dir}: expected layers.{{i}}.attn.* tensors, got none")
    problems = []
    for layer_id, tensors in sorted(found.items()):
        if layer_id >= m.num_layers:
            problems += [
                f"{name}: expected a layer below num_layers = {m.num_layers} of {m.name!r}, "
                f"got layer {layer_id}"
                for name in tensors
            ]
            continue
        problems += tensor_problems(
            tensors, layer_tensor_specs(m, layer_id), unexpected_hint=f" in layer {layer_id}"
        )
    if problems:
        raise WeightLoadError("\n".join(problems))
    return sorted(rows, key=_natural_key)


def _natural_key(row: TensorRow) -> list[int | str]:
    """``layers.2.`` before ``layers.10.``: digit runs compare as numbers."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", row.name)]


def load_layer(ckpt_dir: str | Path, layer_weights: LayerWeights) -> set[str]:
    """Load one rank's ``LayerWeights`` from a checkpoint directory (its layer's tensors only)."""
    return layer_weights.load_weights(iter_checkpoint(ckpt_dir, layer_weights.layer_id))


def format_table(rows: Sequence[TensorRow]) -> str:
    """Rows as an aligned text table with a header line."""
    lines = [TensorRow._fields, *rows]
    widths = [max(len(str(line[c])) for line in lines) for c in range(len(TensorRow._fields))]
    cells = (zip(line, widths, strict=True) for line in lines)
    return "\n".join("  ".join(str(v).ljust(w) for v, w in row).rstrip() for row in cells)
