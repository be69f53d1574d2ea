"""The L2 prefetch reads every word of its tensors: its xor checksums equal torch's."""

import functools

import pytest
import torch

from dsv41.common.mx import E4M3
from dsv41.nvidia.ops.l2_prefetch import L2Prefetcher


def _xor_all(t: torch.Tensor) -> int:
    words = t.view(torch.uint8).view(-1).view(torch.int32).tolist()
    return functools.reduce(lambda a, b: a ^ b, words, 0)


def test_checksums_cover_every_word():
    gen = torch.Generator().manual_seed(2)
    tensors = [
        torch.randn(96, 640, generator=gen).to(E4M3),  # 3.75 blocks of 4096 words over 3 programs
        torch.randint(0, 255, (64, 8), generator=gen, dtype=torch.uint8),
    ]
    pf = L2Prefetcher(tensors, programs=3)
    pf.launch()
    for t, sums in zip(tensors, pf.checksums):
        assert functools.reduce(lambda a, b: a ^ b, sums.tolist(), 0) == _xor_all(t)


def test_refuses_what_it_cannot_read_as_words():
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        L2Prefetcher([torch.zeros(3, dtype=torch.uint8)])
