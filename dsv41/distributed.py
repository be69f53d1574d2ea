"""Tensor parallelism across processes (docs/tensor_parallel.md): each rank runs its share of the
heads and groups, and the ranks' bf16 partials are summed exactly and reproducibly.

``init`` joins the process group ``torchrun`` describes ("nccl" on CUDA, which is RCCL on ROCm;
"gloo" on CPU). ``TensorParallelAttention`` builds the rank's ``DSV41Attention``, loads its
shard and runs steps through ``RankReduce``: an all-gather of every rank's bf16 partial into a
preallocated ``[tp * M, hidden]`` buffer, then ``sum_rank_partials`` (fp32 in rank order, one
rounding to bf16; docs/design.md §2), the very function the single-process reference sums with,
so the distributed output equals the single-process sum bit for bit. A bare ``all_reduce`` is
not used: NCCL fixes neither its summation order nor its accumulation precision. The reduce
reads no value on the host and writes into buffers made once, so a CUDA graph captures it with
the step. ``distributed_parity`` is ``dsv41 parity --distributed``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from dsv41.backends import DEFAULT_MAX_TOKENS
from dsv41.common.reference import sum_rank_partials
from dsv41.config import DeployConfig, ModelConfig, load_deploy_config, load_model_config
from dsv41.layer import CacheMetadata, DSV41Attention

# torch 2.13 renamed all_gather_into_tensor (same collective, same [tp * M, ...] output)
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def init(
    backend: str | None = None,
    *,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> torch.device:
    """Join the default process group (once; later calls reuse it) and return this rank's device.

    Without arguments the group is the one ``torchrun`` describes in the environment; the
    backend is "nccl" with a GPU (NCCL on NVIDIA, RCCL on ROCm), else "gloo". On a GPU the
    device is ``cuda:<local rank>`` and is made current.
    """
    on_gpu = torch.cuda.is_available()
    if not dist.is_initialized():
        backend = backend or ("nccl" if on_gpu else "gloo")
        kwargs = {k: v for k, v in (("init_method", init_method), ("rank", rank),
                                    ("world_size", world_size)) if v is not None}  # fmt: skip
        dist.init_process_group(backend, **kwargs)
    if not on_gpu:
        return torch.device("cpu")
    local = dist.get_node_local_rank(fallback_rank=dist.get_rank() % torch.cuda.device_count())
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


class RankReduce:
    """The layer output from the ranks' bf16 partials: all-gather into a buffer made once, then
    ``sum_rank_partials`` (fp32, rank order, bf16). No host sync; graph-capturable."""

    def __init__(self, tp: int, max_tokens: int, hidden: int, device: torch.device | str,
                 group: dist.ProcessGroup | None = None):  # fmt: skip
        self.tp, self.max_tokens, self.hidden, self.group = tp, max_tokens, hidden, group
        # rank r's partial lands in rows [r * M, (r + 1) * M): one contiguous [tp, M, hidden]
        self.gathered = torch.empty(tp * max_tokens, hidden, dtype=torch.bfloat16, device=device)

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        """``partial`` bf16 ``[M, hidden]`` (this rank's) -> the bf16 ``[M, hidden]`` sum."""
        m = partial.shape[0] if partial.dim() == 2 else -1
        if (partial.dtype != torch.bfloat16 or partial.dim() != 2 or partial.shape[1] != self.hidden
                or not 1 <= m <= self.max_tokens):  # fmt: skip
            raise ValueError(f"partial: expected bfloat16 [M <= {self.max_tokens}, {self.hidden}], "
                             f"got {partial.dtype} {list(partial.shape)}")  # fmt: skip
        out = self.gathered[: self.tp * m]
        _all_gather(out, partial.contiguous(), group=self.group)
        return sum_rank_partials(out.view(self.tp, m, self.hidden))


class TensorParallelAttention(nn.Module):
    """One attention layer on this process's TP rank; ``forward`` returns the whole layer output
    (the ranks' partials reduced by ``RankReduce``), the same on every rank."""

    def __init__(
        self,
        model: str | ModelConfig,
        layer_id: int,
        backend: str = "auto",
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        warmup: bool = False,
    ):
        """The process group (default: the one ``init`` joined) gives tp (its size) and the rank;
        the rest as ``DSV41Attention`` takes it."""
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("TensorParallelAttention: expected an initialised process group "
                               "(call dsv41.distributed.init() first), got none")  # fmt: skip
        cfg = model if isinstance(model, ModelConfig) else load_model_config(model)
        self.tp, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if device is None:
            on_gpu = torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu"
        self.layer = DSV41Attention(cfg, self.tp, self.rank, layer_id, backend,
                                    max_tokens=max_tokens, device=device, warmup=warmup)
        self.reduce = RankReduce(self.tp, max_tokens, cfg.hidden, device, group)

    @classmethod
    def from_deploy(cls, deploy: DeployConfig | str, layer_id: int,
                    **kwargs) -> TensorParallelAttention:  # fmt: skip
        """The layer of a deployment config; its tp must be the process group's size."""
        d = deploy if isinstance(deploy, DeployConfig) else load_deploy_config(deploy)
        world = dist.get_world_size(kwargs.get("group"))
        if d.tp != world:
            raise ValueError(f"deploy {d.name}: expected tp equal to the process group's size "
                             f"{world}, got tp {d.tp}")  # fmt: skip
        return cls(d.model, layer_id, d.backend, max_tokens=d.max_tokens, **kwargs)

    @property
    def weights(self):
        """The rank's ``LayerWeights`` (its shard, in the kernels' layouts)."""
        return self.layer.weights

    def load_weights(self, weights) -> set[str]:
        """Full checkpoint ``(name, tensor)`` pairs of the layer; its loaders keep the shard."""
        return self.layer.load_weights(weights)

    def load_checkpoint(self, ckpt_dir) -> set[str]:
        """This rank's shard of the layer from a checkpoint directory."""
        from dsv41.common.checkpoint import load_layer

        return load_layer(ckpt_dir, self.layer.weights)

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                cache_metadata: CacheMetadata) -> torch.Tensor:  # fmt: skip
        """``x`` bf16 [M, hidden], ``positions`` [M] -> the layer's bf16 [M, hidden] output."""
        return self.reduce(self.layer(x, positions, cache_metadata))


