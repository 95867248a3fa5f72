"""``mla-sink bench`` with FlashMLA as a peer, on the CPU: a fake ``flash_mla`` module that checks every
argument as FlashMLA's interface does (shapes, dtypes, head counts) and answers with our float64
reference in FlashMLA's conventions (``+inf`` LSE on empty rows, the decode's ``[b, h, s_q]`` LSE); the
grid; the peer adapters; the correctness check; the case loop with a fake timer; the printed table."""

from __future__ import annotations

import json
import math
import re
import sys
import types

import numpy as np
import pytest
import torch

import mla_sink
from mla_sink.core.platform import detect_platform
from mla_sink.core.reference import sparse_mla_decode_reference
from mla_sink.tools import bench, peers

#: The head counts FlashMLA's sparse kernels are instantiated for (csrc/api/sparse_fwd.h, sparse_decode.h): the fake
#: below refuses others as FlashMLA does, and tables/peers.yaml must say the same.
FLASH_MLA_HEADS = (64, 128)

class FakeFlashMLA(types.ModuleType):
    """Checks each argument as FlashMLA's C++ interface does and answers with our reference."""

    def __init__(self, log2_lse: bool = False):
        super().__init__("flash_mla")
        self.calls: list = []
        self.log2_lse = log2_lse  # a wrong LSE convention, to show the check catches it

    def flash_mla_sparse_fwd(self, q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
        s_q, h_q, d_qk = q.shape
        assert h_q in FLASH_MLA_HEADS, "Unsupported h_q"
        assert q.dtype == kv.dtype == torch.bfloat16 and indices.dtype == torch.int32 and d_qk == 576 and d_v == 512
        assert kv.dim() == 3 and kv.shape[1:] == (1, 576) and indices.shape[:2] == (s_q, 1)
        assert attn_sink is None or (attn_sink.dtype == torch.float32 and attn_sink.shape == (h_q,))
        assert q.stride(-1) == kv.stride(-1) == indices.stride(-1) == 1
        self.calls.append(("sparse_fwd", q, kv, indices, sm_scale, attn_sink))
        out, lse = sparse_mla_decode_reference(q, kv[:, 0], indices[:, 0], attn_sink, sm_scale)
        return out.to(torch.bfloat16), torch.zeros_like(lse), self._lse(lse)

    def get_mla_metadata(self, *args, **kwargs):
        return types.SimpleNamespace(have_initialized=False), None

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits=None,
                               softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None):
        b, s_q, h_q, d_qk = q.shape
        if h_q not in FLASH_MLA_HEADS:
            pytest.fail(f"FlashMLA's decode called at {h_q} heads: it segfaults there")
        assert block_table is None and cache_seqlens is None and num_splits is None and head_dim_v == 512
        assert is_fp8_kvcache is True and causal is False and isinstance(softmax_scale, float)
        assert q.dtype == torch.bfloat16 and d_qk == 576 and k_cache.dtype == torch.uint8
        blocks = k_cache.shape[0]
        assert k_cache.shape[1:] == (peers.FLASH_MLA_BLOCK, 1, 656) and k_cache.stride(1) == 656
        assert indices.dtype == torch.int32 and indices.shape[:2] == (b, s_q)
        assert bool(((indices >= -1) & (indices < blocks * peers.FLASH_MLA_BLOCK)).all()), "out-of-range id"
        assert attn_sink is None or (attn_sink.dtype == torch.float32 and attn_sink.shape == (h_q,))
        if sched.have_initialized:
            assert sched.shape == (b, s_q, h_q, indices.shape[-1])
        sched.have_initialized, sched.shape = True, (b, s_q, h_q, indices.shape[-1])
        self.calls.append(("decode", q, k_cache, indices, softmax_scale, attn_sink))
        out, lse = sparse_mla_decode_reference(q.reshape(b * s_q, h_q, d_qk), k_cache.reshape(-1, 656),
                                               indices.reshape(b * s_q, -1),
                                               attn_sink, softmax_scale)
        return out.to(torch.bfloat16).reshape(b, s_q, h_q, 512), self._lse(lse).reshape(b, s_q, h_q).transpose(1, 2)

    def _lse(self, lse):
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
        return lse / math.log(2) if self.log2_lse else lse


@pytest.fixture
def fake_flash_mla(monkeypatch):
    """A fake ``flash_mla`` importable."""
    fake = FakeFlashMLA()
    monkeypatch.setitem(sys.modules, "flash_mla", fake)
    return fake


class FakeTimer:
    """Calls the function once (so its arguments are checked) and reports a fixed time per implementation."""

    def __init__(self):
        self.fns = []

    def time_us(self, fn):
        fn()
        self.fns.append(fn)
        return 10.0 * len(self.fns)


