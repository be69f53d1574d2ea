"""The NVIDIA backend's layer step: six launches, no host sync, no shuffle kernel (docs/design.md
§2, §6).

1. ``mx_gemm`` (A_CAST): ``qkv = mxfp8(x) @ Wqkv^T``, the cast of x in the prologue;
2. ``norm_rope_insert``: both RMSNorms, RoPE on kv, the record insert, ``qr8 = mxfp8(qr)``;
3. ``mx_gemm`` (A_MX): ``q = qr8 @ Wq_b^T``, already in the fused Q layout (wq_b's rows are).
   In the CUDA-core token buckets (M <= 2) wq_b normalises qr in its own prologue (A_NORM)
   and launch 2 (its kv half only) runs beside it on a side stream, joined before attention,
   so the norm kernel is off the step's critical path (``Tuning.norm_in_wq_b``). There wq_b's
   programs ask the L2 for the records attention reads next before their PDL wait, which
   makes attention's early key reads L2 hits;
4. ``mega_attention``: q RoPE, attention over the key table, sink, inverse RoPE, MXFP8 ->
   ``xo`` in the fused O layout;
5. ``mx_gemm`` grouped (A_MX, QUANT_OUT): ``z = xo @ Wo_a^T`` per group and ``z8 = mxfp8(z)``;
6. ``mx_gemm`` (A_MX): ``y = z8 @ Wo_b^T``, this rank's bf16 partial. At one token z is cast
   in wo_b's prologue instead (A_CAST, which stores z8), so wo_a takes whole rows
   (``Tuning.z_cast_in_wo_b``).

Each GEMM on the MMA loop (above the CUDA-core buckets) reads its activation as bf16 values its
producer dequantized once (``Dequantized``, A_DEQ): x by an ``mx_round`` launch before Wqkv, qr
by the norm kernel, xo by attention, z by wo_a's epilogue.

Every choice above (tiles, splits, PDL) is in the step's ``Tuning`` (``dsv41/nvidia/tuning.py``),
resolved once for the GPU, the tp share and the token bucket and passed to every launch.

Every launch takes device tensors only, so a step is capturable in one CUDA
graph: ``NvidiaStepRunner`` holds the inputs and outputs at fixed addresses,
captures a step and replays it. Split-K scratch is per runner and never freed
while a graph may use it.
"""

from __future__ import annotations

import dataclasses

import torch

from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.mx import E4M3, MX_BLOCK
from dsv41.common.rope import rope_tables
from dsv41.common.step_inputs import StepInputs, check_step_inputs
from dsv41.common.weights import LayerWeights
from dsv41.nvidia.ops.mega_attention import attention_tuning, mega_attention
from dsv41.nvidia.ops.mx_gemm import Dequantized, NormInput, Scratch, mx_gemm, scratch_for
from dsv41.nvidia.ops.mx_round import mx_round
from dsv41.nvidia.ops.norm_rope_insert import norm_rope_insert
from dsv41.nvidia.ops.record_prefetch import RecordsAhead
from dsv41.nvidia.tuning import GEMM_SITES, Tuning, tuning_for

