"""Model configs: the geometry of docs/design.md §1 read from YAML and validated.

A config is looked up by name in ``configs/models/`` (``dsv41-flash``, ``tiny``)
or read from a path. Every field is checked on load and an error names the
field, what was expected and what came, so a typo in a deployment fails at
start-up rather than as a wrong shape deep inside a kernel.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
MX_BLOCK = 32  # values sharing one E8M0 code; widths must be multiples of it
COMPRESS_RATIOS = (0, 1, 2)  # 0 = window only, 1 / 2 = window + compressed top-k


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
    compress_ratios: tuple[int, ...]
    rope_window: RopeConfig
    rope_compressed: RopeConfig
    max_position: int

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
    ratios = raw.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) != ints["num_layers"]:
        got = len(ratios) if isinstance(ratios, list) else type(ratios).__name__
        raise ConfigError(
            f"compress_ratios: expected a list of num_layers = {ints['num_layers']} values, got {got}"
        )
    for i, r in enumerate(ratios):
        if r not in COMPRESS_RATIOS:
            raise ConfigError(f"compress_ratios[{i}]: expected one of {COMPRESS_RATIOS}, got {r!r}")
    rope = raw.get("rope")
    if not isinstance(rope, dict):
        raise ConfigError("rope: missing (expected a mapping with window and compressed)")
    name = raw.get("name", "unnamed")
    return ModelConfig(
        name=str(name),
        eps=eps,
        compress_ratios=tuple(ratios),
        rope_window=_rope(rope, "window"),
        rope_compressed=_rope(rope, "compressed"),
        **ints,
    )


def _read_yaml(kind: str, name_or_path: str | Path) -> tuple[Path, object]:
    """``configs/<kind>/<name>.yaml`` (or a path) and its parsed content; names the known ones."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / kind / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))
        raise ConfigError(f"{kind} config {name_or_path!r}: no file {path}; known names: {known}")
    with open(path) as f:
        return path, yaml.safe_load(f)


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """Load ``configs/models/<name>.yaml`` or a YAML file at a path, validated."""
    path, raw = _read_yaml("models", name_or_path)
    try:
        return parse_model_config(raw)
    except ConfigError as e:
        raise ConfigError(f"{path.name}: {e}") from None


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
    """Load ``configs/deploy/<name>.yaml`` (gb200-tp4, h200-tp4, mi355-tp4, mi355-tp2) or a path."""
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
