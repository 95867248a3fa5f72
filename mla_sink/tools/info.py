"""Which kernel paths can run on a platform, and why not (``mla-sink info``)."""

from __future__ import annotations

from mla_sink.core.records import Platform

_AITER_ARCHS = ("gfx942", "gfx950")


def path_availability(platform: Platform) -> list[tuple[str, bool, str]]:
    """``(path, available, reason)`` for every path of the rule table on ``platform``.

    Availability is about the machine only (is the library importable, is the arch one AITER
    ships kernels for); whether a given call shape is served is the rule table's answer
    (``mla-sink explain``).
    """
    from mla_sink.core.select import KNOWN_PATHS

    rows = []
    for path in KNOWN_PATHS:
        if path.startswith("aiter"):
            if platform.aiter_version is None:
                rows.append((path, False, "AITER not importable"))
            elif platform.arch not in _AITER_ARCHS:
                rows.append((path, False, f"arch={platform.arch}, AITER MLA kernels exist for {_AITER_ARCHS}"))
            else:
                rows.append((path, True, f"AITER {platform.aiter_version} on {platform.arch}"))
        elif path == "triton":
            if not platform.triton:
                from mla_sink.core.platform import _triton_available

                why = ("Triton importable, but its CPU interpreter cannot run the kernel with this numpy "
                       "(see mla_sink.core.platform.triton_interpreter_ok); CPU calls use the reference"
                       if platform.arch == "cpu" and _triton_available() else "Triton not importable")
                rows.append((path, False, why))
            elif platform.arch == "cpu":
                rows.append((path, True, "Triton importable; CPU tensors run through Triton's interpreter"))
            else:
                rows.append((path, True, f"Triton importable; compiles for {platform.arch}"))
        else:
            rows.append((path, True, "plain PyTorch, float64; always available"))
    return rows