CEILINGS = {"matmul_tflops": 800.0, "copy_gbs": 4000.0}


# ---------------------------------------------------------------- the grid
def test_grid_has_t128_and_both_fp8_caches():
    cases = bench.default_cases()
    bf16 = {(c["H"], c["T"], c["sinks"]) for c in cases if c["kv"] == bench.BASE_KV}
    assert bf16 == {(H, T, s) for H in (16, 32, 64, 128) for T in (2, 64, 128, 256) for s in (True, False)}
    for kv in ("fp8_e4m3", "fp8_ds_mla"):
        fp8 = [(c["H"], c["T"]) for c in cases if c["kv"] == kv]
        assert sorted(fp8) == sorted((H, T) for H in (16, 32, 64, 128) for T in (2, 64, 256)), kv
        assert all(c["sinks"] for c in cases if c["kv"] == kv)
    assert all(c["topk"] == 2048 for c in cases) and len(cases) == 32 + 24
    platform = detect_platform("cpu")
    names = [bench.case_name(c, platform) for c in cases]
    assert len(set(names)) == len(names)
    assert "bf16-h128-cpu-sinks-dcp1-T128-topk2048" in names
    assert "bf16+kv_fp8_ds_mla-h64-cpu-sinks-dcp1-T64-topk2048" in names
    assert "bf16+kv_fp8_e4m3-h16-cpu-sinks-dcp1-T2-topk2048" in names
    # the --cases substrings the docs give split the grid in two
    assert {n for n in names if "bf16-h" in n} | {n for n in names if "kv_fp8" in n} == set(names)
    assert not {n for n in names if "bf16-h" in n} & {n for n in names if "kv_fp8" in n}


@pytest.mark.parametrize("case,max_tokens,expected", [
    (dict(H=64, T=256, kv="bf16"), 256, {peers.SPARSE_FWD: None}),
    (dict(H=128, T=2, kv="bf16"), 256, {peers.SPARSE_FWD: None}),
    (dict(H=128, T=2, kv="fp8_e4m3"), 256, {peers.DECODE: None}),
    (dict(H=64, T=64, kv="fp8_ds_mla"), 256, {peers.DECODE: None}),
    (dict(H=16, T=2, kv="bf16"), 256, {peers.SPARSE_FWD: "serves num_heads in (64, 128)"}),
    (dict(H=32, T=2, kv="bf16"), 256, {peers.SPARSE_FWD: "not called at 32"}),
    (dict(H=16, T=2, kv="fp8_ds_mla"), 256, {peers.DECODE: "crashes at other head counts"}),
    (dict(H=32, T=2, kv="fp8_e4m3"), 256, {peers.DECODE: "not called at 32"}),
    (dict(H=64, T=256, kv="bf16"), 128, {peers.SPARSE_FWD: "T=256 > --peer-max-tokens 128"}),
    (dict(H=64, T=2, kv="fp16"), 256, {}),
])
def test_which_case_gets_which_peer(case, max_tokens, expected):
    got = bench.flash_peers_of(case, max_tokens)
    assert set(got) == set(expected)
    for peer, why in expected.items():
        assert (got[peer] is None) if why is None else (why in got[peer]), got


def test_ratio_is_ours_over_theirs():
    entry = {"impls": {"triton": {"us": 30.0}, peers.SPARSE_FWD: {"us": 60.0}, peers.DECODE: {"us": 20.0},
                       "torch": {"us": 90.0}}}
    assert bench.ratios(entry) == {peers.SPARSE_FWD: 0.5, peers.DECODE: 1.5}
    entry["impls"][peers.DECODE] = {"skipped": "heads"}
    entry["impls"]["triton"] = {"us": 30.0}
    assert bench.ratios(entry) == {peers.SPARSE_FWD: 0.5}
    entry["impls"]["triton"] = {"unavailable": "uint8"}
    assert bench.ratios(entry) == {}


