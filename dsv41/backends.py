"""The backends in one registry: name -> step, forward, launch, limits, warm-up; and the
selection a layer makes at init (docs/design.md §6.3).

Every step callable has the signature ``f(layer, inputs: StepInputs)``. ``step`` checks its
inputs and returns every seam (a dict); ``forward`` is the server path (y only, inputs
already checked, no host sync); ``launch`` enqueues y only and is graph-capturable (what
``dsv41 bench`` times; ``launch_with(name, changes)`` is a kernel backend's with its tuning
changed, for A/B runs); ``warmup(layer, max_tokens)`` compiles what such steps dispatch.
``limits(name)`` reads a backend's limits without importing its kernels; ``get(name)``
imports them.

Selection: SM90 and the SM100 family -> ``nvidia``; ROCm gfx942 / gfx950 -> ``mono``
where tp and the step's tokens are within mono's limits, else the nvidia-style Triton path;
CPU -> ``reference`` (the Triton kernels run there under ``TRITON_INTERPRET=1`` when asked
for by name). ``backend=`` or ``DSV41_BACKEND`` overrides; an impossible request fails
saying why.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from dsv41.amd.mono.plan import MAX_TOKENS as MONO_MAX_TOKENS
from dsv41.amd.mono.plan import MONO_TP
from dsv41.common import switches
from dsv41.common.kv_cache import RECORD_FORMATS
from dsv41.common.platform import Platform
from dsv41.common.step_inputs import StepInputs
from dsv41.common.weights import LayerWeights

NAMES = ("nvidia", "mono", "reference")
KERNEL_BACKENDS = ("nvidia", "mono")  # what parity compares with the reference
ROCM_MONO_ARCHS = ("gfx942", "gfx950")  # MI300 / MI355: where mono was designed and tuned

StepFn = Callable[[LayerWeights, StepInputs], dict]
ForwardFn = Callable[[LayerWeights, StepInputs], torch.Tensor]
WarmupFn = Callable[[LayerWeights, int], dict]  # (layer, max_tokens) -> seconds per variant


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a backend can run: tp shares, tokens a step, KV record formats."""

    tp: tuple[int, ...] | None  # None: any share
    max_tokens: int | None  # None: any M
    record_formats: tuple[str, ...]

    def refusal(self, tp: int, tokens: int, record_format: str | None = None) -> str | None:
        """Why a step at ``tp`` of ``tokens`` tokens (in ``record_format``) cannot run, or None."""
        if self.tp is not None and tp not in self.tp:
            return f"expected tp in {self.tp} (its task tables are laid out for them), got tp {tp}"
        if self.max_tokens is not None and tokens > self.max_tokens:
            return (f"expected max_tokens <= {self.max_tokens} (its scratch holds that many), "
                    f"got {tokens}")  # fmt: skip
        if record_format is not None and record_format not in self.record_formats:
            return f"expected a record format in {self.record_formats}, got {record_format!r}"
        return None

    def describe(self) -> str:
        """The limits in words: tp shares, tokens a step, record formats."""
        tp = "any tp" if self.tp is None else f"tp in {self.tp}"
        tokens = "any tokens" if self.max_tokens is None else f"at most {self.max_tokens} tokens"
        return f"{tp}, {tokens}, record formats {', '.join(self.record_formats)}"


LIMITS = {
    "nvidia": Limits(None, None, tuple(RECORD_FORMATS)),
    "mono": Limits(MONO_TP, MONO_MAX_TOKENS, ("fp8_ds_mla",)),
    "reference": Limits(None, None, tuple(RECORD_FORMATS)),
}
DEFAULT_MAX_TOKENS = MONO_MAX_TOKENS  # a decode step's tokens at most, unless a layer says


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    step: StepFn  # checks, returns every seam
    forward: ForwardFn  # server path: y, no checks, no host sync
    launch: ForwardFn  # enqueue y only, graph-capturable (the bench's)
    limits: Limits
    warmup: WarmupFn  # compiles every kernel variant a step of up to max_tokens dispatches


def limits(name: str) -> Limits:
    """A backend's limits, its kernels not imported."""
    _check_name(name)
    return LIMITS[name]


@functools.cache
def get(name: str) -> Backend:
    """The backend called ``name``, its kernels imported."""
    _check_name(name)
    if name == "nvidia":
        from dsv41.nvidia.step import nvidia_forward, nvidia_step
        from dsv41.nvidia.warmup import warmup_up_to

        return Backend(name, nvidia_step, nvidia_forward, nvidia_forward, LIMITS[name],
                       warmup_up_to)  # fmt: skip
    if name == "mono":
        from dsv41.amd.mono.launcher import mono_forward, mono_launch, mono_step
        from dsv41.amd.mono.warmup import warmup

        return Backend(name, mono_step, mono_forward, mono_launch, LIMITS[name], warmup)
    from dsv41.common.reference import reference_step

    def step(layer: LayerWeights, inputs: StepInputs) -> dict:
        return vars(reference_step(layer, inputs))

    def forward(layer: LayerWeights, inputs: StepInputs) -> torch.Tensor:
        return reference_step(layer, inputs).y

    def warmup(layer: LayerWeights, max_tokens: int) -> dict:  # nothing to compile
        return {}

    return Backend(name, step, forward, forward, LIMITS[name], warmup)


def tuning_type(name: str) -> type:
    """The frozen dataclass of a kernel backend's launch choices (what ``launch_with``
    changes)."""
    if name == "nvidia":
        from dsv41.nvidia.tuning import Tuning

        return Tuning
    if name == "mono":
        from dsv41.amd.mono.tuning import Tuning

        return Tuning
    raise ValueError(f"backend: expected one of {KERNEL_BACKENDS} (a tuning to change), "
                     f"got {name!r}")  # fmt: skip


