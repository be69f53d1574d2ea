"""``DSV41Attention``: the module a server uses; picks a backend at init (docs/design.md §6).

``dsv41.backends.select`` makes the choice (platform, tp, tokens a step; ``backend=``
or ``DSV41_BACKEND`` overrides); an impossible request fails at init saying why. One
log line records the choice, the reason and the NVIDIA-only features the platform turns
on (``dsv41.common.platform``).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

from dsv41 import backends
from dsv41.backends import DEFAULT_MAX_TOKENS
from dsv41.common import switches
from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import (
    COMPRESSED_BLOCK,
    FP8_DS_MLA,
    PagedKVCache,
    build_key_table,
    window_slots,
)
from dsv41.common.platform import Platform, detect_platform
from dsv41.common.step_inputs import StepInputs, check_step_inputs, check_step_values
from dsv41.common.weights import LayerWeights
from dsv41.config import DeployConfig, ModelConfig, load_deploy_config, load_model_config

log = logging.getLogger("dsv41")


@dataclasses.dataclass
class CacheMetadata:
    """What a step reads and writes besides x and positions (docs/design.md §4)."""

    slot_mapping: torch.Tensor  # int64 [M]: window-cache slot each new token's record goes to
    key_table: torch.Tensor  # int32 [M, KEYS]: slot | 1 << 31 compressed, window slot, -1 none
    window_cache: PagedKVCache
    compressed_cache: PagedKVCache | None = None


class DSV41Attention(nn.Module):
    """One DeepSeek-V4.1 attention layer on one TP rank; ``forward`` returns the rank's bf16 partial."""

    def __init__(
        self,
        model: str | ModelConfig,
        tp: int,
        rank: int,
        layer_id: int,
        backend: str = "auto",
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        device: torch.device | str | None = None,
        platform: Platform | None = None,
        warmup: bool = False,
        validate: bool | None = None,
    ):
        """``max_tokens``: the most tokens a step will have (the backend is chosen for it and
        ``warmup`` compiles up to it); ``warmup=True``: ``self.warmup()`` before returning;
        ``validate=True`` (None: ``DSV41_VALIDATE``): check the values of each step's inputs
        before it runs, raising on the first bad one (a device sync a step; off when serving)."""
        super().__init__()
        cfg = model if isinstance(model, ModelConfig) else load_model_config(model)
        cfg.checkpoint_prefix(layer_id)  # refuses a layer id the model does not have
        self.dims = Dims(tp, cfg)
        self.platform = platform or detect_platform()
        self.backend, self.reason = backends.select(self.platform, tp, max_tokens, backend)
        self.max_tokens = max_tokens
        self.validate = switches.validate() if validate is None else validate
        device = device or ("cuda" if self.platform.kind != "cpu" else "cpu")
        self.weights = LayerWeights(self.dims, rank, layer_id, device=device)
        chosen = backends.get(self.backend)
        self._forward = chosen.forward
        # A step past the backend's token limit (mono's scratch: a prefill step) takes nvidia's.
        self._forward_limit = chosen.limits.max_tokens
        self._large_forward = backends.get("nvidia").forward if self._forward_limit else None
        log.info("dsv41: layer %d rank %d/%d: backend %s (%s); %s", layer_id, rank, tp, self.backend,
                 self.reason, self.platform.features)
        if warmup:
            self.warmup()

    @classmethod
    def from_deploy(cls, deploy: DeployConfig | str, rank: int, layer_id: int,
                    **kwargs) -> DSV41Attention:  # fmt: skip
        """The layer of a deployment config (a ``DeployConfig`` or its name / path): its model,
        tp share, backend and max tokens a step; ``kwargs`` as ``__init__`` takes them."""
        d = deploy if isinstance(deploy, DeployConfig) else load_deploy_config(deploy)
        return cls(d.model, d.tp, rank, layer_id, d.backend, max_tokens=d.max_tokens, **kwargs)

    def warmup(self) -> dict[tuple[str, int], float]:
        """Compile every kernel variant a step of up to ``max_tokens`` tokens dispatches (the
        nvidia backend: each token bucket up to ``bucket_for(max_tokens)``; mono: each distinct
        variant of its token counts) by running one step of each on random inputs; seconds per
        (entry point, tokens). The reference compiles nothing. Call it before serving (or
        capturing a CUDA graph), so no step compiles a kernel."""
        return backends.get(self.backend).warmup(self.weights, self.max_tokens)

    def new_caches(
        self, window_pages: int, compressed_rows: int = 0, *, fmt: str = FP8_DS_MLA.name,
        device: torch.device | str | None = None,
    ) -> tuple[PagedKVCache, PagedKVCache | None]:  # fmt: skip
        """Empty ``(window_cache, compressed_cache)`` of this layer in record format ``fmt``
        (fp8_ds_mla: every backend; fp8_mx: the nvidia backend, the SM100 family's): the window
        cache ``window_pages`` pages of ``window_block`` tokens; the compressed one, on a
        compressed layer, ``compressed_rows`` rows in pages of ``COMPRESSED_BLOCK`` (None on a
        window-only layer)."""
        m, device = self.dims.model, device or self.weights.wqkv.device
        window = PagedKVCache(window_pages, m.window_block, fmt, device)
        if not m.compress_ratios[self.weights.layer_id]:
            return window, None
        pages = -(-compressed_rows // COMPRESSED_BLOCK)
        return window, PagedKVCache(pages, COMPRESSED_BLOCK, fmt, device)

    def cache_metadata(
        self, positions: torch.Tensor, block_tables: torch.Tensor, window_cache: PagedKVCache,
        compressed_cache: PagedKVCache | None = None, topk: torch.Tensor | None = None,
    ) -> CacheMetadata:  # fmt: skip
        """A step's ``CacheMetadata`` from each token's position ``[M]`` and its sequence's
        window-cache pages ``block_tables`` int32 ``[M, max_pages]``: the slot its record goes
        to, and the key table (``topk`` int32 ``[M, TOPK]``: compressed rows, -1 for none, on a
        compressed layer; then the window's last ``window`` positions, oldest first)."""
        m = self.dims.model
        slot_mapping = window_slots(positions[:, None], block_tables, m.window_block)[:, 0]
        key_table = build_key_table(positions, block_tables, window=m.window, block=m.window_block,
                                    topk=topk, keys=m.keys)  # fmt: skip
        return CacheMetadata(slot_mapping, key_table, window_cache, compressed_cache)

    def load_weights(self, weights) -> set[str]:
        """Checkpoint ``(name, tensor)`` pairs of this layer, through the permuting loaders."""
        return self.weights.load_weights(weights)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache_metadata: CacheMetadata) -> torch.Tensor:
        """``x`` bf16 [M, hidden], ``positions`` [M] -> this rank's bf16 [M, hidden] partial."""
        c = cache_metadata
        inputs = StepInputs(x, positions, c.slot_mapping, c.key_table, c.window_cache,
                            c.compressed_cache)  # fmt: skip
        check_step_inputs(self.weights, inputs)
        if self.validate:
            check_step_values(self.weights, inputs)
        if self._forward_limit and inputs.tokens > self._forward_limit:
            return self._large_forward(self.weights, inputs)
        return self._forward(self.weights, inputs)
