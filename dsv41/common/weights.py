"""The layer's parameters for one TP rank and their vLLM-style weight loaders (SPEC §3, §5).

Checkpoint tensors (``layers.{i}.attn.<name>.weight`` e4m3 with ``.scale`` E8M0
on 32x32 blocks, ``q_norm`` / ``kv_norm`` bf16, ``attn_sink`` fp32) become the
kernel-visible parameters of one rank:

=============  ==========================================  =================================
parameter      shape (dtype)                               from
=============  ==========================================  =================================
wqkv           [q_rank + kv_dim, hidden] (e4m3)            wq_a rows, then wkv rows (replicated)
wqkv_scale     [q_rank + kv_dim, hidden / 32] (uint8)      their block scales, one row each
q_norm         [q_rank] (bf16)                             q_norm
kv_norm        [kv_dim] (bf16)                             kv_norm
wq_b           [heads * 512, q_rank] (e4m3)                this rank's heads' rows, Q-fused
wq_b_scale     [heads * 512, q_rank / 32] (uint8)          same rows, same permutation
wo_a           [groups * o_rank, 8 * 512] (e4m3)           this rank's groups' rows, columns O-fused
wo_a_scale     [groups * o_rank, 8 * 512 / 32] (uint8)     columns by the O chunk permutation
wo_b           [hidden, groups * o_rank] (e4m3)            this rank's groups' columns
wo_b_scale     [hidden, groups * o_rank / 32] (uint8)
attn_sink      [heads] (fp32)                              this rank's heads
=============  ==========================================  =================================

Each parameter has a ``weight_loader(param, loaded[, shard])`` that slices the
rank's shard out of the full checkpoint tensor, expands block scales to rows
and, for wq_b and wo_a, is composed with the fused-layout permutation by
``permute_on_load`` so the permutation runs right after the shard is written.
``load_weights`` validates a whole batch of tensors before writing any of them.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from dsv41.common.fused_layout import (
    o_fused_chunk_permutation,
    o_fused_permutation,
    permute_on_load,
    q_fused_permutation,
)
from dsv41.common.geometry import Dims
from dsv41.common.mx import E4M3, MX_BLOCK, block_to_row_scales, quantize_weight_blocks

E8M0 = torch.float8_e8m0fnu
QUANTIZED = ("wq_a", "wkv", "wq_b", "wo_a", "wo_b")  # e4m3 + E8M0 block scales
NORMS = ("q_norm", "kv_norm")


class WeightLoadError(ValueError):
    """A checkpoint tensor is missing, unexpected, mis-shaped or mis-typed."""


def checkpoint_shapes(dims: Dims) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Short name (``wq_a.weight``) -> (full checkpoint shape, dtype) of one layer."""
    m = dims.model
    out_in = {
        "wq_a": (m.q_rank, m.hidden),
        "wkv": (m.kv_dim, m.hidden),
        "wq_b": (m.n_heads * m.head_dim, m.q_rank),
        "wo_a": (m.o_groups * m.o_rank, dims.group_k),
        "wo_b": (m.hidden, m.o_groups * m.o_rank),
    }
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for name, (n, k) in out_in.items():
        shapes[f"{name}.weight"] = ((n, k), E4M3)
        shapes[f"{name}.scale"] = ((n // MX_BLOCK, k // MX_BLOCK), E8M0)
    shapes["q_norm.weight"] = ((m.q_rank,), torch.bfloat16)
    shapes["kv_norm.weight"] = ((m.kv_dim,), torch.bfloat16)
    shapes["attn_sink"] = ((m.n_heads,), torch.float32)
    return shapes


def checkpoint_prefix(layer_id: int) -> str:
    return f"layers.{layer_id}.attn."


def synth_layer_tensors(dims: Dims, layer_id: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random tensors of one layer in checkpoint format, keyed by full checkpoint name.

    Weights are N(0, 1/K) quantized on 32x32 blocks (so activations stay O(1)),
    norms 1 + N(0, 0.1^2), sinks N(0, 1).
    """
    prefix = checkpoint_prefix(layer_id)
    out: dict[str, torch.Tensor] = {}
    for short, (shape, dtype) in checkpoint_shapes(dims).items():
        name, kind = short.rsplit(".", 1) if "." in short else (short, "")
        if name in QUANTIZED:
            if kind == "scale":
                continue
            w = torch.randn(shape, generator=generator) / shape[1] ** 0.5
            values, codes = quantize_weight_blocks(w)
            out[prefix + f"{name}.weight"] = values
            out[prefix + f"{name}.scale"] = codes.view(E8M0)
        elif name in NORMS:
            out[prefix + short] = (1 + 0.1 * torch.randn(shape, generator=generator)).to(dtype)
        else:
            out[prefix + short] = torch.randn(shape, generator=generator).to(dtype)
    return out


def _param(shape: tuple[int, ...], dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape, dtype=dtype, device=device), requires_grad=False)


def _as_codes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == E8M0 else t


class LayerWeights(nn.Module):
    """The kernel-visible parameters of one layer on one TP rank (table in the module docstring)."""

    def __init__(self, dims: Dims, rank: int, layer_id: int, device="cpu"):
        super().__init__()
        m = dims.model
        self.dims, self.rank, self.layer_id = dims, rank, layer_id
        self.heads = dims.head_range(rank)
        self.groups = dims.group_range(rank)
        self.prefix = checkpoint_prefix(layer_id)
        sc = MX_BLOCK
        self.wqkv = _param((m.qkv_rows, m.hidden), E4M3, device)
        self.wqkv_scale = _param((m.qkv_rows, m.hidden // sc), torch.uint8, device)
        self.q_norm = _param((m.q_rank,), torch.bfloat16, device)
        self.kv_norm = _param((m.kv_dim,), torch.bfloat16, device)
        self.wq_b = _param((dims.q_rows, m.q_rank), E4M3, device)
        self.wq_b_scale = _param((dims.q_rows, m.q_rank // sc), torch.uint8, device)
        self.wo_a = _param((dims.o_rows, dims.group_k), E4M3, device)
        self.wo_a_scale = _param((dims.o_rows, dims.group_k // sc), torch.uint8, device)
        self.wo_b = _param((m.hidden, dims.o_rows), E4M3, device)
        self.wo_b_scale = _param((m.hidden, dims.o_rows // sc), torch.uint8, device)
        self.attn_sink = _param((dims.heads,), torch.float32, device)
        self._install_loaders()

    # -- loaders --------------------------------------------------------------

    def _install_loaders(self) -> None:
        m, d = self.dims.model, self.dims
        q_rows = slice(self.heads.start * m.head_dim, self.heads.stop * m.head_dim)
        o_rows = slice(self.groups.start * m.o_rank, self.groups.stop * m.o_rank)
        qkv_rows = {"wq_a": slice(0, m.q_rank), "wkv": slice(m.q_rank, m.qkv_rows)}

        def rows_loader(rows: slice | None, scale: bool):
            def load(param, loaded, shard: str | None = None):
                full = _as_codes(loaded)
                if scale:
                    full = block_to_row_scales(full)
                dst = param.data if shard is None else param.data[qkv_rows[shard]]
                src = full if rows is None else full[rows]
                dst.copy_(src.to(dst.device))

            return load

        def cols_loader(cols: slice):
            def load(param, loaded):
                param.data.copy_(block_to_row_scales(_as_codes(loaded))[:, cols].to(param.device)
                                 if param.dtype == torch.uint8 else loaded[:, cols].to(param.device))

            return load

        self.wqkv.weight_loader = rows_loader(None, scale=False)
        self.wqkv_scale.weight_loader = rows_loader(None, scale=True)
        for norm in (self.q_norm, self.kv_norm):
            norm.weight_loader = rows_loader(None, scale=False)
        self.wq_b.weight_loader = rows_loader(q_rows, scale=False)
        self.wq_b_scale.weight_loader = rows_loader(q_rows, scale=True)
        q_perm = q_fused_permutation(d.heads, m.head_dim)
        permute_on_load(self.wq_b, q_perm, 0)
        permute_on_load(self.wq_b_scale, q_perm, 0)
        self.wo_a.weight_loader = rows_loader(o_rows, scale=False)
        self.wo_a_scale.weight_loader = rows_loader(o_rows, scale=True)
        permute_on_load(self.wo_a, o_fused_permutation(m.heads_per_group, m.head_dim), 1)
        permute_on_load(self.wo_a_scale, o_fused_chunk_permutation(m.heads_per_group, m.head_dim), 1)
        self.wo_b.weight_loader = cols_loader(o_rows)
        self.wo_b_scale.weight_loader = cols_loader(slice(o_rows.start // MX_BLOCK, o_rows.stop // MX_BLOCK))
        self.attn_sink.weight_loader = rows_loader(slice(self.heads.start, self.heads.stop), scale=False)

    def _target(self, short: str) -> tuple[nn.Parameter, str | None]:
        """Checkpoint short name -> (parameter, shard id)."""
        name, _, kind = short.partition(".")
        if name in ("wq_a", "wkv"):
            return (self.wqkv_scale if kind == "scale" else self.wqkv), name
        if name in QUANTIZED:
            return getattr(self, f"{name}_scale" if kind == "scale" else name), None
        return getattr(self, name), None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, require_all: bool = True) -> set[str]:
        """Load full checkpoint tensors of this layer (any order, any number of times).

        Every tensor is checked (name, shape, dtype) before any is written, so a
        bad batch changes nothing. With ``require_all`` a batch lacking any of
        the layer's tensors is refused too. Returns the names loaded.
        """
        expected = {self.prefix + k: v for k, v in checkpoint_shapes(self.dims).items()}
        batch: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            if name not in expected:
                raise WeightLoadError(
                    f"{name}: unexpected tensor for layer {self.layer_id} "
                    f"(expected names under {self.prefix!r}: {sorted(k[len(self.prefix):] for k in expected)})"
                )
            shape, dtype = expected[name]
            ok_dtype = tensor.dtype == dtype or (dtype == E8M0 and tensor.dtype == torch.uint8)
            if not ok_dtype or tuple(tensor.shape) != shape:
                raise WeightLoadError(
                    f"{name}: expected {str(dtype).removeprefix('torch.')} {list(shape)}, "
                    f"got {str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"
                )
            batch[name] = tensor
        missing = sorted(set(expected) - set(batch))
        if require_all and missing:
            raise WeightLoadError(f"layer {self.layer_id}: missing tensors {missing}; nothing was loaded")
        for name, tensor in batch.items():
            param, shard = self._target(name[len(self.prefix):])
            if shard is None:
                param.weight_loader(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)
        return set(batch)

    def dummy_load(self, seed: int = 0) -> None:
        """Random MXFP8 weights in checkpoint format, through the same loaders (for benchmarks)."""
        gen = torch.Generator().manual_seed(seed)
        self.load_weights(synth_layer_tensors(self.dims, self.layer_id, gen).items())
