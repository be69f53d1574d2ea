"""``DSV41Attention``: the module a server uses; picks a backend at init (docs/design.md §6).

Selection: SM90 and the SM100 family -> ``nvidia``; ROCm gfx942 / gfx950 ->
``mono`` where tp is 2 or 4 and a step has at most 48 tokens, else the
nvidia-style Triton path; CPU -> ``reference`` (the Triton kernels run there
under ``TRITON_INTERPRET=1`` when asked for by name). ``backend=`` or the
``DSV41_BACKEND`` environment variable overrides; an impossible request fails
at init saying why. One log line records the choice, the reason and the NVIDIA-only
features the platform turns on (``dsv41.common.platform``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

import torch
from torch import nn

from dsv41.common.geometry import Dims
from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.platform import Platform, detect_platform
from dsv41.common.step_inputs import check_step_inputs
from dsv41.common.weights import LayerWeights
from dsv41.config import BACKENDS, ModelConfig, load_model_config

log = logging.getLogger("dsv41")

MONO_TP = (2, 4)  # the mono plan's task tables and scratch are laid out for these shares
MONO_MAX_TOKENS = 48  # mono scratch holds at most 48 tokens a step
ROCM_MONO_ARCHS = ("gfx942", "gfx950")  # MI300 / MI355: where mono was designed and tuned


def _nvidia_native(arch: str) -> bool:
    """SM90 (Hopper) and the SM100 family (sm100, sm103, sm110): the archs the nvidia kernels target."""
    return arch == "sm90" or arch[:4] in ("sm10", "sm11")


def select_backend(platform: Platform, tp: int, max_tokens: int, requested: str = "auto") -> tuple[str, str]:
    """``(backend, reason)`` for a layer at ``tp`` running up to ``max_tokens`` a step; raises when impossible."""
    if requested == "auto" and os.environ.get("DSV41_BACKEND"):
        requested = os.environ["DSV41_BACKEND"]
        source = "DSV41_BACKEND"
    else:
        source = "backend="
    if requested not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {requested!r} (from {source})")
    on_cpu = platform.kind == "cpu"
    if requested != "auto":
        if requested == "reference":
            return "reference", f"requested by {source}"
        if on_cpu and not platform.interpret:
            raise ValueError(
                f"backend {requested!r} needs a GPU; on this CPU-only machine set TRITON_INTERPRET=1 "
                f"to run its Triton kernels in the interpreter, or use backend='reference'"
            )
        if requested == "mono":
            _check_mono(tp, max_tokens)
        return requested, f"requested by {source}"
    if on_cpu:
        return "reference", "no GPU: the eager PyTorch reference (TRITON_INTERPRET=1 and backend='nvidia' run the kernels)"
    if platform.kind == "cuda":
        if _nvidia_native(platform.arch):
            return "nvidia", f"NVIDIA {platform.arch}: FlashMLA-style kernels"
        raise ValueError(
            f"no kernel backend targets NVIDIA {platform.arch} (SM90 and the SM100 family do); "
            f"pass backend='nvidia' to try the Triton kernels there or backend='reference'"
        )
    if platform.arch not in ROCM_MONO_ARCHS:
        raise ValueError(
            f"no kernel backend targets ROCm {platform.arch} ({', '.join(ROCM_MONO_ARCHS)} do); "
            f"pass backend='nvidia' (the portable Triton path) or backend='reference'"
        )
    if tp in MONO_TP and max_tokens <= MONO_MAX_TOKENS:
        return "mono", f"ROCm {platform.arch}, tp {tp}, <= {MONO_MAX_TOKENS} tokens: single-launch mono kernel"
    return "nvidia", (
        f"ROCm {platform.arch} but mono needs tp in {MONO_TP} and <= {MONO_MAX_TOKENS} tokens "
        f"(tp {tp}, max_tokens {max_tokens}): the nvidia-style Triton path"
    )


def _check_mono(tp: int, max_tokens: int) -> None:
    if tp not in MONO_TP:
        raise ValueError(f"backend 'mono': expected tp in {MONO_TP} (its task tables are laid out for them), got tp {tp}")
    if max_tokens > MONO_MAX_TOKENS:
        raise ValueError(
            f"backend 'mono': expected max_tokens <= {MONO_MAX_TOKENS} (its scratch holds that many), "
            f"got {max_tokens}"
        )


@dataclasses.dataclass
class CacheMetadata:
    """What a step reads and writes besides x and positions (docs/design.md §4)."""

    slot_mapping: torch.Tensor  # int64 [M]: window-cache slot each new token's record goes to
    key_table: torch.Tensor  # int32 [M, KEYS]: slot | 1 << 31 compressed, window slot, -1 none
    window_cache: PagedKVCache
    compressed_cache: PagedKVCache | None = None


StepFn = Callable[..., dict]


def _step_function(backend: str) -> StepFn:
    if backend == "nvidia":
        from dsv41.nvidia.step import nvidia_step

        return nvidia_step
    if backend == "mono":
        from dsv41.amd.mono.launcher import mono_step

        return mono_step
    from dsv41.common.reference import reference_step

    def reference(layer, x, positions, slot_mapping, key_table, window_cache, compressed_cache):
        seams = reference_step(layer, x, positions, slot_mapping, key_table, window_cache, compressed_cache)
        return vars(seams)

    return reference


def _forward_function(backend: str) -> Callable[..., torch.Tensor]:
    """What ``forward`` runs: the step, y only, without the seam copies or host syncs of the
    stage-by-stage entry points (mono's timeouts surface at a later call)."""
    if backend == "mono":
        from dsv41.amd.mono.launcher import mono_forward

        return mono_forward
    if backend == "nvidia":  # forward has checked the arguments already
        from dsv41.nvidia.step import nvidia_step

        return lambda *args: nvidia_step(*args, check=False)["y"]
    step = _step_function(backend)
    return lambda *args: step(*args)["y"]


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
        max_tokens: int = MONO_MAX_TOKENS,
        device: torch.device | str | None = None,
        platform: Platform | None = None,
    ):
        super().__init__()
        cfg = model if isinstance(model, ModelConfig) else load_model_config(model)
        cfg.checkpoint_prefix(layer_id)  # refuses a layer id the model does not have
        self.dims = Dims(tp, cfg)
        self.platform = platform or detect_platform()
        self.backend, self.reason = select_backend(self.platform, tp, max_tokens, backend)
        self.max_tokens = max_tokens
        device = device or ("cuda" if self.platform.kind != "cpu" else "cpu")
        self.weights = LayerWeights(self.dims, rank, layer_id, device=device)
        self._forward = _forward_function(self.backend)
        self._large_forward = _forward_function("nvidia") if self.backend == "mono" else self._forward
        log.info("dsv41: layer %d rank %d/%d: backend %s (%s); %s", layer_id, rank, tp, self.backend,
                 self.reason, self.platform.features)

    def load_weights(self, weights) -> set[str]:
        """Checkpoint ``(name, tensor)`` pairs of this layer, through the permuting loaders."""
        return self.weights.load_weights(weights)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache_metadata: CacheMetadata) -> torch.Tensor:
        """``x`` bf16 [M, hidden], ``positions`` [M] -> this rank's bf16 [M, hidden] partial."""
        c = cache_metadata
        check_step_inputs(self.weights, x, positions, c.slot_mapping, c.key_table, c.window_cache,
                          c.compressed_cache)  # fmt: skip
        # Mono's scratch holds MONO_MAX_TOKENS; a larger (prefill) step takes the Triton GEMM path.
        forward = self._forward if x.shape[0] <= MONO_MAX_TOKENS else self._large_forward
        return forward(self.weights, x, positions, c.slot_mapping, c.key_table, c.window_cache,
                       c.compressed_cache)
