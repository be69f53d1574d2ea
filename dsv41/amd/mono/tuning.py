"""The mono kernel's launch choices as data: one frozen ``Tuning`` a (tp share, step tokens).

``resolve(dims, tokens)`` gives the measured defaults below; a ``Plan`` (and so a
``MonoRunner``) resolves it once when built and every task table and launch it makes reads
it. Tests and A/B runs pass another ``Tuning`` (``dataclasses.replace``) to reach the other
variants the kernel compiles; no environment switch is read.
"""

from __future__ import annotations

import dataclasses

from dsv41.common.geometry import Dims
from dsv41.common.platform import Platform, current_platform

# K columns a GEMV step (and an xq task) covers at most: GEMV_BLOCK_FEW up to FEW_TOKENS tokens,
# GEMV_BLOCK above. H200, tp 4, us a step at
# M = 1 / 16 / 48: 174.1 / 192.0 / 265.6 with 512, 187.8 / 204.8 / 259.6 with 256 (128 was slower).
GEMV_BLOCK = 256
GEMV_BLOCK_FEW = 512
FEW_TOKENS = 16
# Steps of up to CORES_TOKENS tokens multiply their GEMV blocks on CUDA cores (kernel.py, _gemv):
# faster than tensor cores up to 4 tokens on the H200 (tp 4, M = 1: 94.2 against 173.0 us; with
# weight words M = 4 105.2 against 122.6); 8 tokens spill.
CORES_TOKENS = 4
# wo_a's K (group_k) runs in WOA_K_PARTS parts, a task each:
# 32-row tasks over the whole K were 64 tasks of 128 KB at tp 4, for 132 programs.
WOA_K_PARTS = 4
# Tensor-core GEMV blocks of up to SPLIT_TOKENS tokens run in MMA_SPLIT K segments (at most: each
# of >= MMA_MIN_K columns). H200, tp 4, us a step at
# M = 8 / 16 / 48 in 8 segments: 124.8 / 136.5 / 317.1; 4: 125.7 / 137.6 / 325.8; whole blocks:
# 164.1 / 177.1 / 244.7.
SPLIT_TOKENS = 16
MMA_SPLIT = 8
# One token's wq_b and wo_b tasks run two at once (a pair of one stage; kernel.py, GEMV_PAIRS);
# H200, tp 4 / tp 2, M = 1: 62.2 / 87.3 us a step in pairs,
# 72.3 / 103.7 one at a time. Pairs in Wqkv and wo_a too (each task's own activation columns, a
# tried variant) took 66.1 / 97.6 against 62.9 / 90.1 (spills; attention slowed).
PAIRS = True
KEY_CHUNK = 64  # keys of an attention task (at most)
KEY_SLICE = 32  # keys an attention task holds in registers at once
NUM_WARPS = 8  # warps of a program (one program a multiprocessor); 16 was slower
# On ROCm (gfx942, gfx950; compiled, never run): 8 waves a program as on NVIDIA, with 16-key
# slices up to FEW_TOKENS tokens (32 above: 16 spilled a VGPR on gfx942 at 48 tokens with
# Triton 3.6), GEMV blocks of 128 columns, every tensor-core block in 8 K segments and weight
# words at one token only: no VGPR spill at tp 2 and 4, 1 .. 48 tokens (docs/amd.md). The NVIDIA
# tiles spill on gfx942 at 8 waves (tp 4, M = 1 / 4 / 16: 36 / 54 / 74; 16-key slices and
# 128-column blocks at M = 48 in whole blocks: 171).
ROCM_NUM_WARPS = 8
ROCM_KEY_SLICE = 16
ROCM_GEMV_BLOCK = 128
ROCM_MMA_SPLIT = MMA_SPLIT
# Tensor-core GEMV blocks read their activations as bf16 values their producer dequantized once
# (xq, norm, combine, wo_a's last part: exact, an e4m3 value times a power of two) instead of
# loading values and codes and dequantizing them in every K step. An A/B choice for the H200
# (dsv41 bench --tokens 8,16,32,48 --variant mono:a_dequantized=1); off until timed.
A_DEQUANTIZED = False


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Every launch choice of one mono step (``Plan.tiling`` turns them into constexprs)."""

    gemv_block: int  # K columns a GEMV step covers at most: a power of two 32 .. 1024
    gemv_cores: bool  # GEMV blocks multiplied on CUDA cores (else tensor cores)
    gemv_words: bool  # CUDA-core weight blocks held as int32 words (with gemv_cores only)
    gemv_pairs: bool  # one token's wq_b / wo_b tasks two at once (with gemv_words, 1 token)
    mma_split: int | None  # K segments of a tensor-core block (1, 2, 4, 8); None: the plan picks
    woa_parts: int  # K parts of a wo_a task: 1, 2, 4 or 8
    key_chunk: int  # keys of an attention task, at most (the plan takes <= keys / 2)
    key_slice: int  # keys an attention task holds in registers at once: a power of two >= 16
    num_warps: int  # warps of a program: 4, 8 or 16
    a_dequantized: bool  # tensor-core GEMVs read bf16 activations dequantized by their producer

    def __post_init__(self):
        pow2 = lambda v: v > 0 and v & (v - 1) == 0  # noqa: E731
        checks = {
            "gemv_block": (32 <= self.gemv_block <= 1024 and pow2(self.gemv_block),
                           "a power of two 32 .. 1024"),
            "gemv_words": (self.gemv_cores or not self.gemv_words, "False on tensor cores"),
            "gemv_pairs": (self.gemv_words or not self.gemv_pairs, "False without gemv_words"),
            "a_dequantized": (not (self.gemv_cores and self.a_dequantized),
                              "False with gemv_cores (tensor-core GEMV blocks read it)"),
            "mma_split": (self.mma_split in (None, 1, 2, 4, 8), "None, 1, 2, 4 or 8"),
            "woa_parts": (self.woa_parts in (1, 2, 4, 8), "1, 2, 4 or 8"),
            "key_chunk": (pow2(self.key_chunk), "a power of two"),
            "key_slice": (self.key_slice >= 16 and pow2(self.key_slice), "a power of two >= 16"),
            "num_warps": (self.num_warps in (4, 8, 16), "4, 8 or 16"),
        }  # fmt: skip
        for name, (ok, expected) in checks.items():
            if not ok:
                raise ValueError(
                    f"mono Tuning.{name}: expected {expected}, got {getattr(self, name)}"
                )

    def rows(self) -> list[tuple[str, str]]:
        """``(name, value)`` lines for ``dsv41 plan``."""
        return [(f.name, str(getattr(self, f.name))) for f in dataclasses.fields(self)]


def resolve(dims: Dims, tokens: int, platform: Platform | None = None, **changes) -> Tuning:
    """The measured choices for a step of ``tokens`` tokens at ``dims`` (the same at both tp
    shares today) on ``platform`` (None: ``current_platform()``; ROCm takes the ``ROCM_*``
    tiles), with ``changes`` (Tuning fields) applied."""
    rocm = (platform or current_platform()).kind == "rocm"
    cores = tokens <= CORES_TOKENS
    words = lambda cores: cores and not (rocm and tokens > 1)  # noqa: E731
    deq = lambda cores: A_DEQUANTIZED and not cores  # noqa: E731
    base = Tuning(
        gemv_block=GEMV_BLOCK_FEW if tokens <= FEW_TOKENS else GEMV_BLOCK,
        gemv_cores=cores,
        gemv_words=words(cores),
        gemv_pairs=PAIRS and tokens == 1 and cores,
        mma_split=1 if cores else None,
        woa_parts=WOA_K_PARTS,
        key_chunk=KEY_CHUNK,
        key_slice=KEY_SLICE,
        num_warps=NUM_WARPS,
        a_dequantized=deq(cores),
    )
    if rocm:
        slice_ = ROCM_KEY_SLICE if tokens <= FEW_TOKENS else KEY_SLICE
        base = dataclasses.replace(base, gemv_block=ROCM_GEMV_BLOCK, key_slice=slice_,
                                   num_warps=ROCM_NUM_WARPS,
                                   mma_split=1 if cores else ROCM_MMA_SPLIT)
    if "gemv_cores" in changes:  # words, pairs, the split and a_dequantized follow the loop
        cores = changes["gemv_cores"]  # unless given
        changes = {"gemv_words": words(cores), "mma_split": 1 if cores else None,
                   "a_dequantized": deq(cores), **changes}
        changes.setdefault("gemv_pairs", PAIRS and tokens == 1 and changes["gemv_words"])
    elif "gemv_words" in changes:
        changes.setdefault("gemv_pairs", PAIRS and tokens == 1 and changes["gemv_words"])
    return dataclasses.replace(base, **changes)


def k_block(k: int, block: int) -> int:
    """The K block of a GEMV over ``k`` columns: the largest power of two dividing k, at most
    ``block`` (``Tuning.gemv_block``)."""
    return min(block, k & -k)


def tail_k_block(k: int, block: int) -> int:
    """The K block of a GEMV whose last block may be partial (the kernel masks it): ``block``,
    at most the power of two >= k. wq_b's 1280 columns run in blocks of 512, 512 and 256
    instead of five blocks of 256."""
    return min(block, 1 << (k - 1).bit_length())
