"""Checkpoints on disk: sharded safetensors files with an HF-style index (docs/design.md §3;
released layouts: docs/checkpoints.md).

A checkpoint directory holds ``model-0000k-of-0000n.safetensors`` files and
``model.safetensors.index.json`` (``{"metadata": {...}, "weight_map": {name:
file}}``), as Hugging Face writes them; a single ``model.safetensors`` without
an index is read too. Tensors keep the public names and dtypes: ``layers.{i}.attn.
<name>.weight`` F8_E4M3 with ``.scale`` F8_E8M0 on the model's scale blocks,
``q_norm`` / ``kv_norm`` BF16, ``attn_sink`` F32; MTP layer ``j`` under
``mtp.{j}.attn.``. Reading is lazy: ``iter_checkpoint`` opens one file at a time
through the index and reads only the tensors asked for, and
``inspect_checkpoint`` reads headers only. The model config comes from the
directory's ``config.json`` (a downloaded model) or, for dsv41's own synthetic
checkpoints, the config name in the index metadata (``dsv41_model``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dsv41.common.weights import (
    NOT_OURS,
    LayerWeights,
    WeightLoadError,
    layer_tensor_specs,
    synth_layer_tensors,
    tensor_problems,
)
from dsv41.config import HF_CONFIG, ModelConfig, load_model_config, read_hf_config

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SHARD_MODE = 0o644  # shards readable by the group and others, as the index and config.json are
MODEL_KEY = "dsv41_model"  # index metadata: the model config the checkpoint was made for
LAYER_NAME = re.compile(r"^(layers|mtp)\.(\d+)\.attn\.")
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
# The released layouts ``synth --like`` writes: config.json's shape and the scale block.
LAYOUTS = {
    "dsv41-flash": {"nested": True, "block": (32, 32), "architecture": "DeepseekV41ForCausalLM",
                    "model_type": "deepseek_v41"},
    "dsv4-flash": {"nested": False, "block": (128, 128), "architecture": "DeepseekV4ForCausalLM",
                   "model_type": "deepseek_v4"},
}
OTHERS_VOCAB = 64  # rows of the stand-in embedding and head ``--others`` writes


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


def hf_config_json(m: ModelConfig, like: str) -> dict:
    """A config.json for model ``m`` in the released layout ``like`` (flat V4 or nested V4.1)."""
    layout = LAYOUTS[like]
    text = {
        "hidden_size": m.hidden, "q_lora_rank": m.q_rank, "num_attention_heads": m.n_heads,
        "num_key_value_heads": 1, "head_dim": m.head_dim, "qk_rope_head_dim": m.rope_dim,
        "o_groups": m.o_groups, "o_lora_rank": m.o_rank, "sliding_window": m.window,
        "index_topk": m.topk, "num_hidden_layers": m.num_layers,
        "num_nextn_predict_layers": m.mtp_layers, "rms_norm_eps": m.eps,
        "max_position_embeddings": m.max_position, "rope_theta": m.rope_window.theta,
        "compress_rope_theta": m.rope_compressed.theta,
        "compress_ratios": list(m.compress_ratios), "torch_dtype": "bfloat16",
    }
    y = m.rope_compressed.yarn
    if y is not None:
        text["rope_scaling"] = {
            "rope_type" if layout["nested"] else "type": "yarn", "factor": y.factor,
            "original_max_position_embeddings": y.original_max_position,
            "beta_fast": y.beta_fast, "beta_slow": y.beta_slow,
        }
    quant = {"quant_method": "fp8", "activation_scheme": "dynamic",
             "weight_block_size": list(layout["block"]), "scale_fmt": "ue8m0"}
    if not layout["nested"]:
        quant["fmt"] = "e4m3"
        return {"architectures": [layout["architecture"]], "model_type": layout["model_type"],
                **text, "quantization_config": quant}
    return {"architectures": [layout["architecture"]], "model_type": layout["model_type"],
            "quantization_config": {**quant, "expert_dtype": "fp4"},
            "text_config": {"model_type": f"{layout['model_type']}_text", **text}}


def other_tensors(m: ModelConfig, layer_ids: Sequence[int], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Stand-ins for the rest of a model directory (``--others``): the public names, small
    shapes: embedding and head, each layer's norms, the compressor's and indexer's tensors
    inside a compressed layer's attn namespace, the MTP layers' norms."""
    def t(*shape):
        return torch.randn(shape, generator=gen).bfloat16()

    out = {"embed.weight": t(OTHERS_VOCAB, m.hidden), "norm.weight": t(m.hidden),
           "head.weight": t(OTHERS_VOCAB, m.hidden)}
    indexed = min((r for r in m.compress_ratios if r), default=0)
    for i in layer_ids:
        if i >= m.num_layers:
            j = i - m.num_layers
            out |= {f"mtp.{j}.enorm.weight": t(m.hidden), f"mtp.{j}.hnorm.weight": t(m.hidden)}
            continue
        out |= {f"layers.{i}.attn_norm.weight": t(m.hidden), f"layers.{i}.ffn_norm.weight": t(m.hidden)}
        ratio = m.compress_ratios[i]
        if ratio:
            p = f"layers.{i}.attn.compressor."
            out |= {p + "wkv.weight": t(m.head_dim, 32), p + "norm.weight": t(m.head_dim)}
        if ratio == indexed and ratio:
            p = f"layers.{i}.attn.indexer."
            out |= {p + "wq_b.weight": t(64, 32), p + "k_norm.weight": t(64)}
    return out


