"""AITER calls of more id slots (``T * topk``) than one AITER call indexes: served as consecutive token chunks.

AITER's ``kv_indptr`` and the persistent plan's row starts are int32, so one call indexes at most 2^31 - 1 id slots
(:data:`mla_sink.paths.aiter.plan.MAX_ID_SLOTS`). Such a call used to be refused ("call with fewer tokens"); now it
runs as chunks of ``MAX_ID_SLOTS // topk`` tokens, each a complete AITER call. 2^31 ids cannot be allocated here, so
the tests lower the bound (``max_id_slots`` of the planner, the contract fake's own bound) and check, on adversarial
inputs, that the chunked call equals the float64 reference and, bit for bit, the same call unchunked; that each
chunk's AITER call gets its own buffers and metadata (batch size, ``kv_indptr`` from 0 over its own rows, the split
heuristic asked for its own batch size); and that the fake, like AITER, cannot take the unchunked call.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from mla_sink.core.plan import build_plan
from mla_sink.core.records import TOPK_MAX, CallSpec, Platform
from mla_sink.paths.aiter import (
    MAX_ID_SLOTS,
    AiterCall,
    AiterChunkedCall,
    AiterWorkspace,
    launch_aiter,
    plan_aiter,
    plan_aiter_launch,
    run_call,
    valid_id_mask,
)

from aiter_contract import AiterAbort, AiterContractFake
from test_aiter_contract import N_ROWS, PATH_CASES, TOPK, assert_matches_reference, make_inputs, make_plan

#: the lowered bound: chunks of 3 tokens at topk 24; T = 8 runs as chunks of 3, 3 and 2 tokens
LIMIT = 3 * TOPK + 5
T = 8
CHUNKS = [(0, 3), (3, 6), (6, 8)]

#: PATH_CASES and two of odd head counts: 5 heads padded to 16 (non-persistent), 17 padded to 32 (persistent)
CASES = PATH_CASES + [
    ("lse-bf16-h5-padded", "aiter_lse", "gfx942", "bf16", 5, {}, {}, True),
    ("persistent-bf16-h17-lse", "aiter_persistent", "gfx950", "bf16", 17, {"return_lse": True}, {}, True),
]
CASE_SINKS = [pytest.param(case, sinks, id=f"{case[0]}-{sinks}") for sinks in (None, "finite", "inf")
              for case in CASES if case[-1] or sinks is None]


def adversarial_inputs(H: int, q_key: str, sinks, *, seed: int = 0, **kw):
    """:func:`make_inputs` at T = 8 (-1 mid-row, ids >= N, negative ids, an all-invalid row, NaN in unreferenced
    rows, ``topk_length``), and a whole chunk (tokens 3-5) with no valid id: -1, ids past N and negative ids."""
    x = make_inputs(T, H, q_key, sinks=sinks, seed=seed, **kw)
    idx = x.indices.clone()
    idx[3:6] = -1
    idx[3, ::3] = N_ROWS + 11
    idx[4, 1::4] = -5
    return x._replace(indices=idx)


def chunked_plan(path, arch, q_key, H, params, sinks):
    plan = make_plan(path, arch, q_key, H, params=params, sinks=sinks is not None)
    launch = plan_aiter_launch(plan, num_tokens=T, max_id_slots=LIMIT)
    return attrs.evolve(plan, num_tokens=T, launch=launch), launch


@pytest.mark.parametrize("case,sinks", CASE_SINKS)
def test_a_chunked_call_equals_the_reference_and_the_unchunked_call(case, sinks):
    _, path, arch, q_key, H, params, fake_kw, has_lse = case
    plan, launch = chunked_plan(path, arch, q_key, H, params, sinks)
    assert isinstance(launch, AiterChunkedCall) and launch.chunks == CHUNKS and launch.num_chunks == len(CHUNKS)
    assert [c.num_tokens for c in launch.calls] == [3, 2] and launch.chunk_tokens == LIMIT // TOPK
    x = adversarial_inputs(H, q_key, sinks, noncontig_q=H == 16)
    fake = AiterContractFake(arch=arch, max_id_slots=LIMIT, **fake_kw)
    ws = AiterWorkspace()
    out, lse = launch_aiter(plan, x, impl=fake, workspace=ws)
    assert (lse is not None) == has_lse and out.shape == (T, H, 512)
    assert_matches_reference(x, out, lse)
    for t in (1, 3, 4, 5):  # rows with no valid id, a whole chunk of them included
        assert torch.all(out[t] == 0) and (lse is None or torch.all(lse[t] == float("-inf")))
    # the same call unchunked (on a fake whose bound it fits) gives the same bits
    ref_out, ref_lse = launch_aiter(make_plan(path, arch, q_key, H, params=params, sinks=sinks is not None), x,
                                    impl=AiterContractFake(arch=arch, **fake_kw), workspace=AiterWorkspace())
    assert torch.equal(out, ref_out) and (lse is None or torch.equal(lse, ref_lse))
    # one AITER call per chunk, each of its own tokens' ids: batch, kv_indices within the bound, kv_indptr from 0
    assert [c["batch"] for c in fake.calls] == [b - a for a, b in CHUNKS]
    mask = valid_id_mask(x.indices, N_ROWS, x.topk_length)
    for (a, b), got in zip(CHUNKS, fake.calls):
        assert got["kv_indices_size"] == (b - a) * TOPK <= LIMIT
        assert got["kv_indptr"] == [0] + mask[a:b].sum(1).cumsum(0).tolist()
        assert got["max_seqlen_q"] == 1 and got["qo_rows"] == 1
    assert len(ws) == 2  # the full chunks share one buffer set, the shorter last chunk has its own
    if path == "aiter_persistent":
        assert fake.metadata_fills == len(CHUNKS)  # each chunk's work plan, for its own kv_indptr
    if path == "aiter_lse_fp8_two_split":  # AITER's split heuristic asked per chunk, forced to at least 2
        assert all(c["num_kv_splits"] >= 2 and c["num_kv_splits_indptr_given"] for c in fake.calls)


def test_the_fake_like_aiter_cannot_take_the_call_unchunked():
    """The failure mode the chunks avoid is real in the contract fake: one call of 8 * 24 id slots past its bound."""
    plan = make_plan("aiter_lse", "gfx942", "bf16", 16)
    x = adversarial_inputs(16, "bf16", "finite")
    with pytest.raises(AiterAbort, match="int32"):
        run_call(plan_aiter(plan, num_tokens=T), x, impl=AiterContractFake(max_id_slots=LIMIT),
                 workspace=AiterWorkspace())


def test_a_chunked_call_writes_the_callers_out_and_takes_a_whole_number_of_chunks():
    """``out`` given: each chunk writes its rows of it. T = 6, a multiple of the chunk: two chunks of one call."""
    plan = make_plan("aiter_lse_fp8_two_split", "gfx942", "fp8_e4m3fnuz", 16)
    launch = plan_aiter_launch(plan, num_tokens=6, max_id_slots=LIMIT)
    assert launch.chunks == [(0, 3), (3, 6)] and len(launch.calls) == 1
    x = make_inputs(6, 16, "fp8_e4m3fnuz", sinks="inf")
    buf = torch.full((6, 16, 512), 7.0, dtype=torch.bfloat16)
    fake = AiterContractFake(max_id_slots=LIMIT, heuristic_splits=1)
    out, lse = launch_aiter(attrs.evolve(plan, num_tokens=6, launch=launch), x._replace(out=buf), impl=fake,
                            workspace=AiterWorkspace())
    assert out is buf
    assert_matches_reference(x, out, lse)
    assert [c["num_kv_splits"] for c in fake.calls] == [2, 2]  # AITER's pick of 1 forced to 2 in each chunk


def test_a_call_that_fits_is_planned_and_launched_as_one_call():
    """The plan of a call within the bound is the one AiterCall it was before; its runner is one call's (the chunks'
    runner is never built): the hot path of ordinary calls is unchanged."""
    import mla_sink.paths.aiter.launch as launch_mod

    plan = make_plan("aiter_lse", "gfx942", "bf16", 16)
    assert plan_aiter_launch(plan, num_tokens=3, max_id_slots=LIMIT) == plan_aiter(plan, num_tokens=3)
    runner = launch_mod.prepare_aiter(plan, make_inputs(3, 16, "bf16"), impl=AiterContractFake(),
                                      workspace=AiterWorkspace())
    assert runner.__qualname__.startswith("_call_runner.")


def test_the_real_bound_chunks_past_2_31_id_slots():
    """At MAX_ID_SLOTS itself (planning only: no tensor): the most tokens one call takes is one call; one more is two
    chunks, through the library's plan (build_plan) as through the planner."""
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=2048, sinks=True)
    platform = Platform(arch="gfx950", aiter_version="0.1.20", num_sms=256)
    most = MAX_ID_SLOTS // 2048
    one = build_plan(spec, platform, num_tokens=most).launch
    assert isinstance(one, AiterCall) and one.kv_indices_size == most * 2048 <= MAX_ID_SLOTS
    two = build_plan(spec, platform, num_tokens=most + 1).launch
    assert isinstance(two, AiterChunkedCall) and two.chunks == [(0, most), (most, most + 1)]
    assert all(c.kv_indices_size <= MAX_ID_SLOTS for c in two.calls)
    assert f"{most + 1} * 2048 = {(most + 1) * 2048} id slots exceed {MAX_ID_SLOTS}" in two.why


