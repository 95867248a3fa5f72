"""Plan tables for the AITER paths (pure, CPU) and the ragged buffers against a plain Python loop."""

from __future__ import annotations

import random
import sys
from typing import Any, Optional

import attrs
import pytest
import torch

from mla_sink.paths.aiter import (
    AiterDecodeCall,
    AiterPersistentCall,
    PersistentMetadata,
    fill_kv_buffers,
    plan_aiter,
)
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import CallSpec, Platform


def make_plan(path: str, arch: str, q: str, heads: int, *, kv: Optional[str] = None, topk: int = 32,
              params: Optional[dict] = None, sinks: bool = True, version: Optional[str] = "0.1.20",
              logit_cap: float = 0.0) -> LaunchPlan:
    spec = CallSpec(q_dtype=q, kv_dtype=kv or q, num_heads=heads, topk=topk, sinks=sinks, logit_cap=logit_cap)
    return LaunchPlan(path=path, params=params or {}, spec=spec,
                      platform=Platform(arch=arch, aiter_version=version), row_id="t")


# (case id, plan kwargs, meta_param, expected fields of the AiterCall)
PLAN_TABLE: list[tuple[str, dict[str, Any], Optional[tuple[int, int]], dict[str, Any]]] = [
    ("lse-bf16-h16-gfx942", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16), None,
     dict(kind=AiterDecodeCall, padded_heads=16, num_kv_splits=None, return_lse=True, persistent=False,
          kv_indices_layout="packed", pass_q_scale=False, pass_kv_scale=False)),
    ("lse-bf16-h4-padded", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=4), None,
     dict(kind=AiterDecodeCall, padded_heads=16, num_heads=4, num_kv_splits=None, return_lse=True)),
    ("lse-bf16-h128", dict(path="aiter_lse", arch="gfx950", q="bf16", heads=128), None,
     dict(kind=AiterDecodeCall, padded_heads=128, num_kv_splits=None)),
    ("single-split-gfx950-h32", dict(path="aiter_lse_single_split", arch="gfx950", q="bf16", heads=32,
                                     params={"num_kv_splits": 1}), None,
     dict(kind=AiterDecodeCall, padded_heads=32, num_kv_splits=1, return_lse=True, kv_indices_layout="packed")),
    ("fp8-two-split-forces-1-to-2", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz",
                                         heads=16, params={"min_kv_splits": 2}), (1, 5),
     dict(kind=AiterDecodeCall, num_kv_splits=2, return_lse=True, pass_q_scale=True, pass_kv_scale=True,
          out_dtype="bf16")),
    ("fp8-two-split-leaves-3", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz",
                                    heads=128, params={"min_kv_splits": 2}), (3, 5),
     dict(kind=AiterDecodeCall, num_kv_splits=3, padded_heads=128)),
    ("fp8-two-split-h8-padded-gfx950", dict(path="aiter_lse_fp8_two_split", arch="gfx950", q="fp8_e4m3",
                                            heads=8, params={"min_kv_splits": 2}), (1, 5),
     dict(kind=AiterDecodeCall, num_kv_splits=2, padded_heads=16)),
    ("persistent-bf16-nolse", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=16, sinks=False,
                                   params={"return_lse": False}), None,
     dict(kind=AiterPersistentCall, persistent=True, return_lse=False, num_kv_splits=32,
          kv_indices_layout="row_strided", padded_heads=16)),
    ("persistent-bf16-h8-padded", dict(path="aiter_persistent", arch="gfx942", q="bf16", heads=8, sinks=False,
                                       params={"return_lse": False}), None,
     dict(kind=AiterPersistentCall, padded_heads=16, return_lse=False)),
    ("persistent-fp8-h64-lse-gfx942", dict(path="aiter_persistent", arch="gfx942", q="fp8_e4m3fnuz", heads=64,
                                           params={"return_lse": True}), None,
     dict(kind=AiterPersistentCall, padded_heads=64, return_lse=True, pass_q_scale=True, pass_kv_scale=True)),
    ("persistent-bf16-h48-lse-gfx950", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=48,
                                            params={"return_lse": True, "max_split_per_batch": 16}), None,
     dict(kind=AiterPersistentCall, padded_heads=48, return_lse=True, num_kv_splits=16)),
]


