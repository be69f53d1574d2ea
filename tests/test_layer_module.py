"""DSV41Attention: the module a server uses; forward equals the reference on CPU."""

import dataclasses
import logging

import pytest
import torch

from dsv41.common.reference import reference_step
from dsv41.common.scenario import make_scenario
from dsv41.layer import CacheMetadata, DSV41Attention


def _metadata(sc):
    return CacheMetadata(sc.slot_mapping, sc.key_table, sc.window_cache, sc.compressed_cache)


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    monkeypatch.delenv("DSV41_BACKEND", raising=False)


def test_init_logs_the_choice_and_the_reason(caplog):
    with caplog.at_level(logging.INFO, logger="dsv41"):
        layer = DSV41Attention("tiny", 2, 1, 1, backend="reference")
    assert layer.backend == "reference"
    assert "layer 1 rank 1/2: backend reference (requested by backend=)" in caplog.text


def test_init_refuses_an_impossible_request():
    with pytest.raises(ValueError, match="'mono': expected tp in \\(2, 4\\)"):
        DSV41Attention("tiny", 1, 0, 1, backend="mono")
    with pytest.raises(ValueError, match="layer_id: expected 0 <= layer_id < 3, got 7"):
        DSV41Attention("tiny", 2, 0, 7)


@pytest.mark.parametrize("backend", ["reference", pytest.param("nvidia", marks=pytest.mark.slow),
                                     pytest.param("mono", marks=pytest.mark.slow)])
def test_forward_equals_the_reference(backend):
    layer = DSV41Attention("tiny", 2, 0, 1, backend=backend)
    layer.weights.dummy_load(4)
    sc = make_scenario(layer.dims, 1, 3, seed=9)
    ref = reference_step(layer.weights, sc.clone_caches())
    y = layer(sc.x, sc.positions, _metadata(sc))
    assert y.dtype == torch.bfloat16 and y.shape == ref.y.shape
    # measured: mono and nvidia at tp 2 equal the reference bit for bit (test_step_tolerances)
    assert ((y.float() - ref.y.float()).norm() / ref.y.float().norm()).item() < 3e-3


def test_forward_rejects_a_wrong_x():
    layer = DSV41Attention("tiny", 2, 0, 1, backend="reference")
    sc = make_scenario(layer.dims, 1, 2, seed=1)
    with pytest.raises(ValueError, match="x: expected bfloat16 \\[M, 256\\], got torch.float32"):
        layer(sc.x.float(), sc.positions, _metadata(sc))


@pytest.mark.slow
def test_forward_checks_the_arguments_once(monkeypatch):
    """The nvidia forward checks the step's arguments in forward, not again in nvidia_step,
    and nvidia_step called on its own still checks them."""
    import dsv41.layer
    import dsv41.nvidia.step
    from dsv41.common.step_inputs import check_step_inputs

    calls = []

    def counted(layer, inputs):
        calls.append(inputs)
        return check_step_inputs(layer, inputs)

    monkeypatch.setattr(dsv41.layer, "check_step_inputs", counted)
    monkeypatch.setattr(dsv41.nvidia.step, "check_step_inputs", counted)
    layer = DSV41Attention("tiny", 2, 0, 1, backend="nvidia")
    layer.weights.dummy_load(4)
    sc = make_scenario(layer.dims, 1, 2, seed=5)
    layer(sc.x, sc.positions, _metadata(sc))
    assert len(calls) == 1
    with pytest.raises(ValueError, match="positions: expected"):
        dsv41.nvidia.step.nvidia_step(layer.weights,
                                      dataclasses.replace(sc, positions=sc.positions[:1]))
    assert len(calls) == 2


def test_mono_warmup_variants():
    """Mono compiles one kernel a distinct variant: CUDA cores with pairs at 1 token, 2 token
    rows at 2, 4 rows at 3 and 4, tensor cores from 5 (16 rows up to 16 tokens)."""
    from dsv41.amd.mono.warmup import variants

    lw = DSV41Attention("tiny", 2, 0, 1, backend="mono").weights
    assert variants(lw, 5) == variants(lw, 16) == [1, 2, 3, 5]
    with pytest.raises(ValueError, match="max_tokens: expected 1 .. 48, got 49"):
        variants(lw, 49)


@pytest.mark.slow
def test_warmup_compiles_each_bucket_up_to_max_tokens():
    """nvidia at max_tokens 2: the step (and an o_proj entry point) of buckets 1 and 2; mono at
    max_tokens 2: one step of each of its two variants; the reference: nothing."""
    layer = DSV41Attention("tiny", 2, 0, 1, backend="nvidia", max_tokens=2)
    assert {b for _, b in layer.warmup()} == {1, 2}
    mono = DSV41Attention("tiny", 2, 0, 1, backend="mono", max_tokens=2, warmup=True)
    assert set(mono.warmup()) == {("mono", 1), ("mono", 2)}
    assert DSV41Attention("tiny", 2, 0, 1, backend="reference", warmup=True).warmup() == {}


def test_a_deployment_builds_its_layer():
    """A deploy config's model, tp, backend and max tokens go to the layer."""
    layer = DSV41Attention.from_deploy("mi355-tp2", 1, 1, device="cpu")
    assert (layer.dims.model.name, layer.dims.tp, layer.backend, layer.max_tokens) == (
        "dsv41-flash", 2, "mono", 48)  # fmt: skip
