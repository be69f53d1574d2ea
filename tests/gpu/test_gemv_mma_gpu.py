"""One token's GEMV on e4m3 tensor cores (``gemv_mma``) on the GPU, real geometry: wo_a at the
tp 4 and tp 2 shares against the reference seam and against the CUDA-core loop."""

from __future__ import annotations

import pytest
import torch

from dsv41.common.geometry import Dims
from dsv41.common.mx import mxfp8_dequantize, mxfp8_quantize
from dsv41.common.reference import wo_a_grouped
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.gemv_mma import gemv_mma
from dsv41.nvidia.ops.mx_gemm import mx_gemm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("tp", [4, 2])
def test_wo_a_matches_the_reference_and_the_cuda_core_loop(tp, monkeypatch):
    """Relative error of z against the reference <= 1e-2 (the step's bound), and within one
    bf16 step of the CUDA-core loop's z in >= 99 % of its values (the same exact products,
    summed in another order)."""
    monkeypatch.delenv("DSV41_GEMV_MMA", raising=False)
    layer = LayerWeights(Dims.of("dsv41-flash", tp), rank=1, layer_id=3, device="cuda")
    layer.dummy_load(seed=tp)
    dims, model = layer.dims, layer.dims.model
    g = torch.Generator().manual_seed(7)
    xo = mxfp8_quantize(torch.randn(1, dims.heads * model.head_dim, generator=g).cuda())
    out = torch.empty(1, dims.o_rows, dtype=torch.bfloat16, device="cuda")
    got = gemv_mma(xo, layer.wo_a, layer.wo_a_scale, out, model.o_rank).float()
    want = wo_a_grouped(layer, mxfp8_dequantize(*xo)).reshape(1, dims.o_rows).float()
    assert got.abs().sum() > 0
    assert (got - want).norm() <= 1e-2 * want.norm()
    cores = mx_gemm(xo, layer.wo_a, layer.wo_a_scale, n_per_group=model.o_rank).float()
    near = (got - cores).abs() <= 2.0**-7 * cores.abs()
    assert near.float().mean() >= 0.99, float(near.float().mean())