def cache_metadata(inputs) -> CacheMetadata:
    """A ``StepInputs``' caches and tables as ``DSV41Attention.forward`` takes them."""
    return CacheMetadata(inputs.slot_mapping, inputs.key_table, inputs.window_cache,
                         inputs.compressed_cache)  # fmt: skip


@dataclasses.dataclass
class DistributedResult:
    """One backend's distributed step against the single-process sums (rank 0's view)."""

    backend: str
    tp: int
    tokens: int
    equals_single_process: bool  # bit for bit, the same backend's partials summed in one process
    repeat_identical: bool  # a second step on fresh caches gave the same bits
    ranks_agree: bool  # every rank returned the same bits
    rel_l2: float  # against the reference's sum of partials
    max_abs: float
    ok: bool


def distributed_parity(
    model: str | ModelConfig,
    layer_id: int,
    tokens: int,
    backends: list[str],
    *,
    record_format: str = "fp8_ds_mla",
    seed: int = 0,
    checkpoint=None,
    rel_tol: float,
    device: torch.device | str,
) -> list[DistributedResult]:
    """Every backend's distributed step (this process's rank of the group) against the
    single-process sum of the same backend's rank partials (bit for bit) and the reference's sum
    (relative L2 <= ``rel_tol``). Collective: every rank calls it; rank 0 computes the
    single-process sums and its result list is the verdict (other ranks get an empty list)."""
    from dsv41 import backends as registry
    from dsv41.common.geometry import Dims
    from dsv41.common.scenario import make_scenario
    from dsv41.common.weights import LayerWeights
    from dsv41.parity import compare

    cfg = model if isinstance(model, ModelConfig) else load_model_config(model)
    tp, rank = dist.get_world_size(), dist.get_rank()
    dims = Dims(tp, cfg)
    sc = make_scenario(dims, layer_id, tokens, fmt=record_format, seed=seed, device=device)

    def load(weights) -> None:
        if checkpoint is None:
            weights.dummy_load(seed)
        else:
            from dsv41.common.checkpoint import load_layer

            load_layer(checkpoint, weights)

    def single_process_sum(step) -> torch.Tensor:
        partials = []
        for r in range(tp):
            lw = LayerWeights(dims, r, layer_id, device=device)
            load(lw)
            partials.append(step(lw, sc.clone_caches()))
        return sum_rank_partials(partials)

    reference = single_process_sum(registry.get("reference").forward) if rank == 0 else None
    results = []
    for name in backends:
        tpl = TensorParallelAttention(cfg, layer_id, name, max_tokens=tokens, device=device)
        load(tpl.weights)
        first, again = (tpl(sc.x, sc.positions, cache_metadata(s))
                        for s in (sc.clone_caches(), sc.clone_caches()))  # fmt: skip
        everyone = torch.empty(tp * tokens, cfg.hidden, dtype=torch.bfloat16, device=device)
        _all_gather(everyone, first)
        if rank != 0:
            continue
        single = (reference if name == "reference"
                  else single_process_sum(registry.get(name).forward))  # fmt: skip
        c = compare("y", (name, "reference"), first.float(), reference.float(), rel_tol, 0.0)
        equal, repeat = torch.equal(first, single), torch.equal(first, again)
        agree = all(torch.equal(first, other) for other in everyone.view(tp, tokens, -1))
        results.append(DistributedResult(name, tp, tokens, equal, repeat, agree, c.rel_l2,
                                         c.max_abs, equal and repeat and agree and c.ok))
    return results


def format_results(results: list[DistributedResult]) -> str:
    head = (f"{'backend':<10} {'tp':>3} {'M':>4} {'== 1-process sum':>17} {'repeat':>7} "
            f"{'ranks':>6} {'rel L2 vs ref':>14} {'max abs':>10}  status")  # fmt: skip
    lines = [head, "-" * len(head)]
    yes = lambda b: "yes" if b else "NO"  # noqa: E731
    for r in results:
        lines.append(f"{r.backend:<10} {r.tp:>3} {r.tokens:>4} {yes(r.equals_single_process):>17} "
                     f"{yes(r.repeat_identical):>7} {yes(r.ranks_agree):>6} {r.rel_l2:>14.3e} "
                     f"{r.max_abs:>10.3e}  {'ok' if r.ok else 'FAIL'}")  # fmt: skip
    return "\n".join(lines)
