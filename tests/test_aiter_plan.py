"""Plan tables for the AITER paths (pure, CPU) and the ragged buffers against a plain Python loop."""

from __future__ import annotations

import ast
import random
import sys
from pathlib import Path
from typing import Any, Optional

import attrs
import pytest
import torch

from mla_sink.paths.aiter import (
    MAX_SEQLEN_Q,
    AiterCall,
    AiterDecodeCall,
    AiterPersistentCall,
    PersistentMetadata,
    fill_kv_buffers,
    plan_aiter,
    with_meta_param,
)
from mla_sink.core.plan import LaunchPlan
from mla_sink.core.records import CallSpec, Platform
from mla_sink.core.select import NoKernelError, mla_table, plan_call


def make_plan(path: str, arch: str, q: str, heads: int, *, kv: Optional[str] = None, topk: int = 32,
              params: Optional[dict] = None, sinks: bool = True, version: Optional[str] = "0.1.20",
              logit_cap: float = 0.0, defaults: bool = True) -> LaunchPlan:
    """A plan of ``path``; its params are the path's defaults in tables/mla_decode.yaml under ``params``."""
    spec = CallSpec(q_dtype=q, kv_dtype=kv or q, num_heads=heads, topk=topk, sinks=sinks, logit_cap=logit_cap)
    base = dict(mla_table().paths[path].params) if defaults and path in mla_table().paths else {}
    return LaunchPlan(path=path, params={**base, **(params or {})}, spec=spec,
                      platform=Platform(arch=arch, aiter_version=version), row_id="t")


# (case id, plan kwargs, meta_param, expected fields of the AiterCall)
PLAN_TABLE: list[tuple[str, dict[str, Any], Optional[tuple[int, int]], dict[str, Any]]] = [
    ("lse-bf16-h16-gfx942", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16), None,
     dict(kind=AiterDecodeCall, padded_heads=16, num_kv_splits=None, min_kv_splits=None, return_lse=True,
          persistent=False, kv_indices_layout="packed", pass_q_scale=False, pass_kv_scale=False)),
    ("lse-bf16-h4-padded", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=4), None,
     dict(kind=AiterDecodeCall, padded_heads=16, num_heads=4, num_kv_splits=None, return_lse=True)),
    ("lse-bf16-h128", dict(path="aiter_lse", arch="gfx950", q="bf16", heads=128), None,
     dict(kind=AiterDecodeCall, padded_heads=128, num_kv_splits=None)),
    ("single-split-gfx950-h32", dict(path="aiter_lse_single_split", arch="gfx950", q="bf16", heads=32), None,
     dict(kind=AiterDecodeCall, padded_heads=32, num_kv_splits=1, return_lse=True, kv_indices_layout="packed")),
    ("fp8-two-split-forces-1-to-2", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz",
                                         heads=16), (1, 5),
     dict(kind=AiterDecodeCall, num_kv_splits=2, min_kv_splits=2, return_lse=True, pass_q_scale=True,
          pass_kv_scale=True, out_dtype="bf16")),
    ("fp8-two-split-leaves-3", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz",
                                    heads=128), (3, 5),
     dict(kind=AiterDecodeCall, num_kv_splits=3, padded_heads=128)),
    ("fp8-two-split-unresolved", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz",
                                      heads=16), None,
     dict(kind=AiterDecodeCall, num_kv_splits=None, min_kv_splits=2, needs_meta_param=True)),
    ("fp8-two-split-h8-padded-gfx950", dict(path="aiter_lse_fp8_two_split", arch="gfx950", q="fp8_e4m3",
                                            heads=8), (1, 5),
     dict(kind=AiterDecodeCall, num_kv_splits=2, padded_heads=16)),
    ("persistent-bf16-nolse", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=16, sinks=False,
                                   params={"return_lse": False}), None,
     dict(kind=AiterPersistentCall, persistent=True, return_lse=False, num_kv_splits=32,
          kv_indices_layout="row_strided", padded_heads=16)),
    ("persistent-bf16-h8-padded", dict(path="aiter_persistent", arch="gfx942", q="bf16", heads=8, sinks=False,
                                       params={"return_lse": False}), None,
     dict(kind=AiterPersistentCall, padded_heads=16, return_lse=False)),
    ("persistent-bf16-h24-to-32", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=24,
                                       params={"return_lse": True}), None,
     dict(kind=AiterPersistentCall, padded_heads=32, return_lse=True)),
    ("persistent-fp8-h64-lse-gfx942", dict(path="aiter_persistent", arch="gfx942", q="fp8_e4m3fnuz", heads=64,
                                           params={"return_lse": True}), None,
     dict(kind=AiterPersistentCall, padded_heads=64, return_lse=True, pass_q_scale=True, pass_kv_scale=True)),
    ("persistent-bf16-h48-lse-gfx950", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=48,
                                            params={"return_lse": True, "max_split_per_batch": 16}), None,
     dict(kind=AiterPersistentCall, padded_heads=48, return_lse=True, num_kv_splits=16)),
]


