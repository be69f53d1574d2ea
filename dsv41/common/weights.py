"""The layer's parameters for one TP rank and their vLLM-style weight loaders (docs/design.md §3,
§5).

Checkpoint tensors (``layers.{i}.attn.<name>.weight`` e4m3 with ``.scale`` E8M0
on the model's ``weight_block`` blocks, 32 x 32 for V4.1, 128 x 128 for V4;
``q_norm`` / ``kv_norm`` bf16, ``attn_sink`` fp32; an MTP layer's under
``mtp.{j}.attn.``) become the kernel-visible parameters of one rank:

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
rank's shard out of the full checkpoint tensor, expands block scales of any
size to per-row codes (one a row and 32 columns) and, for wq_b and wo_a, is composed with the fused-layout permutation by
``permute_on_load`` so the permutation runs right after the shard is written.
``load_weights`` checks a whole batch (names, dtypes, shapes) before writing
any of it, so a bad batch leaves every parameter as it was; every problem is
reported as ``name: expected X, got Y`` in one ``WeightLoadError``. The
compressor's and indexer's tensors inside the layer's namespace
(``attn.compressor.*``, ``attn.indexer.*``) belong to another module: they are
skipped and named in ``last_skipped``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
from dsv41.config import ModelConfig

E8M0 = torch.float8_e8m0fnu
QUANTIZED = ("wq_a", "wkv", "wq_b", "wo_a", "wo_b")  # e4m3 + E8M0 block scales
NORMS = ("q_norm", "kv_norm")
NORM_STD = 0.1  # synthetic norms: 1 + N(0, NORM_STD^2)
NOT_OURS = ("compressor.", "indexer.")  # inside a layer's attn namespace, read by other modules

TensorSpec = tuple[tuple[int, ...], torch.dtype]  # (shape, dtype)


class WeightLoadError(ValueError):
    """A checkpoint tensor is missing, unexpected, mis-shaped or mis-typed (or a write failed)."""


def checkpoint_shapes(model: Dims | ModelConfig) -> dict[str, TensorSpec]:
    """Short name (``wq_a.weight``) -> (full checkpoint shape, dtype) of one layer, any tp."""
    m = model.model if isinstance(model, Dims) else model
    out_in = {
        "wq_a": (m.q_rank, m.hidden),
        "wkv": (m.kv_dim, m.hidden),
        "wq_b": (m.n_heads * m.head_dim, m.q_rank),
        "wo_a": (m.o_groups * m.o_rank, m.heads_per_group * m.head_dim),
        "wo_b": (m.hidden, m.o_groups * m.o_rank),
    }
    bn, bk = m.weight_block
    shapes: dict[str, TensorSpec] = {}
    for name, (n, k) in out_in.items():
        shapes[f"{name}.weight"] = ((n, k), E4M3)
        shapes[f"{name}.scale"] = ((-(-n // bn), -(-k // bk)), E8M0)
    shapes["q_norm.weight"] = ((m.q_rank,), torch.bfloat16)
    shapes["kv_norm.weight"] = ((m.kv_dim,), torch.bfloat16)
    shapes["attn_sink"] = ((m.n_heads,), torch.float32)
    return shapes


def _config(model: Dims | ModelConfig) -> ModelConfig:
    return model.model if isinstance(model, Dims) else model


def is_not_ours(name: str, prefix: str) -> bool:
    """A tensor in the layer's namespace that another module reads (compressor, indexer)."""
    return name.startswith(prefix) and name[len(prefix):].startswith(NOT_OURS)


def layer_tensor_specs(model: Dims | ModelConfig, layer_id: int) -> dict[str, TensorSpec]:
    """Full checkpoint name -> (shape, dtype) of every tensor of layer ``layer_id``."""
    prefix = _config(model).checkpoint_prefix(layer_id)
    return {prefix + short: spec for short, spec in checkpoint_shapes(model).items()}


def describe(dtype: torch.dtype | str, shape: Iterable[int]) -> str:
    """``float8_e4m3fn [16384, 128]``: how errors and tables print a tensor."""
    name = str(dtype).removeprefix("torch.")
    return f"{name} {list(shape)}"


def dtype_matches(got: torch.dtype | str, expected: torch.dtype) -> bool:
    """Equal dtypes; E8M0 scales may also come as their raw uint8 codes."""
    return got == expected or (expected == E8M0 and got == torch.uint8)


