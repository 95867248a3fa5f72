"""Which kernel paths can run on a platform, and why not (``mla-sink info``)."""

from __future__ import annotations

from mla_sink.core.platform import arch_of
from mla_sink.core.records import Platform


def path_availability(platform: Platform) -> list[tuple[str, bool, str]]:
    """``(path, available, reason)`` for every path of the rule table on ``platform``.

    Availability is about the machine only: a path whose ``requires`` in ``tables/mla_decode.yaml``
    fail on the machine's fields (arch, AITER version; e.g. the AITER paths off gfx942/gfx950 or
    without AITER) is unavailable with those failures as the reason; ``triton`` needs Triton, the
    reference runs anywhere. Whether a given call shape is served is the rule table's answer
    (``mla-sink explain``).
    """
    from mla_sink import dispatch
    from mla_sink.core.select import KNOWN_PATHS, path_platform_failures

    on_cpu = platform.arch == arch_of("cpu")
    reasons = dispatch.ReasonsOnce()  # paths sharing requirements: each reason written once
    rows = []
    for path in KNOWN_PATHS:
        fails = path_platform_failures(path, platform)
        if fails:
            rows.append((path, False, "; ".join(dispatch.statements(reasons(fails)))))
        elif path.startswith("aiter"):
            rows.append((path, True, f"AITER {platform.aiter_version} on {platform.arch}"))
        elif path == "triton":
            if not platform.triton:
                from mla_sink.core.platform import _triton_available, triton_interpreter_refusal

                why = ((triton_interpreter_refusal() or "Triton's CPU interpreter is off on this platform record")
                       if on_cpu and _triton_available() else "Triton not importable")
                rows.append((path, False, why))
            elif on_cpu:
                rows.append((path, True, "Triton importable; CPU tensors run through Triton's interpreter"))
            else:
                rows.append((path, True, f"Triton importable; compiles for {platform.arch}"))
        else:
            rows.append((path, True, "plain PyTorch, float64; always available"))
    return rows