@pytest.mark.parametrize("case_id,kw,meta_param,expected", PLAN_TABLE, ids=[c[0] for c in PLAN_TABLE])
def test_plan_table(case_id, kw, meta_param, expected):
    call = plan_aiter(make_plan(**kw), num_tokens=5, meta_param=meta_param)
    expected = dict(expected)
    assert type(call) is expected.pop("kind")
    for name, want in expected.items():
        assert getattr(call, name) == want, f"{case_id}: {name}={getattr(call, name)!r}, expected {want!r}"
    # Invariants of every AITER call.
    assert call.kv_view_shape == (-1, 1, 1, 576) and call.kv_indices_size == 5 * 32 and call.topk == 32
    assert call.padded_heads >= max(call.num_heads, 16)
    if isinstance(call, AiterPersistentCall):
        m = call.metadata
        assert (m.batch_size, m.num_heads, m.q_dtype, m.kv_dtype, m.topk) == (5, call.padded_heads, call.q_dtype, call.kv_dtype, 32)
        assert m.max_split_per_batch == call.num_kv_splits and call.padded_heads % 16 == 0
        # the metadata's AITER choices are the path's params in the table, not constants of the planner
        params = mla_table().paths["aiter_persistent"].params
        assert (m.kv_granularity, m.fast_mode) == (params["kv_granularity"], params["fast_mode"])
    else:
        assert "metadata" not in attrs.fields_dict(type(call))


def test_records_hold_no_single_valued_or_per_call_fields():
    """Fields every call shares are module constants (MAX_SEQLEN_Q, PAGE_SIZE, ...); N and sm_scale come
    with the tensors, so a planned call serves every call of its (spec, platform, T)."""
    gone = {"max_seqlen_q", "qo_indptr", "kv_last_page_lens", "page_size", "nhead_kv", "kv_indptr_mode",
            "num_kv_rows", "sm_scale"}
    assert not gone & set(attrs.fields_dict(AiterPersistentCall))
    assert not {"max_seqlen_qo", "num_heads_k", "is_sparse", "page_size", "is_causal"} & set(
        attrs.fields_dict(PersistentMetadata))
    assert MAX_SEQLEN_Q == 1


def test_head_padding_comes_from_the_plan_params():
    """AITER's minimum of 16 heads and the persistent multiple of 16 are the paths' params in the table."""
    table = mla_table()
    assert table.paths["aiter_lse"].params["pad_heads_to"] == 16
    assert plan_aiter(make_plan("aiter_lse", "gfx942", "bf16", 4, params={"pad_heads_to": 32}),
                      num_tokens=2).padded_heads == 32
    plan = make_plan("aiter_persistent", "gfx950", "bf16", 20, params={"return_lse": True, "pad_heads_multiple": 8})
    assert plan_aiter(plan, num_tokens=2).padded_heads == 24
    plan = make_plan("aiter_persistent", "gfx950", "bf16", 20, params={"return_lse": True})
    assert plan_aiter(plan, num_tokens=2).padded_heads == 32
    with pytest.raises(ValueError, match=r"plan.params\['pad_heads_to'\] is required on path 'aiter_lse'"):
        plan_aiter(make_plan("aiter_lse", "gfx942", "bf16", 4, defaults=False), num_tokens=2)


@pytest.mark.parametrize("param,value,match", [("kv_granularity", 0, "int >= 1"), ("kv_granularity", None, "is required"),
                                               ("fast_mode", 1, "must be a bool"), ("fast_mode", None, "is required")])
def test_persistent_metadata_params_come_from_the_plan(param, value, match):
    """``kv_granularity`` and ``fast_mode`` are the table's: a plan without them, or with a value of another kind,
    is refused when planned."""
    plan = make_plan("aiter_persistent", "gfx942", "bf16", 16, sinks=False, params={"return_lse": False})
    params = {k: v for k, v in plan.params.items() if not (k == param and value is None)}
    if value is not None:
        params[param] = value
    with pytest.raises(ValueError, match=match):
        plan_aiter(attrs.evolve(plan, params=params), num_tokens=2)


