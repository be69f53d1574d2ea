"""RoPE on the last 64 dims of a head: GPT-J interleaved pairs (docs/design.md §1, §2).

Pair i is dims ``(nope + 2i, nope + 2i + 1)`` and turns by ``pos * inv_freq[i]``:
``v0' = v0 c - v1 s``, ``v1' = v0 s + v1 c``; the inverse (applied to the
attention output) is ``v0' = v0 c + v1 s``, ``v1' = v1 c - v0 s``. Window-only
layers use plain frequencies ``theta^(-2i/64)``; compressed layers use YaRN
(frequencies blended between ``f`` and ``f / factor`` by a linear ramp over the
correction range set by beta_fast / beta_slow, no magnitude scaling).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dsv41.config import RopeConfig


def yarn_correction_dim(rotations: float, dim: int, theta: float, original_max: int) -> float:
    """Dim index whose wavelength fits ``rotations`` times in ``original_max``: ``dim ln(L / (2 pi r)) / (2 ln theta)``."""
    return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def inv_frequencies(rope_dim: int, rope: RopeConfig) -> torch.Tensor:
    """fp32 [rope_dim / 2]: ``theta^(-2i/d)``, YaRN-blended where ``rope.yarn`` is set."""
    i = torch.arange(0, rope_dim, 2, dtype=torch.float64)
    freq = rope.theta ** (-i / rope_dim)
    if rope.yarn is not None:
        y = rope.yarn
        low = max(math.floor(yarn_correction_dim(y.beta_fast, rope_dim, rope.theta, y.original_max_position)), 0)
        high = min(math.ceil(yarn_correction_dim(y.beta_slow, rope_dim, rope.theta, y.original_max_position)), rope_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(rope_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1 where the wavelength is short: extrapolate; 0 where long: interpolate
        freq = freq / y.factor * (1 - keep) + freq * keep
    return freq.float()


def cos_sin_cache(rope_dim: int, rope: RopeConfig, max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` fp32 [max_position, rope_dim / 2] of ``pos * inv_freq``."""
    angles = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_frequencies(rope_dim, rope).double())
    return torch.cos(angles).float(), torch.sin(angles).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float, nope: int) -> torch.Tensor:
    out = x.float().clone()
    v0, v1 = out[..., nope::2].clone(), out[..., nope + 1 :: 2].clone()
    out[..., nope::2] = v0 * cos - sign * v1 * sin
    out[..., nope + 1 :: 2] = v1 * cos + sign * v0 * sin
    return out.to(x.dtype)


def _broadcast(table: torch.Tensor, positions: torch.Tensor, x: torch.Tensor, outside: float) -> torch.Tensor:
    """Each token's row of ``table``, ``outside`` for a position outside ``[0, max_position)``
    (cos 1, sin 0: no turn, as the kernels do; docs/bad_inputs.md)."""
    pos = positions.long()
    inside = (pos >= 0) & (pos < table.shape[0])
    rows = torch.where(inside[:, None], table[pos.clamp(0, table.shape[0] - 1)], outside)  # [M, pairs]
    return rows.view(rows.shape[0], *([1] * (x.dim() - 2)), rows.shape[1])


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, nope: int) -> torch.Tensor:
    """``x [M, ..., D]``: pairs of dims ``nope..`` turned forward by each token's position (a
    position outside the tables: not turned); fp32 math, x's dtype out."""
    return _rotate(x, _broadcast(cos, positions, x, 1.0), _broadcast(sin, positions, x, 0.0), 1.0, nope)


def apply_inverse_rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, nope: int) -> torch.Tensor:
    """Undo ``apply_rope``: ``v0' = v0 c + v1 s``, ``v1' = v1 c - v0 s``."""
    return _rotate(x, _broadcast(cos, positions, x, 1.0), _broadcast(sin, positions, x, 0.0), -1.0, nope)


@triton.jit
def rope_pair_tl(v0, v1, c, s, INVERSE: tl.constexpr):
    """One GPT-J pair turned forward (``v0 c - v1 s``, ``v0 s + v1 c``) or back; fp32."""
    if INVERSE:
        return v0 * c + v1 * s, v1 * c - v0 * s
    else:
        return v0 * c - v1 * s, v0 * s + v1 * c


_TABLES: dict = {}


def rope_tables(model, layer_id: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` fp32 ``[max_position, rope_dim / 2]`` for a layer, built once per (model, kind, device)."""
    rope = model.rope_for_layer(layer_id)
    key = (model.rope_dim, rope, model.max_position, str(device))
    if key not in _TABLES:
        cos, sin = cos_sin_cache(model.rope_dim, rope, model.max_position)
        _TABLES[key] = (cos.to(device), sin.to(device))
    return _TABLES[key]
