"""Every AITER call the rule table can make, planned and launched through the contract fake.

The table (which path), the planner (which call) and the documented AITER contract must agree: for
each arch x dtype x head count x qlen x sinks that the table sends to an AITER path, `prepare()`
accepts it and the planned call runs through `AiterContractFake` to the float64 reference. A head
count the table routes to a persistent kernel AITER does not have, or an LSE path that aborts, fails
here. (The fake models AITER's documented contract; it is not evidence that AITER runs.)
"""

from __future__ import annotations

import pytest

from aiter_contract import AiterContractFake
from mla_sink.paths.aiter import AiterWorkspace, launch_aiter
from mla_sink.core.records import CallSpec, Platform
from mla_sink.api import prepare
from test_aiter_contract import TOPK, assert_matches_reference, make_inputs

ARCH_DTYPES = [("gfx942", "bf16"), ("gfx942", "fp8_e4m3fnuz"), ("gfx950", "bf16"), ("gfx950", "fp8_e4m3")]
HEADS = [1, 5, 8, 16, 20, 24, 32, 40, 48, 64, 80, 112, 128]


def _aiter_cases():
    cases = []
    for arch, q in ARCH_DTYPES:
        for h in HEADS:
            for sinks in (False, True):
                spec = CallSpec(q_dtype=q, kv_dtype=q, num_heads=h, topk=TOPK, sinks=sinks)
                platform = Platform(arch=arch, aiter_version="0.1.20")
                plan = prepare(spec, platform)
                if plan.path.startswith("aiter"):
                    cases.append(pytest.param(plan, arch, h, q, sinks, id=f"{arch}-{q}-h{h}-{'sinks' if sinks else 'nosinks'}-{plan.row_id}"))
    return cases


CASES = _aiter_cases()


def test_the_sweep_covers_every_aiter_row():
    from mla_sink.core.select import mla_table

    aiter_rows = {r.id for r in mla_table().rows if r.path and r.path.startswith("aiter")}
    assert {c.values[0].row_id for c in CASES} == aiter_rows


@pytest.mark.parametrize("heuristic_splits", [None, 1], ids=["own-splits", "one-split"])
@pytest.mark.parametrize("plan,arch,h,q,sinks", CASES)
def test_table_plan_and_contract_agree(plan, arch, h, q, sinks, heuristic_splits):
    """``one-split``: AITER's split heuristic picks one split, as it does at T=256 and topk 2048 on MI300 (its
    choice depends on the batch and the CU count, which the fake's small calls do not reach); a non-persistent
    row must still get its LSE written (fortieth session's review: the bf16 rows at 32 heads on gfx942, 64 and
    128 heads on both archs got none, so the sink and the DCP merge read uninitialised memory)."""
    x = make_inputs(3, h, q, sinks="finite" if sinks else None)
    fake = AiterContractFake(arch=arch, heuristic_splits=heuristic_splits)
    out, lse = launch_aiter(plan, x, impl=fake, workspace=AiterWorkspace())
    assert_matches_reference(x, out, lse)
    # every call is launched with one query row per batch: max_seqlen_q (and the metadata's qo lengths) = 1
    assert [c["max_seqlen_q"] for c in fake.calls] == [1] and fake.calls[0]["qo_rows"] == 1
    assert all(value == 1 for _, _, value in fake.qlen_args), fake.qlen_args
