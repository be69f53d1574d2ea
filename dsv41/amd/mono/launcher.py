"""Launching the mono kernel: runners per (layer, tokens) over a persistent scratch, seams.

``MonoRunner`` holds one plan's scratch (allocated once, never cleared: the
device-side epoch tags each step's hand-offs) and launches the kernel with
pointers that never change, so ``launch`` can be captured in a CUDA/HIP graph
and replayed. ``mono_step`` is the one-call entry point: it keeps a runner per
(layer, tokens), validates the inputs (docs/design.md §4) when asked, launches, raises
``MonoError`` if a hand-off timed out (never a silent hang), and returns the
step's output with the intermediates the scratch holds.

Those runners share one scratch per (device, geometry), laid out for 48
tokens: a step's scratch is dead once its launch ends and the epoch keeps
successive launches apart, so the steps of every layer and token count run one
after another on a stream can share it (37 MB at the tp 2 share, 19 MB at tp
4). Two streams must not run mono steps of one geometry at once.

Seams returned by ``mono_step`` (all copies, standard row = token):

======  ================================================================
y       bf16 [S, hidden]: this rank's partial of the layer output
x8      (e4m3 [S, hidden], uint8 [S, hidden / 32]): MXFP8 of x
qkv     bf16 [S, q_rank + kv_dim]: ``bf16(p0 + p1)`` of the two K halves
q       bf16 [S, heads, 512]: q **after** RoPE, standard layout (the scratch's
        fused q un-fused)
xo      (e4m3 [S, heads * 512], uint8 [S, heads * 16]): MXFP8 o, fused O layout
z       bf16 [S, o_rows]: z, groups side by side
z8      (e4m3 [S, o_rows], uint8 [S, o_rows / 32]): MXFP8 of z (what wo_b reads)
======  ================================================================
"""

from __future__ import annotations

import weakref

import torch

from dsv41.amd.mono.kernel import mono_kernel
from dsv41.amd.mono.plan import CTL_EPOCH, CTL_ERROR, DEQUANTIZED, MAX_TOKENS, Plan
from dsv41.amd.mono.tuning import Tuning
from dsv41.common import switches
from dsv41.common.fused_layout import permute_q_from_fused
from dsv41.common.kv_cache import FP8_DS_MLA, validate_key_table
from dsv41.common.platform import current_platform
from dsv41.common.rope import rope_tables
from dsv41.common.step_inputs import StepInputs, check_step_inputs
from dsv41.common.weights import LayerWeights

INTERPRETER_PROGRAMS = 4  # programs of the persistent grid under the Triton interpreter
SPIN_LIMIT_GPU = 1 << 20  # polls before a wait gives up (about a second)
SPIN_LIMIT_INTERPRETER = 16  # tickets run in order there: a wait never needs a second poll


class MonoError(RuntimeError):
    """A mono launch posted an error (a hand-off timed out) or was given bad inputs."""


def _interpreted() -> bool:
    return switches.interpreting()


_SHARED_SCRATCH: dict[tuple, torch.Tensor] = {}