STEP_SEAMS = ("qkv", "kv", "q", "xo", "lse", "z", "z8", "y")
@dataclasses.dataclass
class StepBuffers:
    """Outputs of the GEMM-side launches for up to ``rows`` tokens (attention allocates its own)."""

    qkv: torch.Tensor  # bf16 [rows, q_rank + kv_dim]
    kv: torch.Tensor  # bf16 [rows, 512]: normed, RoPE'd, inserted
    qr8: tuple[torch.Tensor, torch.Tensor]  # e4m3 [rows, q_rank], uint8 [rows, q_rank/32]
    # (written only where wq_b reads it: not where wq_b normalises qr itself)
    q: torch.Tensor  # bf16 [rows, heads*512], fused Q layout, before RoPE
    z: torch.Tensor  # bf16 [rows, groups*o_rank]
    z8: tuple[
        torch.Tensor, torch.Tensor
    ]  # e4m3 [rows, groups*o_rank], uint8 [rows, groups*o_rank/32]
    y: torch.Tensor  # bf16 [rows, hidden]
    # The MMA loops' activations dequantized (Tuning.dequantized): x, qr, xo (fused O), z
    xd: torch.Tensor  # bf16 [rows, hidden]
    qrd: torch.Tensor  # bf16 [rows, q_rank]
    xod: torch.Tensor  # bf16 [rows, heads*512]
    zd: torch.Tensor  # bf16 [rows, groups*o_rank]

    @classmethod
    def allocate(cls, layer: LayerWeights, rows: int, device) -> StepBuffers:
        m, d = layer.dims.model, layer.dims

        def t(cols: int, dtype=torch.bfloat16) -> torch.Tensor:
            return torch.empty(rows, cols, dtype=dtype, device=device)

        return cls(
            qkv=t(m.qkv_rows),
            kv=t(m.kv_dim),
            qr8=(t(m.q_rank, E4M3), t(m.q_rank // MX_BLOCK, torch.uint8)),
            q=t(d.q_rows),
            z=t(d.o_rows),
            z8=(t(d.o_rows, E4M3), t(d.o_rows // MX_BLOCK, torch.uint8)),
            y=t(m.hidden),
            xd=t(m.hidden),
            qrd=t(m.q_rank),
            xod=t(d.q_rows),
            zd=t(d.o_rows),
        )

    def rows(self, m: int) -> StepBuffers:
        """Views of the first ``m`` rows of every buffer."""

        def head(v):
            return tuple(t[:m] for t in v) if isinstance(v, tuple) else v[:m]

        return StepBuffers(**{f.name: head(getattr(self, f.name)) for f in dataclasses.fields(self)})


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def launch_step(
    layer: LayerWeights,
    inputs: StepInputs,
    out: StepBuffers,
    scratch: dict[str, Scratch],
    tuning: Tuning | None = None,
) -> dict:
    """Enqueue one step into ``out`` (rows = M) as ``tuning`` says (None: ``tuning_for`` its
    M); returns the seams (views, no sync)."""
    x, positions, slot_mapping, key_table = (
        inputs.x, inputs.positions, inputs.slot_mapping, inputs.key_table,
    )  # fmt: skip
    window_cache, compressed_cache = inputs.window_cache, inputs.compressed_cache
    t = tuning or tuning_for(layer.dims, x.device, x.shape[0])
    model = layer.dims.model
    cos, sin = rope_tables(model, layer.layer_id, x.device)
    a = x
    if t.dequantized("wqkv"):
        a = Dequantized(mx_round(x, out.xd, pdl=t.pdl))
    mx_gemm(a, layer.wqkv, layer.wqkv_scale, out=out.qkv, scratch=scratch["wqkv"],
            config=t.wqkv, pdl=t.pdl)  # fmt: skip

    def norm(qr8, qr_deq=None) -> None:
        norm_rope_insert(
            out.qkv, layer.q_norm, layer.kv_norm, positions, slot_mapping, window_cache, cos, sin,
            eps=model.eps, nope=model.nope_dim, kv=out.kv, qr8=qr8, qr_deq=qr_deq, pdl=t.pdl,
        )  # fmt: skip

    side = None  # the side stream the norm kernel ran on, if any
    if t.norm_in_wq_b:  # the norm kernel's kv half only
        main = None
        if x.is_cuda:
            main = torch.cuda.current_stream(x.device)
            if x.device not in _SIDE_STREAMS:
                _SIDE_STREAMS[x.device] = torch.cuda.Stream(x.device)
            side = _SIDE_STREAMS[x.device]
        if side is not None:  # attention starts when it ends
            side.wait_stream(main)
            with torch.cuda.stream(side):
                norm(None)
        else:
            norm(None)
        qr = NormInput(out.qkv[:, : model.q_rank], layer.q_norm, model.eps)
        ahead = RecordsAhead(key_table, window_cache, compressed_cache)  # for wq_b's programs
        mx_gemm(qr, layer.wq_b, layer.wq_b_scale, out=out.q, scratch=scratch["wq_b"],
                records=ahead, config=t.wq_b, pdl=t.pdl)  # fmt: skip
        if side is not None:
            main.wait_stream(side)  # attention reads the inserted records
    else:
        deq = t.dequantized("wq_b")
        norm(out.qr8, out.qrd if deq else None)
        mx_gemm(Dequantized(out.qrd) if deq else out.qr8, layer.wq_b, layer.wq_b_scale, out=out.q,
                scratch=scratch["wq_b"], config=t.wq_b, pdl=t.pdl)  # fmt: skip
    attention = t.attention
    if key_table.shape[1] != model.keys:  # a key table of another width: split it as it is
        attention = attention_tuning(t.bucket, layer.dims.heads, key_table.shape[1], t.sms)
    xo, xo_codes, lse = mega_attention(
        out.q,
        positions,
        key_table,
        window_cache,
        compressed_cache,
        layer.attn_sink,
        cos,
        sin,
        softmax_scale=model.softmax_scale,
        heads_per_group=model.heads_per_group,
        records_ready=side is not None,  # the insert joined by an event, not a PDL edge
        tuning=attention,
        pdl=t.pdl,
        xo_deq=out.xod if t.dequantized("wo_a") else None,
    )
    if t.z_cast_in_wo_b:
        mx_gemm((xo, xo_codes), layer.wo_a, layer.wo_a_scale, out=out.z,
                n_per_group=model.o_rank, scratch=scratch["wo_a"], config=t.wo_a,
                pdl=t.pdl)  # fmt: skip
        mx_gemm(out.z, layer.wo_b, layer.wo_b_scale, out=out.y, a8_out=out.z8,
                scratch=scratch["wo_b"], config=t.wo_b, pdl=t.pdl)  # fmt: skip
    else:
        xa = Dequantized(out.xod) if t.dequantized("wo_a") else (xo, xo_codes)
        deq = t.dequantized("wo_b")
        mx_gemm(xa, layer.wo_a, layer.wo_a_scale, out=out.z, out8=out.z8,
                out_deq=out.zd if deq else None, n_per_group=model.o_rank, scratch=scratch["wo_a"],
                config=t.wo_a, pdl=t.pdl)  # fmt: skip
        mx_gemm(Dequantized(out.zd) if deq else out.z8, layer.wo_b, layer.wo_b_scale, out=out.y,
                scratch=scratch["wo_b"], config=t.wo_b, pdl=t.pdl)  # fmt: skip
    return {
        "qkv": out.qkv,
        "kv": out.kv,
        "q": out.q,
        "xo": (xo, xo_codes),
        "lse": lse,
        "z": out.z,
        "z8": out.z8,
        "y": out.y,
    }


def nvidia_step(
    layer: LayerWeights, inputs: StepInputs, *, check: bool = True, tuning: Tuning | None = None
) -> dict:
    """One decode step of one rank; inserts the new records into ``window_cache``.

    Same arguments as ``reference_step``: ``x`` bf16 [M, hidden]; ``positions``
    and ``slot_mapping`` [M] int (window-cache slots of the new tokens);
    ``key_table`` int32 [M, KEYS] (``slot | 1 << 31`` compressed row, window
    slot otherwise, -1 or out-of-cache = none). Returns the seams
    ``qkv, kv, q`` (fused, before RoPE), ``xo`` (values, codes; fused O layout),
    ``lse, z, z8`` (values, codes) and ``y`` (this rank's bf16 partial).
    ``check=False`` skips the argument check, for a caller that has just made it;
    ``tuning`` (None: ``tuning_for`` its M) says how each launch runs.
    """
    if check:
        check_step_inputs(layer, inputs)
    out = StepBuffers.allocate(layer, inputs.tokens, inputs.x.device)
    scratch = {site: scratch_for(site) for site in GEMM_SITES}
    return launch_step(layer, inputs, out, scratch, tuning)


def nvidia_forward(layer: LayerWeights, inputs: StepInputs) -> torch.Tensor:
    """The server path: ``nvidia_step``'s y, the inputs already checked by the caller."""
    return nvidia_step(layer, inputs, check=False)["y"]


class NvidiaStepRunner:
    """A layer step at fixed addresses for CUDA graphs: static inputs, preallocated outputs.

    ``capture(...)`` copies the inputs into the runner's buffers, runs one eager
    step (compiles kernels, sizes scratch) and captures the next into a graph;
    ``replay(...)`` optionally copies new inputs of the same M and replays.
    The caches are captured by address: a replay reads and writes the same ones.
    """

    def __init__(self, layer: LayerWeights, max_tokens: int):
        model = layer.dims.model
        dev = layer.wqkv.device
        self.layer, self.max_tokens = layer, max_tokens
        self.x = torch.zeros(max_tokens, model.hidden, dtype=torch.bfloat16, device=dev)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self.key_table = torch.full((max_tokens, model.keys), -1, dtype=torch.int32, device=dev)
        self.buffers = StepBuffers.allocate(layer, max_tokens, dev)
        self.scratch = {site: Scratch() for site in GEMM_SITES}
        self.graph: torch.cuda.CUDAGraph | None = None
        self.m = 0
        self.outputs: dict = {}

    def load(self, inputs: StepInputs) -> int:
        """Copy a step's tensors into the static buffers; returns M."""
        m = inputs.tokens
        if not 1 <= m <= self.max_tokens:
            raise ValueError(f"x: expected 1 <= M <= max_tokens = {self.max_tokens}, got {m}")
        if inputs.key_table.shape[1] != self.key_table.shape[1]:
            raise ValueError(
                f"key_table: expected [M, {self.key_table.shape[1]}], "
                f"got {list(inputs.key_table.shape)}"
            )
        self.x[:m].copy_(inputs.x)
        self.positions[:m].copy_(inputs.positions)
        self.slot_mapping[:m].copy_(inputs.slot_mapping)
        self.key_table[:m].copy_(inputs.key_table)
        return m

    def run(
        self, m: int, window_cache: PagedKVCache, compressed_cache: PagedKVCache | None
    ) -> dict:
        """Enqueue one step over the first ``m`` rows of the static inputs."""
        inputs = StepInputs(
            self.x[:m], self.positions[:m], self.slot_mapping[:m], self.key_table[:m],
            window_cache, compressed_cache,
        )  # fmt: skip
        return launch_step(self.layer, inputs, self.buffers.rows(m), self.scratch)

    def capture(self, inputs: StepInputs) -> dict:
        """Capture one step of these inputs' M in a CUDA graph; returns its fixed-address seams."""
        check_step_inputs(self.layer, inputs)
        self.m = self.load(inputs)
        caches = inputs.window_cache, inputs.compressed_cache
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.run(self.m, *caches)  # compile, size the scratch
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = self.run(self.m, *caches)
        return self.outputs

    def replay(self, inputs: StepInputs | None = None) -> dict:
        """Replay the captured step, after copying new inputs of the captured M when given (their
        caches must be the captured ones: the graph holds their addresses)."""
        if self.graph is None:
            raise RuntimeError("replay: nothing captured yet (call capture first)")
        if inputs is not None:
            if inputs.tokens != self.m:
                raise ValueError(
                    f"x: expected the captured M = {self.m} tokens, got {inputs.tokens}"
                )
            self.load(inputs)
        self.graph.replay()
        return self.outputs
