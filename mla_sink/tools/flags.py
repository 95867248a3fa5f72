"""The CLI's flag checks, shared by its commands: range checks whose errors name the flag, the value and what is
allowed, raised before anything is allocated or launched; and the flag put in front of a library error raised
for the record field that flag gave (:func:`flag_named`)."""

from __future__ import annotations

import os

from mla_sink.core.records import COUNT_MAX  # the largest count a flag may give: int32's

#: The seeds ``torch.Generator.manual_seed`` takes as unsigned 64-bit values.
SEED_MAX = 2 ** 64 - 1
#: How the CLI says "no forced path" in a refused ``--path``'s message (:func:`mla_sink.core.select.check_path`).
CLI_UNSET_PATH = "no --path"


def check_count(flag: str, value: int, low: int = 1, high: int = COUNT_MAX) -> None:
    """``value`` in ``[low, high]`` (``low`` 0 for ``--tokens``: a call of no tokens is a valid call; ``high``
    :data:`~mla_sink.core.records.TOPK_MAX`, 2^30, for ``--topk``, as the records take it).

    Raises:
        ValueError: naming ``flag`` (e.g. ``'--heads'``) and the allowed range.
    """
    if not low <= value <= high:
        raise ValueError(f"'{flag}' must be in [{low}, {high}] (got {value})")


def check_int_count(flag: str, value) -> None:
    """``value`` an int (not a bool) in ``[1, COUNT_MAX]``: the benchmarks' count flags, whose values may also come
    from a Namespace built in code.

    Raises:
        ValueError: naming ``flag`` (e.g. ``'--reps'``), the value and the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= COUNT_MAX:
        raise ValueError(f"'{flag}' must be an int in [1, {COUNT_MAX}] (got {value!r})")


def check_seed(flag: str, value: int) -> None:
    """``value`` in ``[0, SEED_MAX]``.

    Raises:
        ValueError: naming ``flag`` and the allowed range.
    """
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"'{flag}' must be in [0, 2**64 - 1] (got {value})")


def check_not_empty(flag: str, value, default: str) -> None:
    """A given string flag is not blank: leaving the flag out is how to ask for its ``default`` (named in the
    message), and an empty value is a mistake, not a silent default.

    Raises:
        ValueError: naming ``flag``.
    """
    if value is not None and not value.strip():
        raise ValueError(f"'{flag}' must not be empty (got {value!r}); leave it out for {default}")


def check_output_path(flag: str, path) -> None:
    """A given output file (``--json``, ``--png``) can be written: its folder exists and is writable and the path is
    not a folder - checked before a benchmark runs, whose report would otherwise be lost to a traceback at the end.
    An empty or ``None`` path (the flag left out) passes.

    Raises:
        ValueError: naming ``flag``, the path and what is wrong.
    """
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"'{flag}' must name a file, not a folder (got {path!r})")
    if not os.path.isdir(folder):
        raise ValueError(f"'{flag}' must be a file in an existing folder (got {path!r}: no folder {folder!r})")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"'{flag}' must be a file in a writable folder (got {path!r}: {folder!r} is not writable)")


#: The flag that gives each record field that the library's errors name (``'arch' must be ...``).
FIELD_FLAGS = {"arch": "--arch", "aiter_version": "--aiter", "logit_cap": "--logit-cap", "path": "--path",
               "q_dtype": "--q-dtype", "kv_dtype": "--kv-dtype", "num_heads": "--heads", "topk": "--topk",
               "dcp_world_size": "--dcp", "num_sms": "--sms"}


#: The flags that give a dtype pair, by how the library's pair error names the pair
#: (:func:`mla_sink.core.dtypes.pair_error`): the records' fields (``explain``) or the tensors' dtypes (``demo``).
PAIR_FLAGS = {"('q_dtype', 'kv_dtype') ": "--q-dtype/--kv-dtype", "(q dtype, kv_cache dtype) ": "--q-dtype/--kv-dtype"}


def flag_named(message: str) -> str:
    """A library error raised for a flag's value, with that flag in front where the message starts with the record
    field's name: ``'arch' must be ...`` -> ``--arch: 'arch' must be ...`` (a refused dtype pair: both flags);
    other messages as they are."""
    for field, flag in FIELD_FLAGS.items():
        if message.startswith(f"'{field}' "):
            return f"{flag}: {message}"
    for start, flags in PAIR_FLAGS.items():
        if message.startswith(start):
            return f"{flags}: {message}"
    return message
