"""The inputs of a layer step (docs/design.md §4) as every backend takes them: ``StepInputs``,
and the checks they share.

Every step function of the project has the signature ``step(layer, inputs)``:
the reference, each backend's step and forward, the mono launcher and its
schedule executor. ``check_step_inputs`` reads shapes, dtypes and devices only,
never a value, so it costs no device sync and runs on every call. Value checks
(x finite, positions in range, slots, key-table entries) sync, so
``check_step_values`` runs only when asked (``DSV41Attention(validate=True)``,
``DSV41_VALIDATE=1``); what each backend does with a bad value otherwise is one contract
(docs/bad_inputs.md).
"""

from __future__ import annotations

import dataclasses

import torch

from dsv41.common.kv_cache import PagedKVCache, decode_key_table
from dsv41.common.weights import LayerWeights

INDEX_DTYPES = (torch.int32, torch.int64)  # positions and slot_mapping


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """One decode step's tensors; a step inserts the new records into ``window_cache``."""

    x: torch.Tensor  # bf16 [M, hidden]
    positions: torch.Tensor  # int32 / int64 [M]
    slot_mapping: torch.Tensor  # int32 / int64 [M]: window-cache slot of each new token's record
    key_table: torch.Tensor  # int32 [M, KEYS]: slot | 1 << 31 compressed row, window slot, -1 none
    window_cache: PagedKVCache
    compressed_cache: PagedKVCache | None = None

    @property
    def tokens(self) -> int:
        """M, the tokens of the step."""
        return self.x.shape[0]

    def clone_caches(self):
        """The same step with private copies of the caches (a step inserts into them)."""
        comp = self.compressed_cache
        return dataclasses.replace(
            self,
            window_cache=clone_cache(self.window_cache),
            compressed_cache=None if comp is None else clone_cache(comp),
        )


def clone_cache(cache: PagedKVCache) -> PagedKVCache:
    """A copy of ``cache`` with its own storage."""
    copy = PagedKVCache.__new__(PagedKVCache)
    copy.fmt, copy.block, copy.data = cache.fmt, cache.block, cache.data.clone()
    return copy


def check_compressed_cache(layer: LayerWeights, compressed_cache: PagedKVCache | None) -> None:
    """A compressed layer's step needs its compressed cache: ``ValueError`` naming it if None."""
    ratio = layer.dims.model.compress_ratios[layer.layer_id]
    if ratio and compressed_cache is None:
        raise ValueError(f"compressed_cache: layer {layer.layer_id} is compressed (ratio {ratio}); "
                         f"expected a PagedKVCache, got None")  # fmt: skip


def check_step_inputs(layer: LayerWeights, inputs: StepInputs) -> int:
    """Raise ``ValueError`` / ``TypeError`` naming the first bad field; return M.

    ``x`` bf16 ``[M, hidden]`` with a unit stride along hidden; ``positions``,
    ``slot_mapping`` int32 or int64 ``[M]``; ``key_table`` int32 ``[M, KEYS]``;
    the caches ``PagedKVCache`` (the compressed one optional); all on the
    weights' device.
    """
    x, positions, slot_mapping, key_table = (
        inputs.x, inputs.positions, inputs.slot_mapping, inputs.key_table,
    )  # fmt: skip
    window_cache, compressed_cache = inputs.window_cache, inputs.compressed_cache
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
    check_compressed_cache(layer, compressed_cache)
    tensors = {"x": x, "positions": positions, "slot_mapping": slot_mapping,
               "key_table": key_table, "window_cache": window_cache.data}  # fmt: skip
    if compressed_cache is not None:
        tensors["compressed_cache"] = compressed_cache.data
    device = layer.wqkv.device
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name}: expected a tensor on the weights' {device}, got {t.device}")
    return m


def _first(bad: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in bad.nonzero()[0])


def check_step_values(layer: LayerWeights, inputs: StepInputs) -> None:
    """Raise ``ValueError`` naming the argument, the index and the bound of the first bad value
    (docs/bad_inputs.md): x not finite, a position outside ``[0, max_position)``, a slot
    neither -1 nor in the window cache, a key-table entry neither -1 nor inside its cache.
    Reads values: one device sync."""
    m = layer.dims.model
    finite = torch.isfinite(inputs.x)
    if not bool(finite.all()):
        t, d = _first(~finite)
        raise ValueError(f"x[{t}, {d}]: expected a finite value, got {float(inputs.x[t, d])}")
    pos = inputs.positions
    bad = (pos < 0) | (pos >= m.max_position)
    if bool(bad.any()):
        (t,) = _first(bad)
        raise ValueError(f"positions[{t}]: expected 0 <= position < max_position = "
                         f"{m.max_position}, got {int(pos[t])}")  # fmt: skip
    slots, n = inputs.slot_mapping, inputs.window_cache.num_slots
    bad = (slots < -1) | (slots >= n)
    if bool(bad.any()):
        (t,) = _first(bad)
        raise ValueError(f"slot_mapping[{t}]: expected -1 (padding) or 0 <= slot < {n} (the "
                         f"window cache's slots), got {int(slots[t])}")  # fmt: skip
    comp = inputs.compressed_cache
    comp_n = 0 if comp is None else comp.num_slots
    is_comp, slot, valid = decode_key_table(inputs.key_table, n, comp_n)
    bad = ~valid & (inputs.key_table != -1)
    if bool(bad.any()):
        t, k = _first(bad)
        which, size = ("compressed", comp_n) if bool(is_comp[t, k]) else ("window", n)
        raise ValueError(f"key_table[{t}, {k}]: expected -1 or a {which} slot < {size} (the "
                         f"{which} cache's slots), got {which} slot {int(slot[t, k])}")  # fmt: skip