@pytest.mark.parametrize("case_id,kw,meta_param,expected", PLAN_TABLE, ids=[c[0] for c in PLAN_TABLE])
def test_plan_table(case_id, kw, meta_param, expected):
    call = plan_aiter(make_plan(**kw), num_tokens=5, num_kv_rows=100, topk=32, meta_param=meta_param)
    expected = dict(expected)
    assert type(call) is expected.pop("kind")
    for name, want in expected.items():
        assert getattr(call, name) == want, f"{case_id}: {name}={getattr(call, name)!r}, expected {want!r}"
    # Invariants of every AITER call.
    assert call.max_seqlen_q == 1 and call.qo_indptr == "arange" and call.kv_last_page_lens == "ones"
    assert call.kv_view_shape == (100, 1, 1, 576) and call.kv_indices_size == 5 * 32
    assert call.padded_heads >= 16 and call.logit_cap <= 0
    assert call.kv_indptr_mode == "ragged_valid"
    if isinstance(call, AiterPersistentCall):
        m = call.metadata
        assert (m.batch_size, m.num_heads, m.q_dtype, m.kv_dtype, m.topk) == (5, call.padded_heads, call.q_dtype, call.kv_dtype, 32)
        assert m.is_sparse and m.max_seqlen_qo == 1 and m.max_split_per_batch == call.num_kv_splits
    else:
        assert "metadata" not in attrs.fields_dict(type(call))


def test_non_persistent_call_has_no_metadata_field():
    call = plan_aiter(make_plan("aiter_lse", "gfx942", "bf16", 16, topk=4), num_tokens=2, num_kv_rows=10, topk=4)
    meta = PersistentMetadata(batch_size=2, num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=4)
    with pytest.raises(TypeError):
        attrs.evolve(call, metadata=meta)
    with pytest.raises(ValueError, match="'path' of a non-persistent call"):
        attrs.evolve(call, path="aiter_persistent")


def test_persistent_call_metadata_must_match():
    call = plan_aiter(make_plan("aiter_persistent", "gfx950", "bf16", 32, sinks=False, topk=4), num_tokens=3, num_kv_rows=10, topk=4)
    bad = PersistentMetadata(batch_size=3, num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=4)
    with pytest.raises(ValueError, match="'metadata' must be built for"):
        attrs.evolve(call, metadata=bad)


def test_metadata_heads_multiple_of_8():
    with pytest.raises(ValueError, match="multiple of 8"):
        PersistentMetadata(batch_size=3, num_heads=20, q_dtype="bf16", kv_dtype="bf16", topk=4)


def test_sm_scale_and_scalar_kwargs():
    call = plan_aiter(make_plan("aiter_lse_single_split", "gfx950", "bf16", 32, topk=4, params={"num_kv_splits": 1}),
                      num_tokens=2, num_kv_rows=10, topk=4, sm_scale=0.125)
    assert call.scalar_kwargs() == {"page_size": 1, "nhead_kv": 1, "sm_scale": 0.125, "logit_cap": 0.0,
                                    "num_kv_splits": 1, "return_lse": True}
    default = plan_aiter(make_plan("aiter_lse", "gfx942", "bf16", 16, topk=4), num_tokens=2, num_kv_rows=10, topk=4)
    assert default.sm_scale == pytest.approx(576 ** -0.5)
    assert "num_kv_splits" not in default.scalar_kwargs()


ERROR_TABLE = [
    ("not-an-aiter-path", dict(path="triton", arch="gfx942", q="bf16", heads=16), {}, "plan.path"),
    ("fp16-never", dict(path="aiter_lse", arch="gfx942", q="fp16", heads=16), {}, "fp16"),
    ("logit-cap", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16, logit_cap=30.0), {}, "logit_cap"),
    ("no-aiter", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16, version=None), {}, "AITER not importable"),
    ("lse-before-0.1.19", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16, version="0.1.15"), {}, "0.1.19"),
    ("two-split-needs-meta", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz", heads=16), {}, "meta_param"),
    ("two-split-stale-meta", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz", heads=16),
     {"meta_param": (1, 7)}, "batch_size=7"),
    ("two-split-needs-fp8", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="bf16", heads=16),
     {"meta_param": (1, 5)}, "needs fp8 q"),
    ("single-split-must-be-1", dict(path="aiter_lse_single_split", arch="gfx950", q="bf16", heads=32,
                                    params={"num_kv_splits": 2}), {}, "must be 1"),
    ("persistent-no-lse-with-sinks", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=16, sinks=True,
                                          params={"return_lse": False}), {}, "returns no LSE"),
    ("persistent-lse-gfx942-bf16-aborts", dict(path="aiter_persistent", arch="gfx942", q="bf16", heads=16,
                                               params={"return_lse": True}), {}, "no kernel"),
    ("topk-mismatch", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16, topk=8), {}, "'topk'"),
    ("bad-sm-scale", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16), {"sm_scale": float("nan")}, "sm_scale"),
]


@pytest.mark.parametrize("case_id,kw,extra,match", ERROR_TABLE, ids=[c[0] for c in ERROR_TABLE])
def test_plan_errors(case_id, kw, extra, match):
    with pytest.raises(ValueError, match=match):
        plan_aiter(make_plan(**kw), num_tokens=5, num_kv_rows=100, topk=32, **extra)


def test_planning_never_imports_aiter():
    plan_aiter(make_plan("aiter_persistent", "gfx950", "bf16", 16, sinks=False), num_tokens=5, num_kv_rows=100, topk=32)
    assert "aiter" not in sys.modules


