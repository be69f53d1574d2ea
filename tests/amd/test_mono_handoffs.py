"""The mono kernel's hand-offs, checked without running it (the interpreter runs the tickets
in order, so it can never show a wait that is too weak).

A model of the kernel's tasks (what each reads, writes, waits on and arrives at, with the
kernel's index formulas and arrival counts) gives, at tp 2 and 4 for S = 1..48 (tiny
geometry; FLASH_TOKENS at the real one), the happens-before order the mailboxes make; every task must then come after every producer
of every 128-B line it reads (plan.py, "Cache lines"). A static pass over kernel.py checks
that each load of data produced inside the launch asks for ``.cg``.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import inspect

import pytest

from dsv41.amd.mono import kernel as kernel_module
from dsv41.amd.mono.plan import (
    COMBINE_PARTS,
    K_HALVES,
    MAX_TOKENS,
    WOA_TASK_ROWS,
    WOB_TASK_ROWS,
    WQB_TASK_ROWS,
    WQKV_TASK_ROWS,
    Plan,
)
from dsv41.amd.mono.tuning import k_block, resolve
from dsv41.common.fused_layout import O_CHUNK, Q_CHUNK
from dsv41.common.geometry import HEAD_TILE, Dims
from dsv41.common.mx import MX_BLOCK

LINE = 128  # bytes of a cache line: the unit a load may bring into L1


@dataclasses.dataclass
class Task:
    stage: str
    coords: tuple[int, ...]
    waits: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    arrive: tuple[str, int] | None = None
    reads: list[frozenset] = dataclasses.field(default_factory=list)  # of (space, line)
    writes: list[frozenset] = dataclasses.field(default_factory=list)


class Model:
    """The tasks of one plan as the kernel runs them (index formulas from kernel.py)."""

    def __init__(self, plan: Plan, split_x_ready: bool = False):
        """``split_x_ready``: the first kernel's hand-off, Wqkv waiting only on its K half."""
        self.p, self.d, self.m = plan, plan.dims, plan.dims.model
        self.split_x_ready = split_x_ready
        self.deq = plan.tuning.a_dequantized  # the tensor-core GEMVs read the bf16 regions
        self._lines: dict[tuple, frozenset] = {}
        self.tasks: list[Task] = []
        for st in plan.stages:
            for i in range(st.tasks):
                task = Task(st.name, plan.task_coords(st.name, i))
                getattr(self, "_" + st.name)(task, *task.coords)
                self.tasks.append(task)
                if st.name == "woa" and plan.woa_parts > 1 and task.coords[1] == plan.woa_parts - 1:
                    # Whichever part arrives last at wrdy sums the block: a task after them all.
                    self.tasks.append(self._woa_sum(task.coords[0]))

    # -- byte spans -> lines ----------------------------------------------------------

    def _span(self, name: str, index: tuple[int, ...], count: int, repeat: int = 1,
              step: int = 0) -> frozenset:
        """Lines of ``count`` consecutive elements of region ``name`` from element ``index``,
        and of the ``repeat - 1`` runs like it every ``step`` elements after it."""
        r = self.p.regions[name]
        assert len(index) == len(r.shape) and all(0 <= i < n for i, n in zip(index, r.shape))
        flat = 0
        for i, n in zip(index, r.shape):
            flat = flat * n + i
        size = r.dtype.itemsize
        starts = [r.offset + (flat + k * step) * size for k in range(repeat)]
        assert starts[-1] + count * size <= r.offset + r.nbytes, (name, index, count)
        return frozenset(
            ("scratch", line) for lo in starts
            for line in range(lo // LINE, (lo + count * size - 1) // LINE + 1)
        )

    def _rows(self, name: str, lead: tuple[int, ...], col: int, count: int) -> frozenset:
        """``_span(name, (*lead, s, col), count)`` over the step's tokens s (cached)."""
        key = (name, lead, col, count)
        if key not in self._lines:
            row = self.p.regions[name].shape[-1]
            self._lines[key] = self._span(name, (*lead, 0, col), count, self.p.tokens, row)
        return self._lines[key]

    def _tile_heads(self, tile: int) -> range:
        return range(tile * HEAD_TILE, min((tile + 1) * HEAD_TILE, self.d.heads))

    def _act(self, mx: str, col: int, count: int) -> list[frozenset]:
        """The lines a GEMV reads of activation ``mx``'s columns ``col ..`` (every token): its
        bf16 region ``mx + "d"`` with a_dequantized, else its values and codes."""
        if self.deq:
            return [self._rows(mx + "d", (), col, count)]
        return [self._rows(mx, (), col, count),
                self._rows(mx + "s", (), col // MX_BLOCK, count // MX_BLOCK)]

    def arrivals(self) -> dict[tuple[str, int], int]:
        """The count each mailbox's last arrival brings (the kernel's ``_arrive`` calls)."""
        p, d, m = self.p, self.d, self.m
        xq_tasks = p.stage("xq").tasks
        out = {("qrdy", 0): p.tokens, ("ardy", 0): p.woa_blocks}
        if p.woa_parts > 1:
            out |= {("wrdy", b): p.woa_parts for b in range(p.woa_blocks)}
        if self.split_x_ready:
            out |= {("xrdy", h): xq_tasks // K_HALVES for h in range(K_HALVES)}
            out[("xrdy", K_HALVES)] = K_HALVES * p.wqkv_tiles
        else:
            out[("xrdy", 0)] = m.hidden // k_block(m.hidden // K_HALVES, p.tuning.gemv_block)
            assert out[("xrdy", 0)] == xq_tasks
            out[("xrdy", 1)] = K_HALVES * p.wqkv_tiles
        for t in range(p.head_tiles):
            out[("qrdy", 1 + t)] = m.head_dim // Q_CHUNK * len(self._tile_heads(t))
            out[("crdy", t)] = p.tokens * COMBINE_PARTS
            for s in range(p.tokens):
                out[("srdy", s * p.head_tiles + t)] = p.chunks
        return out

    # -- stages ---------------------------------------------------------------------

    def _xq(self, task: Task, half: int, block: int) -> None:
        bk = self.m.hidden // K_HALVES // self.p.xq_blocks
        col = (half * self.p.xq_blocks + block) * bk
        task.writes = [self._rows("x8", (), col, bk),
                       self._rows("x8s", (), col // MX_BLOCK, bk // MX_BLOCK)]
        if self.deq:
            task.writes.append(self._rows("x8d", (), col, bk))
        task.arrive = ("xrdy", half if self.split_x_ready else 0)

    def _wqkv(self, task: Task, half: int, tile: int) -> None:
        k = self.m.hidden // K_HALVES
        task.waits = [("xrdy", half if self.split_x_ready else 0)]
        task.reads = self._act("x8", half * k, k)
        task.writes = [self._rows("qkvp", (half,), tile * WQKV_TASK_ROWS, WQKV_TASK_ROWS)]
        task.arrive = ("xrdy", K_HALVES if self.split_x_ready else 1)

    def _norm(self, task: Task, s: int) -> None:
        m = self.m
        task.waits = [("xrdy", K_HALVES if self.split_x_ready else 1)]
        task.reads = [self._span("qkvp", (h, s, 0), m.qkv_rows) for h in range(K_HALVES)]
        task.writes = [self._span("qx8", (s, 0), m.q_rank),
                       self._span("qx8s", (s, 0), m.q_rank // MX_BLOCK),
                       frozenset({("records", s)})]  # its window record: any key may name it
        if self.deq:
            task.writes.append(self._span("qx8d", (s, 0), m.q_rank))
        task.arrive = ("qrdy", 0)

    def _wqb(self, task: Task, chunk: int, head: int) -> None:
        m, i = self.m, chunk * self.d.heads + head
        task.waits = [("qrdy", 0)]
        task.reads = self._act("qx8", 0, m.q_rank)
        task.writes = [self._rows("q", (), i * WQB_TASK_ROWS, WQB_TASK_ROWS)]
        task.arrive = ("qrdy", 1 + head // HEAD_TILE)

    def _attn(self, task: Task, s: int, tile: int, chunk: int) -> None:
        m, d = self.m, self.d
        task.waits = [("qrdy", 0), ("qrdy", 1 + tile)]
        heads = self._tile_heads(tile)
        # fused Q: dims c * Q_CHUNK .. of head h at column (c * heads + h) * Q_CHUNK
        task.reads = [
            self._span("q", (s, heads.start * Q_CHUNK), len(heads) * Q_CHUNK,
                       m.head_dim // Q_CHUNK, d.heads * Q_CHUNK),
            frozenset(("records", j) for j in range(self.p.tokens)),
        ]
        task.writes = [self._span("part", (s, chunk, heads.start, 0), len(heads) * m.head_dim),
                       self._span("pstat", (s, chunk, heads.start, 0), len(heads) * 2)]
        task.arrive = ("srdy", s * self.p.head_tiles + tile)

    def _combine(self, task: Task, s: int, tile: int, part: int) -> None:
        m, d, p = self.m, self.d, self.p
        task.waits = [("srdy", s * p.head_tiles + tile)]
        heads, dims = self._tile_heads(tile), m.head_dim // COMBINE_PARTS
        for j in range(p.chunks):
            task.reads.append(self._span("pstat", (s, j, heads.start, 0), len(heads) * 2))
            task.reads.append(self._span("part", (s, j, heads.start, part * dims), dims,
                                         len(heads), m.head_dim))
        g, c0, c1 = m.heads_per_group, part * dims // O_CHUNK, (part + 1) * dims // O_CHUNK
        for h in heads:  # fused O: (h // g) * group_k + ((dim // 32) * g + h % g) * 32
            col = (h // g) * d.group_k + (c0 * g + h % g) * O_CHUNK
            task.writes.append(self._span("xo", (s, col), O_CHUNK, c1 - c0, g * O_CHUNK))
            task.writes.append(self._span("xos", (s, col // MX_BLOCK), 1, c1 - c0, g))
            if self.deq:
                task.writes.append(self._span("xod", (s, col), O_CHUNK, c1 - c0, g * O_CHUNK))
        task.arrive = ("crdy", tile)

    def _woa(self, task: Task, block: int, part: int) -> None:
        d, m, parts = self.d, self.m, self.p.woa_parts
        row0 = block * WOA_TASK_ROWS
        group = row0 // m.o_rank
        kp = d.group_k // parts
        col = group * d.group_k + part * kp
        task.waits = [("crdy", group * m.heads_per_group // HEAD_TILE)]
        task.reads = self._act("xo", col, kp)
        if parts > 1:
            task.writes = [self._rows("woap", (part,), row0, WOA_TASK_ROWS)]
            task.arrive = ("wrdy", block)
        else:
            self._woa_out(task, block)

    def _woa_sum(self, block: int) -> Task:
        """The sum of a row block's K parts, by the last of them to arrive at wrdy."""
        task = Task("woa sum", (block,), waits=[("wrdy", block)])
        task.reads = [self._rows("woap", (p,), block * WOA_TASK_ROWS, WOA_TASK_ROWS)
                      for p in range(self.p.woa_parts)]
        self._woa_out(task, block)
        return task

    def _woa_out(self, task: Task, block: int) -> None:
        row0 = block * WOA_TASK_ROWS
        task.writes += [self._rows("z", (), row0, WOA_TASK_ROWS),
                        self._rows("x8b", (), row0, WOA_TASK_ROWS),
                        self._rows("x8bs", (), block, 1)]
        if self.deq:
            task.writes.append(self._rows("x8bd", (), row0, WOA_TASK_ROWS))
        task.arrive = ("ardy", 0)

    def _wob(self, task: Task, i: int) -> None:
        d = self.d
        assert (i + 1) * WOB_TASK_ROWS <= d.model.hidden
        task.waits = [("ardy", 0)]
        task.reads = self._act("x8b", 0, d.o_rows)

    # -- the check ------------------------------------------------------------------

    def unordered_reads(self) -> list[tuple[Task, tuple[str, int], Task]]:
        """``(reader, line, writer)`` where a task reads a line one of whose producers is not
        ordered before it.

        Also asserts the mailboxes: each wait names a mailbox whose producers all hold
        smaller tickets and bring it exactly to its arrival count, and every mailbox a
        step uses ends with exactly its count (so the next step starts from 0).
        """
        want = self.arrivals()
        arrivers: dict[tuple[str, int], list[int]] = {}
        for t, task in enumerate(self.tasks):
            if task.arrive is not None:
                assert task.arrive in want, (task.stage, task.coords, task.arrive)
                arrivers.setdefault(task.arrive, []).append(t)
        assert {box: len(ts) for box, ts in arrivers.items()} == want
        writers: dict[tuple[str, int], int] = {}  # line -> bitmask of tasks
        for t, task in enumerate(self.tasks):
            for line in frozenset().union(*task.writes):
                writers[line] = writers.get(line, 0) | 1 << t
        piece_writers: dict[int, int] = {}  # id of a read piece -> its lines' writers
        for task in self.tasks:
            for piece in task.reads:
                if id(piece) not in piece_writers:
                    piece_writers[id(piece)] = 0
                    for line in piece:
                        piece_writers[id(piece)] |= writers.get(line, 0)
        before: list[int] = []  # bitmask of the tasks ordered before each task
        published: dict[tuple[str, int], int] = {}  # a full mailbox's producers and theirs
        bad = []
        for t, task in enumerate(self.tasks):
            mask = 0
            for box in task.waits:
                assert max(arrivers[box]) < t, (task.stage, task.coords, box)
                if box not in published:
                    published[box] = 0
                    for a in arrivers[box]:
                        published[box] |= before[a] | 1 << a
                mask |= published[box]
            before.append(mask)
            for piece in task.reads:
                if not piece_writers[id(piece)] & ~mask & ~(1 << t):
                    continue
                for line in sorted(piece):
                    loose = writers.get(line, 0) & ~mask & ~(1 << t)
                    if loose:
                        bad.append((task, line, self.tasks[(loose & -loose).bit_length() - 1]))
        return bad


# Every token count at the tiny geometry; at the real one (0.8 s a plan at 48 tokens) the
# counts the GPU runs failed at and the token-block edges, in a private and the shared scratch.
FLASH_TOKENS = (1, 2, 3, 4, 7, 10, 15, 16, 17, 20, 32, 33, 48)


def _assert_ordered(dims: Dims, tokens: int, capacity: int, **tuning) -> None:
    plan = Plan(dims, tokens, capacity=capacity, tuning=resolve(dims, tokens, **tuning))
    bad = Model(plan).unordered_reads()
    assert not bad, [
        f"S={tokens} cap={capacity}: {r.stage}{r.coords} reads line {line} that "
        f"{w.stage}{w.coords} writes, unordered"
        for r, line, w in bad[:3]
    ]


@pytest.mark.parametrize("tp", [2, 4])
def test_every_read_line_is_ordered_after_its_producers_tiny(tp: int) -> None:
    for tokens in range(1, MAX_TOKENS + 1):
        _assert_ordered(Dims.of("tiny", tp), tokens, MAX_TOKENS)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("tokens", FLASH_TOKENS)
def test_every_read_line_is_ordered_after_its_producers_flash(tp: int, tokens: int) -> None:
    for capacity in sorted({tokens, MAX_TOKENS}):
        _assert_ordered(Dims.of("dsv41-flash", tp), tokens, capacity)


@pytest.mark.parametrize("model, tp, tokens",
                         [*(("tiny", tp, s) for tp in (2, 4) for s in (5, 16, 17, 48)),
                          *(("dsv41-flash", tp, s) for tp in (2, 4) for s in (5, 17, 48))])
def test_dequantized_regions_are_ordered_after_their_producers(model: str, tp: int,
                                                                tokens: int) -> None:
    """Tuning.a_dequantized: each bf16 region is written by its MXFP8 form's producer before
    the same arrival and read by the tensor-core GEMV after the same wait."""
    _assert_ordered(Dims.of(model, tp), tokens, MAX_TOKENS, a_dequantized=True)


def test_half_x_ready_hand_off_is_caught() -> None:
    """The first kernel's Wqkv waited on its K half's xq tasks only; x8s lines hold codes
    of both halves, so an L1 line filled then could serve the other half stale codes."""
    plan = Plan(Dims.of("dsv41-flash", 4), 10)
    bad = Model(plan, split_x_ready=True).unordered_reads()
    x8s = plan.regions["x8s"]
    x8s_lines = range(x8s.offset // LINE, -(-x8s.end // LINE))
    assert bad
    for reader, (space, line), writer in bad:
        assert (reader.stage, writer.stage, space) == ("wqkv", "xq", "scratch")
        assert line in x8s_lines and reader.coords[0] != writer.coords[0]  # the other half


# -- kernel.py's loads ------------------------------------------------------------------

# Pointers to data that no task writes: the step's inputs, weights and tables.
READ_ONLY = {
    "x_ptr", "pos_ptr", "slot_ptr", "key_ptr", "cos_ptr", "sin_ptr", "sink_ptr", "w_ptr",
    "ws_ptr",
}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _plain_loads_of_launch_data(source: str) -> list[str]:
    """``tl.load`` calls without ``.cg`` whose pointer derives from a non-read-only ``*_ptr``."""
    bad = []
    for fn in ast.parse(source).body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        args = [a.arg for a in fn.args.args]
        tainted = {a for a in args if a.endswith("_ptr") and a not in READ_ONLY}
        for node in ast.walk(fn):  # names assigned from a tainted pointer are pointers too
            if isinstance(node, ast.Assign) and _names(node.value) & tainted:
                tainted |= {n for t in node.targets for n in _names(t)}
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "tl.load"):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            cg = isinstance(kw.get("cache_modifier"), ast.Constant) and (
                kw["cache_modifier"].value == ".cg"
            )
            if _names(node.args[0]) & tainted and not cg:
                bad.append(f"{fn.name}: {ast.unparse(node)}")
    return bad


def test_kernel_reads_launch_data_through_l2() -> None:
    assert _plain_loads_of_launch_data(inspect.getsource(kernel_module)) == []


def test_plain_load_check_catches_a_plain_load() -> None:
    source = (
        "def _task(q_ptr, pos_ptr, s):\n"
        "    row = q_ptr + s\n"
        "    a = tl.load(pos_ptr + s)\n"
        "    b = tl.load(row + 1, cache_modifier='.cg')\n"
        "    return tl.load(row + 2)\n"
    )
    assert _plain_loads_of_launch_data(source) == ["_task: tl.load(row + 2)"]


# -- the model's waits are kernel.py's ------------------------------------------------------


def _kernel_waits() -> dict[str, collections.Counter]:
    """The mailboxes (by name, with multiplicity) each stage's branch of ``mono_kernel`` waits
    on, read from kernel.py: its ``_wait`` calls and those of the functions it calls, a
    mailbox pointer followed through arguments and assignments; of an ``if`` / ``else`` (or an
    ``if`` that returns / the rest) the larger of the two."""
    fns = {f.name: f for f in ast.parse(inspect.getsource(kernel_module)).body
           if isinstance(f, ast.FunctionDef)}  # fmt: skip

    def calls(node: ast.AST, bound: dict) -> collections.Counter:
        out = collections.Counter()
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            name = ast.unparse(call.func)
            if name == "_wait":
                boxes = [bound[n] for n in sorted(_names(call.args[0])) if n in bound]
                assert len(boxes) == 1, ast.unparse(call)
                out[boxes[0]] += 1
            elif name in fns:
                params = [a.arg for a in fns[name].args.args]
                inner = {}
                for param, arg in [*zip(params, call.args),
                                   *((k.arg, k.value) for k in call.keywords)]:  # fmt: skip
                    for n in _names(arg) & bound.keys():
                        inner[param] = bound[n]
                if inner:
                    out += block(fns[name].body, inner)
        return out

    def block(stmts: list[ast.stmt], bound: dict) -> collections.Counter:
        bound, out = dict(bound), collections.Counter()
        for i, st in enumerate(stmts):
            if isinstance(st, ast.If) and isinstance(st.body[-1], ast.Return):  # or the rest
                rest = block(st.orelse + stmts[i + 1 :], bound)
                return out + calls(st.test, bound) + (block(st.body, bound) | rest)
            if isinstance(st, ast.If):
                out += calls(st.test, bound) + (block(st.body, bound) | block(st.orelse, bound))
            elif isinstance(st, (ast.For, ast.While)):
                out += block(st.body, bound) + block(st.orelse, bound)
            else:
                out += calls(st, bound)
                if isinstance(st, ast.Assign):
                    names = _names(st.value) & bound.keys()
                    for n in (n for t in st.targets for n in _names(t)):
                        if names:
                            bound[n] = bound[sorted(names)[0]]
                        else:
                            bound.pop(n, None)
        return out

    kernel = fns["mono_kernel"]
    boxes = {a.arg: a.arg[: -len("_ptr")] for a in kernel.args.args if a.arg.endswith("rdy_ptr")}
    # a loop a stage: ``end = (end_xq, ...)[STAGE]`` and a branch ``STAGE == k`` for each stage
    ends = next(n for n in ast.walk(kernel)
                if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "end")  # fmt: skip
    order = [ast.unparse(e)[len("end_"):] for e in ends.value.value.elts]
    chain = next(n for n in ast.walk(kernel)
                 if isinstance(n, ast.If) and ast.unparse(n.test) == "STAGE == 0")  # fmt: skip
    stages, node = {}, chain
    while True:
        stage = order[int(ast.unparse(node.test.comparators[0]))]
        stages[stage] = block(node.body, boxes)
        nxt = node.orelse[0] if len(node.orelse) == 1 else None
        if isinstance(nxt, ast.If) and ast.unparse(nxt.test).startswith("STAGE == "):
            node = nxt
        else:
            stages["last"] = block(node.orelse, boxes)
            return stages


@pytest.mark.parametrize("tp", [2, 4])
def test_model_waits_are_the_kernel_waits(tp: int) -> None:
    """Each stage of the model waits on the mailboxes kernel.py's branch for it waits on, as
    many times (a wait dropped or added in the kernel fails here)."""
    plan = Plan(Dims.of("tiny", tp), 3)
    model = Model(plan)
    kernel = _kernel_waits()
    names = [st.name for st in plan.stages]
    assert list(kernel) == [*names[:-1], "last"], list(kernel)
    kernel[names[-1]] = kernel.pop("last")
    for stage in names:
        want = {frozenset(collections.Counter(b for b, _ in t.waits).items())
                for t in model.tasks if t.stage == stage}  # fmt: skip
        assert want == {frozenset(kernel[stage].items())}, (stage, want, kernel[stage])
