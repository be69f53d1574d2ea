"""Compile a Triton kernel for SM90 on a machine without a GPU.

What the tests that check the emitted code (``tests/nvidia/sm90.py``) and
``benchmarks/sass_facts.py`` share: ``triton.compile`` of a jit function for
SM90 (warp size 32), the arguments named rather than numbered. Triton's own
ptxas assembles the PTX, so a kernel that compiles here also assembles.
Triton reads ``TRITON_INTERPRET`` when it is imported: call this from a
process without it.
"""

from __future__ import annotations

SM90_TARGET = ("cuda", 90, 32)  # backend, compute capability, warp size


def compile_sm90(fn, signature: dict, constexprs: dict, attrs: dict, **options):
    """``fn`` compiled for SM90: ``signature`` maps every argument name to its Triton type
    (``"constexpr"`` for those in ``constexprs``, which maps them to values), ``attrs`` some
    names to their attributes (``[["tt.divisibility", 16]]``); ``options`` as
    ``triton.compile`` takes them (``num_warps`` ...). Returns the compiled kernel (``.asm``:
    ``ptx``, ``cubin`` ...; ``.metadata``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    at = fn.arg_names.index
    src = ASTSource(fn=fn, signature=signature,
                    constexprs={(at(k),): v for k, v in constexprs.items()},
                    attrs={(at(k),): v for k, v in attrs.items()})  # fmt: skip
    return triton.compile(src, target=GPUTarget(*SM90_TARGET), options=options)
