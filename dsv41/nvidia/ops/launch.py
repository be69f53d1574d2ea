"""What every NVIDIA launcher asks before it launches: the interpreter, the SM count, the
token bucket.

Every launch choice is a function of the token bucket ``bucket_for(M)``, never of M, whose
value the kernels do not specialise on: warming a bucket up compiles every kernel variant
a step of that bucket dispatches.
"""

from __future__ import annotations

import torch

from dsv41.common import switches

DEFAULT_SMS = 8  # the "SM count" the interpreter plans for, so tiny tests still split K
M_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 128, 256, 512)  # decode, then prefill token counts


def interpreting() -> bool:
    """Kernels run under the Triton interpreter (CPU tests)."""
    return switches.interpreting()


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; ``DEFAULT_SMS`` for the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SMS


def bucket_for(m: int) -> int:
    """The token bucket whose kernel variants serve ``m`` tokens: the smallest >= m (else m)."""
    return next((b for b in M_BUCKETS if b >= m), m)