# ---------------------------------------------------------------- the adapters
def _inputs(T=2, H=64, topk=64, rows=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(rows, 576, generator=g).to(torch.bfloat16)
    q = torch.randn(T, H, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, rows, (T, topk), generator=g, dtype=torch.int32)
    sinks = torch.randn(H, generator=g)
    return q, kv, idx, sinks


def test_lse_to_ours_maps_flash_mla_empty_rows():
    lse = torch.tensor([1.5, math.inf, -math.inf, math.nan])
    got = peers.lse_to_ours(lse)
    assert got[0] == 1.5 and got[1] == -math.inf and got[2] == -math.inf and math.isnan(got[3])


@pytest.mark.parametrize("with_sinks", [True, False])
def test_sparse_fwd_call_arguments(fake_flash_mla, with_sinks):
    q, kv, idx, sinks = _inputs()
    idx[0, 0], idx[0, 1], idx[1, 2] = -5, 256 + 3, -1  # invalid ids reach FlashMLA as -1
    call = peers.sparse_fwd_call(fake_flash_mla, q, kv, idx, sinks if with_sinks else None, 0.04)
    assert fake_flash_mla.calls == []  # nothing runs until run()
    out, lse = call.result(call.run())
    (_, q3, kv3, idx3, scale, sink), = fake_flash_mla.calls
    assert q3 is q and kv3.shape == (256, 1, 576) and kv3.data_ptr() == kv.data_ptr()
    assert idx3.shape == (2, 1, 64) and idx3.dtype == torch.int32
    assert idx3[0, 0, :2].tolist() == [-1, -1] and idx3[1, 0, 2] == -1 and torch.equal(idx3[0, 0, 2:], idx[0, 2:])
    assert scale == 0.04 and (torch.equal(sink, sinks) if with_sinks else sink is None)
    ref_out, ref_lse = sparse_mla_decode_reference(q, kv, idx, sinks if with_sinks else None, 0.04)
    assert out.shape == (2, 64, 512) and lse.shape == (2, 64)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse.double())


def test_adapters_refuse_bad_shapes_before_calling(fake_flash_mla):
    q, kv, idx, sinks = _inputs()
    cache, _ = peers.ds_mla_cache(kv)
    with pytest.raises(ValueError, match="'q' must be"):
        peers.sparse_fwd_call(fake_flash_mla, q[..., :512], kv, idx, sinks, 0.04)
    with pytest.raises(ValueError, match="'kv_cache' must be"):
        peers.sparse_fwd_call(fake_flash_mla, q, kv[:, :512], idx, sinks, 0.04)
    with pytest.raises(ValueError, match="'cache' must be"):
        peers.decode_call(fake_flash_mla, q, cache[:100], idx, sinks, 0.04)
    with pytest.raises(ValueError, match="'cache' must be"):
        peers.decode_call(fake_flash_mla, q, kv, idx, sinks, 0.04)
    q16, _, _, sinks16 = _inputs(H=16)
    with pytest.raises(ValueError, match="crashes at other head counts"):
        peers.decode_call(fake_flash_mla, q16, cache, idx, sinks16, 0.04)
    assert fake_flash_mla.calls == []


def test_decode_call_arguments(fake_flash_mla):
    q, kv, idx, sinks = _inputs(T=3, H=128, rows=300)
    cache, _ = peers.ds_mla_cache(kv)
    assert cache.shape == (256, 656)  # whole blocks of 64 rows
    idx[0, 0], idx[2, 5] = 299, -7  # beyond the cache's rows, negative: -1 for FlashMLA
    call = peers.decode_call(fake_flash_mla, q, cache, idx, sinks, 0.05)
    assert len(fake_flash_mla.calls) == 1  # the scheduler metadata is filled here, outside any graph capture
    out, lse = call.result(call.run())
    assert len(fake_flash_mla.calls) == 2
    _, q4, cache4, idx3, scale, sink = fake_flash_mla.calls[-1]
    assert q4.shape == (3, 1, 128, 576) and q4.data_ptr() == q.data_ptr()
    assert cache4.shape == (4, 64, 1, 656) and cache4.data_ptr() == cache.data_ptr()
    assert idx3.shape == (3, 1, 64) and idx3[0, 0, 0] == -1 and idx3[2, 0, 5] == -1
    assert scale == 0.05 and torch.equal(sink, sinks)
    skipped = idx.clone()
    skipped[0, 0], skipped[2, 5] = -1, -1
    ref_out, ref_lse = sparse_mla_decode_reference(q, cache, skipped, sinks, 0.05)
    assert out.shape == (3, 128, 512) and lse.shape == (3, 128)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse.double())


def test_ds_mla_cache_is_the_library_pow2_cache_of_whole_blocks():
    _, kv, _, _ = _inputs(rows=200)
    cache, source = peers.ds_mla_cache(kv)
    assert source == peers.DS_MLA_SOURCE and source.startswith("mla_sink.quantize_kv_cache") and "pow2" in source
    assert cache.dtype == torch.uint8 and cache.shape == (192, 656) and cache.is_contiguous()  # whole blocks of 64
    assert torch.equal(cache, mla_sink.quantize_kv_cache(kv[:192], layout="fp8_ds_mla", scale="pow2"))
    scales = cache[:, 512:528].contiguous().view(torch.float32)
    assert torch.equal(torch.exp2(torch.log2(scales).round()), scales)  # powers of two (FlashMLA's convention)
    with pytest.raises(ValueError, match="needs at least 64"):
        peers.ds_mla_cache(kv[:63])