def test_no_topk_is_too_large_for_a_chunk_at_the_real_bound_and_a_lowered_one_is_refused_naming_topk():
    """Only a single token whose topk alone exceeds the bound cannot be served: never at the real bound (topk <=
    2^30 < 2^31 - 1, a chunk of one token at the largest topk), only at a lowered one."""
    assert TOPK_MAX < MAX_ID_SLOTS
    plan = make_plan("aiter_persistent", "gfx950", "bf16", 16, params={"return_lse": True})
    plan = attrs.evolve(plan, spec=attrs.evolve(plan.spec, topk=TOPK_MAX))
    launch = plan_aiter_launch(plan, num_tokens=3)
    assert launch.chunks == [(0, 1), (1, 2), (2, 3)] and launch.calls[0].metadata.batch_size == 1
    with pytest.raises(ValueError, match=r"'topk' = 24 ids of one token exceed 23, the most id slots one AITER call"):
        plan_aiter_launch(make_plan("aiter_lse", "gfx942", "bf16", 16), num_tokens=2, max_id_slots=TOPK - 1)


def test_plan_aiter_alone_still_plans_one_call_and_names_the_chunking_planner():
    plan = make_plan("aiter_lse", "gfx942", "bf16", 16)
    with pytest.raises(ValueError, match=r"8 \* 24 = 192 id slots exceeds 77.*at most 3 tokens; plan_aiter_launch"):
        plan_aiter(plan, num_tokens=T, max_id_slots=LIMIT)
    for bad in (0, 2 ** 31, 1.5, True):
        with pytest.raises(ValueError, match=r"'max_id_slots' must be an int in \[1, 2\^31 - 1\]"):
            plan_aiter_launch(plan, num_tokens=T, max_id_slots=bad)


