"""The mono kernel's schedule and scratch: task tables and the front / back regions (docs/design.md
§6).

One persistent launch runs a layer step as a list of stages, each a table of
tasks. A program takes tickets from a global atomic counter; ticket ``t``
names task ``t - stage.first`` of the stage whose range holds it. Stages are
numbered in dependency order and a task waits only on mailboxes that tasks of
*earlier* stages fill, so every wait points to a smaller ticket: a ticket is
only ever held by a running program, hence no deadlock when programs are not
co-resident, and the Triton interpreter (programs one after another) finishes.

=========  =====================================  ============================================
stage      tasks (ticket-local index ``i``)      waits on
=========  =====================================  ============================================
xq         ``half, block = divmod(i, B)``        nothing
           (B = hidden / 2 / k_block): MXFP8 of
           one block of x's columns
wqkv       ``half = i // T, tile = i % T``        xrdy[0] (every xq task, both halves:
           (T = qkv_rows / 16): 16 rows, one K    see "Cache lines" below)
           half -> fp32 partial in qkvp[half]
norm       token ``s = i``: both norms, KV RoPE,  xrdy[1] (every wqkv task)
           record insert, MXFP8 of qr
wqb        16 fused-Q rows ``16 i ..``: chunk     qrdy[0] (every norm task)
           ``c = i // heads``, head ``i % heads``
           + q RoPE on chunks >= nope / 16
attn       ``(s, tile, chunk)`` s-major: keys     qrdy[0] (records inserted), qrdy[1 + tile]
           ``chunk * key_chunk ..`` of token s    (every wqb task of the tile's heads)
           for 16 heads -> fp32 part + (max,sum)
combine    ``(s, tile, part)`` s-major: dims      srdy[s, tile] (every chunk)
           ``128 part ..`` of 16 heads: merge the
           chunks, sink, inverse RoPE, MXFP8 -> xo
woa        ``block, part = divmod(i, P)``: 32      crdy[tile of the group] (every token, part)
           rows ``32 block ..`` of group
           ``32 block // o_rank``, K part ``part``
           of P (``Plan.woa_parts``) -> fp32
           partial in woap[part]; the block's
           last part to arrive at wrdy[block]
           sums the P partials in part order
           -> z, MXFP8 z in x8b (P = 1: no woap)
wob        16 rows ``16 i ..`` of y               ardy[0] (every woa row block)
=========  =====================================  ============================================

Hand-offs are 8-byte mailboxes ``(count, tag)`` of int32 in the ``*rdy``
regions. A producer finishes a task with a CTA barrier, then an acq_rel
``atomic_add(count, 1)``; the one that brings the count to the mailbox's
arrivals resets it to 0 and publishes ``atomic_xchg(tag, epoch, release)``. A
consumer spins on ``atomic_add(tag, 0, acquire) == epoch``. The epoch is a
device word that the last program to finish advances, so a mailbox holds the
previous step's tag until its producers are done: nothing is cleared between
steps, equality is the only test (wrap-around is harmless) and every kernel
argument is a fixed pointer. Scratch is created with counts 0 and tags
``epoch - 1``.

Cache lines: a consumer may read a whole 128-B line, not just its bytes (when
Triton pipelines a GEMV's 4-byte loads of E8M0 codes into ``cp.async`` copies,
those are ``.ca``, filling L1, whatever cache modifier the load asked for: only
16-byte copies can be ``.cg``), and a line it read stays in its SM's L1 for
later tasks. So a wait must cover every producer of every line a
task reads, not only of the bytes it uses. x8s's rows (hidden / 32 codes)
put the two K halves' codes in one line, so Wqkv waits on all of x8, not on
its half. ``tests/amd/test_mono_handoffs.py`` checks this for every region.

Regions (byte offsets into one uint8 scratch, 256-B aligned, total rounded to
4096): ``ctl`` (ticket, finished programs, epoch, error word), then the front
``x8, x8s, xrdy, qkvp, qx8, qx8s, qrdy, q`` and the back ``part, pstat, srdy,
xo, xos, crdy, x8b, x8bs, ardy, z, woap, wrdy``. Regions beyond docs/design.md §6's
list: ``q``, the bf16 post-RoPE q in the fused Q layout that wqb writes and attn
reads; ``z``, the bf16 z that woa also keeps for the z seam (x8b / x8bs are
what wob reads); ``woap`` and ``wrdy``, wo_a's fp32 K-part partials and the
mailboxes that count them. The last arrival at a ``wrdy`` mailbox (an acq_rel
count) is the task that sums the block's partials; the tag it also publishes
is waited on by no one.

With ``Tuning.a_dequantized`` four more regions follow the back, ``DEQUANTIZED``: ``x8d,
qx8d, xod, x8bd``, bf16 in the layouts of ``x8, qx8, xo, x8b``, each that MXFP8 activation's
values dequantized (exact: an e4m3 value times a power of two). The task that writes the
MXFP8 form writes them before the same arrival, and the tensor-core GEMV that would read the
values and codes reads them instead, after the same wait. Without it they are not allocated.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from dsv41.common.geometry import HEAD_TILE, Dims
from dsv41.common.mx import MX_BLOCK
from dsv41.amd.mono.tuning import MMA_SPLIT, SPLIT_TOKENS, Tuning, k_block, resolve, tail_k_block

MONO_TP = (2, 4)  # ranks the mono kernel is built for
MAX_TOKENS = 48  # decode tokens a step at most
WQKV_TASK_ROWS = 16  # rows of a Wqkv task
WQB_TASK_ROWS = 16  # rows of a wq_b task
WOA_TASK_ROWS = 32  # rows of a wo_a task (one MX block of z's cast)
WOB_TASK_ROWS = 16  # rows of a wo_b task
K_HALVES = 2  # Wqkv's K dimension runs in two halves
MIN_KEY_CHUNK = 32  # keys of an attention task at least (one slice of the defaults)
MMA_MIN_K = 16  # the smallest K of a bf16 MMA: a K segment of _mma_split has at least this
COMBINE_PARTS = 4  # combine tasks a (token, head tile): 128 dims each, whole MX blocks
# (16 tasks of one MX block each were slower on the H200: 77.5 against 74.9 us at tp 4, M = 1.)
REGION_ALIGN = 256
SCRATCH_ALIGN = 4096
MAILBOX_WORDS = 2  # (count, tag) int32
CTL_WORDS = 4  # ticket, finished, epoch, error
CTL_TICKET, CTL_FINISHED, CTL_EPOCH, CTL_ERROR = range(CTL_WORDS)
STAGES = ("xq", "wqkv", "norm", "wqb", "attn", "combine", "woa", "wob")

FRONT = ("x8", "x8s", "xrdy", "qkvp", "qx8", "qx8s", "qrdy", "q")
BACK = ("part", "pstat", "srdy", "xo", "xos", "crdy", "x8b", "x8bs", "ardy", "z", "woap", "wrdy")
DEQUANTIZED = ("x8d", "qx8d", "xod", "x8bd")  # with Tuning.a_dequantized: bf16 x8, qx8, xo, x8b
E4M3 = torch.float8_e4m3fn
# Attention partials are fp32, not bf16: a bf16 partial is a second rounding of o before
# the contract's one (bf16 o, then MXFP8), and at the tiny geometry it flipped 1.6 % of
# xo's e4m3 values and put y 1.8e-2 (relative) off the reference, over the 1e-2 budget.
PARTIAL_DTYPE = torch.float32


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


@dataclasses.dataclass(frozen=True)
class Region:
    name: str
    offset: int  # bytes from the scratch start
    shape: tuple[int, ...]  # sized for the plan's capacity of tokens
    dtype: torch.dtype
    token_dim: int | None  # the dim that runs over tokens, if any

    @property
    def nbytes(self) -> int:
        """Bytes the region's data takes (before alignment)."""
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def view(self, scratch: torch.Tensor, tokens: int | None = None) -> torch.Tensor:
        """The region as a typed tensor over ``scratch`` (uint8 [size]); with ``tokens``, only
        the rows of the first ``tokens`` tokens (same start, so the same kernel pointer)."""
        t = scratch[self.offset : self.end].view(self.dtype).view(self.shape)
        if tokens is None or self.token_dim is None:
            return t
        return t.narrow(self.token_dim, 0, tokens)


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    first: int  # first ticket
    tasks: int

    @property
    def end(self) -> int:
        return self.first + self.tasks