def test_non_persistent_call_has_no_metadata_field():
    call = plan_aiter(make_plan("aiter_lse", "gfx942", "bf16", 16, topk=4), num_tokens=2)
    meta = PersistentMetadata(batch_size=2, num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=4, max_split_per_batch=32,
                              kv_granularity=16, fast_mode=True)
    with pytest.raises(TypeError, match="metadata"):
        attrs.evolve(call, metadata=meta)
    with pytest.raises(ValueError, match="'path' of a non-persistent call"):
        attrs.evolve(call, path="aiter_persistent")


def test_persistent_call_metadata_must_match():
    call = plan_aiter(make_plan("aiter_persistent", "gfx950", "bf16", 32, sinks=False, topk=4,
                                params={"return_lse": False}), num_tokens=3)
    bad = PersistentMetadata(batch_size=3, num_heads=16, q_dtype="bf16", kv_dtype="bf16", topk=4, max_split_per_batch=32,
                              kv_granularity=16, fast_mode=True)
    with pytest.raises(ValueError, match="'metadata' must be built for"):
        attrs.evolve(call, metadata=bad)


def test_scalar_kwargs():
    call = plan_aiter(make_plan("aiter_lse_single_split", "gfx950", "bf16", 32, topk=4), num_tokens=2)
    assert call.scalar_kwargs() == {"page_size": 1, "nhead_kv": 1, "logit_cap": 0.0, "num_kv_splits": 1,
                                    "return_lse": True}
    default = plan_aiter(make_plan("aiter_lse", "gfx942", "bf16", 16, topk=4), num_tokens=2)
    assert "num_kv_splits" not in default.scalar_kwargs() and "sm_scale" not in default.scalar_kwargs()


def test_with_meta_param():
    call = plan_aiter(make_plan("aiter_lse_fp8_two_split", "gfx942", "fp8_e4m3fnuz", 16), num_tokens=5)
    assert with_meta_param(call, (1, 5)) == plan_aiter(make_plan("aiter_lse_fp8_two_split", "gfx942", "fp8_e4m3fnuz", 16),
                                                       num_tokens=5, meta_param=(1, 5))
    done = with_meta_param(call, (4, 5))
    assert done.num_kv_splits == 4 and with_meta_param(done, (1, 5)) is done
    with pytest.raises(ValueError, match="batch_size=7"):
        with_meta_param(call, (1, 7))
    with pytest.raises(ValueError, match="'num_kv_splits' must be >= min_kv_splits=2"):
        attrs.evolve(call, num_kv_splits=1)


ERROR_TABLE = [
    ("not-an-aiter-path", dict(path="triton", arch="gfx942", q="bf16", heads=16), {}, "plan.path"),
    ("two-split-stale-meta", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz", heads=16),
     {"meta_param": (1, 7)}, "batch_size=7"),
    ("two-split-bad-meta", dict(path="aiter_lse_fp8_two_split", arch="gfx942", q="fp8_e4m3fnuz", heads=16),
     {"meta_param": (1.5, 5)}, "'meta_param' must be a tuple"),
    ("persistent-no-lse-with-sinks", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=16, sinks=True,
                                          params={"return_lse": False}), {}, "returns no LSE"),
    ("persistent-needs-return-lse", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=16), {},
     r"plan.params\['return_lse'\] is required"),
    ("persistent-return-lse-bool", dict(path="aiter_persistent", arch="gfx950", q="bf16", heads=16,
                                        params={"return_lse": 1}), {}, "must be a bool"),
    ("bad-pad", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16, params={"pad_heads_to": 0}), {},
     r"plan.params\['pad_heads_to'\] must be an int >= 1"),
    ("bad-tokens", dict(path="aiter_lse", arch="gfx942", q="bf16", heads=16), {"num_tokens": 0}, "'num_tokens'"),
]


@pytest.mark.parametrize("case_id,kw,extra,match", ERROR_TABLE, ids=[c[0] for c in ERROR_TABLE])
def test_plan_errors(case_id, kw, extra, match):
    extra = {"num_tokens": 5, **extra}
    with pytest.raises(ValueError, match=match):
        plan_aiter(make_plan(**kw), **extra)


