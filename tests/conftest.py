"""Kernels run under the Triton interpreter on machines without a GPU (set before triton loads)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
