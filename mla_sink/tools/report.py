"""The keys every ``mla-sink bench`` JSON report starts with, whichever mode wrote it.

The three modes (the kernel grid, ``--host``, ``--dcp``) measure different things and keep their own keys after
these; a reader that only needs to know what wrote a report, on which machine and when, reads these.
"""

from __future__ import annotations

import time

import torch

#: ``mode`` of each report: the kernel grid (:mod:`mla_sink.tools.bench`), the host cost of eager calls
#: (:mod:`mla_sink.tools.host_bench`), decode context parallelism (:mod:`mla_sink.tools.dcp_bench`).
MODES = ("kernels", "host", "dcp")


def report_header(mode: str, device: str) -> dict:
    """``{"mode", "device", "torch", "triton", "date"}`` of a benchmark report.

    Args:
        mode: one of :data:`MODES`.
        device: the GPU's name (``torch.cuda.get_device_name``).

    Returns:
        The dict; ``triton`` is Triton's version, or ``None`` where Triton is not importable; ``date`` is the
        local date, ``YYYY-MM-DD``.

    Raises:
        ValueError: ``mode`` not one of :data:`MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"'mode' must be one of {list(MODES)} (got {mode!r})")
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return dict(mode=mode, device=device, torch=torch.__version__, triton=triton_version,
                date=time.strftime("%Y-%m-%d"))