def test_ds_mla_cache_with_amax_scales_is_the_library_amax_cache():
    """``scale="amax"`` (vLLM's writer): the library's ``amax / 448`` cache, named so in the source; most of its
    scales are not powers of two (the point of timing it); an unknown convention is refused."""
    _, kv, _, _ = _inputs(rows=200)
    cache, source = peers.ds_mla_cache(kv, "amax")
    assert source == peers.ds_mla_source("amax") and "'amax'" in source and source != peers.DS_MLA_SOURCE
    assert torch.equal(cache, mla_sink.quantize_kv_cache(kv[:192], layout="fp8_ds_mla", scale="amax"))
    scales = cache[:, 512:528].contiguous().view(torch.float32)
    assert (torch.exp2(torch.log2(scales).round()) != scales).float().mean() > 0.9
    with pytest.raises(ValueError, match="'scale' must be one of"):
        peers.ds_mla_cache(kv, "max")


# ---------------------------------------------------------------- the correctness check
def test_peer_checks_against_the_reference(fake_flash_mla, monkeypatch):
    monkeypatch.setitem(peers.CHECK_SHAPE, "pool_rows", 512)  # the interpreter-free fake is fast at any size
    doc = peers.peer_checks(fake_flash_mla, "cpu")
    assert doc["shape"]["H"] == 64 and doc["shape"]["topk"] == 256 and doc["sinks"] is True
    assert "natural-log" in doc["lse_convention"]
    for peer in (peers.SPARSE_FWD, peers.DECODE):
        errs = doc[peer]
        assert set(errs) >= {"max_abs_err_out", "max_rel_err_out", "max_abs_err_lse", "max_rel_err_lse"}, errs
        assert errs["max_abs_err_lse"] < 1e-5 and errs["max_rel_err_out"] < 1e-2, (peer, errs)
    assert doc[peers.DECODE]["cache"] == peers.DS_MLA_SOURCE
    json.dumps(doc)
    # both kernels were called with the sinks and some skipped ids
    for _, _, _, idx, _, sink in fake_flash_mla.calls:
        assert sink is not None and bool((idx == -1).any())


def test_peer_checks_catch_a_wrong_lse_convention(fake_flash_mla, monkeypatch):
    monkeypatch.setitem(peers.CHECK_SHAPE, "pool_rows", 512)
    fake_flash_mla.log2_lse = True
    doc = peers.peer_checks(fake_flash_mla, "cpu")
    assert doc[peers.SPARSE_FWD]["max_abs_err_lse"] > 0.5 and doc[peers.DECODE]["max_rel_err_lse"] > 0.1


def test_peer_checks_report_a_failing_peer(fake_flash_mla, monkeypatch):
    monkeypatch.setitem(peers.CHECK_SHAPE, "pool_rows", 512)

    def broken(*args, **kwargs):
        raise RuntimeError("not compiled")

    monkeypatch.setattr(fake_flash_mla, "flash_mla_sparse_fwd", broken)
    doc = peers.peer_checks(fake_flash_mla, "cpu")
    assert "not compiled" in doc[peers.SPARSE_FWD]["error"] and "max_abs_err_out" in doc[peers.DECODE]


def test_errors_definitions():
    ref_out = torch.tensor([[2.0, -4.0]])
    ref_lse = torch.tensor([1.0, -math.inf])
    errs = peers.errors(torch.tensor([[2.5, -4.0]]), torch.tensor([1.25, -math.inf]), ref_out, ref_lse)
    assert errs == {"max_abs_err_out": 0.5, "max_rel_err_out": 0.125, "max_abs_err_lse": 0.25, "max_rel_err_lse": 0.25}


# ---------------------------------------------------------------- the case loop
SMALL_CASES = [
    dict(H=64, T=2, topk=64, kv="bf16", sinks=True),
    dict(H=64, T=2, topk=64, kv="bf16", sinks=False),
    dict(H=16, T=2, topk=64, kv="bf16", sinks=True),
    dict(H=64, T=2, topk=64, kv="fp8_e4m3", sinks=True),
    dict(H=64, T=2, topk=64, kv="fp8_ds_mla", sinks=True),
    dict(H=16, T=2, topk=64, kv="fp8_ds_mla", sinks=True),
]


