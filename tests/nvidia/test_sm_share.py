"""Attention's programs holding their SMs alone: the rule, the shared-memory raise."""

from __future__ import annotations

from collections import namedtuple

import pytest

from dsv41.nvidia.ops.mega_attention import (
    ALONE_SMS_SHARE,
    ALONE_SMS_SHARE_LONG,
    attention_alone,
)
from dsv41.nvidia.ops.sm_share import reserve_shared


def test_alone_while_the_launch_is_small(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a GPU launch: the interpreter never holds SMs
    sms = 132
    assert attention_alone(40, sms)  # tp 4, M = 1 on the H200
    assert attention_alone(sms // ALONE_SMS_SHARE, sms)
    assert not attention_alone(sms // ALONE_SMS_SHARE + 1, sms)
    assert not attention_alone(80, sms)  # tp 4, M = 2 and tp 2, M = 1: one-block splits
    assert attention_alone(80, sms, 2)  # tp 2, M = 2 and tp 4, M = 4: two-block splits
    assert attention_alone(int(sms // ALONE_SMS_SHARE_LONG), sms, 2)
    assert not attention_alone(int(sms // ALONE_SMS_SHARE_LONG) + 1, sms, 3)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not attention_alone(40, sms)


class _Compiled:
    """What ``reserve_shared`` touches of a Triton ``CompiledKernel``."""

    def __init__(self, shared: int):
        meta = namedtuple("KernelMetadata", ["name", "num_ctas", "num_warps", "shared"])
        self.metadata = meta("k", 1, 4, shared)
        self.packed_metadata = (4, 1, shared)
        self.module, self.function, self._run = object(), object(), object()


def test_reserve_shared_raises_the_launch_size_and_reloads() -> None:
    k = _Compiled(32768)
    reserve_shared(k, 232448)
    assert k.metadata.shared == 232448 and k.metadata.num_warps == 4
    assert k.packed_metadata == (4, 1, 232448)
    assert k.module is None and k.function is None and k._run is None  # loaded again
    big = _Compiled(240000)
    handles = big.module, big.function, big._run
    reserve_shared(big, 232448)  # already holds more: left as it is
    assert big.packed_metadata == (4, 1, 240000)
    assert (big.module, big.function, big._run) == handles
    bare = _Compiled(32768)
    bare.packed_metadata = (4, 1)  # not the layout this Triton's launcher reads
    with pytest.raises(RuntimeError, match=r"packed_metadata is \(num_warps, num_ctas, shared\)"):
        reserve_shared(bare, 232448)