@pytest.mark.parametrize("change,text", [
    (dict(calls=()), "'calls' must be a tuple of one or two AiterCall"),
    (dict(num_tokens=3), "'num_tokens' must exceed a chunk's 3 tokens"),
    (dict(num_tokens=9), "'calls' must end with the last chunk's 0 tokens"),
    (dict(max_id_slots=200), r"'calls'\[0\] must be a full chunk of max_id_slots // topk = 8 tokens"),
])
def test_a_chunked_call_record_refuses_chunks_that_are_not_the_calls(change, text):
    launch = plan_aiter_launch(make_plan("aiter_lse", "gfx942", "bf16", 16), num_tokens=T, max_id_slots=LIMIT)
    with pytest.raises(ValueError, match=text):
        attrs.evolve(launch, **change)


@pytest.mark.parametrize("json_out", [False, True])
def test_explain_counts_the_chunks_of_any_call_without_listing_them(monkeypatch, capsys, json_out):
    """explain plans calls without tensors at any T the CLI takes: at T = 2^31 - 1 and topk = 2^30 every chunk is one
    token, and counting them by listing their ranges grew the process past 24 GB (a break test, forty-third session).
    The count is ``ceil(T / chunk_tokens)``; the ranges are the runner's only."""
    import json

    from mla_sink.tools.cli import main

    def refuse(self):
        raise AssertionError("explain listed the chunks' token ranges")

    monkeypatch.setattr(AiterChunkedCall, "chunks", property(refuse))
    tokens = 2 ** 31 - 1
    argv = ["explain", "--arch", "gfx950", "--aiter", "0.1.20", "--tokens", str(tokens), "--topk", str(TOPK_MAX),
            "--heads", "128", "--sinks"] + (["--json"] if json_out else [])
    assert main(argv) in (0, None)
    out = capsys.readouterr().out
    if json_out:
        launch = json.loads(out)["launch"]
        assert (launch["num_chunks"], launch["chunk_tokens"]) == (tokens, 1)
    else:
        assert f"served in {tokens} calls over token chunks of 1 token" in out
