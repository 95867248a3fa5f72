"""Which Triton and numpy versions the CPU interpreter runs the kernels with: ``tables/triton_interpreter.yaml``, read
by :mod:`mla_sink.core.platform` (until the forty-second session the rule was written in ``triton_interpreter_ok``).

The table decides: the shipped rows give the rule measured on 2026-11-29 (Triton before 3.9 with numpy 2.5 or newer
fails), an edited copy moves the boundary, and the CPU platform, the plan and ``mla-sink info`` follow it."""

from __future__ import annotations

import pytest

from mla_sink import dispatch
from mla_sink.core import platform as platform_mod
from mla_sink.core import tables as core_tables
from mla_sink.core.records import CallSpec

REFUSAL = "Triton's CPU interpreter before Triton 3.9 fails on the kernel's loop bounds with numpy 2.5 or newer"


@pytest.mark.parametrize("triton,numpy,refused", [
    ("3.6.0", "2.5.0", True),
    ("3.8.1", "2.6.2", True),
    ("3.9.0rc1", "2.5.0", True),  # a release candidate of 3.9 comes before 3.9 (as packaging orders it)
    ("3.6.0+git7a3b", "2.5.0", True),  # a local build of 3.6
    ("3.6.0", "2.4.6", False),
    ("3.9.0", "2.5.0", False),
    ("3.9.0", "2.4.6", False),
    ("3.10.1", "3.0.0", False),
    (None, "2.5.0", False),  # no metadata: no version condition holds (as the Python rule had it)
    ("3.6.0", None, False),
])
def test_the_shipped_rows(triton, numpy, refused):
    reason = platform_mod.interpreter_refusal(triton, numpy)
    assert (reason is not None) == refused and (reason is None or reason.startswith(REFUSAL)), reason


def test_the_table_is_proven_and_its_versions_checked():
    table = platform_mod.interpreter_table()
    assert dispatch.check_table(table) == []
    assert dispatch.check_table(table, thresholds=True) == []
    with pytest.raises(ValueError, match="triton_version"):
        platform_mod.interpreter_refusal("three point six", "2.5.0")


@pytest.fixture
def edited_interpreter_table(monkeypatch, tmp_path):
    """``edit(old, new)``: the readers get ``tables/triton_interpreter.yaml`` with ``old`` (once in it) replaced."""
    real = core_tables.table_path
    shipped = real("triton_interpreter").read_text()
    path = tmp_path / "triton_interpreter.yaml"

    def edit(old: str, new: str) -> None:
        assert shipped.count(old) == 1
        path.write_text(shipped.replace(old, new))
        monkeypatch.setattr(core_tables, "table_path",
                            lambda name: path if name == "triton_interpreter" else real(name))
        platform_mod.interpreter_table.cache_clear()

    yield edit
    monkeypatch.undo()
    platform_mod.interpreter_table.cache_clear()


def test_an_edited_table_moves_the_cpu_platform_the_plan_and_info(edited_interpreter_table, monkeypatch):
    """With Triton 3.9 and numpy 2.5 (the versions the lookup is given here) the shipped table lets the interpreter run;
    an edited boundary (below 3.10) refuses it, and the CPU platform reports no Triton, the rule table sends the call to
    the reference and ``mla-sink info`` gives the table's reason."""
    from mla_sink.core.plan import build_plan
    from mla_sink.core.records import Platform
    from mla_sink.tools.info import path_availability

    if not platform_mod._triton_available():
        pytest.skip("Triton not importable: the interpreter is off whatever the table says")
    versions = {"triton": "3.9.0", "numpy": "2.5.0"}
    monkeypatch.setattr(platform_mod, "_installed_version", lambda dist: versions[dist])
    platform_mod._detect_cached.cache_clear()
    try:
        assert platform_mod.triton_interpreter_ok() and platform_mod.detect_platform("cpu").triton
        edited_interpreter_table('triton_version: {below: "3.9", because:', 'triton_version: {below: "3.10", because:')
        platform_mod._detect_cached.cache_clear()
        assert not platform_mod.triton_interpreter_ok()
        cpu = platform_mod.detect_platform("cpu")
        assert cpu == Platform("cpu", triton=False, gluon=False, num_sms=1)
        spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=64)
        assert build_plan(spec, cpu).path == "reference"
        (triton,) = [(ok, why) for path, ok, why in path_availability(cpu) if path == "triton"]
        assert triton == (False, platform_mod.triton_interpreter_refusal()) and triton[1].startswith(REFUSAL)
    finally:
        platform_mod._detect_cached.cache_clear()