class MonoRunner:
    """One rank's mono step for ``tokens`` tokens: a plan, its persistent scratch, the launch."""

    def __init__(
        self,
        layer: LayerWeights,
        tokens: int,
        *,
        programs: int | None = None,
        epoch: int = 1,
        key_chunk: int = 0,
        spin_limit: int | None = None,
        shared: bool = False,
        tuning: Tuning | None = None,
    ):
        """``shared``: use the scratch pooled for this geometry (laid out for MAX_TOKENS;
        ``epoch`` applies only if the pool creates it); otherwise a private scratch for
        ``tokens`` starting at ``epoch``. ``tuning``: the launch choices (None: the measured
        ones for ``tokens``, ``tuning.resolve``), fixed for the runner's life."""
        self.layer = layer
        capacity = MAX_TOKENS if shared else tokens
        self.plan = Plan(layer.dims, tokens, key_chunk, capacity, tuning=tuning)
        self.device = layer.wqkv.device
        if shared:
            key = (str(self.device), self.plan.dims, self.plan.key_chunk, self.plan.woa_parts,
                   self.plan.tuning.a_dequantized)  # a_dequantized: four regions more
            if key not in _SHARED_SCRATCH:
                _SHARED_SCRATCH[key] = self.plan.new_scratch(self.device, epoch)
            self.scratch = _SHARED_SCRATCH[key]
        else:
            self.scratch = self.plan.new_scratch(self.device, epoch)
        self.views = self.plan.views(self.scratch)
        self.cos, self.sin = rope_tables(layer.dims.model, layer.layer_id, self.device)
        if programs is None:
            programs = (
                INTERPRETER_PROGRAMS
                if _interpreted()
                else torch.cuda.get_device_properties(self.device).multi_processor_count
            )
        self.programs = programs
        if spin_limit is None:
            spin_limit = SPIN_LIMIT_INTERPRETER if _interpreted() else SPIN_LIMIT_GPU
        self.spin_limit = spin_limit
        # The error word travels to the host behind an event after each server launch, so a
        # timeout is reported at a later call without a sync on every step.
        self._error_host = torch.zeros(1, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        self._error_copied: torch.cuda.Event | None = None

    @property
    def epoch(self) -> int:
        """The tag the next launch will use (reads the device word)."""
        return int(self.views["ctl"][CTL_EPOCH])

    def reset(self, epoch: int) -> None:
        """Start over from ``epoch``: control words and mailboxes re-initialised."""
        self.plan.reset_control(self.scratch, epoch)

    def launch(
        self, inputs: StepInputs, y: torch.Tensor, trace: torch.Tensor | None = None
    ) -> None:
        """One launch writing ``y``; no host sync and no checks (graph-capturable).

        ``trace``: int64 [plan.total_tasks, 3] on the GPU; receives each task's
        ``(start ns, end ns, program)`` (``benchmarks/mono_trace.py`` reads it).
        """
        p, m, lw, v = self.plan, self.layer.dims.model, self.layer, self.views
        window_cache, compressed_cache = inputs.window_cache, inputs.compressed_cache
        if trace is not None:
            want = (p.total_tasks, 3)
            if not current_platform().ptx or trace.device.type != "cuda":
                raise ValueError(f"trace: the task trace reads NVIDIA's PTX global timer (a GPU run), "
                                 f"got {current_platform().features}")  # fmt: skip
            if trace.dtype != torch.int64 or tuple(trace.shape) != want or not trace.is_contiguous():
                raise ValueError(
                    f"trace: expected a contiguous int64 tensor of shape {list(want)}, "
                    f"got {str(trace.dtype).removeprefix('torch.')} {list(trace.shape)}"
                )
        comp = window_cache if compressed_cache is None else compressed_cache
        comp_slots = 0 if compressed_cache is None else compressed_cache.num_slots
        ends = [st.end for st in p.stages]
        mono_kernel[(self.programs,)](
            v["ctl"], v["x8"], v["x8s"], v["xrdy"], v["qkvp"], v["qx8"], v["qx8s"], v["qrdy"],
            v["q"], v["part"], v["pstat"], v["srdy"], v["xo"], v["xos"], v["crdy"], v["x8b"],
            v["x8bs"], v["ardy"], v["z"], v["woap"], v["wrdy"],
            # without a_dequantized no such regions: pointers the kernel never follows
            *(v.get(name, v["x8"]) for name in DEQUANTIZED),
            inputs.x, inputs.positions, inputs.slot_mapping, inputs.key_table,
            window_cache.data, comp.data, y,
            y if trace is None else trace,
            lw.wqkv, lw.wqkv_scale, lw.q_norm, lw.kv_norm, lw.wq_b, lw.wq_b_scale, lw.wo_a,
            lw.wo_a_scale, lw.wo_b, lw.wo_b_scale, lw.attn_sink, self.cos, self.sin,
            p.tokens, p.capacity, window_cache.num_slots, comp_slots, self.cos.shape[0],
            self.spin_limit, *ends,
            m.eps, m.softmax_scale,
            HIDDEN=m.hidden, Q_RANK=m.q_rank, Q_RANK_P=1 << (m.q_rank - 1).bit_length(),
            QKV_ROWS=m.qkv_rows, NOPE=m.nope_dim, HEADS=p.dims.heads, HEAD_TILES=p.head_tiles,
            O_RANK=m.o_rank, GROUP_K=p.dims.group_k, O_ROWS=p.dims.o_rows,
            WOA_PARTS=p.woa_parts, KEYS=m.keys,
            KC=p.key_chunk, KS=p.key_slice, CHUNKS=p.chunks,
            CHUNKS_P=1 << (p.chunks - 1).bit_length(),
            WIN_BLOCK=window_cache.block, COMP_BLOCK=comp.block,
            HAS_COMP=compressed_cache is not None,
            TB=p.token_block, **p.tiling, EXACT=_interpreted(), TRACE=trace is not None,
            CVT_PTX=current_platform().ptx,
            num_warps=p.tuning.num_warps,
        )

    def report_async(self) -> None:
        """Start copying the error word to the host (no sync); ``raise_reported`` reads it."""
        self._error_host.copy_(self.views["ctl"][CTL_ERROR : CTL_ERROR + 1], non_blocking=True)
        if self.device.type == "cuda":
            self._error_copied = torch.cuda.Event()
            self._error_copied.record()

    def raise_reported(self) -> None:
        """``check`` if an earlier launch's error word has reached the host set; never waits."""
        if self._error_copied is not None and not self._error_copied.query():
            return
        if int(self._error_host[0]):
            self._error_host.zero_()
            self.check()

    def check(self) -> None:
        """Raise ``MonoError`` naming the task whose wait timed out, if any (syncs the device)."""
        code = int(self.views["ctl"][CTL_ERROR])
        if code:
            ticket = code - 1
            stage = next(st for st in self.plan.stages if st.first <= ticket < st.end)
            coords = self.plan.task_coords(stage.name, ticket - stage.first)
            self.reset(self.epoch)
            raise MonoError(
                f"mono kernel: {stage.name} task {coords} (ticket {ticket}) timed out after "
                f"{self.spin_limit} polls waiting on its inputs; scratch reset"
            )

    def seams(self, y: torch.Tensor) -> dict[str, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        """The step's seams from the scratch (module docstring), copied."""
        v, d = self.views, self.layer.dims
        return {
            "y": y,
            "x8": (v["x8"].clone(), v["x8s"].clone()),
            "qkv": (v["qkvp"][0] + v["qkvp"][1]).to(torch.bfloat16),
            "q": permute_q_from_fused(v["q"], d.heads, d.model.head_dim),
            "xo": (v["xo"].clone(), v["xos"].clone()),
            "z": v["z"].clone(),
            "z8": (v["x8b"].clone(), v["x8bs"].clone()),
        }


_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runner_for(layer: LayerWeights, tokens: int, tuning: Tuning | None = None) -> MonoRunner:
    """The cached runner of (layer, tokens, tuning), created on first use; ``tuning`` None: the
    measured choices. A runner's tuning is fixed at build, so one given a tuning is never the
    default's entry, even where the two tunings agree."""
    per_layer = _RUNNERS.setdefault(layer, {})
    if (tokens, tuning) not in per_layer:
        per_layer[tokens, tuning] = MonoRunner(layer, tokens, shared=True, tuning=tuning)
    return per_layer[tokens, tuning]


def validate_inputs(layer: LayerWeights, inputs: StepInputs) -> None:
    """docs/design.md §4 checks: shapes, dtypes, record format, positions, slots and key-table
    entries."""
    x, positions, slot_mapping, key_table = (
        inputs.x, inputs.positions, inputs.slot_mapping, inputs.key_table,
    )  # fmt: skip
    window_cache, compressed_cache = inputs.window_cache, inputs.compressed_cache
    if x.dim() == 2 and not 1 <= x.shape[0] <= MAX_TOKENS:  # the scratch's limit, first
        raise MonoError(f"x: expected 1 <= M <= {MAX_TOKENS} tokens, got {x.shape[0]}")
    try:
        check_step_inputs(layer, inputs)
    except (TypeError, ValueError) as e:
        raise MonoError(str(e)) from None
    m = layer.dims.model
    if not x.is_contiguous():
        raise MonoError(f"x: expected a contiguous tensor, got strides {x.stride()}")
    if positions.numel() and not bool(((positions >= 0) & (positions < m.max_position)).all()):
        raise MonoError(
            f"positions: expected values in [0, {m.max_position}), got {positions.tolist()}"
        )
    if key_table.shape[1] != m.keys:
        raise MonoError(f"key_table: expected {m.keys} keys a token, got {key_table.shape[1]}")
    for name, cache in (("window_cache", window_cache), ("compressed_cache", compressed_cache)):
        if cache is not None and cache.fmt is not FP8_DS_MLA:
            raise MonoError(f"{name}: expected record format fp8_ds_mla, got {cache.fmt.name}")
    bad = (slot_mapping < -1) | (slot_mapping >= window_cache.num_slots)
    if bool(bad.any()):
        raise MonoError(
            f"slot_mapping: expected slots in [0, {window_cache.num_slots}) or -1 (padding, "
            f"stores nothing), got {slot_mapping[bad].tolist()}"
        )
    comp_n = 0 if compressed_cache is None else compressed_cache.num_slots
    try:
        validate_key_table(key_table, window_cache.num_slots, comp_n)
    except (IndexError, ValueError) as e:
        raise MonoError(str(e)) from None


def check_record_formats(inputs: StepInputs) -> None:
    """Raise ``ValueError`` naming a cache whose record format mono does not read (fp8_ds_mla
    only): an attribute check, no device sync, so the server path makes it on every call."""
    for name in ("window_cache", "compressed_cache"):
        cache = getattr(inputs, name)
        if cache is not None and cache.fmt is not FP8_DS_MLA:
            raise ValueError(f"{name}: backend mono expects record format fp8_ds_mla, "
                             f"got {cache.fmt.name}")  # fmt: skip


def capturing(device: torch.device) -> bool:
    """The current stream of ``device`` is being captured into a CUDA / HIP graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def mono_forward(layer: LayerWeights, inputs: StepInputs) -> torch.Tensor:
    """The server path of ``mono_step``: one launch, no host sync, no seam copies; returns y.

    Capturable in the caller's CUDA / HIP graph: while the stream is capturing, the launch
    alone is recorded (no event, no read of the error word). Outside a capture, a timeout
    of an earlier launch of the same runner (eager or a graph replay) is raised
    (``MonoError``, scratch reset) by the first call after its error word has reached the
    host: each such call starts that word's copy after its launch and reads the previous
    copy, so the error costs no device sync on every layer step. ``mono_step`` checks
    synchronously.
    """
    check_record_formats(inputs)
    runner = runner_for(layer, inputs.tokens)
    y = torch.empty_like(inputs.x)
    if capturing(runner.device):
        runner.launch(inputs, y)
        return y
    runner.raise_reported()
    runner.launch(inputs, y)
    runner.report_async()
    return y


def mono_launch(
    layer: LayerWeights, inputs: StepInputs, tuning: Tuning | None = None
) -> torch.Tensor:
    """One launch of the cached runner (of ``tuning``; None: the measured choices) returning y:
    no error report, no host sync (graph-capturable; what the bench times)."""
    check_record_formats(inputs)
    y = torch.empty_like(inputs.x)
    runner_for(layer, inputs.tokens, tuning).launch(inputs, y)
    return y


def mono_step(
    layer: LayerWeights, inputs: StepInputs, *, validate: bool = False
) -> dict[str, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """One decode step of one rank in one launch; inserts the new records into ``window_cache``.

    ``layer``: the rank's weights (tp 2 or 4); ``inputs`` as ``reference_step``
    takes them, M <= 48, caches in the fp8_ds_mla format; a slot_mapping entry
    of -1, or any slot outside the cache, stores nothing; key-table entries
    outside their cache count as none. Returns the seams of the module docstring.
    """
    if validate:
        validate_inputs(layer, inputs)
    runner = runner_for(layer, inputs.tokens)
    y = torch.empty_like(inputs.x)
    runner.launch(inputs, y)
    runner.check()
    return runner.seams(y)
