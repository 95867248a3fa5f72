"""Human and JSON explanations of a ``Selection``."""

from __future__ import annotations

from typing import Sequence

from typing import Any

from .schema import format_value
from .table import Selection


def _json(value: Any) -> Any:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def default_key(selection: Selection) -> str:
    """Return ``field=value, ...`` over the selection's values.

    Args:
        selection: A ``Selection``.

    Returns:
        The header text used when ``explain`` gets no key.
    """
    return ", ".join(f"{k}={format_value(v)}" for k, v in selection.values.items())


def explain(selection: Selection, *, key: str | None = None, details: Sequence[str] = ()) -> str:
    """Render a selection as text: the winner (or refusal), then every rejected row.

    Example::

        bf16-h64-gfx942-sinks-dcp1
          → triton  {BLOCK_H: 64}   (row gfx942_bf16_h64_lse_to_triton)
            why: MI300 lacks a native BF16 LSE kernel for the 64-head bucket
            source: ROCm/aiter hsa/gfx942/mla/mla_asm.csv
          ✗ aiter_persistent: need_lse=true, needs false (writes no LSE)

    Args:
        selection: The result of ``RuleTable.select``.
        key: Header line, e.g. a call's canonical key; defaults to
            ``field=value, ...``.
        details: Lines the application adds about the chosen result (printed after its why and
            source, before the rejected rows), e.g. how the chosen path will be launched.

    Returns:
        Multi-line text (no trailing newline).
    """
    lines = [key if key is not None else default_key(selection)]
    row = selection.row
    if row is None:
        lines.append("  ✗ no row matched")
    elif selection.refused:
        lines.append(f"  ✗ refused: {selection.reason} (row {row.id})")
    else:
        params = f"  {format_value(dict(selection.params))}" if selection.params else ""
        lines.append(f"  → {selection.path}{params}   (row {row.id})")
    if row is not None:
        lines.append(f"    why: {row.why}")
        lines.append(f"    source: {row.source}")
    lines.extend(details)
    for rejected, fails in selection.rejected:
        lines.append(f"  ✗ {rejected.id}: " + "; ".join(str(f) for f in fails))
    return "\n".join(lines)


def selection_to_dict(selection: Selection) -> dict:
    """Return the selection as plain JSON types.

    Args:
        selection: The result of ``RuleTable.select``.

    Returns:
        ``{"table", "values", "path", "params", "refused", "reason", "row",
        "rejected"}``; ``row`` is ``{"id", "path", "refuse", "why", "source",
        "line"}`` or ``None``; each ``rejected`` item is ``{"row", "path",
        "failures": [{"field", "op", "actual", "expected", "because", "text"}]}``.
    """
    row = selection.row
    return {
        "table": selection.table,
        "values": _json(selection.values),
        "path": selection.path,
        "params": _json(selection.params),
        "refused": selection.refused,
        "reason": selection.reason,
        "row": None
        if row is None
        else {
            "id": row.id,
            "path": row.path,
            "refuse": row.refuse,
            "why": row.why,
            "source": row.source,
            "line": row.line,
        },
        "rejected": [
            {
                "row": r.id,
                "path": r.path,
                "failures": [
                    {
                        "field": f.field,
                        "op": f.op,
                        "actual": _json(f.actual),
                        "expected": _json(f.expected),
                        "because": f.because,
                        "text": str(f),
                    }
                    for f in fails
                ],
            }
            for r, fails in selection.rejected
        ],
    }