# ---- ragged buffers ---------------------------------------------------------------------------------

def loop_buffers(indices: torch.Tensor, n: int, topk_length: Optional[torch.Tensor], layout: str):
    """Plain Python: valid ids per row (order kept), ragged indptr, and the expected kv_indices."""
    T, K = indices.shape
    rows = []
    for t in range(T):
        limit = K if topk_length is None else int(topk_length[t])
        rows.append([int(v) for j, v in enumerate(indices[t].tolist()) if 0 <= v < n and j < limit])
    indptr = [0]
    for r in rows:
        indptr.append(indptr[-1] + len(r))
    flat = [0] * (T * K)
    for t, r in enumerate(rows):
        start = indptr[t] if layout == "packed" else t * K
        flat[start:start + len(r)] = r
    return indptr, flat


BUFFER_CASES = {
    # -1 in the middle, ids >= N, other negatives, an all-invalid row, a full row
    "mixed": (torch.tensor([[3, -1, 5, 9, -1, 2],
                            [-1, -1, -1, -1, -1, -1],
                            [0, 1, 2, 3, 4, 5],
                            [12, 99, -7, 11, 10, 1],
                            [-1, 4, -1, 4, -1, 0]], dtype=torch.int32), 12, None),
    "topk_length": (torch.tensor([[1, 2, 3, 4],
                                  [5, -1, 6, 7],
                                  [8, 9, 10, 11],
                                  [0, 0, 0, 0]], dtype=torch.int32), 12, torch.tensor([2, 4, 0, 3], dtype=torch.int32)),
    "all_invalid": (torch.full((3, 5), -1, dtype=torch.int32), 8, None),
}


@pytest.mark.parametrize("layout", ["packed", "row_strided"])
@pytest.mark.parametrize("name", list(BUFFER_CASES))
def test_buffers_match_python_loop(name, layout):
    indices, n, tl = BUFFER_CASES[name]
    T, K = indices.shape
    kv_indptr = torch.full((T + 1,), 77, dtype=torch.int32)
    kv_indices = torch.full((T * K,), 77, dtype=torch.int32)
    fill_kv_buffers(kv_indptr, kv_indices, indices, n, tl, layout=layout)
    want_indptr, want_flat = loop_buffers(indices, n, tl, layout)
    assert kv_indptr.tolist() == want_indptr
    assert kv_indices.tolist() == want_flat


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("layout", ["packed", "row_strided"])
def test_buffers_random(seed, layout):
    rng = random.Random(seed)
    T, K, n = rng.randint(1, 9), rng.randint(1, 17), rng.randint(1, 40)
    indices = torch.tensor([[rng.choice([-1, -3, n, n + 5, rng.randrange(n)]) for _ in range(K)] for _ in range(T)],
                           dtype=torch.int32)
    tl = torch.tensor([rng.randint(0, K) for _ in range(T)], dtype=torch.int32) if seed % 2 else None
    kv_indptr = torch.empty(T + 1, dtype=torch.int32)
    kv_indices = torch.empty(T * K, dtype=torch.int32)
    fill_kv_buffers(kv_indptr, kv_indices, indices, n, tl, layout=layout)
    want_indptr, want_flat = loop_buffers(indices, n, tl, layout)
    assert kv_indptr.tolist() == want_indptr and kv_indices.tolist() == want_flat


def test_buffers_need_no_host_sync():
    """On the meta device any .item(), nonzero() or mask indexing raises: the fill uses none of them."""
    indices = torch.empty(4, 8, dtype=torch.int32, device="meta")
    topk_length = torch.empty(4, dtype=torch.int32, device="meta")
    kv_indptr = torch.empty(5, dtype=torch.int32, device="meta")
    kv_indices = torch.empty(32, dtype=torch.int32, device="meta")
    for layout in ("packed", "row_strided"):
        fill_kv_buffers(kv_indptr, kv_indices, indices, 100, topk_length, layout=layout)
    with pytest.raises(Exception):  # the probe works: a host sync on meta tensors does raise
        indices.sum().item()


def test_buffer_shape_errors():
    indices = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="'kv_indptr'"):
        fill_kv_buffers(torch.zeros(2, dtype=torch.int32), torch.zeros(6, dtype=torch.int32), indices, 5)
    with pytest.raises(ValueError, match="'kv_indices'"):
        fill_kv_buffers(torch.zeros(3, dtype=torch.int32), torch.zeros(5, dtype=torch.int32), indices, 5)
    with pytest.raises(ValueError, match="'layout'"):
        fill_kv_buffers(torch.zeros(3, dtype=torch.int32), torch.zeros(6, dtype=torch.int32), indices, 5, layout="x")
    with pytest.raises(ValueError, match="'topk_length'"):
        fill_kv_buffers(torch.zeros(3, dtype=torch.int32), torch.zeros(6, dtype=torch.int32), indices, 5,
                        torch.zeros(3, dtype=torch.int32))
