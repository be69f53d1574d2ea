"""One token's GEMV on e4m3 tensor cores (``gemv_mma``) against the reference seams: on CPU the
interpreter computes each MMA from the same fragments by tensor arithmetic, so the fragments'
addresses, the column permutation, the scales and the warps' sums are what is checked here;
the SM90 compile test checks the one-element-a-thread layout the instruction needs."""

from __future__ import annotations

import pytest
import torch
from sm90 import ptx_facts  # tests/nvidia/sm90.py
from test_gemms import assert_bf16_close, x_of

from dsv41.common.geometry import Dims
from dsv41.common.mx import E4M3, mxfp8_dequantize, mxfp8_quantize
from dsv41.common.reference import mx_linear, wo_a_grouped
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.gemv_mma import gemv_mma, gemv_mma_enabled, gemv_mma_fits
from dsv41.nvidia.ops.mx_gemm import mx_gemm


@pytest.fixture(scope="module")
def layer() -> LayerWeights:
    lw = LayerWeights(Dims.of("tiny", 2), rank=0, layer_id=1)
    lw.dummy_load(seed=19)
    return lw


def test_wo_a_on_tensor_cores_matches_the_reference(layer, monkeypatch):
    """wo_a at one token (grouped, xo's MXFP8 in the fused O layout), through ``mx_gemm`` with
    the switch on: per group ``xo_g @ Wo_a_g^T`` in bf16, as the reference."""
    monkeypatch.setenv("DSV41_GEMV_MMA", "1")
    dims, model = layer.dims, layer.dims.model
    xo = mxfp8_quantize(x_of(1, dims.heads * model.head_dim, 41))
    got = mx_gemm(xo, layer.wo_a, layer.wo_a_scale, n_per_group=model.o_rank)
    want = wo_a_grouped(layer, mxfp8_dequantize(*xo)).reshape(1, dims.o_rows)
    assert got.abs().sum() > 0
    assert_bf16_close(got, want)


def test_one_group_with_wide_scales():
    """One group of 48 rows x 1024 columns (4 blocks a warp), activation and weight blocks
    scaled from 2^-20 to 2^20 (codes of every size, so a wrong block's scale or a wrong lane's
    bytes shows): the reference's y."""
    n, k = 48, 1024
    gen = torch.Generator().manual_seed(5)
    scale = 2.0 ** torch.randint(-20, 21, (1, k // 32), generator=gen).repeat_interleave(32, 1)
    a8 = mxfp8_quantize((x_of(1, k, 43).float() * scale).to(torch.bfloat16))
    w = (torch.randn(n, k, generator=gen) * 100).to(E4M3)
    w_scale = torch.randint(100, 150, (n, k // 32), generator=gen, dtype=torch.uint8)
    out = torch.empty(1, n, dtype=torch.bfloat16)
    got = gemv_mma(a8, w, w_scale, out, n)
    assert got.abs().sum() > 0
    assert_bf16_close(got, mx_linear(a8, w, w_scale))


def test_switch_fits_and_bad_arguments(layer, monkeypatch):
    monkeypatch.delenv("DSV41_GEMV_MMA", raising=False)
    assert not gemv_mma_enabled()
    monkeypatch.setenv("DSV41_GEMV_MMA", "1")
    assert gemv_mma_enabled()
    monkeypatch.setenv("DSV41_GEMV_MMA", "2")
    with pytest.raises(ValueError, match="DSV41_GEMV_MMA: expected 0 or 1, got '2'"):
        gemv_mma_enabled()
    assert gemv_mma_fits(1, 1024, 4096) and not gemv_mma_fits(2, 1024, 4096)
    assert not gemv_mma_fits(1, 1000, 4096) and not gemv_mma_fits(1, 1024, 4000)
    assert not gemv_mma_fits(1, 1024, 768)  # 3 blocks a warp
    xo = mxfp8_quantize(x_of(2, layer.wo_a.shape[1] * 2, 44))
    out = torch.empty(2, layer.wo_a.shape[0], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a8: expected one token, 16-row tiles"):
        gemv_mma(xo, layer.wo_a, layer.wo_a_scale, out, layer.dims.model.o_rank)
    one = (xo[0][:1], xo[1][:1])
    with pytest.raises(ValueError, match="w: expected a contiguous tensor"):
        gemv_mma(one, layer.wo_a.t().contiguous().t(), layer.wo_a_scale, out[:1], 64)
    assert layer.wo_a.dtype == E4M3


SM90_COMPILE = r"""
import json, re
from sm90 import sm90_ptx
from dsv41.nvidia.sm90_compile import compile_sm90
from dsv41.nvidia.ops.gemv_mma import gemv_mma_kernel as fn
consts = {"K": 4096, "N_PER_GROUP": 1024, "NW": 8, "BPW": 16, "USE_PDL": True, "PTX": True,
          "TRACE": False}
sig = {n: "constexpr" if n in consts else ("*fp8e4nv" if n in ("a_ptr", "w_ptr") else "*u8")
       for n in fn.arg_names}
sig["out_ptr"], sig["trace_ptr"] = "*bf16", "*i64"
k = compile_sm90(fn, sig, consts, {n: [["tt.divisibility", 16]] for n in fn.arg_names
                                   if sig[n][0] == "*"}, num_warps=8)
ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
asm_ops = [l for l in ttgir.splitlines() if "tt.elementwise_inline_asm" in l]
layouts = re.findall(r"#(blocked\d*|linear\d*) = (#ttg\.[^\n]*)", ttgir)
used = {m for l in asm_ops for m in re.findall(r"#(blocked\d*|linear\d*)>", l)}
print(json.dumps({"mma": len(re.findall(r"mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3", ptx)),
                  "waits": ptx.count("griddepcontrol.wait"),
                  "before_wait_loads": len(re.findall(r"ld\.global", ptx.split("griddepcontrol.wait")[0])),
                  "asm_layouts": [v for n, v in layouts if n in used]}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile for the real device")
def test_compiles_for_sm90_with_one_element_a_thread():
    """SM90: 16 MMAs a thread (one a block of its warp), the weight fragments and codes loaded
    before the PDL wait, and the instruction's operands in the layout of one element a thread
    for each block (``[BPW, 256]``: registers along the blocks, lanes then warps along the
    elements), which makes element e thread e."""
    facts = ptx_facts(SM90_COMPILE)
    assert facts["mma"] == 16 and facts["waits"] == 1, facts
    assert facts["before_wait_loads"] >= 16 * 4, facts
    assert facts["asm_layouts"], facts
    for layout in facts["asm_layouts"]:
        assert "sizePerThread = [1, 1]" in layout and "threadsPerWarp = [1, 32]" in layout, layout
        assert "warpsPerCTA = [1, 8]" in layout, layout
