"""Shared test configuration: GPU-marked tests are skipped on machines without a CUDA/ROCm device;
interpreter-marked tests where Triton's CPU interpreter cannot run the kernel; every test starts from one global
torch seed."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    from mla_sink.core.platform import triton_interpreter_ok

    no_gpu = pytest.mark.skip(reason="needs a GPU (marker 'gpu'); run on the device machine")
    no_interp = pytest.mark.skip(reason="Triton's interpreter cannot run the kernel here (triton_interpreter_ok)")
    interp_ok = triton_interpreter_ok()
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "interpreter" in item.keywords and not interp_ok:
            item.add_marker(no_interp)


@pytest.fixture(autouse=True)
def _seeded_global_rng():
    """Each test starts from the same global torch seed, so that a test drawing from the global generator (rather
    than its own ``torch.Generator``) gets the same data whichever tests ran before it: a new test no longer changes
    an older one's inputs (a case of ``test_kernel_topk_length_noncontiguous_q_and_sinks`` turned NaN only after
    tests were added before it; twenty-fourth session)."""
    torch.manual_seed(0)
    yield


def _clear_tuning_caches() -> None:
    """Drop every cache that holds ``tables/triton_tuning.yaml`` or what was planned from it."""
    from mla_sink import api
    from mla_sink.core import plan as core_plan
    from mla_sink.paths.triton import plan as triton_plan

    for cached in (triton_plan.tuning_table, triton_plan._lookup, triton_plan.triton_config,
                   triton_plan.seesaw_stride_multiple, core_plan._build_plan_cached):
        cached.cache_clear()
    api.forget_prepared_calls()


@pytest.fixture
def edited_tuning_table(monkeypatch, tmp_path):
    """``edit(old, new)``: every reader of ``tables/triton_tuning.yaml`` (the plan, the launcher, explain) gets the
    shipped text with ``old`` (which must occur exactly once) replaced by ``new``, for the rest of the test; the
    caches that hold the table or plans made from it are cleared before and after."""
    from mla_sink.core import tables as core_tables

    real = core_tables.table_path
    shipped = real("triton_tuning").read_text()
    path = tmp_path / "triton_tuning.yaml"

    def edit(old: str, new: str) -> None:
        assert shipped.count(old) == 1, old
        path.write_text(shipped.replace(old, new))
        monkeypatch.setattr(core_tables, "table_path", lambda name: path if name == "triton_tuning" else real(name))
        _clear_tuning_caches()

    yield edit
    monkeypatch.undo()
    _clear_tuning_caches()