def _run(cases, flash_mla, peer_max_tokens=256):
    return bench.run_cases(cases, device="cpu", pool_rows=200, peer_max_tokens=peer_max_tokens, timer=FakeTimer(),
                           ceilings=CEILINGS, platform=detect_platform("cpu"), flash_mla=flash_mla)


def test_run_cases_times_each_peer_on_the_same_data(fake_flash_mla, monkeypatch):
    monkeypatch.setattr(bench, "_ours_refuses", lambda *a: "mla-sink refuses a torch.uint8 [192, 656] kv_cache: no")
    ours = []
    monkeypatch.setattr(bench, "_ours_call", lambda *a: ours.append(a))
    results, source = _run(SMALL_CASES, fake_flash_mla)
    assert source == peers.DS_MLA_SOURCE
    impls = [list(r["impls"]) for r in results]
    assert impls == [
        ["triton", "torch", peers.SPARSE_FWD],
        ["triton", "torch", peers.SPARSE_FWD],
        ["triton", "torch", peers.SPARSE_FWD],
        ["triton", peers.DECODE],
        ["triton", peers.DECODE],
        ["triton", peers.DECODE],
    ]
    assert "not called at 16" in results[2]["impls"][peers.SPARSE_FWD]["skipped"]
    assert "crashes at other head counts" in results[5]["impls"][peers.DECODE]["skipped"]
    assert results[4]["impls"]["triton"] == {"unavailable": "mla-sink refuses a torch.uint8 [192, 656] kv_cache: no"}
    for r in results:
        for name, v in r["impls"].items():
            assert "error" not in v, (r["case"], name, v)
        assert set(r["ours_over_peer"]) == {p for p, v in r["impls"].items() if p.startswith("flash") and "us" in v
                                            and "us" in r["impls"]["triton"]}
    # the same q, ids, sinks and sm_scale reach ours and the peer
    sparse = [c for c in fake_flash_mla.calls if c[0] == "sparse_fwd"]
    decode = [c for c in fake_flash_mla.calls if c[0] == "decode"]
    assert len(sparse) == 2 and len(decode) == 4 and len(ours) == 4  # a decode call fills FlashMLA's metadata
    for (_, pq, pkv, pidx, pscale, psink), o in zip(sparse, ours[:2]):
        q, kv, idx, sinks, scale, kv_scale = o[:6]
        assert pq is q and torch.equal(pidx.squeeze(1), idx) and pkv.squeeze(1).data_ptr() == kv.data_ptr()
        assert pscale == scale and kv_scale is None
        assert (psink is None) == (sinks is None) and (sinks is None or torch.equal(psink, sinks))
    assert sparse[0][5] is not None and sparse[1][5] is None  # sinks passed exactly when ours has them
    q, kv, idx, sinks, scale, kv_scale = ours[3][:6]
    _, pq, pkv, pidx, pscale, psink = decode[1]
    assert pq.squeeze(1).data_ptr() == q.data_ptr() and torch.equal(pidx.squeeze(1), idx)
    assert torch.equal(psink, sinks) and pscale == scale and pkv.shape == (3, 64, 1, 656)
    assert kv.dtype == torch.float8_e4m3fn and kv_scale is not None
    assert results[0]["bytes"] == 2 * 64 * 1152 + 2 * 64 * 576 * 2 + 2 * 64 * 512 * 2
    assert results[0]["impls"][peers.SPARSE_FWD]["bytes"] == results[0]["bytes"]
    assert results[3]["impls"][peers.DECODE]["bytes"] == 2 * 64 * 656 + 2 * 64 * 576 * 2 + 2 * 64 * 512 * 2
    json.dumps(results)


def test_run_cases_times_ours_on_the_same_656_byte_cache_when_accepted(fake_flash_mla, monkeypatch):
    monkeypatch.setattr(bench, "_ours_refuses", lambda *a: None)
    ours = []
    monkeypatch.setattr(bench, "_ours_call", lambda *a: ours.append(a))
    results, _ = _run([SMALL_CASES[4]], fake_flash_mla)
    (r,) = results
    assert list(r["impls"]) == ["triton", peers.DECODE] and all("us" in v for v in r["impls"].values())
    (o,) = ours
    _, pq, pkv, pidx, _, psink = fake_flash_mla.calls[-1]
    assert o[1].dtype == torch.uint8 and o[1].shape == (192, 656) and o[5] is None  # no per-tensor kv_scale
    assert pkv.data_ptr() == o[1].data_ptr() and torch.equal(pidx.squeeze(1), o[2]) and torch.equal(psink, o[3])
    assert r["bytes"] == r["impls"][peers.DECODE]["bytes"]
    assert r["ours_over_peer"] == {peers.DECODE: r["impls"]["triton"]["us"] / r["impls"][peers.DECODE]["us"]}


