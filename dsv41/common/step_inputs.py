"""The arguments of a layer step (docs/design.md §4) as every backend takes them: the checks they
share.

``check_step_inputs`` reads shapes, dtypes and devices only, never a value, so it
costs no device sync and runs on every call. Value checks (positions in range,
slots, key-table entries) sync, so backends run them behind a flag (mono's
``validate``).
"""

from __future__ import annotations

import torch

from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.weights import LayerWeights

INDEX_DTYPES = (torch.int32, torch.int64)  # positions and slot_mapping


def check_step_inputs(
    layer: LayerWeights,
    x: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    key_table: torch.Tensor,
    window_cache: PagedKVCache,
    compressed_cache: PagedKVCache | None,
) -> int:
    """Raise ``ValueError`` / ``TypeError`` naming the first bad argument; return M.

    ``x`` bf16 ``[M, hidden]`` with a unit stride along hidden; ``positions``,
    ``slot_mapping`` int32 or int64 ``[M]``; ``key_table`` int32 ``[M, KEYS]``;
    the caches ``PagedKVCache`` (the compressed one optional); all on the
    weights' device.
    """
    hidden = layer.dims.model.hidden
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"x: expected bfloat16 [M, {hidden}], got {x.dtype} {list(x.shape)}")
    if x.stride(1) != 1:
        raise ValueError(f"x: expected a unit stride along hidden, got strides {x.stride()}")
    m = x.shape[0]
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if t.dtype not in INDEX_DTYPES or tuple(t.shape) != (m,):
            raise ValueError(
                f"{name}: expected int32 or int64 [{m}], got {t.dtype} {list(t.shape)}"
            )
    if key_table.dtype != torch.int32 or key_table.dim() != 2 or key_table.shape[0] != m:
        raise ValueError(
            f"key_table: expected int32 [{m}, KEYS], got {key_table.dtype} {list(key_table.shape)}"
        )
    for name, cache in (("window_cache", window_cache), ("compressed_cache", compressed_cache)):
        if not isinstance(cache, PagedKVCache) and not (
            name == "compressed_cache" and cache is None
        ):
            raise TypeError(f"{name}: expected a PagedKVCache, got {type(cache).__name__}")
    tensors = {"x": x, "positions": positions, "slot_mapping": slot_mapping,
               "key_table": key_table, "window_cache": window_cache.data}  # fmt: skip
    if compressed_cache is not None:
        tensors["compressed_cache"] = compressed_cache.data
    device = layer.wqkv.device
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name}: expected a tensor on the weights' {device}, got {t.device}")
    return m
