"""Shared test configuration: GPU-marked tests are skipped on machines without a CUDA/ROCm device."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (marker 'gpu'); run on the device machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
