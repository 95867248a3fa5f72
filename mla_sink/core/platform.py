"""Detect the current :class:`~mla_sink.core.records.Platform` without importing AITER where it is absent."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from typing import Any, Optional

import torch

from mla_sink.core.records import Platform


def _aiter_version() -> Optional[str]:
    """AITER's installed version from package metadata, or ``None``.

    AITER is importable only on ROCm builds of PyTorch: anywhere else it is reported absent even if a
    wheel happens to be installed. AITER itself is never imported here.
    """
    if not torch.version.hip:
        return None
    if importlib.util.find_spec("aiter") is None:
        return None
    for dist in ("amd-aiter", "aiter"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "0.0.0"  # importable from a source tree without metadata: treated as too old for LSE rows


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreter_ok() -> bool:
    """Whether Triton's CPU interpreter can run mla-sink's kernel here.

    Measured 2026-11-29: Triton 3.6's interpreter with numpy 2.5 fails on the kernel's loop bounds
    (``TypeError: only 0-dimensional arrays can be converted to Python scalars``); Triton 3.9 with
    numpy 2.4 runs it (CI). Older Triton with numpy 2.5 or newer is treated as not working.
    """
    if not _triton_available():
        return False
    from packaging.version import Version

    try:
        tv = Version(importlib.metadata.version("triton"))
        nv = Version(importlib.metadata.version("numpy"))
    except importlib.metadata.PackageNotFoundError:
        return True
    return not (tv < Version("3.9") and nv >= Version("2.5"))


def arch_of(device: Any = None) -> str:
    """Compile target of ``device`` (default: the current CUDA/ROCm device, else ``cpu``).

    ``sm{major}{minor}`` on CUDA (``sm90`` for H100/H200), ``gcnArchName`` without feature flags on
    ROCm (``gfx942``), ``cpu`` for CPU tensors or machines without a GPU.
    """
    if device is not None:
        device = torch.device(device)
        if device.type == "cpu":
            return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    if torch.version.hip:
        return str(props.gcnArchName).split(":")[0]
    return f"sm{props.major}{props.minor}"


def gluon_available() -> bool:
    """Whether the warp-specialised kernels (Triton's Gluon dialect and its sm90 primitives) import here."""
    try:
        from mla_sink.kernels.gluon import gluon_fp8, gluon_seesaw  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means the Gluon kernels cannot serve here
        return False
    return True


def _num_sms(device_str: Optional[str]) -> int:
    device = torch.device(device_str) if device_str is not None else torch.device("cuda", torch.cuda.current_device())
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def _detect_cached(device_str: Optional[str]) -> Platform:
    arch = arch_of(device_str)
    if arch == "cpu":  # the interpreter runs one program at a time: one "SM"
        return Platform(arch=arch, triton=triton_interpreter_ok(), gluon=False, num_sms=1)
    triton = _triton_available()
    return Platform(arch=arch, aiter_version=_aiter_version(), triton=triton, gluon=triton and gluon_available(),
                    num_sms=_num_sms(device_str))


def detect_platform(device: Any = None, *, tensor: Optional[str] = None) -> Platform:
    """The :class:`Platform` of ``device`` (a ``torch.device``, string or ``None`` for the default).

    CPU devices report ``arch='cpu'``, no AITER, no Gluon and one SM (the interpreter runs one program
    at a time). The answer is cached per device. ``tensor``: the name of the argument whose device this
    is (e.g. ``"sinks"``), for the error messages; default: the ``device`` argument itself.

    Raises:
        ValueError: ``device`` is not a device (or its name), or names a CUDA/ROCm device this machine
            does not have.
    """
    where = f"'{tensor}' must be on" if tensor else "'device' must be"
    if device is None:
        return _detect_cached(None)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"'device' must be a torch.device or a device name such as 'cpu' or 'cuda:0' "
                         f"(got {device!r})") from None
    if dev.type == "cpu":
        return _detect_cached("cpu")
    if dev.type != "cuda":
        raise ValueError(f"{where} a cpu or cuda (CUDA/ROCm) device (got {dev})")
    if not torch.cuda.is_available() or (dev.index is not None and dev.index >= torch.cuda.device_count()):
        raise ValueError(f"'device' {dev} is not on this machine (CUDA/ROCm devices: "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0})")
    return _detect_cached(str(dev))
