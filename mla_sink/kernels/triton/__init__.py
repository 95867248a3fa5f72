"""Triton kernels: ``portable`` (decode), ``combine`` (split-KV merge), ``math`` (jit helpers both use),
``interpreter`` (running them on CPU tensors)."""