def tensor_problems(
    found: Mapping[str, tuple[torch.dtype | str, tuple[int, ...]]],
    expected: Mapping[str, TensorSpec],
    *,
    require_all: bool = True,
    unexpected_hint: str = "",
) -> list[str]:
    """A ``name: expected X, got Y`` line per unexpected, mis-typed, mis-shaped, missing tensor."""
    problems = []
    for name, (dtype, shape) in found.items():
        if name not in expected:
            got = describe(dtype, shape)
            problems.append(f"{name}: expected no such tensor{unexpected_hint}, got {got}")
            continue
        want_shape, want_dtype = expected[name]
        if not dtype_matches(dtype, want_dtype) or tuple(shape) != want_shape:
            problems.append(
                f"{name}: expected {describe(want_dtype, want_shape)}, got {describe(dtype, shape)}"
            )
    if require_all:
        problems += [
            f"{name}: expected {describe(dtype, shape)}, got nothing (missing)"
            for name, (shape, dtype) in expected.items()
            if name not in found
        ]
    return problems


def synth_layer_tensors(
    model: Dims | ModelConfig, layer_id: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random tensors of one layer in checkpoint format, keyed by full checkpoint name.

    Weights are N(0, 1/K) quantized on the model's ``weight_block`` blocks (so
    activations stay O(1)), norms 1 + N(0, 0.1^2), sinks N(0, 1).
    """
    m = _config(model)
    prefix = m.checkpoint_prefix(layer_id)
    out: dict[str, torch.Tensor] = {}
    for short, (shape, dtype) in checkpoint_shapes(model).items():
        base, _, kind = short.partition(".")
        if kind == "scale":
            continue  # written with its weight
        if base in QUANTIZED:
            w = torch.randn(shape, generator=generator) / shape[1] ** 0.5
            values, codes = quantize_weight_blocks(w, m.weight_block)
            out[prefix + short] = values
            out[f"{prefix}{base}.scale"] = codes.view(E8M0)
        elif base in NORMS:
            out[prefix + short] = (1 + NORM_STD * torch.randn(shape, generator=generator)).to(dtype)
        else:
            out[prefix + short] = torch.randn(shape, generator=generator).to(dtype)
    return out


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape, dtype=dtype, device=device), requires_grad=False)


ALL = slice(None)


def _shard_loader(name: str, rows: slice = ALL, cols: slice = ALL, *,
                  scales: tuple[tuple[int, int], Mapping[str | None, tuple[int, int]]] | None = None,
                  shard_rows: Mapping[str, slice] | None = None):
    """A weight_loader writing ``full[rows, cols]``, block scales first expanded to per-row codes.

    ``scales`` = (block, weight shape of each shard id): the block codes of a
    ``[N, K]`` weight become ``[N, K/32]`` codes before the rank's slice is cut.

    With ``shard_rows`` (a fused parameter) the call names its shard and the
    slice lands on that shard's rows of the parameter. A server may call it
    directly, so it refuses a slice of the wrong dtype or shape itself.
    """

    def load(param: nn.Parameter, loaded: torch.Tensor, shard: str | None = None) -> None:
        full = loaded.view(torch.uint8) if loaded.dtype == E8M0 else loaded
        if scales is not None:
            block, weight_shape = scales
            try:
                full = block_to_row_scales(full, block, weight_shape[shard])
            except ValueError as e:
                where = name if shard is None else f"{name}[{shard}]"
                raise WeightLoadError(f"{where}: {e}") from None
        dst = param.data if shard is None else param.data[shard_rows[shard]]
        src = full[rows][..., cols]
        if src.dtype != dst.dtype or src.shape != dst.shape:
            where = name if shard is None else f"{name}[{shard}]"
            raise WeightLoadError(
                f"{where}: expected a shard of {describe(dst.dtype, dst.shape)}, "
                f"got {describe(src.dtype, src.shape)} from {describe(loaded.dtype, loaded.shape)}"
            )
        dst.copy_(src.to(dst.device))

    return load


class LayerWeights(nn.Module):
    """The kernel-visible parameters of one layer on one TP rank (table in the module docstring)."""

    def __init__(self, dims: Dims, rank: int, layer_id: int, device: torch.device | str = "cpu"):
        super().__init__()
        m = dims.model
        self.prefix = m.checkpoint_prefix(layer_id)  # layers.{i}.attn. or mtp.{j}.attn.
        self.dims, self.rank, self.layer_id = dims, rank, layer_id
        self.heads = dims.head_range(rank)  # global heads of this rank
        self.groups = dims.group_range(rank)  # global wo_a groups of this rank
        self.last_skipped: list[str] = []  # the last load's compressor / indexer names
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

    def _install_loaders(self) -> None:
        m = self.dims.model
        q_rows = slice(self.heads.start * m.head_dim, self.heads.stop * m.head_dim)
        o_rows = slice(self.groups.start * m.o_rank, self.groups.stop * m.o_rank)
        o_blocks = slice(o_rows.start // MX_BLOCK, o_rows.stop // MX_BLOCK)
        qkv_rows = {"wq_a": slice(0, m.q_rank), "wkv": slice(m.q_rank, m.qkv_rows)}
        full = {k.removesuffix(".weight"): shape for k, (shape, _) in checkpoint_shapes(m).items()
                if k.endswith(".weight")}
        block = m.weight_block

        def scales(base: str):
            return block, {None: full[base]}

        loaders = {
            "wqkv": {"shard_rows": qkv_rows},
            "wqkv_scale": {"shard_rows": qkv_rows,
                           "scales": (block, {"wq_a": full["wq_a"], "wkv": full["wkv"]})},
            "q_norm": {},
            "kv_norm": {},
            "wq_b": {"rows": q_rows},
            "wq_b_scale": {"rows": q_rows, "scales": scales("wq_b")},
            "wo_a": {"rows": o_rows},
            "wo_a_scale": {"rows": o_rows, "scales": scales("wo_a")},
            "wo_b": {"cols": o_rows},
            "wo_b_scale": {"cols": o_blocks, "scales": scales("wo_b")},
            "attn_sink": {"rows": slice(self.heads.start, self.heads.stop)},
        }
        for name, where in loaders.items():
            getattr(self, name).weight_loader = _shard_loader(name, **where)

        q_perm = q_fused_permutation(self.dims.heads, m.head_dim)
        permute_on_load(self.wq_b, q_perm, 0)
        permute_on_load(self.wq_b_scale, q_perm, 0)
        permute_on_load(self.wo_a, o_fused_permutation(m.heads_per_group, m.head_dim), 1)
        permute_on_load(
            self.wo_a_scale, o_fused_chunk_permutation(m.heads_per_group, m.head_dim), 1
        )

    def _target(self, name: str) -> tuple[nn.Parameter, str | None]:
        """Full checkpoint name -> (parameter, shard id)."""
        base, _, kind = name.removeprefix(self.prefix).partition(".")
        if base in ("wq_a", "wkv"):
            return (self.wqkv_scale if kind == "scale" else self.wqkv), base
        if base in QUANTIZED and kind == "scale":
            return getattr(self, f"{base}_scale"), None
        return getattr(self, base), None

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], *, require_all: bool = True
    ) -> set[str]:
        """Load full checkpoint tensors of this layer (any order, any number of times).

        Every tensor is checked (name, shape, dtype) before any is written, so a
        bad batch changes nothing. With ``require_all`` a batch lacking any of
        the layer's tensors is refused too. The compressor's and indexer's
        tensors are skipped and named in ``last_skipped``; any other name not
        the layer's is refused. Returns the names loaded.
        """
        expected = layer_tensor_specs(self.dims, self.layer_id)
        batch, skipped = {}, []
        for name, tensor in weights:
            if is_not_ours(name, self.prefix):
                skipped.append(name)
            else:
                batch[name] = tensor
        problems = tensor_problems(
            {name: (t.dtype, tuple(t.shape)) for name, t in batch.items()},
            expected,
            require_all=require_all,
            unexpected_hint=f" in layer {self.layer_id}",
        )
        if problems:
            raise WeightLoadError("\n".join(problems + ["nothing was loaded"]))
        written: list[str] = []
        for name, tensor in batch.items():
            param, shard = self._target(name)
            try:
                if shard is None:
                    param.weight_loader(param, tensor)
                else:
                    param.weight_loader(param, tensor, shard)
            except Exception as e:
                raise WeightLoadError(
                    f"{name}: expected its weight_loader to succeed, got {type(e).__name__}: {e}; "
                    f"parameters written before it: {written or 'none'}; this one may be "
                    "half-written: load the layer again"
                ) from e
            written.append(name)
        self.last_skipped = sorted(skipped)
        return set(batch)

    def dummy_load(self, seed: int = 0) -> None:
        """Random MXFP8 weights in checkpoint format, through the same loaders (for benchmarks)."""
        gen = torch.Generator().manual_seed(seed)
        self.load_weights(synth_layer_tensors(self.dims, self.layer_id, gen).items())
