"""The schedule executor: the mono kernel's task tables run in PyTorch, one task at a time.

``ScheduleExecutor.run`` walks the tickets of a ``Plan`` in order and does,
task by task, what the kernel's task does, writing the same scratch regions
(same layouts, same rounding points; with ``Tuning.a_dequantized`` the bf16
``DEQUANTIZED`` regions too), the same mailboxes and the same control words.
Any stage of the kernel can therefore be diffed against it region by region.
Each wait checks that the mailbox it points to already carries the step's tag,
so running the executor also proves the schedule's order: a wait that pointed
forward would raise here rather than hang a GPU. Where the kernel splits a
task's work further (K blocks of a GEMV, 32-key slices of an attention chunk
under an online softmax) the executor does the task's math in one go, so fp32
sums may differ in their last bits, nothing more.
"""

from __future__ import annotations

import torch

from dsv41.amd.mono.plan import (
    COMBINE_PARTS,
    CTL_EPOCH,
    CTL_FINISHED,
    CTL_TICKET,
    K_HALVES,
    STAGES,
    WOA_TASK_ROWS,
    WOB_TASK_ROWS,
    WQB_TASK_ROWS,
    WQKV_TASK_ROWS,
    Plan,
    as_int32,
)
from dsv41.common.fused_layout import O_CHUNK, Q_CHUNK, permute_o_to_fused, permute_q_from_fused
from dsv41.common.geometry import HEAD_TILE
from dsv41.common.kv_cache import gather_keys
from dsv41.common.mx import MX_BLOCK, dequantize_weight, mxfp8_dequantize, mxfp8_quantize
from dsv41.common.reference import rmsnorm
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights


class ScheduleError(RuntimeError):
    """A task waited on a mailbox that no earlier task had filled."""


