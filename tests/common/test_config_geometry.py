"""Model configs load and validate; per-rank geometry matches docs/design.md §1 and partitions the
model."""

from __future__ import annotations

import pytest
import yaml

from dsv41.common.geometry import Dims
from dsv41.config import CONFIG_DIR, ConfigError, load_model_config


@pytest.mark.parametrize("name", ["tiny", "dsv41-flash", "dsv4-flash", "tiny-v4"])
def test_configs_load(name: str) -> None:
    m = load_model_config(name)
    assert m.name == name
    assert m.nope_dim + m.rope_dim == m.head_dim == m.kv_dim == 512
    assert m.heads_per_group == 8
    assert len(m.compress_ratios) == m.total_layers == m.num_layers + m.mtp_layers
    assert m.keys == m.topk + m.window
    assert m.rope_for_layer(0).yarn is None
    compressed = next(i for i, r in enumerate(m.compress_ratios) if r)
    assert m.rope_for_layer(compressed).yarn is not None


def test_flash_values() -> None:
    m = load_model_config("dsv41-flash")
    got = (m.hidden, m.q_rank, m.n_heads, m.o_groups, m.o_rank, m.window, m.topk, m.keys)
    assert got == (5120, 1280, 64, 8, 1024, 128, 512, 640)
    assert m.eps == 1e-20
    assert m.softmax_scale == 512**-0.5
    assert m.rope_compressed.theta == 160000.0 and m.rope_window.theta == 10000.0
    y = m.rope_compressed.yarn
    assert (y.factor, y.original_max_position, y.beta_fast, y.beta_slow) == (16.0, 65536, 32.0, 1.0)


def _write_broken(tmp_path, edit) -> str:
    with open(CONFIG_DIR / "models" / "tiny.yaml") as f:
        raw = yaml.safe_load(f)
    edit(raw)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _set(key, value):
    def edit(raw):
        raw[key] = value

    return edit


def _drop(key):
    def edit(raw):
        del raw[key]

    return edit


def _set_yarn(key, value):
    def edit(raw):
        raw["rope"]["compressed"]["yarn"][key] = value

    return edit


@pytest.mark.parametrize(
    "edit, field",
    [
        (_set("hidden", 250), "hidden"),  # not a multiple of 32
        (_set("q_rank", -32), "q_rank"),
        (_set("n_heads", "many"), "n_heads"),
        (_drop("topk"), "topk"),
        (_set("nope_dim", 416), "head_dim"),  # 416 + 64 != 512
        (_set("o_groups", 8), "o_groups"),  # 32 / 8 = 4 heads a group
        (_set("eps", 0.0), "eps"),
        (_set("compress_ratios", [0, 1, 3]), "compress_ratios[2]"),
        (_set("compress_ratios", [0, 1]), "compress_ratios"),
        (_set_yarn("factor", "big"), "rope.compressed.yarn.factor"),
        (_drop("rope"), "rope"),
    ],
)
def test_broken_field_is_named(tmp_path, edit, field: str) -> None:
    path = _write_broken(tmp_path, edit)
    with pytest.raises(ConfigError) as err:
        load_model_config(path)
    assert f"{field}:" in str(err.value)
    assert "broken.yaml" in str(err.value)


def test_unknown_config_name() -> None:
    with pytest.raises(ConfigError, match="known names"):
        load_model_config("no-such-model")


def test_flash_tp4_dims() -> None:
    d = Dims.of("dsv41-flash", 4)
    got = {
        "heads": d.heads, "groups": d.groups, "group_k": d.group_k, "q_rows": d.q_rows,
        "o_rows": d.o_rows, "head_tiles": d.head_tiles,
    }
    assert got == {
        "heads": 16, "groups": 2, "group_k": 4096, "q_rows": 8192, "o_rows": 2048,
        "head_tiles": 1,
    }


@pytest.mark.parametrize("tp, match", [(3, r"tp: expected one of"), (8, r"tp: 8 does not divide")])
def test_bad_tp_on_tiny(tp: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Dims.of("tiny", tp)


@pytest.mark.parametrize("model, tp", [("tiny", 1), ("tiny", 2), ("tiny", 4), ("dsv41-flash", 8)])
def test_ranges_partition_model(model: str, tp: int) -> None:
    d = Dims.of(model, tp)
    m = d.model
    heads = [h for r in range(tp) for h in d.head_range(r)]
    groups = [g for r in range(tp) for g in d.group_range(r)]
    assert heads == list(range(m.n_heads))
    assert groups == list(range(m.o_groups))
    for r in range(tp):
        hr, gr = d.head_range(r), d.group_range(r)
        assert len(hr) == d.heads and len(gr) == d.groups
        # A rank's heads are exactly the heads of its groups.
        assert list(hr) == [g * m.heads_per_group + i for g in gr for i in range(m.heads_per_group)]
    with pytest.raises(ValueError, match="rank: expected"):
        d.head_range(tp)
    with pytest.raises(ValueError, match="rank: expected"):
        d.group_range(-1)
