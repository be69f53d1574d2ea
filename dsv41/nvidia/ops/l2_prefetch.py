"""Pull the later GEMMs' weights into L2 on a side stream while the step's first kernels run.

A decode step is a chain of dependent launches, each too short (8 to 10 MB) to
reach HBM bandwidth before its ramp and tail (BENCHMARKS.md: a plain copy of
that size reads at ~1.5 TB/s). A rank's weights (~40 MB at tp 4) fit the
H200's 60 MB L2, so a side-stream kernel that reads wq_b, wo_a and wo_b with
``evict_last`` while Wqkv, the norms and attention run lets those GEMMs read
from L2 instead. It computes an xor checksum of what it read (so the loads are
not dead code) into a scratch word per program; nothing else depends on it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PREFETCH_PROGRAMS = 32  # a quarter of the SMs: the main chain keeps the rest
PREFETCH_BLOCK = 4096  # int32 words a program reads a step (16 KB)


@triton.jit
def l2_prefetch_kernel(src_ptr, words, checksum_ptr, BLOCK: tl.constexpr):
    """``checksum[pid] = xor of src[i]`` over this program's strided blocks, loaded ``evict_last``."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(pid * BLOCK, words, step):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(src_ptr + offs, mask=offs < words, other=0, eviction_policy="evict_last")
    tl.store(checksum_ptr + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


class L2Prefetcher:
    """Reads a fixed list of weight tensors into L2 on a side stream; graph-capturable."""

    def __init__(self, tensors: list[torch.Tensor], programs: int = PREFETCH_PROGRAMS):
        for t in tensors:
            if not t.is_contiguous() or (t.numel() * t.element_size()) % 4:
                raise ValueError(
                    f"tensors: expected contiguous tensors of a multiple of 4 bytes, got "
                    f"{t.dtype} {list(t.shape)} (contiguous={t.is_contiguous()})"
                )
        self.words = [t.view(torch.uint8).view(-1).view(torch.int32) for t in tensors]
        self.programs = programs
        device = tensors[0].device
        self.checksums = torch.zeros(len(tensors), programs, dtype=torch.int32, device=device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def launch(self) -> None:
        """Enqueue the reads on the current stream (tests) ."""
        for words, checksum in zip(self.words, self.checksums):
            l2_prefetch_kernel[(self.programs,)](
                words, words.numel(), checksum, BLOCK=PREFETCH_BLOCK, num_warps=8
            )

    def fork(self) -> None:
        """Start the reads on the side stream, after what the current stream has enqueued."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.launch()

    def join(self) -> None:
        """Make the current stream wait for the reads (end of the step: graphs must rejoin)."""
        torch.cuda.current_stream().wait_stream(self.stream)