def synth_checkpoint(
    model_name_or_cfg: str | ModelConfig,
    layers: int,
    out_dir: str | Path,
    *,
    shards: int = 4,
    seed: int = 0,
    mtp: int = 0,
    like: str | None = None,
    others: bool = False,
) -> Path:
    """Write random layers ``0 .. layers-1`` and MTP layers ``0 .. mtp-1`` in ``shards``
    safetensors files; the index path.

    ``like`` (``dsv41-flash`` or ``dsv4-flash``) writes the released layout: a
    config.json in that model's form (the geometry is ``model``'s) and scales on
    its blocks; without it the index metadata names the config. ``others`` adds
    stand-ins for the rest of the model (``other_tensors``). Layer ``i`` draws
    from its own generator (seeded from ``seed`` and ``i``), so its tensors do
    not depend on ``layers`` or ``shards``. One or two layers are held in memory
    at a time.
    """
    m = _model(model_name_or_cfg)
    if like is not None:
        if like not in LAYOUTS:
            raise ValueError(f"like: expected one of {sorted(LAYOUTS)}, got {like!r}")
        m = dataclasses.replace(m, weight_block=LAYOUTS[like]["block"])
    lowest = 0 if mtp else 1
    if not lowest <= layers <= m.num_layers:
        raise ValueError(
            f"layers: expected {lowest} <= layers <= num_layers = {m.num_layers}, got {layers}"
        )
    if not 0 <= mtp <= m.mtp_layers:
        raise ValueError(f"mtp: expected 0 <= mtp <= mtp_layers = {m.mtp_layers}, got {mtp}")
    layer_ids = [*range(layers), *range(m.num_layers, m.num_layers + mtp)]
    specs = {i: layer_tensor_specs(m, i) for i in layer_ids}
    extra = other_tensors(m, layer_ids, torch.Generator().manual_seed(seed)) if others else {}
    names = [(i, name) for i in layer_ids for name in specs[i]] + [(-1, name) for name in extra]
    if not 1 <= shards <= len(names):
        raise ValueError(f"shards: expected 1 <= shards <= {len(names)} tensors, got {shards}")
    sizes = [torch.Size(shape).numel() * dtype.itemsize for shape, dtype in
             (specs[i][name] for i, name in names if i >= 0)]
    sizes += [t.numel() * t.element_size() for t in extra.values()]
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
            if i < 0:
                tensors[name] = extra[name]
            else:
                if cached[0] != i:
                    gen = torch.Generator().manual_seed(seed * m.total_layers + i)
                    cached = (i, synth_layer_tensors(m, i, gen))
                tensors[name] = cached[1][name]
            weight_map[name] = file
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        os.chmod(out / file, SHARD_MODE)
    metadata = {"total_size": sum(sizes)}
    if like is None:
        metadata[MODEL_KEY] = m.name
    else:
        (out / HF_CONFIG).write_text(json.dumps(hf_config_json(m, like), indent=2) + "\n")
    index = {"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}
    path = out / INDEX_FILE
    path.write_text(json.dumps(index, indent=2) + "\n")
    return path


def _safe_open(path: Path):
    """``safe_open`` of one file; an unreadable or truncated file is a ``WeightLoadError``
    naming it."""
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise WeightLoadError(f"{path}: expected a readable safetensors file, got: {e}") from None


def _read_index(ckpt_dir: Path) -> tuple[dict[str, str], dict]:
    """``(weight_map name -> file, metadata)`` of a checkpoint directory."""
    index = ckpt_dir / INDEX_FILE
    if index.is_file():
        try:
            raw = json.loads(index.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise WeightLoadError(f"{index}: expected a JSON index, got: {e}") from None
        if not isinstance(raw, dict):
            raise WeightLoadError(f"{index}: expected a JSON object, got {type(raw).__name__}")
        if not isinstance(raw.get("weight_map"), dict):
            got = raw.get("weight_map")
            raise WeightLoadError(f"{index}: expected a 'weight_map' mapping, got {got!r}")
        return raw["weight_map"], raw.get("metadata") or {}
    single = ckpt_dir / SINGLE_FILE
    if single.is_file():
        with _safe_open(single) as f:
            return dict.fromkeys(f.keys(), SINGLE_FILE), f.metadata() or {}
    raise WeightLoadError(f"{ckpt_dir}: expected {INDEX_FILE} or {SINGLE_FILE}, got neither")


def _by_file(weight_map: dict[str, str], prefix: str | None) -> dict[str, list[str]]:
    """File -> the names it holds (in index order), only those starting with ``prefix`` if given."""
    files: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        if prefix is None or name.startswith(prefix):
            files.setdefault(file, []).append(name)
    return files


def _open(ckpt_dir: Path, file: str, names: list[str]):
    path = ckpt_dir / file
    if not path.is_file():
        raise WeightLoadError(f"{names[0]}: expected in {path} (index), got no such file")
    f = _safe_open(path)
    held = set(f.keys())
    for name in names:
        if name not in held:
            raise WeightLoadError(f"{name}: expected in {file} (index), got a file without it")
    return f


def iter_checkpoint(
    ckpt_dir: str | Path, prefix: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor (those whose name starts with ``prefix`` if given,
    e.g. a layer's ``layers.2.attn.`` or ``mtp.0.attn.``), one file at a time."""
    ckpt_dir = Path(ckpt_dir)
    weight_map, _ = _read_index(ckpt_dir)
    for file, names in _by_file(weight_map, prefix).items():
        with _open(ckpt_dir, file, names) as f:
            for name in names:
                try:
                    tensor = f.get_tensor(name)
                except (SafetensorError, OSError) as e:
                    raise WeightLoadError(f"{name}: expected readable in {ckpt_dir / file}, "
                                          f"got: {e}") from None  # fmt: skip
                yield name, tensor


def checkpoint_model(ckpt_dir: str | Path, model: str | ModelConfig | None = None) -> ModelConfig:
    """The model a checkpoint directory holds: ``model`` if given, else its config.json,
    else the config named in its index metadata."""
    ckpt_dir = Path(ckpt_dir)
    if model is not None:
        return _model(model)
    if (ckpt_dir / HF_CONFIG).is_file():
        return read_hf_config(ckpt_dir)[0]
    _, metadata = _read_index(ckpt_dir)
    if MODEL_KEY not in metadata:
        raise WeightLoadError(
            f"model: expected a config name, {ckpt_dir / HF_CONFIG} or {MODEL_KEY!r} in the index "
            "metadata, got none of them"
        )
    return _model(metadata[MODEL_KEY])


def _layer_id(m: ModelConfig, match: re.Match) -> tuple[int, str | None]:
    """``(layer id, problem)`` of a ``layers.{i}.attn.`` / ``mtp.{j}.attn.`` name."""
    kind, k = match.group(1), int(match.group(2))
    if kind == "layers":
        if k >= m.num_layers:
            return k, f"expected a layer below num_layers = {m.num_layers} of {m.name!r}, got layer {k}"
        return k, None
    if k >= m.mtp_layers:
        return k, f"expected an MTP layer below mtp_layers = {m.mtp_layers} of {m.name!r}, got mtp.{k}"
    return m.num_layers + k, None


def inspect_checkpoint(
    ckpt_dir: str | Path, model: str | ModelConfig | None = None
) -> list[TensorRow]:
    """Check every layer's attention tensors against the model (headers only); the table rows.

    Every layer (``layers.{i}.attn.``, ``mtp.{j}.attn.``) with at least one tensor
    must hold all of its tensors with the right dtypes and shapes, and no
    others; the compressor's and indexer's tensors in that namespace are listed
    but not checked, as is everything outside it (the rest of a full model).
    ``model`` defaults to ``checkpoint_model``'s. Raises one ``WeightLoadError``
    listing every problem.
    """
    ckpt_dir = Path(ckpt_dir)
    weight_map, _ = _read_index(ckpt_dir)
    m = checkpoint_model(ckpt_dir, model)
    found: dict[int, dict[str, tuple[torch.dtype | str, tuple[int, ...]]]] = {}
    rows, problems = [], []
    for file, names in _by_file(weight_map, None).items():
        with _open(ckpt_dir, file, names) as f:
            for name in names:
                view = f.get_slice(name)
                dtype = SAFETENSORS_DTYPES.get(view.get_dtype(), view.get_dtype())
                shape = tuple(view.get_shape())
                dtype_name = str(dtype).removeprefix("torch.")
                rows.append(TensorRow(name, dtype_name, str(list(shape)), file))
                layer = LAYER_NAME.match(name)
                if not layer or name[layer.end():].startswith(NOT_OURS):
                    continue
                layer_id, problem = _layer_id(m, layer)
                if problem:
                    problems.append(f"{name}: {problem}")
                else:
                    found.setdefault(layer_id, {})[name] = (dtype, shape)
    if not found and not problems:
        raise WeightLoadError(
            f"{ckpt_dir}: expected layers.{{i}}.attn.* or mtp.{{j}}.attn.* tensors, got none"
        )
    for layer_id, tensors in sorted(found.items()):
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
    """Load one rank's ``LayerWeights`` from a checkpoint directory (its layer's tensors only;
    the compressor's and indexer's end up in ``layer_weights.last_skipped``)."""
    return layer_weights.load_weights(iter_checkpoint(ckpt_dir, layer_weights.prefix))


def format_table(rows: Sequence[TensorRow]) -> str:
    """Rows as an aligned text table with a header line."""
    lines = [TensorRow._fields, *rows]
    widths = [max(len(str(line[c])) for line in lines) for c in range(len(TensorRow._fields))]
    cells = (zip(line, widths, strict=True) for line in lines)
    return "\n".join("  ".join(str(v).ljust(w) for v, w in row).rstrip() for row in cells)
