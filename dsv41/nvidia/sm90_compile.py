"""Compile a Triton kernel for a GPU target on a machine without a GPU.

What the tests that check the emitted code (``tests/nvidia/sm90.py``) and
``benchmarks/kernel_facts.py`` share: ``triton.compile`` of a jit function for a
target (SM90 by default, warp size 32; any ``dsv41.common.platform`` target), the
arguments named rather than numbered. Triton's own ptxas assembles the PTX (its
own LLVM the AMDGCN), so a kernel that compiles here also assembles. Triton reads
``TRITON_INTERPRET`` when it is imported: call this from a process without it.
"""

from __future__ import annotations

from dsv41.common.platform import Platform

SM90 = Platform("cuda", "sm90")


def compile_sm90(fn, signature: dict, constexprs: dict, attrs: dict, target: Platform = SM90,
                 **options):  # fmt: skip
    """``fn`` compiled for ``target``: ``signature`` maps every argument name to its Triton type
    (``"constexpr"`` for those in ``constexprs``, which maps them to values), ``attrs`` some
    names to their attributes (``[["tt.divisibility", 16]]``); ``options`` as
    ``triton.compile`` takes them (``num_warps`` ...). Returns the compiled kernel (``.asm``:
    ``ptx``, ``cubin`` or ``amdgcn`` ...; ``.metadata``)."""
    import triton
    from triton.compiler import ASTSource

    at = fn.arg_names.index
    src = ASTSource(fn=fn, signature=signature,
                    constexprs={(at(k),): v for k, v in constexprs.items()},
                    attrs={(at(k),): v for k, v in attrs.items()})  # fmt: skip
    return triton.compile(src, target=target.triton_target(), options=options)
