"""Backend selection at init (docs/design.md §6): each platform, overrides and refusals with their
messages."""

import pytest

from dsv41.backends import select
from dsv41.common.platform import Platform

H200 = Platform("cuda", "sm90", False)
GB200 = Platform("cuda", "sm100", False)
GB300 = Platform("cuda", "sm103", False)
MI300 = Platform("rocm", "gfx942", False)
MI355 = Platform("rocm", "gfx950", False)
CPU = Platform("cpu", "", False)
CPU_INTERP = Platform("cpu", "", True)


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    monkeypatch.delenv("DSV41_BACKEND", raising=False)


@pytest.mark.parametrize("platform", [H200, GB200, GB300])
def test_nvidia_archs_pick_nvidia(platform):
    backend, reason = select(platform, 4, 48)
    assert backend == "nvidia" and platform.arch in reason


@pytest.mark.parametrize("platform", [MI300, MI355])
@pytest.mark.parametrize("tp", [2, 4])
def test_rocm_picks_mono_where_it_applies(platform, tp):
    backend, reason = select(platform, tp, 48)
    assert backend == "mono" and platform.arch in reason


@pytest.mark.parametrize("tp,max_tokens", [(8, 16), (1, 16), (4, 64)])
def test_rocm_outside_mono_takes_the_triton_path(tp, max_tokens):
    backend, reason = select(MI355, tp, max_tokens)
    assert backend == "nvidia"
    assert f"tp {tp}" in reason and f"max_tokens {max_tokens}" in reason


def test_cpu_picks_the_reference():
    backend, reason = select(CPU, 4, 1)
    assert backend == "reference" and "no GPU" in reason


def test_unsupported_gpus_are_refused_with_the_way_out():
    with pytest.raises(ValueError, match="sm80.*backend='reference'"):
        select(Platform("cuda", "sm80", False), 4, 1)
    with pytest.raises(ValueError, match="gfx90a"):
        select(Platform("rocm", "gfx90a", False), 4, 1)


def test_explicit_backend_overrides_auto():
    assert select(H200, 4, 1, "mono") == ("mono", "requested by backend=")
    assert select(MI355, 4, 1, "nvidia")[0] == "nvidia"
    assert select(H200, 4, 1, "reference")[0] == "reference"


def test_environment_overrides_auto_but_not_an_explicit_argument(monkeypatch):
    monkeypatch.setenv("DSV41_BACKEND", "reference")
    assert select(H200, 4, 1) == ("reference", "requested by DSV41_BACKEND")
    assert select(H200, 4, 1, "nvidia")[0] == "nvidia"


def test_bad_environment_value_names_its_source(monkeypatch):
    monkeypatch.setenv("DSV41_BACKEND", "cutlass")
    with pytest.raises(ValueError, match="backend: expected one of .* got 'cutlass' \\(from DSV41_BACKEND\\)"):
        select(H200, 4, 1)


def test_mono_refusals_say_why():
    with pytest.raises(ValueError, match="'mono': expected tp in \\(2, 4\\).*got tp 8"):
        select(MI355, 8, 1, "mono")
    with pytest.raises(ValueError, match="max_tokens <= 48.*got 64"):
        select(MI355, 4, 64, "mono")


def test_kernels_on_cpu_need_the_interpreter():
    with pytest.raises(ValueError, match="needs a GPU.*TRITON_INTERPRET=1"):
        select(CPU, 4, 1, "nvidia")
    assert select(CPU_INTERP, 4, 1, "nvidia")[0] == "nvidia"
    assert select(CPU_INTERP, 2, 1, "mono")[0] == "mono"