@dataclasses.dataclass(frozen=True)
class Plan:
    """Schedule of one rank's step of ``tokens`` tokens, in a scratch laid out for ``capacity``.

    The task tables depend on ``tokens``; the scratch layout only on ``capacity``
    (0: ``tokens``), so plans of every token count up to a capacity share one
    scratch: a region's token rows past ``tokens`` are simply not touched.
    """

    dims: Dims
    tokens: int
    # 0: min(tuning.key_chunk, keys / 2), so every token has two chunks to merge
    key_chunk: int = 0
    capacity: int = 0
    woa_parts: int = 0  # 0: tuning.woa_parts
    tuning: Tuning | None = None  # None: resolve(dims, tokens), the measured choices

    def __post_init__(self):
        m = self.dims.model
        if self.tuning is None:
            object.__setattr__(self, "tuning", resolve(self.dims, self.tokens))
        if self.woa_parts == 0:
            object.__setattr__(self, "woa_parts", self.tuning.woa_parts)
        parts = self.woa_parts
        if parts not in (1, 2, 4, 8) or self.dims.group_k % (parts * MX_BLOCK):
            raise ValueError(
                f"woa_parts: expected 1, 2, 4 or 8 parts of whole MX blocks of group_k = "
                f"{self.dims.group_k}, got {parts}"
            )
        if self.dims.tp not in MONO_TP:
            raise ValueError(
                f"tp: expected one of {MONO_TP} for the mono kernel, got {self.dims.tp}"
            )
        if not 1 <= self.tokens <= MAX_TOKENS:
            raise ValueError(
                f"tokens: expected 1 <= tokens <= {MAX_TOKENS} for the mono kernel, "
                f"got {self.tokens}"
            )
        if self.capacity == 0:
            object.__setattr__(self, "capacity", self.tokens)
        if not self.tokens <= self.capacity <= MAX_TOKENS:
            raise ValueError(
                f"capacity: expected tokens ({self.tokens}) <= capacity <= {MAX_TOKENS}, "
                f"got {self.capacity}"
            )
        if self.key_chunk == 0:
            object.__setattr__(self, "key_chunk", min(self.tuning.key_chunk, m.keys // 2))
        kc = self.key_chunk
        if kc < MIN_KEY_CHUNK or kc & (kc - 1) or m.keys % kc:
            raise ValueError(
                f"key_chunk: expected a power of two >= {MIN_KEY_CHUNK} dividing keys = "
                f"{m.keys}, got {kc}"
            )
        if m.qkv_rows % WQKV_TASK_ROWS or (m.hidden // K_HALVES) % MX_BLOCK:
            raise ValueError(f"model {m.name!r}: qkv_rows / hidden do not split into mono tasks")

    # -- geometry ---------------------------------------------------------------

    @property
    def token_block(self) -> int:
        """Token rows a GEMV tile carries: the next power of two >= tokens, at least 16 (the
        smallest MMA) unless the GEMV runs on CUDA cores (64 at 48 tokens, 1 at 1)."""
        rows = 1 << (self.tokens - 1).bit_length()
        return rows if self.tiling["GEMV_CORES"] else max(16, rows)

    @functools.cached_property
    def tiling(self) -> dict[str, int | bool]:
        """The kernel's GEMV constexprs for this plan: the K block of each GEMV (``BK_X`` a
        Wqkv K half and an xq task, ``BK_QR`` wq_b, ``BK_GK`` a wo_a K part, ``BK_OR`` wo_b),
        ``A_DEQ``, ``GEMV_CORES``, ``GEMV_WORDS``, ``GEMV_PAIRS`` and ``MMA_SPLIT``, from the
        plan's ``tuning``, so the task tables and the launches built from one plan always
        agree."""
        m, d, t = self.dims.model, self.dims, self.tuning
        blocks = {
            "BK_X": k_block(m.hidden // K_HALVES, t.gemv_block),
            "BK_QR": tail_k_block(m.q_rank, t.gemv_block),
            "BK_GK": k_block(d.group_k // self.woa_parts, t.gemv_block),
            "BK_OR": k_block(d.o_rows, t.gemv_block),
        }
        split = t.mma_split
        if split is None:  # as many segments as the smallest K block allows, MMA_SPLIT at most
            most = MMA_SPLIT if self.tokens <= SPLIT_TOKENS else 1
            split = max(1, min(most, min(blocks.values()) // MMA_MIN_K))
        elif split > 1 and min(blocks.values()) // split < MMA_MIN_K:
            raise ValueError(
                f"mono Tuning.mma_split: expected K segments of >= {MMA_MIN_K} columns, got "
                f"{split} segments of the K blocks {blocks}"
            )
        return blocks | {
            "A_DEQ": t.a_dequantized,
            "GEMV_CORES": t.gemv_cores,
            "GEMV_WORDS": t.gemv_words,
            "GEMV_PAIRS": t.gemv_pairs,
            "MMA_SPLIT": split,
        }

    @property
    def key_slice(self) -> int:
        """Keys an attention task holds in registers at once: the tuning's, at most the chunk."""
        return min(self.tuning.key_slice, self.key_chunk)

    @property
    def xq_blocks(self) -> int:
        """xq tasks a K half: hidden / 2 / BK_X (dsv41-flash: 5 up to 16 tokens, 10 above)."""
        return self.dims.model.hidden // K_HALVES // self.tiling["BK_X"]

    @property
    def chunks(self) -> int:
        """Key chunks a token's keys split into: keys / key_chunk (10)."""
        return self.dims.model.keys // self.key_chunk

    @property
    def head_tiles(self) -> int:
        return self.dims.head_tiles

    @property
    def heads_padded(self) -> int:
        """Heads rounded up to whole tiles: head_tiles * 16 (16)."""
        return self.head_tiles * HEAD_TILE

    @property
    def wqkv_tiles(self) -> int:
        """16-row tiles of Wqkv: qkv_rows / 16 (112)."""
        return self.dims.model.qkv_rows // WQKV_TASK_ROWS

    @property
    def wqb_tasks(self) -> int:
        """wq_b tasks of 16 rows: q_rows / 16 (512)."""
        return self.dims.q_rows // WQB_TASK_ROWS

    @property
    def woa_blocks(self) -> int:
        """wo_a row blocks of 32 rows: o_rows / 32 (64); each runs in ``woa_parts`` tasks."""
        return self.dims.o_rows // WOA_TASK_ROWS

    @property
    def wob_tasks(self) -> int:
        """wo_b tasks of 16 rows: hidden / 16 (320)."""
        return self.dims.model.hidden // WOB_TASK_ROWS

    @functools.cached_property
    def stages(self) -> tuple[Stage, ...]:
        d, s = self.dims, self.tokens
        counts = {
            "xq": K_HALVES * self.xq_blocks,
            "wqkv": K_HALVES * self.wqkv_tiles,
            "norm": s,
            "wqb": self.wqb_tasks,
            "attn": s * self.head_tiles * self.chunks,
            "combine": s * self.head_tiles * COMBINE_PARTS,
            "woa": self.woa_blocks * self.woa_parts,
            "wob": self.wob_tasks,
        }
        out, first = [], 0
        for name in STAGES:
            out.append(Stage(name, first, counts[name]))
            first += counts[name]
        return tuple(out)

    def stage(self, name: str) -> Stage:
        return self.stages[STAGES.index(name)]

    @property
    def total_tasks(self) -> int:
        return self.stages[-1].end

    def task_coords(self, name: str, i: int) -> tuple[int, ...]:
        """Coordinates of task ``i`` of a stage, as the kernel decodes them (module table)."""
        d, tiles, chunks = self.dims, self.head_tiles, self.chunks
        if name == "xq":
            return divmod(i, self.xq_blocks)  # (half, block)
        if name == "wqkv":
            return divmod(i, self.wqkv_tiles)  # (half, tile)
        if name == "wqb":
            return divmod(i, d.heads)  # (chunk, head)
        if name == "attn":
            return i // (tiles * chunks), (i // chunks) % tiles, i % chunks  # (s, tile, chunk)
        if name == "combine":
            return i // (tiles * COMBINE_PARTS), (i // COMBINE_PARTS) % tiles, i % COMBINE_PARTS
        if name == "woa":
            return divmod(i, self.woa_parts)  # (row block, K part)
        return (i,)

    # -- mailboxes -----------------------------------------------------------------

    @property
    def mailboxes(self) -> dict[str, int]:
        """Mailboxes of each ``*rdy`` region."""
        return {
            "xrdy": 2,  # "every xq task", then "every wqkv task"
            "qrdy": 1 + self.head_tiles,  # "every norm task", then wqb per head tile
            "srdy": self.capacity * self.head_tiles,  # attn per (token, tile)
            "crdy": self.head_tiles,  # combine per tile, over tokens and parts
            "ardy": 1,  # every woa row block
            "wrdy": self.woa_blocks,  # the K parts of each woa row block
        }

    # -- scratch -------------------------------------------------------------------

    @functools.cached_property
    def regions(self) -> dict[str, Region]:
        d, m, s = self.dims, self.dims.model, self.capacity
        box = self.mailboxes
        shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "ctl": ((CTL_WORDS,), torch.int32),
            "x8": ((s, m.hidden), E4M3),
            "x8s": ((s, m.hidden // MX_BLOCK), torch.uint8),
            "xrdy": ((box["xrdy"], MAILBOX_WORDS), torch.int32),
            "qkvp": ((K_HALVES, s, m.qkv_rows), torch.float32),
            "qx8": ((s, m.q_rank), E4M3),
            "qx8s": ((s, m.q_rank // MX_BLOCK), torch.uint8),
            "qrdy": ((box["qrdy"], MAILBOX_WORDS), torch.int32),
            "q": ((s, d.q_rows), torch.bfloat16),
            "part": ((s, self.chunks, self.heads_padded, m.head_dim), PARTIAL_DTYPE),
            "pstat": ((s, self.chunks, self.heads_padded, 2), torch.float32),
            "srdy": ((box["srdy"], MAILBOX_WORDS), torch.int32),
            "xo": ((s, d.q_rows), E4M3),
            "xos": ((s, d.q_rows // MX_BLOCK), torch.uint8),
            "crdy": ((box["crdy"], MAILBOX_WORDS), torch.int32),
            "x8b": ((s, d.o_rows), E4M3),
            "x8bs": ((s, d.o_rows // MX_BLOCK), torch.uint8),
            "ardy": ((box["ardy"], MAILBOX_WORDS), torch.int32),
            "z": ((s, d.o_rows), torch.bfloat16),
            "woap": ((self.woa_parts, s, d.o_rows), torch.float32),
            "wrdy": ((box["wrdy"], MAILBOX_WORDS), torch.int32),
            "x8d": ((s, m.hidden), torch.bfloat16),
            "qx8d": ((s, m.q_rank), torch.bfloat16),
            "xod": ((s, d.q_rows), torch.bfloat16),
            "x8bd": ((s, d.o_rows), torch.bfloat16),
        }
        out, offset = {}, 0
        for name in ("ctl", *FRONT, *BACK, *(DEQUANTIZED if self.tuning.a_dequantized else ())):
            shape, dtype = shapes[name]
            mailboxes = name.endswith("rdy") or name == "ctl"
            token_dim = None if mailboxes else int(name in ("qkvp", "woap"))
            out[name] = Region(name, offset, shape, dtype, token_dim)
            offset = _round_up(out[name].end, REGION_ALIGN)
        return out

    def views(self, scratch: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every region of ``scratch`` as a typed view of this plan's tokens."""
        return {name: r.view(scratch, self.tokens) for name, r in self.regions.items()}

    @property
    def front_bytes(self) -> int:
        """Bytes up to the end of the front (ctl included), 256-B aligned."""
        return _round_up(self.regions[FRONT[-1]].end, REGION_ALIGN)

    @property
    def scratch_bytes(self) -> int:
        """The whole scratch, rounded up to 4096 B."""
        return _round_up(list(self.regions.values())[-1].end, SCRATCH_ALIGN)

    def new_scratch(self, device="cpu", epoch: int = 1) -> torch.Tensor:
        """Zeroed scratch with the epoch word set and every mailbox tag at ``epoch - 1``."""
        scratch = torch.zeros(self.scratch_bytes, dtype=torch.uint8, device=device)
        self.reset_control(scratch, epoch)
        return scratch

    def reset_control(self, scratch: torch.Tensor, epoch: int) -> None:
        """Counters, ticket and error to 0, epoch to ``epoch``, mailbox tags to ``epoch - 1``."""
        epoch = as_int32(epoch)
        ctl = self.regions["ctl"].view(scratch)
        ctl.zero_()
        ctl[CTL_EPOCH] = epoch
        for name in self.mailboxes:
            boxes = self.regions[name].view(scratch)
            boxes[:, 0] = 0
            boxes[:, 1] = as_int32(epoch - 1)


def as_int32(v: int) -> int:
    """``v`` wrapped into int32's range (the epoch is a wrapping int32)."""
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)
