"""One way for step tests to run a backend and measure it against another, seam by seam.

``run_step(name, layer, inputs)`` calls the registry's step (``dsv41.backends``) on private
copies of the caches and returns its seams in the reference's standard layout
(``dsv41.parity.standard_seams``; ``kv`` and ``lse`` passed through where a backend
returns them) with the window cache after the step. ``step_errors`` gives
``seam_errors`` for every seam both sides have; ``assert_within`` checks them against
per-seam bounds. ``hand_written_step`` is a step whose key table and slot mapping are
written out by hand, not by the shared builders.
"""

from __future__ import annotations

import dataclasses

import torch

from dsv41 import backends
from dsv41.common.kv_cache import PagedKVCache
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights
from dsv41.parity import seam_errors, standard_seams

FLAG = 1 << 31  # a compressed-cache row in the key table: slot | 1 << 31 (int32 bits)
EXACT = {"max_abs": 0.0, "rel_l2": 0.0, "codes": 1.0}  # a seam equal bit for bit (codes all equal)


def _comp(row: int) -> int:
    return row - FLAG  # row | 1 << 31 as a signed int32


def hand_written_step(lw: LayerWeights, seed: int = 0, device="cpu") -> StepInputs:
    """Five tokens, a 6-page window cache with a record in every
    slot and a 64-row compressed cache (compressed layers):

    token 0  position 40: window keys at slots 16..25 with gaps and -1s, its own record at 26
    token 1  position 7: its own record at 48, entries past the window and compressed caches
    token 2  position 100: its own new record (slot 60) three times (duplicates), slot 5 twice
    token 3  position 101, the sequence of token 2: reads token 2's new record (slot 60) and
             inserts its own at 61, which token 4 reads
    token 4  position 102: no valid key at all in a window-only layer (-1 and past the cache)
             else compressed rows only, and token 3's new record
    """
    m = lw.dims.model
    gen = torch.Generator().manual_seed(seed)
    window = PagedKVCache(6, m.window_block, "fp8_ds_mla")
    window.insert(torch.arange(window.num_slots), torch.randn(window.num_slots, m.kv_dim,
                                                              generator=gen).bfloat16())
    comp = None
    if m.compress_ratios[lw.layer_id]:
        comp = PagedKVCache(1, 64, "fp8_ds_mla")
        comp.insert(torch.arange(64), torch.randn(64, m.kv_dim, generator=gen).bfloat16())
    n_win, keys = window.num_slots, m.keys
    rows = [
        [16, 17, -1, 19, 22, -1, -1, 25, 26],
        [n_win, 48, n_win + 100, 3],
        [60, 60, 5, 5, 60],
        [60, 61, 59],
        [-1, n_win + 1],
    ]
    if comp is not None:
        rows[0] = [_comp(3), -1, _comp(40), *rows[0]]
        rows[1] = [_comp(64), _comp(63), _comp(64 + 7), *rows[1]]
        rows[2] = [_comp(9), _comp(9), *rows[2]]
        rows[4] = [_comp(0), _comp(1), 61, *rows[4]]
    table = torch.full((5, keys), -1, dtype=torch.int32)
    for t, row in enumerate(rows):
        table[t, : len(row)] = torch.tensor(row, dtype=torch.int64).to(torch.int32)
    for cache in (window, comp):
        if cache is not None:
            cache.data = cache.data.to(device)
    return StepInputs(
        x=torch.randn(5, m.hidden, generator=gen).bfloat16().to(device),
        positions=torch.tensor([40, 7, 100, 101, 102], device=device),
        slot_mapping=torch.tensor([26, 48, 60, 61, 62], device=device),
        key_table=table.to(device), window_cache=window, compressed_cache=comp,
    )  # fmt: skip


@dataclasses.dataclass
class StepRun:
    seams: dict[str, object]  # standard layout: fp32 tensors, MX seams as (values fp32, codes)
    window: torch.Tensor  # the window cache's bytes after the step


def run_step(name: str, layer: LayerWeights, inputs: StepInputs, **kwargs) -> StepRun:
    """Backend ``name``'s step on copies of ``inputs``' caches; ``kwargs`` go to the step."""
    work = inputs.clone_caches()
    raw = backends.get(name).step(layer, work, **kwargs)
    seams = standard_seams(raw, layer, work.positions)
    for extra in ("kv", "lse"):
        if extra in raw:
            seams[extra] = raw[extra].float()
    return StepRun(seams, work.window_cache.data.clone())


def step_errors(got: StepRun, want: StepRun) -> dict[str, dict[str, float | None]]:
    """``seam_errors`` of every seam ``got`` and ``want`` both have, plus the window cache."""
    out = {name: seam_errors(got.seams[name], want.seams[name])
           for name in got.seams if name in want.seams}  # fmt: skip
    out["window"] = seam_errors(got.window.view(torch.uint8).int(),
                                want.window.view(torch.uint8).int())  # fmt: skip
    return out


def farthest_token(got: StepRun, want: StepRun, seam: str = "q") -> int:
    """The token whose ``seam`` row is farthest from ``want``'s, in relative L2."""
    a = got.seams[seam].reshape(got.seams[seam].shape[0], -1)
    b = want.seams[seam].reshape(a.shape)
    return int(((a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)).argmax())


def drop_token(run: StepRun, token: int) -> StepRun:
    """``run`` without token ``token``'s rows (every seam is token-major); window cache kept."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[:token], t[token + 1 :]])

    seams = {k: tuple(rows(p) for p in v) if isinstance(v, tuple) else rows(v)
             for k, v in run.seams.items()}  # fmt: skip
    return StepRun(seams, run.window)


def misses(errors: dict[str, dict], bounds: dict[str, dict]) -> list[str]:
    """Every seam named in ``bounds`` whose max_abs or rel_l2 is above the bound, or whose codes
    (MX seams) are below it."""
    bad = []
    for seam, bound in bounds.items():
        got = errors[seam]
        for key, limit in bound.items():
            value = got[key]
            if key == "codes" and value is None:  # not an MX seam: values only
                continue
            ok = value >= limit if key == "codes" else value <= limit
            if not ok:
                bad.append(f"{seam}.{key} = {value!r} (bound {limit!r})")
    return bad


def assert_within(errors: dict[str, dict], bounds: dict[str, dict]) -> None:
    """Every seam named in ``bounds``: max_abs and rel_l2 at most the bound, codes (MX seams)
    at least it."""
    bad = misses(errors, bounds)
    assert not bad, "; ".join(bad) + f"\nall errors: {errors}"