def test_run_cases_without_flash_mla_and_over_the_token_limit(fake_flash_mla):
    results, source = _run(SMALL_CASES[:1] + SMALL_CASES[3:4], None)
    assert source == "" and [list(r["impls"]) for r in results] == [["triton", "torch"], ["triton"]]
    assert all(r["ours_over_peer"] == {} for r in results)
    results, _ = _run(SMALL_CASES[:1], fake_flash_mla, peer_max_tokens=1)
    assert list(results[0]["impls"]) == ["triton", peers.SPARSE_FWD]
    assert results[0]["impls"][peers.SPARSE_FWD] == {"skipped": "T=2 > --peer-max-tokens 1"}
    assert results[0]["triton_plan"]["kernel"] == "portable"


def test_run_cases_records_a_failing_quantiser(fake_flash_mla, monkeypatch):
    def broken(kv, scale):
        raise RuntimeError("quantiser broke")

    monkeypatch.setattr(peers, "ds_mla_cache", broken)
    results, _ = _run(SMALL_CASES[3:5], fake_flash_mla)
    assert "quantiser broke" in results[0]["impls"][peers.DECODE]["error"] and "us" in results[0]["impls"]["triton"]
    assert "quantiser broke" in results[1]["impls"]["triton"]["error"]
    assert "quantiser broke" in results[1]["impls"][peers.DECODE]["error"]


def test_ours_refuses_names_the_reason():
    q, kv, idx, sinks = _inputs(H=16)
    assert bench._ours_refuses(q, kv, idx, sinks, 0.04) is None
    why = bench._ours_refuses(q, torch.zeros(64, 655, dtype=torch.uint8), idx % 64, sinks, 0.04)
    assert why.startswith("mla-sink refuses a torch.uint8 [64, 655] kv_cache: ") and "kv_cache" in why[50:]


def test_print_table_shows_ratios_and_why_cells(fake_flash_mla, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_ours_refuses", lambda *a: "no")
    monkeypatch.setattr(bench, "_ours_call", lambda *a: None)
    results, _ = _run(SMALL_CASES, fake_flash_mla)
    report = dict(ceilings=CEILINGS, results=results, peers={"flash_mla": {"status": "timed"}},
                  peer_checks={"shape": peers.CHECK_SHAPE, peers.SPARSE_FWD: {"max_abs_err_out": 0.004},
                               peers.DECODE: {"error": "boom"}})
    bench.print_table(report)
    lines = capsys.readouterr().out.splitlines()
    header = next(x for x in lines if x.startswith("| case |"))
    assert header.split(" | ")[1:6] == ["triton us", "torch us", f"{peers.SPARSE_FWD} us", f"{peers.DECODE} us",
                                        f"ours ÷ {peers.SPARSE_FWD}"]
    assert f"ours ÷ {peers.DECODE}" in header
    rows = {x.split(" | ")[0][2:]: x.split(" | ")[1:] for x in lines if x.startswith("| bf16")}
    r0 = rows[results[0]["case"]]
    assert r0[4] == f"{results[0]['ours_over_peer'][peers.SPARSE_FWD]:.2f}" and r0[5] == "-"
    assert rows[results[2]["case"]][2] == "skipped" and rows[results[4]["case"]][0] == "unavailable"
    assert any("peer check flash_mla_sparse_fwd" in x and "max_abs_err_out 0.004" in x for x in lines)
    assert any("peer check flash_mla_decode" in x and "error boom" in x for x in lines)


class _GraphTimerStandIn(FakeTimer):
    def __init__(self, reps=10, replays=7, flush="read"):
        super().__init__()

    def flush_ms(self):
        return 0.08


@pytest.mark.parametrize("peers_flag", [None, False])
def test_run_bench_end_to_end_on_cpu(fake_flash_mla, monkeypatch, tmp_path, peers_flag, capsys):
    """The whole of ``run_bench`` and the table on the CPU (the GPU-only pieces replaced): every field is
    written, the peer checks run first, ``--cases`` filters, ``--no-peers`` keeps FlashMLA out."""
    import argparse

    monkeypatch.setitem(peers.CHECK_SHAPE, "pool_rows", 512)
    monkeypatch.setattr(bench, "GraphTimer", _GraphTimerStandIn)
    monkeypatch.setattr(bench, "measure_ceilings", lambda timer: dict(CEILINGS))
    monkeypatch.setattr(bench, "default_cases", lambda: list(SMALL_CASES))
    monkeypatch.setattr("torch.cuda.get_device_properties",
                        lambda device: types.SimpleNamespace(name="cpu stand-in", multi_processor_count=2))
    args = argparse.Namespace(reps=10, replays=7, flush="read", cases="-h64-", pool_rows=200, peer_max_tokens=256,
                              peers=peers_flag)
    report = bench.run_bench(args, device="cpu")
    assert [r["H"] for r in report["results"]] == [64, 64, 64, 64]
    # the 656-byte cache (ours is timed on it with or without peers) names its quantiser
    assert report["peers"]["fp8_ds_mla_cache"] == peers.DS_MLA_SOURCE
    assert report["device"] == "cpu stand-in" and report["flush_us"] == 80.0 and report["ceilings"] == CEILINGS
    # the keys every mode's report starts with (mla_sink.tools.report)
    assert list(report)[:5] == ["mode", "device", "torch", "triton", "date"] and report["mode"] == "kernels"
    if peers_flag is None:
        assert report["peers"]["flash_mla"]["status"] == "timed"
        assert "flash_mla" not in report["peers_missing"]
        assert set(report["peer_checks"]) >= {peers.SPARSE_FWD, peers.DECODE, "shape", "lse_convention"}
        assert all("max_abs_err_out" in report["peer_checks"][p] for p in (peers.SPARSE_FWD, peers.DECODE))
        assert peers.SPARSE_FWD in report["results"][0]["ours_over_peer"]
    else:
        assert report["peers"]["flash_mla"] == {"status": "off (--no-peers)"} and "peer_checks" not in report
        assert "flash_mla" in report["peers_missing"]
        assert not any(k.startswith("flash") for r in report["results"] for k in r["impls"])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report, indent=1))
    assert json.loads(path.read_text())["results"][0]["case"] == report["results"][0]["case"]
    bench.print_table(report)
    out = capsys.readouterr().out
    assert out.count("| bf16") == 4 and ("ours ÷ flash_mla_decode" in out) == (peers_flag is None)


