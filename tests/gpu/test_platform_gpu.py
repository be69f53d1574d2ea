"""The platform of a real GPU: an H200 (or any SM90+ NVIDIA GPU) keeps PDL and inline PTX on,
so the platform gating changed nothing there; a ROCm GPU turns both off."""

from __future__ import annotations

import pytest
import torch

from dsv41.common.platform import current_platform, detect_platform
from dsv41.nvidia.ops.mega_attention import prefetch_records
from dsv41.nvidia.ops.pdl import pdl_enabled

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_the_gpu_platform_and_its_features(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("DSV41_PDL", raising=False)
    monkeypatch.delenv("DSV41_ATTN_PREFETCH", raising=False)
    p = detect_platform()
    assert p == current_platform() and not p.interpret
    if torch.version.hip:
        assert p.kind == "rocm" and p.arch.startswith("gfx") and not p.pdl and not p.ptx
        assert not pdl_enabled(1) and not prefetch_records()
    else:
        major, minor = torch.cuda.get_device_capability()
        assert p.kind == "cuda" and p.arch == f"sm{major}{minor}" and p.ptx
        assert p.pdl == (major >= 9) and pdl_enabled(1) == (major >= 9) and prefetch_records()
