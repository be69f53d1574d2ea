"""The single-launch mailbox mega kernel (docs/design.md §6): one persistent launch a layer step.

``plan.py`` (task tables and scratch layout), ``kernel.py`` (the Triton kernel),
``executor.py`` (the same task tables in PyTorch, for stage-by-stage diffs),
``launcher.py`` (``MonoRunner``, ``mono_step``), ``checks.py`` (metrics against
the reference). Nothing here imports ``dsv41.nvidia``.
"""