@pytest.mark.parametrize("patterns", ["nonexistent", "BF16", "-h64-x,-h3-"])
def test_run_bench_refuses_cases_that_select_nothing_before_timing(monkeypatch, patterns):
    """A ``--cases`` whose patterns match no case name (a typo, upper case) is refused naming the flag, the value and
    two names of this platform's cases, before the peer checks, the ceilings or any case is timed (seventieth
    session's break test: it printed an empty table and exited 0)."""
    import argparse

    def untouched(*a, **k):
        raise AssertionError("timed or checked before --cases was refused")

    monkeypatch.setattr(bench, "GraphTimer", untouched)
    monkeypatch.setattr(bench, "measure_ceilings", untouched)
    monkeypatch.setattr(bench, "run_cases", untouched)
    monkeypatch.setattr(peers, "peer_checks", untouched)
    args = argparse.Namespace(reps=10, replays=7, flush="read", cases=patterns, pool_rows=200, peer_max_tokens=256,
                              peers=None)
    with pytest.raises(ValueError, match=r"'--cases' selects none of the 56 cases \(got '" + re.escape(patterns)
                       + r"'\); give substrings of case names such as 'bf16-h16-"):
        bench.run_bench(args, device="cpu")


def test_selected_cases_keeps_every_case_without_patterns_and_filters_with_them():
    """``None`` or an empty ``--cases`` keeps the grid; patterns keep the cases whose name contains one of them."""
    platform = detect_platform("cpu")
    every = bench.default_cases()
    assert bench.selected_cases(None, platform) == every and bench.selected_cases("", platform) == every
    chosen = bench.selected_cases("-h128-,kv_fp8_ds_mla", platform)
    names = [bench.case_name(c, platform) for c in chosen]
    assert names and all("-h128-" in n or "kv_fp8_ds_mla" in n for n in names)
    assert len(chosen) == sum(1 for c in every if c["H"] == 128 or c["kv"] == "fp8_ds_mla")


