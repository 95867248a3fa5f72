"""Detect the current :class:`~mla_sink.core.records.Platform` without importing AITER where it is absent."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
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


def _aiter_experimental() -> bool:
    """Whether AITER's experimental kernels are on: ``AITER_ENABLE_EXPERIMENTAL`` as AITER reads it
    (``aiter/jit/core.py``, ``is_experimental_enabled``: unset or ``0`` off, any other int on, anything else off)."""
    try:
        return int(os.environ.get("AITER_ENABLE_EXPERIMENTAL", "0")) != 0
    except ValueError:
        return False


def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _installed_version(dist: str) -> Optional[str]:
    """The installed version of package ``dist`` from its metadata, or ``None`` when it has none."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def interpreter_table():
    """``tables/triton_interpreter.yaml`` (which Triton and numpy versions the CPU interpreter runs the kernels
    with), loaded and proven by the rule-table checker once per process.

    Raises:
        dispatch.TableError / dispatch.TableCheckError: the shipped table is malformed, has a gap or a shadowed row.
    """
    from mla_sink.core.tables import load_checked_table

    return load_checked_table("triton_interpreter", paths=("interpreter",))


def interpreter_refusal(triton_version: Optional[str], numpy_version: Optional[str]) -> Optional[str]:
    """Why Triton's CPU interpreter cannot run mla-sink's kernels with these versions (the text of the refusal row
    of ``tables/triton_interpreter.yaml`` that matches), or ``None`` where it can.

    Args:
        triton_version, numpy_version: PEP 440 version strings (e.g. ``"3.9.0"``, ``"2.4.6"``), ``None`` for a
            package without metadata.

    Raises:
        ValueError: a version that is not a PEP 440 version.
    """
    sel = interpreter_table().select({"triton_version": triton_version, "numpy_version": numpy_version})
    return sel.reason if sel.refused else None


def triton_interpreter_refusal() -> Optional[str]:
    """Why Triton's CPU interpreter cannot run mla-sink's kernels here: ``"Triton not importable"``, the refusal of
    ``tables/triton_interpreter.yaml`` for the installed Triton and numpy (:func:`interpreter_refusal`), or ``None``
    where it can."""
    if not _triton_available():
        return "Triton not importable"
    return interpreter_refusal(_installed_version("triton"), _installed_version("numpy"))


def triton_interpreter_ok() -> bool:
    """Whether Triton's CPU interpreter can run mla-sink's kernels here (:func:`triton_interpreter_refusal` gives no
    reason not to): Triton importable, and no row of ``tables/triton_interpreter.yaml`` refuses its version with the
    installed numpy's (Triton before 3.9 with numpy 2.5 or newer, measured 2026-11-29)."""
    return triton_interpreter_refusal() is None


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
    aiter = _aiter_version()
    return Platform(arch=arch, aiter_version=aiter, triton=triton, gluon=triton and gluon_available(),
                    num_sms=_num_sms(device_str), aiter_experimental=aiter is not None and _aiter_experimental())


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
        raise ValueError(f"{where} a torch.device or a device name such as 'cpu' or 'cuda:0' "
                         f"(got {device!r})") from None
    if dev.type == "cpu":
        return _detect_cached("cpu")
    if dev.type != "cuda":
        raise ValueError(f"{where} a cpu or cuda (CUDA/ROCm) device (got {dev})")
    if not torch.cuda.is_available() or (dev.index is not None and dev.index >= torch.cuda.device_count()):
        raise ValueError(f"{where} a device of this machine (got {dev}, which is not on this machine: its CUDA/ROCm "
                         f"devices number {torch.cuda.device_count() if torch.cuda.is_available() else 0})")
    return _detect_cached(str(dev))
