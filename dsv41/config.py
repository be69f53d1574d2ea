"""Model configs: the geometry of docs/design.md §1 read from YAML or a checkpoint's config.json,
validated.

A config is looked up by name in ``dsv41/configs/models/`` (``dsv41-flash``,
``dsv4-flash``, ``tiny``, ``tiny-v4``), read from a YAML path, or read from a
downloaded model directory's ``config.json`` (flat as V4-Flash writes it, or
nested under ``text_config`` as V4.1-Flash does; see docs/checkpoints.md). Every
field is checked on load and an error names the field, what was expected and
what came, so a typo in a deployment fails at start-up rather than as a wrong
shape deep inside a kernel.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # package data: ships in the wheel
MX_BLOCK = 32  # values sharing one E8M0 code; widths must be multiples of it
# 0 = window only; any other = window + compressed top-k (V4.1 uses 1 and 2, V4 4 and 128).
COMPRESS_RATIOS = (0, 1, 2, 4, 128)
HF_CONFIG = "config.json"  # a downloaded model directory's config


class ConfigError(ValueError):
    """A model or deployment config field is missing or out of range."""


@dataclasses.dataclass(frozen=True)
class YarnConfig:
    factor: float
    original_max_position: int
    beta_fast: float
    beta_slow: float


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    theta: float
    yarn: YarnConfig | None = None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int  # 5120
    q_rank: int  # 1280
    kv_dim: int  # 512
    head_dim: int  # 512
    nope_dim: int  # 448
    rope_dim: int  # 64
    n_heads: int  # 64
    o_groups: int  # 8
    o_rank: int  # 1024
    window: int  # 128
    topk: int  # 512
    window_block: int  # 32
    eps: float  # 1e-20
    num_layers: int  # 40
    compress_ratios: tuple[int, ...]  # one a layer: num_layers, then the mtp_layers
    rope_window: RopeConfig
    rope_compressed: RopeConfig
    max_position: int
    mtp_layers: int = 0  # speculative-decoding layers, addressed as layers num_layers + j
    weight_block: tuple[int, int] = (MX_BLOCK, MX_BLOCK)  # checkpoint scale block (rows, cols)

    @property
    def total_layers(self) -> int:
        """Layers a layer id may name: num_layers, then the MTP layers."""
        return self.num_layers + self.mtp_layers

    def checkpoint_prefix(self, layer_id: int) -> str:
        """``layers.{i}.attn.``, or ``mtp.{j}.attn.`` for layer id ``num_layers + j``."""
        if not 0 <= layer_id < self.total_layers:
            raise ValueError(
                f"layer_id: expected 0 <= layer_id < {self.total_layers}, got {layer_id} "
                f"({self.num_layers} layers, then {self.mtp_layers} MTP)"
            )
        if layer_id < self.num_layers:
            return f"layers.{layer_id}.attn."
        return f"mtp.{layer_id - self.num_layers}.attn."

    @property
    def heads_per_group(self) -> int:
        """Heads sharing one wo_a group: n_heads / o_groups (8)."""
        return self.n_heads // self.o_groups

    @property
    def keys(self) -> int:
        """A token's keys at most: topk + window (640)."""
        return self.topk + self.window

    @property
    def qkv_rows(self) -> int:
        """Rows of the fused Wqkv = [wq_a; wkv]: q_rank + kv_dim (1792)."""
        return self.q_rank + self.kv_dim

    @property
    def softmax_scale(self) -> float:
        """head_dim ** -0.5."""
        return self.head_dim**-0.5

    def rope_for_layer(self, layer_id: int) -> RopeConfig:
        """Plain RoPE for window-only layers, YaRN for compressed ones."""
        return self.rope_compressed if self.compress_ratios[layer_id] else self.rope_window


