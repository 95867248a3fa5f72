"""Locate the shipped YAML rule tables, in a source checkout and in an installed wheel alike.

The wheel maps the repository's ``tables/`` folder to the package ``mla_sink.tables`` (see
pyproject.toml); a source checkout run with ``PYTHONPATH=.`` finds ``tables/`` beside ``mla_sink/``.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Callable, Optional


def table_path(name: str) -> Path:
    """Path of the shipped table ``name`` (e.g. ``'mla_decode'`` -> ``.../mla_decode.yaml``).

    Raises:
        FileNotFoundError: no such table is shipped.
    """
    filename = f"{name}.yaml"
    # a source checkout's tables/ first (the tables being edited), then the installed package data
    candidates = [Path(__file__).resolve().parents[2] / "tables" / filename]
    try:
        candidates.append(Path(str(importlib.resources.files("mla_sink.tables") / filename)))
    except ModuleNotFoundError:
        pass
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"table {name!r} not found (looked in {[str(c) for c in candidates]})")


def load_checked_table(name: str, check: Optional[Callable] = None, *, paths: Optional[tuple] = None):
    """The shipped table ``name`` loaded (:func:`dispatch.load_table`), proven by the rule-table checker (every
    combination of the declared domains gets a row, no row is shadowed: :func:`dispatch.assert_table_ok`) and,
    with ``check``, checked for what its reader relies on beyond that (``check(table)`` raises). With ``paths``, the
    table may declare no other path: its reader serves those (a row naming an unknown path was served as the real
    one: a break test, forty-third session). Callers cache it.

    Raises:
        FileNotFoundError: no such table is shipped.
        dispatch.TableError / dispatch.TableCheckError: the table is malformed (or its ``table:`` name is not
            ``name``, or it declares a path not in ``paths``), has a gap or a shadowed row.
    """
    from mla_sink import dispatch

    path = table_path(name)
    table = dispatch.load_table(path)
    if table.name != name:  # the name keys the calls' explanations and the readers' checks
        line = next((i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("table:")), 1)
        raise dispatch.TableError(f"{path}:{line}: 'table' must be {name!r}, the file's name (got {table.name!r})")
    if paths is not None:
        for path, spec in table.paths.items():
            if path not in paths:
                raise dispatch.TableError(f"{table.source_file or name}:{spec.line}: path {path!r} is not one its "
                                          f"reader serves ({', '.join(paths)})")
    dispatch.assert_table_ok(table)
    if check is not None:
        check(table)
    return table
