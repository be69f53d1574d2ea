"""The RMSNorm factor as a device helper, shared by both backends (SPEC §2.2).

``reference.rmsnorm`` scales by ``torch.rsqrt(mean(x^2) + eps)``; kernels take
the factor from here (``tl.rsqrt``, the same hardware reciprocal square root
on a GPU) rather than each spelling it their own way.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_factor_tl(x, n: tl.constexpr, eps):
    """``1 / sqrt(sum(x^2) / n + eps)`` over the lanes of ``x`` (lanes past ``n`` hold 0)."""
    return rms_factor_of_tl(tl.sum(x * x, axis=0), n, eps)


@triton.jit
def rms_factor_of_tl(squares, n: tl.constexpr, eps):
    """``1 / sqrt(squares / n + eps)``: the factor from a row's sum of squares (a kernel that
    holds the row in pieces sums each piece's squares)."""
    return tl.rsqrt(squares / n + eps)