def _field(raw: dict, key: str, kind: type, where: str):
    if key not in raw:
        raise ConfigError(f"{where}{key}: missing")
    value = raw[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(
            f"{where}{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _positive(raw: dict, key: str, where: str = "") -> int:
    value = _field(raw, key, int, where)
    if value <= 0:
        raise ConfigError(f"{where}{key}: expected a positive int, got {value}")
    return value


def _rope(raw: dict, key: str) -> RopeConfig:
    where = f"rope.{key}."
    if key not in raw or not isinstance(raw[key], dict):
        raise ConfigError(f"rope.{key}: missing (expected a mapping with theta)")
    section = raw[key]
    theta = _field(section, "theta", float, where)
    yarn = None
    if "yarn" in section:
        y = section["yarn"]
        if not isinstance(y, dict):
            raise ConfigError(f"{where}yarn: expected a mapping, got {type(y).__name__}")
        yw = where + "yarn."
        yarn = YarnConfig(
            factor=_field(y, "factor", float, yw),
            original_max_position=_positive(y, "original_max_position", yw),
            beta_fast=_field(y, "beta_fast", float, yw),
            beta_slow=_field(y, "beta_slow", float, yw),
        )
    return RopeConfig(theta=theta, yarn=yarn)


def parse_model_config(raw: dict) -> ModelConfig:
    """Validate a config mapping against docs/design.md §1's structure."""
    if not isinstance(raw, dict):
        raise ConfigError(f"model config: expected a mapping, got {type(raw).__name__}")
    ints = {
        k: _positive(raw, k)
        for k in (
            "hidden", "q_rank", "kv_dim", "head_dim", "nope_dim", "rope_dim", "n_heads",
            "o_groups", "o_rank", "window", "topk", "window_block", "num_layers", "max_position",
        )
    }
    for k in ("hidden", "q_rank", "kv_dim", "head_dim", "o_rank", "nope_dim", "rope_dim"):
        if ints[k] % MX_BLOCK:
            raise ConfigError(f"{k}: expected a multiple of {MX_BLOCK}, got {ints[k]}")
    if ints["nope_dim"] + ints["rope_dim"] != ints["head_dim"]:
        raise ConfigError(
            f"head_dim: expected nope_dim + rope_dim = {ints['nope_dim'] + ints['rope_dim']}, "
            f"got {ints['head_dim']}"
        )
    if ints["kv_dim"] != ints["head_dim"]:
        raise ConfigError(
            f"kv_dim: expected head_dim ({ints['head_dim']}) since K = V = the one KV head, "
            f"got {ints['kv_dim']}"
        )
    if ints["n_heads"] % ints["o_groups"] or ints["n_heads"] // ints["o_groups"] != 8:
        raise ConfigError(
            f"o_groups: expected n_heads / o_groups = 8 heads a group, "
            f"got n_heads {ints['n_heads']} / o_groups {ints['o_groups']}"
        )
    if ints["rope_dim"] % 2:
        raise ConfigError(f"rope_dim: expected an even number (GPT-J pairs), got {ints['rope_dim']}")
    eps = _field(raw, "eps", float, "")
    if not eps > 0:
        raise ConfigError(f"eps: expected a positive float, got {eps}")
    mtp = raw.get("mtp_layers", 0)
    if not isinstance(mtp, int) or isinstance(mtp, bool) or mtp < 0:
        raise ConfigError(f"mtp_layers: expected an int >= 0, got {mtp!r}")
    ratios = raw.get("compress_ratios")
    n, total = ints["num_layers"], ints["num_layers"] + mtp
    if not isinstance(ratios, list) or len(ratios) not in (n, total):
        got = len(ratios) if isinstance(ratios, list) else type(ratios).__name__
        raise ConfigError(
            f"compress_ratios: expected a list of num_layers + mtp_layers = {total} values "
            f"(or num_layers = {n}: MTP layers window-only), got {got}"
        )
    for i, r in enumerate(ratios):
        if r not in COMPRESS_RATIOS or isinstance(r, bool):
            raise ConfigError(f"compress_ratios[{i}]: expected one of {COMPRESS_RATIOS}, got {r!r}")
    ratios = list(ratios) + [0] * (total - len(ratios))
    block = raw.get("weight_block", [MX_BLOCK, MX_BLOCK])
    if (
        not isinstance(block, (list, tuple)) or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
        or block[1] % MX_BLOCK
    ):
        raise ConfigError(
            f"weight_block: expected [rows, cols], positive ints, cols a multiple of {MX_BLOCK}, "
            f"got {block!r}"
        )
    rope = raw.get("rope")
    if not isinstance(rope, dict):
        raise ConfigError("rope: missing (expected a mapping with window and compressed)")
    name = raw.get("name", "unnamed")
    return ModelConfig(
        name=str(name),
        eps=eps,
        mtp_layers=mtp,
        weight_block=(block[0], block[1]),
        compress_ratios=tuple(ratios),
        rope_window=_rope(rope, "window"),
        rope_compressed=_rope(rope, "compressed"),
        **ints,
    )


def _read_yaml(kind: str, name_or_path: str | Path) -> tuple[Path, object]:
    """``dsv41/configs/<kind>/<name>.yaml`` (or a path) and its parsed content; names the known ones."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / kind / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))
        raise ConfigError(f"{kind} config {name_or_path!r}: no file {path}; known names: {known}")
    with open(path) as f:
        return path, yaml.safe_load(f)


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """A validated model config: a name in ``dsv41/configs/models/``, a YAML path, or a model
    directory (its ``config.json``) or a ``config.json`` path."""
    path = Path(name_or_path)
    if path.is_dir() or path.suffix == ".json":
        return read_hf_config(path)[0]
    path, raw = _read_yaml("models", name_or_path)
    try:
        return parse_model_config(raw)
    except ConfigError as e:
        raise ConfigError(f"{path.name}: {e}") from None


# config.json field -> dsv41 field, for the attention step's geometry and constants.
HF_FIELDS = {
    "hidden_size": "hidden",
    "q_lora_rank": "q_rank",
    "head_dim": "head_dim",
    "qk_rope_head_dim": "rope_dim",
    "num_attention_heads": "n_heads",
    "o_groups": "o_groups",
    "o_lora_rank": "o_rank",
    "sliding_window": "window",
    "index_topk": "topk",
    "rms_norm_eps": "eps",
    "num_hidden_layers": "num_layers",
    "num_nextn_predict_layers": "mtp_layers",
    "compress_ratios": "compress_ratios",
    "max_position_embeddings": "max_position",
}
HF_ROPE = ("rope_theta", "compress_rope_theta", "rope_scaling")
HF_CHECKED = ("num_key_value_heads", "quantization_config")  # read only to refuse what dsv41 cannot run
WINDOW_BLOCK = 32  # tokens a page of the window cache: the server's choice, not the model's


def _hf_value(raw: dict, key: str, where: str):
    if key not in raw:
        raise ConfigError(f"{where}{key}: missing (dsv41 needs it for the attention step)")
    return raw[key]


def _hf_quantization(quant, where: str) -> list[int]:
    """``weight_block_size`` of a ``quantization_config``; refuses anything but e4m3 / ue8m0."""
    if not isinstance(quant, dict):
        raise ConfigError(f"{where}quantization_config: expected a mapping, got {quant!r}")
    wants = {"quant_method": "fp8", "scale_fmt": "ue8m0", "fmt": "e4m3"}
    for key, want in wants.items():
        if key in quant and quant[key] != want:
            raise ConfigError(f"{where}quantization_config.{key}: expected {want!r}, got {quant[key]!r}")
    block = _hf_value(quant, "weight_block_size", f"{where}quantization_config.")
    if not isinstance(block, list) or len(block) != 2:
        raise ConfigError(f"{where}quantization_config.weight_block_size: expected [rows, cols], got {block!r}")
    return block


def _hf_rope(text: dict, where: str) -> dict:
    scaling = _hf_value(text, "rope_scaling", where)
    if not isinstance(scaling, dict):
        raise ConfigError(f"{where}rope_scaling: expected a mapping, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "yarn":
        raise ConfigError(f"{where}rope_scaling.rope_type: expected 'yarn', got {kind!r}")
    sw = f"{where}rope_scaling."
    return {
        "window": {"theta": _hf_value(text, "rope_theta", where)},
        "compressed": {
            "theta": _hf_value(text, "compress_rope_theta", where),
            "yarn": {
                "factor": _hf_value(scaling, "factor", sw),
                "original_max_position": _hf_value(scaling, "original_max_position_embeddings", sw),
                "beta_fast": _hf_value(scaling, "beta_fast", sw),
                "beta_slow": _hf_value(scaling, "beta_slow", sw),
            },
        },
    }


def parse_hf_config(raw: dict, name: str = "checkpoint") -> tuple[ModelConfig, list[str]]:
    """``(ModelConfig, fields not mapped)`` of a config.json mapping, flat or under ``text_config``.

    ``quantization_config`` may sit at the root (V4.1) or beside the model's
    fields (V4). The second value names every field of the model's mapping that
    dsv41 does not map (the rest of the model: experts, vocabulary, ...).
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"config.json: expected a mapping, got {type(raw).__name__}")
    text, where = raw, ""
    if "text_config" in raw:
        text, where = raw["text_config"], "text_config."
        if not isinstance(text, dict):
            raise ConfigError(f"text_config: expected a mapping, got {type(text).__name__}")
    kv_heads = text.get("num_key_value_heads", 1)
    if kv_heads != 1:
        raise ConfigError(f"{where}num_key_value_heads: expected 1 (one shared KV head), got {kv_heads!r}")
    quant = text.get("quantization_config", raw.get("quantization_config"))
    qwhere = where if "quantization_config" in text else ""
    if quant is None:
        raise ConfigError("quantization_config: missing (expected fp8 e4m3 weights with ue8m0 block scales)")
    optional = {"num_nextn_predict_layers": 0}  # a model without MTP layers may leave it out
    out = {
        ours: text.get(theirs, optional[theirs]) if theirs in optional else _hf_value(text, theirs, where)
        for theirs, ours in HF_FIELDS.items()
    }
    head_dim, rope_dim = out["head_dim"], out["rope_dim"]
    if isinstance(head_dim, int) and isinstance(rope_dim, int):
        out["nope_dim"] = head_dim - rope_dim
    out["kv_dim"] = head_dim
    out["window_block"] = WINDOW_BLOCK
    out["rope"] = _hf_rope(text, where)
    out["weight_block"] = _hf_quantization(quant, qwhere)
    out["name"] = name
    unmapped = [f"{where}{k}" for k in text if k not in HF_FIELDS and k not in HF_ROPE
                and k not in HF_CHECKED]
    if where:
        unmapped += [k for k in raw if k not in ("text_config", "quantization_config")]
    ours_to_theirs = {ours: f"{where}{theirs}" for theirs, ours in HF_FIELDS.items()}
    ours_to_theirs["weight_block"] = f"{qwhere}quantization_config.weight_block_size"
    try:
        return parse_model_config(out), sorted(unmapped)
    except ConfigError as e:  # name the config.json field, not dsv41's
        msg = str(e)
        ours = msg.split(":", 1)[0].split("[", 1)[0]
        if ours in ours_to_theirs:
            msg = f"{ours_to_theirs[ours]}{msg[len(ours):]} (dsv41's {ours})"
        raise ConfigError(msg) from None


def read_hf_config(path: str | Path) -> tuple[ModelConfig, list[str]]:
    """``parse_hf_config`` of a model directory's ``config.json`` (or that file); errors name the file."""
    path = Path(path)
    file = path / HF_CONFIG if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{file}: expected a model's config.json, got no such file")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{file}: expected JSON, got {e}") from None
    name = file.parent.name or "checkpoint"
    try:
        return parse_hf_config(raw, name)
    except ConfigError as e:
        raise ConfigError(f"{file}: {e}") from None


BACKENDS = ("auto", "nvidia", "mono", "reference")
RECORD_FORMAT_NAMES = ("fp8_ds_mla", "fp8_mx")


@dataclasses.dataclass(frozen=True)
class DeployConfig:
    """A deployment users run: which model, tp share, backend and KV record format."""

    name: str
    model: str
    tp: int
    backend: str
    record_format: str
    max_tokens: int


def load_deploy_config(name_or_path: str | Path) -> DeployConfig:
    """Load ``dsv41/configs/deploy/<name>.yaml`` (gb200-tp4, h200-tp4, mi355-tp4, mi355-tp2) or a path."""
    path, raw = _read_yaml("deploy", name_or_path)
    where = f"{path.name}: "
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}expected a mapping, got {type(raw).__name__}")
    choices = {"backend": BACKENDS, "record_format": RECORD_FORMAT_NAMES}
    for key, allowed in choices.items():
        if raw.get(key) not in allowed:
            raise ConfigError(f"{where}{key}: expected one of {allowed}, got {raw.get(key)!r}")
    return DeployConfig(
        name=str(raw.get("name", path.stem)),
        model=_field(raw, "model", str, where),
        tp=_positive(raw, "tp", where),
        backend=raw["backend"],
        record_format=raw["record_format"],
        max_tokens=_positive(raw, "max_tokens", where),
    )
