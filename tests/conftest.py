"""Shared test configuration: GPU-marked tests are skipped on machines without a CUDA/ROCm device;
interpreter-marked tests where Triton's CPU interpreter cannot run the kernel."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    from mla_sink.core.platform import triton_interpreter_ok

    no_gpu = pytest.mark.skip(reason="needs a GPU (marker 'gpu'); run on the device machine")
    no_interp = pytest.mark.skip(reason="Triton's interpreter cannot run the kernel here (triton_interpreter_ok)")
    interp_ok = triton_interpreter_ok()
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "interpreter" in item.keywords and not interp_ok:
            item.add_marker(no_interp)