def launch_with(name: str, changes: dict[str, object]) -> ForwardFn:
    """``get(name).launch`` with ``changes`` applied to the tuning the backend resolves for each
    step's M (nvidia: to ``tuning_for``'s, a dotted name reaching a nested field; mono:
    ``resolve(dims, M, **changes)``, in runners of its own), for A/B runs (``dsv41 bench
    --variant``); the serving path keeps its defaults."""
    tuning_type(name)  # a kernel backend's name
    if name == "nvidia":
        from dsv41.nvidia.step import nvidia_step
        from dsv41.nvidia.tuning import changed, tuning_for

        def launch(layer: LayerWeights, inputs: StepInputs) -> torch.Tensor:
            tuning = changed(tuning_for(layer.dims, inputs.x.device, inputs.tokens), changes)
            return nvidia_step(layer, inputs, check=False, tuning=tuning)["y"]

        return launch
    from dsv41.amd.mono.launcher import mono_launch
    from dsv41.amd.mono.tuning import resolve

    def launch(layer: LayerWeights, inputs: StepInputs) -> torch.Tensor:
        return mono_launch(layer, inputs, resolve(layer.dims, inputs.tokens, **changes))

    return launch


def _check_name(name: str) -> None:
    if name not in NAMES:
        raise ValueError(f"backend: expected one of {NAMES}, got {name!r}")


def refusals(tp: int, tokens: int, record_format: str | None = None) -> dict[str, str]:
    """Kernel backends that cannot run a step at (tp, tokens, record_format), each with why."""
    found = {n: LIMITS[n].refusal(tp, tokens, record_format) for n in KERNEL_BACKENDS}
    return {n: why for n, why in found.items() if why}


def available(
    tp: int, tokens: int, requested: str | None = None, record_format: str | None = None
) -> list[str]:
    """Kernel backends this machine can run for (tp, tokens, record_format) (on CPU through the
    Triton interpreter): ``requested`` (comma-separated names) checked, or all that fit."""
    refused = refusals(tp, tokens, record_format)
    names = [n for n in KERNEL_BACKENDS if n not in refused]
    if requested:
        wanted = [n.strip() for n in requested.split(",") if n.strip()]
        for n in wanted:
            if n not in KERNEL_BACKENDS:
                raise ValueError(f"--backends: expected names from {', '.join(KERNEL_BACKENDS)}, "
                                 f"got {n!r}")  # fmt: skip
            if n in refused:
                step = f"tp {tp} with {tokens} tokens"
                step += f" in {record_format}" if record_format else ""
                raise ValueError(f"--backends: {n} cannot run at {step}: {refused[n]}; "
                                 f"{n}'s limits: {LIMITS[n].describe()}")  # fmt: skip
        names = wanted
    return names


def _nvidia_native(arch: str) -> bool:
    """SM90 (Hopper) and the SM100 family (sm100, sm103, sm110): the archs the nvidia kernels
    target."""
    return arch == "sm90" or arch[:4] in ("sm10", "sm11")


def select(
    platform: Platform, tp: int, max_tokens: int, requested: str = "auto"
) -> tuple[str, str]:
    """``(backend, reason)`` for a layer at ``tp`` running up to ``max_tokens`` a step; raises
    when impossible."""
    source = "backend="
    if requested == "auto" and switches.backend_override():
        requested, source = switches.backend_override(), "DSV41_BACKEND"
    if requested != "auto" and requested not in NAMES:
        raise ValueError(
            f"backend: expected one of {('auto', *NAMES)}, got {requested!r} (from {source})"
        )
    on_cpu = platform.kind == "cpu"
    if requested != "auto":
        if requested == "reference":
            return "reference", f"requested by {source}"
        if on_cpu and not platform.interpret:
            raise ValueError(
                f"backend {requested!r} needs a GPU; on this CPU-only machine set "
                f"TRITON_INTERPRET=1 to run its Triton kernels in the interpreter, or use "
                f"backend='reference'"
            )
        why = LIMITS[requested].refusal(tp, max_tokens)
        if why:
            raise ValueError(f"backend {requested!r}: {why}")
        return requested, f"requested by {source}"
    if on_cpu:
        return "reference", ("no GPU: the eager PyTorch reference (TRITON_INTERPRET=1 and "
                             "backend='nvidia' run the kernels)")  # fmt: skip
    if platform.kind == "cuda":
        if _nvidia_native(platform.arch):
            return "nvidia", f"NVIDIA {platform.arch}: FlashMLA-style kernels"
        raise ValueError(
            f"no kernel backend targets NVIDIA {platform.arch} (SM90 and the SM100 family do); "
            f"pass backend='nvidia' to try the Triton kernels there or backend='reference'"
        )
    if platform.arch not in ROCM_MONO_ARCHS:
        raise ValueError(
            f"no kernel backend targets ROCm {platform.arch} ({', '.join(ROCM_MONO_ARCHS)} do); "
            f"pass backend='nvidia' (the portable Triton path) or backend='reference'"
        )
    mono = LIMITS["mono"]
    if mono.refusal(tp, max_tokens) is None:
        return "mono", (f"ROCm {platform.arch}, tp {tp}, <= {mono.max_tokens} tokens: "
                        f"single-launch mono kernel")  # fmt: skip
    return "nvidia", (
        f"ROCm {platform.arch} but mono needs tp in {mono.tp} and <= {mono.max_tokens} tokens "
        f"(tp {tp}, max_tokens {max_tokens}): the nvidia-style Triton path"
    )
