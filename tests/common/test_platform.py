"""dsv41.common.platform: which NVIDIA-only features (PDL, inline PTX) a platform turns on."""

import logging
import types

import pytest
import torch

from dsv41.common import platform as plat
from dsv41.common.platform import Platform, current_platform, detect_platform, parse_target, targeting
from dsv41.layer import DSV41Attention


@pytest.fixture
def rocm_torch(monkeypatch):
    """torch as a ROCm build on an MI300X reports itself (``torch.version.hip``, gcnArchName)."""
    plat._device.cache_clear()
    monkeypatch.setattr(torch.version, "hip", "6.4.43482", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    props = types.SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-", multi_processor_count=304)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    yield
    plat._device.cache_clear()


def test_a_rocm_torch_turns_pdl_and_ptx_off(rocm_torch, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    got = detect_platform()
    assert got == Platform("rocm", "gfx942", False)
    assert not got.pdl and not got.ptx and got.features == "PDL off, inline PTX off"
    assert current_platform() == got


@pytest.mark.parametrize("name,pdl,ptx", [("sm90", True, True), ("sm100", True, True),
                                          ("sm80", False, True), ("gfx942", False, False),
                                          ("gfx950", False, False)])  # fmt: skip
def test_targets_and_their_features(name, pdl, ptx):
    p = parse_target(name)
    assert (p.pdl, p.ptx, p.interpret) == (pdl, ptx, False)
    warp = 64 if name.startswith("gfx") else 32
    assert p.triton_target().warp_size == warp and str(p.triton_target().arch) in name


def test_the_interpreter_turns_both_off_even_on_nvidia():
    assert Platform("cuda", "sm90", True).features == "PDL off, inline PTX off"
    assert Platform("cpu", "").features == "PDL off, inline PTX off"
    with pytest.raises(ValueError, match="target: expected one of .*got 'h200'"):
        parse_target("h200")


def test_targeting_overrides_the_machine_and_nests():
    machine = current_platform()
    with targeting(parse_target("sm90")):
        assert current_platform().pdl
        with targeting(parse_target("gfx950")):
            assert current_platform() == Platform("rocm", "gfx950")
        assert current_platform().arch == "sm90"
    assert current_platform() == machine


def test_the_selection_log_line_names_the_features(rocm_torch, caplog):
    """On the mocked MI300X the layer picks mono and says PDL and PTX are off; as an H200, on."""
    with caplog.at_level(logging.INFO, logger="dsv41"):
        layer = DSV41Attention("tiny", 2, 0, 1, device="cpu")
    assert layer.backend == "mono" and "gfx942" in layer.reason
    assert "backend mono" in caplog.text and "PDL off, inline PTX off" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dsv41"):
        DSV41Attention("tiny", 2, 0, 1, device="cpu", platform=Platform("cuda", "sm90"))
    assert "backend nvidia" in caplog.text and "PDL on, inline PTX on" in caplog.text


def test_rocm_mma_gemms_step_k_by_128_at_most():
    """On ROCm the MMA GEMM loop's K step is at most ``ROCM_BLOCK_K_MAX`` (256 spilled on gfx942
    at 32-row tiles); on NVIDIA the tiles stay what the H200 measured best, for every shape of a
    tp 1 step at the MMA buckets."""
    from dsv41.common.geometry import Dims
    from dsv41.nvidia.ops.mx_gemm import BLOCK_K_MAX, ROCM_BLOCK_K_MAX, gemm_config
    from dsv41.nvidia.tuning import gemm_shapes

    narrower = []
    for m in (32, 48, 128):
        for name, (n, k, npg, _) in gemm_shapes(Dims.of("dsv41-flash", 1)).items():
            args = dict(n_per_group=npg or n, quant_out=name == "wq_b", sms=304)
            with targeting(parse_target("gfx942")):
                amd = gemm_config(m, n, k, **args)
            with targeting(parse_target("sm90")):
                nv = gemm_config(m, n, k, **args, block_k_max=BLOCK_K_MAX)
            assert amd.block_k <= ROCM_BLOCK_K_MAX < BLOCK_K_MAX, (name, m, amd)
            assert k % (amd.block_k * amd.split_k) == 0 and amd.block_m == nv.block_m, (name, amd)
            assert nv == gemm_config(m, n, k, **args), (name, m)  # the machine here is no ROCm
            narrower.append(amd.block_k < nv.block_k)
    assert any(narrower)