def test_run_cases_gives_ours_the_paged_view_of_the_same_cache(fake_flash_mla, monkeypatch):
    """``ds_pages=64``: our call gets ``[rows / 64, 64, 656]`` over the peer's bytes (ids unchanged: row numbers);
    a page size that does not divide FlashMLA's 64-row pages is refused before any case runs."""
    monkeypatch.setattr(bench, "_ours_refuses", lambda *a: None)
    ours = []
    monkeypatch.setattr(bench, "_ours_call", lambda *a: ours.append(a))
    results, _ = bench.run_cases([SMALL_CASES[4]], device="cpu", pool_rows=200, peer_max_tokens=256,
                                 timer=FakeTimer(), ceilings=CEILINGS, platform=detect_platform("cpu"),
                                 flash_mla=fake_flash_mla, ds_pages=64)
    (o,) = ours
    _, _, pkv, pidx, _, _ = fake_flash_mla.calls[-1]
    assert o[1].shape == (3, 64, 656) and pkv.data_ptr() == o[1].data_ptr() and torch.equal(pidx.squeeze(1), o[2])
    assert results[0]["bytes"] == results[0]["impls"][peers.DECODE]["bytes"]
    for bad in (3, -64, 128, 64.0, "64", True):
        with pytest.raises(ValueError, match=f"ds_pages must be 0 .* or a divisor of 64, got ds_pages={bad!r}"):
            bench.run_cases([SMALL_CASES[4]], device="cpu", pool_rows=200, peer_max_tokens=256, timer=FakeTimer(),
                            ceilings=CEILINGS, platform=detect_platform("cpu"), flash_mla=None, ds_pages=bad)


def test_run_cases_reads_the_amax_cache_with_every_implementation(fake_flash_mla, monkeypatch):
    """``ds_scale="amax"``: ours and FlashMLA's decode get the same ``amax / 448`` bytes (the library's cache of the
    pool's first whole blocks), and the source says which; an unknown convention is refused before any case runs."""
    monkeypatch.setattr(bench, "_ours_refuses", lambda *a: None)
    ours = []
    monkeypatch.setattr(bench, "_ours_call", lambda *a: ours.append(a))
    _, source = bench.run_cases([SMALL_CASES[4]], device="cpu", pool_rows=200, peer_max_tokens=256,
                                timer=FakeTimer(), ceilings=CEILINGS, platform=detect_platform("cpu"),
                                flash_mla=fake_flash_mla, ds_scale="amax")
    (o,) = ours
    _, _, pkv, _, _, _ = fake_flash_mla.calls[-1]
    assert source == peers.ds_mla_source("amax") and pkv.data_ptr() == o[1].data_ptr()
    scales = o[1][:, 512:528].contiguous().view(torch.float32)
    assert (torch.exp2(torch.log2(scales).round()) != scales).any()
    with pytest.raises(ValueError, match=r"ds_scale must be one of \('pow2', 'amax'\), got ds_scale='vllm'"):
        bench.run_cases([SMALL_CASES[4]], device="cpu", pool_rows=200, peer_max_tokens=256, timer=FakeTimer(),
                        ceilings=CEILINGS, platform=detect_platform("cpu"), flash_mla=None, ds_scale="vllm")


def test_the_peers_table_calls_flash_mla_at_its_head_counts_only():
    """tables/peers.yaml names the head counts FlashMLA serves, for both kernels; every other count of its domain is
    refused with the row's reason (the bench records it; the adapters refuse such a q)."""
    for peer in (peers.SPARSE_FWD, peers.DECODE):
        assert peers.peer_heads(peer) == FLASH_MLA_HEADS
        for h in peers.peers_table().fields["num_heads"].domain:
            assert (peers.skip_reason(peer, h) is None) == (h in FLASH_MLA_HEADS)
    with pytest.raises(ValueError, match="peer"):
        peers.skip_reason("flash_attn", 64)
    assert peers.skip_reason(peers.DECODE, np.int64(64)) is None  # any integer
    for bad in (64.5, np.float64(64.0), "64", True, None, float("nan"), 0, -1):  # a second break test's inputs
        with pytest.raises(ValueError, match="'num_heads' must be an int >= 1"):
            peers.skip_reason(peers.DECODE, bad)
    with pytest.raises(ValueError, match="'peer' must be a peer name"):
        peers.peer_heads(["x"])


def test_report_header_is_what_every_bench_mode_starts_with():
    """The common keys: the mode, the device's name, torch's and Triton's versions and the date; an unknown mode is
    refused with the allowed ones named. The host and DCP modes (GPU only) build their reports with it."""
    import inspect
    import re

    from mla_sink.tools import dcp_bench, host_bench
    from mla_sink.tools.report import MODES, report_header

    header = report_header("dcp", "H200")
    assert list(header) == ["mode", "device", "torch", "triton", "date"]
    assert header["mode"] == "dcp" and header["device"] == "H200" and header["torch"] == torch.__version__
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", header["date"])
    with pytest.raises(ValueError, match=r"'mode' must be one of \['kernels', 'host', 'dcp'\] \(got 'grid'\)"):
        report_header("grid", "H200")
    assert MODES == ("kernels", "host", "dcp")
    assert 'report_header("host"' in inspect.getsource(host_bench.run_host_bench)
    assert 'report_header("dcp"' in inspect.getsource(dcp_bench)
