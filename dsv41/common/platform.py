"""The platform a layer's kernels run on, and the NVIDIA-only features it allows.

One place decides what every launcher passes its kernels: programmatic dependent
launch (PDL: ``griddepcontrol`` / ``gdc_*``) and inline PTX (the record prefetch,
mono's ``cvt`` e4m3 conversion, the trace timers) are on only for compiled code on
an NVIDIA GPU. A ROCm torch (``torch.version.hip``) or the Triton interpreter turns
both off, so every kernel also compiles for gfx942 / gfx950. A compile-only tool
(``benchmarks/kernel_facts.py``) names its target with ``targeting``; the
launchers then choose for that target, not for the machine they run on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator

import torch

from dsv41.common import switches

TARGETS = ("sm90", "sm100", "gfx942", "gfx950")  # what kernel_facts compiles for
WARP_SIZE = {"cuda": 32, "rocm": 64}  # threads a warp (a wave on CDNA)


@dataclasses.dataclass(frozen=True)
class Platform:
    kind: str  # "cuda", "rocm" or "cpu"
    arch: str  # "sm90", "sm100", "gfx942", ... ("" on CPU)
    interpret: bool = False  # TRITON_INTERPRET=1: Triton kernels run on the CPU

    @property
    def ptx(self) -> bool:
        """Inline PTX compiles: NVIDIA code, not the interpreter."""
        return self.kind == "cuda" and not self.interpret

    @property
    def pdl(self) -> bool:
        """Programmatic dependent launch exists: inline PTX on SM90 or later."""
        return self.ptx and self.arch.startswith("sm") and int(self.arch[2:]) >= 90

    @property
    def features(self) -> str:
        """The NVIDIA-only features on, for the backend selection's log line."""
        return f"PDL {'on' if self.pdl else 'off'}, inline PTX {'on' if self.ptx else 'off'}"

    def triton_target(self):
        """Triton's ``GPUTarget`` for this platform's arch (what ``triton.compile`` takes)."""
        from triton.backends.compiler import GPUTarget

        if self.kind == "cuda":
            return GPUTarget("cuda", int(self.arch[2:]), WARP_SIZE["cuda"])
        if self.kind == "rocm":
            return GPUTarget("hip", self.arch, WARP_SIZE["rocm"])
        raise ValueError(f"platform: expected a GPU to compile for, got {self}")


def parse_target(name: str) -> Platform:
    """``"sm90"`` / ``"sm100"`` / ``"gfx942"`` / ``"gfx950"`` as a compiled (not interpreted) platform."""
    if name.startswith("sm") and name[2:].isdigit():
        return Platform("cuda", name)
    if name.startswith("gfx"):
        return Platform("rocm", name)
    raise ValueError(f"target: expected one of {TARGETS} (or another smNN / gfxNNN), got {name!r}")


@functools.cache
def _device() -> tuple[str, str]:
    """The current GPU's ``(kind, arch)``, ``("cpu", "")`` without one (asked once a process)."""
    if not torch.cuda.is_available():
        return "cpu", ""
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName
        return "rocm", arch.split(":")[0]
    major, minor = torch.cuda.get_device_capability()
    return "cuda", f"sm{major}{minor}"


def detect_platform() -> Platform:
    """What this process runs on: the current GPU's vendor and architecture, or the CPU."""
    return Platform(*_device(), switches.interpreting())


_TARGET: list[Platform] = []  # the innermost ``targeting`` platform, if any


@contextlib.contextmanager
def targeting(platform: Platform) -> Iterator[Platform]:
    """Launchers inside choose their kernels' constexprs for ``platform`` (compile-only tools)."""
    _TARGET.append(platform)
    try:
        yield platform
    finally:
        _TARGET.pop()


def current_platform() -> Platform:
    """The platform launchers choose for: the ``targeting`` one, else ``detect_platform()``."""
    return _TARGET[-1] if _TARGET else detect_platform()