@pytest.mark.parametrize("spec_kw,platform,reason", [
    (dict(q="fp16", heads=16), Platform("gfx942", "0.1.20"), "q_dtype=fp16, needs not fp16"),
    (dict(q="bf16", heads=16, logit_cap=30.0), Platform("gfx942", "0.1.20"), "logit_cap=30.0, needs <= 0.0"),
    (dict(q="bf16", heads=16), Platform("gfx942", None), "AITER not importable"),
    (dict(q="bf16", heads=16), Platform("gfx942", "0.1.15"), "aiter_version=0.1.15, needs >= 0.1.19"),
])
def test_quirks_are_the_tables_not_the_planners(spec_kw, platform, reason):
    """The planner re-checks no quirk: the table refuses these calls for every AITER path (with the reason),
    and the planner, given such a plan by hand, plans it without a second opinion."""
    spec = CallSpec(q_dtype=spec_kw["q"], kv_dtype=spec_kw["q"], num_heads=spec_kw["heads"], topk=32, sinks=True,
                    logit_cap=spec_kw.get("logit_cap", 0.0))
    with pytest.raises(NoKernelError, match=reason):
        plan_call(spec, platform, path="aiter_lse")
    plan = LaunchPlan(path="aiter_lse", params=dict(mla_table().paths["aiter_lse"].params), spec=spec,
                      platform=platform, row_id="by_hand")
    assert isinstance(plan_aiter(plan, num_tokens=2), AiterCall)


def test_planning_never_imports_aiter():
    plan_aiter(make_plan("aiter_persistent", "gfx950", "bf16", 16, sinks=False, params={"return_lse": False}),
               num_tokens=5)
    assert "aiter" not in sys.modules


# ---- no quirk literal in the Python of the AITER paths, the table engine and their tools --------------

OWNED = ["mla_sink/paths/aiter", "mla_sink/tools/info.py", "mla_sink/core/select.py", "dispatch"]


def _code_constants(path: Path):
    """(constant, assigned name or None) for every literal in the code of ``path`` (docstrings excluded)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    targets = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            targets[id(node.value)] = ",".join(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docstrings:
            yield node.value, targets.get(id(node))


def test_no_arch_dtype_or_head_literal_in_the_python():
    """Quirks live in tables/: the archs, dtypes and head counts the rule table names never appear as a
    literal in this Python (comments and docstrings may name them; error messages are f-strings of values)."""
    root = Path(__file__).resolve().parents[1]
    table = mla_table()
    names = {v for f in ("arch", "q_dtype", "kv_dtype") for v in table.fields[f].domain if v is not None}
    names.discard("cpu")  # also torch's name of the host device (arch_of("cpu")), not a hardware quirk
    heads = {8, 16, 24, 32, 48, 64, 128}
    allowed_ints = {"MAX_ENTRIES"}  # not a head count: a cache size
    found = []
    for base in OWNED:
        for path in sorted((root / base).rglob("*.py")) if (root / base).is_dir() else [root / base]:
            for value, target in _code_constants(path):
                if isinstance(value, str) and (value in names or any(f" {n} " in f" {value} " for n in names)):
                    found.append((path.name, value))
                if type(value) is int and value in heads and target not in allowed_ints:
                    found.append((path.name, value))
    assert found == []


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
    with pytest.raises(RuntimeError, match="meta"):  # the probe works: a host sync on meta tensors does raise
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


@pytest.mark.parametrize("path,params", [("aiter_lse", {}), ("aiter_persistent", {"return_lse": True})])
def test_one_aiter_call_of_more_id_slots_than_int32_offsets_is_refused_and_the_library_chunks_it(path, params):
    """T * topk beyond 2^31 - 1: AITER's kv_indptr and the persistent plan's row starts (t * topk) are int32, and so
    are the offsets the id buffers' fill computes, so past 2^31 - 1 they wrap negative; such a call was planned and
    launched all the same (forty-first session), then refused. One call still cannot take it (plan_aiter refuses,
    naming the bound and the most tokens one call takes); the library's plan (build_plan, through
    plan_aiter_launch) serves it as token chunks, each within the bound (tests/test_aiter_chunks.py)."""
    from mla_sink.core.plan import build_plan
    from mla_sink.paths.aiter import AiterChunkedCall
    from mla_sink.paths.aiter.plan import MAX_ID_SLOTS

    topk = 2 ** 30
    plan = make_plan(path, "gfx950", "bf16", 16, topk=topk, params=params)
    assert plan_aiter(plan, num_tokens=1).kv_indices_size == topk  # within int32: planned as before
    with pytest.raises(ValueError, match=r"2 \* 1073741824 = 2147483648 id slots exceeds 2147483647.*at most 1 tokens"):
        plan_aiter(plan, num_tokens=2)
    spec = CallSpec(q_dtype="bf16", kv_dtype="bf16", num_heads=16, topk=2048, sinks=True)
    platform = Platform(arch="gfx950", aiter_version="0.1.20", num_sms=256)
    tokens = MAX_ID_SLOTS // 2048
    assert build_plan(spec, platform, num_tokens=tokens).launch.kv_indices_size == tokens * 2048
    chunked = build_plan(spec, platform, num_tokens=tokens + 1).launch
    assert isinstance(chunked, AiterChunkedCall) and [c.num_tokens for c in chunked.calls] == [tokens, 1]