class ScheduleExecutor:
    """Runs a plan's tasks in ticket order on tensors (usually CPU), mirroring the kernel."""

    def __init__(self, plan: Plan, layer: LayerWeights, cos: torch.Tensor, sin: torch.Tensor):
        self.plan, self.layer, self.cos, self.sin = plan, layer, cos, sin
        self.m = plan.dims.model

    def run(self, scratch: torch.Tensor, inputs: StepInputs, y: torch.Tensor) -> None:
        """One step: every ticket in order, then the last finisher's epoch advance."""
        p = self.plan
        self.r = p.views(scratch)
        self.epoch = int(self.r["ctl"][CTL_EPOCH])
        self.x, self.positions = inputs.x, inputs.positions.long()
        self.slot_mapping, self.key_table = inputs.slot_mapping.long(), inputs.key_table
        self.window_cache, self.compressed_cache = inputs.window_cache, inputs.compressed_cache
        self.y = y
        for name in STAGES:
            task = getattr(self, f"_{name}")
            for i in range(p.stage(name).tasks):
                task(*p.task_coords(name, i))
        ctl = self.r["ctl"]
        ctl[CTL_TICKET] = ctl[CTL_FINISHED] = 0
        ctl[CTL_EPOCH] = as_int32(self.epoch + 1)

    # -- mailboxes ---------------------------------------------------------------

    def _wait(self, region: str, box: int) -> None:
        if int(self.r[region][box, 1]) != self.epoch:
            raise ScheduleError(f"{region}[{box}]: waited on before its producers finished")

    def _arrive(self, region: str, box: int, arrivals: int) -> bool:
        """Count one arrival; True for the ``arrivals``-th, which publishes the tag."""
        mb = self.r[region][box]
        mb[0] += 1
        if int(mb[0]) != arrivals:
            return False
        mb[0] = 0
        mb[1] = self.epoch
        return True

    # -- helpers -----------------------------------------------------------------

    def _dequantized(self, name: str, index, values: torch.Tensor, codes: torch.Tensor) -> None:
        """``region[index] = bf16(dequant(values, codes))`` where the plan has region ``name``
        (``Tuning.a_dequantized``)."""
        if name in self.r:
            self.r[name][index] = mxfp8_dequantize(values, codes).to(torch.bfloat16)

    def _gemv(self, act: str, cols: slice, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
        """``dequant(act[:, cols]) @ dequant(w)^T`` in fp32 (``w`` the task's rows and K range)."""
        sc = slice(cols.start // MX_BLOCK, cols.stop // MX_BLOCK)
        a = mxfp8_dequantize(self.r[act][:, cols], self.r[act + "s"][:, sc])
        return a @ dequantize_weight(w, w_scale).T

    def _rotate(self, t: torch.Tensor, pair0: int, pos: torch.Tensor, inverse: bool):
        """fp32 GPT-J pairs of ``t [..., 2 n]`` turned by pair indices ``pair0 ..`` at ``pos``."""
        n = t.shape[-1] // 2
        inside = ((pos >= 0) & (pos < self.cos.shape[0]))[..., None]  # else no turn, as the kernel
        at = pos.clamp(0, self.cos.shape[0] - 1)
        c = torch.where(inside, self.cos[at][..., pair0 : pair0 + n], 1.0)
        s = torch.where(inside, self.sin[at][..., pair0 : pair0 + n], 0.0)
        if inverse:
            s = -s
        v0, v1 = t[..., 0::2], t[..., 1::2]
        return torch.stack([v0 * c - v1 * s, v0 * s + v1 * c], dim=-1).flatten(-2)

    # -- stages ------------------------------------------------------------------

    def _xq(self, half: int, block: int) -> None:
        blocks = self.plan.xq_blocks
        width = self.m.hidden // K_HALVES // blocks
        cols = slice((half * blocks + block) * width, (half * blocks + block + 1) * width)
        values, codes = mxfp8_quantize(self.x[:, cols])
        self.r["x8"][:, cols] = values
        self.r["x8s"][:, cols.start // MX_BLOCK : cols.stop // MX_BLOCK] = codes
        self._dequantized("x8d", (slice(None), cols), values, codes)
        self._arrive("xrdy", 0, K_HALVES * blocks)

    def _wqkv(self, half: int, tile: int) -> None:
        self._wait("xrdy", 0)
        k = self.m.hidden // K_HALVES
        rows = slice(tile * WQKV_TASK_ROWS, (tile + 1) * WQKV_TASK_ROWS)
        cols, lw = slice(half * k, (half + 1) * k), self.layer
        sc = slice(cols.start // MX_BLOCK, cols.stop // MX_BLOCK)
        partial = self._gemv("x8", cols, lw.wqkv[rows, cols], lw.wqkv_scale[rows, sc])
        self.r["qkvp"][half, :, rows] = partial
        self._arrive("xrdy", 1, K_HALVES * self.plan.wqkv_tiles)

    def _norm(self, s: int) -> None:
        self._wait("xrdy", 1)
        m, lw = self.m, self.layer
        qkv = (self.r["qkvp"][0, s] + self.r["qkvp"][1, s]).to(torch.bfloat16)
        qr = rmsnorm(qkv[: m.q_rank], lw.q_norm, m.eps)
        kv = rmsnorm(qkv[m.q_rank :], lw.kv_norm, m.eps).float()
        kv[m.nope_dim :] = self._rotate(kv[m.nope_dim :], 0, self.positions[s], inverse=False)
        slot = self.slot_mapping[s : s + 1]
        if 0 <= int(slot) < self.window_cache.num_slots:
            self.window_cache.insert(slot, kv[None].to(torch.bfloat16))
        values, codes = mxfp8_quantize(qr)
        self.r["qx8"][s], self.r["qx8s"][s] = values, codes
        self._dequantized("qx8d", s, values, codes)
        self._arrive("qrdy", 0, self.plan.tokens)

    def _wqb(self, chunk: int, head: int) -> None:
        self._wait("qrdy", 0)
        m, lw, d = self.m, self.layer, self.plan.dims
        task = chunk * d.heads + head
        rows = slice(task * WQB_TASK_ROWS, (task + 1) * WQB_TASK_ROWS)
        q = self._gemv("qx8", slice(0, m.q_rank), lw.wq_b[rows], lw.wq_b_scale[rows])
        q = q.bfloat16().float()
        dim0 = chunk * Q_CHUNK
        if dim0 >= m.nope_dim:
            q = self._rotate(q, (dim0 - m.nope_dim) // 2, self.positions, inverse=False)
        self.r["q"][:, rows] = q.to(torch.bfloat16)
        tile = head // HEAD_TILE
        self._arrive("qrdy", 1 + tile, m.head_dim // Q_CHUNK * len(self._tile_heads(tile)))

    def _tile_heads(self, tile: int) -> range:
        return range(tile * HEAD_TILE, min((tile + 1) * HEAD_TILE, self.plan.dims.heads))

    def _attn(self, s: int, tile: int, chunk: int) -> None:
        self._wait("qrdy", 0)
        self._wait("qrdy", 1 + tile)
        p, m = self.plan, self.m
        heads = self._tile_heads(tile)
        q = permute_q_from_fused(self.r["q"][s], p.dims.heads, m.head_dim)[heads.start : heads.stop]
        entries = self.key_table[s : s + 1, chunk * p.key_chunk : (chunk + 1) * p.key_chunk]
        keys, valid = gather_keys(entries, self.window_cache, self.compressed_cache)
        keys, valid = keys[0], valid[0]
        scores = (q.float() @ keys.T * m.softmax_scale).masked_fill(~valid, float("-inf"))
        mx = scores.amax(dim=-1)
        safe = torch.where(torch.isfinite(mx), mx, 0.0)
        prob = torch.exp(scores - safe[:, None])
        total = prob.sum(dim=-1)
        o = prob @ keys / torch.where(total > 0, total, 1.0)[:, None]
        self.r["part"][s, chunk, heads.start : heads.stop] = o
        self.r["pstat"][s, chunk, heads.start : heads.stop] = torch.stack([mx, total], dim=-1)
        self._arrive("srdy", s * p.head_tiles + tile, p.chunks)

    def _combine(self, s: int, tile: int, part: int) -> None:
        p, m = self.plan, self.m
        self._wait("srdy", s * p.head_tiles + tile)
        heads = self._tile_heads(tile)
        hs = slice(heads.start, heads.stop)
        mx, total = self.r["pstat"][s, :, hs].unbind(-1)  # [chunks, h]
        top = mx.amax(dim=0)
        top = torch.where(top > float("-inf"), top, 0.0)
        # A chunk without a valid key has sum 0 exactly; a NaN score's NaN sum flows into o.
        weight = torch.where(total == 0, 0.0, total * torch.exp(mx - top))
        norm = weight.sum(dim=0)
        has_key = norm != 0
        o = (weight[..., None] * self.r["part"][s, :, hs].float()).sum(dim=0)
        o = o / torch.where(has_key, norm, 1.0)[:, None]
        lse = top + torch.log(norm)
        gate = torch.sigmoid(lse - self.layer.attn_sink[hs].float())
        o = torch.where(has_key[:, None], o * gate[:, None], 0.0)
        o[:, m.nope_dim :] = self._rotate(o[:, m.nope_dim :], 0, self.positions[s], inverse=True)
        values, codes = mxfp8_quantize(o.to(torch.bfloat16))
        # The whole heads are computed; the task writes its part's 32-dim chunks c0 .. c1, which
        # in the fused O layout are one run of every group: columns (c * 8 + h) * 32 + j.
        g, groups = m.heads_per_group, len(heads) // m.heads_per_group
        fused = permute_o_to_fused(values, g).view(groups, -1)
        deq = permute_o_to_fused(mxfp8_dequantize(values, codes), g).view(groups, -1)
        fused_codes = codes.view(groups, g, -1).transpose(1, 2).reshape(groups, -1)
        c0 = part * (m.head_dim // COMBINE_PARTS) // O_CHUNK
        c1 = (part + 1) * (m.head_dim // COMBINE_PARTS) // O_CHUNK
        for k in range(groups):
            col0 = heads.start * m.head_dim + k * p.dims.group_k
            cols = slice(col0 + c0 * g * O_CHUNK, col0 + c1 * g * O_CHUNK)
            self.r["xo"][s, cols] = fused[k, c0 * g * O_CHUNK : c1 * g * O_CHUNK]
            if "xod" in self.r:
                self.r["xod"][s, cols] = deq[k, c0 * g * O_CHUNK : c1 * g * O_CHUNK].bfloat16()
            code_cols = slice(col0 // O_CHUNK + c0 * g, col0 // O_CHUNK + c1 * g)
            self.r["xos"][s, code_cols] = fused_codes[k, c0 * g : c1 * g]
        self._arrive("crdy", tile, p.tokens * COMBINE_PARTS)

    def _woa(self, block: int, part: int) -> None:
        d, lw, parts = self.plan.dims, self.layer, self.plan.woa_parts
        row0 = block * WOA_TASK_ROWS
        g = row0 // d.model.o_rank
        self._wait("crdy", g * d.model.heads_per_group // HEAD_TILE)
        rows = slice(row0, row0 + WOA_TASK_ROWS)
        # The task's activations are its group's xo (fused O layout = wo_a's column order),
        # K part ``part``: columns kp * part .. of the group.
        kp = d.group_k // parts
        w_cols = slice(part * kp, (part + 1) * kp)
        cols = slice(g * d.group_k + w_cols.start, g * d.group_k + w_cols.stop)
        sc = slice(w_cols.start // MX_BLOCK, w_cols.stop // MX_BLOCK)
        acc = self._gemv("xo", cols, lw.wo_a[rows, w_cols], lw.wo_a_scale[rows, sc])
        if parts > 1:
            self.r["woap"][part, :, rows] = acc
            if not self._arrive("wrdy", block, parts):
                return
            acc = self.r["woap"][:, :, rows].sum(dim=0)
        z = acc.to(torch.bfloat16)
        values, codes = mxfp8_quantize(z)
        self.r["x8b"][:, rows], self.r["x8bs"][:, block] = values, codes[:, 0]
        self._dequantized("x8bd", (slice(None), rows), values, codes)
        self.r["z"][:, rows] = z
        self._arrive("ardy", 0, self.plan.woa_blocks)

    def _wob(self, i: int) -> None:
        self._wait("ardy", 0)
        lw, d = self.layer, self.plan.dims
        rows = slice(i * WOB_TASK_ROWS, (i + 1) * WOB_TASK_ROWS)
        y = self._gemv("x8b", slice(0, d.o_rows), lw.wo_b[rows], lw.wo_b_scale[rows])
        self.y[:, rows] = y.to(torch.bfloat16)
